"""Gated delta rule vs transformers' Qwen3.5 reference (external, imported here only).

Run: .venv/bin/python -m pytest tests/kernels/test_gated_delta_rule.py -q
"""

import pytest
import torch

from kernels.gated_delta_rule import chunk, naive

qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


def _inputs(T, Hk=2, Hv=4, K=16, V=8, B=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, Hk, K, generator=gen)
    k = torch.randn(B, T, Hk, K, generator=gen)
    v = torch.randn(B, T, Hv, V, generator=gen)
    g = -torch.rand(B, T, Hv, generator=gen) * 0.5
    beta = torch.rand(B, T, Hv, generator=gen)
    s0 = torch.randn(B, Hv, K, V, generator=gen) * 0.3
    return q, k, v, g, beta, s0


@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("T", [1, 2, 31, 33, 64], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("impl", ["naive", "chunk"])
def test_matches_transformers_recurrent(impl, T, with_state):
    q, k, v, g, beta, s0 = _inputs(T)
    init = s0 if with_state else None
    ref_o, ref_s = qwen.torch_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    fn = naive.gated_delta_rule if impl == "naive" else chunk.gated_delta_rule
    kwargs = {"chunk_size": 16} if impl == "chunk" else {}
    o, s = fn(q, k, v, g, beta, initial_state=init, output_final_state=True,
              use_qk_l2norm_in_kernel=True, **kwargs)
    torch.testing.assert_close(o, ref_o, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s, ref_s, atol=1e-4, rtol=1e-4)


def test_initial_state_not_modified():
    q, k, v, g, beta, s0 = _inputs(5)
    before = s0.clone()
    chunk.gated_delta_rule(q, k, v, g, beta, initial_state=s0, use_qk_l2norm_in_kernel=True)
    naive.gated_delta_rule(q, k, v, g, beta, initial_state=s0, use_qk_l2norm_in_kernel=True)
    assert torch.equal(s0, before)
