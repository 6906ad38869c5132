"""clover_engine.cost.per_step: a trace's per-forward cost series and roofline points, the recording
model's Clover config they price with (recorded_clover_config), and project_trace's fallback union.

On the hand-made trace of test_slot_index (writes per step 1, 1, 1, 3; tokens per step
1, 1, 1, 2; bytes 100, 200, None, 300; wall 0, 0.5, 0.25, 0.25 s).

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_cost_per_step.py -q``
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_slot_index import events  # tests/clover_engine/test_slot_index.py

from clover_engine.backbones.clover.config import CloverConfig, recorded_clover_config
from clover_engine.cost import (
    ar_step_cost,
    ar_tokens_per_s,
    attainable_flops_per_s,
    bytes_per_written_token,
    forward_cost,
    get_device,
    project_forwards_roofline,
    project_trace,
    roofline_point,
    roofline_time_s,
    target_union,
)
from clover_engine.recording.trace import Trace

NAN = np.nan


@pytest.fixture()
def trace() -> Trace:
    return Trace.from_events(events(), decode_config={"block_size": 4, "threshold": 0.5}, model_id="tiny")


def test_bytes_per_written_token(trace):
    got = bytes_per_written_token(trace)
    assert got.shape == (4,) and got.dtype == np.float64
    np.testing.assert_array_equal(got, [100.0, 200.0, NAN, 100.0])  # 300 B over 3 slots (2 + 1 EOS fill)


def test_bytes_per_written_token_is_nan_for_a_forward_that_wrote_nothing():
    from clover_engine.cost.per_step import bytes_per_written_token as f

    class Fake:  # the two accessors the function reads
        def slot_index(self):
            class I:
                n_accepted, n_forced, n_eos = np.array([0, 2]), np.array([0, 0]), np.array([0, 0])
            return I()

        def column(self, name):
            return np.array([50.0, 50.0])

    np.testing.assert_array_equal(f(Fake()), [NAN, 25.0])


def test_running_tokens_per_s(trace):
    from clover_engine.cost import running_tokens_per_s

    got = running_tokens_per_s(trace)
    # cumulative tokens 1, 2, 3, 5 (EOS fills excluded) over cumulative wall 0, 0.5, 0.75, 1.0 s
    np.testing.assert_allclose(got, [NAN, 4.0, 4.0, 5.0])
    assert np.isnan(got[0])  # no time measured yet


def test_ar_tokens_per_s_matches_the_pinned_bound():
    rate = ar_tokens_per_s("clover-35b-a3b", "h800")
    ar = ar_step_cost("clover-35b-a3b")
    assert rate == 1.0 / roofline_time_s(ar.bytes_read, ar.flops, get_device("h800"))
    assert rate == pytest.approx(568, rel=0.01)  # docs/architecture.md §7: about 568 tokens/s at 3.35 TB/s
    with pytest.raises(ValueError):
        ar_tokens_per_s("clover-35b-a3b", "no-such-device")


def test_roofline_point_and_attainable_flops():
    h800 = get_device("h800")
    ai, perf = roofline_point(1e9, 1e9, "h800")  # 1 FLOP/B: memory bound
    assert ai == 1.0 and perf == pytest.approx(h800.bandwidth_bytes_per_s)
    ai, perf = roofline_point(1e9, 1e13, h800)  # 10^4 FLOP/B: compute bound
    assert ai == 1e4 and perf == pytest.approx(h800.peak_flops)
    np.testing.assert_allclose(attainable_flops_per_s([1.0, 1e4], "h800"),
                               [h800.bandwidth_bytes_per_s, h800.peak_flops])
    assert np.shape(attainable_flops_per_s(2.0, h800)) == ()
    with pytest.raises(ZeroDivisionError):
        roofline_point(0.0, 1.0, h800)


def test_project_forwards_roofline(trace):
    cfg = CloverConfig.from_name("clover-test")
    # the trace's model ("tiny") is unknown: measured unions cannot be carried over -> independent
    pf = project_forwards_roofline(trace, cfg, "h800")
    assert pf.n_tokens.tolist() == [4, 4, 4, 7] and pf.block_len.tolist() == [4, 4, 4, 3]
    for arr in (pf.union, pf.intensity, pf.flops_per_s):
        assert arr.shape == (4,) and arr.dtype == np.float64
    for i, (n, L) in enumerate(zip(pf.n_tokens.tolist(), pf.block_len.tolist())):
        u = target_union("independent", n, None, None, cfg)
        assert pf.union[i] == u
        fc = forward_cost(cfg, n, u, 2, n - L, L, commit_block_len=4)
        assert (pf.intensity[i], pf.flops_per_s[i]) == roofline_point(fc.bytes_read, fc.flops, "h800")
    fixed = project_forwards_roofline(trace, cfg, "h800", union_assumption=3)
    k = cfg.num_experts_per_tok
    assert fixed.union.tolist() == [float(min(max(3, k), min(cfg.num_experts, n * k))) for n in (4, 4, 4, 7)]


def test_project_forwards_roofline_uses_the_recorded_model_config(trace):
    cfg = CloverConfig.from_name("clover-test")
    recorded = Trace.from_events(events(), decode_config={"block_size": 4}, model_id="clover-test")
    pf = project_forwards_roofline(recorded, "clover-35b-a3b", "h800", "measured_fraction")
    tgt = CloverConfig.from_name("clover-35b-a3b")
    # measured union 3.5 experts per layer of the source's E, carried over to the target's 256,
    # clipped at 4 tokens x top-k
    expected = target_union("measured_fraction", 4, np.array([3.0, 4.0, 2.0, 5.0]), cfg, tgt)
    assert pf.union[0] == expected == min(3.5 / cfg.num_experts * tgt.num_experts, 4 * tgt.num_experts_per_tok)
    assert expected != target_union("independent", 4, None, None, tgt)  # not the fallback


def test_empty_trace_projects_no_forwards():
    pf = project_forwards_roofline(Trace(), "clover-test", "h800")
    assert pf.n_tokens.shape == (0,) and pf.intensity.shape == (0,)


def test_project_trace_fallback_union(trace):
    with pytest.raises(ValueError, match="needs the measured unions and the source config"):
        project_trace(trace, "h800", "clover-test", "measured_vs_independent")
    got = project_trace(trace, "h800", "clover-test", "measured_vs_independent", fallback_union="independent")
    want = project_trace(trace, "h800", "clover-test", "independent")
    assert got == want and got.union_assumption == "independent"
    # the assumption works: no fallback taken
    recorded = Trace.from_events(events(), decode_config={"block_size": 4}, model_id="clover-test")
    got = project_trace(recorded, "h800", "clover-test", "measured_fraction", fallback_union="independent")
    assert got == project_trace(recorded, "h800", "clover-test", "measured_fraction")
    # an empty trace fails under both
    with pytest.raises(ValueError, match="no steps"):
        project_trace(Trace(), "h800", "clover-test", "measured_fraction", fallback_union="independent")


# ---------------------------------------------------------------------- recorded_clover_config
def test_recorded_clover_config_lookups(tmp_path):
    cfg = CloverConfig.from_name("clover-test")
    assert recorded_clover_config(Trace(model_id="clover-test")) == cfg
    assert recorded_clover_config(Trace(meta={"model_config": cfg.to_dict()}, model_id="x")) == cfg
    hf = Trace(meta={"model_config": {"backbone": "transformers"}}, model_id="clover-test")
    assert recorded_clover_config(hf) is None
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    assert recorded_clover_config(Trace(model_id=str(tmp_path))) == cfg
    assert recorded_clover_config(Trace(model_id="no-such-model")) is None
    assert recorded_clover_config(Trace()) is None
    (tmp_path / "config.json").write_text("{not json")
    assert recorded_clover_config(Trace(model_id=str(tmp_path))) is None  # unreadable: None, never an error
