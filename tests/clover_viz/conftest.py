"""Shared fixtures for the clover_viz tests: the recorded small trace and hand-made traces.

Run: .venv/bin/python -m pytest tests/clover_viz -q
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clover_engine.recording.events import BlockEnd, BlockStart, DecodeEnd, StepEvent
from clover_engine.recording.trace import Trace

# Recorded by tests/clover_viz/record_trace.py (loud clover-test, block 8, threshold 0.4):
# 17 steps over 3 blocks with a pre-filled prompt slot, accepted, forced and EOS-filled slots.
SMALL_TRACE = Path(__file__).resolve().parents[1] / "data" / "small_trace.parquet"


@pytest.fixture(scope="module")
def trace() -> Trace:
    return Trace.load(SMALL_TRACE)


def synthetic_trace(block_size: int, lengths: list[int], prefill: int = 0, seed: int = 0, n_layers: int = 3) -> Trace:
    """A hand-made trace: blocks of the given lengths; each step accepts/forces slots at random."""
    rng = np.random.default_rng(seed)
    events = []
    pos = 0
    for b, L in enumerate(lengths):
        prefilled = np.zeros(L, dtype=bool)
        if b == 0:
            prefilled[:prefill] = True
        tokens = np.where(prefilled, 65, 300).astype(np.int64)
        events.append(BlockStart(b, pos, block_size, L, prefilled.copy(), tokens.copy()))
        masked = ~prefilled
        k = 0
        while masked.any():
            conf = np.where(masked, rng.uniform(0.1, 1.0, L), np.nan).astype(np.float32)
            cand = np.where(masked, rng.integers(66, 90, L), -1).astype(np.int64)
            acc = masked & (conf >= 0.7)
            forced = np.zeros(L, dtype=bool)
            if not acc.any():
                forced[int(np.nanargmax(np.where(masked, conf, -1)))] = True
            new = acc | forced
            tokens = np.where(new, cand, tokens)
            top_t = np.where(masked[:, None], np.stack([cand, cand + 1], 1), -1)
            top_p = np.where(masked[:, None], np.stack([conf, (1 - conf) / 2], 1), np.nan).astype(np.float32)
            events.append(StepEvent(
                block_index=b, step_index=k, position_start=pos, tokens=tokens.copy(), masked_before=masked.copy(),
                confidence=conf, candidate=cand, top_tokens=top_t, top_probs=top_p, accepted=acc, forced=forced,
                eos_filled=np.zeros(L, dtype=bool), expert_union=rng.integers(2, 8, n_layers),
                state_norm=rng.uniform(1, 5, n_layers).astype(np.float32),
                memory_share=rng.uniform(0, 1, (n_layers, L)).astype(np.float32),
                n_tokens_forward=L + (block_size if k == 0 and b > 0 else 0), wall_s=0.01,
            ))
            masked = masked & ~new
            k += 1
        events.append(BlockEnd(b, pos, tokens.copy(), k, False))
        pos += L
    gen = np.concatenate([e.tokens[~s.prefilled] for s, e in zip(
        [e for e in events if isinstance(e, BlockStart)], [e for e in events if isinstance(e, BlockEnd)])])
    nfe = sum(isinstance(e, StepEvent) for e in events)
    n_forced = sum(int(e.forced.sum()) for e in events if isinstance(e, StepEvent))
    events.append(DecodeEnd(gen, nfe, len(gen) / nfe, n_forced, 0.01 * nfe, "max_new_tokens"))
    return Trace.from_events(events, decode_config={"block_size": block_size, "threshold": 0.7},
                             model_id="synthetic", token_text=lambda i: chr(i) if i < 256 else f"<{i}>")


