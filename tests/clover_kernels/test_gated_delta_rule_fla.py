"""The flash-linear-attention adapter: argument mapping, grouped heads, scale and dtypes
checked on the CPU through a stand-in with ``chunk_gated_delta_rule``'s documented
semantics (fla's kernels are Triton-on-CUDA only); fla itself against the definition
where CUDA and fla are present.

Run: .venv/bin/python -m pytest tests/clover_kernels/test_gated_delta_rule_fla.py -q
"""

import pytest
import torch

from clover_kernels import gated_delta_rule as gdr
from clover_kernels.gated_delta_rule import fla, naive


def fla_standin(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False):
    """fla's documented contract, written out: time-major [B, T, H, *] with q, k and v on the
    same H heads (releases before 0.5 have no grouped values) and one dtype; g natural-log
    decay applied first; beta post-sigmoid; scale on q after the L2 norm (eps 1e-6, inside the
    rsqrt); state [B, H, K, V] fp32; o in q's dtype."""
    assert q.dim() == k.dim() == v.dim() == 4 and g.dim() == beta.dim() == 3
    assert q.shape[2] == k.shape[2] == v.shape[2] == g.shape[2] == beta.shape[2], "H must equal HV"
    assert q.dtype == k.dtype == v.dtype
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    qh, kh, vh = (x.float().transpose(1, 2) for x in (q, k, v))  # [B, H, T, *]
    if use_qk_l2norm_in_kernel:
        qh = qh / torch.sqrt((qh * qh).sum(-1, keepdim=True) + 1e-6)
        kh = kh / torch.sqrt((kh * kh).sum(-1, keepdim=True) + 1e-6)
    gh, bh = g.float().transpose(1, 2), beta.float().transpose(1, 2)  # [B, H, T]
    B, H, T, K = kh.shape
    h = torch.zeros(B, H, K, vh.shape[-1]) if initial_state is None else initial_state.float().clone()
    out = []
    for t in range(T):
        h = h * gh[:, :, t, None, None].exp()
        err = vh[:, :, t] - torch.einsum("bhk,bhkv->bhv", kh[:, :, t], h)
        h = h + kh[:, :, t, :, None] * (bh[:, :, t, None] * err)[:, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", qh[:, :, t] * scale, h))
    o = torch.stack(out, 2).transpose(1, 2).to(q.dtype)
    return o, (h if output_final_state else None)


def _inputs(T, Hk=2, Hv=4, K=12, V=10, B=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, Hk, K, generator=gen)
    k = torch.randn(B, T, Hk, K, generator=gen)
    v = torch.randn(B, T, Hv, V, generator=gen)
    g = -torch.rand(B, T, Hv, generator=gen)
    beta = torch.rand(B, T, Hv, generator=gen)
    s0 = torch.randn(B, Hv, K, V, generator=gen) * 0.3
    return q, k, v, g, beta, s0


@pytest.mark.parametrize("T", [1, 7, 33])
@pytest.mark.parametrize("with_state, l2norm, scale", [(False, True, None), (True, True, None), (True, False, 0.7)],
                         ids=["zero_state", "state", "no_l2norm_scale0.7"])
def test_adapter_with_standin_equals_definition(T, with_state, l2norm, scale):
    q, k, v, g, beta, s0 = _inputs(T, seed=T)
    init = s0 if with_state else None
    kw = dict(initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=l2norm, scale=scale)
    o, S = fla.gated_delta_rule(q, k, v, g, beta, kernel=fla_standin, **kw)
    ref_o, ref_S = naive.gated_delta_rule(q, k, v, g, beta, **kw)
    torch.testing.assert_close(o, ref_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, ref_S, atol=1e-5, rtol=1e-5)
    if with_state:
        assert torch.equal(init, s0)


def test_adapter_dtypes_and_no_final_state():
    """bf16 q/k/v: o in bf16, the final state fp32; output_final_state=False gives None."""
    q, k, v, g, beta, s0 = (x.bfloat16() if x.dim() == 4 and x is not None else x for x in _inputs(5))
    o, S = fla.gated_delta_rule(q, k, v, g, beta, initial_state=s0.float(), kernel=fla_standin,
                                use_qk_l2norm_in_kernel=True)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    _, none = fla.gated_delta_rule(q, k, v, g, beta, output_final_state=False, kernel=fla_standin)
    assert none is None
    with pytest.raises(ValueError, match="multiple"):
        fla.gated_delta_rule(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3], kernel=fla_standin)


def test_dispatcher_cpu_never_takes_fla():
    q, k, v, g, beta, s0 = _inputs(7)
    o, S = gdr.gated_delta_rule(q, k, v, g, beta, initial_state=s0, use_qk_l2norm_in_kernel=True)
    ref = gdr.gated_delta_rule(q, k, v, g, beta, initial_state=s0, use_qk_l2norm_in_kernel=True, impl="chunk")
    assert torch.equal(o, ref[0]) and torch.equal(S, ref[1])
    with pytest.raises(ValueError, match="impl"):
        gdr.gated_delta_rule(q, k, v, g, beta, impl="triton")


@pytest.mark.skipif(not (torch.cuda.is_available() and fla.available()),
                    reason="needs CUDA and flash-linear-attention >= 0.4")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_real_fla_equals_definition(dtype):
    q, k, v, g, beta, s0 = (x.cuda() for x in _inputs(64, K=64, V=64))
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    o, S = gdr.gated_delta_rule(q, k, v, g, beta, initial_state=s0, use_qk_l2norm_in_kernel=True)
    ref_o, ref_S = naive.gated_delta_rule(q, k, v, g, beta, initial_state=s0, use_qk_l2norm_in_kernel=True)
    tol = dict(atol=2e-3, rtol=2e-3) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(o.float(), ref_o.float(), **tol)
    torch.testing.assert_close(S, ref_S, **tol)
