"""Model configuration for the Clover block-diffusion architecture.

`CloverConfig` follows the field names of the Hugging Face Qwen3.5-MoE text
config (``linear_num_key_heads``, ``moe_intermediate_size`` ...) so that a
converted checkpoint's ``config.json`` reads the same, plus the few fields the
block-diffusion changes add (memory unit, window, MASK id).

Presets (``CloverConfig.from_name``):

* ``clover-35b-a3b`` -- the published Qwen3.5-MoE 35B-A3B text dimensions
  (docs/architecture.md §3). No weights exist here; the preset drives the cost
  model.
* ``clover-test`` -- a tiny random configuration for tests: both layer types,
  a handful of experts, a 320-token vocabulary (byte tokenizer + specials).

`recorded_clover_config` rebuilds the config of the model that recorded a trace (the recording
wing keeps it as a dict and builds no backbone config).

Wing: ``backbones``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LAYER_TYPES = ("linear_attention", "full_attention")


@dataclass
class CloverConfig:
    """Hyper-parameters of a Clover model (a Qwen3.5-MoE-shaped hybrid).

    Raises:
        ValueError: on inconsistent sizes (heads that do not divide, unknown
            layer types, a MASK/EOS id outside the vocabulary ...), naming the
            field and the fix.
    """

    name: str = "clover"
    vocab_size: int = 248320
    hidden_size: int = 2048
    num_hidden_layers: int = 40
    # One entry per layer; default = 3 x GDN then 1 x full attention, repeated.
    layer_types: list[str] | None = None
    full_attention_interval: int = 4
    rms_norm_eps: float = 1e-6
    # Context the model was built for (positions); prompts beyond it are refused.
    max_position_embeddings: int = 262144
    tie_word_embeddings: bool = False

    # Gated DeltaNet (linear attention) layers.
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4

    # Gated full-attention layers.
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    head_dim: int = 256
    partial_rotary_factor: float = 0.25
    rope_theta: float = 10_000_000.0
    # Short causal depthwise conv on the attention layers' q/k/v projections
    # (Primer, So et al. 2021, arXiv:2109.08668, kernel 3; no activation).
    # Gives keys and queries the previous tokens' features that induction /
    # copying needs. 0 = none (Qwen3.5 has none).
    attention_conv_kernel_dim: int = 0

    # Mixture of experts.
    num_experts: int = 256
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    norm_topk_prob: bool = True

    # Block-diffusion additions (docs/architecture.md §3).
    # Initial bias of the memory-unit logit; in pilot runs it barely moved from
    # its init, so it effectively sets the history/block balance.
    memory_logit_bias_init: float = 3.0
    # Initial per-head temperature of in-block scores in GDN layers (q/k are
    # L2-normalised there, so raw cosine scores would give a flat softmax).
    block_temperature_init: float = 9.0
    # Window W of committed K/V kept by full-attention layers in the
    # `state+window` memory mode (0 = the mode is unavailable).
    attention_window: int = 0

    # Special tokens.
    mask_token_id: int = 248319
    eos_token_id: int = 248044
    pad_token_id: int | None = None

    model_type: str = "clover"

    def __post_init__(self) -> None:
        if self.layer_types is None:
            n = self.full_attention_interval
            self.layer_types = [
                "full_attention" if (i + 1) % n == 0 else "linear_attention"
                for i in range(self.num_hidden_layers)
            ]
        self.layer_types = list(self.layer_types)
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries but num_hidden_layers="
                f"{self.num_hidden_layers}; give one type per layer"
            )
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise ValueError(f"unknown layer type(s) {bad}; expected one of {LAYER_TYPES}")
        for name in (
            "vocab_size", "hidden_size", "num_hidden_layers", "linear_num_key_heads",
            "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim", "num_attention_heads", "num_key_value_heads", "head_dim",
            "num_experts", "num_experts_per_tok", "moe_intermediate_size",
            "max_position_embeddings",
        ):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) exceeds num_experts "
                f"({self.num_experts})"
            )
        if not 0.0 <= self.partial_rotary_factor <= 1.0:
            raise ValueError(f"partial_rotary_factor must be in [0, 1], got {self.partial_rotary_factor}")
        if self.attention_conv_kernel_dim < 0:
            raise ValueError(f"attention_conv_kernel_dim must be >= 0 (0 = no conv), got {self.attention_conv_kernel_dim}")
        if self.attention_window < 0:
            raise ValueError(f"attention_window must be >= 0, got {self.attention_window}")
        for name in ("mask_token_id", "eos_token_id"):
            tok = getattr(self, name)
            if not 0 <= tok < self.vocab_size:
                raise ValueError(f"{name}={tok} is outside the vocabulary [0, {self.vocab_size})")
        if self.mask_token_id == self.eos_token_id:
            raise ValueError("mask_token_id and eos_token_id must differ")

    # ----------------------------------------------------------------- derived
    @property
    def rotary_dim(self) -> int:
        """Rotated dims of the attention head (even), `head_dim * partial_rotary_factor`."""
        return int(self.head_dim * self.partial_rotary_factor) // 2 * 2

    @property
    def linear_rotary_dim(self) -> int:
        """Rotated dims of GDN in-block q/k (same fraction as attention)."""
        return int(self.linear_key_head_dim * self.partial_rotary_factor) // 2 * 2

    @property
    def num_linear_layers(self) -> int:
        return sum(t == "linear_attention" for t in self.layer_types)

    @property
    def num_full_layers(self) -> int:
        return sum(t == "full_attention" for t in self.layer_types)

    # --------------------------------------------------------------- presets
    @classmethod
    def from_name(cls, name: str) -> "CloverConfig":
        """Return a preset by name (see `PRESETS`).

        Raises:
            ValueError: for an unknown name, listing the known ones.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}")
        return cls(name=name, **PRESETS[name])

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, path: str | Path | None = None) -> str:
        """Serialise as an HF-style ``config.json`` (written to `path` if given)."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CloverConfig":
        """Build from a dict; unknown keys (HF extras like ``architectures``) are ignored.

        Raises:
            ValueError: if ``model_type`` is present and is not ``clover``.
        """
        mt = data.get("model_type", "clover")
        if mt != "clover":
            raise ValueError(
                f"config has model_type={mt!r}; expected 'clover' (convert an AR checkpoint first)"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, path_or_text: str | Path) -> "CloverConfig":
        """Read a ``config.json`` file (path) or a JSON string.

        Raises:
            ValueError: if the text is not valid JSON.
        """
        p = Path(path_or_text) if not str(path_or_text).lstrip().startswith("{") else None
        text = p.read_text() if p is not None else str(path_or_text)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"config is not valid JSON ({e}); source: {p or 'string'}") from e
        return cls.from_dict(data)


PRESETS: dict[str, dict[str, Any]] = {
    # Qwen3.5-MoE text dimensions (the published base of the 35B-A3B family).
    "clover-35b-a3b": dict(
        vocab_size=248320, hidden_size=2048, num_hidden_layers=40, full_attention_interval=4,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, num_attention_heads=16,
        num_key_value_heads=2, head_dim=256, partial_rotary_factor=0.25, num_experts=256,
        num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        max_position_embeddings=262144, attention_window=0,
        mask_token_id=248319, eos_token_id=248044,
    ),
    # Tiny random model for tests: 4 layers (3 GDN + 1 attention), 8 experts.
    # Vocab: 256 bytes + specials of clover_engine.tokenizer.byte_tokenizer(), padded to 320.
    "clover-test": dict(
        vocab_size=320, hidden_size=64, num_hidden_layers=4, full_attention_interval=4,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5, rope_theta=10000.0,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, max_position_embeddings=8192, attention_window=16,
        mask_token_id=257, eos_token_id=256,
    ),
}


def recorded_clover_config(trace: Any) -> CloverConfig | None:
    """The `CloverConfig` of the model that recorded ``trace``, or None.

    Looked up from ``meta["model_config"]`` (None for any config with a ``backbone``
    field -- a transformers backbone, DiffusionGemma: they have no Clover config), else from ``model_id`` as
    a checkpoint directory holding ``config.json`` or a preset name. Never raises: a
    config that cannot be read gives None.

    Args:
        trace: an `clover_engine.recording.trace.Trace` (duck-typed: ``.meta``, ``.model_id``).
    """
    cand = (getattr(trace, "meta", None) or {}).get("model_config")
    if isinstance(cand, Mapping) and cand.get("backbone") is not None:
        return None  # a transformers backbone or DiffusionGemma: Clover configs have no backbone field
    if isinstance(cand, Mapping):
        try:
            return CloverConfig.from_dict(dict(cand))
        except (TypeError, ValueError):
            pass
    model_id = getattr(trace, "model_id", None)
    if not isinstance(model_id, str):
        return None
    try:
        p = Path(model_id)
        if (p / "config.json").is_file():
            return CloverConfig.from_json(p / "config.json")
        return CloverConfig.from_name(model_id)
    except (ValueError, TypeError, OSError, KeyError, json.JSONDecodeError):
        return None
