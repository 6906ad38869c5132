"""The explorer without a browser: the app module imports without serving, and its
`ExplorerState` drives real decodes of the random ``clover-test`` model in a worker thread.

Run: ``.venv/bin/python -m pytest tests/apps/test_explorer_app.py -q``
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("panel")

from clover_viz.examples import EXAMPLE_PROMPTS  # noqa: E402
from clover_viz.models import (  # noqa: E402
    RANDOM_MODEL_LABEL,
    LoadedModel,
    ModelSpec,
    load_model_cached,
    resolve_model,
)
from clover_viz.state import ExplorerState  # noqa: E402
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30.0


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def run_to_end(state: ExplorerState, timeout: float = TIMEOUT_S) -> list[int]:
    """Tick like the app's periodic callback until the decode ends; returns n_steps seen per tick."""
    seen = []
    deadline = time.monotonic() + timeout
    while state.running:
        assert time.monotonic() < deadline, f"decode did not finish in {timeout} s: {state.status}"
        time.sleep(0.02)
        state.tick(0.02)
        seen.append(state.n_steps)
    return seen


@pytest.fixture
def state():
    s = ExplorerState(model_dir="clover-test", prompt="Hello, block diffusion", max_new_tokens=16, block_size=8)
    yield s
    s.close()
    s.wait(5)


def load_app_module():
    spec = importlib.util.spec_from_file_location("clover_explorer_app_test", ROOT / "apps" / "explorer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_app_module_imports_without_serving_and_builds_a_session():
    import panel as pn

    module = load_app_module()
    assert not pn.state.served
    tpl = module.create_app(model_dir="clover-test", start_callbacks=False, max_new_tokens=8)
    assert isinstance(tpl, pn.template.FastListTemplate)
    app = tpl.explorer
    assert app.state.model_label == "random clover-test"
    assert set(EXAMPLE_PROMPTS) == {"agent tool call", "long tool chain"}
    for name in ("agent tool call", "long tool chain"):  # the chat layout of the bundled model
        assert EXAMPLE_PROMPTS[name].startswith("<|im_start|>system\n")
        assert EXAMPLE_PROMPTS[name].endswith("<|im_start|>assistant\n")


def test_default_model_dir_falls_back_to_a_labelled_random_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no models/clover-tiny here...
    monkeypatch.setattr("clover_viz.models.REPO_ROOT", tmp_path)  # ...nor in the "repository"
    spec = resolve_model("models/clover-tiny")
    assert spec == ModelSpec("random", fallback=True)
    s = ExplorerState()
    assert s.load_model() is not None and s.model_label == RANDOM_MODEL_LABEL
    assert s.error == ""


def test_state_decodes_in_a_worker_and_streams_events(state):
    versions = []
    state.param.watch(lambda e: versions.append(e.new), "trace_version")
    assert state.generate()
    assert state.running and state.trace is not None and len(state.trace) == 0
    seen = run_to_end(state)
    trace = state.trace
    end = trace.decode_end
    assert end is not None and end.stop_reason == "max_new_tokens"
    assert len(trace.generated_tokens) == 16
    assert state.n_steps == len(trace) == end.nfe > 0
    assert state.position == state.n_steps - 1 and state.progress == 100
    assert versions and state.status.startswith("done")
    assert f"memory {trace.decode_config['memory_mode']}," in state.status  # the done line names the mode
    assert len(trace.block_starts) == len(trace.block_ends) >= 2
    # Events arrive through the queue as produced: the step count never goes back between ticks,
    # and the last tick shows every step.
    assert seen and seen == sorted(seen) and seen[-1] == state.n_steps
    # Same tokens as the decoder called directly with the same model and settings.
    loaded = state.loaded_model
    ref = BlockDecoder(loaded.model, loaded.tokenizer).generate(
        state.prompt, config=DecodeConfig(block_size=8, threshold=0.95, max_new_tokens=16, memory_mode=state.memory_mode),
        record_trace=False)
    assert trace.generated_tokens.tolist() == ref.tokens and end.nfe == ref.nfe
    # Block starts are copied at emit time: generation slots start as MASK.
    mask_id = loaded.config.mask_token_id
    for b in trace.block_starts:
        assert np.all(b.tokens[~b.prefilled] == mask_id)


def test_stop_cancels_promptly_and_keeps_what_was_written(state):
    state.max_new_tokens = 2000
    state.param.update(block_size=1)  # a new setting with no trace yet: no decode starts
    assert state.trace is None
    assert state.generate()
    deadline = time.monotonic() + TIMEOUT_S
    while state.n_steps < 5:
        assert time.monotonic() < deadline, state.status
        time.sleep(0.02)
        state.tick(0.02)
    t0 = time.monotonic()
    state.stop()
    assert state.wait(timeout=5.0), "the worker did not stop"
    stop_s = time.monotonic() - t0
    assert stop_s < 2.0, f"stop took {stop_s:.2f} s"
    trace = state.trace
    assert trace.decode_end.stop_reason == "cancelled"
    kept = trace.generated_tokens
    assert 5 <= len(kept) < 2000  # what was produced is kept (block size 1: one token per forward)
    assert len(kept) == trace.decode_end.nfe == state.n_steps
    # the worker (not paced here) ran on after the forwards drained at the Stop; the run keeps those
    # plus the forward in flight, no more (clover_viz.runs.kept_at_stop)
    assert state.n_steps <= state.stop_timing["nfe_shown"] + 1, (state.n_steps, state.stop_timing)
    assert state.status.startswith("stopped") and not state.running


def test_threshold_change_redecodes_and_keeps_the_previous_run():
    s = ExplorerState(model_dir="clover-test", dev_sharpen_random=True, prompt="Hello", max_new_tokens=32)
    try:
        assert s.generate()
        run_to_end(s)
        first = s.trace
        s.threshold = 0.5  # what the slider does on release
        assert s.running, "a threshold change re-decodes"
        run_to_end(s)
        assert s.previous is first and s.trace is not first
        cmp = s.comparison()
        assert cmp["previous"]["threshold"] == 0.95 and cmp["current"]["threshold"] == 0.5
        assert cmp["previous"]["nfe"] != cmp["current"]["nfe"]  # sharpened weights: the threshold matters
        s.block_size = 16
        run_to_end(s)
        assert s.previous.decode_config["block_size"] == 32 and s.trace.decode_config["block_size"] == 16
    finally:
        s.close()
        s.wait(5)


def test_a_new_generate_supersedes_a_running_one(state):
    state.max_new_tokens = 2000
    assert state.generate()
    state.tick()
    assert state.generate()  # e.g. a second slider release while the first decode runs
    state.max_new_tokens = 16
    assert state.generate()
    run_to_end(state)
    assert state.previous is None  # superseded partial runs are dropped, not compared
    assert state.trace.decode_end.stop_reason == "max_new_tokens" and len(state.trace.generated_tokens) == 16
    assert state.n_steps == len(state.trace)


def test_bad_input_shows_an_error_and_keeps_the_runs(state):
    assert state.generate()
    run_to_end(state)
    shown = state.trace
    state.prompt = "   "
    assert not state.generate()
    assert "prompt is empty" in state.error and state.trace is shown and not state.running
    state.prompt = "Hello"
    state.model_dir = "no/such/model"
    assert "no model directory" in state.error and state.error.endswith("Still decoding with random clover-test.")
    # the model before the failed load is kept, and the page names it again
    assert state.model_dir == "clover-test" and state.model_label == "random clover-test" and state.model_ok
    assert state.status.startswith("could not load model: back to random clover-test"), state.status
    assert state.trace is shown
    assert state.generate()
    run_to_end(state)
    assert state.previous is shown


def test_window_mode_needs_a_model_with_a_window():
    def loader(spec):
        base = load_model_cached(ModelSpec("random"))
        cfg = dataclasses.replace(base.model.config, attention_window=0)
        from clover_engine.backbones.clover.model import CloverModel

        torch.manual_seed(0)
        return LoadedModel(spec, CloverModel(cfg).eval(), base.tokenizer, "no-window test model")

    s = ExplorerState(loader=loader, model_dir="clover-test", memory_mode="state+window")
    assert s.load_model() is not None
    assert not s.window_available and s.memory_mode == "state"  # switched back
    s.memory_mode = "state+window"
    try:
        assert not s.generate() and "state+window" in s.error
    finally:
        s.close()
        s.wait(5)


def test_save_load_and_playback(state, tmp_path):
    with pytest.raises(ValueError, match="no run"):
        state.trace_bytes()
    assert state.generate()
    run_to_end(state)
    recorded = state.trace
    data = state.trace_bytes().getvalue()
    assert data[:4] == b"PAR1"

    other = ExplorerState(model_dir="no/model/needed")  # replay needs no model
    assert other.load_trace(data, name="run.parquet")
    assert other.n_steps == len(recorded) and other.position == 0 and other.error == ""
    assert other.trace.generated_tokens.tolist() == recorded.generated_tokens.tolist()
    assert other.block_size == 8  # the settings show the trace's
    assert not other.running  # loading a trace does not re-decode
    other.speed = 10.0
    other.play()
    other.tick(0.25)  # 10 steps/s x 0.25 s
    assert other.position == 2 and other.playing
    other.step(-1)
    assert other.position == 1 and not other.playing
    other.step(-10)
    assert other.position == 0
    other.seek(10_000)
    assert other.position == other.n_steps - 1
    other.play()  # from the end: restarts at 0
    assert other.position == 0
    for _ in range(200):
        other.tick(0.5)
    assert other.position == other.n_steps - 1 and not other.playing

    bad = tmp_path / "not-a-trace.parquet"
    bad.write_bytes(b"hello")
    assert not other.load_trace(bad) and "Trace not loaded" in other.error
    assert other.n_steps == len(recorded)  # the trace on display is kept


def test_close_cancels_and_refuses_new_work(state):
    state.max_new_tokens = 2000
    assert state.generate()
    state.close()
    assert state.wait(5.0)
    assert not state.generate()


def test_views_follow_the_state():
    from clover_viz import figures as F
    from clover_viz.panel_figures import FigureSnapshot
    from clover_viz.panel_views import ExplorerApp

    s = ExplorerState(model_dir="clover-test", prompt="Hi", max_new_tokens=12, block_size=4)
    try:
        app = ExplorerApp(state=s)
        assert "press Generate" in app.summary.numbers.object
        app.settings.generate.clicks += 1  # the Generate button
        assert s.running and not app.settings.stop.disabled
        run_to_end(s)
        # the run measured against its careful decode in the background: Stop stays on for that, then goes off
        assert app.settings.stop.disabled == (not s.measuring)
        assert s.wait_careful(120)
        s.tick(0.02)
        assert app.settings.stop.disabled and not s.measuring
        nfe = s.trace.nfe
        assert f'clover-nfe">{nfe}<' in app.summary.numbers.object
        fig = app.block._fig
        assert F.BLOCK_TRACE in [t.name for t in fig.data]
        # at every step the pane holds a copy equal to the figure built fresh from the trace there;
        # so does the confidence heatmap (rebuilt for a run, merged per block, cursor per step)
        app.tabs.tabs.active = 0
        for pos in [s.position, 0, 1, 2, nfe - 1, 3, 3, nfe // 2, 0]:
            s.seek(pos)
            app.tabs.refresh(force=True)
            assert app.block.pane.object.to_dict() == FigureSnapshot.of(F.block_figure(s.trace, pos)).to_dict()
            assert app.tabs.heatmap.object.to_dict() == FigureSnapshot.of(
                F.confidence_heatmap(s.trace, step=pos)).to_dict(), pos
        assert app.block._fig is fig  # not rebuilt per step
        assert "step 1/" in app.block.pane.object.layout["title"]["text"]
        assert app.playback.scrub.value == 1 and app.playback.scrub.end == nfe  # 1-based, as the block view's title
        assert app.playback.scrub_text.object == f"step: 1 of {nfe}"
        app.playback.scrub.value = 3
        assert s.position == 2 and app.playback.scrub_text.object == f"step: 3 of {nfe}"
        for tab in range(len(app.tabs.TABS)):
            app.tabs.tabs.active = tab
            app.tabs.refresh(force=True)
        assert "projected" in app.tabs.cost.headline.object
        s.prompt = ""
        app.settings.generate.clicks += 1
        assert app.summary.error.visible and "prompt is empty" in app.summary.error.object
    finally:
        s.close()
        s.wait(5)


def test_sliders_set_the_state_on_release_only():
    import param

    from clover_viz.panel_settings import SettingsPanel

    s = ExplorerState(model_dir="clover-test", auto_redecode=False)
    panel = SettingsPanel(state=s)
    panel.threshold.value = 0.7  # dragging
    panel.block_size.value = 8
    assert (s.threshold, s.block_size) == (0.95, 32)
    with param.edit_constant(panel.threshold), param.edit_constant(panel.block_size):
        panel.threshold.value_throttled = 0.7  # released
        panel.block_size.value_throttled = 8
    assert (s.threshold, s.block_size) == (0.7, 8)


def test_text_diff_marks_insertions_and_deletions():
    """The comparison's text diff (one function for both front ends: `figures.compare_runs`)."""
    import re

    from clover_viz import figures as F

    diff = F.compare_runs({"text": "abcdef"}, {"text": "abXdef"})["text"]["diff_html"]
    assert re.search(r">ab<del[^>]*>c</del><ins[^>]*>X</ins>def<", diff), diff


def test_issue15_small_items_in_the_views(tmp_path):
    """Issue 15, item 11, without a browser: the max-new-tokens range is said, not reverted
    silently; Save before a run is disabled and logs nothing; a garbage trace names the file
    and the Open button; the status counts blocks from 0 as the figures do; the threshold
    slider formats two decimals."""
    import logging

    from clover_viz.panel_views import ExplorerApp

    s = ExplorerState(model_dir="clover-test", prompt="Hello, block diffusion", max_new_tokens=24, block_size=8)
    try:
        app = ExplorerApp(state=s)
        box = app.settings.max_new_tokens
        assert "1-2048" in box.label
        for bad in (0, 100000, -5):
            box.value = bad
            assert s.max_new_tokens == 24 and box.value == 24
            assert "from 1 to 2048" in s.error and str(bad) in s.error
        box.value = 40
        assert s.max_new_tokens == 40 and s.error == ""
        assert app.settings.threshold.format is not None  # "1.00", not "1"
        # Save before any run: disabled; a click anyway logs no traceback and says why
        assert app.settings.save.disabled
        records: list = []
        handler = logging.Handler(level=logging.WARNING)
        handler.emit = records.append
        logging.getLogger().addHandler(handler)
        try:
            app.settings.save._clicks += 1
        finally:
            logging.getLogger().removeHandler(handler)
        assert not records, [r.getMessage() for r in records]
        assert "Nothing saved" in s.error
        # a garbage file from the Open button
        app.settings.open.filename = "my-run.parquet"
        app.settings.open.value = b"not a trace at all"
        assert "'my-run.parquet'" in s.error and "Open button" in s.error
        assert "/tmp" not in s.error and "trace.bin" not in s.error and "Trace.save" not in s.error
        # the status names the block as the figures do (0-based)
        statuses = []
        assert s.generate()
        while s.running:
            time.sleep(0.02)
            s.tick(0.02)
            if s.running and s.status.startswith("decoding: block") and len(s.trace):
                statuses.append((s.status, s.trace.step(-1).block_index))
        assert statuses
        for status, block in statuses:
            assert status.startswith(f"decoding: block {block},"), (status, block)
        assert not app.settings.save.disabled
    finally:
        s.close()
        s.wait(5)


def test_bundled_models_resolve_by_name():
    """The model field takes a bundled model's name as well as its directory."""
    for name in ("clover-tiny", "smollm2-bd"):
        spec = resolve_model(name)
        assert spec.kind == "checkpoint" and spec.path == str((ROOT / "models" / name).resolve())
    with pytest.raises(ValueError, match="no model directory"):
        resolve_model("no-such-model")


def test_bundled_models_are_one_click_away():
    """The sidebar lists the models shipped in models/ (default first); a click loads one by
    path, and typing another directory clears the selection."""
    from clover_viz.models import bundled_models
    from clover_viz.panel_settings import SettingsPanel

    names = bundled_models()
    assert names[0] == "clover-tiny" and "smollm2-bd" in names
    loaded_specs = []

    def loader(spec):
        loaded_specs.append(spec)
        return load_model_cached(resolve_model("clover-test"))

    s = ExplorerState(loader=loader, model_dir="models/clover-tiny")
    panel = SettingsPanel(state=s)
    assert panel.bundled.options == names and panel.bundled.value == "clover-tiny"
    panel.bundled.value = "smollm2-bd"
    assert s.model_dir == "models/smollm2-bd" and Path(loaded_specs[-1].path).name == "smollm2-bd"
    s.model_dir = "clover-test"
    assert panel.bundled.value is None


def test_a_block_past_the_adapters_training_is_noted_in_the_done_line():
    """An adapter directory names its largest trained block (32 for smollm2-bd): a run at a larger
    block_size says so in the done line (the CLI prints the same note); within it, nothing."""
    from clover_viz.runs import past_training_note

    assert past_training_note(64, 32) == " · block 64 is past the model's training (blocks <= 32): expect worse text"
    assert past_training_note(32, 32) == "" and past_training_note(64, None) == ""
    import dataclasses

    from clover_engine.backbones.clover.model import CloverModel

    class Trained32(CloverModel):  # clover-test declaring what smollm2-bd declares: blocks <= 32
        @property
        def capabilities(self):
            return super().capabilities.replace(largest_trained_block=32)

    base = load_model_cached(resolve_model("clover-test"))
    model = Trained32(base.model.config)
    model.load_state_dict(base.model.state_dict())
    s = ExplorerState(loader=lambda spec: dataclasses.replace(base, model=model.eval()),
                      model_dir="models/smollm2-bd", prompt="Hi", max_new_tokens=4, block_size=64)
    try:
        for block, noted in ((64, True), (32, False)):
            s.block_size = block
            assert s.generate()
            assert s.wait(60) and s.status.startswith("done")
            assert ("past the model's training (blocks <= 32)" in s.status) is noted, s.status
    finally:
        s.close()
        s.wait(5)


def test_cost_tab_measures_the_break_even_here():
    """The Cost tab's 'Measure break-even here' times the loaded model on this machine at the run's
    block_size and says what the run's tokens per forward are worth against AR decoding."""
    from clover_viz.panel_views import ExplorerApp

    s = ExplorerState(model_dir="clover-test", prompt="Hi", max_new_tokens=12, block_size=8)
    try:
        app = ExplorerApp(state=s)
        cost = app.tabs.cost
        cost.refresh()
        assert "not measured" in cost.break_even.object
        app.settings.generate.clicks += 1
        assert s.measure_break_even() is None and "a decode is running" in s.error  # refused mid-run
        run_to_end(s)
        status = s.status
        cost.measure.clicks += 1  # the button
        assert s.error == "" and s.status == status  # the refusal is cleared, the run's status line kept
        p = s.break_even_point()
        assert p is not None and p.block_size == 8 and p.t_ar_s > 0 and p.t_block_s > 0
        html = cost.break_even.object
        tpf = s.trace.summary()["tokens_per_forward"]
        assert f"block 8 needs <b>{p.tokens_per_forward:.2f}</b>" in html
        assert f"wrote {tpf:.2f} tokens per forward: <b>{p.speedup(tpf):.2f}x</b>" in html
        own = s.trace.model_id
        s.trace.model_id = "another-model"  # e.g. a trace opened from a file: its run is not priced on this model
        assert "this run wrote" not in s.break_even_html() and "needs <b>" in s.break_even_html()
        s.trace.model_id = own
        s.block_size = 4  # another block size: not measured yet (once the new run is displayed)
        run_to_end(s)
        assert s.break_even_point() is None
        assert "not measured" in s.break_even_html()
    finally:
        s.close()
        s.wait(5)


def test_a_script_may_exit_with_a_decode_still_running():
    """A script that closes a session (or just ends) while a decode runs exits cleanly: the running
    forward finishes and the worker stops, instead of the process aborting inside a torch op."""
    import subprocess
    import sys

    script = (
        "import time\n"
        "from clover_viz.state import ExplorerState\n"
        "s = ExplorerState(model_dir='clover-test', prompt='Hello there', max_new_tokens=2000, block_size=1)\n"
        "s.generate()\n"
        "time.sleep(0.5)\n"
        "assert s.running\n"
        "s.close()\n"  # no wait(): the interpreter exits with the worker mid-decode
    )
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-1500:]
    assert "terminate called" not in p.stderr


def test_memory_note_gives_the_models_measured_best_mode():
    """The sidebar's memory note says which mode the loaded model does best in and the numbers
    behind it (its eval.json), and `state` stays one click away."""
    from clover_viz.panel_views import ExplorerApp

    s = ExplorerState(model_dir="models/clover-tiny")
    try:
        app = ExplorerApp(state=s)
        assert s.load_model() is not None
        assert s.memory_advice.startswith("`state+window` is the best measured mode of clover-tiny")
        note = app.settings.memory_note.object
        assert "29%" in note and "4% in state" in note and "Clover's own" in note
        assert not app.settings.memory_mode.disabled and "state" in app.settings.memory_mode.options
    finally:
        s.close()


def test_a_stopped_run_says_what_it_kept_and_the_text_shows_only_that():
    """Issue 35, item 8: after Stop the page said 'kept 16 tokens' while the text showed tokens
    past the masked gap and forced fills read 35. A stopped run keeps its last block's slots only up
    to the first still-masked one: the done line counts the dropped slots (and their forced fills),
    the text strikes exactly those through, and the kept tokens plus the dropped slots account for
    every slot written."""
    import re
    import time

    from clover_viz import figures as F
    from clover_viz.runs import dropped_at_stop, run_stats

    s = ExplorerState(model_dir="clover-test", dev_sharpen_random=True, max_new_tokens=2048, block_size=32)
    s.load_model()
    s.prompt = "Hello"
    try:
        for _attempt in range(5):  # stop mid-block: a stop between blocks drops nothing (retried)
            assert s.generate()
            time.sleep(0.4)
            s.drain()
            s.stop()
            assert s.wait(30)
            gone = dropped_at_stop(s.trace)
            if gone and gone["n_dropped"]:
                break
        assert gone and gone["n_dropped"] > 0, "no stop landed mid-block in 5 tries"
        st = run_stats(s.trace)
        assert s.status.startswith(f"stopped: kept {st['n_tokens']} tokens"), s.status
        slots = "1 slot" if gone["n_dropped"] == 1 else f"{gone['n_dropped']} slots"
        assert f"{slots} of block {gone['block']} written after a still-masked slot" in s.status
        html = F.text_html(s.trace, len(s.trace) - 1, show_prompt=False)
        assert html.count('class="clover-dropped"') == gone["n_dropped"]
        shown_kept = html.count("border-radius:2px")  # a kept token's span
        assert shown_kept == st["n_tokens"], (shown_kept, st["n_tokens"])
        # every slot written is either kept or dropped (clover-test writes no EOS at x15)
        written = sum(int(ev.n_written) for ev in s.trace.steps)
        assert written == st["n_tokens"] + gone["n_dropped"] or "clover-end" in html
        assert not re.search(r"clover-dropped", F.text_html(s.trace, len(s.trace) - 2, show_prompt=False))
    finally:
        s.close()
        s.wait(5)


def test_control_help_names_no_internal_identifiers():
    """Issue 35, item 8: the example picker's help showed the internal name YOUR_PROMPT. Every control's
    help text (its tooltip, from the state's parameter docs) reads as prose: no ALL_CAPS constants,
    no module paths, no backticks."""
    import re

    import panel as pn

    from clover_viz.panel_views import ExplorerApp

    s = ExplorerState(model_dir="clover-test")
    app = ExplorerApp(state=s)
    internal = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b|\b(clover_engine|clover_viz)\.\w|`")
    seen = 0
    for view in (app.settings, app.playback, app.tabs.cost):
        for name, widget in vars(view).items():
            help_text = getattr(widget, "description", None) if isinstance(widget, pn.widgets.Widget) else None
            if help_text:
                seen += 1
                assert not internal.search(help_text), (type(view).__name__, name, help_text)
    assert seen >= 8
    assert "'(your prompt)'" in app.settings.example.description


def test_the_model_picker_says_what_each_bundled_model_is_for():
    """Each bundled model's one-line purpose comes from its card (``**Purpose:**``) and is listed under the
    buttons, so a newcomer can tell which model answers a plain question."""
    from clover_viz.models import bundled_models, bundled_purpose
    from clover_viz.panel_settings import SettingsPanel

    names = bundled_models()
    assert names and all(bundled_purpose(n) for n in names), {n: bundled_purpose(n) for n in names}
    assert "verify" in bundled_purpose("smollm2-drafter") and "plain question" in bundled_purpose("smollm2-drafter")
    panel = SettingsPanel(state=ExplorerState(model_dir="clover-test", auto_redecode=False))
    for n in names:
        assert f"<b>{n}</b>: " in panel.purposes.object
    assert bundled_purpose("no-such-model") == ""


def test_one_saved_trace_shows_the_same_summary_in_the_app_and_the_notebook(tmp_path):
    """The run summary is one component (`clover_viz.runs.summary_cards_html`): a trace saved from a decode and
    opened in the Panel app's session and in the notebook `Explorer` shows the same values in every card."""
    import re

    from clover_viz.panel_views import RunSummary
    from clover_viz.widgets import Explorer

    s = ExplorerState(model_dir="clover-test", dev_sharpen_random=True, max_new_tokens=24, block_size=8,
                      memory_mode="state", auto_redecode=False)
    try:
        assert s.generate() and s.wait(60)
        s.tick(0.02)
        path = s.trace.save(tmp_path / "run.parquet")
    finally:
        s.close()
        s.wait(5)

    def values(fragment: str) -> dict[str, str]:
        return dict(re.findall(r'<div class="val (clover-[a-z]+)">([^<]*)</div>', fragment))

    app_state = ExplorerState(model_dir="clover-test", auto_redecode=False)
    try:
        summary = RunSummary(state=app_state)
        assert app_state.load_trace(path), app_state.error
        summary._refresh()
        in_app = values(summary.numbers.object)
    finally:
        app_state.close()
    ex = Explorer(str(path))
    try:
        in_notebook = values(ex.summary.value)
    finally:
        ex.close()
    expected = {"clover-nfe", "clover-tokens", "clover-tpf", "clover-forced", "clover-tps", "clover-bytes",
                "clover-stop", "clover-settings", "clover-model", "clover-careful"}
    assert set(in_app) == expected and in_app == in_notebook, (in_app, in_notebook)
    assert in_app["clover-careful"] != "measuring…"  # saved while its careful decode ran: a replay is not measuring
    assert in_app["clover-settings"] == "8 · 0.95" and in_app["clover-stop"] != "running"


def test_a_failed_decode_ends_the_decoding_status(state, monkeypatch):
    """A decode that fails in its worker: the error says why, and the status line stops reading "decoding with
    ..." (it once kept saying so for as long as the page was open)."""
    from clover_engine.decoding.decoder import BlockDecoder

    state.tick(0.02)
    shown = state.trace

    def fails(self, *args, **kwargs):
        raise ValueError("the model refused this decode")

    monkeypatch.setattr(BlockDecoder, "generate", fails)
    assert state.generate()
    assert state.wait(60)
    for _ in range(3):
        state.tick(0.02)
    assert not state.running
    assert state.error.startswith("Decoding failed: ValueError: the model refused this decode"), state.error
    assert state.status == "decoding failed (ValueError): see the error (the run on display is unchanged)", state.status
    assert state.trace is shown


def test_a_refused_model_name_says_kept_only_when_a_model_is_loaded(state):
    """The refusal of a model name ends "Kept <model>." while a model is loaded; a failed load keeps the model
    before it; after a first load that failed there is none to keep, and the message says so instead of naming the name that did not load."""
    assert state.load_model() is not None and state.model_ok
    assert state.setting_problem("model_dir", "no/such/model").endswith("Kept clover-test.")
    state.model_dir = "no/such/model"  # fails: the model before it is kept, and the refusal still says so
    assert state.model_ok and state.setting_problem("model_dir", "no/such/model").endswith("Kept clover-test.")
    fresh = ExplorerState(model_dir="no/such/model")  # a first load that failed: no model before it
    try:
        assert fresh.load_model() is None and not fresh.model_ok
        msg = fresh.setting_problem("model_dir", "./no-such-folder")
    finally:
        fresh.close()
    assert msg.startswith("Model not loaded:") and "Kept" not in msg and msg.endswith(
        "No model is loaded: pick a bundled model, or name a folder or hub id this server lists."), msg
