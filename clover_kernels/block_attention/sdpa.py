"""In-block attention through a fused attention kernel that returns the log-sum-exp,
merged exactly with the memory unit.

The memory read-out is one more softmax unit, so the attention over the keys alone
(normalised output ``o^att_i`` and log-sum-exp ``lse_i = log sum_j exp(s_ij)``, natural
log, scores ``s_ij = scale q_i.k_j``) combines with the memory logit ``l_i`` as

    Z_i = logaddexp(lse_i, l_i),   a_i,mem = exp(l_i - Z_i),
    o_i = exp(lse_i - Z_i) o^att_i + a_i,mem m_i

-- the same softmax as `naive.block_attention`, split into two parts (the merge of
partial softmaxes of FlashAttention: Dao et al., "FlashAttention", NeurIPS 2022, and
Milakov & Gimelshein, 2018). Invalid window slots get an additive -inf bias.

The kernels (private ATen ops; their log-sum-exp output has no gradient, so this path is
for inference):
  * CPU: ``aten._scaled_dot_product_flash_attention_for_cpu`` -> (out, lse [B, H, L] fp32);
  * CUDA: ``aten._scaled_dot_product_efficient_attention(..., compute_log_sumexp=True)``
    -> (out, lse [B, H, >= L] fp32, ...); its bias rows must be 16-element aligned, so the
    bias is allocated padded and sliced.
A per-head scale ([H] tensor) is folded into q, and the kernel runs with scale 1.
"""

from __future__ import annotations

import torch


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None, scale: float):
    """Softmax attention over all keys: (out [B, H, L, V] q's dtype, lse [B, H, L] fp32, natural log).

    keep: None, or bool broadcastable to [B, H, L, S] (False = masked key)."""
    B, H, L, _ = q.shape
    S = k.shape[2]
    bias = None
    if q.is_cuda:
        if keep is not None:
            pad = -S % 16
            bias = torch.zeros(B, H, L, S + pad, dtype=q.dtype, device=q.device)[..., :S]
            bias.masked_fill_(~keep.expand(B, H, L, S), float("-inf"))
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, True, 0.0, False, scale=scale)[:2]
        return out, lse[..., :L].float()
    if keep is not None:
        bias = torch.zeros(B, H, L, S, dtype=q.dtype, device=q.device).masked_fill_(~keep.expand(B, H, L, S),
                                                                                  float("-inf"))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=bias,
                                                                          scale=scale)
    return out, lse.float()


def block_attention(q, k, v, scale, mem_out, mem_logit, extra_k=None, extra_v=None, extra_valid=None):
    """`naive.block_attention` through a fused kernel plus the log-sum-exp merge (same
    arguments and results; see the module docstring). Requires K == V head dims (as the
    model has) and q, k, v of one dtype.

    Raises:
        ValueError: extra_k without extra_v / extra_valid.
    """
    if extra_k is not None and (extra_v is None or extra_valid is None):
        raise ValueError("extra_k needs extra_v and extra_valid")
    if torch.is_tensor(scale):
        q = (q.float() * scale.float().view(1, -1, 1, 1)).to(q.dtype)
        scale = 1.0
    keep = None
    if extra_k is not None:
        k, v = torch.cat([k, extra_k], 2), torch.cat([v, extra_v], 2)
        L = q.shape[2]
        inblock = torch.ones(L, dtype=torch.bool, device=q.device)
        if extra_valid.dim() == 1:
            keep = torch.cat([inblock, extra_valid]).view(1, 1, 1, -1)
        else:
            keep = torch.cat([inblock.expand(extra_valid.shape[0], L), extra_valid], 1)[:, None, None, :]
    o_att, lse = _attend(q, k, v, keep, float(scale))
    l = mem_logit.float()
    z = torch.logaddexp(lse, l)
    share = torch.exp(l - z)  # [B, H, L]
    o = torch.exp(lse - z)[..., None] * o_att.float() + share[..., None] * mem_out.float()
    return o.to(v.dtype), share
