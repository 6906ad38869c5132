"""Figures of the newcomer's explorer review: the comparison table names model, memory mode and
prompt (item 4), and the block view shows the slots a stopped run dropped (item 6).

Run: ``.venv/bin/python -m pytest tests/clover_viz/test_newcomer_figures.py -q``
"""

from __future__ import annotations

import numpy as np

from clover_viz import colors as C
from clover_viz import figures as F
from clover_viz.runs import RUN_LABELS, compare, diff_caption, dropped_at_stop
from clover_engine.recording.events import BlockStart, DecodeEnd, StepEvent
from clover_engine.recording.trace import Trace

L = 8


def stopped_trace() -> Trace:
    """One block of 8 slots, stopped after its second forward: slots 0-1 accepted, slot 2 still masked,
    slots 3 (forced) and 5 (accepted) written after it -- the run keeps 0-1 and drops 3 and 5."""
    mask = 300
    tokens = np.full(L, mask, dtype=np.int64)
    events = [BlockStart(0, 10, L, L, np.zeros(L, dtype=bool), tokens.copy())]
    masked = np.ones(L, dtype=bool)
    writes = [({0, 1}, set()), ({5}, {3})]
    for k, (acc_slots, forced_slots) in enumerate(writes):
        conf = np.where(masked, 0.5, np.nan).astype(np.float32)
        cand = np.where(masked, 70 + np.arange(L), -1).astype(np.int64)
        acc = np.isin(np.arange(L), list(acc_slots))
        forced = np.isin(np.arange(L), list(forced_slots))
        conf[acc] = 0.97
        tokens = np.where(acc | forced, cand, tokens)
        events.append(StepEvent(
            block_index=0, step_index=k, position_start=10, tokens=tokens.copy(), masked_before=masked.copy(),
            confidence=conf, candidate=cand, top_tokens=np.where(masked[:, None], cand[:, None], -1),
            top_probs=np.where(masked[:, None], conf[:, None], np.nan).astype(np.float32), accepted=acc,
            forced=forced, eos_filled=np.zeros(L, dtype=bool), expert_union=np.array([2, 3]),
            state_norm=np.ones(2, dtype=np.float32), memory_share=np.zeros((2, L), dtype=np.float32),
            n_tokens_forward=L, wall_s=0.01))
        masked = masked & ~(acc | forced)
    events.append(DecodeEnd(tokens[:2].copy(), 2, 1.0, 1, 0.02, "cancelled"))
    return Trace.from_events(events, decode_config={"block_size": L, "threshold": 0.9}, model_id="synthetic",
                             token_text=lambda i: chr(i) if i < 256 else f"<{i}>", prompt_ids=list(range(65, 75)))


def _states(fig) -> list[str]:
    cells = next(t for t in fig.data if t.name == F.BLOCK_TRACE)
    return [c[0] for row in cells.customdata for c in row][:L]


def test_the_block_view_marks_the_slots_dropped_at_stop():
    tr = stopped_trace()
    gone = dropped_at_stop(tr)
    assert gone["slots"] == [3, 5] and gone["first_gap"] == 2
    fig = F.block_figure(tr, -1)
    states = _states(fig)
    assert [i for i, s in enumerate(states) if s == C.DROPPED] == [3, 5]
    assert states[:3] == ["earlier", "earlier", "masked"]
    cells = next(t for t in fig.data if t.name == F.BLOCK_TRACE)
    flat_hover = [c[1] for row in cells.customdata for c in row]
    assert "dropped at Stop" in flat_hover[3] and "forced at iteration 2" in flat_hover[3]
    assert "slot 2 was still masked" in flat_hover[5] and "accepted at iteration 2" in flat_hover[5]
    z = [v for row in cells.z for v in row]
    assert C.STATE_CODES[C.DROPPED] <= z[3] <= C.Z_MAX  # its own colour band
    assert "<s>" in [t for row in cells.text for t in row][3]  # struck through, as in the text view
    swatch = next(t for t in fig.data if t.name == F.DROPPED_SWATCH)
    assert swatch.showlegend and swatch.marker.color == C.STATE_COLORS[C.DROPPED]
    assert "2 dropped at Stop" in fig.layout.title.text
    # the step before the end: nothing dropped yet, no legend entry; in-place update equals a fresh figure
    before = F.block_figure(tr, 0)
    assert C.DROPPED not in _states(before)
    assert not next(t for t in before.data if t.name == F.DROPPED_SWATCH).showlegend
    F.update_block_figure(before, tr, -1)
    assert before.to_dict() == fig.to_dict()
    assert F.block_trace_updates(tr, -1)[F.DROPPED_SWATCH] == {"showlegend": True}


def test_the_dropped_colour_band_sits_above_accepted():
    scale = C.block_colorscale()
    f = (C.STATE_CODES[C.DROPPED] + 0.5) / C.Z_MAX
    assert [c for p, c in scale if p <= f][-1] == C.STATE_COLORS[C.DROPPED]
    one = (C.STATE_CODES["accepted"] + 1.0) / C.Z_MAX  # an accepted cell at confidence 1
    assert [c for p, c in scale if p <= one + 1e-12][-1] == C.ACCEPTED_SCALE[-1][1]


def _cells(a, b) -> dict[str, tuple[str, str, str]]:
    table = F.compare_table(a, b, labels=RUN_LABELS).data[0]
    return {m: (x, y, d) for m, x, y, d in zip(*[list(c) for c in table.cells.values])}


def test_the_comparison_names_model_memory_mode_and_prompt(trace):
    a = {"model": "smollm2-bd", "memory_mode": "state", "prompt": "What is 2+2?", "nfe": 3, "text": "4"}
    b = {"model": "clover-tiny", "memory_mode": "state+window", "prompt": "<|im_start|>system", "nfe": 2,
         "text": "x"}
    rows = _cells(a, b)
    assert list(rows)[:3] == ["model", "memory mode", "prompt"]
    assert rows["model"] == ("smollm2-bd", "clover-tiny", "different")
    assert rows["memory mode"] == ("state", "state+window", "different")
    assert rows["prompt"][2] == "different prompts"
    assert rows["text"][2].endswith("unrelated: different prompts")
    same = _cells(a, {**a, "text": "5"})
    assert same["model"][2] == "same" and same["prompt"][2] == "same prompt"
    # the plain-words header above the text difference
    cmp = F.compare_runs(a, b)
    assert diff_caption(cmp).startswith("different prompts and different models")
    assert "unrelated answers" in diff_caption(cmp)
    assert diff_caption(F.compare_runs(a, {**a, "model": "clover-tiny"})).startswith("different models")
    assert diff_caption(F.compare_runs(a, a)) == ""
    # from two real traces, as the views call it: the trace's model id and memory mode
    real = compare(trace, trace)
    assert real["model"] == {"a": "clover-test", "b": "clover-test", "same": True}
    assert real["memory_mode"]["a"] == trace.decode_config["memory_mode"]
    assert real["prompt"]["same"] is True
    assert F.COMPARE_TABLE_HEIGHT == 110 + 24 * len(_cells(trace, trace))
