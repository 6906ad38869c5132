"""The notebook `Explorer` and the app share one set of settings and defaults (issue 35, item 5).

* whatever way a setting changes (a widget, ``decode(**overrides)``, the constructor's
  DecodeConfig), the widgets show what ran and the next decode uses it;
* ``Explorer()`` opens the bundled default model with the app's default prompt;
* the default memory mode is the model's best measured one, the same in the notebook,
  the app (`ExplorerState` after ``load_model``) and the CLI (`clover_engine.generate`).

Run: .venv/bin/python -m pytest tests/clover_viz/test_widget_defaults.py -q
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")  # plotly >= 6 FigureWidget

from clover_viz.models import DEFAULT_MODEL_DIR, REPO_ROOT  # noqa: E402
from clover_viz.state import ExplorerState  # noqa: E402
from clover_viz.widgets import Explorer  # noqa: E402

TINY = REPO_ROOT / "models" / "clover-tiny"


def _small_explorer(**cfg):
    """An Explorer over the loud random clover-test with a byte tokenizer (fast decodes)."""
    from record_trace import loud_clover_test  # tests/clover_viz/record_trace.py

    from clover_engine.decoding.decoder import DecodeConfig
    from clover_engine.tokenizer import byte_tokenizer

    dc = DecodeConfig(**{"block_size": 4, "threshold": 0.9, "max_new_tokens": 4, **cfg})
    return Explorer(loud_clover_test(), byte_tokenizer(), dc)


def test_a_decode_override_becomes_the_setting_the_widgets_show():
    """decode(block_size=7) used to run at 7 while the dropdown (7 not among its options) showed the
    old value, and the next decode() went back to it with no notice."""
    ex = _small_explorer()
    try:
        first = ex.decode("def f(x):", block_size=7)
        assert first.decode_config["block_size"] == 7
        assert 7 in ex.block_size.options and ex.block_size.value == 7  # the widget shows what ran
        assert ex.config.block_size == 7
        again = ex.decode()  # no override: the setting stays
        assert again.decode_config["block_size"] == 7
        assert "block_size 7" in ex.status.value

        # a threshold below the slider's range: the slider widens to show it, the next decode keeps it
        low = ex.decode(threshold=0.3)
        assert low.decode_config["threshold"] == 0.3 and ex.threshold.value == 0.3 and ex.threshold.min <= 0.3
        assert ex.decode().decode_config["threshold"] == 0.3

        # a field without a widget is kept too, and named in the status line
        ex.decode(max_new_tokens=2)
        assert ex.decode().decode_config["max_new_tokens"] == 2 and "max_new_tokens 2" in ex.status.value

        # the widget's own change is the setting from then on
        ex.block_size.value = 16  # on release: re-decodes in the background
        assert ex.wait(60)
        assert ex.trace.decode_config["block_size"] == 16 and ex.config.block_size == 16

        # an override that cannot run changes nothing
        with pytest.raises(ValueError, match="block_size"):
            ex.decode(block_size=0)
        assert ex.block_size.value == 16 and ex.config.block_size == 16
        assert ex.decode().decode_config["block_size"] == 16
    finally:
        ex.close()


def test_a_constructor_setting_the_widgets_cannot_show_is_not_dropped():
    """A DecodeConfig threshold below the slider's 0.5 used to be clamped to 0.5 silently: the first
    decode then ran at 0.5, not at the threshold given."""
    ex = _small_explorer(threshold=0.4, block_size=5)
    try:
        assert ex.threshold.value == 0.4 and ex.block_size.value == 5
        run = ex.decode("def f(x):")
        assert run.decode_config["threshold"] == 0.4 and run.decode_config["block_size"] == 5
    finally:
        ex.close()


def test_explorer_with_no_argument_opens_the_bundled_model_as_the_app_does():
    """Explorer() used to raise TypeError; the app opens DEFAULT_MODEL_DIR with its default example."""
    app = ExplorerState(model_dir=DEFAULT_MODEL_DIR)  # what apps/explorer.py's create_app() builds
    ex = Explorer()
    try:
        assert app.load_model() is not None
        assert ex.state.loaded_model.model_id == app.loaded_model.model_id
        assert ex.state.loaded_model.model_id.endswith(Path(DEFAULT_MODEL_DIR).name)
        assert ex.prompt == ex.prompt_box.value == app.prompt  # the app's default example
        assert ex.config == app.decode_config()  # the app's settings, memory mode included
        run = ex.decode(max_new_tokens=4)
        assert len(run) >= 1 and run.summary()["n_tokens"] >= 1
        assert run.prompt_ids is not None and len(run.prompt_ids) > 0
    finally:
        ex.close()
        app.close()


def _cli_memory_mode(model_dir: Path, capsys) -> str:
    """The memory mode `python -m clover_engine.generate` decodes ``model_dir`` in when not told one."""
    from clover_engine.generate import main

    assert main(["--model", str(model_dir), "--prompt", "def f(x):", "--block-size", "2",
                 "--max-new-tokens", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    found = re.search(r"memory_mode=(state\+window|state)\b", out)
    assert found, out
    return found.group(1)


def _modes(model_dir: Path, capsys) -> dict[str, str]:
    app = ExplorerState(model_dir=str(model_dir))
    ex = Explorer(str(model_dir))
    try:
        assert app.load_model() is not None
        return {"notebook": ex.config.memory_mode, "app": app.memory_mode,
                "app decode": app.decode_config().memory_mode, "cli": _cli_memory_mode(model_dir, capsys)}
    finally:
        ex.close()
        app.close()


def test_notebook_app_and_cli_start_in_the_models_best_measured_memory_mode(tmp_path, capsys):
    """The notebook used DecodeConfig()'s `state` for clover-tiny while the app and CLI chose
    state+window; and the app kept its fixed state+window for a model measured best in `state`."""
    from clover_engine.checkpoint import best_memory_mode

    assert best_memory_mode(TINY)[0] == "state+window"  # eval.json: 29 % exact with the window, 4 % in state
    assert set(_modes(TINY, capsys).values()) == {"state+window"}

    # the same weights with an eval.json that measures `state` better: every front end follows it
    other = tmp_path / "measured-state"
    other.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (other / name).symlink_to(TINY / name)
    table = json.loads((TINY / "eval.json").read_text(encoding="utf-8"))
    table["agent"]["bd32-window"]["exact_match"], table["agent"]["bd32-state"]["exact_match"] = 0.1, 0.2
    (other / "eval.json").write_text(json.dumps(table), encoding="utf-8")
    assert best_memory_mode(other)[0] == "state"
    assert set(_modes(other, capsys).values()) == {"state"}

    # a dict decode_config: the fields it leaves out take the app's defaults (the memory mode too)
    ex = Explorer(str(other), decode_config={"block_size": 2, "max_new_tokens": 2})
    try:
        assert ex.config.memory_mode == "state" and ex.block_size.value == 2
        run = ex.decode("def f(x):")
        assert run.decode_config["memory_mode"] == "state"
        assert "memory state" in ex.status.value  # the status line names the mode that ran
    finally:
        ex.close()


def test_a_memory_mode_given_to_the_app_state_is_kept_on_load():
    """The best measured mode is only a default: a mode given to the state stays."""
    s = ExplorerState(model_dir=str(TINY), memory_mode="state")
    try:
        assert s.load_model() is not None and s.memory_mode == "state"
    finally:
        s.close()
