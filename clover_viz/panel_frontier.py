"""The Panel app's frontier card: what a setting's speed costs in the answer, for the prompt on display.

Wing: front ends (`clover_viz`), beside `clover_viz.panel_views`. `FrontierView` has a button that measures the
frontier of the current prompt and setting (`clover_viz.session_careful.SessionCareful.measure_frontier`, in the
background: its status counts the settings, another press or a new decode cancels it), the frontier figure
(`clover_viz.figures.frontier_figure`: tokens per forward vs agreement with the careful decode, the Pareto front and
this setting marked) and its table. A click on a point loads that setting's run as the run on display -- its
settings become the sidebar's.

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_careful_views.py -q``
"""

from __future__ import annotations

from typing import Any

import panel as pn
import param

from clover_viz import figures as F
from clover_viz.panel_figures import FigurePane
from clover_viz.state import ExplorerState


class FrontierView(pn.viewable.Viewer):
    """Measure and draw the frontier of the prompt on display (module docstring)."""

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        s = self.state
        self.measure = pn.widgets.Button(
            label="Measure the frontier of this prompt", color="primary", width=300,
            description="decode this prompt at each threshold x block size (or the sampler's own knobs) and compare "
                        "every answer with the careful decode, one slot per forward")
        self.cancel = pn.widgets.Button(label="Stop measuring", color="default", width=140, visible=False)
        self.status = pn.pane.HTML("", css_classes=["clover-frontier-status"], sizing_mode="stretch_width",
                                   styles={"font-size": "12px", "color": "#475569"})
        self.figure = FigurePane(None, sizing_mode="stretch_width", height=430, visible=False)
        self.table = pn.pane.HTML("", sizing_mode="stretch_width")
        self.measure.on_click(lambda _e: s.measure_frontier())
        self.cancel.on_click(lambda _e: (s.cancel_frontier(), self.refresh()))
        self.figure.param.watch(self._on_click, "click_data")
        self._drawn: tuple = ()
        s.param.watch(lambda *_e: self.refresh(), ["trace_version", "running", "error"])
        self.refresh()

    def refresh(self) -> None:
        """Redraw when the frontier or its status changed (cheap otherwise)."""
        s = self.state
        key = (len(s.frontier), s.frontier_status, id(s.frontier[0]) if s.frontier else None)
        measuring = s.frontier_status.startswith("measuring")
        self.cancel.visible = measuring
        self.measure.disabled = s.running or measuring
        if key == self._drawn:
            return
        self._drawn = key
        self.status.object = s.frontier_status or (
            "Each setting buys speed (tokens per forward); the careful decode -- the same model and prompt, one slot "
            "per forward -- says what it cost in the answer. Measure it for this prompt:")
        if s.frontier:
            self.figure.show(F.frontier_figure(s.frontier))
            self.figure.visible = True
            self.table.object = F.frontier_table_html(s.frontier)
        else:
            self.figure.visible = False
            self.table.object = ""

    def _on_click(self, event: Any) -> None:
        points = (event.new or {}).get("points") or []
        if not points:
            return
        self.figure.click_data = {}  # the same point clicked again later is a change again
        index = points[0].get("customdata")
        if isinstance(index, list):
            index = index[0] if index else None
        if isinstance(index, int) and 0 <= index < len(self.state.frontier):
            self.state.load_frontier_point(index)

    def __panel__(self) -> Any:
        return pn.Column(pn.Row(self.measure, self.cancel), self.status, self.figure, self.table,
                         sizing_mode="stretch_width")


__all__ = ["FrontierView"]
