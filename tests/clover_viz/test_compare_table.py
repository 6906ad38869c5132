"""`figures.compare_table` (the Panel app's and the notebook's comparison of two runs): every row
has a human label and one precision for both runs and the change (issue 35, item 8).

Run: ``.venv/bin/python -m pytest tests/clover_viz/test_compare_table.py -q``
"""

from __future__ import annotations

from clover_viz import figures as F
from clover_viz.runs import RUN_LABELS

PREVIOUS = {"block_size": 32, "threshold": 0.9, "nfe": 7, "n_tokens": 49, "tokens_per_forward": 7.0,
            "n_forced": 0, "wall_s": 0.5, "text": "get_weather(city)"}
CURRENT = {"block_size": 16, "threshold": 0.95, "nfe": 10, "n_tokens": 64, "tokens_per_forward": 6.4,
           "n_forced": 3, "wall_s": 0.26718, "text": "get_weather(town)"}


def _cells(a: dict, b: dict) -> dict[str, tuple[str, str, str]]:
    table = F.compare_table(a, b, labels=RUN_LABELS).data[0]
    assert list(table.header.values) == ["metric", *RUN_LABELS, "change"]
    cols = [list(c) for c in table.cells.values]
    return {m: (x, y, d) for m, x, y, d in zip(*cols)}


def test_every_row_has_a_human_label():
    rows = _cells(PREVIOUS, CURRENT)
    assert list(rows) == ["model", "memory mode", "prompt", "block size", "threshold", "NFE (forwards)",
                          "tokens generated", "tokens per forward", "forced fills", "wall time (s)", "text"]
    assert not {"nfe", "n tokens", "n forced", "wall s", "tokens_per_forward"} & set(rows)


def test_one_precision_per_row_for_both_runs_and_the_change():
    rows = _cells(PREVIOUS, CURRENT)
    assert rows["tokens per forward"] == ("7.00", "6.40", "-0.60")  # not "7" beside "6.4"
    assert rows["threshold"] == ("0.90", "0.95", "+0.05")
    assert rows["wall time (s)"] == ("0.50", "0.27", "-0.23")
    assert rows["NFE (forwards)"] == ("7", "10", "+3")
    assert rows["tokens generated"] == ("49", "64", "+15")
    assert rows["forced fills"] == ("0", "3", "+3")
    assert rows["block size"] == ("32", "16", "-16")
    assert rows["text"][2] == "differs after 12 chars (similarity 0.82)"


def test_an_unchanged_metric_and_a_missing_one():
    same = _cells(PREVIOUS, {**PREVIOUS, "threshold": None})
    assert same["tokens per forward"] == ("7.00", "7.00", "±0.00")
    assert same["NFE (forwards)"] == ("7", "7", "±0")
    assert same["threshold"] == ("0.90", "–", "")  # no change to show without both values
    assert same["text"][2] == "identical"


def test_the_table_from_two_real_runs(trace):
    """The same saved decode twice (the `trace` fixture of tests/clover_viz/conftest.py), as the views call it."""
    rows = _cells(trace, trace)
    tpf = trace.summary()["tokens_per_forward"]
    assert rows["tokens per forward"] == (f"{tpf:.2f}", f"{tpf:.2f}", "±0.00")
    assert rows["NFE (forwards)"][0] == str(len(trace))
