"""Routed experts of a sparse MoE, plain torch -- the definition (docs/architecture.md §3).

Given each token's top-k expert ids and (renormalised) router weights, token t's routed
output is ``sum_j w[t, j] * E_{ids[t, j]}(x_t)`` with the SwiGLU expert
``E_e(x) = down_e (silu(gate_e x) * up_e x)`` (Qwen3.5-MoE; transformers'
``Qwen3_5MoeExperts`` weight layout). The (token, slot) pairs are grouped by expert and
each hit expert runs once, on its rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.compiler.disable  # a host-side loop over the hit experts: torch.compile runs it eagerly
def routed_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up_proj: torch.Tensor,
                   down_proj: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Weighted sum of each token's top-k SwiGLU experts.

    Args:
        x: [T, D] token activations (model dtype).
        weights: [T, k] router weights (fp32; cast to x's dtype before the weighted sum).
        ids: [T, k] int64 expert ids in [0, E).
        gate_up_proj: [E, 2F, D] (gate rows, then up rows); down_proj: [E, D, F].

    Returns:
        out: [T, D] in x's dtype; hit: the expert union, distinct experts over all T*k pairs
        (a Python int -- the host sync is needed anyway to loop over the hit experts).
    """
    T, top_k = ids.shape
    flat = ids.reshape(-1)  # [T*k]
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=gate_up_proj.shape[0]).tolist()
    xs = x[order // top_k]  # [T*k, D]
    ys, start, hit = [], 0, 0
    for e, n in enumerate(counts):
        if n:
            h = xs[start:start + n] @ gate_up_proj[e].t()  # [n, 2F]
            gte, up = h.chunk(2, -1)
            ys.append((F.silu(gte) * up) @ down_proj[e].t())  # [n, D]
            start += n
            hit += 1
    y = torch.cat(ys) * weights.reshape(-1)[order, None].to(x.dtype)
    y_pairs = torch.empty_like(y)
    y_pairs[order] = y  # back to (token, slot) order
    return y_pairs.view(-1, top_k, x.shape[-1]).sum(1), hit  # [T, D]
