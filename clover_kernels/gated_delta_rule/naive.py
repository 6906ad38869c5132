"""Gated delta rule, token by token in fp32 -- the definition (plain torch).

Recurrence per value head h, tokens in order (Yang et al., "Gated Delta
Networks", ICLR 2025; the same order as transformers'
``torch_recurrent_gated_delta_rule`` for Qwen3.5):

    S <- exp(g_t) S                       # decay first
    u_t = beta_t (v_t - S^T k_t)          # delta with the decayed state
    S <- S + k_t u_t^T
    o_t = S^T q_t

with q, k optionally L2-normalised (eps 1e-6) and q scaled by ``scale``
(default ``d_k ** -0.5``). Grouped values: value head j uses key head
``j // (H_v // H_k)``.
"""

from __future__ import annotations

import torch


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (the fla / transformers definition)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def prepare(q, k, v, g, beta, initial_state, use_qk_l2norm_in_kernel, scale):
    """Shared input preparation of every implementation: check grouped heads, cast to fp32,
    optionally L2-normalise q/k, expand q/k to the H_v value heads, scale q, and copy
    (or zero-initialise) the state.

    Returns:
        q, k: [B, T, H_v, K]; v: [B, T, H_v, V]; g, beta: [B, T, H_v]; S: [B, H_v, K, V] (all fp32).

    Raises:
        ValueError: if H_v is not a multiple of H_k.
    """
    B, T, Hk, K = k.shape
    Hv, V = v.shape[-2:]
    if Hv % Hk:
        raise ValueError(f"H_v={Hv} must be a multiple of H_k={Hk}")
    scale = K**-0.5 if scale is None else scale
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    if Hv != Hk:
        q = q.repeat_interleave(Hv // Hk, dim=2)  # [B, T, H_v, K]
        k = k.repeat_interleave(Hv // Hk, dim=2)
    S = (
        torch.zeros(B, Hv, K, V, dtype=torch.float32, device=v.device)
        if initial_state is None
        else initial_state.float().clone()
    )
    return q * scale, k, v, g, beta, S


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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the gated delta rule over T tokens.

    Args:
        q, k: [B, T, H_k, K] queries / keys (any float dtype).
        v: [B, T, H_v, V] values; H_v must be a multiple of H_k.
        g: [B, T, H_v] log-decay (<= 0), beta: [B, T, H_v] write strength in (0, 1).
        initial_state: [B, H_v, K, V] or None (zeros).
        output_final_state: return the state after the last token.
        use_qk_l2norm_in_kernel: L2-normalise q and k first.
        scale: query scale; None = K ** -0.5.

    Returns:
        o: [B, T, H_v, V] in v's dtype; final state [B, H_v, K, V] fp32 (or None).
    """
    out_dtype = v.dtype
    q, k, v, g, beta, S = prepare(q, k, v, g, beta, initial_state, use_qk_l2norm_in_kernel, scale)
    B, T, Hv, V = v.shape
    o = torch.empty(B, T, Hv, V, dtype=torch.float32, device=v.device)
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]  # [B, H, K, V]
        kv = torch.einsum("bhkv,bhk->bhv", S, k[:, t])
        u = beta[:, t, :, None] * (v[:, t] - kv)  # [B, H, V]
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t])
    return o.to(out_dtype), (S if output_final_state else None)
