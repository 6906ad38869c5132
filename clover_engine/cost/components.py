"""What a priced forward is, whatever formula priced it: `ForwardCost`, the names of its
components (Clover's and a dense transformer's), and the token-count check every formula makes.

The formulas of each cost family (`clover_engine.backbones.base.COST_FAMILIES`) build a `ForwardCost`
from here: ``clover`` in `clover_engine.cost.formulas`, ``kv_cache`` and ``recompute`` in
`clover_engine.cost.dense`; `clover_engine.cost.formulas.forward_cost` picks among them.

Wing: ``cost``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from clover_engine.cost.devices import Device, roofline_time_s

# Component keys of a Clover forward, in display order. The first eight are weights.
WEIGHT_COMPONENTS = (
    "embedding",
    "gdn_mixers",
    "attention_mixers",
    "norms",
    "routers",
    "shared_experts",
    "routed_experts",
    "lm_head",
)
COMPONENTS = WEIGHT_COMPONENTS + ("state_read", "state_write", "window_kv", "block_attention")

# A transformers causal LM adapted to block diffusion (`clover_engine.backbones.causal_lm.model`): history in a KV cache;
# masked diffusion (`clover_engine.backbones.masked_diffusion`) uses the same keys with the cache entries at 0.
DENSE_WEIGHT_COMPONENTS = ("embedding", "attention_mixers", "mlp", "norms", "lm_head")
DENSE_COMPONENTS = DENSE_WEIGHT_COMPONENTS + ("kv_cache_read", "kv_cache_write", "attention")

# A block drafter over a frozen causal LM (`clover_engine.cost.drafter`): its own forward and the fusing of the
# base's features into its context; a verify round's cost holds these beside the base's DENSE_COMPONENTS.
DRAFTER_WEIGHT_COMPONENTS = ("draft_inputs", "feature_fuse", "draft_layers", "draft_norms", "slot_heads",
                             "draft_lm_head")
DRAFTER_COMPONENTS = DRAFTER_WEIGHT_COMPONENTS + ("draft_context", "draft_attention")

NORM_FLOPS_PER_ELEMENT = 4  # square, sum, scale, weight


@dataclass(frozen=True)
class ForwardCost:
    """Bytes read and FLOPs of one forward, with the breakdown behind them.

    Attributes:
        bytes_read: total bytes read from and written to device memory
            (weights, embedding rows, state read/write, window K/V).
        flops: total floating-point operations (a multiply-add = 2).
        arithmetic_intensity: ``flops / bytes_read`` (FLOP per byte).
        bytes_by_component, flops_by_component: one entry per key of
            `COMPONENTS` (zeros included, so tables line up).
        n_tokens, n_commit_tokens, block_len: the forward's T, C and L.
        mean_expert_union: the expert union averaged over MoE layers.
    """

    bytes_read: float
    flops: float
    arithmetic_intensity: float
    bytes_by_component: dict[str, float]
    flops_by_component: dict[str, float]
    n_tokens: int = 0
    n_commit_tokens: int = 0
    block_len: int = 0
    mean_expert_union: float = 0.0

    @property
    def weights_bytes_read(self) -> float:
        """Bytes of weights alone (the weights-only accounting of write-ups): the `WEIGHT_COMPONENTS` (and a
        dense model's ``mlp``, a drafter's `DRAFTER_WEIGHT_COMPONENTS`)."""
        return float(sum(v for k, v in self.bytes_by_component.items()
                         if k in WEIGHT_COMPONENTS or k in DENSE_WEIGHT_COMPONENTS or k in DRAFTER_WEIGHT_COMPONENTS))

    def roofline_time_s(self, device: "Device | str") -> float:
        """`roofline_time_s` of this forward on ``device``."""
        return roofline_time_s(self.bytes_read, self.flops, device)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_token_counts(n_tokens: int, n_commit_tokens: int, block_len: int | None) -> tuple[int, int, int]:
    """(T, C, L) of a forward: T tokens in all, C of them committed, L block slots (default T - C).

    Raises:
        ValueError: T < 1, C outside [0, T], or C + L != T.
    """
    T, C = int(n_tokens), int(n_commit_tokens)
    if T < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    if not 0 <= C <= T:
        raise ValueError(f"n_commit_tokens must be in [0, n_tokens={T}], got {n_commit_tokens}")
    L = T - C if block_len is None else int(block_len)
    if L < 0 or C + L != T:
        raise ValueError(
            f"n_commit_tokens ({C}) + block_len ({block_len}) must equal n_tokens ({T}); "
            "n_tokens counts the committed tokens and the block slots together"
        )
    return T, C, L
