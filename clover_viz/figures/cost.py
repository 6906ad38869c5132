"""Cost figures: bytes per forward and measured vs projected tokens/s (`cost_figure`), and
the roofline with every device and the run's operating points (`roofline_figure`). The
numbers come from `engine.cost` (docs/architecture.md §7); these functions only draw them.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import plotly.graph_objects as go

from clover_viz import colors as C
from clover_viz.figures._common import _base_layout, _empty_figure, _index, _json_list
from engine.units import format_si


# =============================================================================== cost
def cost_figure(trace: Any, device: str = "h800", config: str = "clover-35b-a3b",
                union_assumption: Any = "measured_vs_independent") -> go.Figure:
    """Cost panel: bytes read per forward (left) and tokens/s measured vs projected (right).

    Left: the cost model's bytes per forward of the recorded model (from the
    trace's ``bytes_read``), with bytes per written token. Right (log scale):
    the measured running tokens/s on the machine that recorded the trace
    (cumulative tokens / cumulative ``wall_s``) and, dashed and labelled
    "projected", `engine.cost.project_trace` on ``device`` for the recorded
    model and for ``config`` at the same tokens per forward, beside the AR
    bound of ``config``. ``union_assumption`` (see `engine.cost.target_union`)
    defaults to ``"measured_vs_independent"``: the recorded routing's
    correlation carried over to the target's 256 experts (``"measured_fraction"``,
    the CLI default, saturates at all experts for a model with few experts).
    """
    from plotly.subplots import make_subplots

    if len(trace) == 0:
        return _empty_figure("Cost", "no steps yet")
    from engine.cost import (
        ar_tokens_per_s,
        bytes_per_written_token,
        project_trace,
        running_tokens_per_s,
    )

    _index(trace)  # a trace, or TypeError
    bytes_read = trace.column("bytes_read")  # (S,) float64, NaN without a cost
    x = np.arange(1, len(trace) + 1)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("bytes read per forward (cost model)", f"tokens/s: measured vs projected ({device})"))
    if np.isfinite(bytes_read).any():
        fig.add_trace(go.Bar(x=x, y=_json_list(bytes_read / 1e6), name="MB per forward", marker_color="#93c5fd",
                             hovertemplate="forward %{x}<br>%{y:.3f} MB<extra></extra>"), row=1, col=1)
        per_tok = bytes_per_written_token(trace) / 1e6
        fig.add_trace(go.Scatter(x=x, y=_json_list(per_tok), name="MB per token written", mode="lines+markers",
                                 marker=dict(size=4), line=dict(color="#1d4ed8", width=1.5),
                                 hovertemplate="forward %{x}<br>%{y:.3f} MB / token<extra></extra>"), row=1, col=1)
    else:
        fig.add_annotation(text="no cost fields in this trace", showarrow=False, xref="x domain", yref="y domain",
                           x=0.5, y=0.5, row=1, col=1)
    measured = running_tokens_per_s(trace)
    fig.add_trace(go.Scatter(x=x, y=_json_list(measured), name="measured (this machine)", mode="lines",
                             line=dict(color=C.MEASURED_COLOR, width=3),
                             hovertemplate="after %{x} forwards: %{y:.3g} tok/s measured<extra></extra>"), row=1, col=2)
    try:
        proj = project_trace(trace, device=device, target_config=config, union_assumption=union_assumption,
                             source_config=trace.model_config(), fallback_union="independent")
    except (ValueError, TypeError) as exc:
        proj = None
        fig.add_annotation(text=f"no projection: {html.escape(str(exc))[:80]}", showarrow=False,
                           xref="x2 domain", yref="y2 domain", x=0.5, y=0.1)
    lines = []
    if proj is not None:
        if proj.source is not None:
            lines.append((proj.source.tokens_per_s, f"projected: {proj.source.config_name} on {proj.device}", C.PROJECTED_COLOR))
        lines.append((proj.target.tokens_per_s, f"projected: {proj.target.config_name} on {proj.device}", C.TARGET_COLOR))
        lines.append((ar_tokens_per_s(config, device), f"projected: {config} autoregressive on {proj.device}", C.AR_COLOR))
    for rate, label, color in lines:
        text = f"{format_si(rate, digits=3, missing='n/a')} tok/s"
        fig.add_trace(go.Scatter(x=[x[0], x[-1]], y=[rate, rate], mode="lines", name=f"{label}: {text}",
                                 line=dict(color=color, dash="dash", width=2),
                                 hovertemplate=f"{label}<br>{text}<extra></extra>"), row=1, col=2)
    fig.update_yaxes(title_text="MB", row=1, col=1)
    fig.update_yaxes(title_text="tokens/s (log)", type="log", row=1, col=2)
    fig.update_xaxes(title_text="forward (NFE)", row=1, col=1)
    fig.update_xaxes(title_text="forward (NFE)", row=1, col=2)
    m_last = measured[np.isfinite(measured)]
    # over the forwards' own wall times (the curve); the app's headline divides by the whole decode's,
    # which adds the explorer's own per-step work (events, cost meter)
    summ = (f"measured {format_si(float(m_last[-1]) if m_last.size else None, digits=3, missing='n/a')} tok/s over "
            "the forwards' own time (the run's headline divides by the whole decode's)")
    if proj is not None:
        summ += (f" · projected {config} on {proj.device}: {format_si(proj.target.tokens_per_s, digits=3, missing='n/a')}"
                 f" tok/s ({proj.union_assumption} union)")
    fig.update_layout(**_base_layout(f"Cost<br><sup>{summ}</sup>", margin=dict(l=60, r=20, t=100, b=45)), height=430,
                      legend=dict(orientation="h", y=-0.18, yanchor="top", x=0, font=dict(size=11)))
    return fig


def roofline_figure(trace: Any | None = None, device: str = "h800", config: str = "clover-35b-a3b",
                    union_assumption: Any = "measured_vs_independent", devices: Any = None) -> go.Figure:
    """Log-log roofline (FLOP/s attainable vs FLOP/byte) with every device's ridge point.

    Operating points on ``device``: the autoregressive step of ``config``
    (`engine.cost.ar_step_cost`), the trace's forwards as ``config`` would run
    them (same tokens per forward and commits, union from
    ``union_assumption``; labelled "projected") and the recorded model's own
    forwards (the trace's ``arithmetic_intensity``). ``trace=None`` draws the
    devices and the AR point only.
    """
    from engine.config import CloverConfig
    from engine.cost import (
        DEVICES,
        ar_step_cost,
        attainable_flops_per_s,
        get_device,
        project_forwards_roofline,
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
        hov = [f"forward {i + 1}: {n} tokens ({L} slots), union {u:.0f}"
               for i, (n, L, u) in enumerate(zip(pf.n_tokens.tolist(), pf.block_len.tolist(), pf.union.tolist()))]
        fig.add_trace(go.Scatter(x=pf.intensity.tolist(), y=pf.flops_per_s.tolist(), mode="markers", name=f"{cfg.name} block diffusion (projected)",
                                 marker=dict(size=8, color=C.TARGET_COLOR, opacity=0.6, line=dict(width=0.5, color="white")),
                                 customdata=hov, hovertemplate="%{customdata}<br>%{x:.3g} FLOP/B<extra></extra>"))
        own = [(float(s.arithmetic_intensity), i) for i, s in enumerate(idx.steps)
               if s.arithmetic_intensity is not None and s.bytes_read]
        if own:
            ox = [a for a, _ in own]
            oy = attainable_flops_per_s(np.array(ox), dev).tolist()
            fig.add_trace(go.Scatter(x=ox, y=oy, mode="markers", name=f"{trace.model_id or 'recorded model'} forwards (projected)",
                                     marker=dict(size=7, color=C.PROJECTED_COLOR, symbol="circle-open"),
                                     hovertemplate="recorded model<br>%{x:.3g} FLOP/B<extra></extra>"))
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
