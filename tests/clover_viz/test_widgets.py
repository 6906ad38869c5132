"""clover_viz.widgets.Explorer: built from a trace or a model, figures mutated in place, no stacked callbacks.

Run: .venv/bin/python -m pytest tests/clover_viz/test_widgets.py -q
"""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")  # plotly >= 6 FigureWidget

from clover_viz import figures as F  # noqa: E402
from clover_viz import widget_bundle, widget_decoding  # noqa: E402
from clover_viz.widgets import Explorer  # noqa: E402
from clover_engine.recording.trace import Trace  # noqa: E402


def n_observers(widget, name="value") -> int:
    return len(widget._trait_notifiers.get(name, {}).get("change", []))


def test_explorer_from_a_trace_steps_in_place(trace):
    ex = Explorer(trace)
    assert ex.show() is ex.show()  # the same tree on every call
    assert ex.step_slider.min == 1 and ex.step_slider.max == len(trace) == ex.play.max  # counts like the titles
    assert ex.threshold.disabled and ex.block_size.disabled  # no model: settings show the recorded run
    assert ex.threshold.continuous_update is False and ex.block_size.value == trace.decode_config["block_size"]
    figs = dict(ex.figures)
    assert all(isinstance(f, go.FigureWidget) for f in figs.values())
    block = ex.block_fig
    for i in (0, 4, 9, len(trace) - 1):
        ex.step_slider.value = i + 1  # "step i+1 of n" shows the state after forward i+1
        assert ex.block_fig is block
        fresh = F.block_figure(trace, i)
        assert f"step {i + 1}/{len(trace)}" in ex.block_fig.layout.title.text
        assert ex.block_fig.data[0].z == fresh.data[0].z
        assert ex.block_fig.data[0].customdata == fresh.data[0].customdata
        assert F.text_html(trace, i) == ex.text.value
        assert ex.cum_fig.layout.shapes[-1].x0 == i + 1
    assert dict(ex.figures) == figs  # no figure object was replaced
    ex.close()


def test_play_is_linked_and_callbacks_do_not_stack(trace):
    ex = Explorer(trace)
    assert ex._link.source == (ex.play, "value") and ex._link.target == (ex.step_slider, "value")
    before = n_observers(ex.step_slider), n_observers(ex.threshold), n_observers(ex.block_size)
    for _ in range(3):
        ex.show()
    assert (n_observers(ex.step_slider), n_observers(ex.threshold), n_observers(ex.block_size)) == before
    assert before[0] == 1
    ex.speed.value = 20
    assert ex.play.interval == 50
    with pytest.raises(ValueError, match="replays a recorded trace"):
        ex.decode("hello")
    ex.close()


def test_explorer_from_a_trace_file(tmp_path, trace):
    path = trace.save(tmp_path / "run.parquet")
    ex = Explorer(str(path))
    assert len(ex.trace) == len(trace)
    with pytest.raises(TypeError, match="Explorer takes"):
        Explorer(42)
    ex.close()


def test_explorer_takes_model_and_trace_by_keyword(tmp_path, trace):
    """``Explorer(model="...")`` as the app's and the CLI's ``--model`` names it (a TypeError once), and
    ``Explorer(trace=...)``; two sources at once are refused, naming both."""
    ex = Explorer(model="clover-tiny")
    assert ex.state.loaded_model.model_id.endswith("clover-tiny") and ex.config is not None
    ex.close()
    ex = Explorer(trace=str(trace.save(tmp_path / "run.parquet")))
    assert len(ex.trace) == len(trace)
    ex.close()
    with pytest.raises(TypeError, match="Explorer takes one model or trace; got model and trace"):
        Explorer(model="clover-tiny", trace=trace)
    with pytest.raises(TypeError, match="got model_or_trace and model"):
        Explorer("clover-tiny", model="clover-tiny")


def test_decode_streams_into_the_same_figures_and_redecode_compares(monkeypatch):
    from record_trace import loud_clover_test  # tests/clover_viz/record_trace.py

    from clover_engine.decoding.decoder import DecodeConfig
    from clover_engine.tokenizer import byte_tokenizer

    monkeypatch.setattr(widget_decoding, "_LIVE_MIN_INTERVAL_S", 0.0)  # draw on every event
    ex = Explorer(loud_clover_test(), byte_tokenizer(), DecodeConfig(block_size=4, threshold=0.4, max_new_tokens=4))
    assert not ex.threshold.disabled
    drawn = []
    real = ex.show_step
    monkeypatch.setattr(ex, "show_step", lambda s: (drawn.append((len(ex.trace), s)), real(s)))
    block = ex.block_fig
    # placeholders hold only a title: the widget front end would keep an annotation the real figure lacks
    assert not block.layout.annotations and block.layout.xaxis.visible is None
    first = ex.decode("def f(x):")
    assert isinstance(first, Trace) and len(first) >= 2
    live_draws = [d for d in drawn if d[0] == d[1] + 1]
    assert len(live_draws) >= len(first)  # each step was drawn as it arrived
    assert ex.block_fig is block and ex.trace is first
    assert "NFE" in ex.status.value
    ex.threshold.value = 0.9  # on release: re-decode in the background, keep the previous run
    assert ex.wait(60)
    assert ex.previous is first and ex.trace is not first
    assert ex.trace.decode_config["threshold"] == 0.9
    assert "previous" in ex.compare.value and "text difference" in ex.compare.value
    assert ex.block_fig is block
    ex.close()


def test_explorer_finds_a_bundled_model_by_name_from_any_directory(tmp_path, monkeypatch):
    """As the app does: a bare name is a bundled model, a relative path also counts from the
    repository root -- a notebook in notebooks/ can say Explorer('models/clover-tiny')."""
    from clover_viz.widgets import Explorer

    monkeypatch.chdir(tmp_path)
    for name in ("clover-tiny", "models/clover-tiny"):
        ex = Explorer(name)
        assert ex.state.loaded_model.model_id.endswith("clover-tiny")
        ex.close()
    with pytest.raises(ValueError, match="neither a trace file nor a model: no model directory at 'nope'"):
        Explorer("nope")


def _live_explorer(tokenizer=True, **cfg):
    from record_trace import loud_clover_test  # tests/clover_viz/record_trace.py

    from clover_engine.decoding.decoder import DecodeConfig
    from clover_engine.tokenizer import byte_tokenizer

    dc = DecodeConfig(**{"block_size": 4, "threshold": 0.4, "max_new_tokens": 4, **cfg})
    return Explorer(loud_clover_test(), byte_tokenizer() if tokenizer else None, dc)


def test_a_callback_error_is_shown_in_the_status_line_and_the_run_stays():
    """A click whose decode cannot start used to leave "decoding…" and the error only in the log console."""
    ex = _live_explorer()
    first = ex.decode("def f(x):")
    ex.state.loaded_model.tokenizer, tok = None, ex.state.loaded_model.tokenizer  # as Explorer(model) alone
    ex.decode_button.click()  # ipywidgets swallows a click handler's exception
    assert ex.wait(30)
    assert "error" in ex.status.value and "decoding…" not in ex.status.value
    assert "NoneType" in ex.status.value or "tokenizer" in ex.status.value.lower()
    assert ex.trace is first and len(ex.block_fig.data) > 0  # what was produced stays on display
    ex.close()

    bare = _live_explorer(tokenizer=False)
    bare.decode_button.click()
    assert bare.wait(30) and "error" in bare.status.value
    bare.close()


def test_slider_release_decodes_in_the_background_with_a_stop_button(monkeypatch):
    import threading

    ex = _live_explorer(max_new_tokens=64)
    gate = threading.Event()
    real_drain = ex.state.drain

    def slow_drain(*a, **k):  # hold the pump until the test has looked at the running decode
        gate.wait(30)
        return real_drain(*a, **k)

    monkeypatch.setattr(ex.state, "drain", slow_drain)
    calls = []
    real_generate = ex.state.generate
    monkeypatch.setattr(ex.state, "generate", lambda **k: (calls.append(k), real_generate(**k))[1])
    ex.threshold.value = 0.97  # the callback returns while the decode runs
    assert len(calls) == 1 and ex._decodes_started == 1  # one release, one decode
    assert ex.state.running and not ex.stop_button.disabled and ex._pump is not None
    ex.stop_button.click()
    gate.set()
    assert ex.wait(60)
    assert not ex.state.running and ex.stop_button.disabled
    assert ex.trace.summary()["stop_reason"] == "cancelled"
    assert "stop: cancelled" in ex.status.value
    assert len(calls) == 1
    ex.close()


def test_close_closes_every_widget_it_made(trace):
    from ipywidgets.widgets.widget import _instances

    before = set(_instances)
    ex = _live_explorer()
    ex.decode("def f(x):")
    assert len(set(_instances) - before) > 30
    ex.close()
    assert set(_instances) - before == set()  # layouts, styles, the jslink and the containers too
    ex.close()  # idempotent
    replay = Explorer(trace)
    replay.close()
    assert set(_instances) - before == set()


def test_rerunning_a_cell_closes_the_explorers_its_previous_run_made(monkeypatch, trace):
    from ipywidgets.widgets.widget import _instances

    before = set(_instances)
    key = ["cell-1", "run-1"]
    monkeypatch.setattr(widget_bundle, "_cell_key", lambda: tuple(key))
    a, b = Explorer(trace), Explorer(trace)  # one run of the cell may make two
    made = len(set(_instances) - before)
    assert a.show().comm is not None and b.show().comm is not None
    for run in range(2, 7):  # five re-runs
        key[1] = f"run-{run}"
        a, b = Explorer(trace), Explorer(trace)
    assert len(set(_instances) - before) == made  # not 6x
    key[0] = "cell-2"  # another cell's explorer leaves this cell's alone
    c = Explorer(trace)
    assert a.show().comm is not None
    for ex in (a, b, c):
        ex.close()
    assert set(_instances) - before == set()
    monkeypatch.undo()
    assert widget_bundle._cell_key() is None  # outside a notebook cell: nothing is closed behind the user's back


def test_one_plotly_bundle_per_explorer_not_one_per_figure(trace):
    """Each FigureWidget used to carry plotly's ~5 MB widget bundle: ~50 MB of widget state per Explorer."""
    import json

    from ipywidgets.widgets.widget import _instances

    full = len(go.FigureWidget().get_state()["_esm"])
    before = set(_instances)
    ex = Explorer(trace)
    made = [w for k, w in _instances.items() if k not in before]
    size = sum(len(json.dumps(w.get_state(), default=lambda _o: "")) for w in made)
    esms = [len(f.get_state()["_esm"]) for f in ex.figures.values()]
    assert sorted(esms)[-1] >= full and sorted(esms)[-2] < 2000  # the block view carries it, the rest a stub
    assert size < 1.5 * full  # was ~10x
    key = widget_bundle._BUNDLE[1].split("'")[1]
    assert f"globalThis[{key!r}]=" in ex.block_fig.get_state()["_esm"]  # the carrier publishes the factory
    assert all(key in ex.figures[n].get_state()["_esm"] for n in ex.figures if n != "block")
    ex.close()


def _plain(obj):
    """JSON-like data with arrays as lists (a figure may hold lists, arrays, plotly's base64 typed arrays
    or the widget serialiser's binary buffers)."""
    import base64

    import numpy as np

    if isinstance(obj, dict) and "dtype" in obj and ("bdata" in obj or "buffer" in obj):  # typed arrays
        raw = base64.b64decode(obj["bdata"]) if "bdata" in obj else bytes(obj["buffer"])
        arr = np.frombuffer(raw, dtype=obj["dtype"])
        return _plain(arr.reshape(obj["shape"]) if "shape" in obj else arr)
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [_plain(v) for v in obj]
    return obj.item() if isinstance(obj, np.generic) else obj


def test_a_view_built_after_updates_shows_the_current_figure():
    """A page reloaded with the kernel alive (or any view opened later) is built from the widget
    state: after a decode, that state must hold the drawn figures, not the placeholders."""
    from record_trace import loud_clover_test  # tests/clover_viz/record_trace.py
    from ipywidgets.widgets.widget import _remove_buffers

    from clover_engine.decoding.decoder import DecodeConfig
    from clover_engine.tokenizer import byte_tokenizer

    ex = Explorer(loud_clover_test(), byte_tokenizer(), DecodeConfig(block_size=4, threshold=0.4, max_new_tokens=8))
    placeholder_traces = {name: len(fig.get_state()["_widget_data"]) for name, fig in ex.figures.items()}
    ex.decode("def f(x):")
    ex.show_step(1)
    for name, fig in ex.figures.items():
        state = fig.get_state()
        _remove_buffers(state)  # what ipywidgets sends: must serialise
        shown = fig.to_plotly_json()
        assert _plain(state["_widget_data"]) == _plain(shown["data"]), name
        assert _plain(state["_widget_layout"]) == _plain(shown["layout"]), name
    assert len(ex.block_fig.get_state()["_widget_data"]) > placeholder_traces["block"] == 0
    ex.close()


def test_cost_tab_measures_the_break_even_in_the_notebook(trace):
    """The notebook Explorer's cost tab has the app's 'Measure break-even here': it times this model on
    this machine at the shown run's block_size and says what the run's tokens per forward are worth."""
    ex = _live_explorer()
    assert "not measured" in ex.break_even.value
    ex.decode("def f(x):")
    ex.break_even_button.click()
    p = ex.state.break_even_point()
    assert p is not None and p.block_size == ex.trace.decode_config["block_size"]
    assert f"needs <b>{p.tokens_per_forward:.2f}</b> tokens per forward" in ex.break_even.value
    assert "the AR tokens/s here" in ex.break_even.value
    ex.close()
    replay = Explorer(trace)  # replay has no model to time
    assert replay.break_even_button.disabled and replay.break_even.value == ""
    replay.close()
