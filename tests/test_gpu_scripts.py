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
    from clover_engine.training.loop import build_parser

    cmds = _commands("train_gpu.sh", "clover_engine.train")
    assert len(cmds) == 1
    args = build_parser().parse_args(cmds[0])
    assert args.device == "cuda" and args.dtype == "bf16" and args.size == "small" and args.code_source == "both"


def test_adapt_smollm2_gpu_script_parses():
    pytest.importorskip("peft")
    from clover_engine.training.causal_lm import build_parser

    cmds = _commands("adapt_smollm2_gpu.sh", "clover_engine.train")
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


def _bare(cmd: list[str]) -> list[str]:
    """A command's own arguments: up to a redirection or ``&``, the script's paths replaced by stand-ins."""
    cut = next((i for i, t in enumerate(cmd) if t in (">", "&", "2>&1")), len(cmd))
    return [t.replace("$OUT", "runs/x").replace("$CACHE", "runs/x/f.safetensors") for t in cmd[:cut]]


def test_drafter_gpu_script_parses():
    """benchmarks/drafter_gpu.sh: the features cached are the layers both drafters read, both train on the GPU
    in bf16 at blocks 8 and 16, and each eval runs on the GPU on the drafter its training exported."""
    from clover_engine.eval.drafter import build_parser as eval_parser
    from clover_engine.training.drafter import build_parser

    cmds = [_bare(c) for c in _commands("drafter_gpu.sh", "clover_engine.training.drafter")]
    assert [c[0] for c in cmds] == ["cache", "cache", "train", "train", "export", "export"]
    caches = [build_parser().parse_args(c) for c in cmds[:2]]  # the questions and the tool-call chats
    trains = [build_parser().parse_args(c) for c in cmds[2:4]]
    exports = [build_parser().parse_args(c) for c in cmds[4:]]
    assert all(c.device == "cuda" and c.layers == [8, 15, 22, 30] for c in caches)
    assert len({c.out for c in caches}) == 2 and len({c.data for c in caches}) == 2
    assert sorted(t.block_size for t in trains) == [8, 16]
    assert all(t.device == "cuda" and t.dtype == "bf16" and t.layers == caches[0].layers
               and t.cache == [c.out for c in caches] for t in trains)
    sources = [c[c.index("--source") + 1] for c in _commands("drafter_gpu.sh", "clover_engine.training.causal_lm")]
    assert sources == ["self-instruct", "templates", "tools"]
    assert [e.run for e in exports] == [t.out for t in trains]
    evals = [eval_parser().parse_args(_bare(c)) for c in _commands("drafter_gpu.sh", "clover_engine.eval")]
    assert [e.block_size for e in evals] == [8, 16] and all(e.device == "cuda" for e in evals)
    assert [Path(e.model) for e in evals] == [x.out for x in exports]
    assert evals[0].compare == "models/smollm2-bd"


def test_drafter_cli_refuses_cuda_without_a_device(capsys):
    """On a machine without CUDA, --device cuda stops before any work, saying so (exit status 2)."""
    import torch

    from clover_engine.training.drafter import main

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the refusal cannot be seen here")
    assert main(["cache", "--device", "cuda", "--data", "nothing.jsonl"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
