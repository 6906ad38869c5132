"""Gated delta rule in chunked (WY / UT-transform) form -- plain torch, fp32.

Same signature and result as `naive.gated_delta_rule`, but each chunk of C
tokens is one batched computation instead of C sequential steps. Within a
chunk with start state S_0 and cumulative log-decay G_t = sum_{s<=t} g_s:

    U = (I + A)^-1 (beta * V - beta * exp(G) * (K S_0)),
        A[t, s] = beta_t exp(G_t - G_s) <k_t, k_s>  for s < t (else 0)
    o_t = exp(G_t) S_0^T q_t + sum_{s<=t} exp(G_t - G_s) <q_t, k_s> u_s
    S_C = exp(G_C) S_0 + sum_s exp(G_C - G_s) k_s u_s^T

(derivation: Yang et al., "Parallelizing Linear Transformers with the Delta
Rule over Sequence Length", NeurIPS 2024, and "Gated Delta Networks", ICLR
2025). All exponents are <= 0, so nothing overflows.
"""

from __future__ import annotations

import math

import torch

from kernels.gated_delta_rule.naive import l2norm, prepare

MAX_SUBCHUNK = 16  # longest run handled by one (I + A)^-1 in `chunk_states`


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = True,
    use_qk_l2norm_in_kernel: bool = False,
    scale: float | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked gated delta rule; shapes as `kernels.gated_delta_rule.naive.gated_delta_rule`.

    Args:
        chunk_size: tokens per chunk (the block size when committing a block).
    """
    out_dtype = v.dtype
    q, k, v, g, beta, S = prepare(q, k, v, g, beta, initial_state, use_qk_l2norm_in_kernel, scale)
    B, T, Hv, V = v.shape
    # [B, H, T, D] layout for batched matmuls
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)  # [B, H, T]
    o = torch.empty(B, Hv, T, V, dtype=torch.float32, device=v.device)
    for c0 in range(0, T, chunk_size):
        c1 = min(c0 + chunk_size, T)
        qc, kc, vc = q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1]  # [B, H, C, D]
        bc = beta[:, :, c0:c1, None]  # [B, H, C, 1]
        G = g[:, :, c0:c1].cumsum(-1)  # [B, H, C]
        C = c1 - c0
        decay = (G[..., :, None] - G[..., None, :])  # [B, H, C, C], G_t - G_s
        lower = torch.ones(C, C, dtype=torch.bool, device=v.device).tril()
        decay = torch.where(lower, decay, torch.full_like(decay, float("-inf"))).exp()
        strict = lower & ~torch.eye(C, dtype=torch.bool, device=v.device)
        A = torch.where(strict, bc * decay * (kc @ kc.transpose(-1, -2)), torch.zeros_like(decay))
        rhs = bc * (vc - G.exp()[..., None] * (kc @ S))  # [B, H, C, V]
        U = unit_lower_inverse(A) @ rhs
        o[:, :, c0:c1] = G.exp()[..., None] * (qc @ S) + (decay * (qc @ kc.transpose(-1, -2))) @ U
        last = G[..., -1:]  # [B, H, 1]
        S = last.exp()[..., None] * S + kc.transpose(-1, -2) @ ((last - G).exp()[..., None] * U)
    o = o.transpose(1, 2).to(out_dtype)  # [B, T, H, V]
    return o, (S if output_final_state else None)


def unit_lower_inverse(A: torch.Tensor) -> torch.Tensor:
    """(I + A)^-1 for strictly lower-triangular A [..., C, C], by the nilpotent product
    ``(I + A)^-1 = prod_j (I + (-A)^(2^j))`` (A^C = 0): log2(C) batched matmul pairs,
    autograd-friendly, instead of C sequential substitution steps."""
    C = A.shape[-1]
    eye = torch.eye(C, dtype=A.dtype, device=A.device)
    N = -A
    P = eye + N
    k = 2
    while k < C:
        N = N @ N
        P = P + P @ N
        k *= 2
    return P


def chunk_states(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    chunk_size: int,
    use_qk_l2norm_in_kernel: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """States at every chunk boundary, all chunks' intra-chunk work done at once.

    With U = U0 - W S_0 (U0 = T^-1 beta V, W = T^-1 beta exp(G) K, T = I + A as
    in the module docstring), only the S recursion over chunks is sequential:
    ``S_{c+1} = exp(G_last) S_c + K_c^T (exp(G_last - G) * (U0_c - W_c S_c))``.

    Args:
        k: [B, T, H_k, K]; v: [B, T, H_v, V]; g, beta: [B, T, H_v]; T a multiple of chunk_size.
        initial_state: [B, H_v, K, V] or None.

    Returns:
        before: [B, H_v, n_chunks, K, V] fp32 -- the state each chunk starts from;
        final: [B, H_v, K, V] fp32 -- the state after the last chunk.
    """
    B, T, Hk, K = k.shape
    Hv, V = v.shape[-2:]
    if T % chunk_size:
        raise ValueError(f"T={T} is not a multiple of chunk_size={chunk_size}")
    # Work in sub-chunks of at most 16 tokens: the entries of (I + A)^-1 can grow with the
    # chunk length, and fp32 cancellation then loses the update (seen as NaN at chunk 64).
    C = math.gcd(chunk_size, MAX_SUBCHUNK)
    every = chunk_size // C
    nc = T // C
    k, v, g, beta = (x.float() for x in (k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        k = l2norm(k)
    if Hv != Hk:
        k = k.repeat_interleave(Hv // Hk, dim=2)
    k = k.transpose(1, 2).reshape(B, Hv, nc, C, K)
    v = v.transpose(1, 2).reshape(B, Hv, nc, C, V)
    g = g.transpose(1, 2).reshape(B, Hv, nc, C)
    b = beta.transpose(1, 2).reshape(B, Hv, nc, C, 1)
    G = g.cumsum(-1)  # [B, H, nc, C]
    lower = torch.ones(C, C, dtype=torch.bool, device=k.device).tril(-1)
    diff = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf"))
    A = b * diff.exp() * (k @ k.transpose(-1, -2))  # [B, H, nc, C, C], strictly lower
    Tinv = unit_lower_inverse(A)
    U0 = Tinv @ (b * v)  # [B, H, nc, C, V]
    Wm = Tinv @ (b * G.exp()[..., None] * k)  # [B, H, nc, C, K]
    last = G[..., -1:]  # [B, H, nc, 1]
    kd = k * (last - G).exp()[..., None]  # [B, H, nc, C, K]
    S = (torch.zeros(B, Hv, K, V, dtype=torch.float32, device=k.device) if initial_state is None
         else initial_state.float())
    before = []
    for c in range(nc):
        if c % every == 0:
            before.append(S)
        U = U0[:, :, c] - Wm[:, :, c] @ S  # [B, H, C, V]
        S = last[:, :, c, :, None].exp() * S + kd[:, :, c].transpose(-1, -2) @ U
    return torch.stack(before, 2), S
