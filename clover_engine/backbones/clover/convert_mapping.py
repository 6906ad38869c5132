"""The Qwen3.5-MoE -> Clover mapping (backbones wing, Clover family): how a transformers
Qwen3.5-MoE checkpoint's config, tensors and tokenizer become a Clover model's.

* the source config (`read_source_config`) translated into a `CloverConfig` (`clover_config`);
* the source tensors (`SourceWeights`, read lazily with safetensors) copied under their own names
  (`source_name`), experts stored one per module stacked into ``gate_up_proj`` / ``down_proj``
  (`copy_shared_weights`);
* Clover's own parameters (`CLOVER_ONLY`) set so that ``block_size = 1`` stays close to the source
  (`CloverInit`, `init_clover_parameters`);
* the MASK token found in, or added to, the tokenizer (`mask_token`).

`clover_engine.convert` (``python -m clover_engine.convert``) builds the model with these, saves it, measures its
agreement with the source and writes the model card; its module docstring says what is done and
where the two architectures cannot agree.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clover_engine.backbones.checkpoint_dir import CONFIG_NAME
from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.backbones.clover.weights import _read_header, _weight_files

QWEN3_5_MOE_MODEL_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
"""``config.json`` ``model_type`` values of a Qwen3.5-MoE checkpoint (multimodal, text-only)."""
MASK_TOKEN_NAMES = ("<|mask|>", "<mask>", "<|MASK|>", "[MASK]", "<|mask_token|>")
"""Tokens taken as an existing MASK, in this order; if none is in the tokenizer, ``<|mask|>`` is added."""
MEMORY_OFF_LOGIT = -30.0
"""Memory-unit logit bias that switches an attention layer's memory read-out off (softmax share
below ``e^-30 ~ 1e-13`` of one key's)."""
SKIPPED_PREFIXES = ("mtp.", "model.visual.", "visual.", "model.vision_tower.", "vision_tower.")
"""Source tensors that have no counterpart in Clover: the multi-token-prediction head and the
vision tower. They are counted in the model card, never copied."""


@dataclass(frozen=True)
class CloverInit:
    """Values given to Clover's own parameters by the converter.

    Attributes:
        attention_memory_logit: attention layers' ``mem_b_logit`` (per head); `MEMORY_OFF_LOGIT`
            keeps their output equal to the source's attention in ``state+window`` mode.
        gdn_memory_logit: GDN layers' ``mem_logit_bias`` (per head). 6 gives the state read-out
            ~99.75% of the softmax at ``block_size = 1`` (the self score is ``temperature * cos(q, k)``,
            ~0): the output is nearly the source's ``S^T q``. Same-position agreement in ``state+window``
            mode (`measure_agreement`; 4 tiny random Qwen3.5-MoE sources as in tests/clover_engine/test_convert.py,
            seeds 0-3, 64 tokens each), by bias: 0 -> 0.27, 3 (a fresh Clover model's) -> 0.51,
            6 -> 0.76, 30 -> 0.77; 6 keeps a gradient for the in-block term that 30 would not.
        gdn_block_temperature: GDN layers' ``block_temperature`` (per head): the scale of the
            in-block scores ``cos(q_i, k_j)``; a fresh Clover model's 9.
        seed: torch seed for the attention memory gates (``mem_a``, ``mem_b``, ``mem_A_log``,
            ``mem_dt_bias``), initialised as a fresh Clover model's.
    """

    attention_memory_logit: float = MEMORY_OFF_LOGIT
    gdn_memory_logit: float = 6.0
    gdn_block_temperature: float = 9.0
    seed: int = 0


# ------------------------------------------------------------------------------ config
def read_source_config(src: str | Path) -> dict[str, Any]:
    """The text config of a Qwen3.5-MoE checkpoint directory, as a dict.

    Raises:
        ValueError: no ``config.json``, invalid JSON, or a ``model_type`` other than
            `QWEN3_5_MOE_MODEL_TYPES`.
    """
    path = Path(src) / CONFIG_NAME
    if not path.is_file():
        raise ValueError(f"{src} has no {CONFIG_NAME}; pass a transformers checkpoint directory (save_pretrained)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    mt = data.get("model_type")
    if mt not in QWEN3_5_MOE_MODEL_TYPES:
        raise ValueError(
            f"{path} has model_type={mt!r}; --from qwen3_5_moe converts model_type "
            f"{' or '.join(repr(m) for m in QWEN3_5_MOE_MODEL_TYPES)}"
        )
    if mt == "qwen3_5_moe":
        text = data.get("text_config")
        if not isinstance(text, dict):
            raise ValueError(f"{path}: model_type 'qwen3_5_moe' without a text_config object")
        data = {**text, "tie_word_embeddings": text.get("tie_word_embeddings", data.get("tie_word_embeddings", False))}
    return data


def _rope(cfg: dict[str, Any]) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) of a source config; refuses RoPE scaling Clover lacks."""
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind not in ("default", "mrope"):
        raise ValueError(f"the source uses rope_type {kind!r}; Clover's RoPE is the default one (no scaling)")
    theta = rp.get("rope_theta", cfg.get("rope_theta", 10_000_000.0))
    factor = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    return float(theta), float(factor)


def _eos_id(src: Path, cfg: dict[str, Any]) -> int:
    eos = cfg.get("eos_token_id")
    if eos is None and (src / "generation_config.json").is_file():
        eos = json.loads((src / "generation_config.json").read_text()).get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is None:
        raise ValueError(f"{src}: neither config.json nor generation_config.json names an eos_token_id; "
                         f"pass --eos-token-id")
    return int(eos)


def clover_config(src_cfg: dict[str, Any], *, name: str, eos_token_id: int, mask_token_id: int,
                  vocab_size: int, window: int, init: CloverInit) -> CloverConfig:
    """Translate a Qwen3.5-MoE text config into a `CloverConfig` (same field names).

    Raises:
        ValueError: what Clover cannot represent: an activation other than SiLU, attention
            biases, RoPE scaling, or an inconsistent size (from `CloverConfig`).
    """
    if src_cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {src_cfg['hidden_act']!r}: Clover's experts are SwiGLU (silu)")
    if src_cfg.get("attention_bias"):
        raise ValueError("attention_bias=true: Clover's attention projections have no bias")
    theta, factor = _rope(src_cfg)
    keys = ("hidden_size", "num_hidden_layers", "layer_types", "rms_norm_eps", "max_position_embeddings",
            "tie_word_embeddings", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim", "num_attention_heads", "num_key_value_heads",
            "head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
            "shared_expert_intermediate_size", "pad_token_id")
    fields = {k: src_cfg[k] for k in keys if src_cfg.get(k) is not None}
    if "full_attention_interval" in src_cfg:
        fields["full_attention_interval"] = src_cfg["full_attention_interval"]
    return CloverConfig(
        name=name, vocab_size=vocab_size, rope_theta=theta, partial_rotary_factor=factor,
        attention_conv_kernel_dim=0, attention_window=window, norm_topk_prob=True,
        memory_logit_bias_init=init.gdn_memory_logit, block_temperature_init=init.gdn_block_temperature,
        mask_token_id=mask_token_id, eos_token_id=eos_token_id, **fields,
    )


# ----------------------------------------------------------------------------- weights
_EXPERT = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


def source_name(stored: str) -> str | None:
    """The Clover name of a source tensor (transformers' in-memory name), or None for a tensor
    Clover has no counterpart of (`SKIPPED_PREFIXES`). ``model.language_model.`` (the multimodal
    checkpoint's text model) becomes ``model.``."""
    if stored.startswith(SKIPPED_PREFIXES):
        return None
    if stored.startswith("model.language_model."):
        return "model." + stored[len("model.language_model."):]
    return stored


class SourceWeights:
    """The tensors of a transformers checkpoint directory, read lazily with safetensors.

    Args:
        src: the directory (``model.safetensors`` or an index with shards).

    Raises:
        ValueError: no safetensors weights (only pickle files, or none), or a damaged file.
    """

    def __init__(self, src: Path):
        if not (src / "model.safetensors").is_file() and not (src / "model.safetensors.index.json").is_file():
            pickles = sorted(p.name for p in src.glob("*.bin")) + sorted(p.name for p in src.glob("*.pt"))
            hint = (f" (it holds {', '.join(pickles[:3])}: pickle files, which are never read here -- re-save the "
                    f"model with save_pretrained(..., safe_serialization=True))") if pickles else ""
            raise ValueError(f"{src} has no model.safetensors or model.safetensors.index.json{hint}")
        self.where: dict[str, Path] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for path in _weight_files(src):
            for name, (_, shape) in _read_header(path).items():
                self.where[name] = path
                self.shapes[name] = shape

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self.where[name]), framework="pt", device="cpu") as f:
            return f.get_tensor(name)


def copy_shared_weights(model: torch.nn.Module, weights: SourceWeights) -> dict[str, Any]:
    """Copy every source tensor into the Clover parameter of the same meaning (in place).

    Experts stored one per module are stacked: ``experts.{e}.gate_proj`` / ``up_proj`` [F, D] into
    ``experts.gate_up_proj[e]`` [2F, D] (gate rows first), ``experts.{e}.down_proj`` [D, F] into
    ``experts.down_proj[e]``. Embedding and LM head rows beyond the source vocabulary (a grown
    vocabulary) are left to the caller.

    Returns:
        ``{"copied": [clover names], "skipped": [source names without a counterpart]}``.

    Raises:
        ValueError: a source tensor with no Clover parameter, or of another shape.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    copied: set[str] = set()
    skipped: list[str] = []
    expert_parts: dict[str, set[tuple[int, str]]] = {}  # stacked name -> {(expert, gate|up|down)} copied
    with torch.no_grad():
        for stored in weights.where:
            name = source_name(stored)
            if name is None:
                skipped.append(stored)
                continue
            m = _EXPERT.fullmatch(name)
            if m:
                base, e, which = m[1], int(m[2]), m[3]
                t = weights.get(stored)
                if which == "down_proj":
                    target, rows = params[f"{base}.down_proj"][e], slice(None)
                else:
                    target = params[f"{base}.gate_up_proj"][e]
                    F_ = target.shape[0] // 2
                    rows = slice(0, F_) if which == "gate_proj" else slice(F_, 2 * F_)
                if tuple(target[rows].shape) != tuple(t.shape):
                    raise ValueError(f"source tensor {stored!r} has shape {list(t.shape)}, Clover's "
                                     f"{base}.{'down_proj' if which == 'down_proj' else 'gate_up_proj'}[{e}] "
                                     f"slice expects {list(target[rows].shape)}")
                target[rows].copy_(t)
                expert_parts.setdefault(f"{base}.{'down_proj' if which == 'down_proj' else 'gate_up_proj'}",
                                        set()).add((e, which))
                continue
            if name not in params:
                raise ValueError(f"source tensor {stored!r} (as {name!r}) has no counterpart in the Clover model; "
                                 f"is SRC a Qwen3.5-MoE checkpoint of this config?")
            t, p = weights.get(stored), params[name]
            if name in ("model.embed_tokens.weight", "lm_head.weight") and t.shape[0] < p.shape[0]:
                p[: t.shape[0]].copy_(t)  # a vocabulary grown by the MASK row
            elif tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"source tensor {stored!r} has shape {list(t.shape)}, Clover's {name!r} "
                                 f"expects {list(p.shape)}")
            else:
                p.copy_(t)
            copied.add(name)
    for name, parts in expert_parts.items():  # a stacked tensor counts as copied only when every expert was
        E = params[name].shape[0]
        want = {(e, w) for e in range(E) for w in (("down_proj",) if name.endswith("down_proj") else ("gate_proj", "up_proj"))}
        if parts != want:
            miss = sorted(want - parts)[:3]
            raise ValueError(f"the source lacks expert tensors of {name} (e.g. experts {miss}); are all shards present?")
        copied.add(name)
    return {"copied": sorted(copied), "skipped": skipped}


CLOVER_ONLY = re.compile(r".*\.(mem_w|mem_logit_bias|block_temperature|mem_a\.weight|mem_b\.weight|mem_A_log|"
                         r"mem_dt_bias|mem_b_logit)")
"""Names of the parameters only Clover has (the memory unit, its gates and the GDN block temperature)."""


def init_clover_parameters(model: torch.nn.Module, init: CloverInit) -> list[str]:
    """Set every Clover-only parameter (`CLOVER_ONLY`) as `init` says; returns their names.

    Attention memory gates: ``mem_a`` / ``mem_b`` weights N(0, 0.02), ``mem_A_log`` = log U(1, 16),
    ``mem_dt_bias`` as flash-linear-attention's GatedDeltaNet (`clover_engine.backbones.clover.ops.dt_bias_init`),
    like a fresh `CloverModel` but from a generator seeded with ``init.seed`` (the global torch RNG
    is left alone); ``mem_w`` = 0 in both mixers, so the memory logit is the bias alone.
    """
    g = torch.Generator().manual_seed(init.seed)
    names = []
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            if layer.layer_type == "linear_attention":
                mix, prefix = layer.linear_attn, f"model.layers.{i}.linear_attn"
                mix.mem_w.zero_()
                mix.mem_logit_bias.fill_(init.gdn_memory_logit)
                mix.block_temperature.fill_(init.gdn_block_temperature)
                names += [f"{prefix}.{n}" for n in ("mem_w", "mem_logit_bias", "block_temperature")]
            else:
                mix, prefix = layer.self_attn, f"model.layers.{i}.self_attn"
                mix.mem_w.zero_()
                mix.mem_b_logit.fill_(init.attention_memory_logit)
                for lin in (mix.mem_a, mix.mem_b):
                    lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 0.02)
                mix.mem_A_log.copy_(torch.log(torch.empty(mix.mem_A_log.shape).uniform_(1, 16, generator=g)))
                dt = torch.exp(torch.empty(mix.mem_dt_bias.shape).uniform_(math.log(1e-3), math.log(0.1), generator=g))
                mix.mem_dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
                names += [f"{prefix}.{n}" for n in ("mem_w", "mem_b_logit", "mem_a.weight", "mem_b.weight",
                                                    "mem_A_log", "mem_dt_bias")]
    return names


# ---------------------------------------------------------------------------- tokenizer
def mask_token(tokenizer, vocab_size: int) -> tuple[int, bool]:
    """The MASK id for a converted model, adding ``<|mask|>`` to `tokenizer` if it has none of
    `MASK_TOKEN_NAMES`.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (changed in place when a token is added), or None.
        vocab_size: rows of the source embedding.

    Returns:
        (mask id, added): ``added`` is True when the MASK row is new to the model (its input
        embedding must be initialised): a token added to the tokenizer, or, without a tokenizer,
        the row ``vocab_size`` (the vocabulary grows by one).
    """
    if tokenizer is None:
        return vocab_size, True
    for name in MASK_TOKEN_NAMES:
        tid = tokenizer.token_to_id(name)
        if tid is not None and tid < vocab_size:
            return tid, False
    from tokenizers import AddedToken

    tokenizer.add_special_tokens([AddedToken("<|mask|>", special=True, normalized=False)])
    return tokenizer.token_to_id("<|mask|>"), True
