"""clover_engine.recording.slot_index.SlotIndex through Trace.slot_index.

A hand-made trace whose every write is known (two blocks of block_size 4, the second
L=3; a prompt slot; accepted, forced and EOS-filled slots), so expected values are
written out, not recomputed.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_slot_index.py -q``
"""

from __future__ import annotations

import numpy as np
import pytest

from clover_engine.recording.events import BlockEnd, BlockStart, DecodeEnd, StepEvent
from clover_engine.recording.slot_index import WRITE_KINDS, SlotIndex
from clover_engine.recording.trace import Trace

M, EOS = 99, 2  # MASK and EOS ids
NAN = np.nan


def _step(block, k, pos, tokens, masked, conf, acc=(), forced=(), eos=(), n_fwd=4, wall=0.25, bytes_read=None):
    L = len(tokens)

    def mask(slots):
        m = np.zeros(L, dtype=bool)
        m[list(slots)] = True
        return m

    conf = np.asarray(conf, dtype=np.float32)
    masked = np.asarray(masked, dtype=bool)
    return StepEvent(
        block_index=block, step_index=k, position_start=pos, tokens=np.asarray(tokens, dtype=np.int64),
        masked_before=masked, confidence=conf, candidate=np.where(masked, 20 + np.arange(L), -1),
        top_tokens=np.full((L, 1), -1), top_probs=np.full((L, 1), NAN, dtype=np.float32),
        accepted=mask(acc), forced=mask(forced), eos_filled=mask(eos),
        expert_union=np.array([3, 4, 2, 5]), state_norm=np.ones(4, dtype=np.float32),
        memory_share=np.zeros((4, L), dtype=np.float32), n_tokens_forward=n_fwd, wall_s=wall, bytes_read=bytes_read,
    )


def events() -> list:
    """Block 0 (slot 0 = prompt): step 0 accepts slot 1, step 1 forces slot 2, step 2 accepts
    slot 3. Block 1 (L=3): one forward (commit fused: 7 tokens) accepts slots 0 and 1 (an
    EOS) and EOS-fills slot 2. Four layers (as clover-test), expert unions 3, 4, 2, 5."""
    pre = np.array([True, False, False, False])
    return [
        BlockStart(0, 0, 4, 4, pre, np.array([10, M, M, M])),
        _step(0, 0, 0, [10, 11, M, M], [0, 1, 1, 1], [NAN, 0.9, 0.3, 0.2], acc=[1], wall=0.0, bytes_read=100.0),
        _step(0, 1, 0, [10, 11, 12, M], [0, 0, 1, 1], [NAN, NAN, 0.4, 0.35], forced=[2], wall=0.5,
              bytes_read=200.0),
        _step(0, 2, 0, [10, 11, 12, 13], [0, 0, 0, 1], [NAN, NAN, NAN, 0.95], acc=[3], bytes_read=None),
        BlockEnd(0, 0, np.array([10, 11, 12, 13]), 3, False),
        BlockStart(1, 4, 4, 3, np.zeros(3, dtype=bool), np.array([M, M, M])),
        _step(1, 0, 4, [14, EOS, EOS], [1, 1, 1], [0.8, 0.7, 0.1], acc=[0, 1], eos=[2], n_fwd=7,
              bytes_read=300.0),
        BlockEnd(1, 4, np.array([14, EOS, EOS]), 1, True),
        DecodeEnd(np.array([11, 12, 13, 14]), 4, 1.0, 1, 1.0, "eos"),
    ]


@pytest.fixture()
def trace() -> Trace:
    return Trace.from_events(events(), decode_config={"block_size": 4, "threshold": 0.5}, model_id="tiny")


def f32(*values: float) -> np.ndarray:
    """Confidences as the trace holds them (float32) compared in float64."""
    return np.asarray(values, dtype=np.float32).astype(np.float64)


def test_steps_per_block_and_counts(trace):
    idx = trace.slot_index()
    assert idx.n == 4
    assert idx.steps_of == {0: [0, 1, 2], 1: [3]}
    assert idx.block_of.tolist() == [0, 0, 0, 1] and idx.block_of.dtype == np.int64
    assert idx.iter_of.tolist() == [0, 1, 2, 0]
    assert idx.n_accepted.tolist() == [1, 0, 1, 2]
    assert idx.n_forced.tolist() == [0, 1, 0, 0]
    assert idx.n_eos.tolist() == [0, 0, 0, 1]
    assert idx.block_size() == 4
    assert idx.last_step(0) == 2 and idx.last_step(1) == 3


def test_which_step_wrote_each_slot(trace):
    idx = trace.slot_index()
    assert idx.written_at[0].tolist() == [-1, 0, 1, 2]
    assert idx.written_iter[0].tolist() == [-1, 0, 1, 2]
    assert idx.written_kind[0].tolist() == ["", "accepted", "forced", "accepted"]
    np.testing.assert_array_equal(idx.written_conf[0], [NAN, *f32(0.9, 0.4, 0.95)])
    assert idx.written_at[1].tolist() == [3, 3, 3]
    assert idx.written_iter[1].tolist() == [0, 0, 0]
    assert idx.written_kind[1].tolist() == ["accepted", "accepted", "eos"]
    np.testing.assert_array_equal(idx.written_conf[1], [*f32(0.8, 0.7), NAN])  # EOS fills carry no confidence
    assert idx.eos_id == EOS  # learned from the EOS-filled slot
    assert idx.written_by(0, 1).tolist() == [False, True, True, False]
    assert idx.written_by(0, 0).tolist() == [False, True, False, False]


def test_slot_states_after_each_step(trace):
    idx = trace.slot_index()
    assert idx.slot_states(0).tolist() == ["prompt", "accepted", "masked", "masked"]
    assert idx.slot_states(1).tolist() == ["prompt", "earlier", "forced", "masked"]
    assert idx.slot_states(2).tolist() == ["prompt", "earlier", "earlier", "accepted"]
    assert idx.slot_states(3).tolist() == ["accepted", "accepted", "eos"]


def test_confidence_rows_and_writes(trace):
    idx = trace.slot_index()
    z = idx.confidence_rows(0)
    assert z.shape == (3, 4) and z.dtype == np.float64
    np.testing.assert_array_equal(z, [[NAN, *f32(0.9, 0.3, 0.2)], [NAN, NAN, *f32(0.4, 0.35)],
                                      [NAN, NAN, NAN, *f32(0.95)]])
    assert idx.writes(0) == {"accepted": ([1, 3], [0, 2]), "forced": ([2], [1]), "eos": ([], [])}
    assert idx.writes(1) == {"accepted": ([0, 1], [0, 0]), "forced": ([], []), "eos": ([2], [0])}
    assert tuple(idx.writes(1)) == WRITE_KINDS
    for bad in (idx.confidence_rows, idx.writes, idx.last_step):
        with pytest.raises(ValueError, match="block 7 has no steps"):
            bad(7)


def test_prefilled_mask(trace):
    idx = trace.slot_index()
    assert idx.prefilled(0, 4).tolist() == [True, False, False, False]
    assert idx.prefilled(0, 3).tolist() == [False] * 3  # another length: not this block's mask
    assert idx.prefilled(5, 2).tolist() == [False, False]  # unknown block


def test_index_is_kept_and_extended_while_the_trace_grows():
    live = Trace(decode_config={"block_size": 4})
    first = None
    for ev in events():
        live(ev)
        if len(live) == 0:
            continue
        idx = live.slot_index()
        first = first or idx
        assert idx is first  # one index per trace, extended in place
        fresh = SlotIndex(live)
        assert idx.n == fresh.n == len(live)
        assert idx.steps_of == fresh.steps_of
        for name in ("block_of", "iter_of", "n_accepted", "n_forced", "n_eos"):
            assert np.array_equal(getattr(idx, name), getattr(fresh, name)), name
        for b in fresh.written_at:
            for name in ("written_at", "written_iter", "written_kind"):
                assert np.array_equal(getattr(idx, name)[b], getattr(fresh, name)[b]), (name, b)
            np.testing.assert_array_equal(idx.written_conf[b], fresh.written_conf[b])


def test_index_survives_a_round_trip(trace, tmp_path):
    loaded = Trace.load(trace.save(tmp_path / "t.parquet"))
    a, b = trace.slot_index(), loaded.slot_index()
    for blk in (0, 1):
        assert a.written_at[blk].tolist() == b.written_at[blk].tolist()
        assert a.written_kind[blk].tolist() == b.written_kind[blk].tolist()
    assert b.block_size() == 4


def test_block_size_without_block_starts():
    steps = [e for e in events() if isinstance(e, StepEvent)]
    assert Trace.from_events(steps, decode_config={"block_size": 16}).slot_index().block_size() == 16
    assert Trace.from_events(steps).slot_index().block_size() == 4  # the longest block seen
    assert Trace().slot_index().block_size() == 1


def test_eos_id_from_the_model_config_wins():
    t = Trace.from_events(events(), meta={"model_config": {"eos_token_id": 13}})
    assert t.slot_index().eos_id == 13
