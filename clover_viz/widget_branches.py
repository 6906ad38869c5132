"""Branching in the notebook `Explorer`: a slot's candidates at the step shown, the branch actions,
and the list of the session's branches with the comparison's two runs.

Wing: front ends (`clover_viz`), below `clover_viz.widgets`. `BranchWidgets` is built by
`clover_viz.widgets.Explorer` (its ``branching``): the slot panel sits under the block view, the
branch list in the "compare runs" tab. The state does the work (`clover_viz.session_branches`);
the branch decodes on the state's worker and the Explorer's pump draws it like a decode
(`clover_viz.widget_decoding.ExplorerDecoding.start_branch`).

* a click on a cell of the block view (``on_click`` of its heatmap), or the slot box and **Open slot**,
  opens that slot at the step the slider shows: its top-K candidates (`figures.candidates_html`);
* **Choose** writes the picked candidate (or the token typed in the box: an id or its text) there,
  **Re-mask** withdraws a written slot, **Branch here with these settings** decodes on from the step
  with the panel's own threshold and block size (the Explorer's re-decode the prompt when moved) and
  the Explorer's other settings (`Explorer.config`);
* the branch list (`figures.branch_list_html`), a picker showing any branch, and two pickers of the
  runs the comparison sets side by side (default previous vs this run).

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_branching.py -q``
"""

from __future__ import annotations

import dataclasses
import html
from typing import Any

from clover_viz import figures as F
from clover_viz.session_branches import CURRENT, PICK_LABELS, PREVIOUS, candidate_label
from clover_viz.session_settings import BLOCK_SIZES
from clover_engine.decoding.branch import Branch


class BranchWidgets:
    """The branching widgets of one `clover_viz.widgets.Explorer` (``explorer.branching``).

    Attributes:
        slot_panel: the slot's candidates and actions (under the block view).
        list_panel: the branch list and the pickers (in the "compare runs" tab).
    """

    def __init__(self, explorer: Any) -> None:
        import ipywidgets as W  # optional: the notebook front end only, as in clover_viz.widgets

        self.ex = explorer
        has_model = explorer.config is not None
        self.slot = W.BoundedIntText(value=0, min=0, max=4096, description="slot", layout=W.Layout(width="160px"))
        self.open_button = W.Button(description="Open slot", disabled=not has_model,
                                    tooltip="the slot's candidates at the step shown (or click a cell of the block)")
        self.info = W.HTML(value="<i>click a slot of the block view (or give its index and Open slot): its "
                                 "candidates at the step shown, and branches from there</i>")
        self.candidates = W.Dropdown(options=[], description="candidate", layout=W.Layout(width="420px"))
        self.entry = W.Text(placeholder="or another token: its id or its text", layout=W.Layout(width="300px"))
        self.choose_button = W.Button(description="Choose", button_style="primary", disabled=True)
        self.remask_button = W.Button(description="Re-mask", disabled=True)
        self.settings_button = W.Button(description="Branch here with these settings", disabled=not has_model,
                                        layout=W.Layout(width="260px"),
                                        tooltip="decode on from the step shown with this threshold and block size")
        cfg = explorer.config
        self.new_threshold = W.BoundedFloatText(value=float(getattr(cfg, "threshold", 0.95)), min=0.0, max=1.0,
                                                step=0.01, description="threshold", layout=W.Layout(width="170px"))
        self.new_block = W.Dropdown(options=sorted(set(BLOCK_SIZES) | {int(getattr(cfg, "block_size", 32))}),
                                    value=int(getattr(cfg, "block_size", 32)), description="block",
                                    layout=W.Layout(width="150px"))
        self.message = W.HTML(value="")
        self.table = W.HTML(value=F.branch_list_html([]))
        self.show_pick = W.Dropdown(options=[("–", -1)], value=-1, description="show")
        opts = [(PICK_LABELS[PREVIOUS], PREVIOUS), (PICK_LABELS[CURRENT], CURRENT)]
        self.compare_a = W.Dropdown(options=opts, value=PREVIOUS, description="compare")
        self.compare_b = W.Dropdown(options=opts, value=CURRENT, description="with")
        self._at: tuple[Any, int, int] | None = None
        self._syncing = False
        self.open_button.on_click(lambda _b: self.open(self.ex._step, int(self.slot.value)))
        self.choose_button.on_click(lambda _b: self._act("choose"))
        self.remask_button.on_click(lambda _b: self._act("remask"))
        self.settings_button.on_click(lambda _b: self._act("settings"))
        self.show_pick.observe(self._on_show, names="value")
        self.compare_a.observe(self._on_compare, names="value")
        self.compare_b.observe(self._on_compare, names="value")
        self.slot_panel = W.VBox([W.HBox([self.slot, self.open_button, self.new_threshold, self.new_block,
                                          self.settings_button]), self.info,
                                  W.HBox([self.candidates, self.entry]),
                                  W.HBox([self.choose_button, self.remask_button]), self.message])
        self.list_panel = W.VBox([self.table, W.HBox([self.show_pick, self.compare_a, self.compare_b])])
        self.widgets = [self.slot, self.open_button, self.new_threshold, self.new_block, self.info, self.candidates, self.entry, self.choose_button,
                        self.remask_button, self.settings_button, self.message, self.table, self.show_pick,
                        self.compare_a, self.compare_b, self.slot_panel, self.list_panel,
                        *self.slot_panel.children, *self.list_panel.children]

    # ------------------------------------------------------------------ the slot
    def attach_click(self) -> None:
        """(Re)register the block view's click: call after its traces were replaced."""
        fig = self.ex.block_fig
        cells = [t for t in fig.data if t.name == F.BLOCK_TRACE]
        if cells:
            cells[0].on_click(self._on_click, append=False)

    def _on_click(self, _trace: Any, points: Any, _state: Any = None) -> None:
        xs, ys = list(getattr(points, "xs", []) or []), list(getattr(points, "ys", []) or [])
        t = self.ex.trace
        if not xs or t is None or len(t) == 0:
            return
        slot = F.slot_at_cell(len(t.step(self.ex._step).tokens), xs[0], ys[0])
        if slot is not None:
            self.open(self.ex._step, slot)

    def open(self, step: int, slot: int) -> None:
        """Show slot ``slot`` of the block at global ``step`` (a click on the block view does this)."""
        s = self.ex.state
        try:
            c = s.slot_candidates(step, slot)
        except ValueError as exc:
            self.message.value = f"<span style='color:#b91c1c'>{html.escape(str(exc))}</span>"
            return
        self._at, self._c = (s.trace, c.step, c.slot), c
        self.slot.value = c.slot
        self.info.value = F.candidates_html(c)
        self.candidates.options = [(candidate_label(x, c.token), x["token"]) for x in c.candidates]
        pick = next((x["token"] for x in c.candidates if x["token"] != c.token), None)
        if pick is not None:
            self.candidates.value = pick
        self.entry.value = ""
        self.message.value = ""
        has_model = self.ex.config is not None
        dc = s.trace.decode_config or {}
        self.new_threshold.value = float(dc.get("threshold", self.new_threshold.value))
        if dc.get("block_size") in self.new_block.options:
            self.new_block.value = dc["block_size"]
        self.choose_button.disabled = not (has_model and c.can_choose)
        self.remask_button.disabled = not (has_model and c.can_remask)

    def _act(self, what: str) -> None:
        if self._at is None and what != "settings":
            self.message.value = "<span style='color:#b91c1c'>open a slot first (click the block view)</span>"
            return
        s = self.ex.state
        step, slot = (self._at[1], self._at[2]) if self._at is not None else (self.ex._step, 0)
        if what == "choose":
            token = self.entry.value.strip() or self.candidates.value
            action = lambda: s.branch_choose(step, slot, token)  # noqa: E731
        elif what == "remask":
            action = lambda: s.branch_remask(step, slot)  # noqa: E731
        else:
            action = lambda: self._branch_widget_settings(step)  # noqa: E731
        self.message.value = ""
        if not self.ex.start_branch(action=action):
            self.message.value = f"<span style='color:#b91c1c'>{html.escape(self.ex._last_error)}</span>"

    def _branch_widget_settings(self, step: int) -> bool:
        """Branch after ``step`` with the Explorer's settings (its config, the threshold / block_size widgets)."""
        if self.ex.config is None:  # a replay: the state says what is missing
            return self.ex.state.branch_settings(step)
        ev = self.ex.trace.step(step)
        dc = dataclasses.replace(self.ex.config, threshold=float(self.new_threshold.value),
                                 block_size=int(self.new_block.value))
        return self.ex.state.branch(Branch(int(ev.block_index), int(ev.step_index), config=dc))

    # ------------------------------------------------------------------ the list
    def refresh(self) -> None:
        """Redraw the branch list and the pickers from the state (after a run, a pick, a new tree)."""
        s = self.ex.state
        rows = s.branch_rows()
        self.table.value = F.branch_list_html(rows)
        self._syncing = True
        try:
            self.show_pick.options = [("–", -1)] + [(f"{r['name']}: {r['label']}"[:60], r["id"]) for r in rows]
            shown = s.shown_node
            self.show_pick.value = -1 if shown is None else shown
            picks = [(PICK_LABELS[PREVIOUS], PREVIOUS), (PICK_LABELS[CURRENT], CURRENT)] + [
                (f"#{r['id']}" + (" original" if r["id"] == 0 else ""), r["id"]) for r in rows]
            a, b = s._compare or (PREVIOUS, CURRENT)
            for w, v in ((self.compare_a, a), (self.compare_b, b)):
                w.options = picks
                w.value = v
        finally:
            self._syncing = False
        if self._at is not None and self._at[0] is not s.trace:
            self._at = None
            self.choose_button.disabled = self.remask_button.disabled = True

    def _on_show(self, change: dict) -> None:
        if self._syncing or change["new"] is None or change["new"] < 0:
            return
        if self.ex.show_branch(int(change["new"])) is None:
            self.refresh()

    def _on_compare(self, _change: dict) -> None:
        if self._syncing:
            return
        self.ex.state.compare_pick(self.compare_a.value, self.compare_b.value)
        self.ex._show_comparison()
        self.refresh()


__all__ = ["BranchWidgets"]
