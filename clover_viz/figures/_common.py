"""What every figure module shares: trace-name constants, the trace check and step
resolution, layout defaults, strict-JSON lists, the empty placeholder figure, and
`refresh_figure` / `step_for`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import plotly.graph_objects as go

from clover_viz import colors as C
from clover_engine.recording.slot_index import SlotIndex

BLOCK_TRACE = "block cells"
CONFIDENCE_TRACE = "confidence"
ACCEPTED_MARKS = "accepted"
FORCED_MARKS = "forced"
EOS_MARKS = "EOS-filled"
TEXT_TRACE = "generated"
TEXT_PROMPT_TRACE = "prompt"
EXPERT_TRACE = "expert union"
MEMORY_TRACE = "memory share"

NOT_APPLICABLE = "not applicable to this model"

_Index = SlotIndex  # the index type, under the name the views and tests have used


# =============================================================================== trace access
def _index(trace: Any) -> SlotIndex:
    """The trace's `clover_engine.recording.slot_index.SlotIndex`, up to date (`Trace.slot_index`).

    Raises:
        TypeError: for an object that is not a trace.
    """
    _check_trace(trace)
    return trace.slot_index()


def _check_trace(trace: Any) -> None:
    # on the type: ``blocks`` / ``steps`` are properties that walk the whole trace
    cls = type(trace)
    if not all(hasattr(cls, a) or hasattr(trace, a) for a in ("steps", "blocks", "token_str", "slot_index")):
        raise TypeError(
            f"expected an clover_engine.recording.trace.Trace (recorded by the decoder or Trace.load(path)), "
            f"got {type(trace).__name__}"
        )


def _resolve_step(trace: Any, step: int | None) -> int:
    """``step`` (None = the last, negative from the end) as a global step index ``0 .. S - 1``.

    Raises:
        ValueError: for an empty trace or a step out of range.
        TypeError: for a step that is not an int or None.
    """
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
    """The threshold the run decided by, or None: none recorded, or a verify run (the base decided)."""
    dc = getattr(trace, "decode_config", None) or {}
    t = None if dc.get("policy") == "verify" else dc.get("threshold")
    return None if t is None else float(t)


def _tok(trace: Any, token_id: int, max_chars: int = 8) -> str:
    return C.token_label(trace.token_str(int(token_id)), max_chars)


def step_for(trace: Any, block_index: int) -> int:
    """The last global step of block ``block_index`` (where its final contents are drawn).

    Raises:
        ValueError: for a block with no steps in the trace.
    """
    return _index(trace).last_step(block_index)


# =============================================================================== plotly helpers
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


def _empty_figure(title: str, message: str) -> go.Figure:
    """A titled figure with only ``message`` in its middle (no steps yet, not applicable)."""
    fig = go.Figure()
    fig.update_layout(**_base_layout(title), height=300)
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color="#64748b"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


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
