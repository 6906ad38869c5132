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

from clover_kernels._triton import HAS_TRITON, require_triton
from clover_kernels.moe import grouped_mm as _grouped_mm
from clover_kernels.moe.naive import routed_experts as _torch_experts

IMPLS = ("torch", "grouped_mm", "triton")


def _auto(x: torch.Tensor, gate_up_proj: torch.Tensor) -> str:
    if not x.is_cuda:
        return "torch"
    if (x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (9, 0)
            and _grouped_mm.supported(x, gate_up_proj)):
        return "grouped_mm"
    return "triton" if HAS_TRITON else "torch"


def routed_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up_proj: torch.Tensor,
                   down_proj: torch.Tensor, impl: str | None = None,
                   union_as_tensor: bool = False) -> tuple[torch.Tensor, int | torch.Tensor]:
    """Dispatch; arguments and results as in `clover_kernels.moe.naive.routed_experts`.

    Args:
        impl: ``"torch"``, ``"grouped_mm"``, ``"triton"`` or None (see the module docstring).
            The fast paths have no backward; with autograd recording (training) None picks torch.
        union_as_tensor: sync-free call (CUDA-graph capture): the expert union comes back as a 0-d
            int64 tensor, and impl=None picks a path with no host sync -- Triton on CUDA where
            ``grouped_mm`` does not apply, ``grouped_mm`` elsewhere (its CPU reference, for tests).

    Raises:
        ValueError: unknown impl; ``union_as_tensor`` with impl ``"torch"`` (its loop over the hit
            experts needs the counts on the host) or with shapes ``grouped_mm`` cannot take and no
            Triton. RuntimeError: impl="triton" where Triton cannot run.
    """
    if impl is None:
        grad = torch.is_grad_enabled() and (x.requires_grad or gate_up_proj.requires_grad)
        impl = "torch" if grad else _auto(x, gate_up_proj)
        if union_as_tensor and impl == "torch":
            impl = "triton" if x.is_cuda and HAS_TRITON else "grouped_mm"
    if union_as_tensor and impl == "torch":
        raise ValueError("union_as_tensor needs a sync-free impl ('grouped_mm' or 'triton'); the torch loop "
                         "reads the per-expert counts on the host")
    if impl == "grouped_mm":
        return _grouped_mm.routed_experts(x, weights, ids, gate_up_proj, down_proj, union_as_tensor=union_as_tensor)
    if impl == "triton":
        require_triton("routed_experts", x)
        from clover_kernels.moe import triton_moe  # local: triton is optional (clover_kernels/_triton.py)

        return triton_moe.routed_experts(x, weights, ids, gate_up_proj, down_proj, union_as_tensor=union_as_tensor)
    if impl == "torch":
        return _torch_experts(x, weights, ids, gate_up_proj, down_proj)
    raise ValueError(f"unknown routed_experts impl {impl!r}; choose one of {IMPLS}")


__all__ = ["IMPLS", "routed_experts"]
