"""A file given where a model directory belongs gets one message, whichever front end it was typed into.

The command line (``--model README.md``) said "is a file; pass the model's directory" while the
explorer's model field and ``resolve_model`` said "no model directory at 'README.md'" -- as if the
path did not exist. Both now raise `clover_engine.checkpoint.file_as_model_dir`'s sentence.

Run: ``.venv/bin/python -m pytest tests/apps/test_model_path_message.py -q``
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clover_engine.checkpoint import file_as_model_dir

ROOT = Path(__file__).resolve().parents[2]


def test_file_as_model_dir_names_the_file_and_the_directory_to_pass():
    assert file_as_model_dir("README.md") == ("'README.md' is a file; pass the model's directory (the folder "
                                              "that holds config.json), e.g. models/clover-tiny")
    # a file inside a checkpoint: its own folder is the directory to pass
    inside = file_as_model_dir("models/clover-tiny/config.json", ROOT / "models/clover-tiny/config.json")
    assert inside.endswith("e.g. models/clover-tiny") and inside.startswith("'models/clover-tiny/config.json'")


@pytest.mark.parametrize("cli", ["clover_engine.generate", "clover_engine.eval"])
def test_the_command_lines_refuse_a_file_with_the_shared_message(cli):
    argv = ["--model", "README.md"] + (["--prompt", "x"] if cli == "clover_engine.generate" else [])
    out = subprocess.run([sys.executable, "-m", cli, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode != 0, out.stderr
    assert f"error: {file_as_model_dir('README.md')}" in out.stderr


def test_the_explorer_refuses_a_file_with_the_same_message_as_the_cli(tmp_path, monkeypatch):
    pytest.importorskip("panel")
    from clover_viz.models import resolve_model
    from clover_viz.state import ExplorerState

    expected = file_as_model_dir("README.md")
    monkeypatch.chdir(tmp_path)  # found against the repository root, shown as typed
    with pytest.raises(ValueError) as e:
        resolve_model("README.md")
    assert str(e.value) == expected
    with pytest.raises(ValueError) as e:
        resolve_model("models/clover-tiny/config.json")
    assert str(e.value) == file_as_model_dir("models/clover-tiny/config.json",
                                             ROOT / "models/clover-tiny/config.json")
    state = ExplorerState(model_dir="clover-test", prompt="Hello", max_new_tokens=8, block_size=8)
    try:
        state.model_dir = "README.md"
        assert expected in state.error and "no model directory" not in state.error
        assert not state.generate()
        assert expected in state.error
    finally:
        state.close()


def test_the_loader_names_a_stray_file_the_same_way(tmp_path):
    from clover_engine.checkpoint import load_model

    f = tmp_path / "notes.txt"
    f.write_text("x")
    with pytest.raises(ValueError) as e:
        load_model(f)
    assert str(e.value) == file_as_model_dir(f)
