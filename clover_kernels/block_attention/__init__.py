"""In-block attention with the memory unit: one dispatcher over the implementations.

``torch`` (`naive.block_attention`, the definition and the CPU path) and ``sdpa``
(`sdpa.block_attention`: a fused attention kernel returning the log-sum-exp, merged
exactly with the memory logit). With ``impl=None``: CUDA tensors without window keys take
``sdpa`` when autograd is not recording; everything else torch (the log-sum-exp output
has no gradient; the window's padded bias path has not run on a GPU in this repository's
tests).
"""

from __future__ import annotations

import torch

from clover_kernels.block_attention import sdpa as _sdpa
from clover_kernels.block_attention.naive import block_attention as _torch_attention

IMPLS = ("torch", "sdpa")


def block_attention(q, k, v, scale, mem_out, mem_logit, extra_k=None, extra_v=None, extra_valid=None,
                    impl: str | None = None):
    """Dispatch; arguments and results as in `clover_kernels.block_attention.naive.block_attention`.

    Args:
        impl: ``"torch"``, ``"sdpa"`` or None (see the module docstring).

    Raises:
        ValueError: unknown impl.
    """
    if impl is None:
        tensors = [t for t in (q, k, v, scale, mem_out, mem_logit) if torch.is_tensor(t)]
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        impl = "sdpa" if q.is_cuda and extra_k is None and not grad else "torch"
    if impl == "torch":
        return _torch_attention(q, k, v, scale, mem_out, mem_logit, extra_k, extra_v, extra_valid)
    if impl == "sdpa":
        return _sdpa.block_attention(q, k, v, scale, mem_out, mem_logit, extra_k, extra_v, extra_valid)
    raise ValueError(f"unknown block_attention impl {impl!r}; choose one of {IMPLS}")


__all__ = ["IMPLS", "block_attention"]
