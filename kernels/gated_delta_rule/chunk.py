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

import torch

from kernels.gated_delta_rule.naive import l2norm


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
    B, T, Hk, K = k.shape
    Hv, V = v.shape[-2:]
    if Hv % Hk:
        raise ValueError(f"H_v={Hv} must be a multiple of H_k={Hk}")
    out_dtype = v.dtype
    scale = K**-0.5 if scale is None else scale
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    if Hv != Hk:
        q = q.repeat_interleave(Hv // Hk, dim=2)
        k = k.repeat_interleave(Hv // Hk, dim=2)
    q = q * scale
    # [B, H, T, D] layout for batched matmuls
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)  # [B, H, T]
    S = (
        torch.zeros(B, Hv, K, V, dtype=torch.float32, device=v.device)
        if initial_state is None
        else initial_state.float().clone()
    )
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
        eye = torch.eye(C, dtype=torch.float32, device=v.device)
        U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        o[:, :, c0:c1] = G.exp()[..., None] * (qc @ S) + (decay * (qc @ kc.transpose(-1, -2))) @ U
        last = G[..., -1:]  # [B, H, 1]
        S = last.exp()[..., None] * S + kc.transpose(-1, -2) @ ((last - G).exp()[..., None] * U)
    o = o.transpose(1, 2).to(out_dtype)  # [B, T, H, V]
    return o, (S if output_final_state else None)
