"""Branching in the explorer (issue 38, part 2) without a browser: the state's branch path (decoded
on the worker like a Generate), the tree it grows, the comparison of two picked runs, save / open
through the app's own download and upload, refusals shown as messages that lose nothing, a click on
the block view opening the slot of the step shown, and the notebook Explorer's widgets.

Model: the random ``clover-test`` with the dev option (weights x15), 16 new tokens in blocks of 8 --
a decode or a branch takes well under a second.

Run: ``.venv/bin/python -m pytest tests/clover_viz/test_branching.py -q``
"""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import torch

pytest.importorskip("panel")

from clover_viz import figures as F  # noqa: E402
from clover_viz.session_branches import slot_candidates  # noqa: E402
from clover_viz.state import ExplorerState  # noqa: E402
from clover_engine.decoding.branch import Branch  # noqa: E402
from clover_engine.recording.branches import BranchTree  # noqa: E402
from clover_engine.recording.trace import Trace  # noqa: E402

PROMPT = "Hello, block diffusion"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _decoded(**settings) -> ExplorerState:
    s = ExplorerState(model_dir="clover-test", dev_sharpen_random=True, prompt=PROMPT, max_new_tokens=16,
                      block_size=8, **settings)
    assert s.generate()
    assert s.wait(30) and s.status.startswith("done"), (s.status, s.error)
    return s


@pytest.fixture
def state():
    s = _decoded()
    yield s
    s.close()
    s.wait(5)


def _masked_slot(trace: Trace) -> tuple[int, int]:
    """(step, slot): a step of a block after the first with a slot still masked after it (its choice
    then changes what the rule decodes next)."""
    for i, ev in enumerate(trace.steps):
        if ev.block_index < 1:
            continue
        for slot in range(len(ev.tokens)):
            if slot_candidates(trace, i, slot).state == "masked":
                return i, slot
    raise AssertionError("no step leaves a slot masked: the test needs a decode that takes several steps per block")


def _other_candidate(trace: Trace, step: int, slot: int) -> int:
    c = slot_candidates(trace, step, slot)
    assert len(c.candidates) >= 2, c
    return next(x["token"] for x in c.candidates[1:] if x["token"] != c.token)


def test_slot_candidates_come_from_the_step_shown_or_the_step_that_wrote_the_slot(state):
    t = state.trace
    step, slot = _masked_slot(t)
    c = state.slot_candidates(step, slot)
    ev = t.step(step)
    assert (c.block_index, c.step_index, c.position) == (ev.block_index, ev.step_index, ev.position_start + slot)
    assert c.can_choose and not c.can_remask and c.source_step == step
    assert [x["token"] for x in c.candidates] == [int(x) for x in ev.top_tokens[slot] if x >= 0]
    # a written slot: the candidates of the forward that wrote it, at any later step of its block
    last = t.slot_index().last_step(ev.block_index)
    w = state.slot_candidates(last, slot)
    assert w.state in ("earlier", "accepted", "forced") and w.can_remask and w.token == int(t.step(last).tokens[slot])
    wrote = t.step(w.written_step)
    assert step < w.written_step <= last and wrote.masked_before[slot] and int(wrote.tokens[slot]) == w.token
    assert [x["token"] for x in w.candidates] == [int(x) for x in wrote.top_tokens[slot] if x >= 0]
    # a position in an earlier, finished block is read after that block's last step
    first = t.block_starts[0]
    p = state.slot_candidates(len(t) - 1, position=first.position_start + len(first.tokens) - 1)
    assert p.block_index == 0 and p.step == t.slot_index().last_step(0) and p.block_finished
    with pytest.raises(ValueError, match="slot 99 is outside block"):
        state.slot_candidates(step, 99)


def test_a_branch_decodes_live_and_joins_the_tree_with_the_chosen_token(state):
    orig = state.trace
    step, slot = _masked_slot(orig)
    token = _other_candidate(orig, step, slot)
    ev = orig.step(step)
    assert state.branch_choose(step, slot, token), state.error
    assert state.running and state.trace is not orig and state.previous is orig  # the worker, as a Generate
    seen = []  # drained one forward at a time, as the notebook's pump does: the views see each step
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, state.status
        if state.drain(max_steps=1):
            if not seen or seen[-1] != state.n_steps:
                seen.append(state.n_steps)
        elif not state.running:
            break
        else:
            time.sleep(0.001)
    assert state.wait(30) and state.error == "", state.error
    b = state.trace
    assert seen == list(range(1, len(b) + 1)) and state.position == len(b) - 1
    assert b.decode_end is not None and state.status.startswith("branch #1 (")
    # the branch's own record: the edited step forces the token, and the block ends holding it
    meta = b.meta["branch"]
    assert (meta["block_index"], meta["step_index"]) == (ev.block_index, ev.step_index)
    assert meta["edits"] == [dict(meta["edits"][0], slot=slot, token=token)]
    edited = b.step(meta["parent_nfe"] - 1)
    assert edited.tokens[slot] == token and edited.forced[slot]
    end = next(e for e in b.block_ends if e.block_index == ev.block_index)
    assert int(end.tokens[slot]) == token
    # the parent's steps up to the branch point are the parent's
    for i in range(meta["parent_nfe"] - 1):
        assert np.array_equal(b.step(i).tokens, orig.step(i).tokens)
    tree = state.branches
    assert len(tree) == 2 and tree.root is orig and tree[1] is b
    rows = state.branch_rows()
    assert [(r["id"], r["parent"], r["shown"]) for r in rows] == [(0, None, False), (1, 0, True)]
    assert f"slot {slot}" in rows[1]["label"]
    # a branch of the branch attaches to the branch it was made from
    s2, slot2 = _masked_slot(b)
    assert state.branch_choose(s2, slot2, _other_candidate(b, s2, slot2)), state.error
    assert state.wait(30) and state.error == ""
    assert [(r["id"], r["parent"]) for r in state.branch_rows()] == [(0, None), (1, 0), (2, 1)]
    # and one made with the current settings records what changed
    state.show_branch(0)
    assert state.branch_settings(len(orig) - 1, threshold=0.5) and state.wait(30) and state.error == "", state.error
    node = state.shown_node
    assert state.branches.nodes[node].parent == 0 and "threshold 0.95 -> 0.5" in state.branch_rows()[-1]["label"]


def test_showing_a_branch_and_comparing_any_two_runs(state):
    orig = state.trace
    step, slot = _masked_slot(orig)
    assert state.branch_choose(step, slot, _other_candidate(orig, step, slot)) and state.wait(30)
    branch = state.trace
    assert state.comparison_labels() == ("previous", "this run")
    cmp = state.comparison()
    assert cmp["previous"]["text"] == "".join(orig.token_str(t) for t in orig.generated_tokens)
    assert state.show_branch(0) and state.trace is orig and state.n_steps == len(orig)
    assert state.show_branch(1) and state.trace is branch and state.previous is orig  # its parent
    assert state.compare_pick(1, 0)
    assert state.comparison_labels() == ("#1", "#0 original")
    cmp = state.comparison()
    texts = ["".join(t.token_str(x) for x in t.generated_tokens) for t in (branch, orig)]
    assert [cmp["previous"]["text"], cmp["current"]["text"]] == texts
    assert not state.compare_pick(7, 0) and "no run 7" in state.error
    assert state.compare_pick() and state.comparison_labels() == ("previous", "this run")
    # the list marks the first answer token that differs from the parent's
    rows = state.branch_rows()
    d = rows[1]["first_difference"]
    html = F.branch_list_html(rows)
    assert html.count('class="clover-first-diff"') == 1
    if d is not None and d < len(rows[1]["tokens"]):
        assert rows[1]["tokens"][:d] == rows[0]["tokens"][:d] and rows[1]["tokens"][d] != rows[0]["tokens"][d]


def test_the_apps_save_and_open_keep_the_branches(state, tmp_path):
    import panel as pn  # noqa: F401  (the app's sidebar)

    from clover_viz.panel_views import ExplorerApp

    app = ExplorerApp(state=state)
    orig = state.trace
    step, slot = _masked_slot(orig)
    assert state.branch_choose(step, slot, _other_candidate(orig, step, slot)) and state.wait(30)
    saved = app.settings._save()  # the Save trace button's callback
    assert isinstance(saved, io.BytesIO)
    data = saved.getvalue()
    path = tmp_path / "tree.parquet"
    path.write_bytes(data)
    assert Trace.load(path).generated_tokens.tolist() == orig.generated_tokens.tolist()  # a plain reader: the original
    other = _decoded()
    try:
        app2 = ExplorerApp(state=other)
        app2.settings._open(data, "tree.parquet")  # the Open box's callback
        assert other.error == "" and "with 1 branch" in other.status
        tree = other.branches
        assert len(tree) == 2 and tree.nodes[1].parent == 0 and other.trace is tree.root
        assert tree[1].generated_tokens.tolist() == state.branches[1].generated_tokens.tolist()
        assert tree[1].meta["branch"]["label"] == state.branches[1].meta["branch"]["label"]
        assert "clover-first-diff" in app2.branches.table.object
        # a plain trace file still opens as before, and leaves the tree as it is
        plain = tmp_path / "plain.parquet"
        orig.save(plain)
        app2.settings._open(plain.read_bytes(), "plain.parquet")
        assert other.error == "" and "branch" not in other.status and len(other.trace) == len(orig)
        assert other.branches is tree and other.shown_node is None
        # the loaded tree branches on: a branch of its original attaches to node 0
        other.show_branch(0)
        s2, slot2 = _masked_slot(other.trace)
        assert other.branch_choose(s2, slot2, _other_candidate(other.trace, s2, slot2)) and other.wait(30), other.error
        assert [(r["id"], r["parent"]) for r in other.branch_rows()] == [(0, None), (1, 0), (2, 0)]
    finally:
        other.close()


def test_refusals_are_messages_and_lose_nothing(state):
    orig, prev = state.trace, state.previous
    step, slot = _masked_slot(orig)
    state.seek(step)
    # the engine's refusal, from the worker: the token the slot already holds
    last = orig.slot_index().last_step(orig.step(step).block_index)
    held = int(orig.step(last).tokens[slot])
    assert state.branch(Branch.choose(int(orig.step(last).block_index), int(orig.step(last).step_index), slot, held))
    state.wait(30)
    assert state.error.startswith("Not branched: ") and "already holds" in state.error, state.error
    assert state.trace is orig and state.previous is prev and state.position == step
    assert state.status.startswith("not branched") and state.branches is None
    # refused before it starts: a masked slot re-masked, a text of several tokens, a decode running
    assert not state.branch_remask(step, slot) and "nothing to re-mask" in state.error
    assert not state.branch_choose(step, slot, "several") and "is 7 tokens" in state.error
    assert state.generate()
    assert not state.branch_choose(step, slot, 5) and "a decode is running" in state.error
    state.wait(30)
    assert state.branches is None and state.trace is not orig and state.previous is orig


def test_token_entry_reads_ids_and_one_tokens_text(state):
    assert state.token_id("65") == 65 and state.token_id(66) == 66
    assert state.token_id("A") == state.token_id("'A'") == state.loaded_model.tokenizer.encode("A").ids[0]
    with pytest.raises(ValueError, match="type a token id"):
        state.token_id("  ")


def test_a_click_on_the_block_view_opens_the_slot_of_the_step_shown(state):
    from clover_viz.panel_views import ExplorerApp

    app = ExplorerApp(state=state)
    t = state.trace
    step, slot = _masked_slot(t)
    orig_block, orig_iter = t.step(step).block_index, t.step(step).step_index
    state.seek(step)  # the player's position: the block view draws that step
    assert app.block.drawn_step == step
    cols = min(8, len(t.step(step).tokens))
    app.block.pane.click_data = {"points": [{"x": slot % cols, "y": slot // cols, "curveNumber": 0}]}
    assert app.slot._at == (t, step, slot)
    assert f"slot {slot}</b>" in app.slot.info.object and app.slot.choose.visible and not app.slot.remask.visible
    assert app.block.pane.click_data == {}  # the same cell clicked again is a change again
    # choose the second candidate: the branch decodes and the list shows it
    second = list(app.slot.choice.options.values())[1]
    app.slot.choice.value = second
    assert f"(id {second})" in app.slot.choose.label
    app.slot._choose()
    assert state.wait(30) and state.error == ""
    assert state.branches[1].meta["branch"]["edits"][0]["token"] == second
    assert 'data-node="1"' in app.branches.table.object and app.branches.show.value == 1
    assert app.compare.table.object.data[0]["header"]["values"][1:3] == ["previous", "this run"]
    app.branches.compare_a.value = 0
    assert app.compare.table.object.data[0]["header"]["values"][1:3] == ["#0 original", "this run"]
    # the panel's own settings: a branch of the original from the step shown, threshold 0.6
    app.branches.show.value = 0
    assert state.trace is state.branches.root
    state.seek(step)
    app.block.pane.click_data = {"points": [{"x": slot % cols, "y": slot // cols, "curveNumber": 0}]}
    assert app.slot.new_threshold.value == 0.95 and app.slot.with_settings.visible
    app.slot.new_threshold.value = 0.6
    app.slot._branch_settings()
    assert state.wait(30) and state.error == ""
    row = state.branch_rows()[-1]
    assert row["parent"] == 0 and row["label"] == f"b{orig_block} s{orig_iter}: threshold 0.95 -> 0.6"


def test_the_notebook_explorer_branches_from_a_clicked_slot():
    pytest.importorskip("ipywidgets")
    from clover_viz.widgets import Explorer

    ex = Explorer("clover-test", decode_config=dict(block_size=8, max_new_tokens=16), prompt=PROMPT)
    try:
        t = ex.decode()
        step, slot = _masked_slot(t)
        ex.show_step(step)

        class Points:  # what plotly hands a heatmap's on_click callback
            xs, ys = [slot % 8], [slot // 8]

        ex.branching._on_click(None, Points())
        assert ex.branching._at == (t, step, slot) and not ex.branching.choose_button.disabled
        ex.branching.candidates.value = ex.branching.candidates.options[1][1]
        ex.branching._act("choose")
        assert ex.wait(30) and ex.state.error == ""
        assert len(ex.state.branches) == 2 and ex.trace is ex.state.branches[1]
        assert ex.status.value.startswith("branch #1 (")
        assert 'data-node="1"' in ex.branching.table.value
        assert ex.show_branch(0) is t
        ex.show_step(step)
        ex.branching.open(step, slot)
        ex.branching.new_threshold.value = 0.7
        ex.branching._act("settings")
        assert ex.wait(30) and ex.state.error == ""
        assert [(r["parent"], r["label"].split(": ")[-1]) for r in ex.state.branch_rows()][-1] == (0, "threshold 0.95 -> 0.7")
        assert ex.show_branch(0) is t
        with pytest.raises(ValueError, match="Not branched"):
            ex.branch(Branch.remask(int(t.step(step).block_index), int(t.step(step).step_index), slot))
        assert ex.trace is t
    finally:
        ex.close()
