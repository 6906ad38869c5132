"""clover_engine.eval's account of where written tokens go wrong (`summarise_writes`): calibration among
accepted tokens, error by slot index and by distance from the last clean token, and its table rows."""

from __future__ import annotations

import numpy as np

from clover_engine.eval import format_table, summarise_writes
from clover_engine.experiments import KIND_ACCEPTED, KIND_EOS, KIND_FORCED, TaskRun

EOS = 3


def _run(target, tokens, writes, its) -> TaskRun:
    """Blocks of 4 from answer position 0; writes: (pos, token, conf, kind) in `its` iterations."""
    w = np.array(writes, np.float64)
    return TaskRun(setting="bd", task=0, block_size=4, threshold=0.95, prompt_len=0,
                   target=np.asarray(target, np.int64), tokens=np.asarray(tokens, np.int64), hit_eos=True,
                   text="", nfe=max(its) + 1, n_forced=int((w[:, 3] == KIND_FORCED).sum()), wall_s=1.0,
                   exact_match=False, json_valid=True, name_correct=True,
                   write_pos=w[:, 0].astype(np.int64), write_token=w[:, 1].astype(np.int64),
                   write_conf=w[:, 2].astype(np.float32), write_kind=w[:, 3].astype(np.int8),
                   write_slot=w[:, 0].astype(np.int64) % 4, write_iter=np.asarray(its, np.int64))


def test_summarise_writes_counts_wrong_accepted_tokens_by_confidence_slot_and_distance():
    # target 10 11 12 13 EOS; decoded 10 99 12 13 EOS. Iteration 0 accepts 10 (0.99) and the wrong 99 (0.96)
    # at distance 2; iteration 1 forces 12 (0.4); iteration 2 accepts 13 (0.97); the EOS is EOS-filled.
    r = _run([10, 11, 12, 13, EOS], [10, 99, 12, 13],
             [(0, 10, 0.99, KIND_ACCEPTED), (1, 99, 0.96, KIND_ACCEPTED), (2, 12, 0.4, KIND_FORCED),
              (3, 13, 0.97, KIND_ACCEPTED), (4, EOS, float("nan"), KIND_EOS)], [0, 0, 1, 2, 2])
    w = summarise_writes([{"run": r}, {"no": "run"}], threshold=0.95, block_size=8)
    assert w["n_accepted"] == 3 and w["wrong_share_accepted"] == round(1 / 3, 4)
    cal = w["calibration"]
    assert cal["lo"] == [0.0, 0.5, 0.8, 0.9, 0.95, 0.99] and cal["n"] == [1, 0, 0, 0, 2, 1]
    assert cal["wrong_share"] == [0.0, None, None, None, 0.5, 0.0]  # empty bins are null, not NaN, in JSON
    assert w["error_by_slot"]["n"] == [4, 1] and w["error_by_slot"]["rate"] == [0.25, 0.0]  # slots 0-3, 4-7
    dist = w["error_by_distance"]
    assert dist["lo"] == [1, 2, 3, 5, 9, 17]
    assert dist["n"] == [3, 1, 0, 0, 0, 0] and dist["wrong_share"][:2] == [0.0, 1.0]
    assert summarise_writes([{"text": "read from a sweep"}]) == {}

    table = format_table({"agent": {}, "writes": {"bd32-window": w, "ar1-window": w}})
    assert "wrong share of written tokens, agent tasks:" in table
    rows = {line[:28].strip(): line[28:].split() for line in table.splitlines()}
    assert rows["accepted >= threshold"] == ["0.333", "0.333"]
    assert rows["confidence 0.95-0.99"] == ["0.500", "0.500"] and rows["confidence 0.50-0.80"] == ["-", "-"]
    assert rows["distance from clean 2"] == ["1.000", "1.000"] and "distance from clean 17+" in rows
