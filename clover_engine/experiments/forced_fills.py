"""Forced fills beside what independent slots would give: per iteration, binned by the pass rate
of the rest of the decode (`forced_fill_table`), counted against the independent expectation
(`forced_fill_excess`), and ``(1 - p) ** m`` itself (`independent_forced_fill`). Wing ``experiments``.

*Forced fill* (docs/architecture.md §5): the single most confident masked slot written because
none reached the threshold.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_experiments.py -q``
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from clover_engine.experiments.tasks import TaskRun, _cat


def independent_forced_fill(p, m=32):
    """Probability that no masked slot reaches the threshold when each of `m` slots passes
    independently with probability `p`: ``(1 - p) ** m`` (a forced fill follows).

    Args:
        p: per-slot pass probability in [0, 1] (scalar or array).
        m: masked slots (scalar or array, >= 0).

    Raises:
        ValueError: p outside [0, 1] or m < 0.
    """
    p, m = np.asarray(p, np.float64), np.asarray(m, np.float64)
    if np.any((p < 0) | (p > 1)) or np.any(m < 0):
        raise ValueError(f"need 0 <= p <= 1 and m >= 0, got p={p}, m={m}")
    out = (1.0 - p) ** m
    return float(out) if out.ndim == 0 else out


def forced_fill_table(runs: Sequence[TaskRun], edges: Sequence[float] = (0.0, 0.05, 0.1, 0.2, 0.5, 1.0),
                      min_masked: int = 2, max_masked: int | None = None) -> dict:
    """Forced fills per iteration, binned by the per-slot pass rate of the rest of the decode.

    For iteration i of a decode with m_i masked slots of which k_i reached the threshold,
    the pass rate is measured *leaving that iteration out*:
    ``p_i = (sum_j k_j - k_i) / (sum_j m_j - m_i)`` over the decode's iterations j (binning
    by the iteration's own k_i / m_i would be circular: a forced fill is k_i == 0).
    Independent slots would give a forced fill with probability ``(1 - p_i) ** m_i``.
    Only iterations with ``min_masked <= m_i <= max_masked`` count (one masked slot is forced
    or accepted, nothing to compare; ``max_masked=None``: no upper bound).

    Args:
        runs: `TaskRun`s (block decodes; pooled).
        edges: increasing bin edges of p in [0, 1] (last bin closed).
        min_masked, max_masked: the range of m_i counted (min_masked >= 1).

    Returns:
        dict of arrays of length ``len(edges) - 1``: ``lo``, ``hi``, ``n`` (iterations),
        ``mean_p``, ``mean_masked``, ``measured`` (share of the iterations that ended in a
        forced fill), ``independent`` (mean of ``(1 - p_i) ** m_i``), ``n_forced``; NaN
        where n == 0.

    Raises:
        ValueError: bad edges or min_masked < 1.
    """
    e = np.asarray(edges, np.float64)
    if e.ndim != 1 or len(e) < 2 or np.any(np.diff(e) <= 0) or e[0] < 0 or e[-1] > 1:
        raise ValueError(f"edges must be >= 2 increasing numbers in [0, 1], got {list(edges)}")
    p, m, f = _iteration_pass_rates(runs, min_masked, max_masked)
    k = len(e) - 1
    b = np.clip(np.searchsorted(e, p, side="right") - 1, 0, k - 1)
    n = np.bincount(b, minlength=k)
    ind = (1.0 - p) ** m

    def mean(w):
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, np.bincount(b, weights=w, minlength=k) / np.maximum(n, 1), np.nan)

    return {"lo": e[:-1], "hi": e[1:], "n": n, "mean_p": mean(p), "mean_masked": mean(m),
            "measured": mean(f.astype(np.float64)), "independent": mean(ind),
            "n_forced": np.bincount(b, weights=f, minlength=k).astype(np.int64)}


def _iteration_pass_rates(runs: Sequence[TaskRun], min_masked: int, max_masked: int | None):
    """(p, m, forced) per counted iteration: leave-one-out pass rate, masked slots, forced fill
    (see `forced_fill_table`)."""
    if min_masked < 1:
        raise ValueError(f"min_masked must be >= 1, got {min_masked}")
    ps, ms, fs = [], [], []
    for r in runs:
        m, k = r.step_masked.astype(np.float64), r.step_passed.astype(np.float64)
        rest = m.sum() - m
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.where(rest > 0, (k.sum() - k) / np.maximum(rest, 1), np.nan)
        keep = (r.step_masked >= min_masked) & ~np.isnan(p)
        if max_masked is not None:
            keep &= r.step_masked <= max_masked
        ps.append(p[keep]), ms.append(m[keep]), fs.append(r.step_forced[keep])
    return _cat(ps, np.float64), _cat(ms, np.float64), _cat(fs, bool)


def forced_fill_excess(runs: Sequence[TaskRun], min_masked: int = 2, max_masked: int | None = None) -> dict:
    """Forced fills counted against what independent slots would give, over the iterations
    `forced_fill_table` counts.

    Under independence, iteration i ends in a forced fill with probability
    ``q_i = (1 - p_i) ** m_i``; the count of forced fills then has mean ``sum q_i`` and
    standard deviation ``sqrt(sum q_i (1 - q_i))`` (a sum of independent Bernoulli draws).

    Returns:
        dict: ``n`` iterations, ``measured`` forced fills, ``expected`` (sum q_i), ``sd``,
        ``z`` = (measured - expected) / sd (NaN when sd == 0), ``ratio`` = measured / expected.

    Raises:
        ValueError: min_masked < 1.
    """
    p, m, f = _iteration_pass_rates(runs, min_masked, max_masked)
    q = (1.0 - p) ** m
    exp, sd = float(q.sum()), float(np.sqrt((q * (1 - q)).sum()))
    meas = int(f.sum())
    return {"n": len(f), "measured": meas, "expected": exp, "sd": sd,
            "z": (meas - exp) / sd if sd > 0 else math.nan, "ratio": meas / exp if exp > 0 else math.nan}
