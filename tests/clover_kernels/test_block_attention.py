"""In-block attention with the memory unit: the fused-kernel + log-sum-exp path against the
plain-torch definition over block sizes, head dims, per-head scales and window masks; the
dispatcher. The CPU runs ATen's CPU flash-attention op; the CUDA op runs only with CUDA.

Run: .venv/bin/python -m pytest tests/clover_kernels/test_block_attention.py -q
"""

import pytest
import torch

from clover_kernels import block_attention as ba
from clover_kernels.block_attention import naive, sdpa


def _case(L, D, W=0, B=2, H=3, dtype=torch.float32, seed=0, per_head=False, valid_rows=False):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k, v, m = r(B, H, L, D), r(B, H, L, D), r(B, H, L, D), r(B, H, L, D)
    mem_logit = r(B, H, L) * 2
    scale = torch.rand(H, generator=gen) + 0.2 if per_head else D**-0.5
    ek = ev = valid = None
    if W:
        ek, ev = r(B, H, W, D), r(B, H, W, D)
        valid = torch.rand(B, W, generator=gen) > 0.4 if valid_rows else torch.arange(W) >= W // 3
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    return (cast(q), cast(k), cast(v), scale, cast(m), mem_logit, cast(ek), cast(ev), valid)


GRID = [(L, D, W, per_head, rows) for L, D, W, per_head, rows in
        ((1, 24, 0, False, False), (7, 24, 5, True, False), (32, 40, 0, True, False),
         (33, 24, 9, False, True), (64, 16, 0, False, False))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("L, D, W, per_head, rows", GRID, ids=[f"L{g[0]}-D{g[1]}-W{g[2]}" for g in GRID])
def test_sdpa_merge_equals_definition(L, D, W, per_head, rows, dtype):
    args = _case(L, D, W, dtype=dtype, seed=L, per_head=per_head, valid_rows=rows)
    o, share = sdpa.block_attention(*args)
    f32 = [a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
    ref_o, ref_share = naive.block_attention(*f32)
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    assert o.dtype == dtype and share.dtype == torch.float32
    torch.testing.assert_close(o.float(), ref_o, **tol)
    torch.testing.assert_close(share, ref_share, **tol)


def test_memory_dominates_and_vanishes():
    """A huge memory logit gives share 1 and o = m; a hugely negative one gives the plain attention."""
    q, k, v, scale, m, _, _, _, _ = _case(7, 24)
    for logit, want in ((1e4, 1.0), (-1e4, 0.0)):
        o, share = sdpa.block_attention(q, k, v, scale, m, torch.full(q.shape[:3], logit))
        torch.testing.assert_close(share, torch.full_like(share, want))
        ref = m if want else torch.softmax((q @ k.transpose(-1, -2)) * scale, -1) @ v
        torch.testing.assert_close(o, ref, atol=1e-5, rtol=1e-5)


def test_dispatcher_cpu_is_the_definition():
    args = _case(7, 24, 5)
    got, ref = ba.block_attention(*args), naive.block_attention(*args)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    with pytest.raises(ValueError, match="impl"):
        ba.block_attention(*args, impl="flash")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the efficient-attention op)")
@pytest.mark.parametrize("W", [0, 9])
def test_sdpa_cuda_equals_definition(W):
    args = [a.cuda() if torch.is_tensor(a) else a for a in _case(33, 24, W, dtype=torch.bfloat16, per_head=True)]
    o, share = sdpa.block_attention(*args)
    f32 = [a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
    ref_o, ref_share = naive.block_attention(*f32)
    torch.testing.assert_close(o.float(), ref_o, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(share, ref_share, atol=1e-2, rtol=1e-2)
