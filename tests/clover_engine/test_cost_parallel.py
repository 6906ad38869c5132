"""clover_engine.cost.parallel.project_parallel: per-GPU bytes of a forward split over GPUs (expert and
tensor parallel), the arithmetic pinned: the ep shards' expert bytes sum to the single-GPU expert
bytes, replicated weights are counted in full on every GPU, the heads' share divides by tp, and the
ring all-reduce term."""

from __future__ import annotations

import itertools

import pytest

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.cost import forward_cost, param_counts
from clover_engine.cost.cli import main
from clover_engine.cost.devices import Device
from clover_engine.cost.parallel import (
    INTERCONNECT_BYTES_PER_S,
    parse_split,
    project_parallel,
    project_parallel_table,
)

CFG = CloverConfig.from_name("clover-35b-a3b")
REPLICATED = ("embedding", "norms", "routers", "lm_head")
BY_HEADS = ("gdn_mixers", "attention_mixers", "state_read", "state_write", "window_kv", "block_attention")


def test_one_gpu_is_forward_cost():
    one = project_parallel(CFG, "h800", n_tokens=32, expert_union=32)
    fc = forward_cost(CFG, 32, 32)
    assert one.bytes_per_gpu == pytest.approx(fc.bytes_read, rel=1e-12)
    assert one.flops_per_gpu == pytest.approx(fc.flops, rel=1e-12)
    assert one.comm_time_s == 0 and one.n_collectives == 0
    assert one.time_s == pytest.approx(fc.roofline_time_s("h800"), rel=1e-12)


@pytest.mark.parametrize("G", [2, 4, 8])
def test_expert_parallel_bytes(G):
    union = 40.0
    one = project_parallel(CFG, "h800", n_tokens=32, expert_union=union)
    ep = project_parallel(CFG, "h800", ep=G, n_tokens=32, expert_union=union)
    expert_bytes = CFG.num_hidden_layers * union * 3 * CFG.moe_intermediate_size * CFG.hidden_size * 2
    assert one.bytes_by_component["routed_experts"] == pytest.approx(expert_bytes, rel=1e-12)
    # the G shards' expert bytes sum to the single GPU's
    assert G * ep.bytes_by_component["routed_experts"] == pytest.approx(expert_bytes, rel=1e-12)
    for key in REPLICATED + BY_HEADS + ("shared_experts",):  # everything else replicated under ep alone
        assert ep.bytes_by_component[key] == one.bytes_by_component[key], key
    assert ep.bytes_per_gpu == pytest.approx(one.bytes_per_gpu - expert_bytes * (G - 1) / G, rel=1e-12)
    # per layer the routed [T, hidden] output (bf16) and an 8-byte union count, ring all-reduce
    msg = 32 * CFG.hidden_size * 2
    comm = 2 * (G - 1) / G * CFG.num_hidden_layers * (msg + 8)
    assert ep.n_collectives == 2 * CFG.num_hidden_layers
    assert ep.comm_bytes_per_gpu == pytest.approx(comm, rel=1e-12)
    assert ep.comm_time_s == pytest.approx(comm / 200e9, rel=1e-12)  # H800 NVLink 400 GB/s both ways
    assert ep.time_s == pytest.approx(max(ep.bytes_per_gpu / 3.35e12, ep.flops_per_gpu / 989.4e12) + comm / 200e9,
                                      rel=1e-12)


def test_tensor_and_expert_parallel_bytes():
    G, union = 4, 32.0
    one = project_parallel(CFG, "h200", n_tokens=32, expert_union=union, memory_mode="state+window", window=64)
    both = project_parallel(CFG, "h200", ep=G, tp=G, n_tokens=32, expert_union=union, memory_mode="state+window",
                            window=64)
    for key in REPLICATED:  # read in full by every GPU
        assert both.bytes_by_component[key] == one.bytes_by_component[key] > 0
    for key in BY_HEADS:
        assert G * both.bytes_by_component[key] == pytest.approx(one.bytes_by_component[key], rel=1e-12), key
        assert G * both.flops_by_component[key] == pytest.approx(one.flops_by_component[key], rel=1e-12), key
    gate = CFG.num_hidden_layers * CFG.hidden_size * 2  # the shared expert's sigmoid gate row, replicated
    shared = CFG.num_hidden_layers * param_counts(CFG)["shared_expert"] * 2
    assert both.bytes_by_component["shared_experts"] == pytest.approx((shared - gate) / G + gate, rel=1e-12)
    assert G * both.bytes_by_component["routed_experts"] == pytest.approx(one.bytes_by_component["routed_experts"])
    msg = 32 * CFG.hidden_size * 2
    assert both.n_collectives == 4 * CFG.num_hidden_layers
    assert both.comm_bytes_per_gpu == pytest.approx(1.5 * CFG.num_hidden_layers * (3 * msg + 8), rel=1e-12)
    assert both.link_bytes_per_s == INTERCONNECT_BYTES_PER_S["h200"][0] == 450e9
    lat = project_parallel(CFG, "h200", ep=G, tp=G, n_tokens=32, expert_union=union, collective_latency_s=1e-5,
                           memory_mode="state+window", window=64)
    assert lat.comm_time_s == pytest.approx(both.comm_time_s + 160 * 1e-5, rel=1e-12)


def test_table_and_errors():
    rows = project_parallel_table("ep=8", CFG, "h800", expert_union=32)
    assert [(r.gpus, r.ep, r.tp) for r in rows] == [(1, 1, 1), (2, 2, 1), (4, 4, 1), (8, 8, 1)]
    assert all(a.time_s > b.time_s for a, b in itertools.pairwise(rows))  # more GPUs, fewer bytes each
    assert [r.gpus for r in project_parallel_table("tp=6", CFG, "h800")] == [1, 2, 4, 6]
    assert parse_split("ep=8, tp=8") == {"ep": 8, "tp": 8}
    for bad in ("ep=8,tp=4", "dp=2", "ep=0", "", "ep=2,ep=2"):
        with pytest.raises(ValueError, match="ep=N and/or tp=N"):
            parse_split(bad)
    with pytest.raises(ValueError, match="same GPUs"):
        project_parallel(CFG, "h800", ep=2, tp=4)
    odd = Device("odd", 1e12, 1e14, "made up for the test")
    with pytest.raises(ValueError, match="interconnect"):
        project_parallel(CFG, odd, ep=2)
    assert project_parallel(CFG, odd, ep=2, link_bytes_per_s=1e11).link_source == "given"


def test_cli_parallel(capsys):
    assert main(["--parallel", "ep=8", "--union", "32"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("projection (not measured): clover-35b-a3b on h800")
    assert "ep=8" in out and "collective latency not modelled" in out and "NVLink" in out
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [int(line.split()[0]) for line in rows] == [1, 2, 4, 8]
    assert main(["--parallel", "ep=8,tp=2"]) == 2
