"""The decode forward's CPU shortcuts are the definitions' own arithmetic: equal bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from clover_engine.backbones.clover.moe import SMALL_PAIRS, few_token_experts, pairwise_experts
from clover_engine.backbones.clover.ops import causal_conv_step, delta_update, rope, rope_angles
from clover_engine.backbones.clover.compiled import compiler_available
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.backbones.clover.model import random_model
from clover_kernels.moe import routed_experts


@pytest.mark.parametrize("T", [1, 2, 3, SMALL_PAIRS // 2])
def test_few_token_experts_equal_the_grouped_loop(T):
    g = torch.Generator().manual_seed(T)
    E, k, D, Fd = 8, 2, 64, 48
    gu, down = torch.randn(E, 2 * Fd, D, generator=g), torch.randn(E, D, Fd, generator=g)
    for _ in range(30):
        x = torch.randn(T, D, generator=g)
        probs = torch.softmax(torch.randn(T, E, generator=g), -1)
        w, idx = probs.topk(k, -1)
        want, hit = routed_experts(x, w, idx, gu, down, impl="torch")
        got, got_hit = few_token_experts(x, w, idx, gu, down)
        assert torch.equal(want, got) and hit == got_hit


def _routing(g, T, E=8, k=2, D=64, Fd=48):
    x = torch.randn(T, D, generator=g)
    w, idx = torch.softmax(torch.randn(T, E, generator=g), -1).topk(k, -1)
    return x, w, idx


@pytest.mark.parametrize("T", [1, 2, 3, SMALL_PAIRS // 2])
def test_pairwise_experts_equal_the_grouped_loop(T):
    """The traceable form (one pair at a time, the union as a tensor) is the same sum; a stacked
    [n, D] product may round differently from n one-row products, so equal to float rounding."""
    g = torch.Generator().manual_seed(10 + T)
    gu, down = torch.randn(8, 96, 64, generator=g), torch.randn(8, 64, 48, generator=g)
    for _ in range(30):
        x, w, idx = _routing(g, T)
        want, hit = routed_experts(x, w, idx, gu, down, impl="torch")
        got, got_hit = pairwise_experts(x, w, idx, gu, down)
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()  # float rounding of sums of ~100 terms
        assert got_hit.dtype == torch.int64 and int(got_hit) == hit


@pytest.mark.skipif(not compiler_available(), reason="no C++ compiler for TorchInductor's CPU kernels")
def test_pairwise_experts_compile_once_for_every_routing():
    """Compiled in one graph (fullgraph: no break), the expert ids read as symbolic scalars: new
    routings reuse the graph (a recompile raises) and give the eager result."""
    g = torch.Generator().manual_seed(3)
    gu, down = torch.randn(8, 96, 64, generator=g), torch.randn(8, 64, 48, generator=g)
    compiled = torch.compile(pairwise_experts, fullgraph=True, dynamic=False)
    with torch.no_grad(), torch._dynamo.config.patch(capture_scalar_outputs=True):
        x, w, idx = _routing(g, 2)
        try:
            compiled(x, w, idx, gu, down)
        except torch._dynamo.exc.BackendCompilerFailed as exc:  # the toolchain (e.g. no Python headers)
            pytest.skip(f"TorchInductor cannot build CPU kernels here: {str(exc).splitlines()[0][:200]}")
        with torch._dynamo.config.patch(error_on_recompile=True):
            for _ in range(6):
                x, w, idx = _routing(g, 2)
                got, hit = compiled(x, w, idx, gu, down)
                want, want_hit = few_token_experts(x, w, idx, gu, down)
                assert (got - want).abs().max() <= 1e-5 * want.abs().max()
                assert int(hit) == want_hit


@pytest.mark.parametrize("Hk,H", [(4, 4), (2, 4)])
def test_one_token_commit_equals_the_token_loop(Hk, H):
    g = torch.Generator().manual_seed(H)
    S = torch.randn(1, H, 16, 24, generator=g)
    k, v = torch.randn(1, 1, Hk, 16, generator=g), torch.randn(1, 1, H, 24, generator=g)
    gl, beta = -torch.rand(1, 1, H, generator=g), torch.rand(1, 1, H, generator=g)
    assert torch.equal(delta_update(S, k, v, gl, beta), delta_update(S, k, v, gl, beta, naive=True))


@pytest.mark.parametrize("T,n_commit", [(1, 0), (2, 1), (33, 32), (64, 32)])
def test_causal_conv_step_equals_conv1d(T, n_commit):
    g = torch.Generator().manual_seed(T)
    ch, kernel = 96, 4
    x, w = torch.randn(2, T, ch, generator=g), torch.randn(ch, 1, kernel, generator=g)
    tail = torch.randn(2, kernel - 1, ch, generator=g)
    conv_in = torch.cat([tail, x], 1)
    want = F.conv1d(conv_in.transpose(1, 2), w, groups=ch).transpose(1, 2)
    new_tail = tail.clone()
    with torch.no_grad():
        got = causal_conv_step(x, w, new_tail, n_commit)
    assert torch.equal(want, got)
    assert torch.equal(new_tail, conv_in[:, n_commit:n_commit + kernel - 1])


def test_rope_with_shared_angles_is_rope():
    x, pos = torch.randn(1, 2, 5, 16), torch.arange(7, 12)
    assert torch.equal(rope(x, pos, 8, 1e4), rope(x, pos, 8, 1e4, rope_angles(pos, 8, 1e4)))


def test_one_token_prompt_at_block_size_1_matches_the_reference():
    """A one-token forward (no commit) goes through the one-token MoE path; the decode still
    gives the model's own greedy tokens (the reference forward over the whole history)."""
    m = random_model("clover-test", seed=1, weight_scale=15.0)
    res = BlockDecoder(m).generate([42], record_trace=False, config=DecodeConfig(block_size=1, max_new_tokens=6))
    hist = [42]
    for tok in res.tokens:
        out = m.forward_reference(torch.tensor([hist]), torch.tensor([[m.config.mask_token_id]]), block_size=1)
        logits = out.logits[0, 0].clone()
        logits[m.config.mask_token_id] = float("-inf")
        assert int(logits.argmax()) == tok
        hist.append(tok)
