"""Routed experts: the Triton grouped kernels (under TRITON_INTERPRET=1 on the CPU) and the
``torch._grouped_mm`` path against the plain-torch definition, and the dispatcher against
`clover_engine.backbones.clover.moe.SparseMoE`.

Run: .venv/bin/python -m pytest tests/clover_kernels/test_moe.py -q
"""

import importlib.util

import pytest
import torch

from clover_kernels import moe
from clover_kernels.moe import grouped_mm, naive

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton)")


def _case(T, D, F, E=6, k=2, dtype=torch.float32, seed=0, skew=False):
    """Inputs as the router makes them. skew: most tokens pick experts 0 and 1 (experts with
    more pairs than one tile, and experts with none)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=gen).to(dtype)
    logits = torch.randn(T, E, generator=gen)
    if skew:
        logits[:, :2] += 4.0
    w, ids = torch.softmax(logits, -1).topk(k, -1)
    w = w / w.sum(-1, keepdim=True)
    gate_up = (torch.randn(E, 2 * F, D, generator=gen) * D**-0.5).to(dtype)
    down = (torch.randn(E, D, F, generator=gen) * F**-0.5).to(dtype)
    return x, w, ids, gate_up, down


def _tol(dtype):
    return dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


GRID = [(T, D, F, skew, dtype) for T, D, F, skew in ((1, 37, 23, False), (7, 40, 24, True), (33, 24, 20, True))
        for dtype in (torch.float32, torch.float16)]


@needs_triton
@pytest.mark.parametrize("T, D, F, skew, dtype", GRID, ids=[f"T{t}-D{d}-F{f}-{str(x)[6:]}" for t, d, f, _, x in GRID])
def test_triton_equals_torch(T, D, F, skew, dtype):
    from clover_kernels.moe import triton_moe

    x, w, ids, gate_up, down = _case(T, D, F, dtype=dtype, seed=T, skew=skew)
    P = T * ids.shape[1]
    nan = float("nan")
    bufs = (torch.full((P, F), nan, dtype=dtype), torch.full((P, D), nan, dtype=dtype))
    out, hit = triton_moe.routed_experts(x, w, ids, gate_up, down, buffers=bufs, block_m=16, block_n=16, block_k=16)
    ref, ref_hit = naive.routed_experts(x.float(), w, ids, gate_up.float(), down.float())
    assert not bool(bufs[1].isnan().any()), "a (token, slot) row was not written"
    assert out.dtype == dtype and hit == ref_hit
    torch.testing.assert_close(out.float(), ref, **_tol(dtype))


@needs_triton
def test_tile_table_covers_every_pair_once():
    """Every sorted row lies in exactly one tile of its own expert; spare tiles are empty."""
    from clover_kernels.moe import triton_moe

    _, _, ids, _, _ = _case(33, 8, 8, skew=True)
    order, counts, tile_e, tile_row0, tile_n = triton_moe.tile_table(ids, 6, 16)
    flat = ids.reshape(-1)
    seen = torch.zeros(flat.numel(), dtype=torch.int64)
    for e, r0, n in zip(tile_e.tolist(), tile_row0.tolist(), tile_n.tolist()):
        assert 0 <= n <= 16
        seen[r0:r0 + n] += 1
        assert bool((flat[order[r0:r0 + n]] == e).all())
    assert bool((seen == 1).all()) and int(counts.max()) > 16


@pytest.mark.parametrize("T", [1, 7, 33])
def test_grouped_mm_equals_torch(T):
    x, w, ids, gate_up, down = _case(T, 40, 24, seed=T, skew=True)
    out, hit = grouped_mm.routed_experts(x, w, ids, gate_up, down)
    ref, ref_hit = naive.routed_experts(x, w, ids, gate_up, down)
    assert hit == ref_hit
    torch.testing.assert_close(out, ref, **_tol(torch.float32))


def test_grouped_mm_rejects_unaligned_rows():
    x, w, ids, gate_up, down = _case(3, 37, 23)
    assert not grouped_mm.supported(x, gate_up)
    with pytest.raises(ValueError, match="16-byte"):
        grouped_mm.routed_experts(x, w, ids, gate_up, down)


def test_dispatcher_cpu_is_sparse_moe():
    """On the CPU the dispatcher is the definition, bit for bit the MoE layer's routed output."""
    from clover_engine.backbones.clover.moe import SparseMoE
    from clover_engine.backbones.clover.config import CloverConfig

    cfg = CloverConfig(hidden_size=24, moe_intermediate_size=20, num_experts=6, num_experts_per_tok=2,
                       shared_expert_intermediate_size=16)
    layer = SparseMoE(cfg).eval()
    x = torch.randn(1, 9, 24)
    with torch.no_grad():
        y, hit = layer(x)
        xf = x.reshape(-1, 24)
        probs = torch.softmax(layer.gate(xf).float(), -1)
        w, ids = probs.topk(2, -1)
        w = w / w.sum(-1, keepdim=True) if cfg.norm_topk_prob else w
        routed, hit2 = moe.routed_experts(xf, w, ids, layer.experts.gate_up_proj, layer.experts.down_proj)
        shared = layer.shared_expert(xf) * torch.sigmoid(layer.shared_expert_gate(xf))
    assert hit == hit2
    assert torch.equal(y.reshape(-1, 24), routed + shared)
    with pytest.raises(ValueError, match="impl"):
        moe.routed_experts(xf, w, ids, layer.experts.gate_up_proj, layer.experts.down_proj, impl="cuda")
