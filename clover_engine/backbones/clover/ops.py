"""Building blocks of the Clover model (docs/architecture.md §3): norms, RoPE, the in-block
attention with the memory unit, one-row-per-block reshapes, the causal conv with a carried
tail, and the gated-delta-rule state update.

Wing: ``backbones``."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from clover_kernels.block_attention.naive import block_attention  # noqa: F401  (re-exported: GDN and the reference path use the definition)
from clover_kernels.gated_delta_rule import gated_delta_rule
from clover_kernels.gated_delta_rule.naive import l2norm


class RMSNorm(nn.Module):
    """Qwen3.5 RMSNorm: ``x / rms(x) * (1 + w)`` in fp32, ``w`` initialised to 0."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:  # the same ops without no-op casts
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)
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


def rope_angles(pos: torch.Tensor, rot_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each [T, rot_dim] fp32, for positions `pos` [T] (int64)."""
    inv_freq = theta ** (-torch.arange(0, rot_dim, 2, dtype=torch.float32, device=pos.device) / rot_dim)
    ang = pos.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, rot/2]
    return torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)


def rope(x: torch.Tensor, pos: torch.Tensor, rot_dim: int, theta: float,
         cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Rotary embedding on the first `rot_dim` dims of the last axis (rotate-half form).

    Args:
        x: [B, H, T, D]; pos: [T] absolute positions (int64).
        cos_sin: `rope_angles(pos, rot_dim, theta)` when the caller already has them (a forward
            computes them once for all its layers, `Pass.rope`); None computes them here.

    Returns:
        [B, H, T, D], dtype of x.
    """
    if rot_dim == 0:
        return x
    cos, sin = rope_angles(pos, rot_dim, theta) if cos_sin is None else cos_sin  # [T, rot]
    xr, xp = x[..., :rot_dim], x[..., rot_dim:]
    x1, x2 = xr[..., : rot_dim // 2], xr[..., rot_dim // 2:]
    rotated = torch.cat([-x2, x1], -1)
    return torch.cat([(xr.float() * cos + rotated.float() * sin).to(x.dtype), xp], -1)


def rope_qk(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, rot_dim: int, theta: float,
            cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`rope` of queries and keys in one pass over their heads stacked (the same elementwise
    operations, so the same values; half the fixed cost).

    Args:
        q: [B, Hq, T, D]; k: [B, Hk, T, D] (same B, T, D and dtype); pos, rot_dim, theta, cos_sin: as `rope`.

    Returns:
        (q_rot [B, Hq, T, D], k_rot [B, Hk, T, D]): views of one [B, Hq + Hk, T, D] tensor.
    """
    if rot_dim == 0:
        return q, k
    both = rope(torch.cat([q, k], 1), pos, rot_dim, theta, cos_sin)
    return both[:, : q.shape[1]], both[:, q.shape[1]:]


def dt_bias_init(n: int, dt_min: float = 1e-3, dt_max: float = 0.1) -> torch.Tensor:
    """flash-linear-attention's GatedDeltaNet init: softplus(dt_bias) log-uniform in
    [dt_min, dt_max], so the initial decay per token is exp(-A * dt) ~ 0.9-1.0."""
    dt = torch.exp(torch.empty(n).uniform_(math.log(dt_min), math.log(dt_max)))
    return dt + torch.log(-torch.expm1(-dt))  # inverse softplus


def to_blocks(t: torch.Tensor, L: int) -> torch.Tensor:
    """[B, H, n, ...] -> [B * n/L, H, L, ...]: one batch row per block."""
    B, H, n = t.shape[:3]
    t = t.reshape(B, H, n // L, L, *t.shape[3:]).transpose(1, 2)
    return t.reshape(B * (n // L), H, L, *t.shape[4:])


def from_blocks(t: torch.Tensor, B: int) -> torch.Tensor:
    """Inverse of `to_blocks`: [B * nb, H, L, ...] -> [B, H, nb * L, ...]."""
    nb, H, L = t.shape[0] // B, t.shape[1], t.shape[2]
    t = t.reshape(B, nb, H, L, *t.shape[3:]).transpose(1, 2)
    return t.reshape(B, H, nb * L, *t.shape[4:])


def delta_update(S: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 naive: bool = False) -> torch.Tensor:
    """Fold a committed block into state S [B, H, K, V] (fp32) with the gated delta rule; returns the new S.

    k: [B, C, H, K] (L2-normalised inside), v: [B, C, H, V], g / beta: [B, C, H]. ``naive``: the
    token-loop definition (`clover_kernels.gated_delta_rule.naive`) instead of the dispatcher's fast path.
    One token with as many key as value heads (autoregressive decoding) is folded in here with the
    definition's own operations, without its query read-out (`delta_update_one`).
    """
    if k.shape[1] == 1 and not naive:
        return delta_update_one(S, k, v, g, beta)
    _, S_new = gated_delta_rule(k, k, v, g, beta, initial_state=S, output_final_state=True,
                                use_qk_l2norm_in_kernel=True, impl="naive" if naive else None)
    return S_new


def delta_update_one(S: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor) -> torch.Tensor:
    """One token of the gated delta rule, the exact operations of the token-loop definition
    (`clover_kernels.gated_delta_rule.naive`: L2-normalise k, decay, delta, rank-1 write) without the
    output read-out, which a commit does not use.

    Args:
        S: [B, H, K, V] fp32 state (not modified); k: [B, 1, H_k, K] with H a multiple of H_k
            (value head j uses key head j // (H / H_k)); v: [B, 1, H, V]; g, beta: [B, 1, H]
            (any float dtype; computed in fp32).

    Returns:
        The new state [B, H, K, V] fp32.

    Raises:
        ValueError: H is not a multiple of H_k.
    """
    Hk, H = k.shape[2], v.shape[2]
    if H % Hk:
        raise ValueError(f"H_v={H} must be a multiple of H_k={Hk}")
    k0 = l2norm(k[:, 0].float())  # [B, H_k, K]
    if H != Hk:
        k0 = k0.repeat_interleave(H // Hk, dim=1)  # [B, H, K]
    S = S.float() * g[:, 0].float().exp()[..., None, None]
    kv = torch.einsum("bhkv,bhk->bhv", S, k0)
    u = beta[:, 0].float()[..., None] * (v[:, 0].float() - kv)  # [B, H, V]
    return S + k0[..., None] * u[:, :, None, :]


def causal_conv_step(x: torch.Tensor, weight: torch.Tensor, tail: torch.Tensor, n_commit: int) -> torch.Tensor:
    """Causal depthwise conv (no activation) over ``[tail ++ commit ++ block]``; the tail then
    becomes the last (kernel-1) inputs of ``[tail ++ commit]`` (never the block).

    Args:
        x: [B, T, channels] projections, the first `n_commit` of them committed tokens;
        weight: [channels, 1, kernel] (``nn.Conv1d`` depthwise weight);
        tail: [B, kernel-1, channels], updated in place.

    Returns:
        [B, T, channels], dtype of x.
    """
    k1 = weight.shape[-1] - 1
    channels = x.shape[-1]
    conv_in = torch.cat([tail.to(x.dtype), x], 1)  # [B, k-1+T, channels]
    if x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_grad_enabled():
        # the same taps as oneDNN's depthwise conv, in its order (fused multiply-adds, first tap
        # first; equal bit for bit), at a fraction of its fixed cost for a few tokens
        T, w = x.shape[1], weight[:, 0].t()  # [kernel, channels]
        out = conv_in[:, :T] * w[0]
        for j in range(1, k1 + 1):
            out = torch.addcmul(out, conv_in[:, j:j + T], w[j])
    else:
        out = F.conv1d(conv_in.transpose(1, 2), weight, groups=channels).transpose(1, 2)
    kept = conv_in[:, : k1 + n_commit]
    tail.copy_(kept[:, kept.shape[1] - k1:].detach().to(tail.dtype))
    return out


def causal_conv_train(x: torch.Tensor, weight: torch.Tensor, n: int, L: int) -> torch.Tensor:
    """`causal_conv_step` for a training pass x = [clean n ++ noisy n]: the clean half from a zero
    tail; each noisy block b sees the clean inputs just before clean block b as its tail -- what
    the decoder sees when it decodes block b.

    Args:
        x: [B, 2n, channels]; weight: [channels, 1, kernel]; L: block size (n a multiple of L).

    Returns:
        [B, 2n, channels], dtype of x.
    """
    k1 = weight.shape[-1] - 1
    channels = x.shape[-1]
    B, nb = x.shape[0], n // L
    clean_in = torch.cat([x.new_zeros(B, k1, channels), x[:, :n]], 1)  # [B, k-1+n, ch]
    clean = F.conv1d(clean_in.transpose(1, 2), weight, groups=channels).transpose(1, 2)
    idx = (torch.arange(nb, device=x.device) * L)[:, None] + torch.arange(k1, device=x.device)
    tails = clean_in[:, idx]  # [B, nb, k-1, ch]
    noisy_in = torch.cat([tails, x[:, n:].reshape(B, nb, L, channels)], 2)
    noisy = F.conv1d(noisy_in.reshape(B * nb, k1 + L, channels).transpose(1, 2), weight,
                     groups=channels).transpose(1, 2).reshape(B, n, channels)
    return torch.cat([clean, noisy], 1)


class MixerInputs(NamedTuple):
    """One forward's projections in a mixer, built once and handed to its path (train, prefill, stepwise).

    GDN (T tokens, Hv value / Hk key heads): q_rot, k_rot [B, Hv, T, K] RoPE'd in-block q / k; vh
    [B, Hv, T, V]; q_read [B, Hv, T, K] memory read query (q / sqrt(K)); mem_logit [B, Hv, T];
    k [B, T, Hk, K] L2-normalised and v [B, T, Hv, V] for the state update; g, beta [B, T, Hv].
    Attention (Hq query / Hkv kv heads, D head dim): q_rot [B, Hq, T, D], k_rot and vh
    [B, Hkv, T, D]; q_read [B, Hq, T, D] fp32 (l2norm(q) / sqrt(D)); mem_logit [B, Hq, T] fp32;
    k, v [B, T, Hkv, D] for the memory update; g, beta [B, T, Hkv] fp32 memory gates.
    """

    q_rot: torch.Tensor
    k_rot: torch.Tensor
    vh: torch.Tensor
    q_read: torch.Tensor
    mem_logit: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
