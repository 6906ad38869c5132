"""Routed experts with ``torch._grouped_mm`` (one grouped GEMM per projection).

The pairs sorted by expert form one [T*k, D] matrix whose rows ``offs[e-1]:offs[e]``
belong to expert e (``offs`` = cumulative pair counts, int32, computed on the device);
``torch._grouped_mm(A, W^T, offs=offs)`` multiplies each group by its expert's matrix, so
each touched expert's weights are read once and an expert with no rows is skipped.
``torch._grouped_mm`` is a private PyTorch op (CUDA: bf16 on compute capability >= 9.0;
the CPU has a reference implementation); it needs row strides that are multiples of
16 bytes, so D, F and 2F times the element size must be multiples of 16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def supported(x: torch.Tensor, gate_up_proj: torch.Tensor) -> bool:
    """True when `torch._grouped_mm` can take these shapes (16-byte aligned rows) and exists."""
    F_, D = gate_up_proj.shape[1] // 2, gate_up_proj.shape[2]
    size = x.element_size()
    return hasattr(torch, "_grouped_mm") and (D * size) % 16 == 0 and (F_ * size) % 16 == 0


def routed_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up_proj: torch.Tensor,
                   down_proj: torch.Tensor) -> tuple[torch.Tensor, int]:
    """`kernels.moe.naive.routed_experts` with two grouped GEMMs (same arguments and results).

    Raises:
        ValueError: D or F not 16-byte aligned, or torch has no ``_grouped_mm``.
    """
    if not supported(x, gate_up_proj):
        raise ValueError(f"torch._grouped_mm needs D and F with 16-byte rows (D={gate_up_proj.shape[2]}, "
                         f"F={gate_up_proj.shape[1] // 2}, {x.dtype}) and a torch that has it")
    T, top_k = ids.shape
    flat = ids.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=gate_up_proj.shape[0])
    offs = counts.cumsum(0).to(torch.int32)
    xs = x[order // top_k]  # [T*k, D], sorted by expert
    h = torch._grouped_mm(xs, gate_up_proj.transpose(-2, -1), offs=offs)  # [T*k, 2F]
    gte, up = h.chunk(2, -1)
    y = torch._grouped_mm((F.silu(gte) * up).contiguous(), down_proj.transpose(-2, -1), offs=offs)  # [T*k, D]
    y = y * weights.reshape(-1)[order, None].to(x.dtype)
    y_pairs = torch.empty_like(y)
    y_pairs[order] = y
    return y_pairs.view(T, top_k, x.shape[-1]).sum(1), int((counts > 0).sum())
