"""Pacing a served session (`clover_viz.session_pacing`): a paced decode runs at most about one refresh
ahead of what its page drew, a Stop keeps what was drawn plus about one forward, the time spent waiting
for the page is not counted as decode time, and redraws are spaced by their cost and the live decodes.

Run: ``.venv/bin/python -m pytest tests/clover_viz/test_pacing.py -q``
"""

from __future__ import annotations

import threading
import time

import pytest

from clover_viz.session_pacing import MAX_DRAW_INTERVAL_S, PACE_S, DrawPacer, RunPace
from clover_viz.state import ExplorerState

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_an_unpaced_run_never_waits_and_a_paced_one_waits_for_the_page_until_drawn_or_cancelled():
    free = RunPace(False, threading.Event())
    t0 = time.monotonic()
    for _ in range(5):
        free.forward_ended()
        time.sleep(PACE_S / 4)
    assert free.waited_s == 0.0 and len(free.ended_at) == 5 and time.monotonic() - t0 < 5 * PACE_S

    cancel = threading.Event()
    paced = RunPace(True, cancel)
    paced.forward_ended()  # nothing undrawn for PACE_S yet: returns at once
    assert paced.waited_s < PACE_S
    time.sleep(PACE_S * 1.5)
    threading.Timer(0.3, paced.forwards_drawn, args=(1,)).start()  # the page draws forward 1 in 0.3 s
    t0 = time.monotonic()
    paced.forward_ended()  # forward 1 has waited > PACE_S undrawn: forward 2 waits for the draw
    assert 0.25 <= time.monotonic() - t0 < 2.0 and paced.waited_s >= 0.25
    time.sleep(PACE_S * 1.5)
    threading.Timer(0.2, cancel.set).start()
    t0 = time.monotonic()
    paced.forward_ended()  # forward 2 undrawn: waits, until the run is cancelled
    assert 0.15 <= time.monotonic() - t0 < 2.0


def test_redraws_are_spaced_by_their_cost_and_the_live_decodes_and_capped():
    pacer = DrawPacer()
    assert pacer.due()
    pacer.drew(0.02, live_decodes=1)
    assert not pacer.due()
    assert pacer.next_at - time.monotonic() == pytest.approx(0.06, abs=0.02)  # 0.02 s x 3 x 1
    pacer.drew(0.02, live_decodes=4)
    assert pacer.next_at - time.monotonic() == pytest.approx(0.24, abs=0.02)  # x 4 decodes
    pacer.drew(5.0, live_decodes=4)
    assert pacer.next_at - time.monotonic() <= MAX_DRAW_INTERVAL_S


def test_a_paced_decode_stays_near_its_page_and_a_stop_keeps_what_was_drawn_plus_about_one_forward():
    state = ExplorerState(model_dir="clover-test", dev_sharpen_random=True, prompt="Hello, block diffusion",
                          max_new_tokens=2048, block_size=32)
    state.paced_decodes = True
    try:
        assert state.load_model() is not None
        assert state.generate()
        run = state._run
        spans, deadline = [], time.monotonic() + 60
        while state.n_steps < 12 and time.monotonic() < deadline:  # a page that draws every 0.5 s: slow
            time.sleep(0.5)
            ended, drawn = list(run.pace.ended_at), run.pace.drawn
            if drawn < len(ended):  # how far past its oldest undrawn forward the worker ran
                spans.append(ended[-1] - ended[drawn])
            state.drain()
        assert state.n_steps >= 12, "the paced decode made no progress"
        forward_s = max(st.wall_s for st in state.trace.steps)
        # between two draws 0.5 s apart the worker ran about one refresh (PACE_S) ahead, then waited
        assert spans and max(spans) <= PACE_S + 2 * forward_s + 0.05, (spans, forward_s)
        shown = len(state.trace.steps)
        state.stop()
        assert state.wait(timeout=60)
        kept = state.trace.decode_end.nfe
        ended = run.pace.ended_at
        # what the stopped run kept past the page: at most about one refresh of forwards, plus the one in flight
        assert kept >= shown and ended[kept - 1] - ended[shown - 1] <= PACE_S + 3 * forward_s + 0.05, (shown, kept)
        end = state.trace.decode_end
        # the seconds spent waiting for the page are not decode time: wall time ~ the forwards' own
        forwards_s = sum(st.wall_s for st in state.trace.steps)
        assert run.pace.waited_s > 0.3  # it did wait for the page
        assert end.wall_s < forwards_s + 0.5 * run.pace.waited_s, (end.wall_s, forwards_s, run.pace.waited_s)
    finally:
        state.close()
