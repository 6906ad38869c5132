"""Cost figures: bytes per forward and measured vs projected tokens/s (`cost_figure`), and
the roofline with every device and the run's operating points (`roofline_figure`). The
numbers come from `clover_engine.cost` (docs/architecture.md §7); these functions only draw them.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import plotly.graph_objects as go

from clover_viz import colors as C
from clover_viz.figures._common import _base_layout, _empty_figure, _index, _json_list
from clover_engine.backbones.clover.config import recorded_clover_config
from clover_engine.units import format_si


# =============================================================================== cost
COST_SUMMARY_CLASS = "clover-cost"
"""CSS class of `cost_summary_html`'s outer div (tests and the browser find it by this)."""


def _fmt(x: float | None, unit: str = "") -> str:
    return format_si(x, unit, digits=3, missing="n/a")


def _forwards_range(indices: list[int]) -> str:
    """1-based forward numbers, as ranges: [1, 2, 3, 7] -> 'forwards 2-4, 8'."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    parts = [f"{r[0] + 1}" if len(r) == 1 else f"{r[0] + 1}&ndash;{r[-1] + 1}" for r in runs]
    return ("forward " if len(indices) == 1 else "forwards ") + ", ".join(parts)


def cost_summary_html(trace: Any, projection: Any, step: int | None = None) -> str:
    """The Cost tab's figures as two small HTML tables, every one labelled with what it is.

    * bytes read (the recorded model): **as run** here -- the cost model's bytes at the dtype
      the model ran in (`clover_engine.cost.recorded_weight_bytes`, fp32 on this CPU) -- beside
      **projected** at bf16 weights, for the forward at ``step`` and the mean per forward;
    * tokens/s: measured on this machine, projected for the recorded model and for the
      target (``projection.target``, clover-35b-a3b) on ``projection.device``, and the
      target's autoregressive line, for the **whole run** (the prompt forward included) beside
      the **decode phase** (`clover_engine.cost.DecodePhase`: the prompt forward left out, the figure
      comparable with the AR line), with a note on what each includes and the tokens per
      forward the target would need to match AR (`clover_engine.cost.ar_break_even_tokens_per_forward`).

    Args:
        trace: an `clover_engine.recording.trace.Trace` with at least one step.
        projection: its `clover_engine.cost.TraceProjection` (`ExplorerState.cost_projection`), or
            None when it has none: the projected cells then read "n/a".
        step: the global step the "this forward" row describes (None = the last).

    Raises:
        ValueError: for a trace without steps.
    """
    from clover_engine.cost import (  # local: clover_engine.cost loads torch (~2 s); the figures draw a trace without it
        ar_break_even_tokens_per_forward,
        ar_step_cost,
        ar_tokens_per_s,
        dtype_name,
        recorded_weight_bytes,
    )

    if len(trace) == 0:
        raise ValueError("cost_summary_html needs a trace with at least one step; decode first")
    n = len(trace)
    pos = n - 1 if step is None else (step + n if step < 0 else min(step, n - 1))
    weight_bytes = recorded_weight_bytes(trace)
    run_dt = dtype_name(weight_bytes)
    as_run = f"{run_dt}, the run's dtype" if weight_bytes is not None else "in the run's dtype"
    p, src = projection, getattr(projection, "source", None)
    model = html.escape(str(src.config_name if src is not None else trace.model_id or "recorded model"))
    bytes_read = np.asarray(trace.column("bytes_read"), dtype=np.float64)
    mean_run, mean_label = as_run_mean_bytes(trace, bytes_read)
    this_run = float(bytes_read[pos]) if np.isfinite(bytes_read[pos]) else None
    steps = [i for i, s in enumerate(getattr(p, "stepped", ()) or ()) if s] or list(range(n))  # forwards with a step
    this_proj = (src.bytes_per_forward[steps[pos]] if src is not None and len(steps) == n
                 and len(src.bytes_per_forward) >= len(steps) else None)
    mean_proj = src.bytes_read / src.n_forwards if src is not None else None
    th = "style='text-align:left;padding:2px 10px 2px 0;font-weight:600'"
    td = "style='padding:2px 10px 2px 0'"

    def row(cells: list[str], head: bool = False) -> str:
        tag = "th" if head else "td"
        return "<tr>" + "".join(f"<{tag} {th if head else td}>{c}</{tag}>" for c in cells) + "</tr>"

    dev = html.escape(p.device) if p is not None else "n/a"
    bytes_tab = [
        row(["bytes read by " + model, f"as run here ({as_run}; cost model)",
             f"projected (bf16 weights{'' if p is None else ', roofline ' + dev})"], head=True),
        row([f"this forward ({pos + 1} of {n})", f"<b>{_fmt(this_run, 'B')}</b>", f"<b>{_fmt(this_proj, 'B')}</b>"]),
        row([mean_label, _fmt(mean_run, "B"), _fmt(mean_proj, "B")]),
    ]
    out = [f"<table class='clover-cost-bytes' style='border-collapse:collapse'>{''.join(bytes_tab)}</table>"]
    if p is None:
        out.append("<i>no projection for this run: only the as-run figures</i>")
        return f"<div class='{COST_SUMMARY_CLASS}' style='font-size:13px;line-height:1.5'>{''.join(out)}</div>"

    tgt, dp = p.target, p.decode_phase
    ar = ar_tokens_per_s(tgt.config_name, p.device)
    whole_h = (f"whole run: {p.n_forwards} forwards{forward_kinds(trace)}, {p.tokens_written} tokens, "
               f"{p.tokens_per_forward:.2f} per forward")
    if dp is None:
        dec_h = "decode phase: none (the prompt forward was the whole run)"
    else:
        dec_h = (f"decode phase: {dp.n_forwards} forwards, {dp.tokens_written} tokens, "
                 f"{dp.tokens_per_forward:.2f} per forward")
    dec = (lambda f: "n/a") if dp is None else (lambda f: f"<b>{_fmt(f(dp))}</b>")  # noqa: E731
    tname = html.escape(tgt.config_name)
    rate_tab = [
        row(["tokens/s", whole_h, dec_h], head=True),
        row([f"measured here ({run_dt if weight_bytes is not None else 'as run'}"
             f"{', as run' if weight_bytes is not None else ''}): answer tokens ÷ the decode's wall time "
             "(decode phase: less the prompt forward's)", f"<b>{_fmt(p.measured_tokens_per_s)}</b>",
             dec(lambda d: d.measured_tokens_per_s)]),
    ]
    if src is not None:
        rate_tab.append(row([f"projected {model} on {dev} (bf16)", f"<b>{_fmt(src.tokens_per_s)}</b>",
                             dec(lambda d: d.source.tokens_per_s if d.source is not None else None)]))
    rate_tab += [
        row([f"projected {tname} block decoding on {dev} (bf16, {html.escape(p.union_assumption)} union)",
             f"<b>{_fmt(tgt.tokens_per_s)}</b>", dec(lambda d: d.target.tokens_per_s)]),
        row([f"projected {tname} autoregressive on {dev} (bf16, 1 token per forward, no prompt)",
             f"<b>{_fmt(ar)}</b>", f"<b>{_fmt(ar)}</b>"]),
    ]
    out.append(f"<table class='clover-cost-rates' style='border-collapse:collapse;margin-top:6px'>"
               f"{''.join(rate_tab)}</table>")
    notes = []
    if dp is None:
        notes.append("<b>whole run:</b> every forward; the run was its prompt forward only, so it has no decode "
                     "phase to set beside the autoregressive line.")
    elif not dp.prompt_forwards:
        notes.append("<b>whole run</b> = <b>decode phase:</b> the prompt was shorter than one block and only "
                     "pre-filled the first block's head, so no forward carried a prompt block.")
    elif p.stepped and not p.stepped[dp.prompt_forwards[0]]:  # a prefill forward of its own (block-causal)
        kept = [i for i in range(p.n_forwards) if i not in set(dp.prompt_forwards)]
        notes.append(
            f"<b>whole run:</b> every forward, including the prefill ({_forwards_range(list(dp.prompt_forwards))}"
            f"), a forward of its own that puts the prompt's {dp.prompt_tokens} tokens of whole blocks into the "
            f"KV cache and writes nothing, and the commit forwards that put each finished block there. "
            f"<b>decode phase:</b> {_forwards_range(kept)} and the {dp.tokens_written} tokens they wrote, the "
            "prefill left out: an autoregressive decode prefills too, and its line leaves that out.")
    else:
        first = dp.prompt_forwards[0]
        union = tgt.expert_union_per_forward[first] if tgt.expert_union_per_forward else None
        kept = [i for i in range(p.n_forwards) if i not in set(dp.prompt_forwards)]
        shown = int(trace.step(first).n_tokens_forward)
        wrote = f"{dp.prompt_tokens_written} token{'' if dp.prompt_tokens_written == 1 else 's'}"
        union_note = f"; on {tname} an expert union of {union:.0f} per layer" if union is not None else ""
        notes.append(
            "<b>whole run:</b> every forward, including the prompt forward "
            f"({_forwards_range(list(dp.prompt_forwards))}), which folds the {dp.prompt_tokens}-token prompt into "
            f"history together with the first block ({shown} tokens through the model{union_note}) and wrote "
            f"{wrote}. <b>decode phase:</b> {_forwards_range(kept)} and the {dp.tokens_written} tokens they wrote, "
            "the prompt forward left out: prefill is work an autoregressive decode does too, and its line leaves it "
            "out, so this is the column to compare with it.")
    if dp is not None:
        need = ar_break_even_tokens_per_forward(dp.target, tgt.config_name, p.device)
        ar_step = ar_step_cost(tgt.config_name)
        verdict = "above" if dp.target.tokens_per_s > ar else "below"
        notes.append(
            f"In the decode phase {tname} block decoding is <b>{verdict}</b> its autoregressive line: a decode "
            f"forward reads the expert union of all its tokens ({dp.target.mean_expert_union:.0f} experts per "
            f"layer on average, against {ar_step.mean_expert_union:.0f} for one AR token) and takes "
            f"as long as {need:.2f} AR steps, so it needs <b>{need:.2f}</b> tokens per forward to match; this run "
            f"wrote {dp.tokens_per_forward:.2f}.")
    notes.append(f"<b>as run</b> = the cost model's bytes at the dtype the model ran in here ({run_dt}); "
                 "<b>measured</b> = wall time on this machine: the whole run's figure divides the answer tokens by "
                 "the whole decode's wall time (the headline's tokens/s), the decode phase's leaves the prompt "
                 "forward's time and tokens out (so it is higher), and the Cost chart's curve divides the slots "
                 "written by the forwards' own time alone; <b>projected</b> = roofline max(bytes / bandwidth, "
                 f"FLOPs / peak) on {dev} from clover_engine.cost, bf16 weights whatever the run's dtype, not measured.")
    split = _expert_split_note(trace)
    if split:
        notes.insert(0, split)
    out.append("<div style='color:#475569;margin-top:4px'>" + "<br>".join(notes) + "</div>")
    return f"<div class='{COST_SUMMARY_CLASS}' style='font-size:13px;line-height:1.5'>{''.join(out)}</div>"


def _expert_split_note(trace: Any) -> str:
    """The devices of a run split over experts (``meta["expert_parallel"]``, as recorded by ``clover_engine.generate
    --parallel ep=N``): each device's routed-expert bytes per forward, measured from its experts' unions, and the
    busiest over the mean; "" for a run in one process."""
    ep = (getattr(trace, "meta", None) or {}).get("expert_parallel")
    if not isinstance(ep, dict) or not ep.get("rank_unions") or not ep.get("rank_expert_bytes"):
        return ""
    n_forwards = max(len(ep["rank_unions"]), 1)
    per_device = [b / n_forwards for b in ep["rank_expert_bytes"]]
    mean = sum(per_device) / len(per_device)
    shown = ", ".join(f"{b / 1e6:,.2f}" for b in per_device)
    return (f"<b>{ep['world']} devices, experts split:</b> routed-expert bytes per forward on each device, as run: "
            f"{shown} MB (the experts its tokens chose among its own x one expert's bytes; every device also reads "
            f"the replicated weights); busiest / mean {max(per_device) / mean if mean else 1.0:.2f}: the slowest "
            "device bounds the step.")


def as_run_mean_bytes(trace: Any, bytes_read: np.ndarray) -> tuple[float | None, str]:
    """(mean bytes per forward as run, its row label) over the forwards the cards count: the steps' recorded
    ``bytes_read`` plus each prefill / commit forward of its own (``DecodeEnd.unstepped_forwards``, whose
    sixth entry is its bytes). A trace saved before those bytes were recorded averages its steps only, and
    the label says so. (None, label) when no forward has bytes (a replay without the cost model's)."""
    extra = list(getattr(getattr(trace, "decode_end", None), "unstepped_forwards", ()) or ())
    finite = bytes_read[np.isfinite(bytes_read)]
    if not len(finite):
        return None, "mean per forward (whole run)"
    extra_bytes = [f[5] for f in extra if len(f) > 5 and f[5] is not None]
    if extra and len(extra_bytes) < len(extra):
        return float(finite.mean()), f"mean per step ({len(extra)} prefill / commit forwards not recorded)"
    return float((finite.sum() + sum(extra_bytes)) / (len(finite) + len(extra_bytes))), "mean per forward (whole run)"


def forward_kinds(trace: Any) -> str:
    """`` (6 steps, 1 prefill, 2 commits)``: the forwards of a run whose prefill and commit forwards are
    their own (a block-causal family's: ``DecodeEnd.unstepped_forwards``), so that the count reads as the
    run's NFE on the cards; "" when every forward is a step."""
    end = getattr(trace, "decode_end", None)
    extra = list(getattr(end, "unstepped_forwards", ()) or ())
    if not extra:
        return ""
    kinds = [str(f[0]) for f in extra]
    parts = [f"{len(trace)} step{'' if len(trace) == 1 else 's'}"]
    for kind in ("prefill", "commit"):
        c = kinds.count(kind)
        if c:
            parts.append(f"{c} {kind}{'s' if c > 1 and kind == 'commit' else ''}")
    return " (" + ", ".join(parts) + ")"


def cost_figure(trace: Any, device: str = "h800", config: str = "clover-35b-a3b",
                union_assumption: Any = "measured_vs_independent") -> go.Figure:
    """Cost panel: bytes read per forward (left) and tokens/s measured vs projected (right).

    Left: the recorded model's bytes per forward **as run** (the trace's ``bytes_read``: the
    cost model at the dtype the model ran in, `clover_engine.cost.recorded_weight_bytes`; fp32 on
    this CPU) as bars, the same forwards **projected** at bf16 weights as a line, and the
    as-run bytes per written token; for a mapped MoE checkpoint also the bytes each forward really
    paged in (the trace's ``bytes_paged_in``, measured: the routed experts read for the first time).
    The prompt forward(s) (`clover_engine.cost.prompt_forward_mask`) are drawn in their own colour. Right (log scale): the measured running tokens/s on the
    machine that recorded the trace (cumulative tokens / cumulative ``wall_s``) and, dashed
    and labelled "projected", `clover_engine.cost.project_trace` on ``device`` for the recorded
    model and for ``config`` at the same tokens per forward over the whole run, ``config``
    over the decode phase alone (dotted, from the first forward after the prompt forward:
    `clover_engine.cost.DecodePhase`), beside the AR bound of ``config``. ``union_assumption`` (see
    `clover_engine.cost.target_union`) defaults to ``"measured_vs_independent"``: the recorded
    routing's correlation carried over to the target's 256 experts (``"measured_fraction"``,
    the CLI default, saturates at all experts for a model with few experts).
    """
    from plotly.subplots import make_subplots

    if len(trace) == 0:
        return _empty_figure("Cost", "no steps yet")
    from clover_engine.cost import (  # local: clover_engine.cost loads torch (~2 s); the figures draw a trace without it
        ar_tokens_per_s,
        bytes_per_written_token,
        dtype_name,
        project_trace,
        prompt_forward_mask,
        recorded_weight_bytes,
        running_tokens_per_s,
    )

    _index(trace)  # a trace, or TypeError
    bytes_read = trace.column("bytes_read")  # (S,) float64, NaN without a cost
    x = np.arange(1, len(trace) + 1)
    prompt = prompt_forward_mask(trace)
    run_dt = dtype_name(recorded_weight_bytes(trace))
    try:
        proj = project_trace(trace, device=device, target_config=config, union_assumption=union_assumption,
                             source_config=recorded_clover_config(trace), fallback_union="independent")
        proj_error = None
    except (ValueError, TypeError) as exc:
        proj, proj_error = None, exc
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=(f"bytes read per forward: as run ({run_dt}) vs projected (bf16)",
                                        f"tokens/s: measured vs projected ({device})"))
    if np.isfinite(bytes_read).any():
        colors = ["#f59e0b" if p else "#93c5fd" for p in prompt.tolist()]
        fig.add_trace(go.Bar(x=x, y=_json_list(bytes_read / 1e6), name=f"MB per forward, as run ({run_dt})",
                             marker_color=colors,
                             customdata=["prompt forward (prompt blocks + first block)" if p else "decode forward"
                                         for p in prompt.tolist()],
                             hovertemplate=f"forward %{{x}} (%{{customdata}})<br>%{{y:.3f}} MB as run ({run_dt})"
                                           "<extra></extra>"), row=1, col=1)
        stepped = [i for i, st in enumerate(proj.stepped) if st] if proj is not None and proj.stepped else None
        src_bytes = (None if proj is None or proj.source is None else
                     [proj.source.bytes_per_forward[i] for i in stepped] if stepped is not None
                     and len(proj.source.bytes_per_forward) == len(proj.stepped) else proj.source.bytes_per_forward)
        if src_bytes is not None and len(src_bytes) == len(trace):
            fig.add_trace(go.Scatter(x=x, y=[b / 1e6 for b in src_bytes],
                                     name="MB per forward, projected (bf16)", mode="lines+markers",
                                     marker=dict(size=5, symbol="diamond"),
                                     line=dict(color=C.PROJECTED_COLOR, width=1.5, dash="dash"),
                                     hovertemplate="forward %{x}<br>%{y:.3f} MB projected (bf16)<extra></extra>"),
                          row=1, col=1)
        paged = trace.column("bytes_paged_in")  # measured on a mapped MoE checkpoint, else NaN
        if np.isfinite(paged).any():
            fig.add_trace(go.Scatter(x=x, y=_json_list(paged / 1e6), name="MB paged in from the checkpoint (measured)",
                                     mode="lines+markers", marker=dict(size=5, symbol="x"),
                                     line=dict(color="#059669", width=1.5),
                                     hovertemplate="forward %{x}<br>%{y:.3f} MB of the checkpoint newly resident "
                                                   "(measured, /proc/self/smaps)<extra></extra>"), row=1, col=1)
        per_tok = bytes_per_written_token(trace) / 1e6
        fig.add_trace(go.Scatter(x=x, y=_json_list(per_tok), name=f"MB per token written, as run ({run_dt})",
                                 mode="lines+markers", marker=dict(size=4), line=dict(color="#1d4ed8", width=1.5),
                                 hovertemplate="forward %{x}<br>%{y:.3f} MB / token<extra></extra>"), row=1, col=1)
        if prompt.any():
            first = int(np.flatnonzero(prompt)[0])
            fig.add_annotation(x=first + 1, y=float(bytes_read[first] / 1e6), text="prompt forward", showarrow=True,
                               arrowhead=0, ax=0, ay=-22, font=dict(size=10, color="#b45309"), row=1, col=1)
    else:
        fig.add_annotation(text="no cost fields in this trace", showarrow=False, xref="x domain", yref="y domain",
                           x=0.5, y=0.5, row=1, col=1)
    measured = running_tokens_per_s(trace)
    fig.add_trace(go.Scatter(x=x, y=_json_list(measured), name=f"measured (this machine, {run_dt} as run)",
                             mode="lines", line=dict(color=C.MEASURED_COLOR, width=3),
                             hovertemplate="after %{x} forwards: %{y:.3g} tok/s measured<extra></extra>"), row=1, col=2)
    if proj_error is not None:
        fig.add_annotation(text=f"no projection: {html.escape(str(proj_error))[:80]}", showarrow=False,
                           xref="x2 domain", yref="y2 domain", x=0.5, y=0.1)
    lines = []  # (rate, label, color, dash, first forward)
    if proj is not None:
        dev = proj.device
        if proj.source is not None:
            lines.append((proj.source.tokens_per_s, f"projected: {proj.source.config_name} on {dev}, whole run",
                          C.PROJECTED_COLOR, "dash", 1))
        lines.append((proj.target.tokens_per_s, f"projected: {proj.target.config_name} on {dev}, whole run",
                      C.TARGET_COLOR, "dash", 1))
        dp = proj.decode_phase
        if dp is not None and dp.prompt_forwards:
            start = next(i for i in range(len(trace)) if i not in set(dp.prompt_forwards)) + 1
            lines.append((dp.target.tokens_per_s, f"projected: {proj.target.config_name} on {dev}, decode phase "
                          "(prompt forward excluded)", C.TARGET_COLOR, "dot", start))
        lines.append((ar_tokens_per_s(config, device), f"projected: {config} autoregressive on {dev}",
                      C.AR_COLOR, "dash", 1))
    for rate, label, color, dash, first in lines:
        text = f"{format_si(rate, digits=3, missing='n/a')} tok/s"
        fig.add_trace(go.Scatter(x=[first, x[-1]], y=[rate, rate], mode="lines", name=f"{label}: {text}",
                                 line=dict(color=color, dash=dash, width=2),
                                 hovertemplate=f"{label}<br>{text}<extra></extra>"), row=1, col=2)
    fig.update_yaxes(title_text="MB", row=1, col=1)
    fig.update_yaxes(title_text="tokens/s (log)", type="log", row=1, col=2)
    fig.update_xaxes(title_text="forward (NFE)", row=1, col=1)
    fig.update_xaxes(title_text="forward (NFE)", row=1, col=2)
    m_last = measured[np.isfinite(measured)]
    # over the forwards' own wall times (the curve); the app's headline divides by the whole decode's,
    # which adds the explorer's own per-step work (events, cost meter)
    summ = (f"measured {format_si(float(m_last[-1]) if m_last.size else None, digits=3, missing='n/a')} tok/s = "
            "slots written ÷ the forwards' own wall time, leaving out the work between forwards (the headline and "
            "the table's whole run divide answer tokens by the whole decode's time)")
    if proj is not None:
        summ += (f" · projected {config} on {proj.device}: {format_si(proj.target.tokens_per_s, digits=3, missing='n/a')}"
                 f" tok/s whole run")
        if proj.decode_phase is not None and proj.decode_phase.prompt_forwards:
            summ += f", {format_si(proj.decode_phase.target.tokens_per_s, digits=3, missing='n/a')} decode phase"
        summ += f" ({proj.union_assumption} union)"
    fig.update_layout(**_base_layout(f"Cost<br><sup>{summ}</sup>", margin=dict(l=60, r=20, t=100, b=45)), height=430,
                      legend=dict(orientation="h", y=-0.18, yanchor="top", x=0, font=dict(size=11)))
    return fig


def roofline_figure(trace: Any | None = None, device: str = "h800", config: str = "clover-35b-a3b",
                    union_assumption: Any = "measured_vs_independent", devices: Any = None) -> go.Figure:
    """Log-log roofline (FLOP/s attainable vs FLOP/byte) with every device's ridge point.

    Operating points on ``device``: the autoregressive step of ``config``
    (`clover_engine.cost.ar_step_cost`), the trace's forwards as ``config`` would run
    them (same tokens per forward and commits, union from
    ``union_assumption``; labelled "projected", bf16 weights; the prompt forward
    (`clover_engine.cost.prompt_forward_mask`) a star of its own beside the decode-phase
    forwards) and the recorded model's own forwards (the trace's
    ``arithmetic_intensity``: bytes as run, in the run's dtype). ``trace=None`` draws the
    devices and the AR point only.
    """
    from clover_engine.backbones.clover.config import CloverConfig  # local: as clover_engine.cost below
    from clover_engine.cost import (  # local: clover_engine.cost loads torch (~2 s); the figures draw a trace without it
        DEVICES,
        ar_step_cost,
        attainable_flops_per_s,
        dtype_name,
        get_device,
        project_forwards_roofline,
        recorded_weight_bytes,
        ridge_point,
        roofline_point,
    )

    dev = get_device(device)
    names = list(devices) if devices is not None else list(DEVICES)
    if dev.name not in names:
        names.append(dev.name)
    ai = np.logspace(-1, 4, 120)
    fig = go.Figure()
    plateau: dict[float, list[str]] = {}
    for name in names:
        d = get_device(name)
        perf = attainable_flops_per_s(ai, d)
        chosen = d.name == dev.name
        fig.add_trace(go.Scatter(
            x=ai, y=perf, mode="lines", name=f"{d.name} roofline" if chosen else d.name,
            line=dict(color="#0f172a" if chosen else "#cbd5e1", width=3 if chosen else 1.2),
            hovertemplate=f"{d.name}<br>%{{x:.3g}} FLOP/B → %{{y:.3g}} FLOP/s<extra></extra>",
            legendgroup="devices", showlegend=chosen,
        ))
        rp = ridge_point(d)
        plateau.setdefault(d.peak_flops, []).append(f"<b>{d.name}</b>" if chosen else d.name)
        fig.add_trace(go.Scatter(
            x=[rp], y=[d.peak_flops], mode="markers+text" if chosen else "markers",
            text=[f"ridge {rp:.0f} FLOP/B"] if chosen else None, textposition="top center",
            marker=dict(size=9 if chosen else 6, color="#0f172a" if chosen else "#94a3b8", symbol="triangle-up"),
            name="ridge points", legendgroup="ridge", showlegend=chosen,
            hovertemplate=f"{d.name} ridge point<br>{rp:.0f} FLOP/byte<extra></extra>",
        ))
    for peak, labels in plateau.items():  # devices sharing a peak share a label
        fig.add_annotation(x=4.0, y=math.log10(peak), xref="x", yref="y", text=" · ".join(labels),
                           showarrow=False, xanchor="right", yanchor="bottom", font=dict(size=10, color="#475569"))
    cfg = CloverConfig.from_name(config) if isinstance(config, str) else config
    ar = ar_step_cost(cfg)
    x_ar, y_ar = roofline_point(ar.bytes_read, ar.flops, dev)
    fig.add_trace(go.Scatter(x=[x_ar], y=[y_ar], mode="markers+text", name=f"{cfg.name} autoregressive (projected)",
                             text=["AR"], textposition="middle left",
                             marker=dict(size=13, color=C.AR_COLOR, symbol="square"),
                             hovertemplate=f"AR step of {cfg.name}<br>%{{x:.3g}} FLOP/B<extra></extra>"))
    sub = ""
    if trace is not None and len(trace) > 0:
        idx = _index(trace)
        pf = project_forwards_roofline(trace, cfg, dev, union_assumption)
        hov = [f"forward {i + 1}{' (prompt forward)' if p else ''}: {n} tokens ({L} slots), union {u:.0f}"
               for i, (n, L, u, p) in enumerate(zip(pf.n_tokens.tolist(), pf.block_len.tolist(), pf.union.tolist(),
                                                    pf.prompt.tolist()))]
        for part, label, symbol in ((~pf.prompt, "decode-phase forwards", "circle"),
                                    (pf.prompt, "prompt forward", "star")):
            if not part.any():
                continue
            fig.add_trace(go.Scatter(
                x=pf.intensity[part].tolist(), y=pf.flops_per_s[part].tolist(), mode="markers",
                name=f"{cfg.name} block diffusion, {label} (projected, bf16)",
                marker=dict(size=8 if symbol == "circle" else 13, color=C.TARGET_COLOR, symbol=symbol,
                            opacity=0.6 if symbol == "circle" else 0.9, line=dict(width=0.5, color="white")),
                customdata=[h for h, keep in zip(hov, part.tolist()) if keep],
                hovertemplate="%{customdata}<br>%{x:.3g} FLOP/B<extra></extra>"))
        own = [(float(s.arithmetic_intensity), i) for i, s in enumerate(idx.steps)
               if s.arithmetic_intensity is not None and s.bytes_read]
        if own:
            ox = [a for a, _ in own]
            oy = attainable_flops_per_s(np.array(ox), dev).tolist()
            run_dt = dtype_name(recorded_weight_bytes(trace))
            fig.add_trace(go.Scatter(x=ox, y=oy, mode="markers",
                                     name=f"{trace.model_id or 'recorded model'} forwards (bytes as run, {run_dt}; "
                                          f"placed on {dev.name})",
                                     marker=dict(size=7, color=C.PROJECTED_COLOR, symbol="circle-open"),
                                     hovertemplate=f"recorded model, bytes as run ({run_dt})<br>%{{x:.3g}} FLOP/B"
                                                   "<extra></extra>"))
        sub = f"<br><sup>trace forwards as {cfg.name} on {dev.name}; expert union: {union_assumption}</sup>"
    fig.update_layout(
        **_base_layout(f"Roofline: {dev.name}, ridge {ridge_point(dev):.0f} FLOP/byte" + sub,
                       margin=dict(l=70, r=20, t=70, b=50)),
        height=500,
        xaxis=dict(type="log", title="arithmetic intensity (FLOP / byte)", range=[-1, 4], exponentformat="SI"),
        yaxis=dict(type="log", title="attainable FLOP/s", exponentformat="SI", tickformat="~s"),
        legend=dict(orientation="h", x=0, y=-0.2, yanchor="top", font=dict(size=11)),
    )
    return fig
