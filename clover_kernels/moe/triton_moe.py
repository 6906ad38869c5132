"""Routed experts as two grouped GEMMs in Triton, routing and permutation inside the kernels.

The T*k (token, slot) pairs are sorted by expert (stable) and cut into tiles of at most
``BLOCK_M`` rows of one expert. A tile table (expert, first sorted row, row count) is built
on the device, sized by the bound ``ceil(T*k / BLOCK_M) + min(E, T*k)`` so nothing waits on
the host; tiles past the real ones have 0 rows and return at once.

1. `_gate_up_kernel`, grid (tiles, F / BLOCK_N): gathers the tile's token rows of x
   straight from x (no permuted copy), multiplies by the expert's gate and up rows and
   writes ``h = silu(x W_gate^T) * (x W_up^T)`` (fp32 accumulation) in sorted-pair order.
2. `_down_kernel`, grid (tiles, D / BLOCK_N): ``y = (h W_down^T) * w_pair``, scattered
   straight back to (token, slot) order.

An expert with at most ``BLOCK_M`` pairs (the usual case in a block of 32 tokens) has one
tile, so its weights are read once per forward; untouched experts are never read. The k
slots are summed in torch, a deterministic reduction (no atomics).
Grouped-GEMM MoE in this style: vLLM's ``fused_moe``, and Tillet et al., "Triton" (MAPL 2019).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, order_ptr, tile_e_ptr, tile_row0_ptr, tile_n_ptr, h_ptr,
                    D, F, TOP_K, stride_x, stride_we, stride_wn, stride_h,
                    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    nrows = tl.load(tile_n_ptr + t)
    if nrows > 0:
        e = tl.load(tile_e_ptr + t).to(tl.int64)
        row0 = tl.load(tile_row0_ptr + t)
        rm = tl.arange(0, BLOCK_M)
        rmask = rm < nrows
        pair = tl.load(order_ptr + row0 + rm, mask=rmask, other=0)
        tok = pair // TOP_K
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = rn < F
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        w_base = w_ptr + e * stride_we
        for k0 in range(0, D, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            kmask = rk < D
            a = tl.load(x_ptr + tok[:, None] * stride_x + rk[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
            wmask = kmask[:, None] & nmask[None, :]
            wg = tl.load(w_base + rn[None, :] * stride_wn + rk[:, None], mask=wmask, other=0.0)  # [BK, BN]
            wu = tl.load(w_base + (rn[None, :] + F) * stride_wn + rk[:, None], mask=wmask, other=0.0)
            acc_g = tl.dot(a, wg, acc_g, input_precision=PRECISION)
            acc_u = tl.dot(a, wu, acc_u, input_precision=PRECISION)
        h = acc_g * tl.sigmoid(acc_g) * acc_u
        tl.store(h_ptr + (row0 + rm)[:, None] * stride_h + rn[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=rmask[:, None] & nmask[None, :])


@triton.jit
def _down_kernel(h_ptr, w_ptr, order_ptr, weight_ptr, tile_e_ptr, tile_row0_ptr, tile_n_ptr, y_ptr,
                 D, F, stride_h, stride_we, stride_wn, stride_y,
                 PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    nrows = tl.load(tile_n_ptr + t)
    if nrows > 0:
        e = tl.load(tile_e_ptr + t).to(tl.int64)
        row0 = tl.load(tile_row0_ptr + t)
        rm = tl.arange(0, BLOCK_M)
        rmask = rm < nrows
        pair = tl.load(order_ptr + row0 + rm, mask=rmask, other=0)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = rn < D
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        w_base = w_ptr + e * stride_we
        for f0 in range(0, F, BLOCK_K):
            rf = f0 + tl.arange(0, BLOCK_K)
            fmask = rf < F
            a = tl.load(h_ptr + (row0 + rm)[:, None] * stride_h + rf[None, :], mask=rmask[:, None] & fmask[None, :],
                        other=0.0)
            w = tl.load(w_base + rn[None, :] * stride_wn + rf[:, None], mask=fmask[:, None] & nmask[None, :], other=0.0)
            acc = tl.dot(a, w, acc, input_precision=PRECISION)
        wt = tl.load(weight_ptr + pair, mask=rmask, other=0.0)
        y = acc * wt[:, None]
        tl.store(y_ptr + pair[:, None] * stride_y + rn[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=rmask[:, None] & nmask[None, :])


def tile_table(ids: torch.Tensor, num_experts: int, block_m: int):
    """Sort the pairs by expert and cut them into one-expert tiles, all on the device.

    Args:
        ids: [T, k] int64 expert ids. num_experts: E. block_m: rows per tile.

    Returns:
        order: [T*k] int64, pair ids sorted by expert (stable); counts: [E] int64 pairs per expert;
        tile_e, tile_row0, tile_n: [n_tiles] int64, each tile's expert, first row in `order` and
        row count (0 for the spare tiles past the real ones).
    """
    flat = ids.reshape(-1)
    P = flat.numel()
    order = flat.argsort(stable=True)
    # pairs per expert; not bincount, whose output length depends on max(ids) (a host sync on CUDA)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device).index_add_(0, flat, torch.ones_like(flat))
    starts = counts.cumsum(0) - counts
    tiles = (counts + block_m - 1) // block_m
    tile_end = tiles.cumsum(0)
    n_tiles = triton.cdiv(P, block_m) + min(num_experts, P)
    t = torch.arange(n_tiles, device=ids.device)
    e = torch.searchsorted(tile_end, t, right=True)  # E for the spare tiles
    ec = e.clamp(max=num_experts - 1)
    j = t - (tile_end - tiles)[ec]
    tile_n = torch.where(e < num_experts, (counts[ec] - j * block_m).clamp(0, block_m), 0)
    return order, counts, ec, starts[ec] + j * block_m, tile_n


def routed_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up_proj: torch.Tensor,
                   down_proj: torch.Tensor, buffers: tuple[torch.Tensor, torch.Tensor] | None = None,
                   block_m: int = 64, block_n: int = 64, block_k: int = 32,
                   union_as_tensor: bool = False) -> tuple[torch.Tensor, int | torch.Tensor]:
    """Triton `clover_kernels.moe.naive.routed_experts` (same arguments and results).

    Args:
        buffers: optional (h [T*k, F], y_pairs [T*k, D]) in x's dtype for the kernels to write
            (tests pass NaN-filled ones to check every element is written).
        block_m / block_n / block_k: tile sizes (powers of two, >= 16).
        union_as_tensor: return the expert union as a 0-d int64 tensor (no host sync; CUDA graphs).

    Raises:
        ValueError: shapes that do not fit together.
    """
    T, top_k = ids.shape
    E, F2, D = gate_up_proj.shape
    F_ = F2 // 2
    if x.shape != (T, D) or down_proj.shape != (E, D, F_) or weights.shape != ids.shape or F2 % 2:
        raise ValueError(f"shapes do not fit: x {tuple(x.shape)}, weights {tuple(weights.shape)}, ids "
                         f"{tuple(ids.shape)}, gate_up_proj {tuple(gate_up_proj.shape)}, down_proj "
                         f"{tuple(down_proj.shape)}")
    x, gate_up_proj, down_proj = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, gate_up_proj, down_proj))
    P = T * top_k
    order, counts, tile_e, tile_row0, tile_n = tile_table(ids, E, block_m)
    if buffers is None:
        h = torch.empty(P, F_, dtype=x.dtype, device=x.device)
        y_pairs = torch.empty(P, D, dtype=x.dtype, device=x.device)
    else:
        h, y_pairs = buffers
    w = weights.reshape(-1).float().contiguous()
    prec = "ieee" if x.dtype == torch.float32 else "tf32"  # fp32 models: no TF32 rounding
    n_tiles = tile_n.numel()
    _gate_up_kernel[(n_tiles, triton.cdiv(F_, block_n))](
        x, gate_up_proj, order, tile_e, tile_row0, tile_n, h, D, F_, top_k,
        x.stride(0), gate_up_proj.stride(0), gate_up_proj.stride(1), h.stride(0),
        PRECISION=prec, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    _down_kernel[(n_tiles, triton.cdiv(D, block_n))](
        h, down_proj, order, w, tile_e, tile_row0, tile_n, y_pairs, D, F_,
        h.stride(0), down_proj.stride(0), down_proj.stride(1), y_pairs.stride(0),
        PRECISION=prec, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    hit = (counts > 0).sum()
    return y_pairs.view(T, top_k, D).sum(1), hit if union_as_tensor else int(hit)
