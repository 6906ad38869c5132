"""Expert-union arithmetic behind notebook 05: measured unions by forward size, the
effective number of independently routed tokens, the bytes ratio of a block forward to an
autoregressive step, and the net gain of block diffusion when both are bandwidth bound.

Definitions (docs/architecture.md §5 and §7):

* **expert union** of a forward, per MoE layer: the distinct routed experts hit by its T
  tokens (the decoder's ``StepEvent.expert_union``); ``-1`` marks a layer without MoE.
* **independent routing**: every token picks k of E experts uniformly and independently of
  the others; the expected union is ``E * (1 - (1 - k/E)^T)``
  (`clover_engine.cost.formulas.expected_union`, the occupancy expectation).
* **effective tokens** ``T_eff``: the number of independently routed tokens whose expected
  union equals a given union, the inverse of that expectation,
  ``T_eff = ln(1 - u/E) / ln(1 - k/E)`` (`effective_tokens`). Correlated routing of T
  tokens has ``T_eff < T``; ``T_eff = T`` is independent routing. Near saturation
  (``u -> E``) it diverges, so it is informative only while the union leaves experts unhit.
* **bytes ratio** of a forward: its weight bytes over the weight bytes of one
  autoregressive step (`weights_bytes_ratio`; the write-ups' weights-only accounting of
  `clover_engine.cost.formulas.ar_step_cost`).
* **net gain** of block diffusion over autoregressive decoding when every forward is
  bandwidth bound (``time = bytes / bandwidth``, the roofline's left side):
  ``tokens_per_forward / bytes_ratio`` (`net_gain`) -- each forward costs ``bytes_ratio``
  AR steps and writes ``tokens_per_forward`` tokens.

Wing: ``cost``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_cost_routing_memory.py -q``
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.cost.formulas import _as_config, ar_step_cost, forward_cost


def effective_tokens(union: float, num_experts: int, top_k: int) -> float:
    """Independently routed tokens whose expected union is ``union``: ``ln(1 - u/E) / ln(1 - k/E)``.

    The inverse of `clover_engine.cost.formulas.expected_union` in T (occupancy expectation,
    docs/architecture.md §7). ``u = k`` gives 1 token; ``u = E`` gives ``inf`` (a saturated
    union says nothing about how many tokens made it).

    Args:
        union: distinct experts hit (may be a mean, so fractional), in ``[0, E]``.
        num_experts: E; top_k: k, with ``1 <= k < E``.

    Raises:
        ValueError: a union outside ``[0, E]``, or k not in ``[1, E)`` (with k = E every
            token hits every expert and the inverse does not exist).
    """
    E, k, u = int(num_experts), int(top_k), float(union)
    if not 1 <= k < E:
        raise ValueError(f"top_k must be in [1, num_experts={E}) for the inverse to exist, got {k}")
    if not 0.0 <= u <= E or not math.isfinite(u):
        raise ValueError(f"union must be in [0, num_experts={E}], got {union}")
    if u == E:
        return math.inf
    return math.log1p(-u / E) / math.log1p(-k / E)


def union_by_tokens(steps: Iterable[Any]) -> dict[int, np.ndarray]:
    """Measured unions grouped by the forward's token count T.

    Args:
        steps: step events (``clover_engine.recording.events.StepEvent`` or anything with
            ``n_tokens_forward`` and ``expert_union``), e.g. ``trace.steps`` of several
            traces chained. Steps whose ``expert_union`` is None are skipped.

    Returns:
        ``{T: (n_forwards, N) float64}`` in increasing T: one row per forward with T tokens
        (committed + block), one column per layer; layers without MoE (``-1``) are NaN.
    """
    rows: dict[int, list[np.ndarray]] = defaultdict(list)
    for s in steps:
        u = getattr(s, "expert_union", None)
        if u is None:
            continue
        u = np.asarray(u, dtype=np.float64).reshape(-1)
        rows[int(s.n_tokens_forward)].append(np.where(u < 0, np.nan, u))
    return {T: np.stack(rows[T]) for T in sorted(rows)}


def weights_bytes_ratio(config: CloverConfig | str, n_tokens: int, union: float, weight_bytes: float = 2) -> float:
    """Weight bytes of an ``n_tokens`` forward with ``union`` experts per layer over one AR step's.

    Both weights only (`clover_engine.cost.formulas.ForwardCost.weights_bytes_read`): the
    mixers, norms, routers, shared experts and LM head are read once per forward either
    way, the routed experts ``union`` times per layer instead of k times, and the embedding
    rows are T instead of 1. For ``clover-35b-a3b`` at 32 tokens: 2.02 at union 32, 1.4 at
    union 17.4 (`clover_engine.cost.formulas.union_for_bytes_ratio` is the inverse).

    Raises:
        ValueError: a union outside ``[0, min(E, T * k)]`` (from `forward_cost`).
    """
    cfg = _as_config(config)
    block = forward_cost(cfg, n_tokens, union, weight_bytes, include_state=False).weights_bytes_read
    return block / ar_step_cost(cfg, weight_bytes).weights_bytes_read


def net_gain(tokens_per_forward: float, bytes_ratio: float) -> float:
    """Speed-up of block diffusion over AR when both are bandwidth bound: ``tokens_per_forward / bytes_ratio``.

    A forward reading ``bytes_ratio`` times an AR step's bytes takes ``bytes_ratio`` AR
    steps of time (roofline, bandwidth side) and writes ``tokens_per_forward`` tokens.

    Raises:
        ValueError: for a non-positive bytes ratio or negative tokens per forward.
    """
    if bytes_ratio <= 0 or tokens_per_forward < 0:
        raise ValueError(f"need bytes_ratio > 0 and tokens_per_forward >= 0, got {bytes_ratio}, {tokens_per_forward}")
    return float(tokens_per_forward) / float(bytes_ratio)


__all__ = ["effective_tokens", "net_gain", "union_by_tokens", "weights_bytes_ratio"]
