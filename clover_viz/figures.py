"""Pure figures: a `engine.trace.Trace` (and a position in it) -> a plotly figure.

Shared by the Panel app (``apps/explorer.py``) and the ipywidgets front end
(`clover_viz.widgets`). Every function here only *reads* the trace -- no
figure ever calls the model, so a trace recorded on a GPU draws on a laptop
(docs/architecture.md §1: figures never compute, they draw what the trace holds).

Positions: ``step`` is a global step index ``0 .. len(trace) - 1`` (negative
counts from the end, ``None`` = the last step) and means the state *after*
that step's writes.

Block view and its states (`slot_states`), one per slot of the current block:

* ``masked``   -- still masked after this step (the cell shows, faintly, the
  forward's current argmax candidate);
* ``prompt``   -- pre-filled with prompt tokens (never masked);
* ``earlier``  -- written by an earlier step of this block;
* ``eos``      -- resolved as EOS after an accepted EOS (rule 7), this step;
* ``forced``   -- written by the forced fill (or ``max_steps``) this step;
* ``accepted`` -- accepted by the policy this step; shaded by confidence.

API (all return ``plotly.graph_objects.Figure`` unless noted):

* `block_figure(trace, step)`, `update_block_figure(fig, trace, step)` (in place),
  `slot_states(trace, step)` -> ``np.ndarray[str]``
* `confidence_heatmap(trace, block_index, step=None)` -- steps x slots;
  `update_confidence_heatmap(fig, trace, block_index, step=None)` (in place)
* `text_figure(trace, step=None)` (blocks x slots grid), `text_html(trace, step=None)` -> str
* `tokens_per_forward_figure(trace)`, `cumulative_tokens_figure(trace)`,
  `expert_union_figure(trace)`, `state_norm_figure(trace)`, `memory_share_figure(trace, step=None)`
* cost: `cost_figure(trace, device="h800")`,
  `roofline_figure(trace, device="h800", config="clover-35b-a3b")`
* `compare_runs(a, b)` -> dict, `compare_table(a, b)` -- two runs side by side
* `refresh_figure(fig, new_fig)` -- copy a freshly built figure into an existing one in place
* `step_for(trace, block_index)` -- the last global step of a block

Names of the data traces tests and apps look up: ``BLOCK_TRACE`` ("block cells"),
``CONFIDENCE_TRACE`` ("confidence"), ``TEXT_TRACE`` ("generated"), ...

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_figures.py -q``
"""

from __future__ import annotations

import difflib
import html
import json
import math
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go

from clover_viz import colors as C

BLOCK_TRACE = "block cells"
CONFIDENCE_TRACE = "confidence"
ACCEPTED_MARKS = "accepted"
FORCED_MARKS = "forced"
EOS_MARKS = "EOS-filled"
TEXT_TRACE = "generated"
TEXT_PROMPT_TRACE = "prompt"
EXPERT_TRACE = "expert union"
MEMORY_TRACE = "memory share"

_BLOCK_COLS = 8
_CELL_H = 46


# =============================================================================== trace index
class _Index:
    """Per-trace derived data (which steps belong to which block, when each slot was written).

    Extended in place when the trace grows (live decoding): a new step costs its own slots,
    not a pass over the whole trace. Cached per trace object.
    """

    def __init__(self, trace: Any) -> None:
        self.n = 0
        self.steps: list[Any] = []
        self.block_of = np.zeros(0, dtype=np.int64)
        self.iter_of = np.zeros(0, dtype=np.int64)
        self.blocks: dict[int, dict[str, Any]] = {}
        self.steps_of: dict[int, list[int]] = {}
        # per block: global step that wrote each slot (-1 never), its confidence and kind
        self.written_at: dict[int, np.ndarray] = {}
        self.written_conf: dict[int, np.ndarray] = {}
        self.written_kind: dict[int, np.ndarray] = {}
        self.eos_id: int | None = None
        cfg = (getattr(trace, "meta", None) or {}).get("model_config")
        if isinstance(cfg, Mapping) and cfg.get("eos_token_id") is not None:
            self.eos_id = int(cfg["eos_token_id"])
        self.html_cache: dict[Any, str] = {}  # text_html fragments of finished blocks
        self.extend(trace)

    def extend(self, trace: Any) -> None:
        """Take in the steps (and block starts) recorded since the last call."""
        steps = trace.steps
        new = range(self.n, len(steps))
        starts = trace.block_starts  # a copy of the list: cheap, unlike ``trace.blocks``
        if len(self.blocks) != len(starts):
            self.blocks = {b.block_index: {"block_index": b.block_index, "prefilled": b.prefilled,
                                           "block_size": b.block_size} for b in starts}
        self.steps = steps
        self.block_of = np.concatenate([self.block_of, np.array([steps[i].block_index for i in new], dtype=np.int64)])
        self.iter_of = np.concatenate([self.iter_of, np.array([steps[i].step_index for i in new], dtype=np.int64)])
        for i in new:
            ev = steps[i]
            b = int(ev.block_index)
            if b not in self.steps_of:
                L = len(ev.tokens)
                self.steps_of[b] = []
                self.written_at[b] = np.full(L, -1, dtype=np.int64)
                self.written_conf[b] = np.full(L, np.nan, dtype=np.float64)
                self.written_kind[b] = np.full(L, "", dtype=object)
            self.steps_of[b].append(i)
            at, conf, kind = self.written_at[b], self.written_conf[b], self.written_kind[b]
            for name, mask in (("accepted", ev.accepted), ("forced", ev.forced), ("eos", ev.eos_filled)):
                m = np.asarray(mask, dtype=bool)
                if not m.any():
                    continue
                at[m] = i
                kind[m] = name
                if name != "eos":
                    conf[m] = np.asarray(ev.confidence, dtype=np.float64)[m]
                elif self.eos_id is None:  # EOS-filled slots hold EOS: learn the id from them
                    self.eos_id = int(np.asarray(ev.tokens)[m][0])
        self.n = len(steps)

    def prefilled(self, block: int, length: int) -> np.ndarray:
        info = self.blocks.get(block)
        if info is None or info.get("prefilled") is None:
            return np.zeros(length, dtype=bool)
        p = np.asarray(info["prefilled"], dtype=bool)
        return p if len(p) == length else np.resize(p, length) & False

    def block_size(self, trace: Any) -> int:
        for info in self.blocks.values():
            if info.get("block_size"):
                return int(info["block_size"])
        dc = trace.decode_config or {}
        if dc.get("block_size"):
            return int(dc["block_size"])
        return max((len(s.tokens) for s in self.steps), default=1)


_INDEX: "weakref.WeakKeyDictionary[Any, _Index]" = weakref.WeakKeyDictionary()


def _index(trace: Any) -> _Index:
    _check_trace(trace)
    idx = _INDEX.get(trace)
    if idx is None or idx.n > len(trace):
        idx = _Index(trace)
        try:
            _INDEX[trace] = idx
        except TypeError:  # not weak-referenceable: no cache
            pass
    elif idx.n < len(trace):
        idx.extend(trace)
    return idx


def _check_trace(trace: Any) -> None:
    # on the type: ``blocks`` / ``steps`` are properties that walk the whole trace
    cls = type(trace)
    if not all(hasattr(cls, a) or hasattr(trace, a) for a in ("steps", "blocks", "token_str")):
        raise TypeError(
            f"expected an engine.trace.Trace (recorded by the decoder or Trace.load(path)), "
            f"got {type(trace).__name__}"
        )


def _resolve_step(trace: Any, step: int | None) -> int:
    n = len(trace)
    if n == 0:
        raise ValueError("the trace has no steps yet; decode (or load a trace) before drawing a step")
    if step is None:
        return n - 1
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
        raise TypeError(f"step must be an int (global step index 0..{n - 1}) or None, got {step!r}")
    step = int(step)
    if not -n <= step < n:
        raise ValueError(f"step {step} is out of range for a trace of {n} steps (valid: 0..{n - 1} or negative)")
    return step % n


def _threshold(trace: Any) -> float | None:
    dc = getattr(trace, "decode_config", None) or {}
    t = dc.get("threshold")
    return None if t is None else float(t)


def _tok(trace: Any, token_id: int, max_chars: int = 8) -> str:
    return C.token_label(trace.token_str(int(token_id)), max_chars)


def _json_list(a: Any) -> list:
    """``a.tolist()`` with NaN / inf as None: widget messages must be strict JSON (NaN breaks a FigureWidget)."""
    arr = np.asarray(a, dtype=np.float64)
    out = arr.astype(object)
    out[~np.isfinite(arr)] = None
    return out.tolist()


def _base_layout(title: str, **kw: Any) -> dict[str, Any]:
    layout = dict(
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=14)),
        font=C.FONT,
        template="plotly_white",
        margin=dict(l=60, r=20, t=50, b=45),
        paper_bgcolor="white",
        plot_bgcolor="white",
    )
    layout.update(kw)
    return layout


def step_for(trace: Any, block_index: int) -> int:
    """The last global step of block ``block_index`` (where its final contents are drawn).

    Raises:
        ValueError: for a block with no steps in the trace.
    """
    idx = _index(trace)
    if block_index not in idx.steps_of:
        raise ValueError(f"block {block_index} has no steps in this trace (blocks: {sorted(idx.steps_of)})")
    return idx.steps_of[block_index][-1]


# =============================================================================== block view
def slot_states(trace: Any, step: int | None = None) -> np.ndarray:
    """State of each slot of the current block after ``step``: (L,) array of str.

    Values: ``masked``, ``prompt``, ``earlier``, ``eos``, ``forced``,
    ``accepted`` (see the module docstring).
    """
    i = _resolve_step(trace, step)
    idx = _index(trace)
    b = int(idx.block_of[i])
    at = idx.written_at[b]
    kind = idx.written_kind[b]
    out = np.full(len(at), "masked", dtype=object)
    earlier = (at >= 0) & (at < i)
    now = at == i
    out[earlier] = "earlier"
    out[now] = kind[now]
    out[idx.prefilled(b, len(at))] = "prompt"
    return out.astype(str)


def _grid(L: int) -> tuple[int, int]:
    cols = min(_BLOCK_COLS, max(L, 1))
    return cols, max(1, math.ceil(L / cols))


def _top_text(trace: Any, top_tokens: np.ndarray, top_probs: np.ndarray, k: int = 5) -> str:
    parts = []
    for t, p in zip(np.asarray(top_tokens)[:k].tolist(), np.asarray(top_probs)[:k].tolist()):
        if t < 0 or p != p:
            continue
        parts.append(f"{C.plotly_text(_tok(trace, t, 12))} {p:.3f}")
    return "<br>".join(parts) if parts else "(none)"


def _block_payload(trace: Any, step: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(heatmap properties, layout properties) of the block view at ``step``."""
    i = _resolve_step(trace, step)
    idx = _index(trace)
    ev = idx.steps[i]
    b = int(idx.block_of[i])
    L = len(ev.tokens)
    states = slot_states(trace, i)
    at, wconf = idx.written_at[b], idx.written_conf[b]
    cols, rows = _grid(L)
    z: list[list[float | None]] = [[None] * cols for _ in range(rows)]
    text: list[list[str]] = [[""] * cols for _ in range(rows)]
    custom: list[list[list[str]]] = [[["", ""] for _ in range(cols)] for _ in range(rows)]
    conf_now = np.asarray(ev.confidence, dtype=np.float64)
    block_steps = idx.steps_of[b]
    for s in range(L):
        r, c = divmod(s, cols)
        st = states[s]
        pos = ev.position_start + s
        if st == "masked":
            cand = int(ev.candidate[s])
            label = _tok(trace, cand) if cand >= 0 else "·"
            text[r][c] = f"<span style='color:#94a3b8'><i>{C.plotly_text(label)}</i></span>"
            head = f"slot {s} · pos {pos} · <b>masked</b>"
            if cand >= 0 and conf_now[s] == conf_now[s]:
                detail = f"candidate conf {conf_now[s]:.3f}<br>top candidates:<br>" + _top_text(
                    trace, ev.top_tokens[s], ev.top_probs[s])
            else:
                detail = "no forward yet"
            z[r][c] = C.STATE_CODES["masked"]
        else:
            token = int(ev.tokens[s])
            label = C.plotly_text(_tok(trace, token))
            text[r][c] = label
            head = f"slot {s} · pos {pos} · <b>{C.STATE_LABELS[st]}</b><br>token {label} (id {token})"
            if st == "prompt":
                detail = "prompt token (pre-filled, never masked)"
            else:
                j = int(at[s])
                wev = idx.steps[j]
                k_in = block_steps.index(j) if j in block_steps else -1
                conf = wconf[s]
                detail = f"written at iteration {k_in} of this block (step {j})"
                if conf == conf:
                    detail += f", conf {conf:.3f}"
                if st != "eos":
                    detail += "<br>top candidates then:<br>" + _top_text(trace, wev.top_tokens[s], wev.top_probs[s])
            z[r][c] = C.STATE_CODES[st] + (float(conf_now[s]) if st == "accepted" else 0.5)
        custom[r][c] = [st, f"{head}<br>{detail}"]
    n_acc, n_forced = int(np.sum(ev.accepted)), int(np.sum(ev.forced))
    n_eos = int(np.sum(ev.eos_filled))
    n_masked = int(np.sum(states == "masked"))
    thr = _threshold(trace)
    wrote = f"wrote {n_acc} accepted" + (f", {n_forced} forced" if n_forced else "") + (
        f", {n_eos} EOS-filled" if n_eos else "")
    title = (
        f"Block {b} · iteration {int(ev.step_index) + 1} of {len(block_steps)} · step {i + 1}/{len(trace)}"
        f"<br><sup>{wrote} · {n_masked} still masked"
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
    return heat, layout


def block_figure(trace: Any, step: int | None = None) -> go.Figure:
    """The current block's L slots as a grid of cells (8 per row), coloured by `slot_states`.

    Cell text is the token (masked cells: the forward's candidate in grey
    italics); hover gives the state, the token, when it was written and the
    top candidates with probabilities. The cells are the heatmap trace named
    ``BLOCK_TRACE``; its ``customdata[r][c][0]`` is the slot state.
    """
    heat, layout = _block_payload(trace, step)
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
            textfont=dict(family=C.MONO, size=13),
            hovertemplate="%{customdata[1]}<extra></extra>",
            hoverongaps=False,
            **heat,
        )
    )
    for state in C.SLOT_STATES:  # legend swatches
        fig.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="markers", name=C.STATE_LABELS[state], showlegend=True,
                marker=dict(symbol="square", size=13, color=C.STATE_COLORS[state],
                            line=dict(width=1, color="#94a3b8")),
                hoverinfo="skip",
            )
        )
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

    Raises:
        ValueError: if ``fig`` has no ``BLOCK_TRACE`` heatmap.
    """
    heat, layout = _block_payload(trace, step)
    cells = _find(fig, BLOCK_TRACE)
    with fig.batch_update():
        cells.update(**heat)
        fig.update_layout(**layout)


def _find(fig: go.Figure, name: str) -> Any:
    for tr in fig.data:
        if tr.name == name:
            return tr
    raise ValueError(f"the figure has no trace named {name!r} (traces: {[t.name for t in fig.data]}); "
                     "build it with the matching clover_viz.figures function")


def _missing_paths(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted property paths set in ``old`` but not in ``new`` (template and ids excluded)."""
    out: list[str] = []
    for key, value in old.items():
        if key in ("template", "type", "uid"):
            continue
        if key not in new:
            out.append(prefix + key)
        elif isinstance(value, Mapping) and isinstance(new[key], Mapping):
            out += _missing_paths(value, new[key], f"{prefix}{key}.")
    return out


def refresh_figure(fig: go.Figure, new: go.Figure) -> None:
    """Make ``fig`` show ``new`` without replacing the object (keeps a FigureWidget alive).

    Trace properties are updated in place when both figures have the same
    traces (same count and types, the usual case when a figure is redrawn
    for a longer trace); otherwise the data is swapped. Properties that
    ``fig`` has and ``new`` lacks are cleared explicitly: a FigureWidget's
    relayout / restyle messages only *set* values, so an annotation of the old
    figure would otherwise stay on screen. Afterwards
    ``fig.to_dict() == new.to_dict()``.
    """
    new_layout = new.layout.to_plotly_json()
    with fig.batch_update():
        same = len(fig.data) == len(new.data) and all(
            a.type == b.type for a, b in zip(fig.data, new.data))
        if same:
            for old_tr, new_tr in zip(fig.data, new.data):
                props = new_tr.to_plotly_json()
                props.pop("type", None)
                for path in _missing_paths(old_tr.to_plotly_json(), props):
                    old_tr[path] = None
                old_tr.update(props, overwrite=True)
        else:
            fig.data = []
            fig.add_traces(list(new.data))
        for path in _missing_paths(fig.layout.to_plotly_json(), new_layout):
            fig.layout[path] = None
        fig.update_layout(new_layout, overwrite=True)


# =============================================================================== confidence heatmap
def _confidence_payload(trace: Any, block_index: int | None, step: int | None) -> tuple[dict, dict]:
    """({trace name: properties}, layout properties) of the confidence heatmap."""
    idx = _index(trace)
    if len(trace) == 0:
        raise ValueError("the trace has no steps yet; decode (or load a trace) before drawing")
    if block_index is None:
        block_index = int(idx.block_of[_resolve_step(trace, step)])
    if block_index not in idx.steps_of:
        raise ValueError(f"block {block_index} has no steps in this trace (blocks: {sorted(idx.steps_of)})")
    rows = idx.steps_of[block_index]
    L = len(idx.steps[rows[0]].tokens)
    z = np.full((len(rows), L), np.nan)
    hover = np.full((len(rows), L), "", dtype=object)
    marks: dict[str, tuple[list[int], list[int]]] = {"accepted": ([], []), "forced": ([], []), "eos": ([], [])}
    for r, i in enumerate(rows):
        ev = idx.steps[i]
        conf = np.asarray(ev.confidence, dtype=np.float64)
        z[r] = conf
        for s in np.flatnonzero(conf == conf).tolist():
            hover[r, s] = (f"iteration {r} (step {i}) · slot {s}<br>candidate "
                           f"{C.plotly_text(_tok(trace, int(ev.candidate[s]), 12))} conf {conf[s]:.3f}")
        for name, m in (("accepted", ev.accepted), ("forced", ev.forced), ("eos", ev.eos_filled)):
            for s in np.flatnonzero(np.asarray(m, dtype=bool)).tolist():
                marks[name][0].append(s)
                marks[name][1].append(r)
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
    layout = dict(
        title_text=(f"Confidence, block {block_index}: {len(rows)} iterations x {L} slots"
                    + (f" (threshold {thr:g})" if thr is not None else "")),
        height=min(height, 700),
        xaxis=dict(title=dict(text="slot"), range=[-0.5, L - 0.5], showgrid=False, zeroline=False,
                   dtick=1 if L <= 16 else 4),
        yaxis=dict(title=dict(text="iteration"), range=[len(rows) - 0.5, -0.5], showgrid=False, zeroline=False,
                   dtick=1 if len(rows) <= 20 else None),
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


# =============================================================================== text
def _text_cells(trace: Any, step: int | None) -> list[dict[str, Any]]:
    """Per block up to ``step``: tokens, and per slot state / iteration written / confidence."""
    i = _resolve_step(trace, step)
    idx = _index(trace)
    cur = int(idx.block_of[i])
    out = []
    for b in sorted(idx.steps_of):
        if b > cur:
            break
        steps_b = idx.steps_of[b]
        last = steps_b[-1] if b < cur else i
        ev = idx.steps[last]
        L = len(ev.tokens)
        at = idx.written_at[b]
        pre = idx.prefilled(b, L)
        written = (at >= 0) & (at <= last)
        iteration = np.where(written, [steps_b.index(j) if j in steps_b else -1 for j in at.tolist()], -1)
        out.append(dict(
            block=b, position_start=int(ev.position_start), tokens=np.asarray(ev.tokens), prefilled=pre,
            written=written, iteration=iteration, confidence=np.where(written, idx.written_conf[b], np.nan),
            kind=np.where(written, idx.written_kind[b], ""), n_iter=len(steps_b),
        ))
    return out


def text_figure(trace: Any, step: int | None = None, color_by: str = "step") -> go.Figure:
    """The text so far as a grid: one row per block (block boundaries = rows), one column per slot.

    Generated tokens are coloured by the iteration of their block at which
    they were written (``color_by="step"``) or by their confidence
    (``color_by="confidence"``); forced fills carry an orange dot; prompt
    tokens are grey-blue; slots not yet written at ``step`` are blank.
    """
    if color_by not in ("step", "confidence"):
        raise ValueError(f"color_by must be 'step' or 'confidence', got {color_by!r}")
    cells = _text_cells(trace, step)
    B = max([len(c["tokens"]) for c in cells] + [_index(trace).block_size(trace)])
    R = len(cells)
    zg = np.full((R, B), np.nan)
    zp = np.full((R, B), np.nan)
    text = np.full((R, B), "", dtype=object)
    hover = np.full((R, B), "", dtype=object)
    fx, fy = [], []
    max_iter = max([c["n_iter"] for c in cells] + [1])
    for r, c in enumerate(cells):
        for s, tok in enumerate(c["tokens"].tolist()):
            pos = c["position_start"] + s
            if c["prefilled"][s]:
                zp[r, s] = 1.0
                text[r, s] = C.plotly_text(_tok(trace, tok, 4))
                hover[r, s] = f"pos {pos} · prompt token {text[r, s]}"
            elif c["written"][s]:
                it, conf = int(c["iteration"][s]), float(c["confidence"][s])
                zg[r, s] = it if color_by == "step" else (conf if conf == conf else np.nan)
                text[r, s] = C.plotly_text(_tok(trace, tok, 4))
                hover[r, s] = (f"pos {pos} · block {c['block']} slot {s}<br>token {text[r, s]} (id {tok})<br>"
                               f"{c['kind'][s]} at iteration {it}" + (f", conf {conf:.3f}" if conf == conf else ""))
                if c["kind"][s] == "forced":
                    fx.append(s + 0.32)
                    fy.append(r - 0.28)
    ylab = [f"block {c['block']}" for c in cells]
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        name=TEXT_PROMPT_TRACE, z=_json_list(zp), text=text.tolist(), customdata=hover.tolist(),
        x=list(range(B)), y=list(range(R)), zmin=0, zmax=1, showscale=False, xgap=1, ygap=3,
        colorscale=[[0, C.STATE_COLORS["prompt"]], [1, C.STATE_COLORS["prompt"]]],
        texttemplate="%{text}", textfont=dict(family=C.MONO, size=10),
        hovertemplate="%{customdata}<extra></extra>", hoverongaps=False,
    ))
    if color_by == "step":
        scale, zmax, cbar = "Viridis", max(max_iter - 1, 1), "iteration"
    else:
        scale, zmax, cbar = [[0, "#fee2e2"], [0.5, "#fde68a"], [0.9, "#86efac"], [1, "#166534"]], 1.0, "confidence"
    fig.add_trace(go.Heatmap(
        name=TEXT_TRACE, z=_json_list(zg), text=text.tolist(), customdata=hover.tolist(),
        x=list(range(B)), y=list(range(R)), zmin=0, zmax=zmax, colorscale=scale, xgap=1, ygap=3,
        texttemplate="%{text}", textfont=dict(family=C.MONO, size=10),
        colorbar=dict(title=dict(text=cbar, side="right"), thickness=12, len=0.9),
        hovertemplate="%{customdata}<extra></extra>", hoverongaps=False,
    ))
    fig.add_trace(go.Scatter(x=fx, y=fy, mode="markers", name="forced fill", hoverinfo="skip",
                             marker=dict(size=5, color=C.STATE_COLORS["forced"], line=dict(width=0))))
    fig.update_layout(
        **_base_layout(f"Text so far: {R} block(s) of {B} slots, coloured by {'iteration' if color_by == 'step' else 'confidence'}"),
        height=120 + max(R, 2) * 30,
        xaxis=dict(title="slot", showgrid=False, zeroline=False, range=[-0.5, B - 0.5]),
        yaxis=dict(tickmode="array", tickvals=list(range(R)), ticktext=ylab, autorange="reversed",
                   showgrid=False, zeroline=False),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
        uirevision="text",
    )
    return fig


def text_html(trace: Any, step: int | None = None, color_by: str = "confidence", show_prompt: bool = True) -> str:
    """The text so far as an HTML fragment (a ``<div>``) for a notebook or a Panel HTML pane.

    Prompt text is grey; each generated token is a ``<span>`` whose
    background shows its confidence (``color_by="confidence"``, forced fills
    orange) or the iteration of its block at which it was written
    (``color_by="step"``, over that block's iterations); its ``title`` (tooltip) says which.
    Each block starts at a vertical rule; slots still masked at ``step`` are ``░``.
    The text ends at the first EOS, as the decoder's output does: one ``end`` marker
    (class ``clover-end``), and nothing after it -- no tokens written beyond the EOS
    earlier in its block, no EOS fills.

    Blocks finished before ``step``'s block are rendered once per trace and reused, so the
    cost of a call is the current block's, whatever the length of the trace.
    """
    if color_by not in ("step", "confidence"):
        raise ValueError(f"color_by must be 'step' or 'confidence', got {color_by!r}")
    i = _resolve_step(trace, step)
    idx = _index(trace)
    cur = int(idx.block_of[i])
    parts = ['<div class="clover-text" style="font-family:' + C.MONO + ';font-size:13px;line-height:1.7;'
             'white-space:pre-wrap;word-break:break-all;">']
    blocks = [b for b in idx.steps_of if b <= cur]
    if show_prompt and trace.prompt_ids:
        key = ("prompt", blocks[0] if blocks else None)
        head = idx.html_cache.get(key)
        if head is None:
            first_gen = idx.steps[idx.steps_of[blocks[0]][0]].position_start if blocks else None
            ids = trace.prompt_ids if first_gen is None else trace.prompt_ids[:first_gen]
            head = idx.html_cache[key] = (f'<span style="color:#64748b">'
                                          f'{_esc_text("".join(trace.token_str(t) for t in ids))}</span>')
        parts.append(head)
    for b in blocks:
        if b < cur:  # final: rendered once
            key = ("block", b, color_by, show_prompt)
            frag = idx.html_cache.get(key)
            if frag is None:
                frag = idx.html_cache[key] = _block_html(trace, idx, b, idx.steps_of[b][-1], color_by, show_prompt)
        else:
            frag = _block_html(trace, idx, b, i, color_by, show_prompt)
        parts.append(frag[0])
        if frag[1]:  # the text ended at an EOS
            break
    parts.append("</div>")
    return "".join(parts)


def _esc_text(s: str) -> str:
    return html.escape(s.replace("\n", "⏎\n"), quote=False)


def _block_html(trace: Any, idx: _Index, b: int, last: int, color_by: str, show_prompt: bool) -> tuple[str, bool]:
    """(HTML of block ``b`` as it stands after global step ``last``, whether it ends at an EOS)."""
    steps_b = idx.steps_of[b]
    ev = idx.steps[last]
    toks = np.asarray(ev.tokens).tolist()
    L = len(toks)
    at = idx.written_at[b]
    pre = idx.prefilled(b, L)
    written = (at >= 0) & (at <= last)
    n_iter = len(steps_b)
    eos = idx.eos_id
    parts = [f'<span title="block {b} (pos {int(ev.position_start)})" '
             'style="border-left:2px solid #94a3b8;margin-left:2px;padding-left:1px"></span>']
    ended = False
    for s_, tok in enumerate(toks):
        if pre[s_]:
            if show_prompt:
                parts.append(f'<span style="color:#64748b">{_esc_text(trace.token_str(tok))}</span>')
            continue
        if not written[s_]:
            parts.append('<span style="color:#cbd5e1">░</span>')
            continue
        kind = idx.written_kind[b][s_]
        if (eos is not None and tok == eos) or kind == "eos":
            parts.append(f'<span class="clover-end" title="end of text: EOS in block {b}, slot {s_}" '
                         'style="color:#6d28d9;font-size:11px;padding:0 3px">end</span>')
            ended = True
            break
        conf = float(idx.written_conf[b][s_])
        j = int(at[s_])
        it = steps_b.index(j) if j in steps_b else 0
        if color_by == "confidence":
            bg = C.STATE_COLORS["forced"] if kind == "forced" else C.accepted_color(conf if conf == conf else 0.0)
        else:
            bg = _viridis(it / max(n_iter - 1, 1))
        fg = "#ffffff" if _dark(bg) else "#111827"
        tip = f"{kind} at iteration {it} of block {b}" + (f", conf {conf:.3f}" if conf == conf else "")
        parts.append(f'<span title="{html.escape(tip)}" style="background:{bg};color:{fg};'
                     f'border-radius:2px">{_esc_text(trace.token_str(tok)) or "∅"}</span>')
    return "".join(parts), ended


_VIRIDIS = ("#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725")


def _viridis(t: float) -> str:
    t = min(max(t, 0.0), 1.0) * (len(_VIRIDIS) - 1)
    i = min(int(t), len(_VIRIDIS) - 2)
    return C._mix(_VIRIDIS[i], _VIRIDIS[i + 1], t - i)


def _dark(color: str) -> bool:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return 0.299 * r + 0.587 * g + 0.114 * b < 140


# =============================================================================== per-forward charts
def _written_counts(trace: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    idx = _index(trace)
    acc = np.array([int(np.sum(s.accepted)) for s in idx.steps], dtype=np.int64)
    frc = np.array([int(np.sum(s.forced)) for s in idx.steps], dtype=np.int64)
    eos = np.array([int(np.sum(s.eos_filled)) for s in idx.steps], dtype=np.int64)
    return acc, frc, eos


def _block_starts_x(trace: Any) -> list[int]:
    """NFE (1-based x) of the first forward of each block after the first."""
    idx = _index(trace)
    return [idx.steps_of[b][0] + 1 for b in sorted(idx.steps_of)[1:]]


def _add_block_lines(fig: go.Figure, xs: list[int], offset: float = -0.5, **kw: Any) -> None:
    for x in xs[:200]:
        fig.add_vline(x=x + offset, line=dict(color="#cbd5e1", width=1, dash="dot"), **kw)


NOT_APPLICABLE = "not applicable to this model"


def _not_applicable(trace: Any, name: str) -> bool:
    """True when every step recorded ``None`` for ``name``: a backbone without that observable
    (a transformers model, `engine.hf_model`: no experts, no recurrent state, no memory unit)."""
    steps = _index(trace).steps
    return bool(steps) and all(getattr(s, name) is None for s in steps)


def _empty_figure(title: str, message: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(**_base_layout(title), height=300)
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color="#64748b"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def tokens_per_forward_figure(trace: Any) -> go.Figure:
    """Slots written per forward (stacked: accepted, forced, EOS-filled), block starts dotted."""
    if len(trace) == 0:
        return _empty_figure("Tokens written per forward", "no steps yet")
    acc, frc, eos = _written_counts(trace)
    x = np.arange(1, len(trace) + 1)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=x, y=acc, name="accepted", marker_color=C.STATE_COLORS["accepted"]))
    fig.add_trace(go.Bar(x=x, y=frc, name="forced", marker_color=C.STATE_COLORS["forced"]))
    fig.add_trace(go.Bar(x=x, y=eos, name="EOS-filled", marker_color="#a78bfa"))
    mean = float((acc + frc).sum() / len(trace))
    fig.add_hline(y=mean, line=dict(color="#0f172a", dash="dash", width=1),
                  annotation_text=f"mean {mean:.2f} tokens/forward", annotation_position="top left")
    fig.add_hline(y=1, line=dict(color=C.AR_COLOR, dash="dot", width=1),
                  annotation_text="autoregressive: 1", annotation_position="bottom right")
    _add_block_lines(fig, _block_starts_x(trace))
    fig.update_layout(**_base_layout("Tokens written per forward"), barmode="stack", height=320,
                      xaxis_title="forward (NFE)", yaxis_title="slots written", bargap=0.15,
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"))
    return fig


def cumulative_tokens_figure(trace: Any) -> go.Figure:
    """Tokens written (accepted + forced) against forwards, beside the autoregressive line y = x."""
    if len(trace) == 0:
        return _empty_figure("Cumulative tokens vs forwards", "no steps yet")
    acc, frc, _ = _written_counts(trace)
    y = np.concatenate([[0], np.cumsum(acc + frc)])
    x = np.arange(0, len(trace) + 1)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=x, name="autoregressive (1 token / forward)", mode="lines",
                             line=dict(color=C.AR_COLOR, dash="dash")))
    fig.add_trace(go.Scatter(x=x, y=y, name="block diffusion", mode="lines",
                             line=dict(color=C.MEASURED_COLOR, width=3, shape="hv")))
    fc = np.concatenate([[0], np.cumsum(frc)])
    fig.add_trace(go.Scatter(x=x, y=fc, name="of which forced", mode="lines",
                             line=dict(color=C.STATE_COLORS["forced"], width=1.5, shape="hv")))
    ratio = y[-1] / max(len(trace), 1)
    fig.add_annotation(x=x[-1], y=y[-1], text=f"{int(y[-1])} tokens in {len(trace)} forwards ({ratio:.2f}x AR)",
                       showarrow=True, arrowhead=2, ax=-40, ay=-30, xanchor="right")
    fig.update_layout(**_base_layout("Cumulative tokens vs forwards"), height=340,
                      xaxis_title="forwards (NFE)", yaxis_title="tokens written",
                      legend=dict(x=0.01, y=0.99, bgcolor="rgba(255,255,255,0.8)"))
    return fig


def _model_config(trace: Any) -> Any:
    """The `CloverConfig` of the model that recorded ``trace`` (preset name or checkpoint dir), or None."""
    from engine.config import CloverConfig

    meta = getattr(trace, "meta", None) or {}
    cand = meta.get("model_config")
    if isinstance(cand, Mapping) and cand.get("backbone") == "transformers":
        return None  # a transformers backbone (engine.hf_model) has no Clover config
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


def _layer_labels(trace: Any, n: int) -> list[str]:
    cfg = _model_config(trace)
    types = list(getattr(cfg, "layer_types", []) or [])
    if len(types) == n:
        short = {"linear_attention": "GDN", "full_attention": "attn"}
        return [f"{i} {short.get(t, t)}" for i, t in enumerate(types)]
    return [f"layer {i}" for i in range(n)]


def expert_union_figure(trace: Any) -> go.Figure:
    """Distinct routed experts per layer per forward: heatmap, x = forward (NFE), y = layer."""
    if len(trace) == 0:
        return _empty_figure("Expert union per layer", "no steps yet")
    if _not_applicable(trace, "expert_union"):
        return _empty_figure("Expert union per layer", NOT_APPLICABLE + " (no mixture of experts)")
    u = np.stack([np.asarray(s.expert_union, dtype=np.float64) for s in _index(trace).steps])  # (S, N)
    u[u < 0] = np.nan
    S, N = u.shape
    cfg = _model_config(trace)
    sub = ""
    if cfg is not None and getattr(cfg, "num_experts", 0):
        sub = f" (of {cfg.num_experts} experts, top-{cfg.num_experts_per_tok} per token)"
    fig = go.Figure(go.Heatmap(
        name=EXPERT_TRACE, z=_json_list(u.T), x=list(range(1, S + 1)), y=_layer_labels(trace, N),
        colorscale="Blues", zmin=0, zmax=float(cfg.num_experts) if cfg is not None and getattr(cfg, "num_experts", 0) else None,
        colorbar=dict(title=dict(text="experts", side="right"), thickness=12),
        hovertemplate="forward %{x} · %{y}<br>%{z:.0f} distinct experts<extra></extra>",
    ))
    _add_block_lines(fig, _block_starts_x(trace))
    fig.update_layout(**_base_layout("Expert union per layer and forward" + sub), height=max(260, 140 + min(N, 40) * 14),
                      xaxis_title="forward (NFE)", yaxis=dict(title="layer", autorange="reversed", showgrid=False))
    return fig


def state_norm_figure(trace: Any) -> go.Figure:
    """Frobenius norm of each layer's recurrent state as each block reads it (first forward of the block)."""
    if len(trace) == 0:
        return _empty_figure("Recurrent state norm per layer", "no steps yet")
    if _not_applicable(trace, "state_norm"):
        return _empty_figure("Recurrent state norm per layer", NOT_APPLICABLE + " (history is a KV cache)")
    idx = _index(trace)
    blocks = sorted(idx.steps_of)
    norms = np.stack([np.asarray(idx.steps[idx.steps_of[b][0]].state_norm, dtype=np.float64) for b in blocks])
    N = norms.shape[1]
    labels = _layer_labels(trace, N)
    fig = go.Figure()
    palette = ["#2563eb", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#db2777", "#65a30d", "#475569"]
    for n in range(N):
        attn = "attn" in labels[n]
        fig.add_trace(go.Scatter(
            x=blocks, y=_json_list(norms[:, n]), mode="lines+markers", name=labels[n],
            line=dict(color=palette[n % len(palette)], width=2.5 if attn else 1.5, dash="solid" if attn else None),
            marker=dict(size=5, symbol="diamond" if attn else "circle"),
            hovertemplate=f"{labels[n]}<br>block %{{x}} · ‖S‖ %{{y:.3g}}<extra></extra>",
        ))
    positive = norms[np.isfinite(norms)]
    log = bool(positive.size and positive.min() > 0 and positive.max() / positive.min() > 20)
    fig.update_layout(**_base_layout("Recurrent state norm per layer, as each block reads it"), height=340,
                      xaxis=dict(title="block", dtick=1 if len(blocks) <= 20 else None),
                      yaxis=dict(title="‖S‖ (Frobenius)", type="log" if log else "linear"),
                      legend=dict(font=dict(size=10)))
    return fig


def memory_share_figure(trace: Any, step: int | None = None) -> go.Figure:
    """Attention mass on the memory unit (history) per layer and slot: heatmap layers x slots.

    ``step`` given: that forward's share; ``step=None``: the mean over all
    forwards of the trace (slot-wise, shorter blocks padded).
    """
    if len(trace) == 0:
        return _empty_figure("Memory share", "no steps yet")
    if _not_applicable(trace, "memory_share"):
        return _empty_figure("Memory share", NOT_APPLICABLE + " (no memory unit)")
    idx = _index(trace)
    if step is None:
        mats = [np.asarray(s.memory_share, dtype=np.float64) for s in idx.steps]
        N = mats[0].shape[0]
        L = max(m.shape[1] for m in mats)
        stack = np.full((len(mats), N, L), np.nan)
        for k, m in enumerate(mats):
            stack[k, :, : m.shape[1]] = m
        with np.errstate(all="ignore"):
            z = np.nanmean(stack, axis=0)
        title = f"Memory share per layer and slot, mean over {len(mats)} forwards"
    else:
        i = _resolve_step(trace, step)
        z = np.asarray(idx.steps[i].memory_share, dtype=np.float64)
        N, L = z.shape
        title = f"Memory share per layer and slot, step {i} (block {int(idx.block_of[i])})"
    fig = go.Figure(go.Heatmap(
        name=MEMORY_TRACE, z=_json_list(z), x=list(range(z.shape[1])), y=_layer_labels(trace, z.shape[0]),
        zmin=0, zmax=1, colorscale="Purples", xgap=1, ygap=1,
        colorbar=dict(title=dict(text="share on memory", side="right"), thickness=12),
        hovertemplate="%{y} · slot %{x}<br>memory share %{z:.3f}<extra></extra>",
    ))
    fig.update_layout(**_base_layout(title + "<br><sup>softmax mass on the state read-out vs the block's own keys</sup>",
                                   margin=dict(l=60, r=20, t=62, b=45)),
                      height=150 + min(z.shape[0], 40) * 16,
                      xaxis=dict(title="slot", showgrid=False), yaxis=dict(title="layer", autorange="reversed"))
    return fig


# =============================================================================== cost
def _project(trace: Any, device: str, config: str | None, union_assumption: Any) -> Any:
    from engine.cost import project_trace

    source = _model_config(trace)
    try:
        return project_trace(trace, device=device, target_config=config, union_assumption=union_assumption,
                             source_config=source)
    except ValueError:
        if union_assumption == "independent":
            raise
        return project_trace(trace, device=device, target_config=config, union_assumption="independent",
                             source_config=source)


def _fmt_rate(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def cost_figure(trace: Any, device: str = "h800", config: str = "clover-35b-a3b",
                union_assumption: Any = "measured_vs_independent") -> go.Figure:
    """Cost panel: bytes read per forward (left) and tokens/s measured vs projected (right).

    Left: the cost model's bytes per forward of the recorded model (from the
    trace's ``bytes_read``), with bytes per written token. Right (log scale):
    the measured running tokens/s on the machine that recorded the trace
    (cumulative tokens / cumulative ``wall_s``) and, dashed and labelled
    "projected", `engine.cost.project_trace` on ``device`` for the recorded
    model and for ``config`` at the same tokens per forward, beside the AR
    bound of ``config``. ``union_assumption`` (see `engine.cost.target_union`)
    defaults to ``"measured_vs_independent"``: the recorded routing's
    correlation carried over to the target's 256 experts (``"measured_fraction"``,
    the CLI default, saturates at all experts for a model with few experts).
    """
    from plotly.subplots import make_subplots

    if len(trace) == 0:
        return _empty_figure("Cost", "no steps yet")
    idx = _index(trace)
    acc, frc, eos = _written_counts(trace)
    written = acc + frc + eos
    bytes_read = np.array([np.nan if s.bytes_read is None else float(s.bytes_read) for s in idx.steps])
    wall = np.array([float(s.wall_s) for s in idx.steps])
    x = np.arange(1, len(trace) + 1)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("bytes read per forward (cost model)", f"tokens/s: measured vs projected ({device})"))
    if np.isfinite(bytes_read).any():
        fig.add_trace(go.Bar(x=x, y=_json_list(bytes_read / 1e6), name="MB per forward", marker_color="#93c5fd",
                             hovertemplate="forward %{x}<br>%{y:.3f} MB<extra></extra>"), row=1, col=1)
        per_tok = np.where(written > 0, bytes_read / np.maximum(written, 1), np.nan) / 1e6
        fig.add_trace(go.Scatter(x=x, y=_json_list(per_tok), name="MB per token written", mode="lines+markers",
                                 marker=dict(size=4), line=dict(color="#1d4ed8", width=1.5),
                                 hovertemplate="forward %{x}<br>%{y:.3f} MB / token<extra></extra>"), row=1, col=1)
    else:
        fig.add_annotation(text="no cost fields in this trace", showarrow=False, xref="x domain", yref="y domain",
                           x=0.5, y=0.5, row=1, col=1)
    cum_tok = np.cumsum(acc + frc)
    cum_wall = np.cumsum(wall)
    measured = np.where(cum_wall > 0, cum_tok / np.where(cum_wall > 0, cum_wall, 1), np.nan)
    fig.add_trace(go.Scatter(x=x, y=_json_list(measured), name="measured (this machine)", mode="lines",
                             line=dict(color=C.MEASURED_COLOR, width=3),
                             hovertemplate="after %{x} forwards: %{y:.3g} tok/s measured<extra></extra>"), row=1, col=2)
    try:
        proj = _project(trace, device, config, union_assumption)
    except (ValueError, TypeError) as exc:
        proj = None
        fig.add_annotation(text=f"no projection: {html.escape(str(exc))[:80]}", showarrow=False,
                           xref="x2 domain", yref="y2 domain", x=0.5, y=0.1)
    lines = []
    if proj is not None:
        if proj.source is not None:
            lines.append((proj.source.tok_per_s, f"projected: {proj.source.config_name} on {proj.device}", C.PROJECTED_COLOR))
        lines.append((proj.target.tok_per_s, f"projected: {proj.target.config_name} on {proj.device}", C.TARGET_COLOR))
        from engine.cost import ar_step_cost, get_device, roofline_time_s

        ar = ar_step_cost(config)
        ar_rate = 1.0 / roofline_time_s(ar.bytes_read, ar.flops, get_device(device))
        lines.append((ar_rate, f"projected: {config} autoregressive on {proj.device}", C.AR_COLOR))
    for rate, label, color in lines:
        fig.add_trace(go.Scatter(x=[x[0], x[-1]], y=[rate, rate], mode="lines", name=f"{label}: {_fmt_rate(rate)} tok/s",
                                 line=dict(color=color, dash="dash", width=2),
                                 hovertemplate=f"{label}<br>{_fmt_rate(rate)} tok/s<extra></extra>"), row=1, col=2)
    fig.update_yaxes(title_text="MB", row=1, col=1)
    fig.update_yaxes(title_text="tokens/s (log)", type="log", row=1, col=2)
    fig.update_xaxes(title_text="forward (NFE)", row=1, col=1)
    fig.update_xaxes(title_text="forward (NFE)", row=1, col=2)
    m_last = measured[np.isfinite(measured)]
    summ = f"measured {_fmt_rate(float(m_last[-1]) if m_last.size else None)} tok/s"
    if proj is not None:
        summ += f" · projected {config} on {proj.device}: {_fmt_rate(proj.target.tok_per_s)} tok/s ({proj.union_assumption} union)"
    fig.update_layout(**_base_layout(f"Cost<br><sup>{summ}</sup>", margin=dict(l=60, r=20, t=100, b=45)), height=430,
                      legend=dict(orientation="h", y=-0.18, yanchor="top", x=0, font=dict(size=11)))
    return fig


def roofline_figure(trace: Any | None = None, device: str = "h800", config: str = "clover-35b-a3b",
                    union_assumption: Any = "measured_vs_independent", devices: Any = None) -> go.Figure:
    """Log-log roofline (FLOP/s attainable vs FLOP/byte) with every device's ridge point.

    Operating points on ``device``: the autoregressive step of ``config``
    (`engine.cost.ar_step_cost`), the trace's forwards as ``config`` would run
    them (same tokens per forward and commits, union from
    ``union_assumption``; labelled "projected") and the recorded model's own
    forwards (the trace's ``arithmetic_intensity``). ``trace=None`` draws the
    devices and the AR point only.
    """
    from engine.config import CloverConfig
    from engine.cost import DEVICES, ar_step_cost, forward_cost, get_device, ridge_point, target_union

    dev = get_device(device)
    names = list(devices) if devices is not None else list(DEVICES)
    if dev.name not in names:
        names.append(dev.name)
    ai = np.logspace(-1, 4, 120)
    fig = go.Figure()
    plateau: dict[float, list[str]] = {}
    for name in names:
        d = get_device(name)
        perf = np.minimum(d.peak_flops, ai * d.bandwidth_bytes_per_s)
        chosen = d.name == dev.name
        fig.add_trace(go.Scatter(
            x=ai, y=perf, mode="lines", name=f"{d.name} roofline" if chosen else d.name,
            line=dict(color="#0f172a" if chosen else "#cbd5e1", width=3 if chosen else 1.2),
            hovertemplate=f"{d.name}<br>%{{x:.3g}} FLOP/B → %{{y:.3g}} FLOP/s<extra></extra>",
            legendgroup="devices", showlegend=chosen,
        ))
        rp = ridge_point(d)
        plateau.setdefault(d.peak_flops, []).append(f"<b>{d.name}</b>" if chosen else d.name)
        fig.add_trace(go.Scatter(
            x=[rp], y=[d.peak_flops], mode="markers+text" if chosen else "markers",
            text=[f"ridge {rp:.0f} FLOP/B"] if chosen else None, textposition="top center",
            marker=dict(size=9 if chosen else 6, color="#0f172a" if chosen else "#94a3b8", symbol="triangle-up"),
            name=f"ridge points", legendgroup="ridge", showlegend=chosen,
            hovertemplate=f"{d.name} ridge point<br>{rp:.0f} FLOP/byte<extra></extra>",
        ))
    for peak, labels in plateau.items():  # devices sharing a peak share a label
        fig.add_annotation(x=4.0, y=math.log10(peak), xref="x", yref="y", text=" · ".join(labels),
                           showarrow=False, xanchor="right", yanchor="bottom", font=dict(size=10, color="#475569"))
    cfg = CloverConfig.from_name(config) if isinstance(config, str) else config

    def point(bytes_: float, flops: float) -> tuple[float, float]:
        t = max(bytes_ / dev.bandwidth_bytes_per_s, flops / dev.peak_flops)
        return flops / bytes_, flops / t

    ar = ar_step_cost(cfg)
    x_ar, y_ar = point(ar.bytes_read, ar.flops)
    fig.add_trace(go.Scatter(x=[x_ar], y=[y_ar], mode="markers+text", name=f"{cfg.name} autoregressive (projected)",
                             text=["AR"], textposition="middle left",
                             marker=dict(size=13, color=C.AR_COLOR, symbol="square"),
                             hovertemplate=f"AR step of {cfg.name}<br>%{{x:.3g}} FLOP/B<extra></extra>"))
    sub = ""
    if trace is not None and len(trace) > 0:
        idx = _index(trace)
        src = _model_config(trace)
        bs = (trace.decode_config or {}).get("block_size")
        xs, ys, hov = [], [], []
        cache: dict[tuple, tuple[float, float]] = {}
        for i, s in enumerate(idx.steps):
            L = len(s.tokens)
            n = int(s.n_tokens_forward)
            measured = np.asarray(s.expert_union, dtype=np.float64)
            try:
                u = target_union(union_assumption, n, measured, src, cfg)
            except ValueError:
                u = target_union("independent", n, measured, src, cfg)
            key = (n, L, round(u, 3))
            if key not in cache:
                fc = forward_cost(cfg, n, u, 2, n - L, L, commit_block_len=bs)
                cache[key] = point(fc.bytes_read, fc.flops)
            px, py = cache[key]
            xs.append(px)
            ys.append(py)
            hov.append(f"forward {i + 1}: {n} tokens ({L} slots), union {u:.0f}")
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=f"{cfg.name} block diffusion (projected)",
                                 marker=dict(size=8, color=C.TARGET_COLOR, opacity=0.6, line=dict(width=0.5, color="white")),
                                 customdata=hov, hovertemplate="%{customdata}<br>%{x:.3g} FLOP/B<extra></extra>"))
        own = [(float(s.arithmetic_intensity), i) for i, s in enumerate(idx.steps)
               if s.arithmetic_intensity is not None and s.bytes_read]
        if own:
            ox = [a for a, _ in own]
            oy = [min(dev.peak_flops, a * dev.bandwidth_bytes_per_s) for a in ox]
            fig.add_trace(go.Scatter(x=ox, y=oy, mode="markers", name=f"{trace.model_id or 'recorded model'} forwards (projected)",
                                     marker=dict(size=7, color=C.PROJECTED_COLOR, symbol="circle-open"),
                                     hovertemplate="recorded model<br>%{x:.3g} FLOP/B<extra></extra>"))
        sub = f"<br><sup>trace forwards as {cfg.name} on {dev.name}; expert union: {union_assumption}</sup>"
    fig.update_layout(
        **_base_layout(f"Roofline: {dev.name}, ridge {ridge_point(dev):.0f} FLOP/byte" + sub,
                       margin=dict(l=70, r=20, t=70, b=50)),
        height=500,
        xaxis=dict(type="log", title="arithmetic intensity (FLOP / byte)", range=[-1, 4], exponentformat="SI"),
        yaxis=dict(type="log", title="attainable FLOP/s", exponentformat="SI", tickformat="~s"),
        legend=dict(orientation="h", x=0, y=-0.2, yanchor="top", font=dict(size=11)),
    )
    return fig


# =============================================================================== comparing runs
def _run_info(run: Any) -> dict[str, Any]:
    if hasattr(run, "summary") and callable(run.summary):
        info = dict(run.summary())
        info["text"] = "".join(run.token_str(int(t)) for t in run.generated_tokens)
        dc = getattr(run, "decode_config", None) or {}
        info.setdefault("threshold", dc.get("threshold"))
        info.setdefault("block_size", dc.get("block_size"))
        return info
    if isinstance(run, Mapping):
        return dict(run)
    raise TypeError(f"compare_runs takes two Traces or summary dicts (trace.summary() + 'text'), got {type(run).__name__}")


_COMPARE_KEYS = ("block_size", "threshold", "nfe", "n_tokens", "tokens_per_forward", "n_forced", "wall_s")


def compare_runs(a: Any, b: Any) -> dict[str, Any]:
    """Compare two runs (``a`` = previous, ``b`` = new): Traces or summary dicts (with ``text`` for the diff).

    Returns a dict: one entry per metric in ``block_size, threshold, nfe,
    n_tokens, tokens_per_forward, n_forced, wall_s`` holding ``{"a", "b",
    "delta"}`` (delta None when not numeric), and ``text`` with ``a``, ``b``,
    ``same`` (bool), ``common_prefix`` (characters), ``similarity``
    (difflib ratio) and ``diff_html`` (insertions green, deletions red).
    """
    ia, ib = _run_info(a), _run_info(b)
    out: dict[str, Any] = {}
    for k in _COMPARE_KEYS:
        va, vb = ia.get(k), ib.get(k)
        num = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
        out[k] = {"a": va, "b": vb, "delta": (vb - va) if num else None}
    ta, tb = str(ia.get("text") or ""), str(ib.get("text") or "")
    prefix = 0
    for ca, cb in zip(ta, tb):
        if ca != cb:
            break
        prefix += 1
    sm = difflib.SequenceMatcher(a=ta, b=tb, autojunk=False)
    parts = []
    for op, a0, a1, b0, b1 in sm.get_opcodes():
        if op == "equal":
            parts.append(html.escape(ta[a0:a1]))
        if op in ("delete", "replace"):
            parts.append(f'<del style="background:#fee2e2;color:#991b1b">{html.escape(ta[a0:a1])}</del>')
        if op in ("insert", "replace"):
            parts.append(f'<ins style="background:#dcfce7;color:#166534;text-decoration:none">{html.escape(tb[b0:b1])}</ins>')
    out["text"] = {
        "a": ta, "b": tb, "same": ta == tb, "common_prefix": prefix, "similarity": round(sm.ratio(), 4),
        "diff_html": f'<div style="font-family:{C.MONO};white-space:pre-wrap;font-size:12px">{"".join(parts)}</div>',
    }
    return out


def compare_table(a: Any, b: Any, labels: tuple[str, str] = ("previous", "new")) -> go.Figure:
    """`compare_runs` as a small plotly table: metric, previous, new, change."""
    cmp = compare_runs(a, b)

    def fmt(v: Any) -> str:
        if v is None:
            return "–"
        if isinstance(v, float):
            return f"{v:.3g}"
        return str(v)

    rows = [(k.replace("_", " "), fmt(cmp[k]["a"]), fmt(cmp[k]["b"]),
             "" if cmp[k]["delta"] is None else f"{cmp[k]['delta']:+.3g}") for k in _COMPARE_KEYS]
    t = cmp["text"]
    rows.append(("text", "", "", "identical" if t["same"] else
                 f"differs after {t['common_prefix']} chars (similarity {t['similarity']:.2f})"))
    cols = list(zip(*rows))
    fig = go.Figure(go.Table(
        header=dict(values=["metric", labels[0], labels[1], "change"], fill_color="#e2e8f0", align="left",
                    font=dict(size=12)),
        cells=dict(values=[list(c) for c in cols], align="left", fill_color="white", height=24),
    ))
    fig.update_layout(**_base_layout("Previous run vs new run", margin=dict(l=10, r=10, t=40, b=10)),
                      height=110 + 24 * len(rows))
    return fig


__all__ = [
    "BLOCK_TRACE", "CONFIDENCE_TRACE", "TEXT_TRACE", "TEXT_PROMPT_TRACE", "EXPERT_TRACE", "MEMORY_TRACE",
    "ACCEPTED_MARKS", "FORCED_MARKS", "EOS_MARKS",
    "slot_states", "block_figure", "update_block_figure", "confidence_heatmap", "update_confidence_heatmap",
    "text_figure", "text_html",
    "tokens_per_forward_figure", "cumulative_tokens_figure", "expert_union_figure", "state_norm_figure",
    "memory_share_figure", "cost_figure", "roofline_figure", "compare_runs", "compare_table",
    "refresh_figure", "step_for",
]
