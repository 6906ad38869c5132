"""The Panel app's branching views: a slot's candidates and the actions on it (`SlotPanel`), and the
session's branches with the comparison's two runs (`BranchList`).

Wing: front ends (`clover_viz`), one of the Panel views (`clover_viz.panel_views.ExplorerApp` puts
`SlotPanel` under the block view and `BranchList` beside the comparison). They call the state's
branching API (`clover_viz.session_branches`); the branch decodes on the state's worker like a
Generate, so every live view draws it.

* `SlotPanel` -- a click on a cell of the block view (``click_data`` of its Plotly pane) opens that
  slot at the step the view shows: what it holds, its top-K candidates with probabilities, a box for
  any other token (an id or its text), and three actions: **Choose** (branch with that token there),
  **Re-mask** (a written slot decoded again) and **Branch here with these settings** (its own threshold
  and block size -- moving the sidebar's re-decodes the whole prompt -- and the sidebar's other settings).
* `BranchList` -- every branch under the run it came from (change, NFE, tokens per forward, forced
  fills, the answer with its first difference from the parent's marked; `figures.branch_list_html`),
  a picker showing any of them in the main views, and two pickers for the comparison's runs.

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_branching.py tests/apps/test_browser_branching.py -q``
"""

from __future__ import annotations

import html
from typing import Any

import panel as pn
import param

from clover_viz import figures as F
from clover_viz.panel_checks import check_setting, checked
from clover_viz.session_branches import CURRENT, PICK_LABELS, PREVIOUS, candidate_label
from clover_viz.session_settings import BLOCK_SIZES
from clover_viz.state import ExplorerState

_HINT = ("<div style='color:#64748b;font-size:13px'>Click a slot of the block view to see its candidates at the "
         "step shown, and branch from there.</div>")


class SlotPanel(pn.viewable.Viewer):
    """One slot of the block view at the step shown: its candidates and the branch actions.

    Args:
        state: the session's `ExplorerState`.
        block: the `clover_viz.panel_views.BlockView` whose clicks open slots (``drawn_step`` is the
            step its figure shows).
    """

    state = param.ClassSelector(class_=ExplorerState)
    block = param.Parameter(doc="The BlockView whose cells are clicked.")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        s = self.state
        self.info = pn.pane.HTML(_HINT, sizing_mode="stretch_width", css_classes=["clover-slot-info"])
        self.choice = pn.widgets.RadioBoxGroup(options={}, inline=False, visible=False, margin=(0, 10))
        self.entry = pn.widgets.TextInput(placeholder="or another token: its id (e.g. 262) or its text",
                                          visible=False, sizing_mode="stretch_width")
        self.choose = pn.widgets.Button(label="Choose", color="primary", visible=False)
        self.remask = pn.widgets.Button(label="Re-mask", visible=False,
                                        description="withdraw the written token: the rule decodes this slot again")
        self.with_settings = pn.widgets.Button(label="Branch here with these settings", visible=False,
                                               description="decode on from this step with this threshold and block "
                                                           "size, and the sidebar's policy, memory mode, budget ...")
        lo, hi = self.state.param.threshold.bounds
        self.new_threshold = pn.widgets.FloatInput(label="threshold", start=lo, end=hi, step=0.01, value=s.threshold,
                                                   width=110, visible=False)
        self.new_block = pn.widgets.Select(label="block size", options=list(BLOCK_SIZES), value=s.block_size,
                                           width=100, visible=False)
        self.message = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["clover-slot-message"])
        # what the page sends is checked on the server: the sidebar's rules for threshold and block size
        check_setting(self.new_threshold, s, "threshold")
        check_setting(self.new_block, s, "block_size")
        for w in (self.choice, self.entry):
            checked(w, None, s.report_setting)
        self._at: tuple[Any, int, int] | None = None  # (trace, step, slot) shown
        self.choice.param.watch(self._sync_buttons, "value")
        self.entry.param.watch(self._sync_buttons, "value_input")
        self.choose.on_click(self._choose)
        self.remask.on_click(self._remask)
        self.with_settings.on_click(self._branch_settings)
        self.block.pane.param.watch(self._on_click, "click_data")
        s.param.watch(self._follow, ["trace", "position", "running"])
        s.param.watch(self._on_error, "error")

    # ------------------------------------------------------------------ a slot opened
    def _on_click(self, event: Any) -> None:
        points = (event.new or {}).get("points") or []
        if not points:
            return
        self.block.pane.click_data = {}  # the same cell clicked again later is a change again
        s, step = self.state, self.block.drawn_step
        if s.trace is None or step is None or step >= len(s.trace):
            return
        slot = F.slot_at_cell(len(s.trace.step(step).tokens), points[0].get("x"), points[0].get("y"))
        if slot is not None:
            self.open(step, slot)

    def open(self, step: int, slot: int) -> None:
        """Show slot ``slot`` of the block at global ``step`` of the run on display (what a click does)."""
        s = self.state
        try:
            c = s.slot_candidates(step, slot)
        except ValueError as exc:
            self.close(f"<div style='color:#b91c1c'>{html.escape(str(exc))}</div>")
            return
        self._at = (s.trace, c.step, c.slot)
        self._c = c
        self.info.object = F.candidates_html(c, table=False)  # the radio list below holds them
        self.block.select(c.slot)
        self.choice.options = {candidate_label(x, c.token): x["token"] for x in c.candidates}
        pick = next((x["token"] for x in c.candidates if x["token"] != c.token), None)
        if pick is not None:
            self.choice.value = pick
        self.entry.value = self.entry.value_input = ""
        self.message.object = ""
        for w in (self.choice, self.entry, self.choose):
            w.visible = c.can_choose
        self.choice.visible = c.can_choose and bool(c.candidates)
        self.remask.visible = c.can_remask
        dc = s.trace.decode_config or {}
        self.new_threshold.value = float(dc.get("threshold", s.threshold))
        if dc.get("block_size") in self.new_block.options:
            self.new_block.value = dc["block_size"]
        for w in (self.with_settings, self.new_threshold, self.new_block):
            w.visible = True
        self._sync_buttons()

    def close(self, message: str = _HINT) -> None:
        """Forget the slot shown (the panel says ``message``)."""
        self._at = None
        self.info.object = message
        self.block.select(None)
        for w in (self.choice, self.entry, self.choose, self.remask, self.with_settings, self.new_threshold,
                  self.new_block):
            w.visible = False

    def _follow(self, *_: Any) -> None:
        """The run or the step shown changed: the same slot at the new step (same run and block), else close."""
        s = self.state
        if self._at is None:
            return
        trace, step, slot = self._at
        if s.running:  # a branch (or a decode) under way: the actions wait; a refused one shows this run again
            self._sync_buttons()
            return
        if s.trace is not trace:
            self.close()
            return
        pos = min(s.position, len(trace) - 1)
        if pos != step:
            if trace.step(pos).block_index == trace.step(step).block_index:
                self.open(pos, slot)
            else:
                self.close()

    # ------------------------------------------------------------------ actions
    def _token(self) -> Any:
        typed = (self.entry.value_input or self.entry.value or "").strip()
        return typed or self.choice.value

    def _sync_buttons(self, *_: Any) -> None:
        if self._at is None:
            return
        tok = self._token()
        self.choose.disabled = tok is None or self.state.running
        if isinstance(tok, int):
            text = next((candidate_label(x) for x in self._c.candidates if x["token"] == tok), f"id {tok}")
            self.choose.label = f"Choose {text.split('  ')[0]} (id {tok})"
        else:
            self.choose.label = "Choose the typed token" if tok else "Choose"
        self.remask.disabled = self.with_settings.disabled = self.state.running

    def _choose(self, _event: Any = None) -> None:
        if self._at is None:
            return
        _, step, slot = self._at
        self._run(lambda: self.state.branch_choose(step, slot, self._token()))

    def _remask(self, _event: Any = None) -> None:
        if self._at is None:
            return
        _, step, slot = self._at
        self._run(lambda: self.state.branch_remask(step, slot))

    def _branch_settings(self, _event: Any = None) -> None:
        if self._at is None:
            return
        self._run(lambda: self.state.branch_settings(self._at[1], threshold=float(self.new_threshold.value),
                                                     block_size=int(self.new_block.value)))

    def _run(self, action: Any) -> None:
        self.message.object = ""
        action()

    def _on_error(self, event: Any) -> None:
        """A refused branch is said here too (beside the actions), not only at the top of the page."""
        msg = event.new or ""
        self.message.object = (f"<div style='color:#b91c1c;font-size:13px'>{html.escape(msg)}</div>"
                               if msg.startswith("Not branched") else "")

    def __panel__(self) -> Any:
        return pn.Column(
            self.info, self.choice, self.entry,
            pn.Row(self.choose, self.remask, sizing_mode="stretch_width"),
            pn.Row(self.new_threshold, self.new_block, self.with_settings, sizing_mode="stretch_width"), self.message,
            sizing_mode="stretch_width", css_classes=["clover-slot-panel"],
            styles={"border": "1px solid #e2e8f0", "border-radius": "6px", "background": "white"},
        )


class BranchList(pn.viewable.Viewer):
    """The session's branches (`figures.branch_list_html`), a picker of the run shown and the comparison's
    two runs (`ExplorerState.compare_pick`; default previous vs this run)."""

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        s = self.state
        self.table = pn.pane.HTML("", sizing_mode="stretch_width",
                                  styles={"max-height": "320px", "overflow-y": "auto"})
        self.show = pn.widgets.Select(label="Show in the views", options={"–": -1}, value=-1, width=240)
        opts = {PICK_LABELS[PREVIOUS]: PREVIOUS, PICK_LABELS[CURRENT]: CURRENT}
        self.compare_a = pn.widgets.Select(label="Compare", options=dict(opts), value=PREVIOUS, width=170)
        self.compare_b = pn.widgets.Select(label="with", options=dict(opts), value=CURRENT, width=170)
        self._syncing = False
        self.show.param.watch(self._on_show, "value")
        self.compare_a.param.watch(self._on_compare, "value")
        self.compare_b.param.watch(self._on_compare, "value")
        for w in (self.show, self.compare_a, self.compare_b):
            checked(w, None, s.report_setting)  # a label not among the options: refused, not a ValueError
        s.param.watch(self.refresh, ["branch_version", "trace", "running"])
        self.refresh()

    def refresh(self, *_: Any) -> None:
        """Redraw the list and the pickers from the state."""
        s = self.state
        rows = s.branch_rows()
        self.table.object = F.branch_list_html(rows)
        names = {f"{r['name']}: {r['label']}"[:60]: r["id"] for r in rows}
        picks = {PICK_LABELS[PREVIOUS]: PREVIOUS, PICK_LABELS[CURRENT]: CURRENT, **{f"#{r['id']}" + (" original" if r["id"] == 0 else ""): r["id"]
                                                         for r in rows}}
        a, b = s._compare or (PREVIOUS, CURRENT)
        self._syncing = True
        try:
            self.show.options = {"–": -1, **names}
            shown = s.shown_node
            self.show.value = -1 if shown is None else shown
            self.show.disabled = not rows or s.running
            for w, v in ((self.compare_a, a), (self.compare_b, b)):
                w.options = picks
                w.value = v
        finally:
            self._syncing = False

    def _on_show(self, event: Any) -> None:
        if self._syncing or event.new is None or event.new < 0:
            return
        if not self.state.show_branch(int(event.new)):
            self.refresh()

    def _on_compare(self, _event: Any) -> None:
        if self._syncing:
            return
        if not self.state.compare_pick(self.compare_a.value, self.compare_b.value):
            self.refresh()

    def __panel__(self) -> Any:
        return pn.Column(
            pn.pane.Markdown("**Branches** of this prompt, each under the run it came from", margin=(0, 10)),
            self.table, pn.FlexBox(self.show, self.compare_a, self.compare_b, sizing_mode="stretch_width"),
            sizing_mode="stretch_width", css_classes=["clover-branches"],
        )


__all__ = ["BranchList", "SlotPanel"]
