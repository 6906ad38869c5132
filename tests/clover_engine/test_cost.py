"""Cost model: the seed's arithmetic for clover-35b-a3b, checked exactly, plus consistency.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_cost.py -q``
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from clover_engine import cost
from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.cost import (
    COMPONENTS,
    DEVICES,
    Device,
    active_params_per_token,
    ar_step_cost,
    expected_union,
    forced_fill_probability,
    forward_cost,
    measure_this_machine,
    project_tokens_per_s,
    project_trace,
    ridge_point,
    roofline_time_s,
    union_for_bytes_ratio,
)

BIG = CloverConfig.from_name("clover-35b-a3b")
TINY = CloverConfig.from_name("clover-test")


# ------------------------------------------------------------------ the seed's numbers
def test_active_params_per_token_is_2_95b():
    assert active_params_per_token(BIG) == pytest.approx(2.95e9, rel=0.01)
    assert active_params_per_token(BIG) == 2_946_677_448  # exact, from the shapes
    # and the whole model is the "35B"
    assert cost.param_counts(BIG)["total"] == pytest.approx(35e9, rel=0.02)


def test_ar_step_reads_5_89_gb_weights_only():
    ar = ar_step_cost(BIG)
    assert ar.bytes_read == pytest.approx(5.89e9, rel=0.01)
    # = active params x 2 bytes + one embedding row
    assert ar.bytes_read == 2 * active_params_per_token(BIG) + 2 * BIG.hidden_size
    assert ar.bytes_by_component["state_read"] == ar.bytes_by_component["state_write"] == 0
    with_state = ar_step_cost(BIG, include_state=True)
    assert with_state.bytes_read - ar.bytes_read == pytest.approx(139.264e6, rel=1e-6)


def test_ar_bandwidth_bound_is_568_tokens_per_s():
    ar = ar_step_cost(BIG)
    assert 3.35e12 / ar.bytes_read == pytest.approx(568.0, rel=0.01)
    assert 1 / ar.roofline_time_s("h800") == pytest.approx(568.4, abs=0.1)
    # the seed's "about 555" is 6 GB-ish; with a state read+write the exact number lands there
    assert 1 / ar_step_cost(BIG, include_state=True).roofline_time_s("h800") == pytest.approx(555.3, abs=0.1)


def test_32_token_forward_with_union_32_reads_2_02x_ar():
    ar = ar_step_cost(BIG)
    fc = forward_cost(BIG, 32, 32)
    assert fc.weights_bytes_read / ar.bytes_read == pytest.approx(2.02, abs=0.02)
    assert fc.weights_bytes_read / ar.bytes_read == pytest.approx(2.0249, abs=1e-4)
    # with its 69.6 MB state read, still within the tolerance
    assert fc.bytes_read / ar.bytes_read == pytest.approx(2.037, abs=1e-3)


def test_expected_union_independent_top8_of_256():
    got = [round(expected_union(256, 8, t), 1) for t in (8, 16, 32, 64)]
    assert got == [57.4, 102.0, 163.3, 222.4]
    assert expected_union(256, 8, 1) == pytest.approx(8.0)
    assert expected_union(256, 8, 0) == 0.0


def test_the_write_ups_1_4x_is_a_union_of_about_17():
    u = union_for_bytes_ratio(BIG, 1.4)
    assert u == pytest.approx(17.37, abs=0.01)
    assert round(u) == 17
    assert union_for_bytes_ratio(BIG, forward_cost(BIG, 32, 32).weights_bytes_read / ar_step_cost(BIG).bytes_read) \
        == pytest.approx(32.0)
    with pytest.raises(ValueError, match="dense floor"):
        union_for_bytes_ratio(BIG, 0.5)


@pytest.mark.parametrize(
    "p, expected", [(0.05, 0.19371), (0.1, 0.034337), (0.2, 7.9228e-4), (0.5, 2.3283e-10)],
    ids=["p0.05", "p0.1", "p0.2", "p0.5"],
)
def test_forced_fill_table(p, expected):
    assert forced_fill_probability(p) == pytest.approx(expected, rel=1e-4)
    assert forced_fill_probability(p, block=32) == pytest.approx((1 - p) ** 32)
    assert cost.forced_fill_table()[p] == pytest.approx(expected, rel=1e-4)


# --------------------------------------------------------------------- consistency
def test_breakdown_sums_to_totals_and_lists_every_component():
    fc = forward_cost(TINY, 48, [8, 7, 6, 5], n_commit_tokens=16, memory_mode="state+window")
    assert list(fc.bytes_by_component) == list(COMPONENTS) == list(fc.flops_by_component)
    assert fc.bytes_read == pytest.approx(sum(fc.bytes_by_component.values()))
    assert fc.flops == pytest.approx(sum(fc.flops_by_component.values()))
    assert fc.arithmetic_intensity == pytest.approx(fc.flops / fc.bytes_read)
    assert fc.mean_expert_union == pytest.approx(6.5)
    assert all(fc.bytes_by_component[k] > 0 for k in ("state_read", "state_write", "window_kv"))


def test_tiny_bytes_grow_with_union_and_flops_with_tokens():
    b = [forward_cost(TINY, 16, u).bytes_read for u in (2, 4, 8)]
    assert b[0] < b[1] < b[2]
    expert_bytes = 3 * TINY.moe_intermediate_size * TINY.hidden_size * 2
    assert b[1] - b[0] == pytest.approx(2 * TINY.num_hidden_layers * expert_bytes)
    # FLOPs do not depend on the union (each token runs top-k experts) ...
    assert forward_cost(TINY, 16, 2).flops == forward_cost(TINY, 16, 8).flops
    # ... and grow with the tokens, faster than linearly in-block (O(L^2))
    f = [forward_cost(TINY, t, 8) for t in (8, 16, 32)]
    assert f[0].flops < f[1].flops < f[2].flops
    att = [x.flops_by_component["block_attention"] for x in f]
    assert att[2] / att[1] > att[1] / att[0] * 0.99 and att[2] > 3 * att[1]


def test_lm_head_flops_only_for_block_slots_bytes_once():
    fc = forward_cost(BIG, 64, 64, n_commit_tokens=32)
    assert fc.flops_by_component["lm_head"] == 2 * 32 * BIG.vocab_size * BIG.hidden_size
    assert fc.bytes_by_component["lm_head"] == 2 * BIG.vocab_size * BIG.hidden_size
    assert fc.bytes_by_component["embedding"] == 64 * BIG.hidden_size * 2
    commit_only = forward_cost(BIG, 32, 32, n_commit_tokens=32)
    assert commit_only.bytes_by_component["lm_head"] == commit_only.flops_by_component["lm_head"] == 0


def test_commit_writes_state_once():
    plain = forward_cost(BIG, 32, 32)
    fused = forward_cost(BIG, 64, 32, n_commit_tokens=32)
    assert plain.bytes_by_component["state_write"] == 0
    assert fused.bytes_by_component["state_write"] == fused.bytes_by_component["state_read"]
    # GDN fp32 S [32,128,128] + conv tail [3, 8192] bf16 x 30 layers, attention S [2,256,256] x 10
    assert fused.bytes_by_component["state_read"] == 30 * (32 * 128 * 128 * 4 + 3 * 8192 * 2) + 10 * 2 * 256 * 256 * 4
    # delta rule: 5 Dk Dv per token per head
    assert fused.flops_by_component["state_write"] == 32 * (30 * 5 * 32 * 128 * 128 + 10 * 5 * 2 * 256 * 256)


def test_per_layer_union_equals_scalar_union():
    a = forward_cost(BIG, 32, 20)
    b = forward_cost(BIG, 32, np.full(40, 20))
    assert a.bytes_read == b.bytes_read and a.flops == b.flops


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_tokens=0, expert_union=8), "n_tokens"),
        (dict(n_tokens=4, expert_union=9), "outside"),  # more than E = 8
        (dict(n_tokens=1, expert_union=3), "outside"),  # more than 1 token x top-2
        (dict(n_tokens=4, expert_union=[2, 2]), "MoE layers"),
        (dict(n_tokens=4, expert_union=2, n_commit_tokens=1, block_len=4), "must equal"),
        (dict(n_tokens=4, expert_union=2, memory_mode="kv"), "memory_mode"),
        (dict(n_tokens=4, expert_union=2, window=8), "state\\+window"),
    ],
    ids=["no-tokens", "union>E", "union>T*k", "wrong-layers", "T!=C+L", "bad-mode", "window-without-mode"],
)
def test_forward_cost_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        forward_cost(TINY, **kwargs)


def test_window_mode_needs_a_window():
    with pytest.raises(ValueError, match="needs a window"):
        forward_cost(BIG, 32, 32, memory_mode="state+window")
    fc = forward_cost(BIG, 32, 32, memory_mode="state+window", window=64)
    assert fc.bytes_by_component["window_kv"] == 10 * 2 * 2 * 256 * 2 * 64


# ------------------------------------------------------------------ devices, roofline
def test_device_table_has_every_listed_device_with_a_source():
    for name in ("h800", "h100-sxm", "h200", "a100-80gb", "b200", "rtx-4090"):
        d = DEVICES[name]
        assert d.bandwidth_bytes_per_s > 0 and d.peak_flops > 0
        assert any(word in d.source.lower() for word in ("datasheet", "whitepaper", "specification"))
    assert cost.DEFAULT_DEVICE == "h800"
    assert DEVICES["h800"].bandwidth_bytes_per_s == 3.35e12
    assert ridge_point("h800") == pytest.approx(989.4e12 / 3.35e12)


def test_roofline_picks_the_max():
    d = Device("toy", bandwidth_bytes_per_s=10.0, peak_flops=100.0, source="test")
    assert roofline_time_s(50, 100, d) == 5.0  # bandwidth bound
    assert roofline_time_s(5, 1000, d) == 10.0  # compute bound
    assert ridge_point(d) == 10.0
    with pytest.raises(ValueError, match="unknown device"):
        roofline_time_s(1, 1, "tpu-v9")


def test_measure_this_machine_is_positive_and_cached(tmp_path):
    path = tmp_path / "probe.json"
    d = measure_this_machine(path, size_bytes=4 * 2**20, matmul_n=64, budget_s=0.05)
    assert d.name == "this-machine" and d.bandwidth_bytes_per_s > 0 and d.peak_flops > 0
    assert path.is_file() and json.loads(path.read_text())["bandwidth_bytes_per_s"] == d.bandwidth_bytes_per_s
    again = measure_this_machine(path, size_bytes=4 * 2**20, matmul_n=64, budget_s=0.05)
    assert again == d  # from the cache


# ----------------------------------------------------------------------- projection
def test_project_tokens_per_s_ar_and_block():
    ar = project_tokens_per_s(10, [(1, 8, 0, 1)] * 10, BIG, "h800", weight_bytes=2, include_state=False)
    assert ar == pytest.approx(568.4, abs=0.1)
    # 4 tokens per 32-slot forward with union 32: 4 / 3.583 ms
    bd = project_tokens_per_s(40, [(32, 32, 0, 32)] * 10, BIG, "h800")
    assert bd == pytest.approx(4 * 3.35e12 / forward_cost(BIG, 32, 32).bytes_read)


def _rows():
    # two blocks of 32 on clover-test: first forwards plain, one fused commit (64 tokens)
    rows = []
    for i, (n, written, u) in enumerate([(32, 10, 8), (32, 12, 7), (32, 10, 8), (64, 16, 8), (32, 16, 6)]):
        rows.append({"n_tokens_forward": n, "expert_union": np.full(4, u), "n_written": written,
                     "block_len": 32, "wall_s": 0.01})
    return rows


def test_project_trace_from_rows_and_assumptions():
    rows = _rows()
    p = project_trace(rows, "h800", union_assumption="independent", source_config=TINY)
    assert p.tokens_written == 64 and p.n_forwards == 5
    assert p.tokens_per_forward == pytest.approx(12.8)
    assert p.measured_wall_s == pytest.approx(0.05) and p.measured_tokens_per_s == pytest.approx(1280)
    assert p.source is not None and p.source.config_name == "clover-test"
    # independent: expected_union(256, 8, T) for T = 32 (x4) and 64 (x1)
    exp = (4 * expected_union(256, 8, 32) + expected_union(256, 8, 64)) / 5
    assert p.target.mean_expert_union == pytest.approx(exp)
    fw = [(32, expected_union(256, 8, 32), 0, 32)] * 3 + [(64, expected_union(256, 8, 64), 32, 32),
                                                         (32, expected_union(256, 8, 32), 0, 32)]
    assert p.target.tokens_per_s == pytest.approx(project_tokens_per_s(64, fw, BIG, "h800"))

    frac = project_trace(rows, "h800", union_assumption="measured_fraction", source_config=TINY)
    # the fractions of 8 experts (1, 7/8, 1, 1, 6/8) carried over to 256
    assert frac.target.mean_expert_union == pytest.approx(256 * (3 + 7 / 8 + 6 / 8) / 5)
    fixed = project_trace(rows, "h800", union_assumption=17, source_config=TINY)
    assert fixed.target.mean_expert_union == pytest.approx(17)
    assert fixed.target.tokens_per_s > p.target.tokens_per_s > frac.target.tokens_per_s
    rel = project_trace(rows, "h800", union_assumption="measured_vs_independent", source_config=TINY)
    assert 8 <= rel.target.mean_expert_union <= 256
    with pytest.raises(ValueError, match="union_assumption"):
        project_trace(rows, "h800", union_assumption="guess", source_config=TINY)


def test_project_trace_duck_typed_object_without_source_config():
    steps = [SimpleNamespace(n_tokens_forward=r["n_tokens_forward"], expert_union=r["expert_union"],
                             accepted=np.ones(r["n_written"], bool), forced=np.zeros(1, bool),
                             eos_filled=np.zeros(1, bool), tokens=np.zeros(32), wall_s=0.01) for r in _rows()]
    trace = SimpleNamespace(steps=steps, summary=lambda: {"wall_s": 0.1}, model_id="clover-test",
                            decode_config={"block_size": 32})
    p = project_trace(trace, "h100-sxm", union_assumption="independent")
    assert p.source is not None and p.source.config_name == "clover-test"  # preset model_id
    assert p.tokens_written == 64 and p.measured_tokens_per_s == pytest.approx(640)
    anon = SimpleNamespace(steps=steps, summary=lambda: {"wall_s": 0.1}, model_id="some/unknown/model")
    q = project_trace(anon, "h800", union_assumption=32)
    assert q.source is None and q.target.tokens_per_s > 0
    with pytest.raises(ValueError, match="needs the measured unions"):
        project_trace(anon, "h800", union_assumption="measured_fraction")


def test_project_trace_columns_table():
    rows = _rows()
    table = {k: [r[k] for r in rows] for k in rows[0]}
    a = project_trace(table, "h800", union_assumption="independent", source_config=TINY)
    b = project_trace(rows, "h800", union_assumption="independent", source_config=TINY)
    assert a == b


def test_cli_prints_breakdown_and_devices(capsys):
    assert cost.main(["--config", "clover-35b-a3b", "--device", "h800", "--tokens", "32", "--union", "32"]) == 0
    out = capsys.readouterr().out
    for word in ("routed_experts", "lm_head", "state_read", "total", "arithmetic intensity", "2.037x", "568.4"):
        assert word in out
    assert cost.main(["--list-devices"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in DEVICES)
    assert cost.main(["--config", "clover-test", "--union", "99"]) == 2
    assert "outside" in capsys.readouterr().err



@pytest.mark.parametrize("kernel", [0, 3])
def test_param_counts_and_state_bytes_with_and_without_attention_conv(kernel):
    import dataclasses

    from clover_engine.backbones.clover.model import CloverModel

    cfg = dataclasses.replace(TINY, attention_conv_kernel_dim=kernel)
    assert cost.param_counts(cfg)["total"] == sum(p.numel() for p in CloverModel(cfg).parameters())
    channels = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    assert cost.param_counts(cfg)["attention_conv"] == channels * kernel
    # the conv tail ((kernel-1) x channels activations per attention layer) is read as state
    extra = cost.forward_cost(cfg, 32, 8).bytes_by_component["state_read"] - \
        cost.forward_cost(TINY, 32, 8).bytes_by_component["state_read"]
    assert extra == max(kernel - 1, 0) * channels * 2 * cfg.num_full_layers


def test_meter_memo_by_summed_union_is_exact():
    """The decode's cost meter prices a (C, L, sum of the union) key once: every cost it returns equals
    forward_cost of that forward's own per-layer union, component by component."""
    import random

    from clover_engine.cost.meter import CostMeter
    from clover_engine.training.surgery import tiny_config

    cfg = tiny_config()
    meter = CostMeter(cfg, 4, "state+window", 512, 32)
    rng = random.Random(0)
    for _ in range(200):
        u = [rng.randint(2, 8) for _ in range(cfg.num_hidden_layers)]
        C = rng.choice([0, 32])
        got = meter.forward(C, 32, u, context_len=0)
        want = forward_cost(cfg, C + 32, u, weight_bytes=4, n_commit_tokens=C, block_len=32,
                            memory_mode="state+window", window=512, commit_block_len=32)
        assert got.to_dict() == want.to_dict()
    assert len(meter._memo) < 100  # keys repeat: far fewer pricings than forwards


def test_formulas_are_picked_by_cost_family():
    """forward_cost and the meter price a forward with its cost family's formulas: from the backbone's
    capabilities when given, else from the config's fields (a trace recorded before capabilities)."""
    from clover_engine.backbones.base import Capabilities
    from clover_engine.cost import cost_family, dense_forward_cost
    from clover_engine.cost.dense import recompute_forward_cost
    from clover_engine.cost.meter import CostMeter

    dense = dict(backbone="transformers", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=100)
    assert cost_family(TINY) == cost_family("clover-test") == "clover"
    assert cost_family(dense) == "kv_cache" and cost_family(dict(dense, kv_cache=False)) == "recompute"
    kv = forward_cost(dense, 8, None, 2, 0, 8, context_len=50)
    assert kv.to_dict() == dense_forward_cost(dense, 8, 2, 0, 8, context_len=50).to_dict()
    # the capabilities name the family, whatever the config's legacy fields say
    caps = Capabilities(family="masked_diffusion", cost_family="recompute")
    want = recompute_forward_cost(dense, 8, 2, 0, 8, context_len=50).to_dict()
    for given in (caps, caps.to_dict()):
        assert cost_family(dense, given) == "recompute"
        assert forward_cost(dense, 8, None, 2, 0, 8, context_len=50, capabilities=given).to_dict() == want
    meter = CostMeter(dense, 2, "state", 0, 8, capabilities=caps)
    assert meter.cost_family == "recompute" and meter._memo is None
    assert meter.forward(0, 8, None, context_len=50).to_dict() == want
    assert CostMeter(TINY, 2, "state", 0, 8).cost_family == "clover"
    with pytest.raises(TypeError, match="hidden_size"):  # a recompute config without a dense shape
        forward_cost({"backbone": "diffusion_gemma"}, 8, None)
