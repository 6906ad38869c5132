"""Per-step cost series of a recorded trace, and roofline operating points.

The views draw these; they compute nothing themselves (docs/architecture.md §1). A
trace's steps carry the cost model's ``bytes_read`` and ``flops`` of the model that ran
(priced by `clover_engine.cost.meter.CostMeter`) and the measured ``wall_s``; the functions here
turn them into per-forward series, and price the same forwards for another model on a
device with `clover_engine.cost.formulas.forward_cost` and the roofline (docs/architecture.md §7).

Shapes: S steps (forwards) in the trace. Units in names: ``_bytes``, ``_s``,
``_tokens_per_s``, ``flops_per_s`` (FLOP per second), ``intensity`` (FLOP per byte).

Wing: ``cost``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_cost_per_step.py -q``
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from clover_engine.backbones.clover.config import recorded_clover_config
from clover_engine.cost.devices import Device, get_device, roofline_time_s
from clover_engine.cost.formulas import _as_config, ar_step_cost, forward_cost
from clover_engine.cost.projection import target_union
from clover_engine.cost.trace_projection import prompt_forward_mask

WEIGHT_DTYPES: dict[float, str] = {4: "fp32", 2: "bf16", 1: "fp8", 8: "fp64"}
"""Bytes per weight -> the dtype name the views print (2 bytes reads as bf16: fp16 prices the same)."""


def recorded_weight_bytes(trace: Any) -> float | None:
    """Bytes per weight at which the recorded run's costs (the steps' ``bytes_read``) were
    priced: the model's dtype as it ran (4 = fp32, 2 = bf16 / fp16, ...).

    A trace does not store the dtype; the decoder's `clover_engine.cost.meter.CostMeter` prices each
    forward with `forward_cost` at the model's itemsize. This reprices the first costed forward
    at 4, 2, 1 and 8 bytes per weight, with the decode's memory mode, window and block_size,
    and returns the one that gives the recorded bytes (to 1e-9 relative).

    Returns:
        The bytes per weight, or None when no step has a cost, the recorded model has no Clover
        config (`recorded_clover_config` None: a transformers backbone), or no candidate matches.
    """
    cfg = recorded_clover_config(trace)
    if cfg is None:
        return None
    dc = getattr(trace, "decode_config", None) or {}
    mode = dc.get("memory_mode") or "state"
    step = next((st for st in trace.steps if st.bytes_read), None)
    if step is None or step.expert_union is None:
        return None
    L, n = len(step.tokens), int(step.n_tokens_forward)
    union = [int(u) for u in np.asarray(step.expert_union).reshape(-1)]
    for w in WEIGHT_DTYPES:
        try:
            fc = forward_cost(cfg, n, union, w, n - L, L, mode, 0, commit_block_len=dc.get("block_size"),
                              context_len=int(step.position_start) - (n - L))
        except (ValueError, TypeError):
            return None
        if abs(fc.bytes_read - float(step.bytes_read)) <= 1e-9 * float(step.bytes_read):
            return float(w)
    return None


def dtype_name(weight_bytes: float | None) -> str:
    """``"fp32"`` for 4 bytes per weight, ``"bf16"`` for 2, ... (`WEIGHT_DTYPES`); for None or
    another size, ``"the run's dtype"`` or ``"N-byte weights"``."""
    if weight_bytes is None:
        return "the run's dtype"
    return WEIGHT_DTYPES.get(float(weight_bytes), f"{weight_bytes:g}-byte weights")


def bytes_per_written_token(trace: Any) -> np.ndarray:
    """(S,) float64 bytes read per slot written, per forward.

    A forward's ``bytes_read`` divided by the slots it wrote (accepted + forced +
    EOS-filled); NaN where the step has no cost (``bytes_read`` None) or wrote nothing.

    Args:
        trace: an `clover_engine.recording.trace.Trace`.
    """
    idx = trace.slot_index()
    written = idx.n_accepted + idx.n_forced + idx.n_eos
    bytes_read = np.asarray(trace.column("bytes_read"), dtype=np.float64)
    return np.where(written > 0, bytes_read / np.maximum(written, 1), np.nan)


def running_tokens_per_s(trace: Any) -> np.ndarray:
    """(S,) float64 measured tokens/s after each forward, on the machine that recorded the trace.

    Cumulative tokens written (accepted + forced; EOS fills are not answer tokens) over
    cumulative ``wall_s``; NaN while the cumulative wall time is 0.

    Args:
        trace: an `clover_engine.recording.trace.Trace`.
    """
    idx = trace.slot_index()
    cum_tok = np.cumsum(idx.n_accepted + idx.n_forced)
    cum_wall = np.cumsum(np.asarray(trace.column("wall_s"), dtype=np.float64))
    return np.where(cum_wall > 0, cum_tok / np.where(cum_wall > 0, cum_wall, 1), np.nan)


def ar_tokens_per_s(config: Any, device: Device | str, weight_bytes: float = 2) -> float:
    """Projected autoregressive tokens/s of ``config`` on ``device``: one token per
    `ar_step_cost` forward, timed by the roofline.

    Raises:
        ValueError: for an unknown preset or device name.
    """
    ar = ar_step_cost(config, weight_bytes)
    return 1.0 / roofline_time_s(ar.bytes_read, ar.flops, get_device(device))


def ar_break_even_tokens_per_forward(projection: Any, config: Any, device: Device | str,
                                     weight_bytes: float = 2) -> float:
    """Tokens per forward the projected forwards would need to match `ar_tokens_per_s` of
    ``config`` on ``device``: their mean roofline time per forward times the AR tokens/s (an
    AR step writes one token; a forward that takes k AR steps' time must write k tokens).

    Args:
        projection: an `clover_engine.cost.Projection` (``time_s``, ``n_forwards``), e.g. a
            `TraceProjection`'s ``target`` or its ``decode_phase.target``.
        config, device, weight_bytes: the autoregressive model to match, as `ar_tokens_per_s`.

    Raises:
        ValueError: a projection without forwards, or an unknown preset or device.
    """
    if not projection.n_forwards:
        raise ValueError("the projection has no forwards")
    return projection.time_s / projection.n_forwards * ar_tokens_per_s(config, device, weight_bytes)


def attainable_flops_per_s(intensity: Any, device: Device | str) -> Any:
    """The roofline: ``min(peak, intensity * bandwidth)`` FLOP/s at ``intensity`` FLOP/byte
    (a number or an array of any shape; the result has the same shape)."""
    dev = get_device(device)
    return np.minimum(dev.peak_flops, np.asarray(intensity) * dev.bandwidth_bytes_per_s)


def roofline_point(bytes_read: float, flops: float, device: Device | str) -> tuple[float, float]:
    """(arithmetic intensity in FLOP/byte, achieved FLOP/s) of one forward on ``device``,
    its time being ``max(bytes / bandwidth, flops / peak)``.

    Raises:
        ZeroDivisionError: for ``bytes_read == 0``.
    """
    dev = get_device(device)
    t = max(bytes_read / dev.bandwidth_bytes_per_s, flops / dev.peak_flops)
    return flops / bytes_read, flops / t


@dataclass(frozen=True)
class ProjectedForwards:
    """A trace's forwards as another model would run them on a device (projected).

    Attributes (each (S,), one entry per step of the trace):
        n_tokens: int64 tokens in the forward (committed + block slots).
        block_len: int64 slots of the block (L).
        union: float64 the target's expert union per layer (`target_union`).
        intensity: float64 FLOP per byte of the forward.
        flops_per_s: float64 FLOP/s it achieves on the device's roofline.
        prompt: bool, the prompt forward(s) (`prompt_forward_mask`): prefill, not decode phase.
    """

    n_tokens: np.ndarray
    block_len: np.ndarray
    union: np.ndarray
    intensity: np.ndarray
    flops_per_s: np.ndarray
    prompt: np.ndarray | None = None


def project_forwards_roofline(trace: Any, config: Any, device: Device | str,
                              union_assumption: Any = "measured_vs_independent",
                              weight_bytes: float = 2) -> ProjectedForwards:
    """Every forward of ``trace`` priced for ``config`` and placed on ``device``'s roofline.

    Same tokens per forward and commits as the recorded run (committed tokens =
    ``n_tokens_forward - L``, committed blocks of the decode's ``block_size``); the
    union per forward from ``union_assumption`` (`target_union`, with the recorded
    model's config from `recorded_clover_config`), falling back to ``"independent"`` for a
    forward where that assumption cannot be used (no measured unions or no source config).

    Args:
        trace: an `clover_engine.recording.trace.Trace`.
        config: the target `CloverConfig` or preset name.
        device: a `Device` or name.

    Raises:
        ValueError: for an unknown preset or device, or a forward `forward_cost` refuses.
    """
    cfg = _as_config(config)
    src = recorded_clover_config(trace)
    bs = (trace.decode_config or {}).get("block_size")
    rows: list[tuple[int, int, float, float, float]] = []
    cache: dict[tuple, tuple[float, float]] = {}
    for s in trace.steps:
        L = len(s.tokens)
        n = int(s.n_tokens_forward)
        measured = np.asarray(s.expert_union, dtype=np.float64)
        try:
            u = target_union(union_assumption, n, measured, src, cfg)
        except ValueError:
            u = target_union("independent", n, measured, src, cfg)
        key = (n, L, round(u, 3))
        if key not in cache:
            fc = forward_cost(cfg, n, u, weight_bytes, n - L, L, commit_block_len=bs)
            cache[key] = roofline_point(fc.bytes_read, fc.flops, device)
        rows.append((n, L, u) + cache[key])
    cols = list(zip(*rows)) if rows else [()] * 5
    return ProjectedForwards(
        n_tokens=np.array(cols[0], dtype=np.int64), block_len=np.array(cols[1], dtype=np.int64),
        union=np.array(cols[2], dtype=np.float64), intensity=np.array(cols[3], dtype=np.float64),
        flops_per_s=np.array(cols[4], dtype=np.float64),
        prompt=prompt_forward_mask(trace),
    )


__all__ = ["WEIGHT_DTYPES", "ProjectedForwards", "ar_break_even_tokens_per_forward", "ar_tokens_per_s",
           "attainable_flops_per_s", "bytes_per_written_token", "dtype_name", "project_forwards_roofline",
           "recorded_weight_bytes",
           "roofline_point", "running_tokens_per_s"]
