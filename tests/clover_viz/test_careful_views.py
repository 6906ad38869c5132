"""Every finished decode is measured against its careful decode, in the app's state and in both front ends' cards
(issue 63; `clover_viz.session_careful`).

* a run of clover-tiny records its agreement with the same settings decoded one slot per forward -- equal to the
  engine's own `agreement` of the two answers -- and the cards of the Panel app and of the notebook `Explorer`
  (one function, `clover_viz.runs.summary_cards_html`) show it; a saved trace replays the same card without the
  model;
* the next run on the same prompt at another threshold reuses the cached reference (measured at once);
* a run that is its own careful decode says so, a stopped run and a run superseded while measuring say why they
  were not measured; a family sampler's run (SDAR) is measured too.

Run: ``.venv/bin/python -m pytest tests/clover_viz/test_careful_views.py -q``
"""

from __future__ import annotations

import re
import time

import pytest

from clover_engine.decoding.careful import agreement, careful_setting
from clover_engine.decoding.samplers import decoder_for
from clover_viz.runs import careful_card, run_stats, summary_cards_html
from clover_viz.state import ExplorerState

PROMPT = "def add(a, b):\n    return"


def _card_value(html_text: str) -> str:
    return re.search(r'class="val clover-careful">([^<]*)<', html_text).group(1)


@pytest.fixture
def state():
    s = ExplorerState(model_dir="clover-tiny", prompt=PROMPT, max_new_tokens=24, block_size=32, threshold=0.6,
                      memory_mode="state", auto_redecode=False)
    assert s.load_model() is not None, s.error
    yield s
    s.close()


def _decode(s: ExplorerState) -> None:
    assert s.generate(), s.error
    assert s.wait(120) and s.status.startswith("done"), s.status


def test_a_finished_run_is_measured_and_every_card_shows_it(state, tmp_path):
    from clover_viz.session_careful import CAREFUL_REFERENCES

    state.threshold = 0.55  # a prompt/setting pair no other test measured: the reference is decoded here
    _decode(state)
    assert state.careful["status"] == "measuring" and _card_value(summary_cards_html(run_stats(state.trace))) \
        == "measuring…" and "careful" not in state.trace.meta
    assert state.wait_careful(120)
    record = state.careful
    loaded = state.loaded_model
    dc = state.decode_config(loaded)
    care = decoder_for(loaded.model, loaded.tokenizer, careful_setting(dc)).generate(
        state.trace.prompt_ids, record_trace=False, config=careful_setting(dc))
    want = agreement(state.trace.decode_end.tokens, care.tokens)
    assert {k: record[k] for k in want.to_dict()} == want.to_dict() and record["reference_nfe"] == care.nfe
    value, detail = careful_card(record)
    card = summary_cards_html(run_stats(state.trace))  # the app's cards and the notebook Explorer's
    assert _card_value(card) == value and detail in card
    assert value == (f"{want.token_agreement:.0f} %" if not want.identical else "100 %")
    from clover_viz.widgets import Explorer  # the notebook front end draws the same card for the same trace

    ex = Explorer(state.trace)
    assert _card_value(ex.summary.value) == value
    # a replay shows it without the model
    path = state.trace.save(tmp_path / "run.parquet")
    replay = ExplorerState(model_dir="clover-tiny", auto_redecode=False)
    try:
        assert replay.load_trace(str(path)), replay.error
        assert _card_value(summary_cards_html(run_stats(replay.trace))) == value
        assert replay.careful == record
    finally:
        replay.close()
    # the next run on the same prompt at another threshold: the same careful decode, measured at once
    assert CAREFUL_REFERENCES.get((loaded.spec, loaded.label), state.trace.prompt_ids, dc) == list(care.tokens)
    state.threshold = 0.9
    _decode(state)
    assert state.careful.get("status") is None and state.careful["n_reference"] == len(care.tokens)


def test_own_stopped_and_superseded_runs_say_why(state):
    state.block_size = 1  # one slot per forward: its own reference
    _decode(state)
    assert state.careful["own"] and careful_card(state.careful) == ("its own", "this run is one slot per forward")
    state.block_size, state.max_new_tokens, state.threshold = 32, 512, 0.99
    assert state.generate()
    state.stop()
    assert state.wait(120) and state.status.startswith("stopped"), state.status
    assert careful_card(state.careful) == ("–", "not measured: the run was stopped")
    state.max_new_tokens, state.threshold = 96, 0.61  # a reference not cached yet: it is measuring ...
    _decode(state)
    first = state.trace
    assert state.careful["status"] == "measuring" and "careful" not in first.meta  # beside the trace, not in it
    state.threshold = 0.62
    assert state.generate()  # ... when a new decode starts: the measurement is given up, and says so
    assert careful_card(first.meta["careful"]) == ("–", "not measured: a new decode started first")
    assert state.wait(120) and state.wait_careful(240)
    assert state.careful.get("status") is None and "token_agreement" in state.careful


def test_a_family_samplers_run_is_measured(tmp_path):
    pytest.importorskip("transformers")
    from clover_engine.backbones.block_causal import write_tiny_block_causal

    d = write_tiny_block_causal(tmp_path / "sdar", "SDAR")
    s = ExplorerState(model_dir=str(d), prompt="Explain block diffusion.", max_new_tokens=16, block_size=8,
                      threshold=0.5, memory_mode="state", auto_redecode=False)
    try:
        assert s.load_model() is not None, s.error
        s.policy = "sdar"
        _decode(s)
        assert s.wait_careful(120)
        assert "token_agreement" in s.careful and s.careful["reference_nfe"] >= s.careful["n_reference"] > 0
    finally:
        s.close()


def test_the_frontier_of_the_prompt_in_the_state_and_the_app(state):
    """The frontier card measures the prompt over a small grid in the background (the careful decode first,
    100 %), draws the figure and table, and a click on a point makes that run the run on display with its
    agreement on the card; a new decode cancels a frontier under way and keeps its points so far."""
    from clover_viz.panel_frontier import FrontierView

    view = FrontierView(state=state)
    state.threshold = 0.9
    assert state.measure_frontier(thresholds=(0.6, 0.9), block_sizes=(8,)), state.error
    assert view.cancel.visible is False or state.frontier_status.startswith("measuring")
    assert state.wait_frontier(240) and state.frontier_status.startswith("done"), state.frontier_status
    view.refresh()
    pts = state.frontier
    assert pts[0].careful and pts[0].agreement.token_agreement == 100.0 and sum(p.current for p in pts) == 1
    assert view.figure.visible and "clover-frontier-table" in view.table.object
    assert any(p.pareto for p in pts) and len(pts) == 5
    pick = next(i for i, p in enumerate(pts) if not p.careful and not p.current)
    view._on_click(type("E", (), {"new": {"points": [{"customdata": pick}]}})())  # a click on that point
    assert state.trace is pts[pick].result.trace and state.threshold == pts[pick].setting.threshold
    assert _card_value(summary_cards_html(run_stats(state.trace))) == careful_card(state.careful)[0]
    assert state.careful["token_agreement"] == pytest.approx(pts[pick].agreement.token_agreement)
    state.max_new_tokens = 64
    assert state.measure_frontier(thresholds=(0.6, 0.7, 0.8, 0.9), block_sizes=(4, 8))
    assert state.generate()  # a new decode: the frontier gives way
    assert state.frontier_status.startswith("cancelled after")
    assert state.wait(120)


def test_the_text_view_overlays_the_careful_answer_and_stop_ends_a_measurement(state):
    from clover_viz.panel_settings import SettingsPanel
    from clover_viz.panel_views import TextView

    text, panel = TextView(state=state), SettingsPanel(state=state)
    state.threshold, state.max_new_tokens = 0.5, 32
    _decode(state)
    assert state.wait_careful(120)
    record = state.careful
    text.show_careful.value = True
    shown = text.pane.object
    assert "clover-careful-overlay" in shown
    n_diff = shown.count('class="clover-careful-diff"')
    if record["identical"]:
        assert "identical to the careful decode" in shown and n_diff == 0
    else:  # each differing slot marked in both answers, the first one named
        assert f"the first at slot {record['first_difference']}" in shown and n_diff >= 2
    # a measurement under way: Stop is on and ends it, saying so on the card
    state.max_new_tokens, state.threshold = 128, 0.56
    _decode(state)
    assert state.measuring
    panel._sync()
    assert not panel.stop.disabled
    panel._on_stop_click(None)
    assert not state.measuring and careful_card(state.careful) == ("–", "not measured: Stop ended the measurement")


def test_the_notebook_explorer_shows_the_measured_card_and_draws_the_frontier():
    """The notebook `Explorer`: its card turns from "measuring…" to the measured agreement without another call,
    and ``ex.frontier()`` measures and draws the frontier of the session's prompt."""
    from clover_viz.widgets import Explorer

    ex = Explorer("clover-tiny", decode_config={"max_new_tokens": 24, "threshold": 0.58, "memory_mode": "state"},
                  prompt="def sub(a, b):\n    return")
    try:
        assert ex.state.measure_careful is True  # a notebook measures every decode, as the app does
        ex.decode()
        s = ex.state
        assert s.wait_careful(120)
        deadline = time.monotonic() + 30
        while _card_value(ex.summary.value) == "measuring…" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _card_value(ex.summary.value) == careful_card(s.careful)[0] != "measuring…"
        fig = ex.frontier(thresholds=(0.6, 0.9), block_sizes=(8,))
        assert len(s.frontier) >= 4 and s.frontier[0].careful and len(fig.data) >= 2
    finally:
        ex.close()
