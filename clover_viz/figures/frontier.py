"""The speed / answer frontier of one prompt: tokens per forward against agreement with the careful decode.

`frontier_figure(points)` draws the points of `clover_engine.decoding.frontier.measure_frontier` (or their
``row()`` dicts, as a saved table holds them): every cell a marker, the Pareto front a line through its cells, the
careful decode a diamond at 100 %, the current setting circled. Each marker's ``customdata`` is its index in
``points``, so a view can load the clicked cell's run. `frontier_table_html` is the same as a table.

Pure: it draws what it is given and decodes nothing.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

FRONTIER_CLASS = "clover-frontier-table"


def _rows(points: Sequence[Any]) -> list[dict[str, Any]]:
    return [p.row() if hasattr(p, "row") else dict(p) for p in points]


def frontier_figure(points: Sequence[Any], title: str | None = None, height: int = 420) -> go.Figure:
    """The frontier as a scatter: x tokens per forward, y % agreement with the careful decode.

    Args:
        points: `clover_engine.decoding.frontier.FrontierPoint` s, or their ``row()`` dicts (keys ``setting``,
            ``tokens_per_forward``, ``agreement_pct``, ``first_difference``, ``careful``, ``current``, ``pareto``).
        title: the figure's title (default names the axes' meaning).

    Raises:
        ValueError: no points.
    """
    rows = _rows(points)
    if not rows:
        raise ValueError("frontier_figure needs at least one point; measure the frontier first")
    fig = go.Figure()
    hover = [f"{html.escape(str(r['setting']))}<br>{r['tokens_per_forward']:.2f} tokens / forward · "
             f"{r['agreement_pct']:.0f} % agreement"
             + ("" if r.get("first_difference") is None else f" (first difference at slot {r['first_difference']})")
             + (" · Pareto-optimal" if r.get("pareto") else "") for r in rows]
    front = sorted((r["tokens_per_forward"], r["agreement_pct"]) for r in rows if r.get("pareto"))
    if len(front) > 1:
        fig.add_trace(go.Scatter(x=[f[0] for f in front], y=[f[1] for f in front], mode="lines", name="Pareto front",
                                 line=dict(color="#16a34a", width=2, dash="dot"), hoverinfo="skip"))
    kinds = [("careful decode (one slot per forward)", lambda r: r.get("careful"), "diamond", "#0f172a", 13),
             ("Pareto-optimal setting", lambda r: r.get("pareto") and not r.get("careful"), "circle", "#16a34a", 10),
             ("other setting", lambda r: not r.get("pareto") and not r.get("careful"), "circle", "#94a3b8", 9)]
    for name, keep, symbol, color, size in kinds:
        idx = [i for i, r in enumerate(rows) if keep(r)]
        if not idx:
            continue
        fig.add_trace(go.Scatter(
            x=[rows[i]["tokens_per_forward"] for i in idx], y=[rows[i]["agreement_pct"] for i in idx],
            mode="markers", name=name, customdata=idx, text=[hover[i] for i in idx], hoverinfo="text",
            marker=dict(symbol=symbol, color=color, size=size, line=dict(color="white", width=1))))
    cur = [i for i, r in enumerate(rows) if r.get("current")]
    if cur:
        r = rows[cur[0]]
        fig.add_trace(go.Scatter(x=[r["tokens_per_forward"]], y=[r["agreement_pct"]], mode="markers",
                                 name="this setting", customdata=cur, text=[hover[cur[0]]], hoverinfo="text",
                                 marker=dict(symbol="circle-open", color="#dc2626", size=20, line=dict(width=3))))
    fig.update_layout(
        title=title or "What speed costs: tokens per forward vs agreement with the careful decode (click a point "
                       "to load its run)",
        height=height, margin=dict(l=60, r=20, t=60, b=50), template="plotly_white",
        legend=dict(orientation="h", y=-0.18), clickmode="event")
    fig.update_xaxes(title="tokens per forward (higher: fewer forwards)", rangemode="tozero")
    fig.update_yaxes(title="% of answer tokens equal to the careful decode's", range=[-3, 105])
    return fig


def _short_labels(settings: Sequence[str]) -> list[str]:
    """``threshold=0.5`` out of ``block_size=32,threshold=0.5,max_new_tokens=64``: the ``key=value`` parts that
    differ between the settings (all of a setting when they share none)."""
    parts = [s.split(",") for s in settings]
    common = set.intersection(*(set(p) for p in parts)) if parts else set()
    return [",".join(x for x in p if x not in common) or s for p, s in zip(parts, settings)]


def sweep_frontier_figure(rows: Sequence[dict[str, Any]], model: str, task_set: str, height: int = 460) -> go.Figure:
    """One model's frontier over a sweep's prompts: each setting at its means (`frontier_figure`'s look), each
    marker labelled with what sets it apart from the others.

    Args:
        rows: the model's rows of a sweep's ``frontier.parquet`` (`clover_engine.experiments.sweep.results.
            FRONTIER_SCHEMA`: ``setting``, ``cells``, ``tokens_per_forward``, ``agreement`` in %,
            ``identical_rate``, ``careful``, ``pareto``).
        model, task_set: named in the title (a model path by its last part).

    Raises:
        ValueError: no rows.
    """
    rows = list(rows)
    labels = _short_labels([r["setting"] for r in rows])
    points = [{"setting": f"{r['setting']} ({r['cells']} prompts, {100 * r['identical_rate']:.0f} % identical)",
               "tokens_per_forward": r["tokens_per_forward"] or 0.0, "agreement_pct": r["agreement"],
               "careful": bool(r["careful"]), "pareto": bool(r["pareto"])} for r in rows]
    name = model.rstrip("/").rsplit("/", 1)[-1] if "/" in model and not model.count("/") == 1 else model
    fig = frontier_figure(points, height=height, title=(
        f"What speed costs: {name} on {task_set}<br><sup>each setting's tokens per forward vs its answers' mean "
        "agreement with the careful decode (one slot per forward)</sup>"))
    for p, label in zip(points, labels):
        fig.add_annotation(x=p["tokens_per_forward"], y=p["agreement_pct"], text=html.escape(label), showarrow=False,
                           xanchor="left", xshift=8, yshift=8, font=dict(size=11, color="#334155"))
    return fig


def frontier_table_html(points: Sequence[Any]) -> str:
    """The frontier as an HTML table (class ``clover-frontier-table``): setting, NFE, tokens, tokens per forward,
    agreement, first difference; the Pareto-optimal rows bold, the current one marked."""
    rows = _rows(points)
    head = ("<tr><th>setting</th><th>NFE</th><th>tokens</th><th>tokens / forward</th><th>agreement</th>"
            "<th>first difference</th></tr>")
    body = []
    for r in sorted(rows, key=lambda r: -r["tokens_per_forward"]):
        style = "font-weight:600" if r.get("pareto") else ""
        mark = " ◀ this setting" if r.get("current") else ""
        diff = "identical" if r.get("identical") else (r.get("first_difference") if r.get("first_difference")
                                                        is not None else "–")
        body.append(f"<tr style='{style}'><td>{html.escape(str(r['setting']))}{mark}</td><td>{r['nfe']}</td>"
                    f"<td>{r['tokens']}</td><td>{r['tokens_per_forward']:.2f}</td><td>{r['agreement_pct']:.0f} %</td>"
                    f"<td>{diff}</td></tr>")
    return (f"<table class='{FRONTIER_CLASS}' style='border-collapse:collapse;font-size:12px'>{head}"
            f"{''.join(body)}</table>")


def careful_overlay_html(answer: Sequence[str], reference: Sequence[str]) -> str:
    """A run's answer over its careful decode's, token under token (class ``clover-careful-overlay``): every
    position where they differ marked (``<mark class="clover-careful-diff">``) in both, the first one titled; a
    token missing on one side (one answer is longer) shows as an empty mark.

    Args:
        answer, reference: the two answers' tokens as text (a trace's ``token_str`` of each id)."""
    n = max(len(answer), len(reference))
    first = next((i for i in range(n) if i >= len(answer) or i >= len(reference) or answer[i] != reference[i]), None)

    def line(tokens: Sequence[str]) -> str:
        out = []
        for i in range(n):
            t = html.escape(tokens[i]) if i < len(tokens) else ""
            same = i < len(answer) and i < len(reference) and answer[i] == reference[i]
            if same:
                out.append(t)
            else:
                title = f' title="slot {i}: the first that differs"' if i == first else f' title="slot {i}"'
                out.append(f'<mark class="clover-careful-diff"{title} style="background:#fde68a">{t or "&nbsp;"}</mark>')
        return "".join(out)

    n_diff = sum(1 for i in range(n) if i >= len(answer) or i >= len(reference) or answer[i] != reference[i])
    head = ("identical to the careful decode" if first is None else
            f"{n_diff} of {n} slots differ from the careful decode, the first at slot {first}")
    return (f"<div class='clover-careful-overlay' style='font-size:12px;white-space:pre-wrap;margin-top:6px'>"
            f"<div style='color:#475569'>{head}</div><div><b>this run:</b> {line(answer)}</div>"
            f"<div><b>careful decode:</b> {line(reference)}</div></div>")


__all__ = ["FRONTIER_CLASS", "careful_overlay_html", "frontier_figure", "frontier_table_html"]
