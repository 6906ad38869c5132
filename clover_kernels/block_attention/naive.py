"""In-block bidirectional attention with the memory unit, plain torch -- the definition.

Inside a block every slot attends to every slot (no causal mask), to the optional window
keys, and to one more softmax unit, the memory read-out ``m_i`` with its own logit ``l_i``
(docs/architecture.md §3):

    a_i = softmax([scale q_i.k_j]_j ++ [scale q_i.k^w_j]_j ++ [l_i])
    o_i = sum_j a_ij v_j + sum_j a^w_ij v^w_j + a_i,mem m_i

The scores and the softmax are fp32; the weighted sums run in v's dtype.
"""

from __future__ import annotations

import torch


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

    Args:
        q, k: [B, H, L, K]; v: [B, H, L, V] (k/v already expanded to H heads).
        scale: float or [H] per-head score scale.
        mem_out: [B, H, L, V] state read-out; mem_logit: [B, H, L].
        extra_k / extra_v: [B, H, W, K] / [B, H, W, V] window keys (or None);
        extra_valid: [W] or [B, W] bool, which window slots hold a token.

    Returns:
        o: [B, H, L, V] in v's dtype; memory share a_mem [B, H, L] (fp32).
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
