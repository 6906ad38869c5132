"""The block view (one cell per slot of the current block) and the confidence heatmap
(iterations x slots of one block), each with an in-place update for a live figure.

Slot states are `clover_engine.recording.slot_index.SlotIndex.slot_states`: ``masked`` (the cell shows,
faintly, the forward's current argmax candidate), ``prompt``, ``earlier``, ``eos``,
``forced``, ``accepted`` (shaded by confidence).

A revisable decoder (`clover_engine.backbones.diffusion_gemma`: a written token can be replaced or
withdrawn) adds two marker traces to the block view: ``REWRITTEN_MARKS`` on slots this step
rewrote (the cell shows the new token; its hover names the previous one) and
``REMASKED_MARKS`` on slots it withdrew (masked again; hover names the token they held).
Traces of accept-once decoders draw exactly as before, without these traces.

At the last step of a stopped run, the slots the run wrote but did not keep -- written after a
slot still masked when it stopped (`clover_viz.runs.dropped_at_stop`, struck through in the text
view too) -- show the block view's own state ``dropped`` (`clover_viz.colors.DROPPED`): a pale red
cell with the token struck through, a hover saying how it was written and why it was dropped,
the count in the title, and the legend entry ``DROPPED_SWATCH`` (in the legend only then).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import plotly.graph_objects as go

from clover_viz import colors as C
from clover_viz.figures._common import (
    ACCEPTED_MARKS,
    BLOCK_TRACE,
    CONFIDENCE_TRACE,
    EOS_MARKS,
    FORCED_MARKS,
    _base_layout,
    _find,
    _index,
    _json_list,
    _resolve_step,
    _threshold,
    _tok,
)
from clover_viz.runs import dropped_at_stop, masked_at_end

_BLOCK_COLS = 8
_CELL_H = 46

REWRITTEN_MARKS = "rewritten this step"
REMASKED_MARKS = "withdrawn this step"
DROPPED_SWATCH = C.STATE_LABELS[C.DROPPED]  # the legend entry of the dropped state ("dropped at Stop")
_REWRITTEN_COLOR = "#be123c"
_REMASKED_COLOR = "#475569"


# =============================================================================== block view
def slot_states(trace: Any, step: int | None = None) -> np.ndarray:
    """State of each slot of the current block after ``step``: (L,) array of str.

    Values: ``masked``, ``prompt``, ``earlier``, ``eos``, ``forced``,
    ``accepted`` (`clover_engine.recording.slot_index.SlotIndex.slot_states`).

    Raises:
        ValueError: for an empty trace or a step out of range.
        TypeError: for a step that is not an int or None, or an object that is not a trace.
    """
    return _index(trace).slot_states(_resolve_step(trace, step))


def _grid(L: int) -> tuple[int, int]:
    cols = min(_BLOCK_COLS, max(L, 1))
    return cols, max(1, math.ceil(L / cols))


def slot_at_cell(length: int, x: Any, y: Any) -> int | None:
    """The slot a click on the block view's cell (column ``x``, row ``y``: plotly's click point) is, in a
    block of ``length`` slots drawn by `block_figure` (8 to a row); None off the block's slots."""
    try:
        c, r = int(round(float(x))), int(round(float(y)))
    except (TypeError, ValueError):
        return None
    cols, rows = _grid(int(length))
    slot = r * cols + c
    return slot if 0 <= c < cols and 0 <= r < rows and slot < length else None


def slot_cell(length: int, slot: int) -> tuple[int, int]:
    """(row, column) of ``slot``'s cell in the block view of a block of ``length`` slots (`slot_at_cell`'s
    inverse)."""
    cols, _ = _grid(int(length))
    return divmod(int(slot), cols)


def _top_text(trace: Any, top_tokens: np.ndarray, top_probs: np.ndarray, k: int = 5) -> str:
    parts = []
    for t, p in zip(np.asarray(top_tokens)[:k].tolist(), np.asarray(top_probs)[:k].tolist()):
        if t < 0 or p != p:
            continue
        parts.append(f"{C.plotly_text(_tok(trace, t, 12))} {p:.3f}")
    return "<br>".join(parts) if parts else "(none)"


def _block_payload(trace: Any, step: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(heatmap properties, layout properties) of the block view at ``step``."""
    heat, layout, _, _ = _block_view(trace, step)
    return heat, layout


def block_trace_updates(trace: Any, step: int | None = None) -> dict[str, dict[str, Any]]:
    """What `update_block_figure` writes into the block view's traces other than the cells, at
    ``step``: ``{trace name: properties}`` -- the ``DROPPED_SWATCH`` legend entry (shown only at the
    last step of a stopped run that dropped slots) and, for a revisable trace, the revision
    markers (`block_revision_marks`). A view that merges the cells' payload merges these too."""
    _, _, marks, swatch = _block_view(trace, step)
    return {DROPPED_SWATCH: swatch, **(marks or {})}


def block_revision_marks(trace: Any, step: int | None = None) -> dict[str, dict[str, Any]] | None:
    """The revision marker traces' properties at ``step``: ``{REWRITTEN_MARKS: {x, y, text},
    REMASKED_MARKS: {...}}`` for a revisable trace, None for an accept-once one (its block
    view has no such traces). What `update_block_figure` writes into them.

    Raises:
        ValueError / TypeError: as `slot_states`.
    """
    return _block_view(trace, step)[2]


def _block_view(trace: Any, step: int | None
                ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None, dict[str, Any]]:
    """(heatmap properties, layout properties, revision marks or None, the dropped legend entry's
    properties) of the block view at ``step``; the marks (``{trace name: properties}``) only for a
    revisable trace."""
    i = _resolve_step(trace, step)
    idx = _index(trace)
    ev = idx.steps[i]
    b = int(idx.block_of[i])
    L = len(ev.tokens)
    states = idx.slot_states(i)
    if b in idx.revised:  # the writes of the tokens held at this step, not the block's final ones
        at, witer, wconf, _ = idx.written_as_of(b, i)
    else:
        at, wconf, witer = idx.written_at[b], idx.written_conf[b], idx.written_iter[b]
    revisable = idx.revisable
    rewritten, remasked, previous = idx.rewritten_at(i)
    cols, rows = _grid(L)
    z: list[list[float | None]] = [[None] * cols for _ in range(rows)]
    text: list[list[str]] = [[""] * cols for _ in range(rows)]
    custom: list[list[list[str]]] = [[["", ""] for _ in range(cols)] for _ in range(rows)]
    conf_now = np.asarray(ev.confidence, dtype=np.float64)
    block_steps = idx.steps_of[b]
    gone = dropped_at_stop(trace) if i == len(trace) - 1 else None
    dropped = frozenset(gone["slots"]) if gone is not None and gone["block"] == b else frozenset()
    kinds = (idx.written_kind[b] if b not in idx.revised else idx.written_as_of(b, i)[3]) if dropped else None
    for s in range(L):
        r, c = divmod(s, cols)
        st = states[s]
        pos = ev.position_start + s
        if st == "masked":
            cand = int(ev.candidate[s])
            label = _tok(trace, cand, C.CELL_CHARS) if cand >= 0 else "·"
            text[r][c] = f"<span style='color:#94a3b8'><i>{C.plotly_text(label)}</i></span>"
            head = f"slot {s} · pos {pos} · <b>masked</b>"
            if cand >= 0 and conf_now[s] == conf_now[s]:
                detail = f"candidate conf {conf_now[s]:.3f}<br>top candidates:<br>" + _top_text(
                    trace, ev.top_tokens[s], ev.top_probs[s])
            else:
                detail = "no forward yet"
            if remasked[s]:
                detail += _previous_text(trace, "withdrawn this step; it held", int(previous[s]))
            z[r][c] = C.STATE_CODES["masked"]
        else:
            token = int(ev.tokens[s])
            label = C.plotly_text(_tok(trace, token, 12))
            text[r][c] = C.plotly_text(_tok(trace, token, C.CELL_CHARS))
            head = f"slot {s} · pos {pos} · <b>{C.STATE_LABELS[st]}</b><br>token {label} (id {token})"
            if st == "prompt":
                detail = "prompt token (pre-filled, never masked)"
            else:
                j = int(at[s])
                wev = idx.steps[j]
                k_in = int(witer[s])
                conf = wconf[s]
                detail = f"written at iteration {k_in + 1} of this block (step {j + 1})"
                if conf == conf:
                    detail += f", conf {conf:.3f}"
                if rewritten[s] and j == i:
                    detail += _previous_text(trace, "rewritten this step; it held", int(previous[s]))
                if s in dropped:  # written, then not kept when the run stopped
                    head = (f"slot {s} · pos {pos} · <b>{C.STATE_LABELS[C.DROPPED]}</b><br>token {label} "
                            f"(id {token})")
                    detail = (f"{kinds[s]} at iteration {k_in + 1} of this block (step {j + 1})"
                              + (f", conf {conf:.3f}" if conf == conf else "")
                              + f"<br>not kept: slot {gone['first_gap']} was still masked when the run stopped, "
                              "and a stopped run keeps a block only up to its first masked slot")
                    text[r][c] = f"<span style='color:#64748b'><s>{text[r][c]}</s></span>"
                    st = C.DROPPED
                elif st != "eos":
                    detail += "<br>top candidates then:<br>" + _top_text(trace, wev.top_tokens[s], wev.top_probs[s])
            z[r][c] = C.STATE_CODES[st] + (float(conf_now[s]) if st == "accepted" else 0.5)
        custom[r][c] = [st, f"{head}<br>{detail}"]
    n_acc, n_forced, n_eos = int(idx.n_accepted[i]), int(idx.n_forced[i]), int(idx.n_eos[i])
    n_masked = int(np.sum(states == "masked"))
    thr = _threshold(trace)
    wrote = f"wrote {n_acc} accepted" + (f", {n_forced} forced" if n_forced else "") + (
        f", {n_eos} EOS-filled" if n_eos else "")
    if revisable:
        wrote += f" ({int(rewritten.sum())} rewritten), {int(remasked.sum())} withdrawn"
    if dropped:
        wrote += f" · {len(dropped)} dropped at Stop (written after slot {gone['first_gap']}, still masked)"
    # a run that ended with slots never written: they hold MASK for good (`masked_at_end`), not "still" masked
    left = " ended holding MASK" if i == len(trace) - 1 and n_masked and masked_at_end(trace) else " still masked"
    title = (
        f"Block {b} · iteration {int(ev.step_index) + 1} of {len(block_steps)} · step {i + 1}/{len(trace)}"
        f"<br><sup>{wrote} · {n_masked}{left}"
        + (f" · threshold {thr:g}" if thr is not None else "") + "</sup>"
    )
    heat = dict(
        z=z,
        text=text,
        customdata=custom,
        x=list(range(cols)),
        y=list(range(rows)),
    )
    layout = dict(
        title_text=title,
        height=120 + rows * _CELL_H,
        yaxis=dict(
            tickmode="array",
            tickvals=list(range(rows)),
            ticktext=[f"{r * cols}–{min(L, (r + 1) * cols) - 1}" for r in range(rows)],
            autorange="reversed",
            showgrid=False,
            zeroline=False,
            title=dict(text="slots"),
        ),
        xaxis=dict(showticklabels=False, showgrid=False, zeroline=False, range=[-0.5, cols - 0.5]),
    )
    marks = None
    if revisable:
        marks = {}
        for name, m in ((REWRITTEN_MARKS, rewritten), (REMASKED_MARKS, remasked)):
            slots = np.flatnonzero(m).tolist()
            marks[name] = {
                "x": [s % cols + 0.36 for s in slots], "y": [s // cols - 0.3 for s in slots],
                "text": [f"slot {s}: {'rewritten' if m is rewritten else 'withdrawn'}, it held "
                         f"{C.plotly_text(_tok(trace, int(previous[s])))} (id {int(previous[s])})" for s in slots],
            }
    return heat, layout, marks, {"showlegend": bool(dropped)}


def _previous_text(trace: Any, what: str, token: int) -> str:
    return f"<br><b>{what}</b> {C.plotly_text(_tok(trace, token))} (id {token})"


def _add_revision_marks(fig: go.Figure, marks: dict[str, Any]) -> None:
    """The revision marker traces of a revisable trace's block view (see the module docstring)."""
    sty = {REWRITTEN_MARKS: {"symbol": "star", "size": 11, "color": _REWRITTEN_COLOR,
                             "line": {"width": 1, "color": "#ffffff"}},
           REMASKED_MARKS: {"symbol": "circle-x-open", "size": 10, "color": _REMASKED_COLOR, "line": {"width": 2}}}
    for name, marker in sty.items():
        fig.add_trace(go.Scatter(mode="markers", name=name, marker=marker, showlegend=True,
                                 hovertemplate="%{text}<extra></extra>", **marks[name]))


def block_figure(trace: Any, step: int | None = None) -> go.Figure:
    """The current block's L slots as a grid of cells (8 per row), coloured by `slot_states`.

    Cell text is the token (masked cells: the forward's candidate in grey
    italics); hover gives the state, the token, when it was written and the
    top candidates with probabilities. The cells are the heatmap trace named
    ``BLOCK_TRACE``; its ``customdata[r][c][0]`` is the slot state. For a revisable
    trace (`clover_engine.recording.slot_index.SlotIndex.revisable`) rewritten slots carry a star
    (``REWRITTEN_MARKS``) and withdrawn ones a crossed circle (``REMASKED_MARKS``), and
    their hovers name the token they held.
    """
    heat, layout, marks, swatch = _block_view(trace, step)
    fig = go.Figure()
    fig.add_trace(
        go.Heatmap(
            name=BLOCK_TRACE,
            colorscale=C.block_colorscale(),
            zmin=0.0,
            zmax=C.Z_MAX,
            showscale=False,
            xgap=3,
            ygap=3,
            texttemplate="%{text}",
            textfont=dict(family=C.MONO, size=12),
            hovertemplate="%{customdata[1]}<extra></extra>",
            hoverongaps=False,
            **heat,
        )
    )
    for state in C.BLOCK_VIEW_STATES:  # legend swatches (dropped: only where a slot is)
        fig.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="markers", name=C.STATE_LABELS[state],
                showlegend=swatch["showlegend"] if state == C.DROPPED else True,
                marker=dict(symbol="square", size=13, color=C.STATE_COLORS[state],
                            line=dict(width=1, color="#94a3b8")),
                hoverinfo="skip",
            )
        )
    if marks is not None:
        _add_revision_marks(fig, marks)
    fig.update_layout(
        **_base_layout(""),
        legend=dict(orientation="h", y=-0.02, yanchor="top", x=0, font=dict(size=11)),
        hoverlabel=dict(font=dict(family=C.MONO, size=12), align="left"),
    )
    fig.update_layout(**layout)
    fig.update_layout(margin=dict(l=60, r=20, t=62, b=40), uirevision="block")
    return fig


def update_block_figure(fig: go.Figure, trace: Any, step: int | None = None) -> None:
    """Redraw ``fig`` (made by `block_figure`, possibly a ``go.FigureWidget``) at ``step``, in place.

    One ``batch_update`` (a single message to the browser for a FigureWidget);
    the result equals ``block_figure(trace, step)``.

    A figure drawn for an accept-once trace gains the revision marker traces when
    redrawn for a revisable one; in the other direction they are emptied.

    Raises:
        ValueError: if ``fig`` has no ``BLOCK_TRACE`` heatmap.
    """
    heat, layout, marks, swatch = _block_view(trace, step)
    cells = _find(fig, BLOCK_TRACE)
    present = {t.name for t in fig.data}
    with fig.batch_update():
        cells.update(**heat)
        fig.update_layout(**layout)
        if DROPPED_SWATCH in present:
            _find(fig, DROPPED_SWATCH).update(**swatch)
        for name in (REWRITTEN_MARKS, REMASKED_MARKS):
            if name in present:
                _find(fig, name).update(**(marks[name] if marks is not None else {"x": [], "y": [], "text": []}))
    if marks is not None and not present >= {REWRITTEN_MARKS, REMASKED_MARKS}:
        _add_revision_marks(fig, marks)


# =============================================================================== confidence heatmap
def _confidence_payload(trace: Any, block_index: int | None, step: int | None) -> tuple[dict, dict]:
    """({trace name: properties}, layout properties) of the confidence heatmap."""
    idx = _index(trace)
    if len(trace) == 0:
        raise ValueError("the trace has no steps yet; decode (or load a trace) before drawing")
    if block_index is None:
        block_index = int(idx.block_of[_resolve_step(trace, step)])
    z = idx.confidence_rows(block_index)  # (R, L); raises ValueError for a block without steps
    rows = idx.steps_of[block_index]
    L = z.shape[1]
    hover = np.full(z.shape, "", dtype=object)
    for r, i in enumerate(rows):
        cand = idx.steps[i].candidate
        for s in np.flatnonzero(z[r] == z[r]).tolist():
            hover[r, s] = (f"iteration {r + 1} (step {i + 1}) · slot {s}<br>candidate "
                           f"{C.plotly_text(_tok(trace, int(cand[s]), 12))} conf {z[r, s]:.3f}")
    marks = idx.writes(block_index)
    thr = _threshold(trace)
    data = {
        CONFIDENCE_TRACE: dict(z=_json_list(z), x=list(range(L)), y=list(range(len(rows))), customdata=hover.tolist()),
        ACCEPTED_MARKS: dict(x=marks["accepted"][0], y=marks["accepted"][1]),
        FORCED_MARKS: dict(x=marks["forced"][0], y=marks["forced"][1]),
        EOS_MARKS: dict(x=marks["eos"][0], y=marks["eos"][1]),
    }
    cursor = dict(type="rect", x0=-0.5, x1=L - 0.5, y0=-0.5, y1=0.5, visible=False,
                  line=dict(color=C.THRESHOLD_COLOR, width=2), name="current step")
    if step is not None:
        i = _resolve_step(trace, step)
        if i in rows:
            r = rows.index(i)
            cursor.update(y0=r - 0.5, y1=r + 0.5, visible=True)
    height = 130 + max(len(rows), 3) * (22 if L <= 32 else 16)
    # rows are 0-based in the data, labelled 1-based like the block view's "iteration k of n"
    ticks = list(range(0, len(rows), max(1, math.ceil(len(rows) / 20))))
    layout = dict(
        title_text=(f"Confidence, block {block_index}: {len(rows)} iterations x {L} slots"
                    + (f" (threshold {thr:g})" if thr is not None else "")),
        height=min(height, 700),
        xaxis=dict(title=dict(text="slot"), range=[-0.5, L - 0.5], showgrid=False, zeroline=False,
                   dtick=1 if L <= 16 else 4),
        yaxis=dict(title=dict(text="iteration"), range=[len(rows) - 0.5, -0.5], showgrid=False, zeroline=False,
                   tickmode="array", tickvals=ticks, ticktext=[str(r + 1) for r in ticks]),
        shapes=[cursor],
    )
    return data, layout


def confidence_heatmap(trace: Any, block_index: int | None = None, step: int | None = None) -> go.Figure:
    """Confidence of every masked slot at every iteration of one block: rows = iterations, columns = slots.

    Cells are the candidate's probability (blank where the slot was already
    written or pre-filled). The colour scale breaks at the run's threshold
    (grey-blue below, greens above, marked on the colour bar); accepted slots
    get a dark ring, forced ones an orange cross, EOS-filled a violet
    diamond. ``block_index=None`` takes the block of ``step`` (default the
    last). ``step`` (optional) outlines that iteration's row (the layout's
    first shape, hidden when ``step`` is not in the block).
    """
    data, layout = _confidence_payload(trace, block_index, step)
    thr = _threshold(trace)
    t = 0.95 if thr is None else min(max(thr, 1e-3), 1.0)
    eps = 1e-4
    scale = [[0.0, "#f1f5f9"], [max(t - eps, 0.0) * 0.5, "#cbd5e1"], [max(t - eps, 0.0), "#64748b"]]
    if t < 1.0:
        scale += [[t, "#bbf7d0"], [1.0, "#15803d"]]
    else:
        scale[-1] = [1.0, "#64748b"]
    ticks = [(0.0, "0"), (0.5, "0.5"), (1.0, "1")]
    if thr is not None:  # the threshold label, without plain ticks crowding it
        ticks = [(v, lab) for v, lab in ticks if abs(v - t) > 0.1] + [(t, f"<b>threshold {t:g}</b>")]
    fig = go.Figure()
    fig.add_trace(
        go.Heatmap(
            name=CONFIDENCE_TRACE, zmin=0.0, zmax=1.0, colorscale=scale, xgap=1, ygap=1,
            hovertemplate="%{customdata}<extra></extra>", hoverongaps=False,
            colorbar=dict(
                title=dict(text="confidence", side="right"), thickness=14, len=0.9,
                tickvals=[v for v, _ in ticks], ticktext=[label for _, label in ticks],
            ),
            **data[CONFIDENCE_TRACE],
        )
    )
    sty = {
        ACCEPTED_MARKS: dict(symbol="circle-open", size=9, color=C.ACCEPTED_MARK, line=dict(width=2)),
        FORCED_MARKS: dict(symbol="x-thin-open", size=10, color=C.FORCED_MARK, line=dict(width=3)),
        EOS_MARKS: dict(symbol="diamond-open", size=9, color="#6d28d9", line=dict(width=2)),
    }
    for name, marker in sty.items():
        fig.add_trace(go.Scatter(mode="markers", name=name, marker=marker, hoverinfo="skip", showlegend=True,
                                 **data[name]))
    fig.update_layout(
        **_base_layout(""),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right", font=dict(size=11)),
        uirevision="confidence",
    )
    fig.update_layout(**layout)
    return fig


def update_confidence_heatmap(fig: go.Figure, trace: Any, block_index: int | None = None,
                              step: int | None = None) -> None:
    """Redraw ``fig`` (made by `confidence_heatmap`) for another block / step, in place, in one batch.

    The result equals ``confidence_heatmap(trace, block_index, step)`` for the same trace
    (the colour scale follows the trace's threshold, set when the figure was built).
    """
    data, layout = _confidence_payload(trace, block_index, step)
    with fig.batch_update():
        for name, props in data.items():
            _find(fig, name).update(**props)
        fig.update_layout(**layout)
