"""Branches as HTML: the list of a session's branches (`branch_list_html`) and one slot's candidates
(`candidates_html`), shared by the Panel app (`clover_viz.panel_branches`) and the notebook
(`clover_viz.widget_branches`).

Wing: front ends (`clover_viz`), one of the figures: they draw what the rows hold
(`clover_viz.session_branches.SessionBranches.branch_rows`, `clover_viz.session_branches.SlotCandidates`)
and compute nothing.

The element classes are stable for tests: ``clover-branch-list``, ``clover-branch-row`` (with
``data-node``; ``clover-branch-shown`` on the run on display), ``clover-first-diff`` (the first answer
token that differs from the parent's), ``clover-candidates``.
"""

from __future__ import annotations

import html
from typing import Any

from clover_viz import colors as C

DIFF_BEFORE = 12  # answer tokens shown before the first difference (the rest: "…")
DIFF_AFTER = 40  # and after it

_STYLE = (
    "<style>.clover-branch-list{border-collapse:collapse;width:100%;font-size:12px;"
    "font-family:Inter,Helvetica,Arial,sans-serif}.clover-branch-list th{text-align:left;color:#64748b;"
    "font-weight:500;border-bottom:1px solid #e2e8f0;padding:2px 6px}.clover-branch-list td{padding:3px 6px;"
    "border-bottom:1px solid #f1f5f9;vertical-align:top}.clover-branch-shown{background:#f0fdfa}"
    ".clover-branch-text{font-family:" + C.MONO + ";white-space:pre-wrap;word-break:break-all;color:#334155}"
    ".clover-branch-text .same{color:#94a3b8}.clover-first-diff{background:#fde68a;color:#7c2d12;"
    "border-radius:3px;padding:0 2px;font-weight:600}.clover-candidates{border-collapse:collapse;font-size:12px}"
    ".clover-candidates td{padding:1px 8px;font-family:" + C.MONO + "}</style>"
)


def _token_html(text: str) -> str:
    """One token's text for the answer column: as written, but a token of only whitespace shown by its
    label (``␣``, ``⏎``) so the mark around a first difference is never empty."""
    return html.escape(C.token_label(text, 16) if not text.strip() else text)


def answer_html(tokens: list[str], first_difference: int | None) -> str:
    """An answer's tokens as HTML: before the first difference greyed (cut to `DIFF_BEFORE` tokens),
    the first differing token marked ``clover-first-diff``, then up to `DIFF_AFTER` tokens; without a
    difference (the original, or the same answer) the first `DIFF_AFTER` tokens."""
    if first_difference is None:
        body = "".join(html.escape(t) for t in tokens[:DIFF_AFTER])
        return body + ("…" if len(tokens) > DIFF_AFTER else "") or "<i>(no tokens)</i>"
    d = int(first_difference)
    lo = max(0, d - DIFF_BEFORE)
    same = ("…" if lo else "") + "".join(html.escape(t) for t in tokens[lo:d])
    if d >= len(tokens):  # this answer is a prefix of its parent's: it ends here
        mark = '<mark class="clover-first-diff" title="the answer ends here; its parent\'s goes on">END</mark>'
        return f'<span class="same">{same}</span>{mark}'
    mark = (f'<mark class="clover-first-diff" title="answer token {d}: the first that differs from the parent">'
            f"{_token_html(tokens[d])}</mark>")
    rest = "".join(html.escape(t) for t in tokens[d + 1:d + 1 + DIFF_AFTER])
    return f'<span class="same">{same}</span>{mark}{rest}' + ("…" if len(tokens) > d + 1 + DIFF_AFTER else "")


def branch_list_html(rows: list[dict[str, Any]]) -> str:
    """The branches as an HTML table, each branch under its parent (indented by depth): run, change
    (`clover_engine.recording.branches.branch_label`), NFE, tokens per forward, forced fills and the answer
    with its first difference from the parent's marked (`answer_html`). ``rows``:
    `SessionBranches.branch_rows`; empty: a line saying how to make a branch."""
    if not rows:
        return ('<div class="clover-branch-empty" style="color:#64748b;font-size:13px">No branches yet. Click a '
                "slot in the block view at any step, then choose another candidate, re-mask it or branch there "
                "with other settings: the branch decodes live and is listed here under the run it "
                "came from.</div>")
    head = ("<tr><th>run</th><th>change</th><th>NFE</th><th>tok/fwd</th><th>forced</th>"
            "<th>answer (first difference from its parent marked)</th></tr>")
    body = []
    for r in rows:
        cls = "clover-branch-row" + (" clover-branch-shown" if r.get("shown") else "")
        name = html.escape(r.get("name") or f"#{r['id']}")
        shown = ' <span title="on display">◀ shown</span>' if r.get("shown") else ""
        pad = 6 + 14 * int(r.get("depth", 0))
        parent = "" if r.get("parent") is None else f'<div style="color:#94a3b8">of #{r["parent"]}</div>'
        tokens = r.get("tokens") or list(r.get("text", ""))
        body.append(
            f'<tr class="{cls}" data-node="{r["id"]}"><td style="padding-left:{pad}px;white-space:nowrap">'
            f"<b>{name}</b>{shown}{parent}</td><td>{html.escape(r['label'])}</td><td>{r['nfe']}</td>"
            f"<td>{r['tokens_per_forward']:.2f}</td><td>{r['n_forced']}</td>"
            f'<td class="clover-branch-text">{answer_html(tokens, r.get("first_difference"))}'
            + ('<div style="color:#64748b">(the same answer as its parent)</div>'
               if r.get("parent") is not None and r.get("first_difference") is None else "") + "</td></tr>")
    return f'{_STYLE}<table class="clover-branch-list">{head}{"".join(body)}</table>'


def candidates_html(c: Any, table: bool = True) -> str:
    """One slot's candidates (a `clover_viz.session_branches.SlotCandidates`): where it is, what it holds,
    and (``table``) its top-K with probabilities, the token it holds marked -- a view listing them in its
    own picker passes False and gets the line naming whose forward they come from."""
    where = (f"<b>slot {c.slot}</b> · pos {c.position} · block {c.block_index}, after iteration {c.step_index + 1} "
             f"(step {c.step + 1}) · <b>{html.escape(C.STATE_LABELS.get(c.state, c.state))}</b>")
    if c.token is not None:
        where += f" · holds {html.escape(C.token_label(c.token_text, 16))} (id {c.token})"
    src = ""
    if c.source_step is not None:
        src = ("this step's forward" if c.source_step == c.step else f"the forward that wrote it (step {c.source_step + 1})")
    rows = "".join(
        f"<tr><td>{html.escape(C.token_label(x['text'], 16))}</td><td>{x['prob']:.3f}</td><td>id {x['token']}</td>"
        f"<td>{'◀ holds' if x['token'] == c.token else ''}</td></tr>" for x in c.candidates)
    listed = (f'<div style="font-size:12px;color:#64748b;margin-top:4px">top candidates of {src}'
              + (f':</div><table class="clover-candidates">{rows}</table>' if table else ":</div>") if rows else "")
    return (f'{_STYLE}<div style="font-size:13px">{where}</div>'
            f'<div style="font-size:12px;color:#475569;margin-top:2px">{html.escape(c.note)}</div>{listed}')


__all__ = ["DIFF_AFTER", "DIFF_BEFORE", "answer_html", "branch_list_html", "candidates_html"]
