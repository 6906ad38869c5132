"""Plotly figures in Panel without the browser writing back: `FigurePane` and `FigureSnapshot`.

Wing: front ends (`clover_viz`), used by the Panel views (`clover_viz.panel_views`).

* `FigureSnapshot` -- a copy of a plotly figure's ``data`` and ``layout`` (plain lists /
  dicts), updated by merging a step's payload (`FigureSnapshot.updated`) without plotly
  validating it again;
* `FigurePane` -- a Plotly pane that holds only snapshots: Python -> browser, never back into
  a Python figure;
* `_placeholder` -- an empty figure with a message, before the first run.

Tests: ``.venv/bin/python -m pytest tests/apps/test_explorer_app.py -q``
"""

from __future__ import annotations

import pickle
from typing import Any

import panel as pn
import plotly.graph_objects as go


def _placeholder(title: str, message: str) -> Any:
    """An empty figure with a message (before the first run)."""
    fig = go.Figure()
    fig.update_layout(title=dict(text=title, x=0.01, font=dict(size=14)), height=260, template="plotly_white",
                      margin=dict(l=30, r=20, t=50, b=30))
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color="#64748b"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


class FigureSnapshot:
    """A copy of a plotly figure's ``data`` and ``layout`` (plain lists / dicts) for `FigurePane`.

    Not a dict on purpose: param compares a new dict value with the old one key by key
    before it notifies anyone, which for a heatmap with hover text costs more than drawing.
    """

    __slots__ = ("data", "layout")

    def __init__(self, data: list, layout: dict) -> None:
        self.data, self.layout = data, layout

    @classmethod
    def of(cls, fig: Any, data: list | None = None) -> "FigureSnapshot":
        """Copy ``fig`` (``data`` given: reuse that copy of the traces, copy only the layout)."""
        raw_data, raw_layout = getattr(fig, "_data", None), getattr(fig, "_layout", None)
        if raw_data is None or raw_layout is None:  # not a plotly BaseFigure: its public dict
            d = fig.to_dict()
            return cls(d["data"], d["layout"])
        if data is None:
            return cls(*pickle.loads(pickle.dumps((raw_data, raw_layout), protocol=pickle.HIGHEST_PROTOCOL)))
        return cls(data, pickle.loads(pickle.dumps(raw_layout, protocol=pickle.HIGHEST_PROTOCOL)))

    def to_dict(self) -> dict[str, Any]:
        return {"data": self.data, "layout": self.layout}

    def updated(self, traces: dict[int, dict[str, Any]], layout: dict[str, Any]) -> "FigureSnapshot":
        """A new snapshot: these trace and layout properties merged in as ``fig.update`` /
        ``fig.update_layout`` would (dicts merge, ``None`` unsets, ``title_text`` is
        ``title.text``), without plotly validating them again -- the payload functions of
        `clover_viz.figures` make values plotly accepts unchanged (tests compare with the
        figure built fresh). Untouched traces are shared with this snapshot.
        """
        data = list(self.data)
        for i, props in traces.items():
            data[i] = _merge(dict(data[i]), props)
        return FigureSnapshot(data, _merge(dict(self.layout), layout))

    def trace_index(self, name: str) -> int:
        return next(i for i, t in enumerate(self.data) if t.get("name") == name)


def _merge(dst: dict[str, Any], src: dict[str, Any]) -> dict[str, Any]:
    for key, value in src.items():
        if key.endswith("_text") and "_" not in key[:-5]:  # plotly's magic underscore: title_text
            key, value = key[:-5], {"text": value}
        if value is None:
            dst.pop(key, None)
        elif isinstance(value, dict) and isinstance(dst.get(key), dict):
            dst[key] = _merge(dict(dst[key]), value)
        else:
            dst[key] = value
    return dst


class FigurePane(pn.pane.Plotly):
    """A Plotly pane that only sends: Python -> browser, never back into a Python figure.

    Panel's Plotly pane links a ``go.Figure`` it is given: in-place changes go to the
    browser as restyle / relayout messages, and the browser's own ``restyle_data`` /
    ``relayout_data`` are written back into whatever figure the pane holds *then* --
    a figure Python may have replaced or updated since ("Trace index 0 out of range",
    and a block view frozen on an earlier step). Here every figure given to `show` is
    copied into a `FigureSnapshot`; the pane holds only that copy, Panel diffs it against
    what the browser has and sends the difference, and browser events update the pane's
    event parameters only. Call `show` again after changing a figure.
    """

    def __init__(self, object: Any = None, **params: Any) -> None:
        params["link_figure"] = False
        super().__init__(self._snapshot(object), **params)

    @staticmethod
    def _snapshot(obj: Any) -> Any:
        return FigureSnapshot.of(obj) if hasattr(obj, "to_plotly_json") else obj

    def show(self, fig: Any, layout_only: bool = False) -> None:
        """Display ``fig`` (a plotly figure, copied now; later changes need another `show`).

        ``layout_only``: only the layout changed since the last `show` of this figure (a
        cursor moved): the traces already copied are reused.
        """
        old = self.object
        if layout_only and isinstance(old, FigureSnapshot):
            self.object = FigureSnapshot.of(fig, data=old.data)
        else:
            self.object = self._snapshot(fig)

    @classmethod
    def applies(cls, object: Any) -> float | bool | None:
        return isinstance(object, FigureSnapshot) or super().applies(object)

    def _to_figure(self, obj: Any) -> Any:
        if isinstance(obj, FigureSnapshot):
            return obj  # made by plotly: no second validation
        snap = self._snapshot(obj)
        return snap if isinstance(snap, FigureSnapshot) else super()._to_figure(obj)

    @classmethod
    def _plotly_json_wrapper(cls, fig: Any) -> dict[str, Any]:
        if isinstance(fig, FigureSnapshot):
            return {"data": [dict(t) for t in fig.data], "layout": dict(fig.layout)}
        return super()._plotly_json_wrapper(fig)

    def _update_figure_style(self) -> None:  # the browser's restyle_data: never written into a figure
        return None

    def _update_figure_layout(self) -> None:  # the browser's relayout_data: likewise
        return None
