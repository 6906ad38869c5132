"""Trace recorder: round trips through Parquet / Arrow, refusals, accessors.

Synthetic events only (no model): two blocks of block_size 4, the second one
shorter (L=3), a prompt head in block 0, one processor firing, NaN confidences
on unmasked slots, and cost fields None in one trace, floats in the other.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_trace.py -q``
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clover_engine.recording.events import BlockEnd, BlockStart, DecodeEnd, ProcessorFiring, StepEvent
from clover_engine.recording.trace import Trace
from clover_engine.recording.trace_files import FORMAT_VERSION

MASK = 99
EOS = 98
N_LAYERS = 3
TOP_K = 2
BLOCK_SIZE = 4
PROMPT = [5, 6]


def _step(rng, block_index, step_index, position_start, before, after, cost, firings=()):
    """A StepEvent turning block contents `before` into `after` (both (L,) int64)."""
    length = len(before)
    masked = before == MASK
    written = (after != before) & masked
    confidence = np.where(masked, rng.random(length), np.nan).astype(np.float32)
    candidate = np.where(masked, after, -1).astype(np.int64)
    top_tokens = np.where(masked[:, None], rng.integers(0, 50, (length, TOP_K)), -1).astype(np.int64)
    top_probs = np.where(masked[:, None], rng.random((length, TOP_K)), np.nan).astype(np.float32)
    forced = np.zeros(length, bool)
    forced[np.flatnonzero(written)[-1:]] = step_index > 0  # the last write of a later step is forced
    return StepEvent(
        block_index=block_index,
        step_index=step_index,
        position_start=position_start,
        tokens=after.astype(np.int64),
        masked_before=masked,
        confidence=confidence,
        candidate=candidate,
        top_tokens=top_tokens,
        top_probs=top_probs,
        accepted=written & ~forced,
        forced=forced,
        eos_filled=np.zeros(length, bool),
        expert_union=rng.integers(1, 9, N_LAYERS).astype(np.int64),
        state_norm=rng.random(N_LAYERS).astype(np.float32),
        memory_share=rng.random((N_LAYERS, length)).astype(np.float32),
        n_tokens_forward=length + position_start,
        wall_s=float(rng.random()),
        bytes_read=None if cost is None else 1.5e9 * (step_index + 1),
        flops=None if cost is None else 3.0e9,
        arithmetic_intensity=None if cost is None else 2.0,
        firings=firings,
    )


def _events(with_cost: bool):
    rng = np.random.default_rng(0)
    cost = 1.0 if with_cost else None
    events = []
    # Block 0: prompt in slots 0-1, two steps.
    b0 = np.array([5, 6, MASK, MASK], np.int64)
    events.append(BlockStart(0, 0, BLOCK_SIZE, 4, np.array([True, True, False, False]), b0.copy()))
    mid = np.array([5, 6, 11, MASK], np.int64)
    fire = (ProcessorFiring(name="repetition", slot=3, token=11, value=-1.25),)
    events.append(_step(rng, 0, 0, 0, b0, mid, cost, firings=fire))
    final0 = np.array([5, 6, 11, 12], np.int64)
    events.append(_step(rng, 0, 1, 0, mid, final0, cost))
    events.append(BlockEnd(0, 0, final0, 2, False))
    # Block 1: a shorter last block (L=3), one step, ends with EOS.
    b1 = np.full(3, MASK, np.int64)
    events.append(BlockStart(1, 4, BLOCK_SIZE, 3, np.zeros(3, bool), b1.copy()))
    final1 = np.array([13, EOS, EOS], np.int64)
    events.append(_step(rng, 1, 0, 4, b1, final1, cost))
    events.append(BlockEnd(1, 4, final1, 1, True))
    events.append(
        DecodeEnd(
            tokens=np.array([11, 12, 13], np.int64),
            nfe=3,
            tokens_per_forward=1.0,
            n_forced=1,
            wall_s=0.5,
            stop_reason="eos",
            bytes_read=None if cost is None else 9.0e9,
            flops=None if cost is None else 9.0e9,
        )
    )
    return events


def _record(with_cost: bool) -> Trace:
    trace = Trace(
        decode_config={"block_size": BLOCK_SIZE, "threshold": 0.9, "memory": "state"},
        model_id="clover-test",
        token_text=lambda i: f"t{i}",
        prompt_ids=PROMPT,
        meta={"device": "cpu"},
    )
    for event in _events(with_cost):
        trace(event)
    return trace


def _assert_same_event(a, b):
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray), f.name
            assert x.dtype == y.dtype, (f.name, x.dtype, y.dtype)
            assert x.shape == y.shape, (f.name, x.shape, y.shape)
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f.name
        else:
            assert x == y, (f.name, x, y)
            assert type(x) is type(y) or x is None, (f.name, type(x), type(y))


def _assert_same_trace(a: Trace, b: Trace):
    assert len(a) == len(b)
    for x, y in zip(a.steps, b.steps):
        _assert_same_event(x, y)
    assert len(a.block_starts) == len(b.block_starts) and len(a.block_ends) == len(b.block_ends)
    for x, y in zip(a.block_starts + a.block_ends, b.block_starts + b.block_ends):
        _assert_same_event(x, y)
    _assert_same_event(a.decode_end, b.decode_end)
    assert a.decode_config == b.decode_config
    assert a.model_id == b.model_id
    assert a.prompt_ids == b.prompt_ids
    assert a.meta == b.meta
    assert a.vocab == b.vocab
    assert a.summary() == b.summary()


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".feather"])
@pytest.mark.parametrize("with_cost", [False, True], ids=["cost=None", "cost=float"])
def test_round_trip_is_exact(tmp_path, suffix, with_cost):
    trace = _record(with_cost)
    path = trace.save(tmp_path / f"run{suffix}")
    loaded = Trace.load(path)
    _assert_same_trace(trace, loaded)
    # the recorded events are the originals, so compare against them too
    steps = [e for e in _events(with_cost) if isinstance(e, StepEvent)]
    for x, y in zip(steps, loaded.steps):
        _assert_same_event(x, y)
    assert loaded.step(-1).tokens.shape == (3,)  # the shorter last block
    assert loaded.step(0).memory_share.shape == (N_LAYERS, 4)
    assert loaded.step(0).firings == (ProcessorFiring("repetition", 3, 11, -1.25),)
    assert np.isnan(loaded.step(0).confidence[:2]).all()
    if not with_cost:
        assert loaded.step(0).bytes_read is None and loaded.decode_end.flops is None


def test_replay_order_matches_recording(tmp_path):
    events = _events(True)
    loaded = Trace.load(_record(True).save(tmp_path / "run.parquet"))
    replayed = list(loaded.iter_events())
    assert [type(e) for e in replayed] == [type(e) for e in events]
    for x, y in zip(events, replayed):
        _assert_same_event(x, y)


def test_file_metadata(tmp_path):
    path = _record(True).save(tmp_path / "run.parquet")
    meta = pq.read_schema(path).metadata
    assert meta[b"format_version"] == str(FORMAT_VERSION).encode()
    assert meta[b"created_by"] == b'"clover-explorer"'
    assert b'"block_size": 4' in meta[b"decode_config"]
    assert meta[b"model_id"] == b'"clover-test"'


def test_vocab_covers_every_token(tmp_path):
    trace = _record(False)
    seen = set(PROMPT)
    for s in trace.steps:
        for arr in (s.tokens, s.candidate, s.top_tokens):
            seen |= set(arr[arr >= 0].tolist())
    assert seen <= set(trace.vocab)
    assert all(trace.vocab[i] == f"t{i}" for i in seen)
    loaded = Trace.load(trace.save(tmp_path / "run.arrow"))
    assert loaded.vocab == trace.vocab
    assert loaded.token_str(EOS) == f"t{EOS}"
    assert loaded.token_str(-1) == ""
    assert loaded.token_str(12345) == "<12345>"  # unknown, and no tokenizer on replay


def test_version_mismatch_is_refused(tmp_path):
    path = _record(False).save(tmp_path / "run.parquet")
    table = pq.read_table(path)
    meta = dict(table.schema.metadata)
    meta[b"format_version"] = b"999"
    pq.write_table(table.replace_schema_metadata(meta), path)
    with pytest.raises(ValueError, match=r"format_version 999.*re-record"):
        Trace.load(path)


def test_file_without_clover_metadata_is_refused(tmp_path):
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), path)
    with pytest.raises(ValueError, match="no clover-explorer metadata"):
        Trace.load(path)


def test_random_bytes_are_refused(tmp_path):
    path = tmp_path / "noise.parquet"
    path.write_bytes(np.random.default_rng(1).bytes(256))
    with pytest.raises(ValueError, match="not a trace file"):
        Trace.load(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.parquet"
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        Trace.load(path)


def test_unknown_suffix_is_refused(tmp_path):
    with pytest.raises(ValueError, match="suffix"):
        _record(False).save(tmp_path / "run.csv")


def test_to_pandas_one_row_per_forward():
    trace = _record(True)
    df = trace.to_pandas()
    assert len(df) == trace.nfe == len(trace) == 3
    assert df["memory_share"].iloc[0].shape == (N_LAYERS, 4)
    assert df["tokens"].iloc[2].shape == (3,)
    assert df["bytes_read"].dtype == np.float64
    assert np.isnan(_record(False).to_pandas()["flops"]).all()


def test_accessors():
    trace = _record(False)
    assert [b["length"] for b in trace.blocks] == [4, 3]
    assert [b["n_steps"] for b in trace.blocks] == [2, 1]
    assert trace.blocks[1]["hit_eos"] and not trace.blocks[0]["hit_eos"]
    assert trace.column("state_norm").shape == (3, N_LAYERS)  # same shape every step: stacked
    assert isinstance(trace.column("tokens"), list)  # L differs: per-step list
    assert trace.column("step_index").tolist() == [0, 1, 0]
    assert np.isnan(trace.column("bytes_read")).all()
    np.testing.assert_array_equal(trace.generated_tokens, [11, 12, 13])
    summary = trace.summary()
    assert summary["nfe"] == 3 and summary["stop_reason"] == "eos" and summary["bytes_read"] is None
    with pytest.raises(ValueError, match="unknown StepEvent field"):
        trace.column("nope")


def test_unfinished_trace_derives_totals():
    trace = Trace()
    for event in _events(True)[:-1]:  # no DecodeEnd
        trace(event)
    np.testing.assert_array_equal(trace.generated_tokens, [11, 12, 13, EOS, EOS])  # EOS id unknown
    summary = trace.summary()
    assert summary["nfe"] == 3 and summary["n_forced"] == 1 and summary["stop_reason"] is None
    assert summary["bytes_read"] == pytest.approx(1.5e9 * (1 + 2 + 1))
    assert trace.vocab == {}  # no token_text given


def test_refuses_foreign_objects_and_events_after_the_end():
    trace = _record(False)
    with pytest.raises(ValueError, match="new Trace"):
        trace(_events(False)[0])
    with pytest.raises(TypeError, match="StepEvent"):
        Trace()("not an event")
    with pytest.raises(TypeError, match="JSON"):
        Trace(decode_config={"fn": object()})


def test_empty_trace_round_trips(tmp_path):
    loaded = Trace.load(Trace(model_id="m").save(tmp_path / "empty.parquet"))
    assert len(loaded) == 0 and loaded.steps == [] and loaded.model_id == "m"
    assert loaded.column("memory_share").shape[0] == 0
