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
                   down_proj: torch.Tensor, union_as_tensor: bool = False) -> tuple[torch.Tensor, int | torch.Tensor]:
    """`clover_kernels.moe.naive.routed_experts` with two grouped GEMMs (same arguments and results).

    Args:
        union_as_tensor: return the expert union as a 0-d int64 tensor on x's device instead of a
            Python int, so the call makes no host sync (CUDA-graph capture, `clover_engine.backbones.clover.cuda_graphs`).

    Raises:
        ValueError: D or F not 16-byte aligned, or torch has no ``_grouped_mm``.
    """
    if not supported(x, gate_up_proj):
        raise ValueError(f"torch._grouped_mm needs D and F with 16-byte rows (D={gate_up_proj.shape[2]}, "
                         f"F={gate_up_proj.shape[1] // 2}, {x.dtype}) and a torch that has it")
    T, top_k = ids.shape
    flat = ids.reshape(-1)
    order = flat.argsort(stable=True)
    # pairs per expert; not bincount, whose output length depends on max(ids) (a host sync on CUDA)
    counts = torch.zeros(gate_up_proj.shape[0], dtype=torch.int64, device=ids.device).index_add_(
        0, flat, torch.ones_like(flat))
    offs = counts.cumsum(0).to(torch.int32)
    xs = x[order // top_k]  # [T*k, D], sorted by expert
    h = torch._grouped_mm(xs, gate_up_proj.transpose(-2, -1), offs=offs)  # [T*k, 2F]
    gte, up = h.chunk(2, -1)
    y = torch._grouped_mm((F.silu(gte) * up).contiguous(), down_proj.transpose(-2, -1), offs=offs)  # [T*k, D]
    y = y * weights.reshape(-1)[order, None].to(x.dtype)
    y_pairs = torch.empty_like(y)
    y_pairs[order] = y
    hit = (counts > 0).sum()
    return y_pairs.view(T, top_k, x.shape[-1]).sum(1), hit if union_as_tensor else int(hit)
