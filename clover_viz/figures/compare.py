"""Two runs side by side: `compare_runs` (metrics, deltas and a text diff) and
`compare_table` (the same as a plotly table).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from clover_viz import colors as C
from clover_viz.figures._common import _base_layout


from clover_viz.runs import _COMPARE_KEYS, _SETTING_KEYS, compare_runs  # noqa: E402  (the data; this module draws it)


COMPARE_TABLE_HEIGHT = 110 + 24 * (len(_SETTING_KEYS) + len(_COMPARE_KEYS) + 1)
"""Height in px of every `compare_table` figure (model, memory mode and prompt rows, one row per
metric, the text row): fixed,
so a view can reserve the space before the first comparison and never re-flow."""

COMPARE_ROWS: dict[str, tuple[str, int]] = {
    "block_size": ("block size", 0),
    "threshold": ("threshold", 2),
    "nfe": ("NFE (forwards)", 0),
    "n_tokens": ("tokens generated", 0),
    "tokens_per_forward": ("tokens per forward", 2),
    "n_forced": ("forced fills", 0),
    "wall_s": ("wall time (s)", 2),
}
"""Per metric of `compare_runs`: the label `compare_table` shows and the decimals of every value
in its row (0 = an integer), the same for both runs and the change."""


def _format_metric(value: Any, decimals: int, sign: bool = False) -> str:
    """One cell of `compare_table`: ``value`` at ``decimals`` decimals ("–" for None; a
    non-numeric value as its text)."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if decimals == 0 and not float(value).is_integer():
        decimals = 2  # an integer metric that is not one (a hand-made dict): keep what it holds
    if sign and value == 0:
        return f"±{0:.{decimals}f}"
    return f"{value:{'+' if sign else ''},.{decimals}f}"


def _setting_rows(cmp: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The table's first rows: which model, memory mode and prompt each run had (the change column
    says "different" / "same"; a run that does not record one shows "–")."""
    def cell(v: Any) -> str:
        return "–" if v is None else C.plotly_text(str(v))

    m, mm, pr = cmp["model"], cmp["memory_mode"], cmp["prompt"]
    change = {True: "same", False: "different", None: ""}
    prompt = {True: "same prompt", False: "different prompts", None: "not recorded"}[pr["same"]]

    def length(v: Any) -> str:
        return "–" if v is None else f"{len(v):,} chars"

    return [("model", cell(m["a"]), cell(m["b"]), change[m["same"]]),
            ("memory mode", cell(mm["a"]), cell(mm["b"]), change[mm["same"]]),
            ("prompt", length(pr["a"]), length(pr["b"]), prompt)]


def compare_table(a: Any, b: Any, labels: tuple[str, str] = ("previous", "new")) -> go.Figure:
    """`compare_runs` as a small plotly table: metric, previous, new, change.

    The first rows say what the two runs were: model, memory mode and whether they decoded the
    same prompt (its length in characters beside "same prompt" / "different prompts").

    Every row has a human label (`COMPARE_ROWS`: "NFE (forwards)", "wall time (s)", ...) and
    one precision for both runs and the change: counts as integers, ratios and seconds to two
    decimals (7.00 beside 6.38, never 7 beside 6.38). A change of exactly zero reads "±0"
    ("±0.00" in a two-decimal row).
    """
    cmp = compare_runs(a, b)
    rows = _setting_rows(cmp)
    for k in _COMPARE_KEYS:
        label, decimals = COMPARE_ROWS[k]
        delta = cmp[k]["delta"]
        rows.append((label, _format_metric(cmp[k]["a"], decimals), _format_metric(cmp[k]["b"], decimals),
                     "" if delta is None else _format_metric(delta, decimals, sign=True)))
    t = cmp["text"]
    rows.append(("text", "", "", "identical" if t["same"] else
                 f"differs after {t['common_prefix']} chars (similarity {t['similarity']:.2f})"
                 + (", unrelated: different prompts" if cmp["prompt"]["same"] is False else "")))
    cols = list(zip(*rows))
    fig = go.Figure(go.Table(
        header=dict(values=["metric", labels[0], labels[1], "change"], fill_color="#e2e8f0", align="left",
                    font=dict(size=12)),
        cells=dict(values=[list(c) for c in cols], align="left", fill_color="white", height=24),
    ))
    fig.update_layout(**_base_layout(f"{labels[0].capitalize()} vs {labels[1]}", margin=dict(l=10, r=10, t=40, b=10)),
                      height=COMPARE_TABLE_HEIGHT)
    return fig
