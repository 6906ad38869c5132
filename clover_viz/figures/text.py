"""The text so far: a blocks x slots grid figure (`text_figure`) and an HTML fragment
(`text_html`), tokens coloured by the iteration that wrote them or their confidence.
"""

from __future__ import annotations

import html
import weakref
from typing import Any

import numpy as np
import plotly.graph_objects as go

from clover_viz import colors as C
from clover_viz.figures._common import (
    TEXT_PROMPT_TRACE,
    TEXT_TRACE,
    _base_layout,
    _index,
    _json_list,
    _resolve_step,
    _tok,
)
from clover_viz.runs import dropped_at_stop
from clover_engine.recording.slot_index import SlotIndex

# text_html fragments of finished blocks (and the prompt), per index: a rebuilt index
# (`Trace.slot_index`) starts with an empty cache
_HTML: weakref.WeakKeyDictionary[SlotIndex, dict[Any, Any]] = weakref.WeakKeyDictionary()


def _html_cache(idx: SlotIndex) -> dict[Any, Any]:
    cache = _HTML.get(idx)
    if cache is None:
        cache = _HTML[idx] = {}
    return cache

def _text_cells(trace: Any, step: int | None) -> list[dict[str, Any]]:
    """Per block up to ``step``: tokens, and per slot state / iteration written / confidence."""
    i = _resolve_step(trace, step)
    idx = _index(trace)
    cur = int(idx.block_of[i])
    out = []
    for b in sorted(idx.steps_of):
        if b > cur:
            break
        steps_b = idx.steps_of[b]
        last = steps_b[-1] if b < cur else i
        ev = idx.steps[last]
        L = len(ev.tokens)
        pre = idx.prefilled(b, L)
        written = idx.written_by(b, last)
        w_iter, w_conf, w_kind = _writes_of(idx, b, last)
        iteration = np.where(written, w_iter, -1)
        out.append(dict(
            block=b, position_start=int(ev.position_start), tokens=np.asarray(ev.tokens), prefilled=pre,
            written=written, iteration=iteration, confidence=np.where(written, w_conf, np.nan),
            kind=np.where(written, w_kind, ""), n_iter=len(steps_b),
        ))
    return out


def text_figure(trace: Any, step: int | None = None, color_by: str = "step") -> go.Figure:
    """The text so far as a grid: one row per block (block boundaries = rows), one column per slot.

    Generated tokens are coloured by the iteration of their block at which
    they were written (``color_by="step"``) or by their confidence
    (``color_by="confidence"``); forced fills carry an orange dot; prompt
    tokens are grey-blue; slots not yet written at ``step`` are blank.
    """
    if color_by not in ("step", "confidence"):
        raise ValueError(f"color_by must be 'step' or 'confidence', got {color_by!r}")
    cells = _text_cells(trace, step)
    L = max([len(c["tokens"]) for c in cells] + [_index(trace).block_size()])
    R = len(cells)
    zg = np.full((R, L), np.nan)
    zp = np.full((R, L), np.nan)
    text = np.full((R, L), "", dtype=object)
    hover = np.full((R, L), "", dtype=object)
    fx, fy = [], []
    max_iter = max([c["n_iter"] for c in cells] + [1])
    for r, c in enumerate(cells):
        for s, tok in enumerate(c["tokens"].tolist()):
            pos = c["position_start"] + s
            if c["prefilled"][s]:
                zp[r, s] = 1.0
                text[r, s] = C.plotly_text(_tok(trace, tok, 4))
                hover[r, s] = f"pos {pos} · prompt token {text[r, s]}"
            elif c["written"][s]:
                it, conf = int(c["iteration"][s]), float(c["confidence"][s])
                zg[r, s] = it if color_by == "step" else (conf if conf == conf else np.nan)
                text[r, s] = C.plotly_text(_tok(trace, tok, 4))
                hover[r, s] = (f"pos {pos} · block {c['block']} slot {s}<br>token {text[r, s]} (id {tok})<br>"
                               f"{c['kind'][s]} at iteration {it + 1}" + (f", conf {conf:.3f}" if conf == conf else ""))
                if c["kind"][s] == "forced":
                    fx.append(s + 0.32)
                    fy.append(r - 0.28)
    ylab = [f"block {c['block']}" for c in cells]
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        name=TEXT_PROMPT_TRACE, z=_json_list(zp), text=text.tolist(), customdata=hover.tolist(),
        x=list(range(L)), y=list(range(R)), zmin=0, zmax=1, showscale=False, xgap=1, ygap=3,
        colorscale=[[0, C.STATE_COLORS["prompt"]], [1, C.STATE_COLORS["prompt"]]],
        texttemplate="%{text}", textfont=dict(family=C.MONO, size=10),
        hovertemplate="%{customdata}<extra></extra>", hoverongaps=False,
    ))
    if color_by == "step":
        scale, zmax, cbar = "Viridis", max(max_iter - 1, 1), "iteration"
    else:
        scale, zmax, cbar = [[0, "#fee2e2"], [0.5, "#fde68a"], [0.9, "#86efac"], [1, "#166534"]], 1.0, "confidence"
    fig.add_trace(go.Heatmap(
        name=TEXT_TRACE, z=_json_list(zg), text=text.tolist(), customdata=hover.tolist(),
        x=list(range(L)), y=list(range(R)), zmin=0, zmax=zmax, colorscale=scale, xgap=1, ygap=3,
        texttemplate="%{text}", textfont=dict(family=C.MONO, size=10),
        colorbar=dict(title=dict(text=cbar, side="right"), thickness=12, len=0.9),
        hovertemplate="%{customdata}<extra></extra>", hoverongaps=False,
    ))
    fig.add_trace(go.Scatter(x=fx, y=fy, mode="markers", name="forced fill", hoverinfo="skip",
                             marker=dict(size=5, color=C.STATE_COLORS["forced"], line=dict(width=0))))
    fig.update_layout(
        **_base_layout(f"Text so far: {R} block(s) of {L} slots, coloured by {'iteration' if color_by == 'step' else 'confidence'}"),
        height=120 + max(R, 2) * 30,
        xaxis=dict(title="slot", showgrid=False, zeroline=False, range=[-0.5, L - 0.5]),
        yaxis=dict(tickmode="array", tickvals=list(range(R)), ticktext=ylab, autorange="reversed",
                   showgrid=False, zeroline=False),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
        uirevision="text",
    )
    return fig


def text_html(trace: Any, step: int | None = None, color_by: str = "confidence", show_prompt: bool = True) -> str:
    """The text so far as an HTML fragment (a ``<div>``) for a notebook or a Panel HTML pane.

    Prompt text is grey; each generated token is a ``<span>`` whose
    background shows its confidence (``color_by="confidence"``, forced fills
    orange) or the iteration of its block at which it was written
    (``color_by="step"``, over that block's iterations); its ``title`` (tooltip) says which.
    Each block starts at a vertical rule; slots still masked at ``step`` are ``░``.
    The text ends at the first EOS, as the decoder's output does: one ``end`` marker
    (class ``clover-end``), and nothing after it -- no tokens written beyond the EOS
    earlier in its block, no EOS fills. At the last step of a stopped run, the slots written
    after a still-masked slot of its last block -- not kept (`clover_viz.runs.dropped_at_stop`)
    -- are struck through in grey (class ``clover-dropped``), their tooltip saying why.

    Blocks finished before ``step``'s block are rendered once per trace and reused, so the
    cost of a call is the current block's, whatever the length of the trace.
    """
    if color_by not in ("step", "confidence"):
        raise ValueError(f"color_by must be 'step' or 'confidence', got {color_by!r}")
    i = _resolve_step(trace, step)
    idx = _index(trace)
    cur = int(idx.block_of[i])
    dropped = dropped_at_stop(trace)
    parts = ['<div class="clover-text" style="font-family:' + C.MONO + ';font-size:13px;line-height:1.7;'
             'white-space:pre-wrap;word-break:break-all;">']
    blocks = [b for b in idx.steps_of if b <= cur]
    if show_prompt and trace.prompt_ids:
        key = ("prompt", blocks[0] if blocks else None)
        cache = _html_cache(idx)
        head = cache.get(key)
        if head is None:
            first_gen = idx.steps[idx.steps_of[blocks[0]][0]].position_start if blocks else None
            ids = trace.prompt_ids if first_gen is None else trace.prompt_ids[:first_gen]
            head = cache[key] = (f'<span style="color:#64748b">'
                                 f'{_esc_text("".join(trace.token_str(t) for t in ids))}</span>')
        parts.append(head)
    for b in blocks:
        if b < cur:  # final: rendered once
            key = ("block", b, color_by, show_prompt)
            cache = _html_cache(idx)
            frag = cache.get(key)
            if frag is None:
                frag = cache[key] = _block_html(trace, idx, b, idx.steps_of[b][-1], color_by, show_prompt)
        else:
            gone = dropped if dropped is not None and dropped["block"] == b and i == len(trace) - 1 else None
            frag = _block_html(trace, idx, b, i, color_by, show_prompt, frozenset(gone["slots"]) if gone else None)
        parts.append(frag[0])
        if frag[1]:  # the text ended at an EOS
            break
    parts.append("</div>")
    return "".join(parts)


def _esc_text(s: str) -> str:
    return html.escape(s.replace("\n", "⏎\n"), quote=False)


def _block_html(trace: Any, idx: SlotIndex, b: int, last: int, color_by: str, show_prompt: bool,
                dropped: frozenset[int] | None = None) -> tuple[str, bool]:
    """(HTML of block ``b`` as it stands after global step ``last``, whether it ends at an EOS).
    ``dropped``: slots written but not kept when the run stopped (drawn struck through)."""
    ev = idx.steps[last]
    toks = np.asarray(ev.tokens).tolist()
    L = len(toks)
    pre = idx.prefilled(b, L)
    written = idx.written_by(b, last)
    # A block the next one overlaps (verify: the next round starts right after the tokens the base kept,
    # so a round's rejected draft slots are never written) ends where the next block starts; and an ended
    # run's last block ends at its last written slot -- neither leaves ░ gaps that are not masks.
    nxt = idx.steps_of.get(b + 1)  # blocks are numbered in order, one after another
    shown = L if nxt is None else max(0, min(L, int(idx.steps[nxt[0]].position_start) - int(ev.position_start)))
    end = getattr(trace, "decode_end", None)
    if (nxt is None and end is not None and end.stop_reason != "cancelled" and last == len(idx.steps) - 1
            and (written | pre).any()):
        shown = min(shown, int(np.flatnonzero(written | pre)[-1]) + 1)
    toks = toks[:shown]
    w_iter, w_conf, w_kind = _writes_of(idx, b, last)
    n_iter = len(idx.steps_of[b])
    eos = idx.eos_id
    parts = [(f'<span title="block {b} (pos {int(ev.position_start)})" '
              'style="border-left:2px solid #94a3b8;margin-left:2px;padding-left:1px"></span>')]
    ended = False
    for s_, tok in enumerate(toks):
        if pre[s_]:
            if show_prompt:
                parts.append(f'<span style="color:#64748b">{_esc_text(trace.token_str(tok))}</span>')
            continue
        if not written[s_]:
            parts.append('<span style="color:#cbd5e1">░</span>')
            continue
        kind = w_kind[s_]
        if dropped and s_ in dropped:
            tip = (f"{kind} at iteration {int(w_iter[s_]) + 1} of block {b}, then dropped at Stop: a stopped run "
                   "keeps a block's written slots only up to its first still-masked slot")
            parts.append(f'<span class="clover-dropped" title="{html.escape(tip)}" style="color:#94a3b8;'
                         f'text-decoration:line-through">{_esc_text(trace.token_str(tok)) or "∅"}</span>')
            continue
        if (eos is not None and tok == eos) or kind == "eos":
            parts.append(f'<span class="clover-end" title="end of text: EOS in block {b}, slot {s_}" '
                         'style="color:#6d28d9;font-size:11px;padding:0 3px">end</span>')
            ended = True
            break
        conf = float(w_conf[s_])
        it = int(w_iter[s_])
        if color_by == "confidence":
            bg = C.STATE_COLORS["forced"] if kind == "forced" else C.accepted_color(conf if conf == conf else 0.0)
        else:
            bg = _viridis(it / max(n_iter - 1, 1))
        fg = "#ffffff" if _dark(bg) else "#111827"
        tip = f"{kind} at iteration {it + 1} of block {b}" + (f", conf {conf:.3f}" if conf == conf else "")
        parts.append(f'<span title="{html.escape(tip)}" style="background:{bg};color:{fg};'
                     f'border-radius:2px">{_esc_text(trace.token_str(tok)) or "∅"}</span>')
    return "".join(parts), ended


def _writes_of(idx: SlotIndex, b: int, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(iteration, confidence, kind) per slot of block ``b`` for the tokens held after global
    step ``step``: the index's final writes, or for a block a revisable decoder revised, the
    writes as of that step (`SlotIndex.written_as_of`)."""
    if b in idx.revised:
        _, it, conf, kind = idx.written_as_of(b, step)
        return it, conf, kind
    return idx.written_iter[b], idx.written_conf[b], idx.written_kind[b]


_VIRIDIS = ("#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725")


def _viridis(t: float) -> str:
    t = min(max(t, 0.0), 1.0) * (len(_VIRIDIS) - 1)
    i = min(int(t), len(_VIRIDIS) - 2)
    return C._mix(_VIRIDIS[i], _VIRIDIS[i + 1], t - i)


def _dark(color: str) -> bool:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return 0.299 * r + 0.587 * g + 0.114 * b < 140
