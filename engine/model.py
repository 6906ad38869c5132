"""The Clover block-diffusion model: Qwen3.5-MoE-shaped hybrid, history in state.

Reads top-down: CloverModel -> DecoderLayer -> {GatedDeltaNet | GatedAttention}
-> SparseMoE / RMSNorm. Letter table: B batch, T tokens of a forward (commit +
block), L block slots, C committed tokens, H heads, K key dim, V value dim,
E experts, N layers, W window.

What differs from an autoregressive Qwen3.5 (docs/architecture.md §3):

* History lives only in per-layer recurrent state, updated by the gated delta
  rule when a block is committed: GDN layers keep their state ``S [H_v, K, V]``
  and conv tail; full-attention layers keep a delta-rule *memory* state of
  their own (L2-normalised) keys and values, with their own gates.
* The current block attends to itself bidirectionally, with RoPE on the
  in-block q/k, and the memory read-out ``m_i = S^T q_i`` is one more unit in
  the same softmax with logit ``l_i = scale * <q_i, w_mem> + b_mem`` per head.
  `memory_share` reports its softmax mass.
* Commit is fused with the next block's first forward: one forward over
  ``[committed block(s) ++ block]``; per layer the committed tokens attend
  within their own block and read the old state, update it, and the block
  reads the new state.
* ``state+window`` mode (a labelled non-Clover variant): attention layers also
  keep the K/V of the last W committed tokens (a ring buffer) as extra keys.
* Optional (``config.attention_conv_kernel_dim > 0``, off in Qwen3.5 and the
  clover-35b-a3b preset): a causal depthwise conv on the attention layers' q/k/v
  projections, as Primer (arXiv:2109.08668) does, carrying its tail across
  forwards like the GDN conv; keys then hold the previous tokens' features that
  a copy (induction) match needs.

`CloverModel.forward` is the fast, incremental path. `CloverModel.forward_reference`
recomputes every state from scratch with the token-loop recurrence and an
explicit window slice; tests hold the fast path to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import CloverConfig
from kernels.gated_delta_rule import gated_delta_rule
from kernels.gated_delta_rule.chunk import chunk_states
from kernels.gated_delta_rule.naive import l2norm

MEMORY_MODES = ("state", "state+window")


# ----------------------------------------------------------------------------- state
@dataclass
class LayerState:
    """Recurrent state of one layer for B sequences (allocated once, updated in place).

    Attributes:
        S: [B, H, K, V] fp32 delta-rule state (H = H_v for GDN, H_kv for attention).
        conv: [B, kernel-1, channels] conv tail (GDN layers, and attention layers
            with ``attention_conv_kernel_dim > 0``).
        win_k, win_v: [B, H_kv, W, D] ring buffer of RoPE'd keys / values
            (attention layers in ``state+window`` mode only).
    """

    S: torch.Tensor
    conv: torch.Tensor | None = None
    win_k: torch.Tensor | None = None
    win_v: torch.Tensor | None = None


@dataclass
class CloverState:
    """All layers' state plus how many tokens have been committed.

    Memory is constant in context length: nothing here grows with `position`.
    """

    layers: list[LayerState]
    memory_mode: str
    window: int
    position: int = 0  # tokens committed so far (absolute position of the next token)

    def nbytes(self) -> int:
        """Bytes held by all state tensors."""
        total = 0
        for ls in self.layers:
            for t in (ls.S, ls.conv, ls.win_k, ls.win_v):
                if t is not None:
                    total += t.numel() * t.element_size()
        return total


@dataclass
class _Ctx:
    """Per-forward context handed to the mixers."""

    n_commit: int  # C, committed tokens at the front of the forward
    chunk: int  # commit chunk length (the block size)
    pos: torch.Tensor  # [T] absolute positions of all tokens in the forward
    start: int  # absolute position of the first committed token (window slot arithmetic)
    observe: bool
    reference: bool  # naive recurrence + explicit window (forward_reference)
    train: bool = False  # x = [clean T ++ noisy T]; noisy block b reads the state before clean block b
    window: int = 0  # W of the explicit window (reference / training); the fast path uses the ring
    prefill: bool = False  # fast path, fresh state, several commit chunks: commit all chunks at once
    memory_share: list = field(default_factory=list)  # per layer [B, L]
    state_norm: list = field(default_factory=list)  # per layer scalar
    expert_union: list = field(default_factory=list)  # per layer int


@dataclass
class ModelOutput:
    """Result of one forward.

    Attributes:
        logits: [B, L, vocab] fp32 logits of the block slots.
        expert_union: [N] int64 distinct routed experts over all T tokens, per layer.
        memory_share: [N, B, L] fp32 memory-unit softmax mass (head mean), or None.
        state_norm: [N] fp32 Frobenius norm of each layer's state after the commit, or None.
    """

    logits: torch.Tensor
    expert_union: torch.Tensor
    memory_share: torch.Tensor | None = None
    state_norm: torch.Tensor | None = None


# ---------------------------------------------------------------------- building blocks
class RMSNorm(nn.Module):
    """Qwen3.5 RMSNorm: ``x / rms(x) * (1 + w)`` in fp32, ``w`` initialised to 0."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """GDN output norm: ``w * rmsnorm(x) * silu(z)`` per head, ``w`` initialised to 1."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return (y * F.silu(z.float())).to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, rot_dim: int, theta: float) -> torch.Tensor:
    """Rotary embedding on the first `rot_dim` dims of the last axis (rotate-half form).

    Args:
        x: [B, H, T, D]; pos: [T] absolute positions (int64).
    """
    if rot_dim == 0:
        return x
    inv_freq = theta ** (-torch.arange(0, rot_dim, 2, dtype=torch.float32, device=x.device) / rot_dim)
    ang = pos.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, rot/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)  # [T, rot]
    xr, xp = x[..., :rot_dim], x[..., rot_dim:]
    x1, x2 = xr[..., : rot_dim // 2], xr[..., rot_dim // 2:]
    rotated = torch.cat([-x2, x1], -1)
    return torch.cat([(xr.float() * cos + rotated.float() * sin).to(x.dtype), xp], -1)


def block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: torch.Tensor | float,
    mem_out: torch.Tensor,
    mem_logit: torch.Tensor,
    extra_k: torch.Tensor | None = None,
    extra_v: torch.Tensor | None = None,
    extra_valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bidirectional attention inside one block, with the memory read-out as a softmax unit.

    ``a = softmax([scale q_i.k_j]_j ++ [scale q_i.k^w_j]_j ++ [l_i])``;
    ``o_i = sum_j a_ij v_j + sum_j a^w_ij v^w_j + a_i,mem m_i`` (docs/architecture.md §3).

    Args:
        q, k: [B, H, L, K]; v: [B, H, L, V] (k/v already expanded to H heads).
        scale: float or [H] per-head score scale.
        mem_out: [B, H, L, V] state read-out; mem_logit: [B, H, L].
        extra_k / extra_v: [B, H, W, K] / [B, H, W, V] window keys (or None);
        extra_valid: [W] bool, which window slots hold a token.

    Returns:
        o: [B, H, L, V]; memory share [B, H, L] (fp32).
    """
    if torch.is_tensor(scale):
        scale = scale.view(1, -1, 1, 1)
    scores = [(q @ k.transpose(-1, -2)).float() * scale]  # [B, H, L, L]
    if extra_k is not None:
        sw = (q @ extra_k.transpose(-1, -2)).float() * scale  # [B, H, L, W]
        keep = extra_valid.view(1, 1, 1, -1) if extra_valid.dim() == 1 else extra_valid[:, None, None, :]
        scores.append(sw.masked_fill(~keep, float("-inf")))
    scores.append(mem_logit.float()[..., None])
    a = torch.softmax(torch.cat(scores, -1), dim=-1)
    L = k.shape[-2]
    o = a[..., :L].to(v.dtype) @ v
    if extra_k is not None:
        o = o + a[..., L:-1].to(v.dtype) @ extra_v
    share = a[..., -1]
    o = o + share[..., None].to(v.dtype) * mem_out
    return o, share


_BAND_MAX_BLOCK = 8
"""Training with a window: blocks of at most this many slots use `GatedAttention._band_blocks`."""


def _dt_bias_init(n: int, dt_min: float = 1e-3, dt_max: float = 0.1) -> torch.Tensor:
    """flash-linear-attention's GatedDeltaNet init: softplus(dt_bias) log-uniform in
    [dt_min, dt_max], so the initial decay per token is exp(-A * dt) ~ 0.9-1.0."""
    dt = torch.exp(torch.empty(n).uniform_(math.log(dt_min), math.log(dt_max)))
    return dt + torch.log(-torch.expm1(-dt))  # inverse softplus


def _schedule(ctx: _Ctx, T: int) -> list[tuple[list[tuple[int, int]], tuple[int, int] | None, int]]:
    """The order in which a mixer reads and updates its state, as
    ``(read ranges, update range or None, absolute position of the ranges' first token)``.

    Inference / reference: each commit chunk reads the state and then folds
    itself in; the block reads the final state. Training: block b of the
    clean half and block b of the noisy half both read the state before
    clean block b, then clean block b is folded in.
    """
    if ctx.train:
        n = ctx.n_commit
        return [([(s, s + ctx.chunk), (n + s, n + s + ctx.chunk)], (s, s + ctx.chunk), s)
                for s in range(0, n, ctx.chunk)]
    steps = [([(s, min(s + ctx.chunk, ctx.n_commit))], (s, min(s + ctx.chunk, ctx.n_commit)), ctx.start + s)
             for s in range(0, ctx.n_commit, ctx.chunk)]
    return steps + [([(ctx.n_commit, T)], None, ctx.start + ctx.n_commit)]


def _to_blocks(t: torch.Tensor, L: int) -> torch.Tensor:
    """[B, H, n, ...] -> [B * n/L, H, L, ...]: one batch row per block."""
    B, H, n = t.shape[:3]
    t = t.reshape(B, H, n // L, L, *t.shape[3:]).transpose(1, 2)
    return t.reshape(B * (n // L), H, L, *t.shape[4:])


def _from_blocks(t: torch.Tensor, B: int) -> torch.Tensor:
    """Inverse of `_to_blocks`: [B * nb, H, L, ...] -> [B, H, nb * L, ...]."""
    nb, H, L = t.shape[0] // B, t.shape[1], t.shape[2]
    t = t.reshape(B, nb, H, L, *t.shape[3:]).transpose(1, 2)
    return t.reshape(B, H, nb * L, *t.shape[4:])


def _delta_update(S, k, v, g, beta, reference: bool):
    """Fold a committed chunk into state S with the gated delta rule; returns the new S.

    k: [B, C, H, K] (L2-normalised inside), v: [B, C, H, V], g / beta: [B, C, H].
    """
    impl = "naive" if reference else None
    _, S_new = gated_delta_rule(k, k, v, g, beta, initial_state=S, output_final_state=True,
                                use_qk_l2norm_in_kernel=True, impl=impl)
    return S_new


def causal_conv(x: torch.Tensor, weight: torch.Tensor, ctx: _Ctx, st: LayerState) -> torch.Tensor:
    """Causal depthwise conv over time, carrying its tail across forwards (no activation).

    Inference: over ``[tail ++ commit ++ block]``; the tail becomes the last
    (kernel-1) inputs of ``[tail ++ commit]`` (never the block). Training: the
    clean half from a zero tail; each noisy block b sees the clean inputs just
    before clean block b as its tail -- what the decoder sees when it decodes block b.

    Args:
        x: [B, T, channels] projections; weight: [channels, 1, kernel] (``nn.Conv1d``
            depthwise weight); st.conv: [B, kernel-1, channels] tail, updated in place
            (inference only).

    Returns:
        [B, T, channels], dtype of x.
    """
    k1 = weight.shape[-1] - 1
    channels = x.shape[-1]
    if not ctx.train:
        conv_in = torch.cat([st.conv.to(x.dtype), x], 1)  # [B, k-1+T, channels]
        out = F.conv1d(conv_in.transpose(1, 2), weight, groups=channels).transpose(1, 2)
        tail = conv_in[:, : k1 + ctx.n_commit]
        st.conv.copy_(tail[:, tail.shape[1] - k1:].detach().to(st.conv.dtype))
        return out
    B, n, L = x.shape[0], ctx.n_commit, ctx.chunk
    nb = n // L
    clean_in = torch.cat([x.new_zeros(B, k1, channels), x[:, :n]], 1)  # [B, k-1+n, ch]
    clean = F.conv1d(clean_in.transpose(1, 2), weight, groups=channels).transpose(1, 2)
    idx = (torch.arange(nb, device=x.device) * L)[:, None] + torch.arange(k1, device=x.device)
    tails = clean_in[:, idx]  # [B, nb, k-1, ch]
    noisy_in = torch.cat([tails, x[:, n:].reshape(B, nb, L, channels)], 2)
    noisy = F.conv1d(noisy_in.reshape(B * nb, k1 + L, channels).transpose(1, 2), weight,
                     groups=channels).transpose(1, 2).reshape(B, n, channels)
    return torch.cat([clean, noisy], 1)


# --------------------------------------------------------------------------- mixers
class GatedDeltaNet(nn.Module):
    """Gated DeltaNet mixer (Qwen3.5 layout: separate in_proj_qkv / z / b / a).

    In-block: bidirectional attention over L2-normalised, RoPE'd q/k with a
    learned per-value-head temperature, plus the state read-out
    ``m = S^T (q / sqrt(K))`` as a softmax unit. Commit: gated delta rule with
    ``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)``.
    """

    def __init__(self, cfg: CloverConfig):
        super().__init__()
        self.cfg = cfg
        self.Hk, self.Hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.K, self.V = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.channels = 2 * self.Hk * self.K + self.Hv * self.V
        D = cfg.hidden_size
        self.in_proj_qkv = nn.Linear(D, self.channels, bias=False)
        self.in_proj_z = nn.Linear(D, self.Hv * self.V, bias=False)
        self.in_proj_b = nn.Linear(D, self.Hv, bias=False)
        self.in_proj_a = nn.Linear(D, self.Hv, bias=False)
        self.conv1d = nn.Conv1d(self.channels, self.channels, cfg.linear_conv_kernel_dim,
                                groups=self.channels, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.empty(self.Hv).uniform_(1, 16)))
        self.dt_bias = nn.Parameter(_dt_bias_init(self.Hv))
        self.norm = GatedRMSNorm(self.V, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.Hv * self.V, D, bias=False)
        # block-diffusion additions
        self.block_temperature = nn.Parameter(torch.full((self.Hv,), cfg.block_temperature_init))
        self.mem_w = nn.Parameter(torch.randn(self.Hv, self.K) * 0.02)
        self.mem_b = nn.Parameter(torch.full((self.Hv,), cfg.memory_logit_bias_init))

    def init_state(self, batch: int, device, dtype) -> LayerState:
        k = self.cfg.linear_conv_kernel_dim
        return LayerState(
            S=torch.zeros(batch, self.Hv, self.K, self.V, dtype=torch.float32, device=device),
            conv=torch.zeros(batch, k - 1, self.channels, dtype=dtype, device=device),
        )

    def forward(self, x: torch.Tensor, ctx: _Ctx, st: LayerState) -> torch.Tensor:
        B, T, _ = x.shape
        qkv = F.silu(causal_conv(self.in_proj_qkv(x), self.conv1d.weight, ctx, st))  # [B, T, channels]
        q, k, v = torch.split(qkv, [self.Hk * self.K, self.Hk * self.K, self.Hv * self.V], -1)
        q = l2norm(q.reshape(B, T, self.Hk, self.K).float())  # [B, T, Hk, K]
        k = l2norm(k.reshape(B, T, self.Hk, self.K).float())
        v = v.reshape(B, T, self.Hv, self.V)
        beta = torch.sigmoid(self.in_proj_b(x).float())  # [B, T, Hv]
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())

        rep = self.Hv // self.Hk
        qh = q.repeat_interleave(rep, 2).transpose(1, 2)  # [B, Hv, T, K]
        kh = k.repeat_interleave(rep, 2).transpose(1, 2)
        vh = v.transpose(1, 2).float()  # [B, Hv, T, V]
        q_rot = rope(qh, ctx.pos, self.cfg.linear_rotary_dim, self.cfg.rope_theta)
        k_rot = rope(kh, ctx.pos, self.cfg.linear_rotary_dim, self.cfg.rope_theta)
        # fp32 from here on whatever the weights' dtype (bf16 / fp16 models): cast the small parameters
        temperature = self.block_temperature.float()
        mem_logit = temperature.view(1, -1, 1) * torch.einsum("bhtk,hk->bht", qh, self.mem_w.float())
        mem_logit = mem_logit + self.mem_b.float().view(1, -1, 1)
        q_read = qh * self.K**-0.5

        if ctx.train:  # all blocks at once: states at every clean block boundary, then batched blocks
            n, L = ctx.n_commit, ctx.chunk
            S_b, _ = chunk_states(k[:, :n], v[:, :n], g[:, :n], beta[:, :n], st.S, L)  # [B, Hv, nb, K, V]
            S_b = S_b.transpose(1, 2).reshape(-1, self.Hv, self.K, self.V)  # [B*nb, Hv, K, V]
            halves = []
            for h0 in (0, n):
                sl = slice(h0, h0 + n)
                m = _to_blocks(q_read[:, :, sl], L) @ S_b  # [B*nb, Hv, L, V]
                o, _ = block_attention(_to_blocks(q_rot[:, :, sl], L), _to_blocks(k_rot[:, :, sl], L),
                                       _to_blocks(vh[:, :, sl], L), self.block_temperature, m,
                                       _to_blocks(mem_logit[:, :, sl], L))
                halves.append(_from_blocks(o, B))
            o = torch.cat(halves, 2).transpose(1, 2)  # [B, T, Hv, V]
            z = self.in_proj_z(x).reshape(B, T, self.Hv, self.V)
            return self.out_proj(self.norm(o, z).to(x.dtype).reshape(B, T, self.Hv * self.V))

        if ctx.prefill:  # a whole prompt: every commit chunk at once, then the block on the final state
            n, L = ctx.n_commit, ctx.chunk
            S_b, S = chunk_states(k[:, :n], v[:, :n], g[:, :n], beta[:, :n], st.S, L)
            S_b = S_b.transpose(1, 2).reshape(-1, self.Hv, self.K, self.V)  # [B*nb, Hv, K, V]
            o_c, _ = block_attention(_to_blocks(q_rot[:, :, :n], L), _to_blocks(k_rot[:, :, :n], L),
                                     _to_blocks(vh[:, :, :n], L), self.block_temperature,
                                     _to_blocks(q_read[:, :, :n], L) @ S_b, _to_blocks(mem_logit[:, :, :n], L))
            o_b, share = block_attention(q_rot[:, :, n:], k_rot[:, :, n:], vh[:, :, n:], self.block_temperature,
                                         q_read[:, :, n:] @ S, mem_logit[:, :, n:])
            outs = [(0, _from_blocks(o_c, B)), (n, o_b)]
        else:
            S, outs, share = self._scheduled(ctx, T, st.S, q_read, q_rot, k_rot, vh, mem_logit, k, v, g, beta)
        st.S.copy_(S)
        if ctx.observe:
            ctx.memory_share.append(share.mean(1).detach())  # [B, L]
            ctx.state_norm.append(S.detach().norm())
        o = torch.cat([o for _, o in sorted(outs, key=lambda t: t[0])], 2).transpose(1, 2)  # [B, T, Hv, V]
        z = self.in_proj_z(x).reshape(B, T, self.Hv, self.V)
        o = self.norm(o, z).to(x.dtype).reshape(B, T, self.Hv * self.V)
        return self.out_proj(o)

    def _scheduled(self, ctx, T, S, q_read, q_rot, k_rot, vh, mem_logit, k, v, g, beta):
        """Chunk by chunk (decode steps and the reference path): see `_schedule`."""
        outs = []
        for reads, update, _ in _schedule(ctx, T):
            for s, e in reads:
                m = q_read[:, :, s:e] @ S  # [B, Hv, l, V]
                o, share = block_attention(q_rot[:, :, s:e], k_rot[:, :, s:e], vh[:, :, s:e],
                                           self.block_temperature, m, mem_logit[:, :, s:e])
                outs.append((s, o))
            if update is not None:  # a committed chunk: fold it into the state
                s, e = update
                S = _delta_update(S, k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], ctx.reference)
        return S, outs, share


class GatedAttention(nn.Module):
    """Gated full attention (Qwen3.5: q/k RMSNorm, partial RoPE, sigmoid output gate, GQA).

    History: a delta-rule memory state over L2-normalised keys and values per
    KV head, with its own gates (``mem_a``, ``mem_b``, ``mem_A_log``,
    ``mem_dt_bias``); read by ``m = S^T (l2norm(q) / sqrt(D))``. In
    ``state+window`` mode, the RoPE'd K/V of the last W committed tokens join
    the softmax.
    """

    def __init__(self, cfg: CloverConfig):
        super().__init__()
        self.cfg = cfg
        self.Hq, self.Hkv, self.D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        Dm = cfg.hidden_size
        self.q_proj = nn.Linear(Dm, self.Hq * self.D * 2, bias=False)  # query + output gate
        self.k_proj = nn.Linear(Dm, self.Hkv * self.D, bias=False)
        self.v_proj = nn.Linear(Dm, self.Hkv * self.D, bias=False)
        self.o_proj = nn.Linear(self.Hq * self.D, Dm, bias=False)
        self.q_norm = RMSNorm(self.D, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.D, cfg.rms_norm_eps)
        self.conv1d = None
        if cfg.attention_conv_kernel_dim:  # Primer-style short conv on q/k/v, initialised to identity
            self.conv_channels = (self.Hq + 2 * self.Hkv) * self.D
            self.conv1d = nn.Conv1d(self.conv_channels, self.conv_channels, cfg.attention_conv_kernel_dim,
                                    groups=self.conv_channels, bias=False)
            with torch.no_grad():
                self.conv1d.weight.zero_()
                self.conv1d.weight[..., -1] = 1.0
        # memory state gates and memory unit
        self.mem_a = nn.Linear(Dm, self.Hkv, bias=False)
        self.mem_b = nn.Linear(Dm, self.Hkv, bias=False)
        self.mem_A_log = nn.Parameter(torch.log(torch.empty(self.Hkv).uniform_(1, 16)))
        self.mem_dt_bias = nn.Parameter(_dt_bias_init(self.Hkv))
        self.mem_w = nn.Parameter(torch.randn(self.Hq, self.D) * 0.02)
        self.mem_b_logit = nn.Parameter(torch.full((self.Hq,), cfg.memory_logit_bias_init))

    def init_state(self, batch: int, device, dtype, window: int) -> LayerState:
        st = LayerState(S=torch.zeros(batch, self.Hkv, self.D, self.D, dtype=torch.float32, device=device))
        if self.conv1d is not None:
            st.conv = torch.zeros(batch, self.cfg.attention_conv_kernel_dim - 1, self.conv_channels,
                                  dtype=dtype, device=device)
        if window:
            st.win_k = torch.zeros(batch, self.Hkv, window, self.D, dtype=dtype, device=device)
            st.win_v = torch.zeros(batch, self.Hkv, window, self.D, dtype=dtype, device=device)
        return st

    def forward(self, x: torch.Tensor, ctx: _Ctx, st: LayerState) -> torch.Tensor:
        B, T, _ = x.shape
        rep = self.Hq // self.Hkv
        qg = self.q_proj(x).reshape(B, T, self.Hq, 2 * self.D)
        q, gate = qg[..., : self.D], qg[..., self.D:]
        k, v = self.k_proj(x), self.v_proj(x)
        if self.conv1d is not None:
            qkv = causal_conv(torch.cat([q.reshape(B, T, -1), k, v], -1), self.conv1d.weight, ctx, st)
            q, k, v = torch.split(qkv, [self.Hq * self.D, self.Hkv * self.D, self.Hkv * self.D], -1)
        q = self.q_norm(q.reshape(B, T, self.Hq, self.D))  # [B, T, Hq, D]
        k = self.k_norm(k.reshape(B, T, self.Hkv, self.D))
        v = v.reshape(B, T, self.Hkv, self.D)
        beta = torch.sigmoid(self.mem_b(x).float())  # [B, T, Hkv]
        g = -self.mem_A_log.float().exp() * F.softplus(self.mem_a(x).float() + self.mem_dt_bias)

        qh = q.transpose(1, 2)  # [B, Hq, T, D]
        q_rot = rope(qh, ctx.pos, self.cfg.rotary_dim, self.cfg.rope_theta)
        k_rot = rope(k.transpose(1, 2), ctx.pos, self.cfg.rotary_dim, self.cfg.rope_theta)  # [B, Hkv, T, D]
        vh = v.transpose(1, 2)  # [B, Hkv, T, D]
        scale = self.D**-0.5
        mem_logit = scale * torch.einsum("bhtd,hd->bht", qh.float(), self.mem_w.float())
        mem_logit = mem_logit + self.mem_b_logit.view(1, -1, 1)
        q_read = l2norm(qh.float()) * scale  # [B, Hq, T, D]

        if ctx.train or ctx.prefill:
            return self._forward_blocks(x, ctx, st, q_rot, k_rot, vh, k, v, g, beta, q_read, mem_logit, gate, scale)
        explicit = ctx.reference
        W = ctx.window if explicit else (st.win_k.shape[2] if st.win_k is not None else 0)
        S = st.S
        outs = []
        for reads, update, seg_pos in _schedule(ctx, T):
            S_q = S.repeat_interleave(rep, 1)  # [B, Hq, D, D]
            ek = ev = valid = None
            if W:
                ek, ev, valid = self._window(st, ctx, seg_pos, W, k_rot, vh)
                ek, ev = ek.repeat_interleave(rep, 1), ev.repeat_interleave(rep, 1)
            for s, e in reads:
                m = (q_read[:, :, s:e] @ S_q).to(vh.dtype)  # [B, Hq, l, D]
                o, share = block_attention(
                    q_rot[:, :, s:e], k_rot[:, :, s:e].repeat_interleave(rep, 1),
                    vh[:, :, s:e].repeat_interleave(rep, 1), scale, m, mem_logit[:, :, s:e], ek, ev, valid,
                )
                outs.append((s, o))
            if update is not None:
                s, e = update
                S = _delta_update(S, k[:, s:e].float(), v[:, s:e].float(), g[:, s:e], beta[:, s:e],
                                  ctx.reference)
                if W and not explicit:  # push the chunk's last <= W tokens into the ring
                    t0 = max(s, e - W)
                    slots = (ctx.start + torch.arange(t0, e, device=x.device)) % W
                    st.win_k[:, :, slots] = k_rot[:, :, t0:e].to(st.win_k.dtype)
                    st.win_v[:, :, slots] = vh[:, :, t0:e].to(st.win_v.dtype)
        if not ctx.train:
            st.S.copy_(S)
        if ctx.observe:
            ctx.memory_share.append(share.mean(1).detach())
            ctx.state_norm.append(S.detach().norm())
        o = torch.cat([o for _, o in sorted(outs, key=lambda t: t[0])], 2).transpose(1, 2)  # [B, T, Hq, D]
        o = o * torch.sigmoid(gate)
        return self.o_proj(o.reshape(B, T, self.Hq * self.D))

    def _forward_blocks(self, x, ctx, st, q_rot, k_rot, vh, k, v, g, beta, q_read, mem_logit, gate, scale):
        """Every committed chunk at once. Training: the clean and the noisy half both read the
        states at the clean block boundaries (see `CloverModel.forward_train`). Prefill: the
        commit chunks read those states, the block reads the final one, the state and the
        ring buffer are written."""
        B, T, _ = x.shape
        n, L = ctx.n_commit, ctx.chunk
        W = ctx.window if ctx.train else (st.win_k.shape[2] if st.win_k is not None else 0)
        nb, rep = n // L, self.Hq // self.Hkv
        S_b, S = chunk_states(k[:, :n].float(), v[:, :n].float(), g[:, :n], beta[:, :n], st.S, L)
        S_b = S_b.repeat_interleave(rep, 1).transpose(1, 2).reshape(B * nb, self.Hq, self.D, self.D)
        band = ctx.train and W and L <= _BAND_MAX_BLOCK  # small training blocks: `_band_blocks`
        wk = wv = valid = None
        if W and not band:  # block b sees the committed K/V at [bL - W, bL); window nb = the final block's
            pad = k_rot.new_zeros(B, self.Hkv, W, self.D)
            kp = torch.cat([pad, k_rot[:, :, :n]], 2).unfold(2, W, L)  # [B, Hkv, nb+1, D, W]
            vp = torch.cat([pad.to(vh.dtype), vh[:, :, :n]], 2).unfold(2, W, L)
            wk = kp.permute(0, 2, 1, 4, 3).repeat_interleave(rep, 2)  # [B, nb+1, Hq, W, D]
            wv = vp.permute(0, 2, 1, 4, 3).repeat_interleave(rep, 2)
            j = torch.arange(W, device=x.device)
            starts = torch.arange(nb + 1, device=x.device) * L
            valid = j[None, :] >= (W - starts)[:, None]  # [nb+1, W]

        def run_blocks(sl):  # all nb blocks of the half `sl`, reading S_b (and windows 0..nb-1)
            if band:
                return self._band_blocks(q_rot[:, :, sl], k_rot[:, :, sl], vh[:, :, sl], k_rot[:, :, :n],
                                         vh[:, :, :n], q_read[:, :, sl], S_b, mem_logit[:, :, sl], L, W, scale)
            ek = ev = vv = None
            if W:
                ek = wk[:, :nb].reshape(B * nb, self.Hq, W, self.D)
                ev = wv[:, :nb].reshape(B * nb, self.Hq, W, self.D)
                vv = valid[:nb].repeat(B, 1)  # [B*nb, W]
            m = (_to_blocks(q_read[:, :, sl], L) @ S_b).to(vh.dtype)  # [B*nb, Hq, L, D]
            o, _ = block_attention(
                _to_blocks(q_rot[:, :, sl], L), _to_blocks(k_rot[:, :, sl], L).repeat_interleave(rep, 1),
                _to_blocks(vh[:, :, sl], L).repeat_interleave(rep, 1), scale, m,
                _to_blocks(mem_logit[:, :, sl], L), ek, ev, vv)
            return _from_blocks(o, B)

        if ctx.train:
            o = torch.cat([run_blocks(slice(0, n)), run_blocks(slice(n, 2 * n))], 2)
        else:
            S_q = S.repeat_interleave(rep, 1)
            m = (q_read[:, :, n:] @ S_q).to(vh.dtype)
            o_b, share = block_attention(
                q_rot[:, :, n:], k_rot[:, :, n:].repeat_interleave(rep, 1), vh[:, :, n:].repeat_interleave(rep, 1),
                scale, m, mem_logit[:, :, n:], wk[:, nb] if W else None, wv[:, nb] if W else None,
                valid[nb] if W else None)
            o = torch.cat([run_blocks(slice(0, n)), o_b], 2)
            st.S.copy_(S)
            if W:  # the ring holds the last <= W committed tokens at slot position % W
                t0 = max(0, n - W)
                slots = torch.arange(t0, n, device=x.device) % W
                st.win_k[:, :, slots] = k_rot[:, :, t0:n].to(st.win_k.dtype)
                st.win_v[:, :, slots] = vh[:, :, t0:n].to(st.win_v.dtype)
            if ctx.observe:
                ctx.memory_share.append(share.mean(1).detach())
                ctx.state_norm.append(S.detach().norm())
        o = o.transpose(1, 2) * torch.sigmoid(gate)  # [B, T, Hq, D]
        return self.o_proj(o.reshape(B, T, self.Hq * self.D))

    def _band_blocks(self, q, k, v, k_clean, v_clean, q_read, S_b, mem_logit, L, W, scale):
        """Training, small blocks: every block of one half at once as a [n, n] banded attention.

        Same result as `block_attention` per block with the clean window, without building
        nb copies of the W-token window (for L <= 8 those copies cost ~4x the step).
        Query i (block b = i // L) sees keys j of its own half with j // L == b, the clean
        keys with bL - W <= j < bL, and its memory unit.

        Args:
            q: [B, Hq, n, D]; k, v: [B, Hkv, n, D] this half's keys/values; k_clean, v_clean:
                [B, Hkv, n, D] the clean half's; q_read: [B, Hq, n, D]; S_b: [B*nb, Hq, D, D];
                mem_logit: [B, Hq, n]; L: block size; W: window.

        Returns:
            [B, Hq, n, D].
        """
        B, Hq, n, D = q.shape
        rep = Hq // k.shape[1]
        blk = torch.arange(n, device=q.device) // L
        j = torch.arange(n, device=q.device)
        in_blk = blk[:, None] == blk[None, :]  # [n, n]
        start = (blk * L)[:, None]
        in_win = (j[None, :] < start) & (j[None, :] >= start - W)
        s_in = (q @ k.repeat_interleave(rep, 1).transpose(-1, -2)).float() * scale
        s_w = (q @ k_clean.repeat_interleave(rep, 1).transpose(-1, -2)).float() * scale
        scores = torch.cat([s_in.masked_fill(~in_blk, float("-inf")), s_w.masked_fill(~in_win, float("-inf")),
                            mem_logit.float()[..., None]], -1)
        a = torch.softmax(scores, -1)
        m = _from_blocks(_to_blocks(q_read, L) @ S_b, B).to(v.dtype)  # [B, Hq, n, D]
        o = a[..., :n].to(v.dtype) @ v.repeat_interleave(rep, 1)
        o = o + a[..., n:2 * n].to(v.dtype) @ v_clean.repeat_interleave(rep, 1)
        return o + a[..., -1:].to(v.dtype) * m

    def _window(self, st, ctx, seg_pos, W, k_rot, vh):
        """Window keys/values visible to a segment starting at absolute `seg_pos`.

        Fast path: the ring buffer (slot = position mod W), valid where a token
        with position in [seg_pos - W, seg_pos) has been written. Reference and
        training: an explicit slice of the committed (clean) K/V of this pass.
        """
        if ctx.reference:
            hk, hv = k_rot[:, :, : ctx.n_commit], vh[:, :, : ctx.n_commit]
            lo = max(0, seg_pos - ctx.start - W)
            hi = seg_pos - ctx.start
            ek, ev = hk[:, :, lo:hi], hv[:, :, lo:hi]
            pad = W - ek.shape[2]
            valid = torch.zeros(W, dtype=torch.bool, device=k_rot.device)
            valid[pad:] = True
            ek = F.pad(ek, (0, 0, pad, 0))
            ev = F.pad(ev, (0, 0, pad, 0))
            return ek, ev, valid
        # tokens 0..seg_pos-1 have been pushed; slot p % W holds position p
        valid = torch.arange(W, device=k_rot.device) < min(seg_pos, W)
        return st.win_k, st.win_v, valid


# ------------------------------------------------------------------------------- MoE
class SparseMoE(nn.Module):
    """Softmax router over E experts (fp32), top-k, renormalised; SwiGLU experts;
    a shared SwiGLU expert scaled by ``sigmoid(Linear(x))`` (Qwen3.5-MoE).

    Returns the output and the expert union (distinct routed experts over all
    tokens of the forward) as a Python int -- the host sync is needed anyway to
    loop over the hit experts.
    """

    def __init__(self, cfg: CloverConfig):
        super().__init__()
        D, F_, E = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
        self.top_k, self.norm_topk = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = nn.Linear(D, E, bias=False)  # router
        self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * F_, D) * 0.02)
        self.down_proj = nn.Parameter(torch.randn(E, D, F_) * 0.02)
        Fs = cfg.shared_expert_intermediate_size
        self.shared_gate_up = nn.Linear(D, 2 * Fs, bias=False)
        self.shared_down = nn.Linear(Fs, D, bias=False)
        self.shared_expert_gate = nn.Linear(D, 1, bias=False)
        self.last_topk: torch.Tensor | None = None  # [T, k] ids of the last forward (for hooks/tests)
        self.aux_loss: torch.Tensor | None = None  # load-balancing loss of the last training forward

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [T, D]
        probs = torch.softmax(self.gate(x).float(), dim=-1)  # [T, E]
        w, idx = probs.topk(self.top_k, dim=-1)  # [T, k]
        if self.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        self.last_topk = idx.detach()
        if self.training:  # Switch-Transformer load balancing: E * sum_e f_e * P_e (1.0 when uniform)
            E = probs.shape[-1]
            f = torch.zeros(E, device=x.device).index_add_(0, idx.reshape(-1), torch.ones(idx.numel(), device=x.device))
            self.aux_loss = E * (f / idx.numel() * probs.mean(0)).sum()
        # group the T*k (token, expert) pairs by expert; run each hit expert once on its rows
        flat = idx.reshape(-1)  # [T*k]
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=probs.shape[-1]).tolist()
        xs = x[order // self.top_k]  # [T*k, D]
        ys, start, hit = [], 0, 0
        for e, n in enumerate(counts):
            if n:
                h = xs[start:start + n] @ self.gate_up_proj[e].t()  # [n, 2F]
                gte, up = h.chunk(2, -1)
                ys.append((F.silu(gte) * up) @ self.down_proj[e].t())  # [n, D]
                start += n
                hit += 1
        y = torch.cat(ys) * w.reshape(-1)[order, None].to(x.dtype)
        y_pairs = torch.empty_like(y)
        y_pairs[order] = y  # back to (token, slot) order
        out = y_pairs.view(-1, self.top_k, x.shape[-1]).sum(1)  # [T, D]
        gte, up = self.shared_gate_up(x).chunk(2, -1)
        shared = self.shared_down(F.silu(gte) * up) * torch.sigmoid(self.shared_expert_gate(x))
        return (out + shared).reshape(shape), hit


# ---------------------------------------------------------------------------- layers
class DecoderLayer(nn.Module):
    """Pre-norm residual block: mixer (GDN or gated attention), then MoE."""

    def __init__(self, cfg: CloverConfig, idx: int):
        super().__init__()
        self.idx = idx
        self.layer_type = cfg.layer_types[idx]
        if self.layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        elif self.layer_type == "full_attention":
            self.self_attn = GatedAttention(cfg)
        else:
            raise ValueError(f"layer {idx}: unknown layer type {self.layer_type!r}")
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SparseMoE(cfg)

    def mixer(self, x, ctx, st):
        if self.layer_type == "linear_attention":
            return self.linear_attn(x, ctx, st)
        return self.self_attn(x, ctx, st)

    def forward(self, x: torch.Tensor, ctx: _Ctx, st: LayerState) -> torch.Tensor:
        x = x + self.mixer(self.input_layernorm(x), ctx, st)
        h, union = self.mlp(self.post_attention_layernorm(x))
        ctx.expert_union.append(union)
        return x + h


class CloverModel(nn.Module):
    """Clover block-diffusion LM (see module docstring).

    Args:
        config: a `CloverConfig`.
    """

    def __init__(self, config: CloverConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.model_id = config.name

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    # ------------------------------------------------------------------ state
    def setup_state(self, batch_size: int = 1, memory_mode: str = "state") -> CloverState:
        """Allocate every layer's state once (zeros, position 0).

        Args:
            batch_size: sequences decoded together.
            memory_mode: ``"state"`` (Clover) or ``"state+window"`` (attention
                layers also keep the last ``config.attention_window`` committed K/V).

        Raises:
            ValueError: unknown mode, or ``state+window`` on a config with
                ``attention_window == 0``.
        """
        if memory_mode not in MEMORY_MODES:
            raise ValueError(f"memory_mode must be one of {MEMORY_MODES}, got {memory_mode!r}")
        W = self.config.attention_window if memory_mode == "state+window" else 0
        if memory_mode == "state+window" and W == 0:
            raise ValueError(
                "memory_mode='state+window' needs config.attention_window > 0; this model has no "
                "window -- use memory_mode='state'"
            )
        layers = []
        for layer in self.layers:
            if layer.layer_type == "linear_attention":
                layers.append(layer.linear_attn.init_state(batch_size, self.device, self.dtype))
            else:
                layers.append(layer.self_attn.init_state(batch_size, self.device, self.dtype, W))
        return CloverState(layers=layers, memory_mode=memory_mode, window=W)

    # ---------------------------------------------------------------- forward
    def forward(
        self,
        block_ids: torch.Tensor,
        state: CloverState,
        commit_ids: torch.Tensor | None = None,
        block_size: int | None = None,
        observe: bool = False,
    ) -> ModelOutput:
        """One denoising forward of the current block, with the fused commit.

        Args:
            block_ids: [B, L] int64 current block (prompt head, written tokens, MASK).
                Its slot 0 sits at absolute position ``state.position + C``.
            state: from `setup_state`; updated in place by the commit.
            commit_ids: [B, C] int64 finished tokens to fold into the state first
                (C a multiple of `block_size`, or one block), or None.
            block_size: commit chunk length (the decode's block size); default C.
            observe: also return memory shares and state norms (for hooks).

        Returns:
            `ModelOutput` with logits [B, L, vocab] (fp32).
        """
        return self._run(block_ids, state, commit_ids, block_size, observe, reference=False)

    @torch.no_grad()
    def forward_reference(
        self,
        history_ids: torch.Tensor,
        block_ids: torch.Tensor,
        block_size: int,
        memory_mode: str = "state",
    ) -> ModelOutput:
        """The definition the fast path must equal: every state recomputed from scratch.

        Runs a fresh state over all of `history_ids` (block by block, token-loop
        gated delta rule, window taken as an explicit slice of the history's
        K/V) and then the block.

        Args:
            history_ids: [B, P] committed tokens from position 0 (P a multiple of block_size).
            block_ids: [B, L] the current block at position P.
        """
        state = self.setup_state(block_ids.shape[0], memory_mode)
        commit = history_ids if history_ids.shape[1] else None
        return self._run(block_ids, state, commit, block_size, True, reference=True)

    def forward_train(self, clean_ids: torch.Tensor, noisy_ids: torch.Tensor, block_size: int,
                      use_window: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Block-diffusion training forward (docs/architecture.md §9).

        One pass over the clean sequence gives every block-boundary state (the
        clean blocks are committed one after another, chunk = block); the noisy
        blocks run in the same pass, block b reading the state (and, with
        `use_window`, the clean K/V window) left by clean blocks 0..b-1 -- the
        same computation the decoder does when block b is decoded after its history.

        Args:
            clean_ids, noisy_ids: [B, T] int64, T a multiple of `block_size`; noisy =
                clean with some slots replaced by MASK.
            block_size: L.
            use_window: ``state+window`` mode (W = config.attention_window) if True.

        Returns:
            hidden: [B, T, D] final-normed hidden states of the noisy tokens (apply
            ``lm_head`` on the masked ones); aux: scalar mean MoE load-balancing loss.
        """
        B, T = clean_ids.shape
        if T % block_size:
            raise ValueError(f"sequence length {T} is not a multiple of block_size {block_size}")
        if use_window and self.config.attention_window == 0:
            raise ValueError("use_window needs config.attention_window > 0")
        state = self.setup_state(B, "state")
        pos = torch.arange(T, device=clean_ids.device).repeat(2)
        ctx = _Ctx(n_commit=T, chunk=block_size, pos=pos, start=0, observe=False, reference=False,
                   train=True, window=self.config.attention_window if use_window else 0)
        x = self.embed_tokens(torch.cat([clean_ids, noisy_ids], 1))  # [B, 2T, D]
        for layer, st in zip(self.layers, state.layers):
            x = layer(x, ctx, st)
        aux = torch.stack([layer.mlp.aux_loss for layer in self.layers]).mean() if self.training else x.new_zeros(())
        return self.norm(x[:, T:]), aux

    def _run(self, block_ids, state, commit_ids, block_size, observe, reference) -> ModelOutput:
        C = 0 if commit_ids is None else commit_ids.shape[1]
        chunk = block_size or max(C, 1)
        if C % chunk:
            raise ValueError(f"commit of {C} tokens is not a whole number of blocks of {chunk}")
        start = state.position
        ids = block_ids if commit_ids is None else torch.cat([commit_ids, block_ids], 1)
        T = ids.shape[1]
        if start + T > self.config.max_position_embeddings:
            raise ValueError(
                f"position {start + T} exceeds max_position_embeddings="
                f"{self.config.max_position_embeddings}; shorten the prompt or max_new_tokens"
            )
        pos = torch.arange(start, start + T, device=ids.device)
        ctx = _Ctx(n_commit=C, chunk=chunk, pos=pos, start=start, observe=observe, reference=reference,
                   window=state.window, prefill=(not reference and start == 0 and C > chunk))
        x = self.embed_tokens(ids)  # [B, T, D]
        for layer, st in zip(self.layers, state.layers):
            x = layer(x, ctx, st)
        state.position = start + C
        logits = self.lm_head(self.norm(x[:, C:])).float()  # [B, L, vocab]
        out = ModelOutput(logits=logits, expert_union=torch.tensor(ctx.expert_union, dtype=torch.int64))
        if observe:
            out.memory_share = torch.stack(ctx.memory_share)  # [N, B, L]
            out.state_norm = torch.stack(ctx.state_norm).float()  # [N]
        return out
