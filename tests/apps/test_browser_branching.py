"""Branching in a real browser (issue 38, part 2): decode, step back, click a slot of the block view,
choose its second candidate, and the branch decodes live and shows up in the branch list under the
original with its first difference from it marked.

The click is a real mouse click on the plotly cell (its centre computed from the plot area: the
block view's axes span its columns and rows exactly), at a step the player moved back to -- so the
slot opened must be the one of the step shown, not of the last step.

Same fixtures as `test_browser.py` (`conftest.py`): the random ``clover-test`` with the dev option,
32 new tokens; seconds per decode.

Run: ``.venv/bin/python -m pytest tests/apps/test_browser_branching.py -q``
"""

from __future__ import annotations

import re
import time

import pytest
from helpers import BROWSER_TIMEOUT_MS as TIMEOUT_MS

pytest.importorskip("panel")


def _wait(cond, what: str, timeout_s: float = TIMEOUT_MS / 1000) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _pick_slot(trace) -> tuple[int, int]:
    """(step, slot): the first step with a generated slot still masked after it and two candidates."""
    from clover_viz.session_branches import slot_candidates

    for i, ev in enumerate(trace.steps):
        for slot in range(len(ev.tokens)):
            c = slot_candidates(trace, i, slot)
            if c.state == "masked" and len(c.candidates) >= 2:
                return i, slot
    raise AssertionError("no step leaves a slot masked with two candidates")


def test_click_a_slot_choose_the_second_candidate_and_see_the_branch(page):
    pg, sessions = page
    pg.get_by_text("press Generate to decode a prompt").first.wait_for(timeout=TIMEOUT_MS)
    state = sessions[-1]
    pg.get_by_role("button", name=re.compile("Generate")).first.click()
    _wait(lambda: state.trace is not None and not state.running and state.trace.decode_end is not None,
          f"the decode did not end: {state.status}")
    pg.locator('.clover-status[data-running="0"]', has_text=re.compile(r"^done")).first.wait_for(timeout=TIMEOUT_MS)
    orig = state.trace
    step, slot = _pick_slot(orig)
    assert step < len(orig) - 1  # a step before the last: the click must be read at the step shown
    # the player goes back to that step (the first-step button, then "step ▶")
    pg.get_by_role("button", name="|◀").first.click()
    for _ in range(step):
        pg.get_by_role("button", name="step ▶").first.click()
    _wait(lambda: state.position == step, f"position {state.position}, wanted {step}")
    pg.locator(".clover-scrub-label", has_text=f"step: {step + 1} of {len(orig)}").first.wait_for(timeout=TIMEOUT_MS)
    title = re.compile(rf"step {step + 1}/{len(orig)}")
    plot = pg.locator(".clover-block-view .js-plotly-plot").first
    plot.locator("text.gtitle", has_text=title).first.wait_for(timeout=TIMEOUT_MS)
    # the cell's centre: the plot area spans the block's columns (x) and rows (y, top row first)
    length = len(orig.step(step).tokens)
    cols = min(8, length)
    rows = -(-length // cols)
    area = plot.locator(".nsewdrag").first.bounding_box()
    r, c = divmod(slot, cols)
    pg.mouse.click(area["x"] + (c + 0.5) * area["width"] / cols, area["y"] + (r + 0.5) * area["height"] / rows)
    info = pg.locator(".clover-slot-info", has_text=f"slot {slot} · pos {orig.step(step).position_start + slot}")
    info.first.wait_for(timeout=TIMEOUT_MS)
    # read at the step shown (an HTML pane's text lives in its shadow root: has_text pierces it)
    pg.locator(".clover-slot-info", has_text=f"(step {step + 1})").first.wait_for(timeout=TIMEOUT_MS)
    # the second candidate, then Choose
    from clover_viz.session_branches import slot_candidates

    second = slot_candidates(orig, step, slot).candidates[1]["token"]
    pg.locator(".clover-slot-panel input[type=radio]").nth(1).check()
    choose = pg.get_by_role("button", name=re.compile(rf"^Choose .*\(id {second}\)$")).first
    choose.wait_for(timeout=TIMEOUT_MS)
    choose.click()
    _wait(lambda: state.branches is not None and len(state.branches) == 2 and not state.running,
          f"no branch: {state.status} {state.error}")
    assert state.error == ""
    branch = state.branches[1]
    assert state.trace is branch and state.branches.root is orig
    edit = branch.meta["branch"]["edits"][0]
    assert (edit["slot"], edit["token"]) == (slot, second)
    pg.locator(".clover-status", has_text=re.compile(r"^branch #1 \(")).first.wait_for(timeout=TIMEOUT_MS)
    # the branch list: the original, then the branch under it (shown), its first difference marked
    row = pg.locator('.clover-branch-row[data-node="1"]').first
    row.wait_for(timeout=TIMEOUT_MS)
    assert "clover-branch-shown" in (row.get_attribute("class") or "")
    pg.locator('.clover-branch-row[data-node="1"]', has_text=f"slot {slot}").first.wait_for(timeout=TIMEOUT_MS)
    rows = state.branch_rows()
    d = rows[1]["first_difference"]
    assert d is not None, "the branch wrote another token: its answer must differ from the original's"
    mark = row.locator(".clover-first-diff").first
    mark.wait_for(timeout=TIMEOUT_MS)
    from clover_viz.figures.branches import answer_html

    want = re.search(r'clover-first-diff[^>]*>(.*?)</mark>', answer_html(rows[1]["tokens"], d)).group(1)
    got = mark.evaluate("el => el.innerHTML")
    assert got == want, (got, want)
    assert pg.locator('.clover-branch-row[data-node="0"]').first.is_visible()
