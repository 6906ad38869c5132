"""Panel views of an `ExplorerState`: thin `pn.viewable.Viewer`s over the figures.

Each view holds its widgets / panes, watches the state parameters it shows,
and redraws with the pure functions of `clover_viz.figures`. No view computes
anything the trace does not hold; no view touches the model (the state does,
through the decoder).

* `SettingsPanel`  -- the sidebar: model, prompt + examples, decoding settings,
  Generate / Stop, open / save a trace (in `clover_viz.panel_settings`).
* `RunSummary`     -- status line, progress bar, errors, NFE / tokens / forced /
  tokens per forward / tokens/s of the run on display.
* `PlaybackBar`    -- play / pause, step back / forward, speed, scrub over all steps.
* `BlockView`      -- the current block filling in (mutated in place, not rebuilt); a click on a
  slot opens it in `clover_viz.panel_branches.SlotPanel` (candidates, choose / re-mask / branch).
* `TextView`       -- the text so far, tokens coloured by confidence.
* `CompareView`    -- previous run vs this run (or the two runs picked in
  `clover_viz.panel_branches.BranchList`, beside it): `figures.compare_table` and the text diff.
* `CostView`       -- bytes per forward, measured vs projected tokens/s, roofline.
* `FigureTabs`     -- confidence heatmap, per-forward charts, experts / state / memory,
  cost; only the visible tab is redrawn, and at most every
  `LIVE_REDRAW_S` seconds while a decode streams in.
* `ExplorerApp`    -- all of the above; ``.sidebar`` / ``.main`` for a template,
  or displayed as one component in a notebook.

Wing: front ends (`clover_viz`). The machinery the views share lives below them:
`clover_viz.panel_figures` (`FigurePane`, `FigureSnapshot`), `clover_viz.panel_controls`
(`keys_within_range`, `clear_after_pick`), `clover_viz.panel_settings` (`SettingsPanel`) and
`clover_viz.panel_branches` (`SlotPanel`, `BranchList`).
This module is the public home of `ExplorerApp` (`apps/explorer.py`) and the views.

Tests: ``.venv/bin/python -m pytest tests/apps -q``
"""

from __future__ import annotations

import html
import time
from typing import Any

import panel as pn
import param
from panel.widgets.slider import _SliderBase

from clover_viz import figures as F
from clover_viz.panel_branches import BranchList, SlotPanel
from clover_viz.panel_checks import checked, control
from clover_viz.panel_controls import keys_within_range
from clover_viz.panel_figures import FigurePane, FigureSnapshot, _placeholder
from clover_viz.panel_frontier import FrontierView
from clover_viz.panel_settings import SettingsPanel
from clover_viz.runs import diff_caption, run_stats, summary_cards_html
from clover_viz.state import ExplorerState
from clover_engine.units import format_si

LIVE_REDRAW_S = 5.0  # heavy charts (a Plotly render of 150-500 ms in the browser) redraw at most this often while a decode streams in
# The block view and the text redraw at most this often while a decode streams in: each redraw
# costs the browser a Plotly render (~100-200 ms in a software-rendered Chromium on a busy
# machine); at every tick it fell behind and a click on Stop waited seconds in its queue.
LIVE_VIEW_S = 0.5


# ----------------------------------------------------------------------------- summary / playback
class RunSummary(pn.viewable.Viewer):
    """Status line, progress, errors and the headline numbers of the run on display.

    The numbers sit in elements with stable class names (``clover-nfe`` ...) so
    browser tests can read them.
    """

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.error = pn.pane.Alert("", alert_type="danger", visible=False, sizing_mode="stretch_width",
                                   margin=(0, 10))
        self.progress = pn.indicators.Progress(value=0, max=100, visible=False, bar_color="primary",
                                               sizing_mode="stretch_width", height=14, margin=(0, 10))
        self.numbers = pn.pane.HTML("", sizing_mode="stretch_width", margin=(0, 10))
        self._last_error = ""
        s = self.state
        s.param.watch(self._on_error, "error")
        s.param.watch(self._refresh, ["trace", "trace_version", "running", "progress", "status", "previous",
                                      "loading", "load_percent"])
        self._refresh()

    def _on_error(self, event: Any) -> None:
        msg = event.new
        self.error.object = html.escape(msg)
        self.error.visible = bool(msg)
        if msg and msg != self._last_error and pn.state.notifications is not None:
            pn.state.notifications.error(msg[:300], duration=6000)
        self._last_error = msg

    def _refresh(self, *_: Any) -> None:
        s = self.state
        self.progress.visible = s.running or s.loading
        # a decode: tokens / budget; a model loading: bytes of its download or weights, indeterminate
        # (-1, animated) while that is not known (queued, transformers' own reading)
        self.progress.value = s.progress if s.running else s.load_percent if s.loading else -1
        self.progress.active = s.loading and not s.running and s.load_percent < 0
        st = run_stats(s.trace)
        prev = run_stats(s.previous)

        cells = summary_cards_html(st, prev)  # the notebook Explorer shows the same cards
        status = html.escape(s.status or "ready")
        running = (' data-running="1"' if s.running else ' data-running="0"') + f' data-loading="{int(s.loading)}"' \
            + f' data-nfe="{s.n_steps}"'  # what the page's Stop reports as shown (SettingsPanel.report_shown_at_stop)
        self.numbers.object = (
            "<style>.clover-status{font-size:13px;color:#334155;margin:2px 0 6px 0}</style>"
            f'<div class="clover-status"{running}>{status}</div>{cells}'
        )

    def __panel__(self) -> Any:
        return pn.Column(self.error, self.numbers, self.progress, sizing_mode="stretch_width")


def scrub_label(position: int, n_steps: int) -> str:
    """The playback slider's label: ``"step: k of n"`` (1-based), ``"step: no run yet"`` for none."""
    if n_steps < 1:
        return "step: no run yet"
    return f"step: {min(position, n_steps - 1) + 1} of {n_steps}"


class PlaybackBar(pn.viewable.Viewer):
    """Play / pause, step back / forward, speed and a scrub slider over every step of the run."""

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        s = self.state
        b = dict(color="default", margin=(5, 2))
        self.first = pn.widgets.Button(label="|◀", description="first step", width=48, **b)
        self.back = pn.widgets.Button(label="◀ step", description="step back", width=70, **b)
        self.play = pn.widgets.Button(label="▶ play", description="play / pause", width=84, **b)
        self.forward = pn.widgets.Button(label="step ▶", description="step forward", width=70, **b)
        self.last = pn.widgets.Button(label="▶|", description="last step", width=48, **b)
        # 1-based like every other step count on the page ("step 3/40" in the block view), shown
        # as "step: k of n" above the slider. Not the slider's own title: bokeh redraws that on a
        # new value, not on a new tick formatter, so "of n" lagged a run ("14 of 13").
        self.scrub = pn.widgets.IntSlider(name="", start=1, end=2, value=1, disabled=True, show_value=False,
                                          sizing_mode="stretch_width", margin=(0, 15, 5, 15))
        keys_within_range(self.scrub)  # its end is the run's step count: Home / End must follow
        self.scrub_text = pn.pane.HTML(scrub_label(0, 0), margin=(0, 15), css_classes=["clover-scrub-label"])
        self.speed = control(pn.widgets.FloatSlider, s, "speed", label="speed (steps/s)", width=170)
        checked(self.scrub, None, s.report_setting, label="Playback step")  # within 1 .. the run's steps
        self.first.on_click(lambda _e: s.seek(0) or s.pause())
        self.back.on_click(lambda _e: s.step(-1))
        self.play.on_click(lambda _e: s.toggle_play())
        self.forward.on_click(lambda _e: s.step(1))
        self.last.on_click(lambda _e: s.seek(s.n_steps - 1) or s.pause())
        self.scrub.param.watch(lambda e: s.seek(e.new - 1), "value")
        s.param.watch(self._sync, ["position", "n_steps", "playing"])
        self._sync()

    def _sync(self, *_: Any) -> None:
        s = self.state
        n = s.n_steps
        self.scrub.disabled = n < 2
        self.scrub.end = max(n, 2)
        self.scrub.value = min(s.position + 1, self.scrub.end)
        self.scrub_text.object = scrub_label(s.position, n)
        self.play.label = "▮▮ pause" if s.playing else "▶ play"  # geometric shapes: in every font

    def __panel__(self) -> Any:
        return pn.Row(self.first, self.back, self.play, self.forward, self.last,
                      pn.Column(self.scrub_text, self.scrub, sizing_mode="stretch_width"), self.speed,
                      sizing_mode="stretch_width", align="center")


# ----------------------------------------------------------------------------- live views
class BlockView(pn.viewable.Viewer):
    """The current block at the playback position.

    The plotly figure is built once per run and updated in place on the Python side
    (`figures.update_block_figure`); the pane (a `FigurePane`) is handed a snapshot of
    it, so what the browser shows always equals ``figures.block_figure(trace, position)``.
    """

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.pane = FigurePane(_placeholder("Block view", "press Generate to decode a prompt"),
                               sizing_mode="stretch_width", config={"displayModeBar": False},
                               css_classes=["clover-block-view"])
        self.drawn_step: int | None = None  # the step the figure shows (a click on a cell is a slot of it)
        self.selected: int | None = None  # the slot the slot panel shows, outlined
        self._fig = None
        self._trace: Any = None
        self._last = 0.0
        self.state.param.watch(self._refresh, ["trace", "trace_version", "position", "running"])
        self._refresh()

    @property
    def shown_step(self) -> int | None:
        """The step the figure shows (None: a placeholder)."""
        s = self.state
        if self._fig is None or s.trace is None or len(s.trace) == 0:
            return None
        return min(s.position, len(s.trace) - 1)

    def _refresh(self, *_: Any) -> None:
        s = self.state
        if s.trace is None or len(s.trace) == 0:
            if self._fig is not None or s.trace is not None:
                msg = "waiting for the first forward..." if s.running else "press Generate to decode a prompt"
                self.pane.show(_placeholder("Block view", msg))
                self._fig = None
                self.drawn_step = None
                self._trace = None
            return
        pos = min(s.position, len(s.trace) - 1)
        now = time.monotonic()
        if s.running and self._trace is s.trace and now - self._last < LIVE_VIEW_S:
            return  # streaming: a later tick (or the end of the run) draws
        self._last = now
        self.drawn_step = pos
        names = {t.get("name") for t in self._base.data} if self._fig is not None else set()
        extra = F.block_trace_updates(s.trace, pos) if self._fig is not None else {}
        if self._fig is None or self._trace is not s.trace or not set(extra) <= names:
            # a new run, or traces the drawn figure lacks (revision marks once the run first revises): draw afresh
            self._fig = F.block_figure(s.trace, pos)  # validated by plotly once per run
            self._trace = s.trace
            self._base = FigureSnapshot.of(self._fig)
            self.pane.object = self._base
        else:  # the step's payload merged into that copy: no plotly validation per step
            heat, layout = F._block_payload(s.trace, pos)
            updates = {self._base.trace_index(F.BLOCK_TRACE): heat}
            # the "dropped at Stop" legend entry; rewritten / withdrawn slots (a revisable decoder's trace)
            for name, props in extra.items():
                updates[self._base.trace_index(name)] = props
            self.pane.object = self._base.updated(updates, layout)
        self._outline(len(s.trace.step(pos).tokens))

    def select(self, slot: int | None) -> None:
        """Outline ``slot`` of the block shown (the slot panel's; None: no outline)."""
        if slot != self.selected:
            self.selected = slot
            if self._fig is not None and self.drawn_step is not None and self.state.trace is not None:
                self._outline(len(self.state.trace.step(self.drawn_step).tokens))

    def _outline(self, length: int) -> None:
        shapes = []
        if self.selected is not None and self.selected < length:
            r, c = F.slot_cell(length, self.selected)
            shapes = [dict(type="rect", x0=c - 0.5, x1=c + 0.5, y0=r - 0.5, y1=r + 0.5, name="selected slot",
                           line=dict(color="#0f172a", width=3))]
        shown = self.pane.object
        if isinstance(shown, FigureSnapshot) and (shown.layout.get("shapes") or []) != shapes:
            self.pane.object = FigureSnapshot(shown.data, dict(shown.layout, shapes=shapes))

    def __panel__(self) -> Any:
        return self.pane


class TextView(pn.viewable.Viewer):
    """The text so far (prompt in grey), each generated token shaded by its confidence."""

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.pane = pn.pane.HTML("", sizing_mode="stretch_width", height=290,
                                 styles={"overflow-y": "auto", "border": "1px solid #e2e8f0",
                                         "border-radius": "6px", "padding": "6px", "background": "white"})
        self.show_prompt = pn.widgets.Checkbox(label="show prompt", value=False, margin=(0, 10))
        self.show_prompt.param.watch(self._refresh, "value")
        checked(self.show_prompt, None, self.state.report_setting)
        # the careful decode's answer under this run's, differing slots marked (clover_viz.session_careful)
        self.show_careful = pn.widgets.Checkbox(label="overlay the careful decode", value=False, margin=(0, 10))
        self.show_careful.param.watch(self._refresh, "value")
        checked(self.show_careful, None, self.state.report_setting)
        self._last = 0.0
        self.state.param.watch(self._refresh, ["trace", "trace_version", "position", "running"])
        self._refresh()

    def _refresh(self, *_: Any) -> None:
        s = self.state
        if s.trace is None or len(s.trace) == 0:
            self.pane.object = '<div style="color:#94a3b8">the decoded text appears here</div>'
            return
        now = time.monotonic()
        if s.running and now - self._last < LIVE_VIEW_S:
            return  # streaming: a later tick (or the end of the run) draws
        self._last = now
        pos = min(s.position, len(s.trace) - 1)
        text = F.text_html(s.trace, pos, show_prompt=self.show_prompt.value)
        record, end = s.careful or {}, s.trace.decode_end
        if self.show_careful.value and end is not None and record.get("reference") is not None:
            text += F.careful_overlay_html([s.trace.token_str(int(t)) for t in end.tokens],
                                           [s.trace.token_str(int(t)) for t in record["reference"]])
        elif self.show_careful.value:
            text += "<div style='color:#94a3b8;font-size:12px'>no careful decode to overlay yet</div>"
        self.pane.object = text

    def __panel__(self) -> Any:
        return pn.Column(pn.Row(pn.pane.Markdown("**Text so far** (background = confidence; orange = forced; in "
                                                 "verify mode orange = written by the base itself)",
                                                 margin=(0, 10)), self.show_prompt, self.show_careful),
                         self.pane, sizing_mode="stretch_width")


class CompareView(pn.viewable.Viewer):
    """This run beside the previous one: `figures.compare_table` of `ExplorerState.comparison`
    (the table the notebook `Explorer` shows too) and the text difference below it."""

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        # a fixed height and always shown: a pane that appears or grows later made the layout
        # draw this card over the text and the tabs below it (seen in the browser)
        empty = _placeholder("", "no previous run yet")  # the card's header names it
        empty.update_layout(height=F.COMPARE_TABLE_HEIGHT)
        self._empty = empty
        self.table = FigurePane(empty, height=F.COMPARE_TABLE_HEIGHT, sizing_mode="stretch_width",
                                config={"displayModeBar": False})
        self.pane = pn.pane.HTML("", sizing_mode="stretch_width")

    def refresh(self) -> None:
        s = self.state
        cmp = s.comparison() if s.trace is not None and len(s.trace) else None
        if cmp is None:
            self.table.show(self._empty)
            self.pane.object = ('<div style="color:#64748b">No previous run yet. Generate again, or drag threshold '
                                'or block size: the run before stays here for comparison.</div>')
            return
        labels = s.comparison_labels()
        table = F.compare_table(cmp["previous"], cmp["current"], labels=labels)
        table.update_layout(title_text="", margin_t=10)  # the card's header names it
        self.table.show(table)
        caption = diff_caption(cmp)
        self.pane.object = (
            (f"<p class='clover-diff-warning' style='font-size:13px;margin:8px 0 0;color:#b45309'><b>{caption}</b>"
             "</p>" if caption else "")
            + "<p style='font-size:13px;margin:8px 0 4px'>text difference "
            f"(<del style='background:#fee2e2'>{html.escape(labels[0])} only</del> <ins style='background:#dcfce7;"
            f"text-decoration:none'>{html.escape(labels[1])} only</ins>)</p>"
            "<div style='max-height:240px;overflow:auto;border:1px solid #e2e8f0;padding:6px;word-break:break-all'>"
            f"{cmp['text']['diff_html']}</div>"
        )

    def __panel__(self) -> Any:
        return pn.Column(self.table, self.pane, sizing_mode="stretch_width")


class CostView(pn.viewable.Viewer):
    """Bytes per forward as run vs projected, tokens/s measured here vs projected on a device for
    the whole run and its decode phase (`figures.cost_summary_html`), and the roofline."""

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.device = control(pn.widgets.Select, self.state, "device", label="Project onto device", width=180)
        self.union = control(pn.widgets.Select, self.state, "union_assumption", label="35B-A3B expert union",
                             width=220)
        self.headline = pn.pane.HTML("", sizing_mode="stretch_width")
        self.measure = pn.widgets.Button(label="Measure break-even here", width=220,
                                         description="Time this model's autoregressive step and block forward on "
                                                     "this machine: how many tokens per forward beat AR decoding")
        self.measure.on_click(self._measure)
        self.break_even = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["clover-break-even"])
        self.cost = FigurePane(_placeholder("Cost", "no run yet"), sizing_mode="stretch_width")
        self.roofline = FigurePane(F.roofline_figure(None, device=self.state.device),
                                       sizing_mode="stretch_width")

    def _measure(self, _event: Any = None) -> None:
        self.measure.loading = True
        try:
            self.state.measure_break_even()
        finally:
            self.measure.loading = False
        self.refresh()

    def refresh(self) -> None:
        s = self.state
        self.break_even.object = s.break_even_html()
        self.measure.disabled = bool(s.running)
        if s.trace is None or len(s.trace) == 0:
            self.headline.object = "<i>no run yet: the roofline shows the devices and the 35B-A3B AR step</i>"
            self.cost.show(_placeholder("Cost", "no run yet"))
            self.roofline.show(F.roofline_figure(None, device=s.device))
            return
        try:
            proj = s.cost_projection()
        except (ValueError, TypeError) as exc:
            proj = None
            s.error = f"No cost projection: {exc}"
        self.headline.object = F.cost_summary_html(s.trace, proj, step=min(s.position, len(s.trace) - 1))
        self.cost.show(F.cost_figure(s.trace, device=s.device, union_assumption=s.union_assumption))
        self.roofline.show(F.roofline_figure(s.trace, device=s.device, union_assumption=s.union_assumption))

    def __panel__(self) -> Any:
        return pn.Column(pn.Row(pn.Column(self.device, self.union, width=240), self.headline,
                                sizing_mode="stretch_width"),
                         pn.Row(self.measure, self.break_even, sizing_mode="stretch_width"),
                         self.cost, self.roofline, sizing_mode="stretch_width")


class FigureTabs(pn.viewable.Viewer):
    """The analysis figures in tabs; only the visible tab is redrawn (rate-limited while decoding)."""

    state = param.ClassSelector(class_=ExplorerState)

    TABS = ("Confidence", "Per forward", "Experts · state · memory", "Cost")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        s = self.state
        kw = dict(sizing_mode="stretch_width")
        self.heatmap = FigurePane(_placeholder("Confidence heatmap", "no run yet"), **kw)
        self.tpf = FigurePane(_placeholder("Tokens per forward", "no run yet"), **kw)
        self.cumulative = FigurePane(_placeholder("Cumulative tokens", "no run yet"), **kw)
        self.experts = FigurePane(_placeholder("Expert union", "no run yet"), **kw)
        self.expert_load = FigurePane(_placeholder("Tokens per expert", "no run yet"), **kw)
        self.ranks = FigurePane(_placeholder("Experts per device", "no run yet"), visible=False, **kw)
        self.state_norm = FigurePane(_placeholder("State norms", "no run yet"), **kw)
        self.memory = FigurePane(_placeholder("Memory share", "no run yet"), **kw)
        self.cost = CostView(state=s)
        self.tabs = pn.Tabs(
            (self.TABS[0], self.heatmap),
            (self.TABS[1], pn.Row(self.tpf, self.cumulative, **kw)),
            (self.TABS[2], pn.Column(pn.Row(self.experts, self.state_norm, **kw), self.ranks, self.expert_load,
                                     self.memory, **kw)),
            (self.TABS[3], self.cost),
            dynamic=True, **kw,
        )
        self._drawn: dict[int, tuple] = {}
        self._last_draw = 0.0
        self._heat_fig: Any = None
        self._heat_base: FigureSnapshot | None = None
        self._heat_trace: Any = None
        self._heat_key: tuple | None = None
        self.tabs.param.watch(lambda *_e: self.refresh(), "active")
        checked(self.tabs, self._tab_problem, s.report_setting, names=("active",))
        s.param.watch(lambda *_e: self.refresh(),
                      ["trace", "trace_version", "position", "running", "device", "union_assumption"])
        self.refresh()

    def _tab_problem(self, tab: Any) -> str | None:
        if isinstance(tab, int) and not isinstance(tab, bool) and 0 <= tab < len(self.tabs):
            return None
        return (f"Figure tab must be one of 0-{len(self.tabs) - 1} ({', '.join(self.TABS)}); got {tab!r:.40}. "
                f"Kept {self.TABS[self.tabs.active]}.")

    def refresh(self, force: bool = False) -> None:
        s = self.state
        tab = self.tabs.active
        key = (id(s.trace), s.trace_version, s.device, s.union_assumption,
               s.position if tab in (0, 2, 3) else None)
        if not force and self._drawn.get(tab) == key:
            return
        now = time.monotonic()
        if s.running and not force and now - self._last_draw < LIVE_REDRAW_S:
            return  # streaming: the next tick (or the end of the run) redraws
        self._last_draw = now
        self._drawn[tab] = key
        trace = s.trace
        empty = trace is None or len(trace) == 0
        pos = 0 if empty else min(s.position, len(trace) - 1)
        if tab == 0:
            if empty:
                waiting = "waiting for the first forward..." if s.running else "no run yet"
                self._heat_fig = self._heat_key = None
                self.heatmap.show(_placeholder("Confidence heatmap", waiting))
            else:
                self._draw_heatmap(trace, pos)
        elif tab == 1 and not empty:
            self.tpf.show(F.tokens_per_forward_figure(trace))
            self.cumulative.show(F.cumulative_tokens_figure(trace))
        elif tab == 2 and not empty:
            self.experts.show(F.expert_union_figure(trace))
            self.expert_load.show(F.expert_load_figure(trace))
            self.ranks.visible = F.expert_parallel(trace) is not None  # a run split over devices by expert
            if self.ranks.visible:
                self.ranks.show(F.expert_parallel_figure(trace))
            self.state_norm.show(F.state_norm_figure(trace))
            self.memory.show(F.memory_share_figure(trace, step=pos))
        elif tab == 3:
            self.cost.refresh()

    def _draw_heatmap(self, trace: Any, pos: int) -> None:
        """The confidence heatmap at ``pos``, updated in place: rebuilt for a new run, its data
        replaced when the block (or its number of iterations) changes, else only the cursor moves."""
        idx = F._index(trace)
        block = int(idx.block_of[pos])
        rows = idx.steps_of[block]
        key = (block, len(rows))
        shown = self.heatmap.object
        if self._heat_fig is None or self._heat_trace is not trace or not isinstance(shown, FigureSnapshot):
            self._heat_fig = F.confidence_heatmap(trace, block, step=pos)  # validated once per run
            self._heat_trace = trace
            self._heat_base = FigureSnapshot.of(self._heat_fig)
            self.heatmap.object = self._heat_base
        elif key != self._heat_key:  # another block, or it grew: its payload merged in
            data, layout = F._confidence_payload(trace, block, pos)
            base = self._heat_base
            self.heatmap.object = base.updated({base.trace_index(n): props for n, props in data.items()}, layout)
        else:  # the same rows: only the cursor (the layout's first shape) moves
            r = rows.index(pos) if pos in rows else None
            shapes = [dict(sh) for sh in shown.layout.get("shapes", [])]
            if shapes:
                shapes[0].update(visible=False) if r is None else shapes[0].update(y0=r - 0.5, y1=r + 0.5,
                                                                                  visible=True)
            self.heatmap.object = FigureSnapshot(shown.data, dict(shown.layout, shapes=shapes))
        self._heat_key = key

    def __panel__(self) -> Any:
        return self.tabs


# ----------------------------------------------------------------------------- the whole app
class ExplorerApp(pn.viewable.Viewer):
    """The explorer: ``sidebar`` (settings) and ``main`` (live views + figures) over one state.

    Displayed on its own (a notebook cell) it is a Row of the two; `apps/explorer.py` puts
    them into a template. Call `tick` periodically on the UI thread (the app does it with
    a per-session periodic callback).
    """

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        if "state" not in params:
            params["state"] = ExplorerState()
        super().__init__(**params)
        s = self.state
        self.settings = SettingsPanel(state=s)
        self.summary = RunSummary(state=s)
        self.playback = PlaybackBar(state=s)
        self.block = BlockView(state=s)
        self.text = TextView(state=s)
        self.tabs = FigureTabs(state=s)
        self.compare = CompareView(state=s)
        self.slot = SlotPanel(state=s, block=self.block)
        self.branches = BranchList(state=s)
        self.frontier = FrontierView(state=s)
        self.settings.report_shown_at_stop(self.summary.numbers, self.playback.scrub)  # a Stop keeps what was shown
        s.param.watch(lambda *_e: self.compare.refresh(), ["trace", "previous", "running", "branch_version"])
        self.compare.refresh()
        # every slider, whichever view made it: a range that changes later keeps the keys in range
        for slider in self.__panel__().select(_SliderBase):
            if not isinstance(slider, pn.widgets.CompositeWidget):
                keys_within_range(slider)

    def tick(self, dt: float = 0.1) -> None:
        """Drain the decode's events and advance playback (call on the UI thread)."""
        self.state.tick(dt)

    @property
    def sidebar(self) -> Any:
        return self.settings

    @property
    def main(self) -> Any:
        live = pn.Row(
            pn.Column(self.block, self.slot, sizing_mode="stretch_width", min_width=520),
            pn.Column(self.text, sizing_mode="stretch_width", min_width=320, max_width=560),
            sizing_mode="stretch_width",
        )
        return pn.Column(
            self.summary, self.playback, live,
            pn.Card(self.branches, self.compare,
                    title="Branches · compare two runs (default: previous run vs this run)", collapsed=False,
                    sizing_mode="stretch_width", header_background="#f1f5f9"),
            pn.Card(self.frontier, title="What speed costs: the frontier of this prompt", collapsed=True,
                    sizing_mode="stretch_width", header_background="#f1f5f9"),
            self.tabs,
            sizing_mode="stretch_width",
        )

    def __panel__(self) -> Any:
        return pn.Row(pn.Column(self.sidebar, width=340), self.main, sizing_mode="stretch_width")
