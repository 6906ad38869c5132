"""Charts over the forwards of a run: slots written per forward, cumulative tokens, expert
union per layer, recurrent state norms, memory share. Observables a backbone does not have
(`None` in every step) draw a "not applicable" placeholder.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

from clover_viz import colors as C
from clover_viz.figures._common import (
    EXPERT_TRACE,
    MEMORY_TRACE,
    NOT_APPLICABLE,
    _base_layout,
    _empty_figure,
    _index,
    _json_list,
    _resolve_step,
)
from clover_engine.backbones.clover.config import recorded_clover_config


# =============================================================================== per-forward charts
def _block_starts_x(trace: Any) -> list[int]:
    """NFE (1-based x) of the first forward of each block after the first."""
    idx = _index(trace)
    return [idx.steps_of[b][0] + 1 for b in sorted(idx.steps_of)[1:]]


def _add_block_lines(fig: go.Figure, xs: list[int], offset: float = -0.5, **kw: Any) -> None:
    for x in xs[:200]:
        fig.add_vline(x=x + offset, line=dict(color="#cbd5e1", width=1, dash="dot"), **kw)


def _not_applicable(trace: Any, name: str) -> bool:
    """True when every step recorded ``None`` for ``name``: a backbone without that observable
    (a transformers model, `clover_engine.backbones.causal_lm.model`: no experts, no recurrent state, no memory unit)."""
    steps = _index(trace).steps
    return bool(steps) and all(getattr(s, name) is None for s in steps)


def tokens_per_forward_figure(trace: Any) -> go.Figure:
    """Slots written per forward (stacked: accepted, forced, EOS-filled), block starts dotted."""
    if len(trace) == 0:
        return _empty_figure("Tokens written per forward", "no steps yet")
    idx = _index(trace)
    acc, frc, eos = idx.n_accepted, idx.n_forced, idx.n_eos
    x = np.arange(1, len(trace) + 1)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=x, y=acc, name="accepted", marker_color=C.STATE_COLORS["accepted"]))
    fig.add_trace(go.Bar(x=x, y=frc, name="forced", marker_color=C.STATE_COLORS["forced"]))
    fig.add_trace(go.Bar(x=x, y=eos, name="EOS-filled", marker_color="#a78bfa"))
    mean = float((acc + frc).sum() / len(trace))
    fig.add_hline(y=mean, line=dict(color="#0f172a", dash="dash", width=1),
                  annotation_text=f"mean {mean:.2f} tokens/forward", annotation_position="top left")
    fig.add_hline(y=1, line=dict(color=C.AR_COLOR, dash="dot", width=1),
                  annotation_text="autoregressive: 1", annotation_position="bottom right")
    _add_block_lines(fig, _block_starts_x(trace))
    fig.update_layout(**_base_layout("Tokens written per forward"), barmode="stack", height=320,
                      xaxis_title="forward (NFE)", yaxis_title="slots written", bargap=0.15,
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"))
    return fig


def answer_writes(trace: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per forward, the answer tokens it wrote: ``(written, forced)``, each ``(NFE,)`` int64.

    A slot counts when it was accepted or forced and, once the decode has ended, lies within
    the answer (`Trace.generated_tokens`: before the first EOS). The EOS itself and slots after
    it are not answer tokens, so the totals equal the summary's token and forced counts (the
    status line's). While a decode is still running every accepted or forced slot counts.
    """
    idx = _index(trace)
    end = trace.decode_end
    if end is None:
        return np.asarray(idx.n_accepted + idx.n_forced, dtype=np.int64), np.asarray(idx.n_forced, dtype=np.int64)
    n_answer = len(trace.generated_tokens)
    starts = {b.block_index: b for b in trace.block_starts}
    first = starts.get(min(starts)) if starts else None
    gen0 = (first.position_start + int(np.sum(first.prefilled))) if first is not None else 0
    written, forced = [], []
    for ev in trace.steps:
        b = starts.get(int(ev.block_index))
        pos = (b.position_start if b is not None else 0) + np.arange(len(ev.tokens)) - gen0
        inside = pos < n_answer
        acc, frc = np.asarray(ev.accepted, bool) & inside, np.asarray(ev.forced, bool) & inside
        written.append(int(acc.sum() + frc.sum()))
        forced.append(int(frc.sum()))
    return np.asarray(written, dtype=np.int64), np.asarray(forced, dtype=np.int64)


def cumulative_tokens_figure(trace: Any) -> go.Figure:
    """Answer tokens written (accepted + forced, `answer_writes`) against forwards, beside the
    autoregressive line y = x."""
    if len(trace) == 0:
        return _empty_figure("Cumulative tokens vs forwards", "no steps yet")
    written, frc = answer_writes(trace)
    y = np.concatenate([[0], np.cumsum(written)])
    x = np.arange(0, len(trace) + 1)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=x, name="autoregressive (1 token / forward)", mode="lines",
                             line=dict(color=C.AR_COLOR, dash="dash")))
    fig.add_trace(go.Scatter(x=x, y=y, name="block diffusion", mode="lines",
                             line=dict(color=C.MEASURED_COLOR, width=3, shape="hv")))
    fc = np.concatenate([[0], np.cumsum(frc)])
    fig.add_trace(go.Scatter(x=x, y=fc, name="of which forced", mode="lines",
                             line=dict(color=C.STATE_COLORS["forced"], width=1.5, shape="hv")))
    ratio = y[-1] / max(len(trace), 1)
    fig.add_annotation(x=x[-1], y=y[-1], text=f"{int(y[-1])} tokens in {len(trace)} forwards ({ratio:.2f}x AR)",
                       showarrow=True, arrowhead=2, ax=-40, ay=-30, xanchor="right")
    fig.update_layout(**_base_layout("Cumulative tokens vs forwards"), height=340,
                      xaxis_title="forwards (NFE)", yaxis_title="tokens written",
                      legend=dict(x=0.01, y=0.99, bgcolor="rgba(255,255,255,0.8)"))
    return fig


def _layer_labels(trace: Any, n: int) -> list[str]:
    cfg = recorded_clover_config(trace)
    types = list(getattr(cfg, "layer_types", []) or [])
    if len(types) == n:
        short = {"linear_attention": "GDN", "full_attention": "attn"}
        return [f"{i} {short.get(t, t)}" for i, t in enumerate(types)]
    flags = list(_recorded_moe(trace).get("moe_layer_flags") or [])  # a MoE diffusion LM: its MoE layers only
    if sum(map(bool, flags)) == n:
        return [f"layer {i} MoE" for i, f in enumerate(flags) if f]
    return [f"layer {i}" for i in range(n)]


def _recorded_moe(trace: Any) -> dict:
    """``num_experts`` / ``num_experts_per_tok`` / ``moe_layer_flags`` of the recording model: its Clover config,
    else the transformers-backed config in ``meta["model_config"]`` (a MoE diffusion LM); {} when unknown."""
    cfg = recorded_clover_config(trace)
    if cfg is not None and getattr(cfg, "num_experts", 0):
        return dict(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok)
    rec = (getattr(trace, "meta", None) or {}).get("model_config")
    ok = isinstance(rec, dict) and rec.get("num_experts") and rec.get("num_experts_per_tok")
    return dict(rec) if ok else {}  # a config naming experts its own way (DiffusionGemma) gives no subtitle


def expert_union_figure(trace: Any) -> go.Figure:
    """Distinct routed experts per layer per forward: heatmap, x = forward (NFE), y = layer."""
    if len(trace) == 0:
        return _empty_figure("Expert union per layer", "no steps yet")
    if _not_applicable(trace, "expert_union"):
        return _empty_figure("Expert union per layer", NOT_APPLICABLE + " (no mixture of experts)")
    u = np.stack([np.asarray(s.expert_union, dtype=np.float64) for s in _index(trace).steps])  # (S, N)
    u[u < 0] = np.nan
    S, N = u.shape
    moe = _recorded_moe(trace)
    sub = f" (of {moe['num_experts']} experts, top-{moe['num_experts_per_tok']} per token)" if moe else ""
    steps = _index(trace).steps
    hover = "forward %{x} · %{y}<br>%{z:.0f} distinct experts (all tokens of the forward)"
    custom = None
    if all(s.expert_union_block is not None and s.router_entropy is not None for s in steps):
        # the MoE diffusion backbones also record the block's own union and the router's entropy
        blk = np.stack([np.asarray(s.expert_union_block, dtype=np.float64) for s in steps]).T
        ent = np.stack([np.asarray(s.router_entropy, dtype=np.float64) for s in steps]).T
        custom = np.stack([blk, ent], axis=-1).tolist()
        hover += "<br>%{customdata[0]:.0f} chosen by the block's slots<br>router entropy %{customdata[1]:.2f} nats"
    fig = go.Figure(go.Heatmap(
        name=EXPERT_TRACE, z=_json_list(u.T), x=list(range(1, S + 1)), y=_layer_labels(trace, N),
        colorscale="Blues", zmin=0, zmax=float(moe["num_experts"]) if moe else None, customdata=custom,
        colorbar=dict(title=dict(text="experts", side="right"), thickness=12),
        hovertemplate=hover + "<extra></extra>",
    ))
    _add_block_lines(fig, _block_starts_x(trace))
    fig.update_layout(**_base_layout("Expert union per layer and forward" + sub), height=max(260, 140 + min(N, 40) * 14),
                      xaxis_title="forward (NFE)", yaxis=dict(title="layer", autorange="reversed", showgrid=False))
    return fig


def expert_parallel(trace: Any) -> dict | None:
    """What a decode split over experts recorded (``meta["expert_parallel"]``, written by ``clover_engine.generate
    --parallel ep=N`` from `clover_engine.decoding.expert_parallel.RankUnionRecorder`), or None."""
    ep = (getattr(trace, "meta", None) or {}).get("expert_parallel")
    return ep if isinstance(ep, dict) and ep.get("rank_unions") else None


def expert_parallel_figure(trace: Any) -> go.Figure:
    """A run split over N devices by expert: the distinct experts each device ran per forward (summed over the MoE
    layers), one line per device, and the busiest device over the mean (the slowest device bounds the step):
    the block's union spread over the devices. "Not applicable" for a run in one process."""
    title = "Experts per device per forward"
    ep = expert_parallel(trace)
    if ep is None:
        return _empty_figure(title, NOT_APPLICABLE + " (decoded in one process: no expert split)")
    u = np.asarray(ep["rank_unions"], dtype=np.float64).sum(axis=2)  # [forwards, devices]
    S, N = u.shape
    x = list(range(1, S + 1))
    fig = go.Figure()
    for r in range(N):
        fig.add_trace(go.Scatter(x=x, y=u[:, r].tolist(), mode="lines+markers", name=f"device {r}",
                                 hovertemplate=f"forward %{{x}}<br>device {r}: %{{y:.0f}} experts run (all MoE "
                                               "layers)<extra></extra>"))
    imbalance = np.asarray(ep.get("imbalance") or [1.0] * S, dtype=np.float64)
    fig.add_trace(go.Scatter(x=x, y=imbalance.tolist(), mode="lines", name="busiest / mean", yaxis="y2",
                             line=dict(color="#dc2626", dash="dot"),
                             hovertemplate="forward %{x}<br>busiest device / mean: %{y:.2f}<extra></extra>"))
    _add_block_lines(fig, _block_starts_x(trace))
    fig.update_layout(**_base_layout(f"{title}: {N} devices, expert parallel -- busiest / mean at most "
                                     f"{imbalance.max():.2f}, {imbalance.mean():.2f} on average"), height=300,
                      xaxis_title="forward (NFE)", yaxis_title="experts run",
                      yaxis2=dict(title="busiest / mean", overlaying="y", side="right", rangemode="tozero",
                                  showgrid=False))
    return fig


def expert_load_figure(trace: Any) -> go.Figure:
    """Tokens routed to each expert per MoE layer, summed over the run's forwards (heatmap, x = expert,
    y = layer), with the router's entropy averaged over the block's slots in the title (recorded by the MoE
    diffusion backbones, `clover_engine.backbones.llada_moe`; "not applicable" for others)."""
    title = "Tokens per expert"
    if len(trace) == 0:
        return _empty_figure(title, "no steps yet")
    steps = _index(trace).steps
    if any(s.expert_counts is None for s in steps):
        return _empty_figure(title, NOT_APPLICABLE + " (no per-expert counts recorded)")
    counts = np.sum([np.asarray(s.expert_counts, dtype=np.float64) for s in steps], axis=0)  # (N, E)
    ent = float(np.mean([np.mean(s.router_entropy) for s in steps if s.router_entropy is not None] or [np.nan]))
    N, E = counts.shape
    share = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    fig = go.Figure(go.Heatmap(
        z=_json_list(counts), x=list(range(E)), y=_layer_labels(trace, N), customdata=_json_list(share),
        colorscale="Purples", zmin=0, colorbar=dict(title=dict(text="tokens", side="right"), thickness=12),
        hovertemplate="expert %{x} · %{y}<br>%{z:.0f} tokens (%{customdata:.1%} of the layer's)<extra></extra>",
    ))
    sub = f" -- router entropy {ent:.2f} of ln E = {np.log(E):.2f} nats" if np.isfinite(ent) else ""
    fig.update_layout(**_base_layout(title + " over the run" + sub), height=max(240, 140 + min(N, 40) * 14),
                      xaxis_title="expert", yaxis=dict(title="layer", autorange="reversed", showgrid=False))
    return fig


def state_norm_figure(trace: Any) -> go.Figure:
    """Frobenius norm of each layer's recurrent state as each block reads it (first forward of the block)."""
    if len(trace) == 0:
        return _empty_figure("Recurrent state norm per layer", "no steps yet")
    if _not_applicable(trace, "state_norm"):
        caps = (getattr(trace, "meta", None) or {}).get("capabilities") or {}
        dc = getattr(trace, "decode_config", None) or {}
        recomputed = caps.get("cost_family") == "recompute" or (dc.get("sampler") == "llada2" and not dc.get("kv_cache"))
        why = "history is recomputed every forward" if recomputed else "history is a KV cache"
        return _empty_figure("Recurrent state norm per layer", NOT_APPLICABLE + f" ({why})")
    idx = _index(trace)
    blocks = sorted(idx.steps_of)
    norms = np.stack([np.asarray(idx.steps[idx.steps_of[b][0]].state_norm, dtype=np.float64) for b in blocks])
    N = norms.shape[1]
    labels = _layer_labels(trace, N)
    fig = go.Figure()
    palette = ["#2563eb", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#db2777", "#65a30d", "#475569"]
    for n in range(N):
        attn = "attn" in labels[n]
        fig.add_trace(go.Scatter(
            x=blocks, y=_json_list(norms[:, n]), mode="lines+markers", name=labels[n],
            line=dict(color=palette[n % len(palette)], width=2.5 if attn else 1.5, dash="solid" if attn else None),
            marker=dict(size=5, symbol="diamond" if attn else "circle"),
            hovertemplate=f"{labels[n]}<br>block %{{x}} · ‖S‖ %{{y:.3g}}<extra></extra>",
        ))
    positive = norms[np.isfinite(norms)]
    log = bool(positive.size and positive.min() > 0 and positive.max() / positive.min() > 20)
    fig.update_layout(**_base_layout("Recurrent state norm per layer, as each block reads it"), height=340,
                      xaxis=dict(title="block", dtick=1 if len(blocks) <= 20 else None),
                      yaxis=dict(title="‖S‖ (Frobenius)", type="log" if log else "linear"),
                      legend=dict(font=dict(size=10)))
    return fig


def memory_share_figure(trace: Any, step: int | None = None) -> go.Figure:
    """Attention mass on the memory unit (history) per layer and slot: heatmap layers x slots.

    ``step`` given: that forward's share; ``step=None``: the mean over all
    forwards of the trace (slot-wise, shorter blocks padded).
    """
    if len(trace) == 0:
        return _empty_figure("Memory share", "no steps yet")
    if _not_applicable(trace, "memory_share"):
        return _empty_figure("Memory share", NOT_APPLICABLE + " (no memory unit)")
    idx = _index(trace)
    if step is None:
        mats = [np.asarray(s.memory_share, dtype=np.float64) for s in idx.steps]
        N = mats[0].shape[0]
        L = max(m.shape[1] for m in mats)
        stack = np.full((len(mats), N, L), np.nan)
        for k, m in enumerate(mats):
            stack[k, :, : m.shape[1]] = m
        with np.errstate(all="ignore"):
            z = np.nanmean(stack, axis=0)
        title = f"Memory share per layer and slot, mean over {len(mats)} forwards"
    else:
        i = _resolve_step(trace, step)
        z = np.asarray(idx.steps[i].memory_share, dtype=np.float64)
        N, L = z.shape
        title = f"Memory share per layer and slot, step {i} (block {int(idx.block_of[i])})"
    fig = go.Figure(go.Heatmap(
        name=MEMORY_TRACE, z=_json_list(z), x=list(range(z.shape[1])), y=_layer_labels(trace, z.shape[0]),
        zmin=0, zmax=1, colorscale="Purples", xgap=1, ygap=1,
        colorbar=dict(title=dict(text="share on memory", side="right"), thickness=12),
        hovertemplate="%{y} · slot %{x}<br>memory share %{z:.3f}<extra></extra>",
    ))
    fig.update_layout(**_base_layout(title + "<br><sup>softmax mass on the state read-out vs the block's own keys</sup>",
                                   margin=dict(l=60, r=20, t=62, b=45)),
                      height=150 + min(z.shape[0], 40) * 16,
                      xaxis=dict(title="slot", showgrid=False), yaxis=dict(title="layer", autorange="reversed"))
    return fig
