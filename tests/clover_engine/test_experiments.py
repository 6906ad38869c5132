"""The tutorials' measurement helpers (`clover_engine.experiments`): hand-built runs with known
answers for the reductions, and real decodes of two held-out tasks with the bundled model.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_experiments.py -q``
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from clover_engine import experiments as X
from clover_engine.data.agent import eval_tasks
from clover_engine.decoding.decoder import DecodeConfig

EOS = 3


def _run(target, tokens, hit_eos=True, prompt_len=0, writes=(), steps=(), **kw) -> X.TaskRun:
    """A TaskRun by hand. writes: (pos, token, conf, kind); steps: (masked, passed, forced)."""
    w = np.array(writes, dtype=np.float64).reshape(-1, 4)
    s = np.array(steps, dtype=np.int64).reshape(-1, 3)
    base = {"setting": "x", "task": 0, "block_size": 4, "threshold": 0.9, "prompt_len": prompt_len,
                "target": np.asarray(target, np.int64), "tokens": np.asarray(tokens, np.int64), "hit_eos": hit_eos,
                "text": "", "nfe": max(1, len(s)), "n_forced": int((w[:, 3] == X.KIND_FORCED).sum()), "wall_s": 1.0,
                "exact_match": False, "json_valid": False, "name_correct": False, "fields": [],
                "write_pos": w[:, 0].astype(np.int64), "write_token": w[:, 1].astype(np.int64),
                "write_conf": w[:, 2].astype(np.float32), "write_kind": w[:, 3].astype(np.int8),
                "write_slot": w[:, 0].astype(np.int64) % 4, "write_iter": np.zeros(len(w), np.int64),
                "step_masked": s[:, 0], "step_passed": s[:, 1], "step_forced": s[:, 2].astype(bool),
                "step_block": np.zeros(len(s), np.int64)}
    base.update(kw)
    return X.TaskRun(**base)


def test_answer_correctness_is_the_alignment_with_the_target():
    r = _run([10, 11, 12, EOS], [10, 99, 12], writes=[(0, 10, 0.99, 0), (1, 99, 0.5, 1), (2, 12, 0.95, 0),
                                                     (3, EOS, 0.97, 0)])
    assert r.answer.tolist() == [10, 99, 12, EOS]
    assert r.answer_correct.tolist() == [True, False, True, True]
    assert r.write_correct.tolist() == [True, False, True, True]
    # a dropped token does not make what follows wrong; an inserted one is the only error
    assert _run([1, 2, 3, 4, 5, EOS], [1, 3, 4, 5]).answer_correct.all()
    assert _run([1, 2, 3, EOS], [1, 2, 9, 3]).answer_correct.tolist() == [True, True, False, True, True]
    assert _run([1, 2, EOS], [1, 2, 30], hit_eos=False).answer_correct.tolist() == [True, True, False]


def test_calibration_bins_wrong_shares():
    r = _run([1, 2, 3, 4], [1, 7, 3, 5], hit_eos=False,
             writes=[(0, 1, 0.99, 0), (1, 7, 0.3, 1), (2, 3, 0.995, 0), (3, 5, 0.85, 0), (3, 5, float("nan"), 2)])
    c = X.calibration([r], edges=(0.0, 0.8, 0.99, 1.0))
    assert c["n"].tolist() == [1, 1, 2]  # the NaN (EOS-filled) write is left out
    assert c["n_wrong"].tolist() == [1, 1, 0]
    assert c["n_forced"].tolist() == [1, 0, 0]
    np.testing.assert_allclose(c["wrong_share"], [1.0, 1.0, 0.0])
    np.testing.assert_allclose(c["mean_conf"], [0.3, 0.85, (0.99 + 0.995) / 2], rtol=1e-6)
    assert X.calibration([r], edges=(0.0, 1.0))["n"].tolist() == [4]  # 1.0 sits in the last, closed bin
    empty = X.calibration([r], edges=(0.0, 0.1, 1.0))
    assert empty["n"].tolist() == [0, 4] and math.isnan(empty["wrong_share"][0])
    for bad in ((0.5,), (0.0, 0.5, 0.5), (-0.1, 1.0), (0.0, 1.5)):
        with pytest.raises(ValueError, match="edges"):
            X.calibration([r], edges=bad)


def test_slot_errors_group_answer_tokens_by_absolute_slot():
    # prompt of 3 tokens, blocks of 4: answer positions 0..3 sit in slots 3, 0, 1, 2
    r = _run([5, 6, 7, 8, EOS], [5, 6, 0], hit_eos=True, prompt_len=3)
    s = X.slot_errors([r], block_size=4)
    assert s["n"].tolist() == [1, 1, 1, 1]
    assert s["errors"].tolist() == [0, 1, 0, 0]  # answer [5, 6, 0, EOS]: only the 0 (slot 1) is off the alignment
    np.testing.assert_allclose(s["rate"], [0, 1, 0, 0])
    assert X.slot_errors([r], block_size=8)["n"].tolist() == [0, 0, 0, 1, 1, 1, 1, 0]
    assert np.isnan(X.slot_errors([r], block_size=8)["rate"][0])
    with pytest.raises(ValueError):
        X.slot_errors([r], block_size=0)
    np.testing.assert_allclose(X.grouped_rate(s["errors"], s["n"], 2), [0.5, 0.0])
    with pytest.raises(ValueError):
        X.grouped_rate(s["errors"], s["n"], 3)


def test_clean_distance_counts_from_the_last_token_fixed_before_the_forward():
    # blocks of 4 from answer position 0: iteration 0 writes positions 0 and 2, iteration 1 writes 1 and 3;
    # the next block's first forward writes 4..7 at once (its history ends at 3)
    writes = [(0, 5, 0.99, 0), (2, 7, 0.97, 0), (1, 6, 0.9, 1), (3, 9, 0.5, 1),
              (4, 1, 0.99, 0), (5, 1, 0.99, 0), (6, 1, 0.99, 0), (7, 1, 0.99, 0)]
    r = _run([5, 6, 7, 8, 1, 1, 1, 1, EOS], [5, 6, 7, 9, 1, 1, 1, 1], hit_eos=False, writes=writes,
             write_iter=np.array([0, 0, 1, 1, 0, 0, 0, 0]))
    assert X.clean_distance(r).tolist() == [1, 3, 1, 1, 1, 2, 3, 4]
    d = X.distance_errors([r], edges=(1, 2, 3, 5))
    assert d["n"].tolist() == [4, 1, 3]  # distance 4 falls in the last bin
    assert d["n_wrong"].tolist() == [1, 0, 0]  # the 9 at position 3 (distance 1) is off the alignment
    np.testing.assert_allclose(d["wrong_share"], [0.25, 0.0, 0.0])
    # a block that begins inside the prompt: the prompt is clean, so answer position j has distance j + 1
    p = _run([5, 6, EOS], [5, 6], writes=[(0, 5, 0.99, 0), (1, 6, 0.99, 0)], prompt_len=2,
             write_slot=np.array([2, 3]))
    assert X.clean_distance(p).tolist() == [1, 2]
    # EOS-filled slots are not writes the model chose: left out
    e = _run([5, EOS], [5], writes=[(0, 5, 0.99, 0), (1, EOS, float("nan"), 2)])
    assert X.distance_errors([e])["n"].sum() == 1
    for bad in ((1,), (0, 2), (1, 3, 3)):
        with pytest.raises(ValueError, match="edges"):
            X.distance_errors([r], edges=bad)


def test_first_forward_errors_count_blocks_with_the_targets_history():
    target = [5, 6, 7, 8, EOS]
    first = {"first_pos": np.array([0, 1, 2, 3, 4, 5]), "first_token": np.array([5, 9, 7, 8, 1, 2]),
                 "first_block": np.array([0, 0, 0, 1, 1, 1]), "first_conf": np.full(6, 0.5, np.float32)}
    wrong_history = _run(target, [5, 6, 0], prompt_len=1, **first)  # block 1 starts after a wrong token
    f = X.first_forward_errors([wrong_history], block_size=4)
    assert f["n"].tolist() == [0, 1, 1, 1] and f["errors"].tolist() == [0, 0, 1, 0]
    right_history = _run(target, [5, 6, 7, 8], prompt_len=1, **first)
    f = X.first_forward_errors([right_history], block_size=4)
    # slots (1 + position) % 4; block 1 counts: position 3 right, 4 wrong (1 vs EOS), 5 past the target
    assert f["n"].tolist() == [1, 2, 2, 1] and f["errors"].tolist() == [0, 1, 2, 0]
    with pytest.raises(ValueError):
        X.first_forward_errors([right_history], block_size=0)


def test_independent_forced_fill_is_one_minus_p_to_the_m():
    assert X.independent_forced_fill(0.1, 32) == pytest.approx(0.9 ** 32)
    np.testing.assert_allclose(X.independent_forced_fill(np.array([0.05, 0.5]), 2), [0.9025, 0.25])
    assert X.independent_forced_fill(0.0, 5) == 1.0 and X.independent_forced_fill(1.0, 0) == 1.0
    with pytest.raises(ValueError):
        X.independent_forced_fill(1.2)
    with pytest.raises(ValueError):
        X.independent_forced_fill(0.5, -1)


def test_forced_fill_table_uses_the_rest_of_the_decode():
    # three iterations: (masked, passed, forced); leave-one-out pass rates: (2+0)/(4+2)=1/3,
    # (0+0)/(8+2)=0, (0+2)/(8+4)=1/6; the last has 2 masked slots and counts with min_masked=2
    r = _run([1], [1], steps=[(8, 0, 1), (4, 2, 0), (2, 0, 1)])
    t = X.forced_fill_table([r], edges=(0.0, 0.1, 0.2, 1.0))
    assert t["n"].tolist() == [1, 1, 1]
    np.testing.assert_allclose(t["mean_p"], [0.0, 1 / 6, 1 / 3])
    np.testing.assert_allclose(t["measured"], [0.0, 1.0, 1.0])
    np.testing.assert_allclose(t["independent"], [1.0, (5 / 6) ** 2, (2 / 3) ** 8])
    assert t["n_forced"].tolist() == [0, 1, 1]
    t3 = X.forced_fill_table([r], edges=(0.0, 1.0), min_masked=3)
    assert t3["n"].tolist() == [2]
    empty = X.forced_fill_table([r], edges=(0.0, 1.0), min_masked=9)
    assert empty["n"].tolist() == [0] and math.isnan(empty["measured"][0])
    assert X.forced_fill_table([r], edges=(0.0, 1.0), max_masked=4)["n"].tolist() == [2]
    with pytest.raises(ValueError):
        X.forced_fill_table([r], min_masked=0)
    q = np.array([(2 / 3) ** 8, 1.0, (5 / 6) ** 2])
    ex = X.forced_fill_excess([r])
    assert ex["n"] == 3 and ex["measured"] == 2
    assert ex["expected"] == pytest.approx(q.sum()) and ex["sd"] == pytest.approx(np.sqrt((q * (1 - q)).sum()))
    assert ex["z"] == pytest.approx((2 - q.sum()) / ex["sd"]) and ex["ratio"] == pytest.approx(2 / q.sum())
    none = X.forced_fill_excess([r], min_masked=9)
    assert none["n"] == 0 and math.isnan(none["z"]) and math.isnan(none["ratio"])


def test_knee_index():
    x = [0.80, 0.85, 0.90, 0.95, 0.99]
    assert X.knee_index(x, [0.1, 0.5, 0.55, 0.57, 0.58]) == 1  # rises fast, then flat
    assert X.knee_index(x, [3.0, 2.9, 2.8, 2.0, 1.0]) == 2  # flat, then falls
    assert X.knee_index(x[::-1], [0.58, 0.57, 0.55, 0.5, 0.1]) == 3  # decreasing x works too
    x, y = [0, 1, 2, 3], [0, 0, 0, 1]  # flat, then up: every interior point under the chord
    assert X.knee_index(x, y, bend="below") == 2 and X.knee_index(x, y, bend="either") == 2
    assert X.knee_index(x, y, bend="above") == 1  # none above: the closest to it
    for bad_x, bad_y in (([0, 1], [0, 1]), ([0, 1, 1], [0, 1, 2]), ([0, 1, 2], [0, 1]), ([0, 1, 2], [0, np.nan, 1])):
        with pytest.raises(ValueError):
            X.knee_index(bad_x, bad_y)
    with pytest.raises(ValueError, match="bend"):
        X.knee_index(x, y, bend="up")


def test_summarize_counts():
    a = _run([1, 2, EOS], [1, 2], writes=[(0, 1, 0.99, 0), (1, 2, 0.5, 1), (2, EOS, 0.99, 0)],
             steps=[(3, 1, 0), (2, 0, 1), (1, 1, 0)], exact_match=True,
             fields=[{"correct": True}, {"correct": False}], nfe=3, wall_s=0.5)
    b = _run([1, 2, EOS], [9], hit_eos=False, steps=[(3, 0, 1)], nfe=1, wall_s=0.5, n_forced=1)
    s = X.summarize([a, b])
    assert s["n_tasks"] == 2 and s["exact_match"] == 0.5 and s["field_acc"] == 0.5
    assert s["tokens_per_forward"] == pytest.approx(3 / 4) and s["nfe_mean"] == 2
    assert s["forced_fill_rate"] == pytest.approx(2 / 3) and s["forced_iteration_rate"] == pytest.approx(0.5)
    assert s["token_error_rate"] == pytest.approx(1 / 4) and s["tokens_per_s"] == pytest.approx(3.0)
    with pytest.raises(ValueError):
        X.summarize([])


@pytest.fixture(scope="module")
def bundled():
    return X.load_bundled("models/clover-tiny")  # relative to the repository, not the working directory


def test_decode_tasks_records_every_write(bundled):
    model, tok = bundled
    tasks = eval_tasks(n=4)[2:4]  # task 3 is exact at 32 / 0.95 (tests/clover_engine/test_bundled_model.py)
    settings = {"bd": DecodeConfig(block_size=32, threshold=0.95, max_new_tokens=72, memory_mode="state+window"),
                "ar": DecodeConfig(block_size=1, threshold=0.95, max_new_tokens=72, memory_mode="state+window")}
    seen = []
    runs = X.decode_tasks(model, tok, tasks, settings, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (4, 4) and [r.setting for r in runs["bd"]] == ["bd", "bd"]
    for rs in runs.values():
        for r in rs:
            ans = r.answer
            # one write per answer position, each position once, and the writes spell the answer
            assert sorted(r.write_pos.tolist()) == list(range(len(ans)))
            order = np.argsort(r.write_pos)
            assert r.write_token[order].tolist() == ans.tolist()
            assert len(r.step_masked) == r.nfe and r.step_forced.sum() <= r.n_forced
            accepted = r.write_kind == X.KIND_ACCEPTED
            assert np.all(r.write_conf[accepted] >= 0.95)
            assert np.all(r.step_forced == (r.step_passed == 0))  # LowConfidence: forced iff none passed
    exact = runs["bd"][1]
    assert exact.exact_match and exact.write_correct.all() and X.slot_errors([exact])["errors"].sum() == 0
    assert X.first_forward_errors([exact])["n"].sum() > 0
    for r in runs["ar"]:  # one slot per forward: each answer position is its own block's first forward
        assert np.all(r.step_masked == 1) and r.first_pos.tolist() == list(range(len(r.answer)))
    for r in runs["bd"]:  # block 0 starts at answer position 0 with every generation slot masked
        assert r.first_pos[r.first_block == 0].tolist() == list(range((r.prompt_len // 32 + 1) * 32 - r.prompt_len))
    assert X.summarize(runs["bd"])["tokens_per_forward"] > X.summarize(runs["ar"])["tokens_per_forward"]
    with pytest.raises(ValueError):
        X.decode_tasks(model, tok, tasks, {})


def test_task_run_from_a_saved_trace_equals_the_live_one(bundled, tmp_path):
    from clover_engine.decoding.decoder import BlockDecoder
    from clover_engine.recording.trace import Trace

    model, tok = bundled
    cfg = DecodeConfig(block_size=16, threshold=0.9, max_new_tokens=40, memory_mode="state+window")
    for i, task in enumerate(eval_tasks(n=4)[2:4]):
        live = X.decode_task(model, tok, task, cfg, setting="s", index=i)
        r = BlockDecoder(model, tok, cfg).generate(task.prompt, record_trace=True)
        trace = Trace.load(r.trace.save(tmp_path / f"{i}.parquet"))
        back = X.task_run_from_trace(trace, task, tok, setting="s", index=i)
        assert r.observer_s > 0 and back.wall_s == pytest.approx(r.wall_s - r.observer_s)  # the trace's time, less its observers
        for name in X.TaskRun.__dataclass_fields__:
            a, b = getattr(live, name), getattr(back, name)
            if isinstance(a, np.ndarray):
                assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), name
            elif name != "wall_s":
                assert a == b, name
    with pytest.raises(ValueError, match="not a finished BlockDecoder decode"):
        X.task_run_from_trace(Trace(decode_config=cfg, prompt_ids=[1, 2]), task, tok)
