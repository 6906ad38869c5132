"""Per-slot confidence: one dispatcher over the implementations.

``torch`` (`naive.confidence_step`, the definition), ``host`` (`host.confidence_step`, the
CPU path: the same results with vectorised row maxima) and ``triton``
(`triton_confidence.confidence_step`, one fused pass over the vocabulary). With
``impl=None`` CUDA tensors take Triton when it is installed, everything else host (which
falls back to torch for what numpy cannot hold).
"""

from __future__ import annotations

import torch

from clover_kernels._triton import HAS_TRITON, require_triton
from clover_kernels.confidence.host import confidence_step as _host_step
from clover_kernels.confidence.host import top_candidates as _host_top
from clover_kernels.confidence.naive import confidence_step as _torch_step
from clover_kernels.confidence.naive import never_mask
from clover_kernels.confidence.naive import top_candidates as _torch_top

IMPLS = ("torch", "host", "triton")


def confidence_step(logits: torch.Tensor, never: torch.Tensor, with_probs: bool = True,
                    impl: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Dispatch; arguments and results as in `clover_kernels.confidence.naive.confidence_step`.

    Args:
        impl: ``"torch"``, ``"host"``, ``"triton"`` or None (Triton on CUDA when installed,
            else host).

    Raises:
        ValueError: unknown impl. RuntimeError: impl="triton" where Triton cannot run.
    """
    if impl is None:
        impl = "triton" if logits.is_cuda and HAS_TRITON else "host"
    if impl == "torch":
        return _torch_step(logits, never, with_probs)
    if impl == "host":
        return _host_step(logits, never, with_probs)
    if impl == "triton":
        require_triton("confidence_step", logits)
        from clover_kernels.confidence import triton_confidence  # local: triton is optional (clover_kernels/_triton.py)

        return triton_confidence.confidence_step(logits, never, with_probs)
    raise ValueError(f"unknown confidence_step impl {impl!r}; choose one of {IMPLS}")


def top_candidates(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K most probable ids per slot (`clover_kernels.confidence.naive.top_candidates`): the chunked
    host path (`host.top_candidates`) for CPU tensors, ``torch.topk`` elsewhere."""
    return (_host_top if probs.device.type == "cpu" else _torch_top)(probs, k)


__all__ = ["IMPLS", "confidence_step", "never_mask", "top_candidates"]
