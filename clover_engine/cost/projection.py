"""Projection of forwards onto a device: each forward priced by `clover_engine.cost.formulas.forward_cost`
and timed by the roofline, summed into tokens/s (`project_forwards`, `Projection`), and the
target model's expert union per forward under an assumption (`target_union`). Wing ``cost``.

A recorded run's forwards are read and projected by `clover_engine.cost.trace_projection`
(`project_trace`); one forward split over several GPUs is `clover_engine.cost.parallel`.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_cost.py -q``
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.cost.devices import Device, get_device
from clover_engine.cost.formulas import UNION_ASSUMPTIONS, _as_config, expected_union, forward_cost


@dataclass(frozen=True)
class Projection:
    """Projected cost of a sequence of forwards on one device (labelled "projected").

    Attributes:
        config_name: the model configuration projected.
        device: the device name.
        n_forwards: forwards summed.
        tokens_written: tokens finalised by them.
        bytes_read, flops: totals over the forwards.
        time_s: sum of each forward's roofline time (forwards run one after another).
        tokens_per_s: ``tokens_written / time_s``.
        mean_expert_union: union per layer averaged over layers and forwards.
        bytes_per_forward, flops_per_forward, time_s_per_forward, expert_union_per_forward:
            the same per forward, in order (n_forwards entries each; the union is the mean
            over layers); empty for a Projection built by hand.
    """

    config_name: str
    device: str
    n_forwards: int
    tokens_written: int
    bytes_read: float
    flops: float
    time_s: float
    tokens_per_s: float
    mean_expert_union: float
    bytes_per_forward: tuple[float, ...] = ()
    flops_per_forward: tuple[float, ...] = ()
    time_s_per_forward: tuple[float, ...] = ()
    expert_union_per_forward: tuple[float, ...] = ()

    def subset(self, forwards: Sequence[int], tokens_written: int) -> Projection:
        """The same projection over some of its forwards (0-based indices) only, which wrote
        ``tokens_written`` tokens: totals, time and tokens/s summed over those forwards.

        Raises:
            ValueError: no forwards, an index out of range, or a Projection without per-forward
                figures (built by hand).
        """
        idx = [int(i) for i in forwards]
        if not idx:
            raise ValueError("Projection.subset needs at least one forward")
        if len(self.time_s_per_forward) != self.n_forwards:
            raise ValueError("this Projection has no per-forward figures to take a subset of "
                             "(build it with project_forwards)")
        bad = [i for i in idx if not 0 <= i < self.n_forwards]
        if bad:
            raise ValueError(f"forward indices {bad} are outside 0..{self.n_forwards - 1}")
        pick = lambda col: tuple(col[i] for i in idx)  # noqa: E731
        b, f, t, u = (pick(c) for c in (self.bytes_per_forward, self.flops_per_forward, self.time_s_per_forward,
                                        self.expert_union_per_forward))
        time_s = float(sum(t))
        return Projection(self.config_name, self.device, len(idx), int(tokens_written), float(sum(b)),
                          float(sum(f)), time_s, tokens_written / time_s, float(sum(u)) / len(idx), b, f, t, u)


def _forward_tuple(fw: Any) -> tuple[int, Any, int, int | None]:
    if isinstance(fw, Mapping):
        n = int(fw["n_tokens"])
        return n, fw["expert_union"], int(fw.get("n_commit", fw.get("n_commit_tokens", 0))), fw.get("block_len")
    n, union, *rest = fw
    n_commit = int(rest[0]) if rest else 0
    block_len = rest[1] if len(rest) > 1 else None
    return int(n), union, n_commit, block_len


def project_forwards(
    tokens_written: int,
    forwards: Sequence[Any],
    config: CloverConfig | str,
    device: Device | str,
    weight_bytes: float = 2,
    **forward_kwargs: Any,
) -> Projection:
    """Total bytes, FLOPs and roofline time of ``forwards``, and the tokens/s they give.

    Args:
        tokens_written: tokens finalised over all the forwards.
        forwards: one ``(n_tokens, expert_union, n_commit, block_len)`` tuple
            (or mapping with those keys) per forward; ``expert_union`` a number
            or per-layer sequence; ``n_commit`` and ``block_len`` may be left off.
        config, device, weight_bytes: as in `forward_cost` / `get_device`.
        **forward_kwargs: passed on to `forward_cost` (``memory_mode``,
            ``window``, ``commit_block_len`` ...).

    Raises:
        ValueError: for an empty list of forwards or a forward `forward_cost` refuses.
    """
    cfg = _as_config(config)
    dev = get_device(device)
    if not forwards:
        raise ValueError("no forwards to project")
    b, f, t, u = [], [], [], []
    for fw in forwards:
        n, union, n_commit, block_len = _forward_tuple(fw)
        fc = forward_cost(cfg, n, union, weight_bytes, n_commit, block_len, **forward_kwargs)
        b.append(float(fc.bytes_read))
        f.append(float(fc.flops))
        t.append(float(fc.roofline_time_s(dev)))
        u.append(float(fc.mean_expert_union))
    total_t = sum(t)
    return Projection(
        config_name=cfg.name,
        device=dev.name,
        n_forwards=len(forwards),
        tokens_written=int(tokens_written),
        bytes_read=sum(b),
        flops=sum(f),
        time_s=total_t,
        tokens_per_s=tokens_written / total_t,
        mean_expert_union=sum(u) / len(forwards),
        bytes_per_forward=tuple(b),
        flops_per_forward=tuple(f),
        time_s_per_forward=tuple(t),
        expert_union_per_forward=tuple(u),
    )


def project_tokens_per_s(
    tokens_written: int,
    forwards: Sequence[Any],
    config: CloverConfig | str,
    device: Device | str,
    weight_bytes: float = 2,
    **forward_kwargs: Any,
) -> float:
    """Projected tokens/s: ``tokens_written / sum(roofline_time_s(forward))`` (see `project_forwards`)."""
    return project_forwards(tokens_written, forwards, config, device, weight_bytes, **forward_kwargs).tokens_per_s


def target_union(
    union_assumption: str | int | float,
    n_tokens: int,
    measured: np.ndarray | None,
    source: CloverConfig | None,
    target: CloverConfig,
) -> float:
    """The target model's expert union per layer for one forward, under an assumption.

    * ``"measured_fraction"``: the measured fraction of the source's experts
      (mean over layers) carried over, ``union / E_src * E_tgt``. With few
      source experts this saturates (8 of 8 -> 256 of 256): a pessimistic bound.
    * ``"measured_vs_independent"``: the measured union relative to the
      independent expectation of the source, carried over to the target's
      independent expectation (how much routing correlation saves).
    * ``"independent"``: `expected_union` ``(E_tgt, k_tgt, n_tokens)``.
    * a number: that union.

    Always clipped to ``[k_tgt, min(E_tgt, n_tokens * k_tgt)]``.

    Raises:
        ValueError: for an unknown assumption, or a measured one without
            measured unions / source config.
    """
    E, k = target.num_experts, target.num_experts_per_tok
    if isinstance(union_assumption, (int, float, np.integer, np.floating)) and not isinstance(union_assumption, bool):
        u = float(union_assumption)
    elif union_assumption == "independent":
        u = expected_union(E, k, n_tokens)
    elif union_assumption in ("measured_fraction", "measured_vs_independent"):
        if measured is None or source is None:
            raise ValueError(f"union_assumption={union_assumption!r} needs the measured unions and the source config")
        m = measured[measured >= 0]
        if m.size == 0:
            raise ValueError("the trace has no MoE layer unions (all -1)")
        if union_assumption == "measured_fraction":
            u = float(m.mean()) / source.num_experts * E
        else:
            ratio = float(m.mean()) / expected_union(source.num_experts, source.num_experts_per_tok, n_tokens)
            u = ratio * expected_union(E, k, n_tokens)
    else:
        raise ValueError(
            f"union_assumption must be one of {UNION_ASSUMPTIONS} or a number, got {union_assumption!r}"
        )
    return float(min(max(u, k), min(E, n_tokens * k)))
