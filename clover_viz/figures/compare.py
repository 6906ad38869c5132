"""Two runs side by side: `compare_runs` (metrics, deltas and a text diff) and
`compare_table` (the same as a plotly table).
"""

from __future__ import annotations

import difflib
import html
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from clover_viz import colors as C
from clover_viz.figures._common import _base_layout


# =============================================================================== comparing runs
def _run_info(run: Any) -> dict[str, Any]:
    if hasattr(run, "summary") and callable(run.summary):
        from clover_viz.runs import model_of, prompt_of

        info = dict(run.summary())
        info["text"] = "".join(run.token_str(int(t)) for t in run.generated_tokens)
        dc = getattr(run, "decode_config", None) or {}
        info.setdefault("threshold", dc.get("threshold"))
        info.setdefault("block_size", dc.get("block_size"))
        info.setdefault("memory_mode", dc.get("memory_mode"))
        info.setdefault("model", model_of(run))
        info.setdefault("prompt", prompt_of(run))
        return info
    if isinstance(run, Mapping):
        return dict(run)
    raise TypeError(f"compare_runs takes two Traces or summary dicts (trace.summary() + 'text'), got {type(run).__name__}")


_COMPARE_KEYS = ("block_size", "threshold", "nfe", "n_tokens", "tokens_per_forward", "n_forced", "wall_s")
_SETTING_KEYS = ("model", "memory_mode", "prompt")  # what the runs were, before the numbers


def compare_runs(a: Any, b: Any) -> dict[str, Any]:
    """Compare two runs (``a`` = previous, ``b`` = new): Traces or summary dicts (with ``text`` for the diff).

    Returns a dict: one entry per metric in ``block_size, threshold, nfe,
    n_tokens, tokens_per_forward, n_forced, wall_s`` holding ``{"a", "b",
    "delta"}`` (delta None when not numeric), and ``text`` with ``a``, ``b``,
    ``same`` (bool), ``common_prefix`` (characters), ``similarity``
    (difflib ratio) and ``diff_html`` (insertions green, deletions red).

    Also ``model``, ``memory_mode`` and ``prompt``: ``{"a", "b", "same"}`` (``same`` None when
    either run does not record it): two runs of different models or prompts are not a setting's
    effect, and the views say so.
    """
    ia, ib = _run_info(a), _run_info(b)
    out: dict[str, Any] = {}
    for k in _SETTING_KEYS:
        va, vb = ia.get(k), ib.get(k)
        out[k] = {"a": va, "b": vb, "same": None if va is None or vb is None else va == vb}
    for k in _COMPARE_KEYS:
        va, vb = ia.get(k), ib.get(k)
        num = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
        out[k] = {"a": va, "b": vb, "delta": (vb - va) if num else None}
    ta, tb = str(ia.get("text") or ""), str(ib.get("text") or "")
    prefix = 0
    for ca, cb in zip(ta, tb):
        if ca != cb:
            break
        prefix += 1
    sm = difflib.SequenceMatcher(a=ta, b=tb, autojunk=False)
    parts = []
    for op, a0, a1, b0, b1 in sm.get_opcodes():
        if op == "equal":
            parts.append(html.escape(ta[a0:a1]))
        if op in ("delete", "replace"):
            parts.append(f'<del style="background:#fee2e2;color:#991b1b">{html.escape(ta[a0:a1])}</del>')
        if op in ("insert", "replace"):
            parts.append(f'<ins style="background:#dcfce7;color:#166534;text-decoration:none">{html.escape(tb[b0:b1])}</ins>')
    out["text"] = {
        "a": ta, "b": tb, "same": ta == tb, "common_prefix": prefix, "similarity": round(sm.ratio(), 4),
        "diff_html": f'<div style="font-family:{C.MONO};white-space:pre-wrap;font-size:12px">{"".join(parts)}</div>',
    }
    return out


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
