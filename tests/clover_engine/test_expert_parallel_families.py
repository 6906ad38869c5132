"""Expert parallel for the public MoE families: ``torchrun`` over 2 and 4 CPU processes (gloo, fp32) decodes
LLaDA-MoE, SDAR-MoE and LLaDA2.0 token for token as one process.

Each family's tiny checkpoint (8 routed experts) is decoded with its own sampler(s) and with threshold decoding,
by ``tests/clover_engine/ep_family_worker.py`` under ``torchrun --nproc-per-node N`` and, for the reference, in
this process unsplit. Every rank must give the reference's tokens and forwards, every forward's router top-k
per layer (hashed) and every step's expert union; each rank holds only E / N experts (the others never loaded);
and the ranks' experts per forward sum to the step's union (a block's union spread over the N devices). The
command line's 2-rank decode writes a trace whose per-rank unions the explorer reads back anywhere.

Run: ``.venv/bin/python -m pytest -q tests/clover_engine/test_expert_parallel_families.py``
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
FAMILIES = {"llada_moe": ["llada", "block"], "sdar_moe": ["sdar", "block"], "llada2": ["llada2", "llada21", "block"]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from clover_engine.backbones.llada2_moe import write_tiny_llada2_moe
    from clover_engine.backbones.llada_moe import write_tiny_llada_moe
    from clover_engine.backbones.sdar_moe import write_tiny_sdar_moe

    root = tmp_path_factory.mktemp("ep-families")
    return {"llada_moe": write_tiny_llada_moe(root / "llada-moe"), "sdar_moe": write_tiny_sdar_moe(root / "sdar-moe"),
            "llada2": write_tiny_llada2_moe(root / "llada2")}


def _torchrun(n: int, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", str(n), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_rank_decodes_token_for_token_as_one_process(tiny, tmp_path, family, world):
    sys.path.insert(0, str(HERE))
    try:
        from ep_family_worker import decode_all
    finally:
        sys.path.remove(str(HERE))
    from clover_engine.checkpoint import load_model, load_tokenizer

    settings = FAMILIES[family]
    reference = decode_all(load_model(tiny[family]), load_tokenizer(tiny[family]), settings)
    run = _torchrun(world, str(HERE / "ep_family_worker.py"), str(tiny[family]), str(tmp_path / "out.json"), *settings)
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in range(world):
        got = json.loads((tmp_path / f"out-rank{rank}.json").read_text())
        assert got["remote_experts"] == sum(1 for _ in range(_moe_layers(tiny[family]))) * (8 - 8 // world)
        for name in settings:
            mine, ref = got["decodes"][name], reference[name]
            assert (mine["tokens"], mine["nfe"]) == (ref["tokens"], ref["nfe"]), (rank, name)
            assert mine["topk"] == ref["topk"], (rank, name)  # every forward's router choices, per layer
            assert mine["unions"] == ref["unions"], (rank, name)
            # the ranks' experts of a forward, summed over the ranks, are that step's union (disjoint shares)
            assert [[sum(r[layer] for r in step) for layer in range(len(step[0]))] for step in mine["rank_unions"]] \
                == mine["unions"]
            assert all(len(step) == world for step in mine["rank_unions"])


def _moe_layers(path: Path) -> int:
    from clover_engine.backbones.moe import split_layers
    from clover_engine.checkpoint import load_model

    return len(split_layers(load_model(path)))


def test_the_command_line_decodes_on_two_ranks_and_its_trace_shows_per_rank_unions(tiny, tmp_path):
    from clover_engine.recording.trace import Trace

    trace_path = tmp_path / "ep2.parquet"
    run = _torchrun(2, "-m", "clover_engine.generate", "--model", str(tiny["llada2"]), "--sampler", "llada2",
                    "--parallel", "ep=2", "--prompt", "The quick brown fox", "--max-new-tokens", "16",
                    "--block-size", "8", "--trace", str(trace_path), "--threads", "1", "--parallel-timeout", "600")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ep=2 llada2 | tokens=16" in run.stdout and "experts run per forward, per rank" in run.stdout
    one = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", str(tiny["llada2"]), "--sampler",
                          "llada2", "--prompt", "The quick brown fox", "--max-new-tokens", "16", "--block-size", "8",
                          "--threads", "1"], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert one.returncode == 0, one.stderr[-2000:]
    assert run.stdout.splitlines()[0] == one.stdout.splitlines()[0]  # the same answer text
    trace = Trace.load(trace_path)
    ep = trace.meta["expert_parallel"]
    assert ep["world"] == 2 and len(ep["rank_unions"]) == len(trace) and len(ep["rank_expert_bytes"]) == 2
    for step, per_rank in zip(trace.steps, ep["rank_unions"]):
        assert [a + b for a, b in zip(*per_rank)] == [int(u) for u in step.expert_union]
    assert all(i >= 1.0 for i in ep["imbalance"])


def test_a_two_rank_trace_shows_each_devices_experts_in_both_front_ends(tiny, tmp_path):
    """The trace of a 2-rank decode, opened where no process group exists: the figure both front ends draw has one
    line per device whose values sum to each forward's union, the notebook Explorer shows it, and a one-process
    run's Explorer keeps it hidden."""
    pytest.importorskip("ipywidgets")
    from clover_viz import figures as F
    from clover_viz.widgets import Explorer
    from clover_engine.recording.trace import Trace

    trace_path = tmp_path / "ep2.parquet"
    run = _torchrun(2, "-m", "clover_engine.generate", "--model", str(tiny["sdar_moe"]), "--sampler", "sdar",
                    "--parallel", "ep=2", "--prompt", "hello there", "--max-new-tokens", "16", "--block-size", "8",
                    "--trace", str(trace_path), "--threads", "1", "--parallel-timeout", "600")
    assert run.returncode == 0, run.stderr[-3000:]
    trace = Trace.load(trace_path)
    fig = F.expert_parallel_figure(trace)
    devices = [t for t in fig.data if t.name.startswith("device ")]
    assert [t.name for t in devices] == ["device 0", "device 1"]
    unions = [int(sum(s.expert_union)) for s in trace.steps]
    assert [a + b for a, b in zip(devices[0].y, devices[1].y)] == unions
    ex = Explorer(trace)
    try:
        assert ex._ranks_box.layout.display == "" and len(ex.figures["expert_parallel"].data) == 3
    finally:
        ex.close()
    plain = Trace.load(trace_path)
    plain.meta.pop("expert_parallel")
    ex = Explorer(plain)
    try:
        assert ex._ranks_box.layout.display == "none"
    finally:
        ex.close()


def test_the_cost_tab_states_each_devices_routed_expert_bytes(tmp_path):
    """The Cost tab's notes name the device count and each device's routed-expert bytes per forward from the
    recorded unions (union x one expert's bytes, averaged over the forwards)."""
    from clover_viz.figures.cost import _expert_split_note

    trace = type("T", (), {"meta": {"expert_parallel": {
        "world": 2, "rank_unions": [[[3, 2], [1, 1]], [[2, 2], [2, 2]]], "expert_bytes": 1e6,
        "rank_expert_bytes": [9e6, 6e6]}}})()
    note = _expert_split_note(trace)
    assert "2 devices, experts split" in note and "4.50, 3.00 MB" in note and "busiest / mean 1.20" in note
    assert _expert_split_note(type("T", (), {"meta": {}})()) == ""
