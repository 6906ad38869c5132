"""clover_engine.eval through clover_engine.sweep: ``--sweep-out`` decodes the agent grid as a sweep and reports what
the built-in loop reports (timings aside); ``--from-sweep`` reads an existing sweep's results.parquet
without decoding, and names the tasks a sweep lacks."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from clover_engine.eval import main

ARGS = ["--model", "models/clover-tiny", "--tasks", "2", "--ar-tasks", "1", "--settings", "bd32-state,ar1-window",
        "--stdlib-files", "0", "--probe-tasks", "0", "--open-tasks", "0", "--workers", "1", "--threads", "1",
        "--max-new-tokens", "24"]
TIMING = ("wall_s", "tokens_per_s")


def _agent(report: dict) -> dict:
    return {s: {k: v for k, v in m.items() if k not in TIMING} for s, m in report["agent"].items()}


def test_eval_agent_grid_through_sweep(tmp_path):
    own, via, read = tmp_path / "own.json", tmp_path / "via.json", tmp_path / "read.json"
    sweep = tmp_path / "sweep"
    assert main([*ARGS, "--out", str(own)]) == 0
    assert main([*ARGS, "--out", str(via), "--sweep-out", str(sweep)]) == 0
    a, b = json.loads(own.read_text()), json.loads(via.read_text())
    assert _agent(a) == _agent(b)  # the same decodes, scored the same, per-field kinds and sources included
    assert a["agent"]["bd32-state"]["n_tasks"] == 2 and a["agent"]["ar1-window"]["n_tasks"] == 1
    assert a["exact_tasks"] == b["exact_tasks"] and a["examples"] == b["examples"]
    # the built-in loop keeps every write: calibration, error by slot and by distance per setting
    assert set(a["writes"]) == {"bd32-state", "ar1-window"}
    assert a["writes"]["bd32-state"]["n_accepted"] == sum(a["writes"]["bd32-state"]["calibration"]["n"][-2:])
    assert a["writes"]["ar1-window"]["error_by_distance"]["n"][1:] == [0] * 5  # block_size 1: every write at 1
    results = pq.read_table(sweep / "results.parquet").to_pylist()
    assert sorted((r["task_set"], r["block_size"], r["memory_mode"], r["task_id"]) for r in results) == [
        ("agent-eval:1", 1, "state+window", 0), ("agent-eval:2", 32, "state", 0), ("agent-eval:2", 32, "state", 1)]
    assert all(r["max_new_tokens"] == 24 for r in results)

    # reading the sweep back decodes nothing: the same report, timings included (they are the sweep's)
    assert main([*ARGS, "--out", str(read), "--from-sweep", str(sweep)]) == 0
    c = json.loads(read.read_text())
    assert c["agent"] == b["agent"]
    assert c["writes"] == {}  # a sweep's table keeps no per-write record
    # a setting the sweep did not run, and more tasks than it holds: named, with the command that adds them
    for extra in (["--settings", "bd32-window"], ["--tasks", "3"]):
        with pytest.raises(SystemExit, match="lacks agent tasks .* python -m clover_engine.sweep"):
            main([*ARGS, *extra, "--out", str(read), "--from-sweep", str(sweep)])
    with pytest.raises(SystemExit, match="no sweep results table"):
        main([*ARGS, "--out", str(read), "--from-sweep", str(tmp_path / "none")])
