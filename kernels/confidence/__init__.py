"""Per-slot confidence: one dispatcher over the implementations.

``torch`` (`naive.confidence_step`, the definition and the CPU path) and ``triton``
(`triton_confidence.confidence_step`, one fused pass over the vocabulary). With
``impl=None`` CUDA tensors take Triton when it is installed, everything else torch.
"""

from __future__ import annotations

import torch

from kernels._triton import HAS_TRITON, require_triton
from kernels.confidence.naive import confidence_step as _torch_step
from kernels.confidence.naive import never_mask

IMPLS = ("torch", "triton")


def confidence_step(logits: torch.Tensor, never: torch.Tensor, with_probs: bool = True,
                    impl: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Dispatch; arguments and results as in `kernels.confidence.naive.confidence_step`.

    Args:
        impl: ``"torch"``, ``"triton"`` or None (Triton on CUDA when installed, else torch).

    Raises:
        ValueError: unknown impl. RuntimeError: impl="triton" where Triton cannot run.
    """
    if impl is None:
        impl = "triton" if logits.is_cuda and HAS_TRITON else "torch"
    if impl == "torch":
        return _torch_step(logits, never, with_probs)
    if impl == "triton":
        require_triton("confidence_step", logits)
        from kernels.confidence import triton_confidence  # lazy: see kernels/_triton.py

        return triton_confidence.confidence_step(logits, never, with_probs)
    raise ValueError(f"unknown confidence_step impl {impl!r}; choose one of {IMPLS}")


__all__ = ["IMPLS", "confidence_step", "never_mask"]
