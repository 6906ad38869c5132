"""Block-causal diffusion LMs with a KV cache -- Fast-dLLM v2 and SDAR -- over transformers' Qwen2 / Qwen3.

Both families are the seed's own kind of model: the answer is written a block at a time, the block
being written is denoised in parallel, and finished blocks go into a KV cache.

* **Fast-dLLM v2** (Wu et al., "Fast-dLLM v2: Efficient Block-Diffusion LLM", arXiv:2509.26328, 2025;
  NVlabs, hub ``Efficient-Large-Model/Fast_dLLM_v2_1.5B`` / ``_7B``, ``model_type`` ``Fast_dLLM_Qwen``):
  Qwen2.5 layers (q/k/v biases); the head keeps its autoregressive meaning (**logit shift**: the
  output at position i - 1 predicts token i), so each block's first slot is written from the last
  committed token's output -- autoregressively.
* **SDAR** (JetAstra, "SDAR: A Synergistic Diffusion-AutoRegression Paradigm", 2025; hub
  ``JetLM/SDAR-1.7B-Chat`` / ``4B`` / ``8B``, ``model_type`` ``sdar``): Qwen3 layers (q/k RMSNorm);
  every slot is predicted **in place** (no shift).

The attention of both (what `BlockCausalModel` computes):

* **Blocks are aligned to absolute positions** 0, b, 2b, ... (b = the block size), the prompt included:
  a prompt that does not end on a block boundary leaves its tail in the first block decoded.
* **Full within a block, causal across blocks.** A query at position i sees every key at position j with
  ``j // b <= i // b`` (`block_causal_mask`). The prompt's whole blocks are prefilled with that mask;
  the block being denoised sees the whole cache and itself.
* **The cache holds each finished block once**, computed as the originals compute it: one forward over the
  finished block (bidirectional within it, all of the cache before it), its K/V kept (`extend`). A
  denoising forward (`block_logits`) keeps nothing (``DynamicCache.crop``).

What differs between the families is data, one row of `FAMILIES` each: the transformers architecture,
the logit shift, the MASK token and the block size the model was trained with. The MASK id is read
from ``config.json`` (``mask_token_id``), else from the checkpoint's tokenizer files (the family's MASK
token text), else the family's published id (Fast-dLLM v2: 151665); none of them is a guess.

`BlockCausalModel.forward` is the project's backbone protocol, so `clover_engine.decoding.decoder.BlockDecoder`
(the threshold rule) runs on these models as on Clover; the families' own samplers are
`clover_engine.decoding.block_diffusion_samplers`. Loading is lean (meta device, one tensor at a time:
`clover_engine.backbones.safetensors_shards`). The cost model prices a forward as a KV-cache transformer's
(weights once, the block's tokens of FLOPs, the cached history read).

Shape letters: L block slots, C cached tokens, n tokens of a forward, V vocab. Wing: ``backbones``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clover_engine.backbones.base import BlockOutput, Capabilities
from clover_engine.backbones.causal_lm.model import (
    HFBlockConfig, TransformersBackbone, _cache_kwarg, count_parameters, kv_cache_nbytes,
)
from clover_engine.backbones.safetensors_shards import (
    checkpoint_dtype, load_shards, materialize_buffers, meta_tensors, read_header, save_weights, shard_files,
)
from clover_engine.prompting import CHECKPOINT, CheckpointChatTemplate


@dataclass(frozen=True)
class Family:
    """One block-causal family: what its checkpoints do not say about themselves.

    Attributes:
        name: the family's name in the engine (``fast_dllm_v2``, ``sdar``).
        model_type: ``config.json``'s ``model_type`` (any case).
        architecture: the transformers architecture its weights load into (``qwen2`` / ``qwen3``).
        logit_shift: True: the output at position i - 1 predicts token i (Fast-dLLM v2).
        mask_token: the MASK token's text in the family's tokenizer.
        mask_token_id: the published MASK id, used when neither config nor tokenizer names one (None: none).
        block_size: the block size it was trained with (the config key ``bd_size`` / ``block_size`` wins).
        architectures: ``config.json``'s ``architectures`` when this project writes the family's layout.
        hub_fields: further ``config.json`` fields of the family's published checkpoints, written by
            `save_block_causal` so the family's own modeling code reads the file (unused here).
    """

    name: str
    model_type: str
    architecture: str
    logit_shift: bool
    mask_token: str
    mask_token_id: int | None
    block_size: int
    architectures: tuple[str, ...]
    hub_fields: tuple[tuple[str, Any], ...] = ()


FAMILIES: dict[str, Family] = {
    # Fast-dLLM v2: generation_functions.py of NVlabs/Fast-dLLM (v2/) fixes FAST_DLLM_MASK_ID = 151665 and
    # block_size 32 (the hub README: "Block Diffusion Size: 32 tokens")
    "fast_dllm_qwen": Family("fast_dllm_v2", "Fast_dLLM_Qwen", "qwen2", True, "|<MASK>|", 151665, 32,
                             ("Fast_dLLM_QwenForCausalLM",)),
    # SDAR: generate.py of JetAstra/SDAR reads the tokenizer's mask_token ('<MASK>', 151669 in SDAR-4B-Chat, whose
    # config.json also names it and block_size 4)
    "sdar": Family("sdar", "sdar", "qwen3", False, "<MASK>", None, 4, ("SDARForCausalLM",),
                   (("fuse_cross_entropy", True), ("micro_forward", False), ("skip_checkpoint", False),
                    ("debug", False), ("ep_size", 1), ("use_deepep", False))),
    # SDAR-30B-A3B: SDAR's decode on Qwen3-MoE layers (clover_engine.backbones.sdar_moe swaps the MoE feed-forwards in)
    "sdar_moe": Family("sdar", "sdar_moe", "qwen3", False, "<MASK>", None, 4, ("SDARMoeForCausalLM",),
                       (("fuse_cross_entropy", True), ("micro_forward", False), ("skip_checkpoint", False),
                        ("debug", False), ("ep_size", 1), ("use_deepep", False))),
}
"""Lower-cased ``model_type`` -> `Family`."""

FORMATS = {
    "fast_dllm_qwen": "a Fast-dLLM v2 block-diffusion checkpoint (Qwen2.5 layers, KV cache per block, logit shift) "
                      "(clover_engine.backbones.block_causal)",
    "sdar": "an SDAR block-diffusion checkpoint (Qwen3 layers, KV cache per block, no shift) "
            "(clover_engine.backbones.block_causal)",
    "sdar_moe": "an SDAR MoE block-diffusion checkpoint (Qwen3-MoE layers, expert union observed) "
                "(clover_engine.backbones.sdar_moe)",
}
"""Lower-cased ``model_type`` -> description, for `clover_engine.checkpoint.supported_formats`."""


@dataclass
class BlockCausalConfig(HFBlockConfig):
    """`HFBlockConfig` plus what a block-causal family adds (module docstring).

    Attributes:
        family: ``fast_dllm_v2`` or ``sdar``.
        logit_shift: the family's shift rule (`Family.logit_shift`).
        block_size: the block size the checkpoint was trained with.
        kv_cache: True: history is a KV cache (the cost model prices it so).
    """

    family: str = "sdar"
    logit_shift: bool = False
    block_size: int = 4
    kv_cache: bool = True


@dataclass
class BlockCausalState:
    """History of one decode.

    Attributes:
        cache: a transformers ``DynamicCache`` with the K/V of ``committed`` (every committed token).
        committed: every committed token id.
        last_logits: [1, V] fp32, the output at the last committed token (what predicts the next slot
            under the logit shift), or None before the first commit.
        memory_mode: always ``"state"``. window: 0 (the decoder and the cost model read it).
    """

    cache: Any
    committed: list[int] = field(default_factory=list)
    last_logits: torch.Tensor | None = None
    memory_mode: str = "state"
    window: int = 0

    @property
    def position(self) -> int:
        """Tokens committed so far (absolute position of the next token)."""
        return len(self.committed)

    def nbytes(self) -> int:
        """Bytes held by the KV cache."""
        return kv_cache_nbytes(self.cache)


def block_causal_mask(start: int, n: int, block_size: int, dtype: torch.dtype,
                      device: torch.device | str = "cpu") -> torch.Tensor:
    """The additive mask of a forward over positions ``start .. start + n - 1`` after ``start`` cached ones.

    Query i sees key j iff ``j // block_size <= i // block_size`` (absolute positions): full within a
    block, causal across blocks (SDAR's ``block_diffusion_attention_mask``; Fast-dLLM v2's
    ``eval_block_diff_mask``).

    Returns:
        [1, 1, n, start + n] of ``dtype``: 0 = attend, the dtype's minimum = blocked.
    """
    q = torch.arange(start, start + n, device=device) // block_size
    k = torch.arange(start + n, device=device) // block_size
    mask = torch.zeros(n, start + n, dtype=dtype, device=device)
    mask.masked_fill_(k[None, :] > q[:, None], torch.finfo(dtype).min)
    return mask[None, None]


class BlockCausalModel(TransformersBackbone):
    """A Fast-dLLM v2 / SDAR model over a transformers Qwen2 / Qwen3 LM (module docstring).

    Args:
        lm: a ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` holding the family's weights.
        config: its `BlockCausalConfig`.
    """

    def __init__(self, lm: nn.Module, config: BlockCausalConfig):
        super().__init__()
        self.lm = lm
        self.config = config
        self.model_id = config.name
        self.trained_block = config.block_size

    @property
    def capabilities(self) -> Capabilities:
        """Block-causal diffusion: history in a KV cache of whole blocks (`state` only), nothing to observe
        beyond the logits, forwards priced as a KV-cache transformer's."""
        return Capabilities(family="block_causal", memory_modes=("state",), observables=frozenset(),
                            cost_family="kv_cache", chat_template=self.chat_format, chat_system=self.chat_system,
                            largest_trained_block=self.trained_block, trained_context=self.trained_context)

    def setup_state(self, batch_size: int = 1, memory_mode: str = "state") -> BlockCausalState:
        """An empty history (no committed tokens, empty KV cache).

        Raises:
            ValueError: ``batch_size != 1`` or a memory mode other than ``state``.
        """
        from transformers import DynamicCache  # local: transformers is imported only when a model is used

        self.check_state_args(batch_size, memory_mode, "block-causal backbone",
                              "a block-causal model keeps all history in its KV cache")
        return BlockCausalState(cache=DynamicCache())

    def _run(self, state: BlockCausalState, ids: list[int] | torch.Tensor, mask: torch.Tensor,
             keep: bool, rows: torch.Tensor | int | None = None) -> torch.Tensor:
        """One forward of ``ids`` at positions ``state.position ..`` with ``mask``; logits [1, n, V] fp32, or
        only the output rows ``rows`` (a 1-D int64 tensor of row indices, or an int: the last ``rows``) --
        transformers' ``logits_to_keep``: the layers run over all n tokens, the output layer over those rows."""
        device = self.device
        ids = torch.as_tensor(ids, dtype=torch.long, device=device).reshape(1, -1)
        start, n = state.position, ids.shape[1]
        if start + n > self.config.max_position_embeddings:
            raise ValueError(f"position {start + n} exceeds max_position_embeddings="
                             f"{self.config.max_position_embeddings}; shorten the prompt or max_new_tokens")
        pos = torch.arange(start, start + n, device=device)[None]
        keep_rows = {} if rows is None else {"logits_to_keep": rows}
        out = self.lm(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **keep_rows,
                      **{_cache_kwarg(self.lm): state.cache})
        if not keep:
            state.cache.crop(-n)
        return out.logits.float()

    def extend(self, state: BlockCausalState, ids: list[int] | torch.Tensor, block_size: int,
               all_logits: bool = False) -> torch.Tensor:
        """Commit ``ids`` (n tokens) to the history: their K/V computed block-causally and kept.

        A prompt's whole blocks (the prefill) and a finished block (the commit) both go through here.

        Args:
            state: from `setup_state`; extended in place (cache, ``committed``, ``last_logits``).
            ids: n token ids; ``state.position`` should be a multiple of ``block_size``.
            block_size: the block size of the alignment (`block_causal_mask`).
            all_logits: return every row's logits; by default only the last row is computed, the only
                one a sampler reads (the output layer over a long prompt would otherwise cost n x V).

        Returns:
            [1, n, V] fp32 logits with ``all_logits`` (row i = the output at the i-th committed token),
            else [1, 1, V]: the output at the last committed token.
        """
        n = len(ids)
        if n == 0:
            return torch.zeros(1, 0, self.config.vocab_size)
        mask = block_causal_mask(state.position, n, block_size, self.dtype, self.device)
        logits = self._run(state, ids, mask, keep=True, rows=None if all_logits else 1)
        state.committed.extend(int(t) for t in torch.as_tensor(ids).reshape(-1).tolist())
        state.last_logits = logits[:, -1]
        return logits

    def block_logits(self, state: BlockCausalState, block_ids: torch.Tensor,
                     rows: torch.Tensor | None = None) -> torch.Tensor:
        """One denoising forward: ``block_ids`` [1, L] right after the history, full attention to the cache
        and within the block; nothing is kept.

        Args:
            rows: 1-D int64 slot indices whose output rows to compute (None: all L). Every slot still runs
                through the layers; only the output layer (L x V) is cut to the rows a sampler reads.

        Returns:
            [1, L, V] fp32 raw logits (row j = the output at slot j; no shift applied), or [1, len(rows), V].
        """
        L = block_ids.shape[1]
        mask = torch.zeros(1, 1, L, state.position + L, dtype=self.dtype, device=self.device)
        return self._run(state, block_ids, mask, keep=False, rows=rows)

    def forward(self, block_ids: torch.Tensor, state: BlockCausalState, commit_ids: torch.Tensor | None = None,
                block_size: int | None = None, observe: bool = False) -> BlockOutput:
        """The backbone protocol (`clover_engine.backbones.base`): commit, then predict every slot of the block.

        Args:
            block_ids: [1, L] int64, the current block (prompt head, written tokens, MASK); slot 0 sits at
                absolute position ``state.position`` after the commit.
            state: from `setup_state`.
            commit_ids: [1, C] finished tokens (whole aligned blocks), committed with `extend` first.
            block_size: the alignment of the commit (default L).
            observe: unused (no Clover observables).

        Returns:
            `BlockOutput` with logits [1, L, V] fp32: row j predicts slot j (under the logit shift row 0 is
            the output at the last committed token, zeros when nothing is committed -- slot 0 is then a
            prompt token), and ``None`` for expert_union, memory_share and state_norm.

        Raises:
            ValueError: ``block_ids`` not [1, L], or history + block beyond ``max_position_embeddings``.
        """
        if block_ids.dim() != 2 or block_ids.shape[0] != 1:
            raise ValueError(f"block_ids must be [1, L], got shape {tuple(block_ids.shape)}")
        L = block_ids.shape[1]
        if commit_ids is not None and commit_ids.shape[1]:
            self.extend(state, commit_ids[0], block_size or L)
        logits = self.block_logits(state, block_ids)
        if self.config.logit_shift:
            head = (state.last_logits[:, None] if state.last_logits is not None
                    else logits.new_zeros(1, 1, logits.shape[-1]))
            logits = torch.cat([head, logits[:, :-1]], 1)
        return BlockOutput(logits=logits, expert_union=None)


# ------------------------------------------------------------------ loading
def family_of(model_type: Any) -> Family | None:
    """The `Family` of a ``config.json`` ``model_type`` (any case), or None."""
    return FAMILIES.get(model_type.lower()) if isinstance(model_type, str) else None


def _hf_config(data: dict, family: Family) -> Any:
    from transformers import Qwen2Config, Qwen3Config  # local: transformers is heavy

    skip = {"model_type", "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype", "bd_size",
            "block_size", "mask_token_id", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
            "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob", "output_router_logits",
            "router_aux_loss_coef"}  # the MoE fields: clover_engine.backbones.sdar_moe builds the MoE layers
    cls = Qwen2Config if family.architecture == "qwen2" else Qwen3Config
    return cls(**{k: v for k, v in data.items() if k not in skip})


def _tokenizer_mask_id(directory: Path, text: str) -> int | None:
    """The id of the added token ``text`` in the checkpoint's tokenizer files, or None."""
    added = directory / "added_tokens.json"
    if added.is_file():
        table = json.loads(added.read_text(encoding="utf-8"))
        if text in table:
            return int(table[text])
    tok = directory / "tokenizer.json"
    if tok.is_file():
        for entry in json.loads(tok.read_text(encoding="utf-8")).get("added_tokens", []):
            if entry.get("content") == text:
                return int(entry["id"])
    return None


def mask_token_id_of(directory: Path, data: dict, family: Family) -> int:
    """The MASK id: ``config.json``'s ``mask_token_id``, else the tokenizer's ``family.mask_token``, else
    ``family.mask_token_id``.

    Raises:
        ValueError: none of the three names one.
    """
    for found in (data.get("mask_token_id"), _tokenizer_mask_id(directory, family.mask_token), family.mask_token_id):
        if found is not None:
            return int(found)
    raise ValueError(f"{directory}: no MASK id -- config.json has no mask_token_id and the tokenizer files have no "
                     f"{family.mask_token!r} token; add mask_token_id to config.json")


def _stop_id(directory: Path) -> int | None:
    """The first ``eos_token_id`` of ``generation_config.json`` (a chat model's end of turn, ``<|im_end|>``,
    which the originals stop on), or None to keep ``config.json``'s."""
    path = directory / "generation_config.json"
    if not path.is_file():
        return None
    eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    return int(eos) if isinstance(eos, int) else None


def load_block_causal(path: str | Path, device: str | torch.device = "cpu",
                      dtype: torch.dtype | None = None, *, prepare=None,
                      model_cls: type | None = None) -> BlockCausalModel:
    """Load a Fast-dLLM v2 or SDAR checkpoint directory (hub layout) as a `BlockCausalModel`, leanly.

    Built on the meta device, then the safetensors shards are read one tensor at a time straight into
    ``dtype`` on ``device`` (`clover_engine.backbones.safetensors_shards`; peak memory: the weights plus
    the largest tensor). Callers hold `clover_engine.backbones.registry.BUILD_LOCK` (``load_model`` does).

    Args:
        path: the directory (``config.json`` + ``*.safetensors``), or a file in it.
        device: where the weights are read to.
        dtype: the weights' dtype; None = the checkpoint's own. Logits are fp32 whatever the dtype.
        prepare: ``prepare(lm, data) -> dict`` called on the meta-device LM before the weights are read
            (a variant swaps its layers: `clover_engine.backbones.sdar_moe`); returns further config fields.
        model_cls: the `BlockCausalModel` subclass to build (default `BlockCausalModel`), whose
            ``config_cls`` attribute, if any, is the config dataclass taking those fields.

    Returns:
        The model in ``eval()`` mode, ``model_id`` = the directory's name, ``checkpoint_chat`` = the
        checkpoint's own chat template (None when it ships none).

    Raises:
        ValueError: no config.json, a ``model_type`` of neither family, no MASK id (`mask_token_id_of`),
            no safetensors, a truncated / corrupt shard, or weights that do not match the architecture.
    """
    from transformers import AutoModelForCausalLM  # local: transformers is heavy

    directory = Path(path)
    directory = directory.parent if directory.is_file() else directory
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{directory} has no config.json; a Fast-dLLM v2 / SDAR checkpoint directory holds "
                         "config.json and *.safetensors")
    data = json.loads(config_path.read_text(encoding="utf-8"))
    family = family_of(data.get("model_type"))
    if family is None:
        raise ValueError(f"{config_path}: model_type={data.get('model_type')!r} is not a block-causal format; "
                         f"supported: {', '.join(f.model_type for f in FAMILIES.values())}")
    hf_cfg = _hf_config(data, family)
    mask_id = mask_token_id_of(directory, data, family)
    block = int(data.get("bd_size") or data.get("block_size") or family.block_size)
    shards = [read_header(f) for f in shard_files(directory)]
    dtype = dtype or checkpoint_dtype(data, shards)
    with torch.device("meta"):  # no memory, no random init; safe under BUILD_LOCK
        lm = AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype, attn_implementation="sdpa")
        extra = prepare(lm, data) if prepare is not None else {}
    tied = frozenset({"lm_head.weight"}) if getattr(hf_cfg, "tie_word_embeddings", False) else frozenset()
    load_shards(lm, shards, rename=lambda name: name, device=device, optional=tied,
                what=f"a {family.name} model of this config")
    if tied:
        lm.tie_weights()
    materialize_buffers(lm, device)
    left = meta_tensors(lm)
    if left:
        raise ValueError(f"{directory}: {len(left)} tensor(s) were left unloaded (on the meta device): {left[:5]}")
    base = HFBlockConfig.from_hf(hf_cfg, directory.name, mask_id, eos_token_id=_stop_id(directory),
                                 num_parameters=count_parameters(lm.eval()))
    model_cls = model_cls or BlockCausalModel
    cfg = getattr(model_cls, "config_cls", BlockCausalConfig)(
        **dataclasses.asdict(base), family=family.name, logit_shift=family.logit_shift, block_size=block, **extra)
    model = model_cls(lm, cfg).eval()
    model.checkpoint_chat = CheckpointChatTemplate.from_directory(directory)
    model.chat_format = CHECKPOINT if model.checkpoint_chat is not None else None
    return model


def save_block_causal(lm: nn.Module, path: str | Path, model_type: str, mask_token_id: int,
                      block_size: int | None = None) -> Path:
    """Write a transformers Qwen2 (Fast-dLLM v2) / Qwen3 (SDAR) LM as a checkpoint in the family's hub layout.

    The inverse of `load_block_causal` (the fidelity tests' tiny checkpoints, and a model trained here
    handed to the family's own code): Qwen weight names, ``config.json`` with the family's ``model_type``
    and ``architectures``, ``mask_token_id`` and the trained block size (``bd_size``).

    Raises:
        ValueError: an unknown ``model_type``, or an LM whose architecture is not the family's.
    """

    family = family_of(model_type)
    if family is None:
        raise ValueError(f"model_type must be one of {', '.join(f.model_type for f in FAMILIES.values())}, "
                         f"got {model_type!r}")
    if lm.config.model_type != family.architecture:
        raise ValueError(f"a {family.name} checkpoint holds a {family.architecture} LM, got {lm.config.model_type}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in lm.state_dict().items()}
    if lm.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    data = lm.config.to_dict()
    rope = data.get("rope_parameters") or {}
    if "rope_theta" in rope:  # the hub configs (transformers 4.x) name it at the top level
        data.setdefault("rope_theta", rope["rope_theta"])
    data.update(dict(family.hub_fields))
    data.update(model_type=family.model_type, architectures=list(family.architectures), mask_token_id=int(mask_token_id),
                bd_size=int(block_size or family.block_size))
    save_weights(state, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(data, indent=2, default=str))
    return out


CHATML_TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                   "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
"""Qwen's ChatML chat template (the shape of Fast-dLLM v2's and SDAR's), for `write_tiny_block_causal`."""


def write_tiny_block_causal(directory: str | Path, model_type: str, seed: int = 0, sharpen: float = 100.0,
                            block_size: int = 8, **changes: Any) -> Path:
    """Write a tiny random checkpoint of a block-causal family in its hub layout, tokenizer and chat template
    included, to try the engine, the explorer and the tutorials without a download.

    Two layers, hidden 64, a byte-level tokenizer (`clover_engine.tokenizer.byte_tokenizer`, ChatML special
    tokens) plus the family's MASK token -- named in ``added_tokens.json`` as the hub checkpoints do (no
    ``mask_token_id`` in ``config.json``) -- ``generation_config.json`` with ``<|im_end|>`` as the end of a
    turn, and the output layer multiplied by ``sharpen`` (default 100: some slots confident, so a forward can
    write several; at 12 nearly every slot is a forced fill). ``changes`` override the Qwen config's fields
    (e.g. ``hidden_size=512`` for a checkpoint of some size).

    Raises:
        ValueError: an unknown ``model_type``.
    """
    import transformers  # local: transformers is heavy

    from clover_engine.tokenizer import byte_tokenizer  # local: only this writer needs it

    family = family_of(model_type)
    if family is None:
        raise ValueError(f"model_type must be one of {', '.join(f.model_type for f in FAMILIES.values())}, "
                         f"got {model_type!r}")
    out = Path(directory)
    tok = byte_tokenizer()
    tok.add_special_tokens([family.mask_token])
    mask_id, eos, pad = tok.token_to_id(family.mask_token), tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    dims = dict(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                eos_token_id=pad, bos_token_id=pad, pad_token_id=pad, rope_theta=10000.0, rms_norm_eps=1e-6,
                tie_word_embeddings=False) | changes
    cls, cfg_cls = ((transformers.Qwen2ForCausalLM, transformers.Qwen2Config) if family.architecture == "qwen2"
                    else (transformers.Qwen3ForCausalLM, transformers.Qwen3Config))
    torch.manual_seed(seed)
    lm = cls(cfg_cls(**dims)).eval()
    with torch.no_grad():
        lm.lm_head.weight.mul_(sharpen)
    save_block_causal(lm, out, model_type, mask_id, block_size)
    data = json.loads((out / "config.json").read_text())
    data.pop("mask_token_id")  # as published: the MASK id comes from the tokenizer's added tokens
    (out / "config.json").write_text(json.dumps(data, indent=2))
    tok.save(str(out / "tokenizer.json"))
    (out / "added_tokens.json").write_text(json.dumps({family.mask_token: mask_id}))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                                           "mask_token": family.mask_token,
                                                           "chat_template": CHATML_TEMPLATE}))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, pad], "pad_token_id": pad}))
    return out


__all__ = ["FAMILIES", "FORMATS", "BlockCausalConfig", "BlockCausalModel", "BlockCausalState", "Family",
           "block_causal_mask", "family_of", "load_block_causal", "mask_token_id_of", "save_block_causal",
           "write_tiny_block_causal"]
