"""clover_engine.cost: a recorded run's decode phase (the prompt forward left out) beside its whole
run, and the dtype its recorded bytes were priced at.

The prompt forward -- block 0's first forward, which folds the prompt's whole blocks into
history with the first block -- is prefill: the autoregressive line has none, so the Cost tab
sets the decode phase beside it (issue 35, item 6).

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_cost_decode_phase.py -q``
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.cost import (
    DecodePhase,
    ar_break_even_tokens_per_forward,
    ar_tokens_per_s,
    dtype_name,
    project_forwards,
    project_trace,
    prompt_forward_mask,
    recorded_weight_bytes,
    target_union,
)
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.backbones.clover.model import random_model

TINY = CloverConfig.from_name("clover-test")


def _rows(prompt_blocks: int = 2) -> list[dict]:
    """Block 0 opens with a forward carrying ``prompt_blocks`` x 32 prompt tokens plus its 32 slots,
    then: one more step of block 0, the fused commit of block 0 into block 1 (64), two more steps."""
    shape = [(0, 0, 32 * prompt_blocks + 32, 9, 8), (0, 1, 32, 23, 7),
             (1, 0, 64, 12, 8), (1, 1, 32, 10, 6), (1, 2, 32, 10, 6)]
    return [{"block_index": b, "step_index": st, "n_tokens_forward": n, "expert_union": np.full(4, u),
             "n_written": w, "accepted": np.arange(32) < w, "forced": np.zeros(32, bool), "block_len": 32,
             "wall_s": 0.01 * (i + 1)}
            for i, (b, st, n, w, u) in enumerate(shape)]


def test_prompt_forward_mask_is_block_zeros_first_forward_with_a_commit():
    rows = _rows()
    np.testing.assert_array_equal(prompt_forward_mask(rows), [True, False, False, False, False])
    # a prompt shorter than a block only pre-fills block 0's head: no forward carries a prompt block,
    # and block 1's fused commit (64 tokens) is a decode forward, not a prompt forward
    short = _rows(prompt_blocks=0)
    assert not prompt_forward_mask(short).any()
    # rows without block/step indices read in order: the first row, when it carries a commit
    bare = [{k: v for k, v in r.items() if k not in ("block_index", "step_index")} for r in rows]
    np.testing.assert_array_equal(prompt_forward_mask(bare), prompt_forward_mask(rows))
    with pytest.raises(TypeError, match="per-step rows"):
        prompt_forward_mask(42)


def test_decode_phase_leaves_out_exactly_the_prompt_forward():
    rows = _rows()
    p = project_trace(rows, "h800", union_assumption="independent", source_config=TINY)
    d = p.decode_phase
    assert isinstance(d, DecodePhase)
    assert d.prompt_forwards == (0,) and d.prompt_tokens == 64 and d.prompt_tokens_written == 9
    assert p.n_forwards == 5 and d.n_forwards == 4
    assert p.tokens_written == 64 and d.tokens_written == 64 - 9
    assert d.tokens_per_forward == pytest.approx(55 / 4)
    # the measured wall time less the prompt forward's own
    assert p.measured_wall_s == pytest.approx(0.15) and d.measured_wall_s == pytest.approx(0.14)
    assert d.measured_tokens_per_s == pytest.approx(55 / 0.14)
    # the decode phase's projection is project_forwards over forwards 2..5 alone, with their tokens
    big = CloverConfig.from_name("clover-35b-a3b")
    fw = [(r["n_tokens_forward"], target_union("independent", r["n_tokens_forward"], None, TINY, big),
           r["n_tokens_forward"] - 32, 32) for r in rows[1:]]
    want = project_forwards(55, fw, big, "h800", memory_mode="state", window=0, commit_block_len=None)
    assert d.target.n_forwards == 4 and d.target.tokens_written == 55
    assert d.target.time_s == pytest.approx(want.time_s) and d.target.bytes_read == pytest.approx(want.bytes_read)
    assert d.target.tokens_per_s == pytest.approx(want.tokens_per_s)
    # whole run = decode phase + the prompt forward, forward by forward
    assert p.target.time_s == pytest.approx(d.target.time_s + p.target.time_s_per_forward[0])
    assert d.source is not None and d.source.bytes_read == pytest.approx(sum(p.source.bytes_per_forward[1:]))


def test_decode_phase_is_the_whole_run_without_a_prompt_forward_and_none_when_only_prompt():
    rows = _rows(prompt_blocks=0)
    p = project_trace(rows, "h800", union_assumption="independent", source_config=TINY)
    d = p.decode_phase
    assert d.prompt_forwards == () and d.prompt_tokens == 0 and d.n_forwards == p.n_forwards
    assert d.target.tokens_per_s == pytest.approx(p.target.tokens_per_s)
    only = project_trace(_rows()[:1], "h800", union_assumption="independent", source_config=TINY)
    assert only.decode_phase is None


def test_projection_subset_refuses_bad_indices():
    p = project_trace(_rows(), "h800", union_assumption="independent", source_config=TINY).target
    with pytest.raises(ValueError, match="at least one forward"):
        p.subset([], 1)
    with pytest.raises(ValueError, match="outside 0..4"):
        p.subset([5], 1)


def test_ar_break_even_tokens_per_forward():
    d = project_trace(_rows(), "h800", union_assumption="independent", source_config=TINY).decode_phase
    need = ar_break_even_tokens_per_forward(d.target, "clover-35b-a3b", "h800")
    # at `need` tokens per forward the decode phase's projected tokens/s equals the AR line's
    assert need * d.n_forwards / d.target.time_s == pytest.approx(ar_tokens_per_s("clover-35b-a3b", "h800"))


@pytest.mark.parametrize("dtype, want", [(torch.float32, 4.0), (torch.bfloat16, 2.0)])
def test_recorded_weight_bytes_reads_the_runs_dtype_from_its_costs(dtype, want):
    model = random_model("clover-test", dtype=dtype)
    dc = DecodeConfig(block_size=8, max_new_tokens=8, memory_mode="state+window")
    trace = BlockDecoder(model, config=dc).generate(list(range(5, 25))).trace  # 20 tokens: 2 prompt blocks
    assert recorded_weight_bytes(trace) == want
    assert dtype_name(recorded_weight_bytes(trace)) == {4.0: "fp32", 2.0: "bf16"}[want]
    assert prompt_forward_mask(trace).tolist() == [True] + [False] * (len(trace) - 1)
    assert trace.step(0).n_tokens_forward == 16 + 8  # the prompt's 2 whole blocks + the first block's 8 slots


def test_dtype_name_of_unknown_sizes():
    assert dtype_name(None) == "the run's dtype" and dtype_name(3) == "3-byte weights"


def test_the_cli_report_shows_the_decode_phase_after_the_whole_run():
    from clover_engine.cost.cli import format_trace_projection

    p = project_trace(_rows(), "h800", union_assumption="independent", source_config=TINY)
    text = format_trace_projection(p, "t.parquet")
    assert "whole run (prompt forward included): 5 forwards, 64 tokens written" in text
    assert ("decode phase (forward(s) 1 left out: the 64-token prompt's forward): 4 forwards, 55 tokens written, "
            "13.75 tokens per forward") in text
    assert f"{p.decode_phase.target.tokens_per_s:.1f}" in text.split("decode phase")[1]
    short = format_trace_projection(project_trace(_rows(0), "h800", union_assumption="independent",
                                                  source_config=TINY))
    assert "decode phase = whole run" in short
