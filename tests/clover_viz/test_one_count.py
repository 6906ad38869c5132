"""Every view reads one count of a run's forwards and tokens, for every family (issue 62).

Each public family's tiny checkpoint is decoded in the app's state (`clover_viz.state.ExplorerState`) with its
own sampler and with threshold decoding (``low_confidence``). For each run, the status line ("done: T tokens in
N forwards"), the number cards (`clover_viz.runs.run_stats`, what both front ends draw), the Cost tab's headline
("whole run: N forwards ..., T tokens, X per forward") and the projection behind it (`project_trace`) give the
same NFE, tokens and tokens per forward. A block-causal family's prefill and commit forwards -- forwards of their
own, which no step event reports -- are counted and named in the Cost tab ("6 steps, 1 prefill, 2 commits").

Run: ``.venv/bin/python -m pytest -q tests/clover_viz/test_one_count.py``
"""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("transformers")

from clover_viz.figures.cost import as_run_mean_bytes, cost_summary_html  # noqa: E402
from clover_viz.runs import run_stats  # noqa: E402
from clover_viz.state import ExplorerState  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog, and then it runs far away."  # > one block of 8 or 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from clover_engine.backbones.block_causal import write_tiny_block_causal
    from clover_engine.backbones.llada2_moe import write_tiny_llada2_moe
    from clover_engine.backbones.llada_moe import write_tiny_llada_moe
    from clover_engine.backbones.sdar_moe import write_tiny_sdar_moe

    root = tmp_path_factory.mktemp("one-count")
    return {"fast_dllm_v2": write_tiny_block_causal(root / "fd", "Fast_dLLM_Qwen"),
            "sdar": write_tiny_block_causal(root / "sdar", "SDAR"),
            "sdar_moe": write_tiny_sdar_moe(root / "sdar-moe"),
            "llada2": write_tiny_llada2_moe(root / "llada2"),
            "llada": write_tiny_llada_moe(root / "llada-moe")}


CASES = [("fast_dllm_v2", "fast_dllm_v2"), ("fast_dllm_v2", "low_confidence"), ("sdar", "sdar"),
         ("sdar", "low_confidence"), ("sdar_moe", "sdar"), ("llada2", "llada2"), ("llada2", "llada21"),
         ("llada2", "low_confidence"), ("llada", "llada"), ("llada", "dream"), ("llada", "low_confidence")]


@pytest.mark.parametrize("family,policy", CASES, ids=[f"{f}-{p}" for f, p in CASES])
def test_the_status_line_the_cards_and_the_cost_tab_give_one_count(tiny, family, policy):
    s = ExplorerState(model_dir=str(tiny[family]), prompt=PROMPT, max_new_tokens=32, block_size=8, threshold=0.6,
                      memory_mode="state", auto_redecode=False)
    try:
        assert s.load_model() is not None, s.error
        s.policy = policy
        assert s.generate(), s.error
        assert s.wait(120) and s.status.startswith("done"), s.status
        trace = s.trace
        cards = run_stats(trace)
        m = re.match(r"done: (\d+) tokens in (\d+) ", s.status)
        assert m, s.status
        status_tokens, status_nfe = int(m.group(1)), int(m.group(2))
        proj = s.cost_projection()
        head = cost_summary_html(trace, proj)
        w = re.search(r"whole run: (\d+) forwards(?: \(([^)]*)\))?, (\d+) tokens, ([\d.]+) per forward", head)
        assert w, head
        cost_nfe, kinds, cost_tokens, cost_tpf = int(w.group(1)), w.group(2), int(w.group(3)), float(w.group(4))
        assert status_nfe == cards["nfe"] == cost_nfe == proj.n_forwards == trace.nfe
        assert status_tokens == cards["n_tokens"] == cost_tokens == proj.tokens_written
        assert cost_tpf == pytest.approx(cards["tokens_per_forward"], abs=0.006)
        # a slot is written once, as accepted or as forced: the block view's "wrote N accepted, M forced" adds up
        assert not any((st.accepted & st.forced).any() for st in trace.steps)
        extra = list(trace.decode_end.unstepped_forwards)
        assert trace.nfe == len(trace) + len(extra)  # every forward is a step or a named prefill / commit
        # the as-run bytes per forward average the same forwards: the decoder's own total over its NFE
        mean, label = as_run_mean_bytes(trace, np.asarray(trace.column("bytes_read"), dtype=np.float64))
        assert label == "mean per forward (whole run)" and label in head
        assert mean == pytest.approx(trace.decode_end.bytes_read / trace.nfe, rel=1e-9)
        if extra:
            assert all(f[5] is not None and f[5] > 0 for f in extra)  # each prefill / commit's bytes, recorded
            assert kinds is not None and kinds.startswith(f"{len(trace)} step")
            assert sum(int(n) for n in re.findall(r"(\d+) (?:prefill|commit)", kinds)) == len(extra)
        else:
            assert kinds is None
    finally:
        s.close()
        s.wait(5)


@pytest.mark.parametrize("family,policy", [("fast_dllm_v2", "fast_dllm_v2"), ("sdar", "sdar"), ("sdar_moe", "sdar"),
                                           ("sdar", "low_confidence")])
def test_a_block_past_the_checkpoints_training_is_noted_for_every_family_that_records_it(tiny, family, policy):
    """Every family whose checkpoint records the block it was trained on (Fast-dLLM v2's and SDAR's ``bd_size`` /
    ``block_size``: 8 for these tiny ones) gets the done line's note at a larger block, with its own sampler (whose
    setting is ``block_length`` for SDAR) as with threshold decoding; at the trained block it gets none."""
    s = ExplorerState(model_dir=str(tiny[family]), prompt=PROMPT, max_new_tokens=32, block_size=16, threshold=0.6,
                      memory_mode="state", auto_redecode=False)
    try:
        assert s.load_model() is not None, s.error
        trained = s.loaded_model.capabilities.largest_trained_block
        assert trained == 8
        s.policy = policy
        for block, noted in ((16, True), (8, False)):
            s.block_size = block
            assert s.generate(), s.error
            assert s.wait(120) and s.status.startswith("done"), s.status
            note = f"block {block} is past the model's training (blocks <= {trained}): expect worse text"
            assert (note in s.status) == noted, s.status
    finally:
        s.close()
        s.wait(5)


def test_a_saved_trace_keeps_the_prefill_and_commit_bytes_and_an_older_one_says_what_it_averages(tiny, tmp_path):
    import dataclasses
    import types

    from clover_engine.recording.trace import Trace

    s = ExplorerState(model_dir=str(tiny["sdar"]), prompt=PROMPT, max_new_tokens=16, block_size=8, threshold=0.6,
                      memory_mode="state", auto_redecode=False)
    try:
        assert s.load_model() is not None, s.error
        s.policy = "sdar"
        assert s.generate() and s.wait(120), s.error
        trace = s.trace
    finally:
        s.close()
        s.wait(5)
    for suffix in (".parquet", ".arrow"):
        back = Trace.load(trace.save(tmp_path / f"run{suffix}"))
        assert back.decode_end.unstepped_forwards == trace.decode_end.unstepped_forwards, suffix
    steps = np.asarray(trace.column("bytes_read"), dtype=np.float64)
    older = dataclasses.replace(trace.decode_end, unstepped_forwards=tuple(
        f[:5] for f in trace.decode_end.unstepped_forwards))  # as saved before the bytes were recorded
    mean, label = as_run_mean_bytes(types.SimpleNamespace(decode_end=older), steps)
    n = len(older.unstepped_forwards)
    assert n and label == f"mean per step ({n} prefill / commit forwards not recorded)" and mean == steps.mean()
