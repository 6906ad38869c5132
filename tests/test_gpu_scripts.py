"""The GPU scripts' GPU-only command lines parse: CI cannot run them (no GPU), so a renamed or
misspelt flag would otherwise first fail on a lent device, whose minutes are scarce."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _commands(script: str, module: str) -> list[list[str]]:
    """The argument lists of ``"$PY" -m <module> ...`` lines after the script's TINY block."""
    text = (ROOT / "benchmarks" / script).read_text()
    gpu_part = text[text.index("exit 0\nfi"):]  # the TINY=1 branch ends there; the rest is the GPU run
    joined = re.sub(r"\\\n\s*", " ", gpu_part)
    out = []
    for line in joined.splitlines():
        m = re.search(rf'"\$PY" -m {re.escape(module)} (.*?)(\|\||$)', line.strip())
        if m:
            args = m.group(1).replace('"${resume[@]}"', "").replace('"$OUT"', "runs/x").replace('"$DATA"', "d.jsonl")
            out.append(shlex.split(args))
    return out


def test_train_gpu_script_parses():
    from engine.training.loop import build_parser

    cmds = _commands("train_gpu.sh", "engine.train")
    assert len(cmds) == 1
    args = build_parser().parse_args(cmds[0])
    assert args.device == "cuda" and args.dtype == "bf16" and args.size == "small" and args.code_source == "both"


def test_adapt_smollm2_gpu_script_parses():
    pytest.importorskip("peft")
    from engine.training.causal_lm import build_parser

    cmds = _commands("adapt_smollm2_gpu.sh", "engine.train")
    assert len(cmds) == 1
    args = build_parser().parse_args(cmds[0])
    assert args.device == "cuda" and args.dtype == "bf16" and args.init_from == "smollm2-135m-instruct"


def test_gpu_check_script_tiny_path_runs(tmp_path):
    """TINY=1: the benchmark half of benchmarks/gpu_check.sh on clover-test, on the CPU."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TINY": "1", "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path / "gc")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "gc" / "gpu_forward.md").read_text()
    assert "| independent | block 8 |" in table and "% roofline" in table
