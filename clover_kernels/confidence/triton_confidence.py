"""Fused confidence step in Triton: one program per slot streams its logits row twice at most.

Pass 1 keeps an online softmax over vocabulary tiles (Milakov & Gimelshein, "Online
normalizer calculation for softmax", 2018): the running max ``m``, the running
``s = sum_v exp(x_v - m)`` rescaled by ``exp(m_old - m_new)`` whenever the max grows,
and the id of the first maximal logit. The confidence is then ``exp(m - m) / s = 1 / s``
without forming any probability. Pass 2 (only with ``with_probs``) writes
``p_v = exp(x_v - m) / s`` -- the probabilities are materialised once, in the output.
Excluded ids (``never``) read as -inf in both passes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _confidence_kernel(logits_ptr, never_ptr, conf_ptr, cand_ptr, probs_ptr, V, stride_l, stride_p,
                       WITH_PROBS: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    base = logits_ptr + row * stride_l
    offs = tl.arange(0, BLOCK_V)
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    arg = tl.zeros((), tl.int64)
    for v0 in range(0, V, BLOCK_V):
        idx = v0 + offs
        inb = idx < V
        x = tl.load(base + idx, mask=inb, other=float("-inf")).to(tl.float32)
        skip = tl.load(never_ptr + idx, mask=inb, other=1) != 0
        x = tl.where(skip, float("-inf"), x)
        t_max = tl.max(x, 0)
        t_arg = tl.argmax(x, 0, tie_break_left=True).to(tl.int64) + v0
        new_m = tl.maximum(m, t_max)
        arg = tl.where(t_max > m, t_arg, arg)  # strictly greater: the first maximal id wins
        # a tile (or everything so far) of -inf contributes 0; avoid exp(-inf - -inf)
        safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)
        s = s * tl.exp(m - safe_m) + tl.sum(tl.exp(x - safe_m), 0)
        m = new_m
    tl.store(conf_ptr + row, (1.0 / s).to(conf_ptr.dtype.element_ty))
    tl.store(cand_ptr + row, arg)
    if WITH_PROBS:
        inv = 1.0 / s
        for v0 in range(0, V, BLOCK_V):
            idx = v0 + offs
            inb = idx < V
            x = tl.load(base + idx, mask=inb, other=float("-inf")).to(tl.float32)
            skip = tl.load(never_ptr + idx, mask=inb, other=1) != 0
            p = tl.where(skip, 0.0, tl.exp(x - m) * inv)
            tl.store(probs_ptr + row * stride_p + idx, p.to(probs_ptr.dtype.element_ty), mask=inb)


def confidence_step(logits: torch.Tensor, never: torch.Tensor, with_probs: bool = True,
                    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None,
                    block_v: int = 1024) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Triton `clover_kernels.confidence.naive.confidence_step` (same arguments and results).

    Args:
        out: optional preallocated (conf [L], cand [L] int64, probs [L, V] or None) to write into
            (tests pass NaN-filled tensors to check every element is written).
        block_v: vocabulary tile (a power of two).

    Raises:
        ValueError: logits not [L, V], or never not a [V] bool tensor.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [L, V], got shape {tuple(logits.shape)}")
    L, V = logits.shape
    if never.shape != (V,) or never.dtype != torch.bool:
        raise ValueError(f"never must be a [V={V}] bool tensor, got {tuple(never.shape)} {never.dtype}")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if out is None:
        conf = torch.empty(L, dtype=logits.dtype, device=logits.device)
        cand = torch.empty(L, dtype=torch.int64, device=logits.device)
        probs = torch.empty(L, V, dtype=logits.dtype, device=logits.device) if with_probs else None
    else:
        conf, cand, probs = out
    never_u8 = never.contiguous().view(torch.uint8)
    if L:
        _confidence_kernel[(L,)](logits, never_u8, conf, cand, probs if with_probs else conf,
                                 V, logits.stride(0), probs.stride(0) if with_probs else 0,
                                 WITH_PROBS=with_probs, BLOCK_V=min(block_v, triton.next_power_of_2(V)))
    return conf, cand, (probs if with_probs else None)
