"""Routed experts of the sparse MoE: one dispatcher over the implementations.

``torch`` (`naive.routed_experts`: a loop over the hit experts, the definition and the CPU
path), ``grouped_mm`` (`grouped_mm.routed_experts`: two ``torch._grouped_mm`` calls) and
``triton`` (`triton_moe.routed_experts`: two grouped Triton GEMMs that gather and scatter
the pairs themselves). With ``impl=None``: CUDA bf16 on compute capability >= 9.0 with
16-byte-aligned D and F takes ``grouped_mm``; other CUDA tensors take Triton when it is
installed; everything else torch.
"""

from __future__ import annotations

import torch

from kernels._triton import HAS_TRITON, require_triton
from kernels.moe import grouped_mm as _grouped_mm
from kernels.moe.naive import routed_experts as _torch_experts

IMPLS = ("torch", "grouped_mm", "triton")


def _auto(x: torch.Tensor, gate_up_proj: torch.Tensor) -> str:
    if not x.is_cuda:
        return "torch"
    if (x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (9, 0)
            and _grouped_mm.supported(x, gate_up_proj)):
        return "grouped_mm"
    return "triton" if HAS_TRITON else "torch"


def routed_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up_proj: torch.Tensor,
                   down_proj: torch.Tensor, impl: str | None = None) -> tuple[torch.Tensor, int]:
    """Dispatch; arguments and results as in `kernels.moe.naive.routed_experts`.

    Args:
        impl: ``"torch"``, ``"grouped_mm"``, ``"triton"`` or None (see the module docstring).
            The fast paths have no backward; with autograd recording (training) None picks torch.

    Raises:
        ValueError: unknown impl. RuntimeError: impl="triton" where Triton cannot run.
    """
    if impl is None:
        grad = torch.is_grad_enabled() and (x.requires_grad or gate_up_proj.requires_grad)
        impl = "torch" if grad else _auto(x, gate_up_proj)
    if impl == "torch":
        return _torch_experts(x, weights, ids, gate_up_proj, down_proj)
    if impl == "grouped_mm":
        return _grouped_mm.routed_experts(x, weights, ids, gate_up_proj, down_proj)
    if impl == "triton":
        require_triton("routed_experts", x)
        from kernels.moe import triton_moe  # lazy: see kernels/_triton.py

        return triton_moe.routed_experts(x, weights, ids, gate_up_proj, down_proj)
    raise ValueError(f"unknown routed_experts impl {impl!r}; choose one of {IMPLS}")


__all__ = ["IMPLS", "routed_experts"]
