"""One training command: ``python -m clover_engine.train [RECIPE]`` runs the Clover recipe or the causal-LM adapter's
(``causal-lm``, also ``python -m clover_engine.training.causal_lm``), each with its own flags and help (no training).

Run: .venv/bin/python -m pytest tests/clover_engine/test_train_recipes.py -q
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clover_engine import train
from clover_engine.training import causal_lm

ROOT = Path(__file__).resolve().parents[2]


def _help(main, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_the_default_recipe_is_clover_and_names_the_other(capsys):
    text = _help(train.main, [], capsys)
    assert "--window-drop" in text and "--lora-r" not in text  # a Clover flag, not the adapter's
    assert "causal-lm --help" in text
    assert _help(train.main, ["clover"], capsys) == text


def test_causal_lm_by_name_by_its_old_flags_and_by_its_module(capsys):
    text = _help(train.main, ["causal-lm"], capsys)
    assert "--lora-r" in text and "--window-drop" not in text
    assert _help(causal_lm.main, [], capsys) == text  # python -m clover_engine.training.causal_lm: the same command
    old = ["--init-from", "smollm2-135m-instruct", "--objective", "block-diffusion"]
    assert _help(train.main, old, capsys) == text  # the flags that picked it before recipes had names
    distill = _help(train.main, ["causal-lm", "distill"], capsys)
    assert "--max-new-tokens" in distill and distill == _help(causal_lm.main, ["distill"], capsys)


def test_python_dash_m_dispatches():
    out = subprocess.run([sys.executable, "-m", "clover_engine.train", "causal-lm", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "--lora-r" in out.stdout, out.stderr
