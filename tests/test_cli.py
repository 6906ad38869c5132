"""``clover-explorer``'s subcommands are today's commands: the same ``--help``, the bundled models by name
from any directory, ``serve`` as ``panel serve`` of the packaged app, ``tutorials`` copying the notebooks.

Run: ``.venv/bin/python -m pytest tests/test_cli.py -q``
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import clover_viz.explorer
from clover_explorer import cli
from clover_engine.checkpoint import bundled_models_dir, find_model_dir

ROOT = Path(__file__).resolve().parents[1]


def _help(capsys, run) -> str:
    with pytest.raises(SystemExit) as stop:
        run()
    assert stop.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(cli.TOOLS))
def test_each_engine_subcommand_has_that_commands_help(capsys, name):
    module, function = cli.TOOLS[name][0].split(":")
    own = _help(capsys, lambda: getattr(__import__(module, fromlist=[function]), function)(["--help"]))
    assert _help(capsys, lambda: cli.main([name, "--help"])) == own


def test_a_bundled_model_is_found_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny = str(ROOT / "models" / "clover-tiny")
    assert bundled_models_dir() == ROOT / "models"  # the checkout: exactly its models/
    assert find_model_dir("models/clover-tiny") == find_model_dir("clover-tiny") == tiny
    assert find_model_dir("runs/mine") == "runs/mine"  # not bundled: left for the loader's message
    (tmp_path / "models" / "clover-tiny").mkdir(parents=True)
    assert find_model_dir("models/clover-tiny") == "models/clover-tiny"  # a folder of one's own comes first


def test_serve_is_panel_serve_of_the_packaged_app(monkeypatch):
    seen = {}
    monkeypatch.setattr("panel.command.main", lambda: seen.setdefault("argv", list(sys.argv)) and 0)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    assert cli.main(["serve", "--port", "5123", "--show", "--model-root", "runs", "--num-procs", "1"]) == 0
    assert seen["argv"] == ["panel", "serve", clover_viz.explorer.__file__, "--port", "5123", "--show",
                            "--num-procs", "1", "--args", "--model-root", "runs"]


def test_tutorials_copies_the_notebooks_and_keeps_an_edited_one(tmp_path, capsys):
    mine = tmp_path / "00_quickstart.ipynb"
    mine.write_text("my edits")
    assert cli.main(["tutorials", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.ipynb")) == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert mine.read_text() == "my edits"
    first = capsys.readouterr().out
    n = len(list((ROOT / "notebooks").glob("*.ipynb")))
    assert f"copied {n - 1} tutorials" in first and "kept 1 already" in first and "00_quickstart.ipynb" in first
    assert "jupyter lab" in first
    assert cli.main(["tutorials", str(tmp_path)]) == 0  # a second run copies nothing and says so
    second = capsys.readouterr().out
    assert "copied" not in second and f"kept {n} already" in second, second


def test_sweep_prints_and_draws_each_models_frontier(tmp_path, capsys):
    """``clover-explorer sweep`` over two thresholds of the random test model: the summary's agreement column,
    the frontier printed with its Pareto marks, and one plot per model, a page whose scatter holds the settings
    at their measured tokens per forward and agreement."""
    import json
    import re

    import pyarrow.parquet as pq

    (tmp_path / "p.txt").write_text("hello there\nthe cat sat\n")
    out = tmp_path / "sweep"
    code = cli.main(["sweep", "--models", "random:clover-test", "--tasks", f"prompts:{tmp_path / 'p.txt'}",
                     "--threshold", "0.5,0.95", "--block-size", "8", "--max-new-tokens", "16", "--out", str(out),
                     "--no-traces", "--no-progress", "--threads", "1"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "agree%" in text and "frontier of random:clover-test on prompts:" in text
    frontier = pq.read_table(out / "frontier.parquet").to_pylist()
    assert len(frontier) == 2 and any(r["pareto"] for r in frontier)
    [plot] = out.glob("frontier-*.html")
    assert f"frontier plot: {plot}" in text and (out / "plotly.min.js").is_file()
    page = plot.read_text()
    figure = json.loads(re.search(r'Plotly\.newPlot\(\s*"[^"]+",\s*(\[.*?\]),\s*\{', page, re.S).group(1))
    xs = sorted(x for trace in figure for x in trace["x"] if trace.get("mode") == "markers")
    assert xs == pytest.approx(sorted(r["tokens_per_forward"] for r in frontier))
