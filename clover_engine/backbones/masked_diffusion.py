"""Dream / LLaDA-style masked diffusion over a transformers Llama / Qwen2 module: the third backbone.

Masked diffusion language models (LLaDA: Nie et al., "Large Language Diffusion
Models", 2025; Dream 7B: Ye et al., "Dream 7B: Diffusion Large Language Models",
2025) are transformers with the causal mask removed: every position attends to
every other one, and a forward predicts the token of every MASK position. They
keep no cache -- each denoising step recomputes the whole sequence -- and
decode "semi-autoregressively" in blocks: the slots of the current block are
unmasked over several steps, then the next block starts. This module drives
such a model with the project's own `clover_engine.decoding.decoder.BlockDecoder`, so its
acceptance policies (LowConfidence, LLaDA's top-k, Dream's margin and entropy,
Fast-dLLM's factor rule), logits processors, events and traces are the same as
for Clover and for the KV-cached transformers backbone (`clover_engine.backbones.causal_lm.model`):

* **Bidirectional, full recompute.** One forward over ``[committed ++ block ++
  canvas tail]`` at positions ``0 .. T-1`` with an all-zero additive 4D mask
  (no causal mask); nothing is cached between forwards, so committing a block
  is appending its tokens to the history.
* **Logit shift** (Dream): Dream was adapted from the autoregressive Qwen2.5
  and keeps its head's meaning -- the output at position ``i - 1`` predicts
  the token at ``i`` (``logit_shift=True``). LLaDA, trained from scratch as a
  masked model, predicts each position from its own output
  (``logit_shift=False``).
* **Canvas tail.** Dream and LLaDA place the whole answer length of MASK tokens
  after the prompt and decode its blocks left to right, so later (still masked)
  blocks take part in attention. ``canvas_tail`` MASK positions after the
  current block reproduce that; 0 (the default) attends over history and the
  current block only.

Formats `load_masked_diffusion` reads (``config.json`` ``model_type``):

* ``Dream`` / ``dream``: a Dream checkpoint (``DreamModel``; weight names are
  Qwen2's), loaded into transformers' ``Qwen2ForCausalLM``; ``mask_token_id``
  from its config; logit shift on.
* ``llada``: a LLaDA checkpoint (``LLaDAModelLM``, OLMo-style weight names
  ``model.transformer.blocks.{i}.q_proj`` ... ``ff_out``), renamed onto
  transformers' ``LlamaForCausalLM`` by `LLADA_KEYS`; logit shift off.

Loading is lean (`load_masked_diffusion`, `clover_engine.backbones.safetensors_shards`): the
transformers model is built on the meta device, then the safetensors shards (those a
``*.safetensors.index.json`` names, else every ``*.safetensors``) are read one at a time, one tensor
at a time, straight into their final dtype and device (LLaDA's names renamed on the fly), and the
rotary buffers are recomputed on the device; peak resident memory is the weights plus the largest
tensor (<= 1.2x the weights: ``benchmarks/load_memory.py``). The default dtype is the checkpoint's
own (bf16 stays bf16); logits and confidences are fp32 whatever the dtype.

Safetensors only. Clover-only observables (expert union, state norms, memory
share) are ``None``; the cost model prices every forward as a full recompute
(``kv_cache=False``: weights once, all T tokens of FLOPs, no cache traffic).
Shape letters as in `clover_engine`: L block slots, C committed tokens, T tokens of a
forward, V vocab.

Wing: ``backbones``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clover_engine.backbones.causal_lm.model import HFBlockConfig, TransformersBackbone, count_parameters
from clover_engine.backbones.base import BlockOutput, Capabilities
from clover_engine.prompting import CHECKPOINT, CheckpointChatTemplate
from clover_engine.backbones.safetensors_shards import (
    checkpoint_dtype, compile_rules, load_shards, materialize_buffers, meta_tensors, read_header, save_weights,
    shard_files,
)

FORMATS = {
    "dream": "a Dream checkpoint (DreamModel, Qwen2 weight names), masked diffusion with logit shift "
             "(clover_engine.backbones.masked_diffusion)",
    "llada": "a LLaDA checkpoint (LLaDAModelLM), masked diffusion without shift (clover_engine.backbones.masked_diffusion)",
}
"""Lower-cased ``model_type`` -> description, for `clover_engine.checkpoint.supported_formats`."""

LLADA_KEYS: tuple[tuple[str, str], ...] = (
    (r"model\.transformer\.wte\.weight", r"model.embed_tokens.weight"),
    (r"model\.transformer\.ln_f\.weight", r"model.norm.weight"),
    (r"model\.transformer\.ff_out\.weight", r"lm_head.weight"),
    (r"model\.transformer\.blocks\.(\d+)\.attn_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"model\.transformer\.blocks\.(\d+)\.ff_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    (r"model\.transformer\.blocks\.(\d+)\.(q|k|v)_proj\.weight", r"model.layers.\1.self_attn.\2_proj.weight"),
    (r"model\.transformer\.blocks\.(\d+)\.attn_out\.weight", r"model.layers.\1.self_attn.o_proj.weight"),
    (r"model\.transformer\.blocks\.(\d+)\.ff_proj\.weight", r"model.layers.\1.mlp.gate_proj.weight"),
    (r"model\.transformer\.blocks\.(\d+)\.up_proj\.weight", r"model.layers.\1.mlp.up_proj.weight"),
    (r"model\.transformer\.blocks\.(\d+)\.ff_out\.weight", r"model.layers.\1.mlp.down_proj.weight"),
)
"""LLaDA weight name (regular expression) -> transformers Llama name. LLaDA's SwiGLU is
``ff_out(act(ff_proj(x)) * up_proj(x))``, so ``ff_proj`` is the gate and ``ff_out`` the down
projection; the top-level ``model.transformer.ff_out`` is the LM head."""

LLAMA_TO_LLADA: tuple[tuple[str, str], ...] = (
    (r"model\.embed_tokens\.weight", r"model.transformer.wte.weight"),
    (r"model\.norm\.weight", r"model.transformer.ln_f.weight"),
    (r"lm_head\.weight", r"model.transformer.ff_out.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"model.transformer.blocks.\1.attn_norm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"model.transformer.blocks.\1.ff_norm.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.(q|k|v)_proj\.weight", r"model.transformer.blocks.\1.\2_proj.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", r"model.transformer.blocks.\1.attn_out.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", r"model.transformer.blocks.\1.ff_proj.weight"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", r"model.transformer.blocks.\1.up_proj.weight"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", r"model.transformer.blocks.\1.ff_out.weight"),
)
"""`LLADA_KEYS` the other way round (transformers Llama name -> LLaDA name), for `save_masked_diffusion`."""

_LLADA_RENAME = compile_rules(LLADA_KEYS)  # LLaDA name -> Llama name, applied per tensor while loading


@dataclass
class MaskedDiffusionConfig(HFBlockConfig):
    """`HFBlockConfig` plus what masked diffusion changes (module docstring).

    Attributes:
        logit_shift: True (Dream): the output at position i-1 predicts token i;
            False (LLaDA): each position predicts itself.
        canvas_tail: MASK positions after the current block that join every
            forward's attention (0 = none).
        kv_cache: False: every forward recomputes the whole sequence (the cost
            model prices it so).
        family: ``"dream"`` or ``"llada"`` (or ``"masked-diffusion"`` when built by hand).
    """

    logit_shift: bool = False
    canvas_tail: int = 0
    kv_cache: bool = False
    family: str = "masked-diffusion"


@dataclass
class MaskedDiffusionState:
    """History of one decode: the committed tokens (nothing is cached).

    Attributes:
        committed: every committed token id (prompt blocks and finished blocks).
        memory_mode: always ``"state"`` (history = the committed tokens, recomputed each forward).
        window: 0 (the decoder and cost model read it).
    """

    committed: list[int] = field(default_factory=list)
    memory_mode: str = "state"
    window: int = 0

    @property
    def position(self) -> int:
        """Tokens committed so far (absolute position of slot 0 of the next block)."""
        return len(self.committed)

    def nbytes(self) -> int:
        """Bytes of history kept between forwards: 0 (token ids only; every forward recomputes)."""
        return 0


class MaskedDiffusionModel(TransformersBackbone):
    """A bidirectional transformers LM driven as a masked diffusion model (module docstring).

    Args:
        lm: a ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` holding the diffusion model's weights.
        config: its `MaskedDiffusionConfig`.
    """

    def __init__(self, lm: nn.Module, config: MaskedDiffusionConfig):
        super().__init__()
        self.lm = lm
        self.config = config
        self.model_id = config.name

    @property
    def capabilities(self) -> Capabilities:
        """Masked diffusion: no cache (`state` = the committed tokens, recomputed every forward),
        nothing to observe beyond the logits, forwards priced as full recomputes."""
        return Capabilities(family="masked_diffusion", memory_modes=("state",), observables=frozenset(),
                            cost_family="recompute", chat_template=self.chat_format, chat_system=self.chat_system)

    def setup_state(self, batch_size: int = 1, memory_mode: str = "state") -> MaskedDiffusionState:
        """An empty history.

        Raises:
            ValueError: ``batch_size != 1`` or a memory mode other than ``state``.
        """
        self.check_state_args(batch_size, memory_mode, "masked-diffusion backbone",
                              "a masked diffusion model recomputes its whole history every forward")
        return MaskedDiffusionState()

    def forward(self, block_ids: torch.Tensor, state: MaskedDiffusionState, commit_ids: torch.Tensor | None = None,
                block_size: int | None = None, observe: bool = False, rows: slice | None = None) -> BlockOutput:
        """One denoising forward: append the finished tokens, then recompute ``[history ++ block ++ tail]``.

        Args:
            block_ids: [1, L] int64, the current block (prompt head, written tokens, MASK);
                slot 0 sits at absolute position ``state.position`` after the commit.
            state: from `setup_state`; the commit extends ``state.committed``.
            commit_ids: [1, C] finished tokens to append to the history first, or None.
            block_size, observe: accepted for the decoder's protocol; unused.
            rows: the slots (a slice of 0..L) whose logits to return (default all L): every position still runs
                through the model, the output layer only over these (a sampler that reads one block of its canvas).

        Returns:
            `BlockOutput` with logits [1, L, V] fp32, or [1, len(rows), V] (row j predicts slot j; with the logit
            shift and nothing committed, row 0 -- a prompt token, never masked -- is zeros)
            and ``None`` for expert_union, memory_share and state_norm.

        Raises:
            ValueError: ``block_ids`` not [1, L], or history + block (+ tail) beyond
                ``max_position_embeddings``.
        """
        if block_ids.dim() != 2 or block_ids.shape[0] != 1:
            raise ValueError(f"block_ids must be [1, L], got shape {tuple(block_ids.shape)}")
        if commit_ids is not None and commit_ids.shape[1]:
            state.committed.extend(int(t) for t in commit_ids[0].tolist())
        cfg = self.config
        P, L = len(state.committed), block_ids.shape[1]
        if P + L > cfg.max_position_embeddings:
            raise ValueError(f"position {P + L} exceeds max_position_embeddings={cfg.max_position_embeddings}; "
                             "shorten the prompt or max_new_tokens")
        tail = max(0, min(int(cfg.canvas_tail), cfg.max_position_embeddings - P - L))
        ids = state.committed + block_ids[0].tolist() + [cfg.mask_token_id] * tail
        T = len(ids)
        device = self.device
        slots = range(L)[rows] if rows is not None else range(L)
        shift = 1 if cfg.logit_shift else 0
        keep = [P + j - shift for j in slots if P + j - shift >= 0]  # row P + j (shift: P + j - 1) predicts slot j
        x = torch.tensor([ids], dtype=torch.long, device=device)
        mask = torch.zeros(1, 1, T, T, dtype=self.dtype, device=device)  # every position sees every position
        out = self.lm(input_ids=x, attention_mask=mask, position_ids=torch.arange(T, device=device)[None],
                      use_cache=False, logits_to_keep=torch.tensor(keep, device=device))
        logits = out.logits.float()
        if shift and P == 0 and 0 in slots:  # slot 0 is the first prompt token: nothing before it predicts it
            logits = torch.cat([logits.new_zeros(1, 1, logits.shape[-1]), logits], 1)
        return BlockOutput(logits=logits, expert_union=None)


# ------------------------------------------------------------------ loading
def is_masked_diffusion_type(model_type: Any) -> bool:
    """True for a ``config.json`` ``model_type`` `load_masked_diffusion` reads (`FORMATS`, any case)."""
    return isinstance(model_type, str) and model_type.lower() in FORMATS


def _dream_config(data: dict) -> Any:
    from transformers import Qwen2Config

    skip = {"model_type", "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype"}
    return Qwen2Config(**{k: v for k, v in data.items() if k not in skip})


def _llada_config(data: dict, where: Path) -> Any:
    from transformers import LlamaConfig

    expect = {"layer_norm_type": "rms", "block_type": "llama"}
    for key, want in expect.items():
        if key in data and str(data[key]).lower() != want:
            raise ValueError(f"{where}: LLaDA {key}={data[key]!r} is not supported; the adapter maps "
                             f"{key}={want!r} checkpoints (LLaDA-8B's layout) onto transformers' Llama")
    if str(data.get("activation_type", "silu")).lower() not in ("silu", "swiglu"):
        raise ValueError(f"{where}: LLaDA activation_type={data['activation_type']!r} is not supported (silu / swiglu)")
    if data.get("include_bias") or data.get("include_qkv_bias"):
        raise ValueError(f"{where}: LLaDA checkpoints with biases are not supported (include_bias / include_qkv_bias)")
    try:
        d, heads = int(data["d_model"]), int(data["n_heads"])
        return LlamaConfig(
            vocab_size=int(data.get("embedding_size") or data["vocab_size"]), hidden_size=d,
            intermediate_size=int(data["mlp_hidden_size"]), num_hidden_layers=int(data["n_layers"]),
            num_attention_heads=heads, num_key_value_heads=int(data.get("n_kv_heads") or heads),
            max_position_embeddings=int(data.get("max_sequence_length", 4096)),
            rope_theta=float(data.get("rope_theta", 10000.0)), rms_norm_eps=float(data.get("rms_norm_eps", 1e-5)),
            tie_word_embeddings=bool(data.get("weight_tying", False)), eos_token_id=data.get("eos_token_id"),
            pad_token_id=data.get("pad_token_id"), bos_token_id=data.get("bos_token_id"),
        )
    except KeyError as e:
        raise ValueError(f"{where}: a LLaDA config.json needs {e.args[0]!r} (with d_model, n_heads, n_layers, "
                         "mlp_hidden_size, vocab_size)") from e


def _rename(weights: dict[str, torch.Tensor], rules: tuple[tuple[str, str], ...]) -> dict[str, torch.Tensor]:
    rename = compile_rules(rules)
    return {rename(name): t for name, t in weights.items()}


def load_masked_diffusion(path: str | Path, device: str | torch.device = "cpu",
                          dtype: torch.dtype | None = None, canvas_tail: int = 0) -> MaskedDiffusionModel:
    """Load a Dream or LLaDA checkpoint directory as a `MaskedDiffusionModel`, leanly.

    The transformers model is built on the meta device (no memory, no random init), then the
    safetensors shards are read one at a time, one tensor at a time, straight into their final
    dtype on `device` (LLaDA's names renamed on the fly by `LLADA_KEYS`), and rotary buffers are
    recomputed on `device` (`clover_engine.backbones.safetensors_shards`). Peak resident memory is
    the weights plus the largest tensor (``benchmarks/load_memory.py``: <= 1.2x the weights).
    Shards: those a ``*.safetensors.index.json`` names, else every ``*.safetensors``. Callers hold
    `clover_engine.backbones.registry.BUILD_LOCK` (`clover_engine.checkpoint.load_model` does).

    Args:
        path: the directory (``config.json`` + ``*.safetensors``), or a file in it.
        device: where the model ends up (weights are read straight there).
        dtype: the floating dtype of the weights; None = the checkpoint's own (``config.json``'s
            ``torch_dtype`` / ``dtype``, else the stored tensors' dtype: a bf16 checkpoint stays
            bf16, an fp32 one fp32). The logits and confidences are fp32 whatever the dtype.
        canvas_tail: MASK positions after the current block (see the module docstring).

    Returns:
        The model in ``eval()`` mode, ``model_id`` = the directory's name; no tensor on meta. Its
        ``checkpoint_chat`` is the checkpoint's own chat template (None when it ships none).

    Raises:
        ValueError: no such directory or config, a ``model_type`` other than Dream / LLaDA,
            an unsupported LLaDA layout, no ``mask_token_id`` in the config, no safetensors
            weights, a truncated or corrupt shard (the message names the file), a shard an index
            names that is absent, weights that do not match the architecture (missing /
            unexpected names, wrong shapes), or a chat template file that cannot be read or rendered
            (`clover_engine.prompting.CheckpointChatTemplate.from_directory`).
    """
    from transformers import AutoModelForCausalLM

    directory = Path(path)
    directory = directory.parent if directory.is_file() else directory
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{directory} has no config.json; a Dream / LLaDA checkpoint directory holds config.json "
                         "and *.safetensors")
    data = json.loads(config_path.read_text())
    family = str(data.get("model_type", "")).lower()
    if family == "llada" and int(data.get("num_experts") or 0) > 0:  # some copies of LLaDA-MoE's config say "llada"
        raise ValueError(f"{config_path} is a LLaDA-MoE checkpoint (num_experts={data['num_experts']}); open it with "
                         "clover_engine.load_model or clover_engine.backbones.llada_moe.load_llada_moe")
    if family not in FORMATS:
        raise ValueError(f"{config_path}: model_type={data.get('model_type')!r} is not a masked diffusion format; "
                         f"supported: {', '.join(FORMATS)}")
    hf_cfg = _dream_config(data) if family == "dream" else _llada_config(data, config_path)
    mask_id = data.get("mask_token_id")
    if mask_id is None:
        raise ValueError(f"{config_path} names no mask_token_id; add the id of the MASK token the model was trained "
                         "with (Dream-7B: 151666, LLaDA-8B: 126336)")
    shards = [read_header(f) for f in shard_files(directory)]  # headers only: names, dtypes, truncation
    dtype = dtype or checkpoint_dtype(data, shards)
    with torch.device("meta"):  # no memory, no random init; safe under BUILD_LOCK (one build per process)
        lm = AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype)
    tied = frozenset({"lm_head.weight"}) if getattr(hf_cfg, "tie_word_embeddings", False) else frozenset()
    load_shards(lm, shards, rename=_LLADA_RENAME if family == "llada" else (lambda name: name), device=device,
                optional=tied, what=f"a {family} model of this config")
    if tied:
        lm.tie_weights()
    materialize_buffers(lm, device)
    left = meta_tensors(lm)
    if left:
        raise ValueError(f"{directory}: {len(left)} tensor(s) were left unloaded (on the meta device): {left[:5]}")
    lm.eval()
    base = HFBlockConfig.from_hf(hf_cfg, directory.name, int(mask_id), num_parameters=count_parameters(lm))
    cfg = MaskedDiffusionConfig(**dataclasses.asdict(base), logit_shift=family == "dream",
                                canvas_tail=int(canvas_tail), family=family)
    model = MaskedDiffusionModel(lm, cfg).eval()
    # the checkpoint's own chat template (LLaDA-8B-Instruct, Dream-v0-Instruct): a plain question is
    # rendered in it (clover_engine.prompting.model_input); a base checkpoint ships none
    model.checkpoint_chat = CheckpointChatTemplate.from_directory(directory)
    model.chat_format = CHECKPOINT if model.checkpoint_chat is not None else None
    return model


def save_masked_diffusion(lm: nn.Module, path: str | Path, family: str, mask_token_id: int) -> Path:
    """Write a transformers Llama / Qwen2 LM as a Dream- or LLaDA-format checkpoint directory.

    The inverse of `load_masked_diffusion` (used to build test checkpoints and to
    hand a model trained here to Dream's or LLaDA's own code): ``dream`` keeps the
    Qwen2 names and config with ``model_type: "Dream"``; ``llada`` writes LLaDA's
    config fields and weight names (`LLADA_KEYS` reversed).

    Raises:
        ValueError: an unknown family, or a Llama config LLaDA's layout cannot express
            (attention or MLP biases).
    """

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    c = lm.config
    state = {k: v.detach().contiguous() for k, v in lm.state_dict().items()}
    if family == "dream":
        data = c.to_dict()
        data.update(model_type="Dream", architectures=["DreamModel"], mask_token_id=int(mask_token_id))
    elif family == "llada":
        if getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False):
            raise ValueError("LLaDA's layout has no attention / MLP biases; build the Llama with attention_bias=False")
        data = dict(model_type="llada", architectures=["LLaDAModelLM"], d_model=c.hidden_size, n_heads=c.num_attention_heads,
                    n_kv_heads=c.num_key_value_heads, n_layers=c.num_hidden_layers, mlp_hidden_size=c.intermediate_size,
                    vocab_size=c.vocab_size, embedding_size=c.vocab_size, max_sequence_length=c.max_position_embeddings,
                    rope_theta=float(getattr(c, "rope_theta", None) or c.rope_parameters["rope_theta"]),
                    rms_norm_eps=c.rms_norm_eps, weight_tying=bool(c.tie_word_embeddings), layer_norm_type="rms",
                    block_type="llama", activation_type="silu", include_bias=False, include_qkv_bias=False,
                    mask_token_id=int(mask_token_id), eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id,
                    bos_token_id=c.bos_token_id)
        state = _rename(state, LLAMA_TO_LLADA)
        if c.tie_word_embeddings:
            state.pop("model.transformer.ff_out.weight", None)
    else:
        raise ValueError(f"family must be one of {', '.join(FORMATS)}, got {family!r}")
    if family == "dream" and c.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_weights(state, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(data, indent=2, default=str))
    return out
