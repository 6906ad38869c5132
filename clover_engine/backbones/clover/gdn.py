"""Gated DeltaNet mixer with the in-block attention and memory unit (docs/architecture.md §3). Wing: ``backbones``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clover_engine.backbones.clover.ops import (
    GatedRMSNorm,
    MixerInputs,
    block_attention,
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
from clover_kernels.gated_delta_rule.chunk import chunk_states
from clover_kernels.gated_delta_rule.naive import l2norm


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
        self.dt_bias = nn.Parameter(dt_bias_init(self.Hv))
        self.norm = GatedRMSNorm(self.V, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.Hv * self.V, D, bias=False)
        # block-diffusion additions
        self.block_temperature = nn.Parameter(torch.full((self.Hv,), cfg.block_temperature_init))
        self.mem_w = nn.Parameter(torch.randn(self.Hv, self.K) * 0.02)
        self.mem_logit_bias = nn.Parameter(torch.full((self.Hv,), cfg.memory_logit_bias_init))  # memory-unit logit bias

    def init_state(self, batch: int, device, dtype) -> LayerState:
        k = self.cfg.linear_conv_kernel_dim
        return LayerState(
            S=torch.zeros(batch, self.Hv, self.K, self.V, dtype=torch.float32, device=device),
            conv=torch.zeros(batch, k - 1, self.channels, dtype=dtype, device=device),
        )

    def forward(self, x: torch.Tensor, p: Pass, st: LayerState) -> torch.Tensor:
        """x: [B, T, hidden] -> [B, T, hidden]; updates `st` in place except in a train pass."""
        inp = self._inputs(x, p, st)
        if p.kind == "train":
            o = self._train(inp, p, st)
        elif p.kind == "prefill":
            o = self._prefill(inp, p, st)
        else:
            o = self._stepwise(inp, p, st)
        B, T, _ = x.shape
        z = self.in_proj_z(x).reshape(B, T, self.Hv, self.V)
        o = self.norm(o.transpose(1, 2), z).to(x.dtype).reshape(B, T, self.Hv * self.V)  # o: [B, Hv, T, V]
        return self.out_proj(o)

    def _inputs(self, x: torch.Tensor, p: Pass, st: LayerState) -> MixerInputs:
        B, T, _ = x.shape
        proj = self.in_proj_qkv(x)
        if p.kind == "train":
            qkv = causal_conv_train(proj, self.conv1d.weight, p.n_commit, p.block_size)
        else:
            qkv = causal_conv_step(proj, self.conv1d.weight, st.conv, p.n_commit)
        qkv = F.silu(qkv)  # [B, T, channels]
        q, k, v = torch.split(qkv, [self.Hk * self.K, self.Hk * self.K, self.Hv * self.V], -1)
        q = l2norm(q.reshape(B, T, self.Hk, self.K).float())  # [B, T, Hk, K]
        k = l2norm(k.reshape(B, T, self.Hk, self.K).float())
        v = v.reshape(B, T, self.Hv, self.V)
        beta = torch.sigmoid(self.in_proj_b(x).float())  # [B, T, Hv]
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())

        rep = self.Hv // self.Hk
        qh = (q.repeat_interleave(rep, 2) if rep > 1 else q).transpose(1, 2)  # [B, Hv, T, K]
        kh = (k.repeat_interleave(rep, 2) if rep > 1 else k).transpose(1, 2)
        vh = v.transpose(1, 2).float()  # [B, Hv, T, V]
        ang = p.rope_angles(self.cfg.linear_rotary_dim, self.cfg.rope_theta)
        q_rot, k_rot = rope_qk(qh, kh, p.pos, self.cfg.linear_rotary_dim, self.cfg.rope_theta, ang)
        # fp32 from here on whatever the weights' dtype (bf16 / fp16 models): cast the small parameters
        temperature = self.block_temperature.float()
        mem_logit = temperature.view(1, -1, 1) * torch.einsum("bhtk,hk->bht", qh, self.mem_w.float())
        mem_logit = mem_logit + self.mem_logit_bias.float().view(1, -1, 1)
        return MixerInputs(q_rot, k_rot, vh, qh * self.K**-0.5, mem_logit, k, v, g, beta)

    def _boundary_states(self, inp: MixerInputs, p: Pass, st: LayerState) -> tuple[torch.Tensor, torch.Tensor]:
        """States before every committed block, [B*nb, Hv, K, V] (one row per block), and after the last."""
        n, L = p.n_commit, p.block_size
        S_b, S = chunk_states(inp.k[:, :n], inp.v[:, :n], inp.g[:, :n], inp.beta[:, :n], st.S, L)  # [B, Hv, nb, K, V]
        return S_b.transpose(1, 2).reshape(-1, self.Hv, self.K, self.V), S

    def _blocks(self, inp: MixerInputs, sl: slice, S_b: torch.Tensor, L: int) -> torch.Tensor:
        """Every block of L tokens in `sl` at once, block b reading S_b[b]: [B, Hv, len(sl), V]."""
        B = inp.vh.shape[0]
        o, _ = block_attention(to_blocks(inp.q_rot[:, :, sl], L), to_blocks(inp.k_rot[:, :, sl], L),
                               to_blocks(inp.vh[:, :, sl], L), self.block_temperature,
                               to_blocks(inp.q_read[:, :, sl], L) @ S_b, to_blocks(inp.mem_logit[:, :, sl], L))
        return from_blocks(o, B)

    def _train(self, inp: MixerInputs, p: Pass, st: LayerState) -> torch.Tensor:
        """Clean half and noisy half, block b of each reading the state before clean block b."""
        n = p.n_commit
        S_b, _ = self._boundary_states(inp, p, st)
        return torch.cat([self._blocks(inp, slice(0, n), S_b, p.block_size),
                          self._blocks(inp, slice(n, 2 * n), S_b, p.block_size)], 2)

    def _prefill(self, inp: MixerInputs, p: Pass, st: LayerState) -> torch.Tensor:
        """Every committed block at once, then the block on the final state; writes the state."""
        n = p.n_commit
        S_b, S = self._boundary_states(inp, p, st)
        o_c = self._blocks(inp, slice(0, n), S_b, p.block_size)
        o_b, share = block_attention(inp.q_rot[:, :, n:], inp.k_rot[:, :, n:], inp.vh[:, :, n:],
                                     self.block_temperature, inp.q_read[:, :, n:] @ S, inp.mem_logit[:, :, n:])
        st.S.copy_(S)
        p.record(share, S)
        return torch.cat([o_c, o_b], 2)

    def _stepwise(self, inp: MixerInputs, p: Pass, st: LayerState) -> torch.Tensor:
        """Decode and reference: block by block (`Pass.segments`); writes the state."""
        S, outs = st.S, []
        for s, e, commit in p.segments(inp.vh.shape[2]):
            m = inp.q_read[:, :, s:e] @ S  # [B, Hv, l, V]
            o, share = block_attention(inp.q_rot[:, :, s:e], inp.k_rot[:, :, s:e], inp.vh[:, :, s:e],
                                       self.block_temperature, m, inp.mem_logit[:, :, s:e])
            outs.append(o)
            if commit:  # fold the block into the state
                S = delta_update(S, inp.k[:, s:e], inp.v[:, s:e], inp.g[:, s:e], inp.beta[:, s:e],
                                 naive=p.kind == "reference")
        st.S.copy_(S)
        p.record(share, S)
        return torch.cat(outs, 2)
