"""The speed / answer frontier of one prompt: a small grid of settings, each decode's tokens per forward against its
agreement with the careful decode (`clover_engine.decoding.careful`), and the Pareto-optimal settings marked.

`frontier_grid` spans a setting's own knobs -- threshold x block size for threshold decoding, Fast-dLLM v2, SDAR
and LLaDA2.0 / 2.1; steps x block length for LLaDA; steps for Dream -- always including the careful decode itself
(100 % by definition) and the setting given. `measure_frontier` decodes every cell (bounded by the grid, cancellable
between and within cells, with a progress callback), measures each answer against the one shared careful decode,
and marks the Pareto front: no other cell is both faster (tokens per forward) and closer to the careful answer.

Wing: ``decoding``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_frontier.py -q``
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

from clover_engine.decoding.careful import Agreement, agreement, careful_setting
from clover_engine.decoding.config import DecodeConfig

DEFAULT_THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99)
"""Thresholds a frontier spans by default (the field's range: Fast-dLLM's 0.9, LLaDA2.0's 0.95, Clover's 0.95)."""
DEFAULT_BLOCK_SIZES = (4, 8, 16, 32)
"""Block sizes a frontier spans by default (those at most the setting's own are kept, plus its own)."""
MAX_CELLS = 48
"""A frontier decodes at most this many settings (the grid is bounded: each cell is a whole decode)."""


def _knob(setting: Any) -> tuple[str | None, str | None]:
    """(threshold field, block field) of a setting, None where it has none."""
    name = getattr(setting, "sampler", None)
    return {None: ("threshold", "block_size"), "fast_dllm_v2": ("threshold", "block_size"),
            "sdar": ("confidence_threshold", "block_length"), "llada2": ("threshold", "block_length"),
            "llada21": ("threshold", "block_length"), "llada": (None, "block_length"), "dream": (None, None)}[name]


def setting_label(setting: Any) -> str:
    """A cell's label: ``block 32 · threshold 0.90``, ``block 8 · steps 16``, ``steps 32``, ``careful``."""
    thr, blk = _knob(setting)
    parts = [] if blk is None else [f"block {getattr(setting, blk)}"]
    if thr is not None:
        parts.append(f"threshold {getattr(setting, thr):.2f}")
    if getattr(setting, "sampler", None) in ("llada", "dream"):
        parts.append(f"steps {setting.steps}")
    if isinstance(setting, DecodeConfig) and setting.policy == "top_k":
        parts.append(f"top_k {setting.tokens_per_step}")
    return " · ".join(parts) if parts else type(setting).__name__


def frontier_grid(setting: Any, thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
                  block_sizes: Sequence[int] = DEFAULT_BLOCK_SIZES, max_cells: int = MAX_CELLS) -> list[Any]:
    """The settings a frontier decodes for ``setting``: its careful decode first, then ``setting`` itself, then the
    grid of its own knobs (module docstring), each once, at most ``max_cells``.

    Block sizes must divide the budget for the samplers that refuse a partial block (LLaDA, Fast-dLLM v2); those
    that do not are left out.

    Raises:
        TypeError: a setting `careful_setting` does not know.
        ValueError: ``max_cells`` < 2.
    """
    if max_cells < 2:
        raise ValueError(f"max_cells must be at least 2 (the careful decode and the setting); got {max_cells}")
    care = careful_setting(setting)
    thr, blk = _knob(setting)
    name = getattr(setting, "sampler", None)
    budget = int(getattr(setting, "gen_length", None) or getattr(setting, "max_new_tokens", 0) or 0)
    blocks = [getattr(setting, blk)] if blk is not None else [None]
    if blk is not None:
        own = getattr(setting, blk)
        blocks += [b for b in block_sizes if b <= max(own, 1) and b != own]
        if name in ("llada", "fast_dllm_v2"):  # whole blocks only
            blocks = [b for b in blocks if budget % b == 0]
    cells: list[Any] = [care, setting]
    for b in blocks:
        with_block: dict[str, Any] = {} if b is None else {blk: b}
        if name == "fast_dllm_v2":  # sub-blocks of 8 where 8 divides the block, else the whole block
            with_block["small_block_size"] = setting.small_block_size if b % setting.small_block_size == 0 else b
        elif name == "llada2":  # its steps follow the block, as the explorer sets them
            with_block["steps"] = b
        elif name == "sdar":
            with_block["denoising_steps"] = b
        base = dataclasses.replace(setting, **with_block)
        if thr is not None:
            cells += [dataclasses.replace(base, **{thr: float(t)}) for t in thresholds]
        elif name in ("llada", "dream"):
            steps = [s for s in (budget // 8, budget // 4, budget // 2, budget) if s >= 1]
            if name == "llada":  # steps split evenly over the blocks
                steps = [s for s in steps if s % (budget // b) == 0]
            cells += [dataclasses.replace(base, steps=s) for s in steps]
    out: list[Any] = []
    for c in cells:
        if c not in out:
            out.append(c)
    return out[:max_cells]


@dataclasses.dataclass
class FrontierPoint:
    """One decoded cell of a frontier.

    Attributes:
        setting: the cell's setting; label: `setting_label`.
        nfe, n_tokens: forwards and answer tokens; tokens_per_forward: their ratio (the speed axis).
        agreement: its answer against the careful decode's (`clover_engine.decoding.careful.Agreement`).
        careful: this cell is the careful decode; current: it is the setting the frontier was asked for.
        pareto: on the Pareto front (no other cell has both more tokens per forward and more agreement).
        result: the decode's result (its ``trace`` when recorded), for a view to load.
    """

    setting: Any
    label: str
    nfe: int
    n_tokens: int
    tokens_per_forward: float
    agreement: Agreement
    careful: bool = False
    current: bool = False
    pareto: bool = False
    result: Any = None

    def row(self) -> dict[str, Any]:
        """Plain values for a table (no result)."""
        a = self.agreement
        return {"setting": self.label, "nfe": self.nfe, "tokens": self.n_tokens,
                "tokens_per_forward": round(self.tokens_per_forward, 4), "agreement_pct": round(a.token_agreement, 2),
                "first_difference": a.first_difference, "identical": a.identical, "careful": self.careful,
                "current": self.current, "pareto": self.pareto}


def pareto_mask(speed: Sequence[float], quality: Sequence[float]) -> list[bool]:
    """Which of the points ``(speed[i], quality[i])`` no other point dominates (at least as fast and as good,
    better in one): the Pareto front of a speed / quality trade-off."""
    pts = list(zip(speed, quality))
    return [not any(j != i and qs >= s and qq >= q and (qs > s or qq > q) for j, (qs, qq) in enumerate(pts))
            for i, (s, q) in enumerate(pts)]


def mark_pareto(points: Sequence[FrontierPoint]) -> None:
    """Set ``pareto`` on the points no other point dominates (`pareto_mask` of tokens per forward and agreement)."""
    mask = pareto_mask([p.tokens_per_forward for p in points], [p.agreement.token_agreement for p in points])
    for p, on in zip(points, mask):
        p.pareto = on


def measure_frontier(decode: Callable[[Any], Any], setting: Any, cells: Sequence[Any] | None = None,
                     cancel: threading.Event | None = None,
                     progress: Callable[[int, int, FrontierPoint], None] | None = None) -> list[FrontierPoint]:
    """Decode every cell and place it on the frontier.

    Args:
        decode: ``decode(cell_setting) -> result`` with ``tokens`` (the answer's ids) and ``nfe`` (a
            `DecodeResult` or a family's result); it should stop early when ``cancel`` is set.
        setting: the setting the frontier is for (marked ``current``).
        cells: the settings to decode (default `frontier_grid` of ``setting``); the careful decode is decoded first.
        cancel: set to stop; the cells decoded so far are returned.
        progress: called after each cell with (cells done, cells in all, its point).

    Returns:
        the points, in the cells' order, with `mark_pareto` applied.
    """
    cells = list(frontier_grid(setting) if cells is None else cells)
    care = careful_setting(setting)
    if care not in cells:
        cells.insert(0, care)
    cells.sort(key=lambda c: c != care)  # the reference first
    points: list[FrontierPoint] = []
    reference: list[int] | None = None
    for i, cell in enumerate(cells):
        if cancel is not None and cancel.is_set():
            break
        result = decode(cell)
        if getattr(result, "stop_reason", None) == "cancelled":
            break
        tokens = [int(t) for t in result.tokens]
        if reference is None:
            reference = tokens
        point = FrontierPoint(setting=cell, label="careful" if cell == care else setting_label(cell),
                              nfe=int(result.nfe), n_tokens=len(tokens),
                              tokens_per_forward=len(tokens) / max(int(result.nfe), 1),
                              agreement=agreement(tokens, reference, own=cell == care), careful=cell == care,
                              current=cell == setting, result=result)
        points.append(point)
        if progress is not None:
            progress(i + 1, len(cells), point)
    mark_pareto(points)
    return points


__all__ = ["DEFAULT_BLOCK_SIZES", "DEFAULT_THRESHOLDS", "FrontierPoint", "MAX_CELLS", "frontier_grid", "mark_pareto",
           "measure_frontier", "pareto_mask", "setting_label"]
