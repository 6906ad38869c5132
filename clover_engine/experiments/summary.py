"""One setting's headline numbers (`summarize`: exact match, field accuracy, tokens per forward, NFE,
forced fills, tokens/s) and the knee of a trade-off curve over settings (`knee_index`).
Wing ``experiments``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_experiments.py -q``
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from clover_engine.experiments.tasks import TaskRun


def summarize(runs: Sequence[TaskRun]) -> dict:
    """The headline metrics of one setting's runs.

    Returns:
        dict: ``n_tasks``; ``exact_match``, ``json_valid``, ``name_correct`` (shares of tasks);
        ``field_acc`` (share of ground-truth arguments right); ``tokens_per_forward``
        (generated tokens / forwards, summed over tasks); ``nfe_mean`` (forwards per
        answer); ``forced_fill_rate`` (forced slots / generated tokens);
        ``forced_iteration_rate`` (iterations ending in a forced fill / iterations);
        ``token_error_rate`` (share of answer tokens outside the alignment); ``wall_s`` (summed
        seconds); ``tokens_per_s`` (generated tokens / wall_s; the only machine-dependent number).

    Raises:
        ValueError: no runs.
    """
    if not runs:
        raise ValueError("summarize needs at least one TaskRun")
    n = len(runs)
    toks = sum(len(r.tokens) for r in runs)
    nfe = sum(r.nfe for r in runs)
    wall = sum(r.wall_s for r in runs)
    fields = [f["correct"] for r in runs for f in r.fields]
    steps = np.concatenate([r.step_forced for r in runs])
    ans_ok = sum(int(r.answer_correct.sum()) for r in runs)
    ans_n = sum(len(r.answer) for r in runs)
    return {
        "n_tasks": n,
        "exact_match": sum(r.exact_match for r in runs) / n,
        "json_valid": sum(r.json_valid for r in runs) / n,
        "name_correct": sum(r.name_correct for r in runs) / n,
        "field_acc": sum(fields) / len(fields) if fields else math.nan,
        "token_error_rate": 1 - ans_ok / ans_n if ans_n else math.nan,
        "tokens_per_forward": toks / nfe if nfe else 0.0,
        "nfe_mean": nfe / n,
        "forced_fill_rate": sum(r.n_forced for r in runs) / toks if toks else math.nan,
        "forced_iteration_rate": float(steps.mean()) if len(steps) else math.nan,
        "wall_s": wall,
        "tokens_per_s": toks / wall if wall > 0 else math.nan,
    }


def knee_index(x: Sequence[float], y: Sequence[float], bend: str = "above") -> int:
    """The knee of a curve, after Satopaa et al., "Finding a 'Kneedle' in a Haystack" (2011):
    scale x and y to [0, 1] over their ranges and return the index of the interior point
    farthest from the straight line (chord) through the first and last points, on one side.

    For a trade-off such as accuracy (y) against tokens per forward (x) the knee is the
    point farthest *above* the chord: past it, more of one buys little of the other.

    Args:
        x, y: equal-length sequences, >= 3 points, x strictly monotone (either direction).
        bend: ``"above"`` (y highest over the chord, a concave bend), ``"below"`` (lowest
            under it, a convex bend) or ``"either"`` (farthest on either side).

    Returns:
        An index in ``1 .. len(x) - 2`` (end points are never the knee; ties go to the lower
        index; when no interior point lies on the asked side, the one closest to it).

    Raises:
        ValueError: fewer than 3 points, unequal lengths, NaN, x not strictly monotone, or an
            unknown `bend`.
    """
    if bend not in ("above", "below", "either"):
        raise ValueError(f"bend must be 'above', 'below' or 'either', got {bend!r}")
    xa, ya = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if xa.shape != ya.shape or xa.ndim != 1 or len(xa) < 3:
        raise ValueError(f"need two equal 1-D sequences of >= 3 points, got {xa.shape} and {ya.shape}")
    if np.isnan(xa).any() or np.isnan(ya).any():
        raise ValueError("x and y must not hold NaN")
    d = np.diff(xa)
    if not (np.all(d > 0) or np.all(d < 0)):
        raise ValueError("x must be strictly monotone")

    def unit(a):
        span = a.max() - a.min()
        return (a - a.min()) / span if span > 0 else np.zeros_like(a)

    xs, ys = unit(xa), unit(ya)
    chord = ys[0] + (ys[-1] - ys[0]) * (xs - xs[0]) / (xs[-1] - xs[0])
    over = (ys - chord)[1:-1]  # vertical distance; the perpendicular one is proportional to it
    score = {"above": over, "below": -over, "either": np.abs(over)}[bend]
    return int(1 + np.argmax(score))
