"""Gated full attention with a delta-rule memory and an optional window (docs/architecture.md §3).

Wing: ``backbones``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clover_engine.backbones.clover.ops import (
    MixerInputs,
    RMSNorm,
    causal_conv_step,
    causal_conv_train,
    delta_update,
    dt_bias_init,
    from_blocks,
    rope_qk,
    to_blocks,
)
from clover_engine.backbones.clover.state import LayerState, Pass
from clover_engine.backbones.clover.config import CloverConfig
from clover_kernels.block_attention import block_attention
from clover_kernels.gated_delta_rule.chunk import chunk_states
from clover_kernels.gated_delta_rule.naive import l2norm

BAND_MAX_BLOCK = 8
"""Training with a window: blocks of at most this many slots use `GatedAttention._band_blocks`."""


class GatedAttention(nn.Module):
    """Gated full attention (Qwen3.5: q/k RMSNorm, partial RoPE, sigmoid output gate, GQA).

    History: a delta-rule memory state over L2-normalised keys and values per
    KV head, with its own gates (``mem_a``, ``mem_b`` -- the write-strength
    projection, ``mem_A_log``, ``mem_dt_bias``); read by ``m = S^T (l2norm(q) / sqrt(D))``
    with logit bias ``mem_b_logit``. In ``state+window`` mode, the RoPE'd K/V of the last W
    committed tokens join the softmax.
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
        self.mem_dt_bias = nn.Parameter(dt_bias_init(self.Hkv))
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

    def forward(self, x: torch.Tensor, p: Pass, st: LayerState) -> torch.Tensor:
        """x: [B, T, hidden] -> [B, T, hidden]; updates `st` in place except in a train pass."""
        B, T, _ = x.shape
        qg = self.q_proj(x).reshape(B, T, self.Hq, 2 * self.D)
        gate = qg[..., self.D:]
        inp = self._inputs(x, qg[..., : self.D], p, st)
        if p.kind == "train":
            o = self._train(inp, p, st)
        elif p.kind == "prefill":
            o = self._prefill(inp, p, st)
        else:
            o = self._stepwise(inp, p, st)
        o = o.transpose(1, 2) * torch.sigmoid(gate)  # o: [B, Hq, T, D] -> [B, T, Hq, D]
        return self.o_proj(o.reshape(B, T, self.Hq * self.D))

    def _inputs(self, x: torch.Tensor, q: torch.Tensor, p: Pass, st: LayerState) -> MixerInputs:
        B, T, _ = x.shape
        k, v = self.k_proj(x), self.v_proj(x)
        if self.conv1d is not None:
            qkv = torch.cat([q.reshape(B, T, -1), k, v], -1)
            if p.kind == "train":
                qkv = causal_conv_train(qkv, self.conv1d.weight, p.n_commit, p.block_size)
            else:
                qkv = causal_conv_step(qkv, self.conv1d.weight, st.conv, p.n_commit)
            q, k, v = torch.split(qkv, [self.Hq * self.D, self.Hkv * self.D, self.Hkv * self.D], -1)
        q = self.q_norm(q.reshape(B, T, self.Hq, self.D))  # [B, T, Hq, D]
        k = self.k_norm(k.reshape(B, T, self.Hkv, self.D))
        v = v.reshape(B, T, self.Hkv, self.D)
        beta = torch.sigmoid(self.mem_b(x).float())  # [B, T, Hkv]
        g = -self.mem_A_log.float().exp() * F.softplus(self.mem_a(x).float() + self.mem_dt_bias)

        qh = q.transpose(1, 2)  # [B, Hq, T, D]
        ang = p.rope_angles(self.cfg.rotary_dim, self.cfg.rope_theta)
        q_rot, k_rot = rope_qk(qh, k.transpose(1, 2), p.pos, self.cfg.rotary_dim, self.cfg.rope_theta, ang)  # k_rot [B, Hkv, T, D]
        vh = v.transpose(1, 2)  # [B, Hkv, T, D]
        scale = self.D**-0.5
        mem_logit = scale * torch.einsum("bhtd,hd->bht", qh.float(), self.mem_w.float())
        mem_logit = mem_logit + self.mem_b_logit.view(1, -1, 1)
        q_read = l2norm(qh.float()) * scale  # [B, Hq, T, D]
        return MixerInputs(q_rot, k_rot, vh, q_read, mem_logit, k, v, g, beta)

    # ------------------------------------------------------------ decode and reference
    def _stepwise(self, inp: MixerInputs, p: Pass, st: LayerState) -> torch.Tensor:
        """Block by block (`Pass.segments`); decode pushes each committed block into the ring
        buffer, reference slices the window from this pass's committed K/V. Writes the state."""
        rep, W, scale = self.Hq // self.Hkv, p.window, self.D**-0.5
        q_rot, k_rot, vh = inp.q_rot, inp.k_rot, inp.vh
        k_rep, v_rep = k_rot.repeat_interleave(rep, 1), vh.repeat_interleave(rep, 1)  # [B, Hq, T, D], once
        S, outs = st.S, []
        for s, e, commit in p.segments(vh.shape[2]):
            S_q = S.repeat_interleave(rep, 1)  # [B, Hq, D, D]
            ek = ev = valid = None
            if W:
                ek, ev, valid = (self._window_slice(inp, p, p.start + s) if p.kind == "reference"
                                 else self._window_ring(st, p.pos[s]))
                ek, ev = ek.repeat_interleave(rep, 1), ev.repeat_interleave(rep, 1)
            m = (inp.q_read[:, :, s:e] @ S_q).to(vh.dtype)  # [B, Hq, l, D]
            o, share = block_attention(
                q_rot[:, :, s:e], k_rep[:, :, s:e], v_rep[:, :, s:e], scale, m, inp.mem_logit[:, :, s:e], ek, ev, valid,
            )
            outs.append(o)
            if commit:
                S = delta_update(S, inp.k[:, s:e].float(), inp.v[:, s:e].float(), inp.g[:, s:e], inp.beta[:, s:e],
                                 naive=p.kind == "reference")
                if W and p.kind == "decode":  # push the block's last <= W tokens into the ring
                    t0 = max(s, e - W)
                    slots = p.pos[t0:e] % W  # on the device: no host value enters (CUDA graphs)
                    st.win_k[:, :, slots] = k_rot[:, :, t0:e].to(st.win_k.dtype)
                    st.win_v[:, :, slots] = vh[:, :, t0:e].to(st.win_v.dtype)
        st.S.copy_(S)
        p.record(share, S)
        return torch.cat(outs, 2)

    @staticmethod
    def _window_ring(st: LayerState, seg_pos: torch.Tensor):
        """Decode: the ring buffer (slot = position mod W), valid where a token with position in
        [seg_pos - W, seg_pos) has been written. `seg_pos` is a 0-d int64 device tensor (the
        segment's first position, ``Pass.pos[s]``), so a captured CUDA graph reads it at replay.
        Returns keys, values [B, Hkv, W, D], valid [W]."""
        W = st.win_k.shape[2]
        valid = torch.arange(W, device=st.win_k.device) < seg_pos.clamp(max=W)  # tokens 0..seg_pos-1 pushed
        return st.win_k, st.win_v, valid

    @staticmethod
    def _window_slice(inp: MixerInputs, p: Pass, seg_pos: int):
        """Reference: an explicit slice of this pass's committed K/V before `seg_pos`, left-padded to W."""
        W = p.window
        hk, hv = inp.k_rot[:, :, : p.n_commit], inp.vh[:, :, : p.n_commit]
        lo = max(0, seg_pos - p.start - W)
        hi = seg_pos - p.start
        ek, ev = hk[:, :, lo:hi], hv[:, :, lo:hi]
        pad = W - ek.shape[2]
        valid = torch.zeros(W, dtype=torch.bool, device=hk.device)
        valid[pad:] = True
        return F.pad(ek, (0, 0, pad, 0)), F.pad(ev, (0, 0, pad, 0)), valid

    # --------------------------------------------------------------- train and prefill
    def _boundary_states(self, inp: MixerInputs, p: Pass, st: LayerState) -> tuple[torch.Tensor, torch.Tensor]:
        """States before every committed block, [B*nb, Hq, D, D] (GQA-expanded, one row per block), and after the last."""
        n, L = p.n_commit, p.block_size
        B, rep = inp.vh.shape[0], self.Hq // self.Hkv
        S_b, S = chunk_states(inp.k[:, :n].float(), inp.v[:, :n].float(), inp.g[:, :n], inp.beta[:, :n], st.S, L)
        return S_b.repeat_interleave(rep, 1).transpose(1, 2).reshape(B * (n // L), self.Hq, self.D, self.D), S

    def _windows(self, inp: MixerInputs, p: Pass):
        """Block b's window: the committed K/V at [bL - W, bL), for b = 0..nb (nb = the block after
        the commit). Returns keys, values [B, nb+1, Hq, W, D] and valid [nb+1, W]."""
        n, L, W = p.n_commit, p.block_size, p.window
        B, rep, nb = inp.vh.shape[0], self.Hq // self.Hkv, n // L
        pad = inp.k_rot.new_zeros(B, self.Hkv, W, self.D)
        kp = torch.cat([pad, inp.k_rot[:, :, :n]], 2).unfold(2, W, L)  # [B, Hkv, nb+1, D, W]
        vp = torch.cat([pad.to(inp.vh.dtype), inp.vh[:, :, :n]], 2).unfold(2, W, L)
        wk = kp.permute(0, 2, 1, 4, 3).repeat_interleave(rep, 2)  # [B, nb+1, Hq, W, D]
        wv = vp.permute(0, 2, 1, 4, 3).repeat_interleave(rep, 2)
        j = torch.arange(W, device=pad.device)
        starts = torch.arange(nb + 1, device=pad.device) * L
        return wk, wv, j[None, :] >= (W - starts)[:, None]

    def _blocks(self, inp: MixerInputs, sl: slice, S_b: torch.Tensor, L: int, windows=None) -> torch.Tensor:
        """Every block of L tokens in `sl` at once, block b reading S_b[b] and window b: [B, Hq, len(sl), D]."""
        B, rep, scale = inp.vh.shape[0], self.Hq // self.Hkv, self.D**-0.5
        nb = S_b.shape[0] // B
        ek = ev = vv = None
        if windows is not None:
            wk, wv, valid = windows
            W = wk.shape[3]
            ek = wk[:, :nb].reshape(B * nb, self.Hq, W, self.D)
            ev = wv[:, :nb].reshape(B * nb, self.Hq, W, self.D)
            vv = valid[:nb].repeat(B, 1)  # [B*nb, W]
        m = (to_blocks(inp.q_read[:, :, sl], L) @ S_b).to(inp.vh.dtype)  # [B*nb, Hq, L, D]
        o, _ = block_attention(
            to_blocks(inp.q_rot[:, :, sl], L), to_blocks(inp.k_rot[:, :, sl], L).repeat_interleave(rep, 1),
            to_blocks(inp.vh[:, :, sl], L).repeat_interleave(rep, 1), scale, m,
            to_blocks(inp.mem_logit[:, :, sl], L), ek, ev, vv)
        return from_blocks(o, B)

    def _train(self, inp: MixerInputs, p: Pass, st: LayerState) -> torch.Tensor:
        """Clean half and noisy half, block b of each reading the state (and clean window) before
        clean block b (see `CloverModel.forward_train`). The state is not written."""
        n, L, W = p.n_commit, p.block_size, p.window
        S_b, _ = self._boundary_states(inp, p, st)
        halves = (slice(0, n), slice(n, 2 * n))
        if W and L <= BAND_MAX_BLOCK:
            return torch.cat([self._band_blocks(inp, sl, S_b, L, W) for sl in halves], 2)
        windows = self._windows(inp, p) if W else None
        return torch.cat([self._blocks(inp, sl, S_b, L, windows) for sl in halves], 2)

    def _prefill(self, inp: MixerInputs, p: Pass, st: LayerState) -> torch.Tensor:
        """Every committed block at once (reading the boundary states), then the block on the final
        state; writes the state and the ring buffer."""
        n, L, W = p.n_commit, p.block_size, p.window
        rep, nb, scale = self.Hq // self.Hkv, n // L, self.D**-0.5
        q_rot, k_rot, vh = inp.q_rot, inp.k_rot, inp.vh
        S_b, S = self._boundary_states(inp, p, st)
        windows = self._windows(inp, p) if W else None
        m = (inp.q_read[:, :, n:] @ S.repeat_interleave(rep, 1)).to(vh.dtype)
        ek, ev, valid = (windows[0][:, nb], windows[1][:, nb], windows[2][nb]) if W else (None, None, None)
        o_b, share = block_attention(
            q_rot[:, :, n:], k_rot[:, :, n:].repeat_interleave(rep, 1), vh[:, :, n:].repeat_interleave(rep, 1),
            scale, m, inp.mem_logit[:, :, n:], ek, ev, valid)
        o = torch.cat([self._blocks(inp, slice(0, n), S_b, L, windows), o_b], 2)
        st.S.copy_(S)
        if W:  # the ring holds the last <= W committed tokens at slot position % W
            t0 = max(0, n - W)
            slots = torch.arange(t0, n, device=vh.device) % W
            st.win_k[:, :, slots] = k_rot[:, :, t0:n].to(st.win_k.dtype)
            st.win_v[:, :, slots] = vh[:, :, t0:n].to(st.win_v.dtype)
        p.record(share, S)
        return o

    def _band_blocks(self, inp: MixerInputs, sl: slice, S_b: torch.Tensor, L: int, W: int) -> torch.Tensor:
        """Training, small blocks: every block of one half at once as a [n, n] banded attention.

        Same result as `block_attention` per block with the clean window, without building
        nb copies of the W-token window (for L <= 8 those copies cost ~4x the step).
        Query i (block b = i // L) sees keys j of its own half with j // L == b, the clean
        keys with bL - W <= j < bL, and its memory unit.

        Args:
            inp: the layer's inputs over [clean n ++ noisy n]; sl: the half; S_b: [B*nb, Hq, D, D];
                L: block size; W: window.

        Returns:
            [B, Hq, n, D].
        """
        n = sl.stop - sl.start
        q, k, v = inp.q_rot[:, :, sl], inp.k_rot[:, :, sl], inp.vh[:, :, sl]
        k_clean, v_clean = inp.k_rot[:, :, :n], inp.vh[:, :, :n]
        B, Hq = q.shape[:2]
        rep, scale = Hq // k.shape[1], self.D**-0.5
        blk = torch.arange(n, device=q.device) // L
        j = torch.arange(n, device=q.device)
        in_blk = blk[:, None] == blk[None, :]  # [n, n]
        start = (blk * L)[:, None]
        in_win = (j[None, :] < start) & (j[None, :] >= start - W)
        s_in = (q @ k.repeat_interleave(rep, 1).transpose(-1, -2)).float() * scale
        s_w = (q @ k_clean.repeat_interleave(rep, 1).transpose(-1, -2)).float() * scale
        scores = torch.cat([s_in.masked_fill(~in_blk, float("-inf")), s_w.masked_fill(~in_win, float("-inf")),
                            inp.mem_logit[:, :, sl].float()[..., None]], -1)
        a = torch.softmax(scores, -1)
        m = from_blocks(to_blocks(inp.q_read[:, :, sl], L) @ S_b, B).to(v.dtype)  # [B, Hq, n, D]
        o = a[..., :n].to(v.dtype) @ v.repeat_interleave(rep, 1)
        o = o + a[..., n:2 * n].to(v.dtype) @ v_clean.repeat_interleave(rep, 1)
        return o + a[..., -1:].to(v.dtype) * m
