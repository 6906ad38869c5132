"""The explorer's controls in a real browser (issue 35, items 3 and 4): every pick of a file
loads it, and every slider whose range changes at run time answers the keyboard within its
current range.

* Item 3: a browser's ``<input type=file>`` fires no ``change`` for the file it already holds,
  and Panel's ``FileInput.value`` does not change for the same bytes, so opening the same trace
  again (after a Generate replaced it on the page) did nothing. Every file input of the app is
  cleared after each pick, loaded or refused (`panel_controls.clear_after_pick`); the tests open the
  same trace twice around a Generate, the same unreadable file twice around a Generate, and check
  that every `FileInput` of the app has that treatment.
* Item 4: bokeh's slider is a noUiSlider; a new ``start`` / ``end`` reaches it through
  ``updateOptions``, but noUiSlider's Home / End keys read the range it was created with (after a
  27-step run End went to "step: 2 of 27"). Every slider of the app gets
  `panel_controls.keys_within_range`; the tests press Home / End / PageUp / PageDown / arrows on the
  playback slider after a run, and check that every slider of the app has the treatment.

Same fixtures as `test_browser.py` (`conftest.py`): the random ``clover-test`` with the dev
option, 32 new tokens; seconds per decode.

Run: ``.venv/bin/python -m pytest tests/apps/test_browser_controls.py -q``
"""

from __future__ import annotations

import re
import time

import pytest
from helpers import BROWSER_TIMEOUT_MS as TIMEOUT_MS
from helpers import wait_for_empty_value

pytest.importorskip("panel")


def _ready(pg) -> None:
    pg.get_by_text("press Generate to decode a prompt").first.wait_for(timeout=TIMEOUT_MS)


def _set_max_new_tokens(pg, n: int) -> None:
    box = pg.get_by_label(re.compile(r"Max new tokens")).first
    box.fill(str(n))
    box.press("Enter")


def _generate(pg, state) -> None:
    """Click Generate and wait until this run (a new trace) is done and shown."""
    old = state.trace
    pg.get_by_role("button", name=re.compile("Generate")).first.click()
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while state.trace is old or state.running:
        assert time.monotonic() < deadline, state.status
        time.sleep(0.05)
    pg.locator('.clover-status[data-running="0"]', has_text=re.compile(r"^done")).first.wait_for(timeout=TIMEOUT_MS)


def _nfe(pg) -> int:
    return int(pg.locator(".clover-nfe").first.inner_text().strip())


def _wait_max_new_tokens(state, n: int) -> None:
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while state.max_new_tokens != n:
        assert time.monotonic() < deadline, state.max_new_tokens
        time.sleep(0.05)


# ----------------------------------------------------------------------------- item 3: file inputs
def test_opening_the_same_trace_again_loads_it_again(page, tmp_path):
    """Save a run, open it, Generate (another run replaces it), open the same file again: the page
    shows the file's run again (status "loaded trace", its NFE), and the file box is empty after
    each pick (so a real browser fires ``change`` for the same file next time)."""
    pg, sessions = page
    _ready(pg)
    state = sessions[-1]
    _generate(pg, state)  # 32 new tokens
    saved = tmp_path / "my-run.parquet"
    saved.write_bytes(state.trace_bytes().getvalue())
    file_nfe = len(state.trace)
    box = pg.locator("input[type=file]").first
    loaded = pg.locator('.clover-status[data-running="0"]',
                        has_text=re.compile(rf"^loaded trace my-run\.parquet: {file_nfe} steps")).first
    for attempt in range(2):
        box.set_input_files(str(saved))
        loaded.wait_for(timeout=TIMEOUT_MS)
        assert _nfe(pg) == file_nfe, attempt
        assert len(state.trace) == file_nfe
        if attempt == 0:
            # opening the trace took its budget (32); a larger one makes a run with another NFE
            _set_max_new_tokens(pg, 96)
            _wait_max_new_tokens(state, 96)
            _generate(pg, state)
            assert _nfe(pg) != file_nfe and state.trace.decode_config["max_new_tokens"] == 96
            assert not loaded.is_visible()
    # the file box forgets the pick: the status line names what is shown, and picking the same
    # file again is a change for a real browser (Playwright's set_input_files fires one anyway)
    wait_for_empty_value(pg, box)


def test_opening_the_same_bad_file_again_says_so_again(page, tmp_path):
    """An unreadable file picked, then a Generate (which clears the message), then the same file
    picked again: the refusal is shown again, not silently skipped."""
    pg, sessions = page
    _ready(pg)
    state = sessions[-1]
    junk = tmp_path / "not-a-trace.parquet"
    junk.write_bytes(b"this is not a trace")
    box = pg.locator("input[type=file]").first
    # the error pane (a notification toast with the same text may outlive it)
    refused = pg.locator(".alert", has_text=re.compile(r"Trace not loaded: 'not-a-trace\.parquet'")).first
    for attempt in range(2):
        box.set_input_files(str(junk))
        refused.wait_for(timeout=TIMEOUT_MS)
        assert state.error.startswith("Trace not loaded"), attempt
        if attempt == 0:
            # opening the trace took its budget (32); a larger one makes a run with another NFE
            _set_max_new_tokens(pg, 96)
            _wait_max_new_tokens(state, 96)
            _generate(pg, state)
            assert state.error == ""
            refused.wait_for(state="hidden", timeout=TIMEOUT_MS)
    wait_for_empty_value(pg, box)


def test_every_file_input_of_the_app_is_cleared_after_a_pick():
    """The class: each `FileInput` in the app's layout forgets its pick after the callback ran."""
    import panel as pn

    from clover_viz.panel_controls import clears_after_pick
    from clover_viz.panel_views import ExplorerApp
    from clover_viz.state import ExplorerState

    state = ExplorerState(model_dir="clover-test", max_new_tokens=8)
    try:
        app = ExplorerApp(state=state)
        inputs = app.__panel__().select(pn.widgets.FileInput)
        assert inputs, "the app has no file input any more: update this test"
        assert all(clears_after_pick(w) for w in inputs), [w for w in inputs if not clears_after_pick(w)]
    finally:
        state.close()


# ----------------------------------------------------------------------------- item 4: sliders
_HANDLES_JS = """() => {
  const out = [];
  const walk = (r) => {
    for (const el of r.querySelectorAll('*')) {
      if (el.classList && el.classList.contains('noUi-handle'))
        out.push([el.getAttribute('aria-valuemin'), el.getAttribute('aria-valuemax')]);
      if (el.shadowRoot) walk(el.shadowRoot);
    }
  };
  walk(document);
  return out;
}"""


def test_playback_slider_keys_stay_within_the_current_range(page):
    """After a run of n > 2 steps (the slider was created with the range 1..2): End goes to
    "step: n of n", Home to "step: 1 of n", PageUp / PageDown / arrows move within 1..n."""
    pg, sessions = page
    _ready(pg)
    state = sessions[-1]
    _set_max_new_tokens(pg, 64)
    _wait_max_new_tokens(state, 64)
    _generate(pg, state)
    n = len(state.trace)
    assert n > 7, n  # PageUp / PageDown move 5 steps: room for both
    label = pg.locator(".clover-scrub-label").first

    def shows(k: int) -> None:
        from playwright.sync_api import expect

        expect(label).to_have_text(f"step: {k} of {n}", timeout=TIMEOUT_MS)
        deadline = time.monotonic() + TIMEOUT_MS / 1000
        while state.position != k - 1:
            assert time.monotonic() < deadline, (state.position, k)
            time.sleep(0.05)

    shows(n)  # a finished run shows its last step
    # the playback slider: the one handle whose range is 1..n
    handles = pg.evaluate(_HANDLES_JS)
    idx = [i for i, (lo, hi) in enumerate(handles) if lo and hi and float(lo) == 1 and float(hi) == n]
    assert len(idx) == 1, handles
    handle = pg.locator(".noUi-handle").nth(idx[0])
    handle.focus()
    for key, k in (("Home", 1), ("ArrowRight", 2), ("PageUp", 7), ("End", n), ("ArrowRight", n),
                   ("PageUp", n), ("PageDown", n - 5), ("ArrowLeft", n - 6), ("Home", 1), ("ArrowLeft", 1),
                   ("PageDown", 1), ("End", n)):
        handle.press(key)
        shows(k)


def test_every_slider_of_the_app_answers_keys_within_its_current_range():
    """The class: each bokeh slider in the app's layout (the playback scrub, threshold, block size,
    speed, and the slider inside a discrete slider) carries `keys_within_range`, so a slider whose
    range changes later (today: the playback scrub, whose end is the run's step count) is covered
    whichever it is."""
    import panel as pn
    from panel.widgets.slider import _SliderBase

    from clover_viz.panel_controls import has_discrete_keys, has_keys_within_range
    from clover_viz.panel_views import ExplorerApp
    from clover_viz.state import ExplorerState

    state = ExplorerState(model_dir="clover-test", max_new_tokens=8)
    try:
        app = ExplorerApp(state=state)
        sliders = [w for w in app.__panel__().select(_SliderBase) if not isinstance(w, pn.widgets.CompositeWidget)]
        assert app.playback.scrub in sliders and len(sliders) >= 4, sliders
        assert all(has_keys_within_range(w) for w in sliders), [w.name for w in sliders
                                                                  if not has_keys_within_range(w)]
        discrete = app.__panel__().select(pn.widgets.DiscreteSlider)
        assert app.sidebar.block_size in discrete, discrete
        assert all(has_discrete_keys(w) for w in discrete), [w.label for w in discrete if not has_discrete_keys(w)]
    finally:
        state.close()


_BLOCK_HANDLE_JS = """(n) => {
  const out = [];
  const walk = (r) => {
    for (const el of r.querySelectorAll('*')) {
      if (el.classList && el.classList.contains('noUi-handle') && el.getAttribute('aria-valuemin') === '0.0'
          && Number(el.getAttribute('aria-valuemax')) === n - 1)
        out.push(el.getAttribute('aria-valuetext'));
      if (el.shadowRoot) walk(el.shadowRoot);
    }
  };
  walk(document);
  return out;
}"""


def test_block_size_keys_step_through_its_options_and_read_them_aloud(page):
    """The block-size control is a slider over option positions: PageUp / PageDown move one option, as
    the arrows do (PageDown jumped from 64 to 2: five positions), and its ``aria-valuetext`` is the block
    size ("64"), not the position ("6.00")."""
    from playwright.sync_api import expect

    from clover_viz.session_settings import BLOCK_SIZES

    pg, sessions = page
    _ready(pg)
    state = sessions[-1]
    sizes = [str(b) for b in BLOCK_SIZES]
    n = len(sizes)
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while pg.evaluate(_BLOCK_HANDLE_JS, n) != [str(state.block_size)]:  # armed once the page is drawn
        assert time.monotonic() < deadline, pg.evaluate(_BLOCK_HANDLE_JS, n)
        time.sleep(0.1)
    handles = pg.evaluate(_HANDLES_JS)
    idx = [i for i, (lo, hi) in enumerate(handles) if lo == "0.0" and hi and float(hi) == n - 1]
    assert len(idx) == 1, handles
    handle = pg.locator(".noUi-handle").nth(idx[0])
    handle.focus()
    for key, want in (("End", sizes[-1]), ("PageDown", sizes[-2]), ("PageDown", sizes[-3]), ("PageUp", sizes[-2]),
                      ("ArrowLeft", sizes[-3]), ("Home", sizes[0]), ("PageDown", sizes[0]), ("PageUp", sizes[1])):
        handle.press(key)
        expect(handle).to_have_attribute("aria-valuetext", want, timeout=TIMEOUT_MS)
        deadline = time.monotonic() + TIMEOUT_MS / 1000
        while str(state.block_size) != want:  # the release reached the server
            assert time.monotonic() < deadline, (key, want, state.block_size)
            time.sleep(0.05)
