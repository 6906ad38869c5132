"""Where the written tokens go wrong: the wrong share by the confidence they were written at
(`calibration`), the error rate of the decoded answer by slot index (`slot_errors`), of the writes
by distance from the last clean token (`clean_distance`, `distance_errors`), and of each block's
first forward (`first_forward_errors`); `grouped_rate` pools per-slot counts. Wing ``experiments``.

A write is wrong when it is not part of its answer's alignment with the target
(`clover_engine.experiments.tasks.TaskRun.write_correct`); a first-forward prediction is compared
position by position, in blocks whose history is the target's.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_experiments.py -q``
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clover_engine.experiments.tasks import KIND_EOS, KIND_FORCED, TaskRun


def calibration(runs: Sequence[TaskRun], edges: Sequence[float] = (0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 1.0)) -> dict:
    """Wrong share among written tokens, binned by the confidence at which each was written.

    Every accepted and forced write counts (EOS-filled slots have no confidence and are left
    out); a write is wrong when it is not part of its answer's alignment with the target
    (`TaskRun.write_correct`).

    Args:
        runs: `TaskRun`s (any settings, pooled).
        edges: increasing bin edges in [0, 1]; bin i is ``[edges[i], edges[i+1])``, the last
            one closed (1.0 falls in it).

    Returns:
        dict of arrays of length ``len(edges) - 1``: ``lo``, ``hi`` (edges), ``n`` (writes),
        ``n_wrong``, ``wrong_share`` (NaN for an empty bin), ``mean_conf``, ``n_forced``
        (of the writes, how many were forced fills).

    Raises:
        ValueError: fewer than two edges, edges not increasing, or outside [0, 1].
    """
    e = np.asarray(edges, np.float64)
    if e.ndim != 1 or len(e) < 2 or np.any(np.diff(e) <= 0) or e[0] < 0 or e[-1] > 1:
        raise ValueError(f"edges must be >= 2 increasing numbers in [0, 1], got {list(edges)}")
    conf = np.concatenate([r.write_conf for r in runs]).astype(np.float64) if runs else np.zeros(0)
    wrong = ~np.concatenate([r.write_correct for r in runs]) if runs else np.zeros(0, bool)
    forced = np.concatenate([r.write_kind == KIND_FORCED for r in runs]) if runs else np.zeros(0, bool)
    keep = ~np.isnan(conf)
    conf, wrong, forced = conf[keep], wrong[keep], forced[keep]
    b = np.clip(np.searchsorted(e, conf, side="right") - 1, 0, len(e) - 2)
    k = len(e) - 1
    n = np.bincount(b, minlength=k)
    n_wrong = np.bincount(b, weights=wrong, minlength=k).astype(np.int64)
    csum = np.bincount(b, weights=conf, minlength=k)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"lo": e[:-1], "hi": e[1:], "n": n, "n_wrong": n_wrong,
                "wrong_share": np.where(n > 0, n_wrong / np.maximum(n, 1), np.nan),
                "mean_conf": np.where(n > 0, csum / np.maximum(n, 1), np.nan),
                "n_forced": np.bincount(b, weights=forced, minlength=k).astype(np.int64)}


def slot_errors(runs: Sequence[TaskRun], block_size: int = 32) -> dict:
    """Error rate of the decoded answers by slot index: every answer token, grouped by its
    absolute position mod `block_size` (the slot it occupies in a block decode of that size,
    whatever setting decoded it -- so a block_size-1 control is counted on the same slots).

    A token is an error when it is not part of the answer's alignment with the target
    (`TaskRun.answer_correct`; the EOS counts as a token).

    Args:
        runs: `TaskRun`s of one setting.
        block_size: the slot grouping (>= 1).

    Returns:
        dict: ``n`` (block_size,) int64 answer tokens per slot index, ``errors``
        (block_size,) int64, ``rate`` (block_size,) float64 (NaN where n == 0).

    Raises:
        ValueError: block_size < 1.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    pairs = [((r.prompt_len + np.arange(len(r.answer))) % block_size, ~r.answer_correct) for r in runs]
    return _by_slot(pairs, block_size)


def clean_distance(run: TaskRun) -> np.ndarray:
    """Distance of each write from the last clean token before it when it was written.

    A token is clean for a write when it was fixed before the forward that wrote it: the
    prompt, earlier blocks, and slots of the same block written at an earlier iteration
    (slots written by the same forward were masked when it predicted them). Distance 1 is
    the slot right after a clean token -- every write of a block_size-1 decode; a block's
    first forward writing slot j of an empty block has distance j + 1.

    Args:
        run: a `TaskRun` (blocks are aligned to absolute positions: a write at answer position
            a in slot s belongs to the block starting at answer position ``a - s``).

    Returns:
        (W,) int64 distances >= 1, one per write (`TaskRun.write_pos` order).
    """
    pos, slot, it = run.write_pos, run.write_slot, run.write_iter
    out = np.zeros(len(pos), np.int64)
    start = pos - slot  # the block's first answer position (negative: the block begins in the prompt)
    for i in range(len(pos)):
        earlier = (start == start[i]) & (it < it[i]) & (pos < pos[i])
        last = pos[earlier].max() if earlier.any() else max(int(start[i]), 0) - 1
        out[i] = pos[i] - last
    return out


def distance_errors(runs: Sequence[TaskRun], edges: Sequence[int] = (1, 2, 3, 5, 9, 17, 33)) -> dict:
    """Wrong share of the written tokens by their distance from the last clean token
    (`clean_distance`); accepted and forced writes count, EOS-filled slots do not.

    Args:
        runs: `TaskRun`s (pooled); edges: increasing integer bin edges >= 1, bin i is
            ``[edges[i], edges[i+1])`` (distances past the last edge fall in the last bin).

    Returns:
        dict of arrays of length ``len(edges) - 1``: ``lo``, ``hi``, ``n``, ``n_wrong``,
        ``wrong_share`` (NaN for an empty bin).

    Raises:
        ValueError: fewer than two edges, not increasing, or below 1.
    """
    e = np.asarray(edges, np.int64)
    if e.ndim != 1 or len(e) < 2 or np.any(np.diff(e) <= 0) or e[0] < 1:
        raise ValueError(f"edges must be >= 2 increasing integers >= 1, got {list(edges)}")
    keep = [r.write_kind != KIND_EOS for r in runs]
    d = np.concatenate([clean_distance(r)[k] for r, k in zip(runs, keep)]) if runs else np.zeros(0, np.int64)
    wrong = np.concatenate([~r.write_correct[k] for r, k in zip(runs, keep)]) if runs else np.zeros(0, bool)
    b = np.clip(np.searchsorted(e, d, side="right") - 1, 0, len(e) - 2)
    k = len(e) - 1
    n = np.bincount(b, minlength=k)
    n_wrong = np.bincount(b, weights=wrong, minlength=k).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"lo": e[:-1], "hi": e[1:], "n": n, "n_wrong": n_wrong,
                "wrong_share": np.where(n > 0, n_wrong / np.maximum(n, 1), np.nan)}


def first_forward_errors(runs: Sequence[TaskRun], block_size: int = 32) -> dict:
    """Error rate of each block's first forward by slot index: the argmax of every masked
    slot when the block starts (all generation slots masked at once), against the target token
    at that position, grouped by absolute position mod `block_size`.

    Only blocks whose history is the target's count (the answer before the block equals the
    target there, position by position; always true of the first block), so a position is
    the one the target puts there. With block_size-1 runs this is the teacher-forced
    next-token error on the same slot grouping. Positions past the target's end are errors.

    Args:
        runs: `TaskRun`s of one setting; block_size: the slot grouping (>= 1).

    Returns:
        dict like `slot_errors`: ``n``, ``errors``, ``rate`` of shape (block_size,).

    Raises:
        ValueError: block_size < 1.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    pairs = []
    for r in runs:
        ans = r.answer
        for b in np.unique(r.first_block):
            sel = r.first_block == b
            pos, tok = r.first_pos[sel], r.first_token[sel]
            q = int(pos.min())
            if len(ans) < q or not np.array_equal(ans[:q], r.target[:q]):
                continue  # the block starts from a wrong history
            inside = pos < len(r.target)
            wrong = np.ones(len(pos), bool)
            wrong[inside] = r.target[pos[inside]] != tok[inside]
            pairs.append(((r.prompt_len + pos) % block_size, wrong))
    return _by_slot(pairs, block_size)


def _by_slot(pairs, block_size: int) -> dict:
    """Sum ``(slot, wrong)`` array pairs into ``n``, ``errors``, ``rate`` per slot index."""
    n = np.zeros(block_size, np.int64)
    err = np.zeros(block_size, np.int64)
    for slot, wrong in pairs:
        n += np.bincount(slot, minlength=block_size)
        err += np.bincount(slot, weights=wrong, minlength=block_size).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(n > 0, err / np.maximum(n, 1), np.nan)
    return {"n": n, "errors": err, "rate": rate}


def grouped_rate(errors: np.ndarray, n: np.ndarray, group: int) -> np.ndarray:
    """Pool per-slot counts into consecutive groups of `group` slots: (len // group,) rates
    (``errors.sum / n.sum`` per group; NaN for an empty group).

    Raises:
        ValueError: shapes differ, or `group` does not divide their length.
    """
    errors, n = np.asarray(errors), np.asarray(n)
    if errors.shape != n.shape or errors.ndim != 1 or group < 1 or len(n) % group:
        raise ValueError(f"need equal 1-D shapes divisible by group={group}, got {errors.shape} and {n.shape}")
    e, m = errors.reshape(-1, group).sum(1), n.reshape(-1, group).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(m > 0, e / np.maximum(m, 1), np.nan)
