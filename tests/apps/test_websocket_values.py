"""Every value the server receives for a control is checked again on the server (issue 52, item 4).

Values are sent the way a websocket message delivers them: a property change of the control's
Bokeh model applied to the session's document as the client's patch (``doc.apply_json_patch``:
Panel hands it to the widget as it does for a served page), and set on the Panel widget on the
server side. Out-of-range values get the page's message (the state's `error`: the alert and the
notification), the control returns to the value in use, the next decode uses valid settings, and
nothing reaches the log.

Run: ``.venv/bin/python -m pytest tests/apps/test_websocket_values.py -q``
"""

from __future__ import annotations

import importlib.util
import logging
import time
from pathlib import Path

import param
import pytest

pytest.importorskip("panel")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _app_module():
    spec = importlib.util.spec_from_file_location("clover_explorer_app_ws", ROOT / "apps" / "explorer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Page:
    """One session's app drawn into a Bokeh document, and a client's patches to it."""

    def __init__(self, **settings) -> None:
        from bokeh.document import Document

        self.module = _app_module()
        settings = dict(model_dir="clover-test", start_callbacks=False, max_new_tokens=8, block_size=8,
                        prompt="Hello, block diffusion", **settings)
        self.app = self.module.create_app(**settings).explorer
        self.state = self.app.state
        self.doc = Document()
        self.layout = self.app.__panel__()  # sidebar and main: every control
        self.root = self.layout.get_root(self.doc)
        self.doc.add_root(self.root)

    def model(self, widget):
        if self.root.ref["id"] not in widget._models:  # not drawn yet (a tab not opened): drawn on its own
            self.doc.add_root(widget.get_root(self.doc))
            return next(iter(widget._models.values()))[0]
        return widget._models[self.root.ref["id"]][0]

    def send(self, widget, **props) -> None:
        """What a websocket message does: the client's new property values, applied to the document."""
        model = self.model(widget)
        events = [{"kind": "ModelChanged", "model": {"id": model.id}, "attr": k, "new": v} for k, v in props.items()]
        self.doc.apply_json_patch({"events": events}, setter="a client")

    def decode(self, timeout: float = 30.0):
        assert self.state.generate(), self.state.error
        deadline = time.monotonic() + timeout
        while self.state.running:
            assert time.monotonic() < deadline, self.state.status
            time.sleep(0.02)
            self.state.tick(0.02)
        return self.state.trace.decode_config

    def close(self) -> None:
        self.state.close()
        self.state.wait(5)


@pytest.fixture
def page(caplog):
    caplog.set_level(logging.WARNING)
    p = Page()
    yield p
    p.close()
    failed = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not failed, [r.getMessage() for r in failed]  # nothing unhandled reached the log


def _shown_error(page) -> str:
    alert = page.app.summary.error
    assert alert.visible
    return alert.object


@pytest.mark.parametrize("bad", [5, -1, 0.2])
def test_an_out_of_range_threshold_is_refused_and_the_slider_shows_the_value_in_use(page, bad):
    lo, _ = page.state.param.threshold.bounds
    assert bad < lo or bad > 1.0  # 0.2 is below the slider's lower bound
    slider = page.app.settings.threshold
    page.send(slider, value=bad, value_throttled=bad)
    message = f"Threshold must be a number from 0.5 to 1; got {bad}. Kept 0.95."
    assert page.state.error == message and message in _shown_error(page)
    assert slider.value == slider.value_throttled == page.state.threshold == 0.95
    assert page.model(slider).value == 0.95  # the page's slider is set back
    assert not page.state.running  # nothing decoded
    assert page.decode()["threshold"] == 0.95
    page.send(slider, value=0.8, value_throttled=0.8)  # a good value is taken, and clears the message
    assert page.state.threshold == 0.8 and page.state.error == ""


@pytest.mark.parametrize("position", [99, -3])
def test_a_block_size_position_outside_the_slider_is_refused(page, position):
    inner = page.app.settings.block_size._slider  # the slider Panel draws: the page sends its position
    page.send(inner, value=position, value_throttled=position)
    assert page.state.error == ("Block size must be one of 1, 2, 4, 8, 16, 32, 64; got slider position "
                                f"{position} (positions 0-6). Kept 8.")
    assert page.app.settings.block_size.value == page.state.block_size == 8
    assert page.model(inner).value == 3  # position of 8
    assert not page.state.running  # -3 used to pick block size 16 and start a decode
    assert page.decode()["block_size"] == 8


@pytest.mark.parametrize("bad", [0, -7, 10**12])
def test_max_new_tokens_out_of_range_gets_the_typed_values_message(page, bad):
    box = page.app.settings.max_new_tokens
    page.send(box, value=bad)
    message = f"Max new tokens must be a whole number from 1 to 2048; got {bad}. Kept 8."
    assert page.state.error == message and message in _shown_error(page)
    assert box.value == page.state.max_new_tokens == 8 and page.model(box).value == 8
    assert page.decode()["max_new_tokens"] == 8


def test_an_unknown_policy_is_refused(page):
    picker = page.app.settings.policy
    page.send(picker, value="greedy-ish")
    assert page.state.error.startswith("Policy must be one of low_confidence, ")
    assert page.state.error.endswith("; got 'greedy-ish'. Kept low_confidence.")
    assert picker.value == page.state.policy == "low_confidence" and page.model(picker).value == "low_confidence"
    assert page.decode()["policy"] == "low_confidence"


@pytest.mark.parametrize("name", ["no/such/model", "/etc", "../../.."])
def test_a_model_outside_the_servers_roots_is_refused_and_the_model_in_use_stays(page, name):
    box = page.app.settings.model_dir
    page.send(box, value=name)
    assert page.state.error.startswith("Model not loaded: this server loads models only from its model folders")
    assert page.state.error.endswith("Kept clover-test.")
    assert box.value == page.state.model_dir == "clover-test" and page.model(box).value == "clover-test"
    assert page.state.model_ok and page.state.model_label == "random clover-test"
    assert page.decode()  # with the model in use


def test_every_other_control_refuses_what_it_does_not_offer(page):
    s, ui = page.state, page.app.settings
    cases = [
        (ui.memory_mode, dict(active=7), "Memory mode must be one of state, state+window; got option 7"),
        (ui.memory_mode, dict(active=-1), "Memory mode must be one of state, state+window; got option -1"),
        (ui.example, dict(value="not an example"), "Example prompt must be one of "),
        (ui.repetition_penalty, dict(value=500.0), "Repetition penalty must be a number from 0.1 to 20; got 500.0"),
        (ui.eos_limit, dict(value=-2), "EOS soft limit must be a whole number from 0 to 4096; got -2"),
        (ui.prompt, dict(value="x" * 2_000_001), "Prompt must be text of at most 2,000,000 characters; got "
                                                 "2,000,001 characters. Kept 'Hello, block diffusion'."),
        (ui.bundled, dict(active=99), "Bundled models must be one of "),
        (page.app.playback.speed, dict(value=1e6), "Playback speed must be a number from 0.5 to 60"),
        (page.app.playback.scrub, dict(value=99), "Playback step must be from 1 to 2; got 99. Kept 1."),
        (page.app.tabs.cost.device, dict(value="abacus"), "Project onto device must be one of "),
        (page.app.tabs.cost.union, dict(value="guess"), "35B-A3B expert union must be one of "),
        (page.app.tabs.tabs, dict(active=9), "Figure tab must be one of 0-3"),
        (page.app.slot.new_threshold, dict(value=3.0), "Threshold must be a number from 0.5 to 1; got 3.0"),
        (page.app.slot.new_block, dict(value="99"), "Block size must be one of 1, 2, 4, 8, 16, 32, 64; got '99'"),
        (page.app.branches.compare_a, dict(value="#42"), "Compare must be one of "),
    ]
    before = {k: getattr(s, k) for k in ("memory_mode", "example", "prompt", "repetition_penalty", "eos_soft_limit",
                                         "speed", "device", "union_assumption", "model_dir", "position")}
    for widget, props, message in cases:
        s.error = ""
        shown = {k: getattr(widget, "value" if k != "active" or "options" in widget.param else "active")
                 for k in props}
        page.send(widget, **props)
        assert message in s.error, (type(widget).__name__, props, s.error)
        now = {k: getattr(widget, "value" if k != "active" or "options" in widget.param else "active") for k in props}
        assert now == shown, (type(widget).__name__, props)  # the control holds the value in use
    assert {k: getattr(s, k) for k in before} == before
    assert not s.running


def test_values_set_on_the_widgets_on_the_server_side_are_checked_too(page):
    s, ui = page.state, page.app.settings
    ui.threshold.value = 5  # dragged, not released: refused all the same
    assert ui.threshold.value == 0.95 and "Threshold must be a number" in s.error
    with param.edit_constant(ui.threshold):
        ui.threshold.value_throttled = -1
    assert (ui.threshold.value, ui.threshold.value_throttled, s.threshold) == (0.95, 0.95, 0.95)
    assert s.error == "Threshold must be a number from 0.5 to 1; got -1. Kept 0.95."
    ui.block_size.value = 99  # Panel's DiscreteSlider took its first option (1) for a value it lacks
    assert ui.block_size.value == s.block_size == 8 and "got 99. Kept 8." in s.error
    with param.edit_constant(ui.block_size):
        ui.block_size.value_throttled = 3
    assert ui.block_size.value == s.block_size == 8 and "got 3. Kept 8." in s.error
    ui.max_new_tokens.value = 0
    assert ui.max_new_tokens.value == s.max_new_tokens == 8 and "got 0. Kept 8." in s.error
    ui.policy.value = "bogus"
    assert ui.policy.value == s.policy == "low_confidence" and "got 'bogus'" in s.error
    ui.model_dir.value = "/etc"
    assert ui.model_dir.value == s.model_dir == "clover-test" and s.model_ok and "model folders" in s.error
    assert not s.running
    dc = page.decode()
    assert (dc["threshold"], dc["block_size"], dc["max_new_tokens"], dc["policy"]) == (0.95, 8, 8, "low_confidence")
    ui.max_new_tokens.value = 16  # a good value: taken, and the refusal on show goes
    assert s.max_new_tokens == 16 and s.error == ""


def test_good_values_from_the_page_still_set_the_state_and_redecode(page):
    page.decode()
    first = page.state.trace
    page.send(page.app.settings.block_size._slider, value=2, value_throttled=2)
    assert page.state.block_size == 4 and page.state.running  # a new position re-decodes, as before
    page.state.wait(30)
    assert page.state.trace is not first and page.state.trace.decode_config["block_size"] == 4
    page.send(page.app.settings.memory_mode, active=0)
    assert page.state.memory_mode == "state"
    page.send(page.app.settings.max_new_tokens, value=24)
    assert page.state.max_new_tokens == 24 and page.state.error == ""


def test_the_stops_count_of_forwards_shown_is_checked_and_cuts_the_run_there(page):
    """The page's Stop sends "N:time" (N: forwards the page had drawn). Anything else is ignored; N is
    never taken above what the server drew; the stopped run keeps N forwards plus the one in flight --
    cut back when the server (and the decode) had gone further."""
    s, box = page.state, page.app.settings.stop_shown
    page.send(box, value="not a count")  # nothing running, not a count: ignored
    assert not s.running and s.error == "" and s.trace is None
    s.max_new_tokens, s.block_size = 2048, 1
    assert s.generate()
    deadline = time.monotonic() + 30
    while s.n_steps < 8:  # drawn on the server: 8 forwards and more
        assert time.monotonic() < deadline, s.status
        time.sleep(0.02)
        s.tick(0.02)
    page.send(box, value="3:1733450000000")  # the page had drawn only 3 of them
    assert s.wait(30)
    end = s.trace.decode_end
    assert end.stop_reason == "cancelled" and end.nfe == len(s.trace) == s.n_steps == 4, (end, len(s.trace))
    assert len(end.tokens) == 4 and s.position == 3  # block size 1: one token a forward, the last one shown
    assert s.stop_timing["nfe_shown"] == 3 and s.stop_timing["forwards_dropped"] > 0
    assert "later forwards not kept" in s.status, s.status
    assert s.generate()
    while s.n_steps < 5:
        assert time.monotonic() < deadline + 30, s.status
        time.sleep(0.02)
        s.tick(0.02)
    drawn = s.n_steps
    page.send(box, value="99999:1733450000001")  # more than the server drew: taken as what it drew
    assert s.wait(30) and s.stop_timing["nfe_shown"] == drawn and s.trace.decode_end.nfe <= drawn + 1


def test_a_model_name_the_server_resolves_is_taken():
    p = Page()
    try:
        p.send(p.app.settings.model_dir, value="clover-tiny")  # a bundled model, inside the roots
        assert p.state.model_dir == "clover-tiny" and not p.state.error.startswith("Model not loaded")
    finally:
        p.close()
