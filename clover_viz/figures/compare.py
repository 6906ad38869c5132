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
        info = dict(run.summary())
        info["text"] = "".join(run.token_str(int(t)) for t in run.generated_tokens)
        dc = getattr(run, "decode_config", None) or {}
        info.setdefault("threshold", dc.get("threshold"))
        info.setdefault("block_size", dc.get("block_size"))
        return info
    if isinstance(run, Mapping):
        return dict(run)
    raise TypeError(f"compare_runs takes two Traces or summary dicts (trace.summary() + 'text'), got {type(run).__name__}")


_COMPARE_KEYS = ("block_size", "threshold", "nfe", "n_tokens", "tokens_per_forward", "n_forced", "wall_s")


def compare_runs(a: Any, b: Any) -> dict[str, Any]:
    """Compare two runs (``a`` = previous, ``b`` = new): Traces or summary dicts (with ``text`` for the diff).

    Returns a dict: one entry per metric in ``block_size, threshold, nfe,
    n_tokens, tokens_per_forward, n_forced, wall_s`` holding ``{"a", "b",
    "delta"}`` (delta None when not numeric), and ``text`` with ``a``, ``b``,
    ``same`` (bool), ``common_prefix`` (characters), ``similarity``
    (difflib ratio) and ``diff_html`` (insertions green, deletions red).
    """
    ia, ib = _run_info(a), _run_info(b)
    out: dict[str, Any] = {}
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


COMPARE_TABLE_HEIGHT = 110 + 24 * (len(_COMPARE_KEYS) + 1)
"""Height in px of every `compare_table` figure (one row per metric plus the text row): fixed,
so a view can reserve the space before the first comparison and never re-flow."""


def compare_table(a: Any, b: Any, labels: tuple[str, str] = ("previous", "new")) -> go.Figure:
    """`compare_runs` as a small plotly table: metric, previous, new, change."""
    cmp = compare_runs(a, b)

    def fmt(v: Any) -> str:
        if v is None:
            return "–"
        if isinstance(v, float):
            return f"{v:.3g}"
        return str(v)

    rows = [(k.replace("_", " "), fmt(cmp[k]["a"]), fmt(cmp[k]["b"]),
             "" if cmp[k]["delta"] is None else f"{cmp[k]['delta']:+.3g}") for k in _COMPARE_KEYS]
    t = cmp["text"]
    rows.append(("text", "", "", "identical" if t["same"] else
                 f"differs after {t['common_prefix']} chars (similarity {t['similarity']:.2f})"))
    cols = list(zip(*rows))
    fig = go.Figure(go.Table(
        header=dict(values=["metric", labels[0], labels[1], "change"], fill_color="#e2e8f0", align="left",
                    font=dict(size=12)),
        cells=dict(values=[list(c) for c in cols], align="left", fill_color="white", height=24),
    ))
    fig.update_layout(**_base_layout(f"{labels[0].capitalize()} vs {labels[1]}", margin=dict(l=10, r=10, t=40, b=10)),
                      height=COMPARE_TABLE_HEIGHT)
    return fig
