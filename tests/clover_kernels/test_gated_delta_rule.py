"""Gated delta rule: the chunked path against the token loop (the definition) over chunk
sizes and hard inputs, gradients, and both against transformers' Qwen3.5 reference.

Run: .venv/bin/python -m pytest tests/clover_kernels/test_gated_delta_rule.py -q
"""

import importlib.util

import pytest
import torch

from clover_kernels.gated_delta_rule import chunk, naive

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _inputs(T, Hk=2, Hv=4, K=16, V=8, B=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, Hk, K, generator=gen)
    k = torch.randn(B, T, Hk, K, generator=gen)
    v = torch.randn(B, T, Hv, V, generator=gen)
    g = -torch.rand(B, T, Hv, generator=gen) * 0.5
    beta = torch.rand(B, T, Hv, generator=gen)
    s0 = torch.randn(B, Hv, K, V, generator=gen) * 0.3
    return q, k, v, g, beta, s0


def _hard_inputs(keys, gate, T=64, Hk=1, Hv=1, K=24, V=48, seed=0):
    """Inputs of the kind a commit of repeated tokens produces.

    keys: ``random`` or ``repeated`` (one key plus 1e-3 noise: near-identical after L2 norm).
    gate: ``zero`` (g = 0, no decay), ``strong`` (g ~ -5 per token) or ``random`` (g in [-1, 0]).
    beta is 0.95 everywhere (writes nearly overwrite), the worst case for ``(I + A)``.
    """
    gen = torch.Generator().manual_seed(seed)
    if keys == "random":
        k = torch.randn(1, T, Hk, K, generator=gen)
    else:
        k = torch.randn(K, generator=gen) + 1e-3 * torch.randn(1, T, Hk, K, generator=gen)
    q = torch.randn(1, T, Hk, K, generator=gen)
    v = torch.randn(1, T, Hv, V, generator=gen)
    g = {"zero": torch.zeros(1, T, Hv),
         "strong": -5.0 + 0.1 * torch.randn(1, T, Hv, generator=gen),
         "random": -torch.rand(1, T, Hv, generator=gen)}[gate]
    beta = torch.full((1, T, Hv), 0.95)
    s0 = torch.randn(1, Hv, K, V, generator=gen) * 0.3
    return q, k, v, g, beta, s0


GRID = [(c, keys, gate) for c in (16, 32, 64) for keys in ("random", "repeated")
        for gate in ("zero", "strong", "random")]


@pytest.mark.parametrize("chunk_size, keys, gate", GRID, ids=[f"c{c}-{k}-{g}" for c, k, g in GRID])
def test_chunk_equals_token_loop(chunk_size, keys, gate):
    """The chunked path, at every chunk size the engine uses, equals the recurrence. Before
    the forward-substitution solve, repeated keys with g = 0 gave |S - S_ref| = 193 at
    chunk 32 and 2.9e10 at chunk 64 (|S| ~ 1)."""
    q, k, v, g, beta, s0 = _hard_inputs(keys, gate)
    ref_o, ref_s = naive.gated_delta_rule(q, k, v, g, beta, initial_state=s0, use_qk_l2norm_in_kernel=True)
    o, s = chunk.gated_delta_rule(q, k, v, g, beta, initial_state=s0, use_qk_l2norm_in_kernel=True,
                                  chunk_size=chunk_size)
    torch.testing.assert_close(s, ref_s, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(o, ref_o, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("chunk_size, keys, gate", GRID, ids=[f"c{c}-{k}-{g}" for c, k, g in GRID])
def test_chunk_states_equal_token_loop(chunk_size, keys, gate):
    """The all-chunks-at-once path (prompt prefill, training): the state before every chunk
    and the final state equal the token loop's states at those boundaries."""
    _, k, v, g, beta, s0 = _hard_inputs(keys, gate)
    before, final = chunk.chunk_states(k, v, g, beta, s0, chunk_size)
    S = s0
    for c in range(k.shape[1] // chunk_size):
        sl = slice(c * chunk_size, (c + 1) * chunk_size)
        torch.testing.assert_close(before[:, :, c], S, atol=2e-5, rtol=1e-4)
        _, S = naive.gated_delta_rule(k[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], initial_state=S,
                                      use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(final, S, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("keys", ["random", "repeated"])
def test_chunk_gradients_equal_token_loop(keys):
    """Training backpropagates through `chunk_states`: its gradients w.r.t. k, v, g, beta and
    the initial state equal autograd through the token loop (chunk 32, hard inputs)."""
    _, k, v, g, beta, s0 = _hard_inputs(keys, "random", T=64, Hv=2, K=8, V=6)
    g = g * 0.5
    beta = torch.sigmoid(torch.randn(beta.shape, generator=torch.Generator().manual_seed(1)) + 2.0)
    w_before = torch.randn(1, 2, 2, 8, 6, generator=torch.Generator().manual_seed(2))
    w_final = torch.randn(1, 2, 8, 6, generator=torch.Generator().manual_seed(3))

    def grads(fn):
        xs = [t.clone().requires_grad_(True) for t in (k, v, g, beta, s0)]
        before, final = fn(*xs)
        ((before * w_before).sum() + (final * w_final).sum()).backward()
        return [x.grad for x in xs]

    def by_loop(k, v, g, beta, s0):
        S, before = s0, []
        for c in range(2):
            sl = slice(32 * c, 32 * (c + 1))
            before.append(S)
            _, S = naive.gated_delta_rule(k[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], initial_state=S,
                                          use_qk_l2norm_in_kernel=True)
        return torch.stack(before, 2), S

    fast = grads(lambda *xs: chunk.chunk_states(*xs, 32))
    ref = grads(by_loop)
    for name, a, b in zip(("k", "v", "g", "beta", "s0"), fast, ref):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3, msg=lambda m, n=name: f"d/d{n}: {m}")


def test_chunk_size_must_be_positive():
    q, k, v, g, beta, _ = _inputs(4)
    with pytest.raises(ValueError, match="chunk_size"):
        chunk.gated_delta_rule(q, k, v, g, beta, chunk_size=0)
    with pytest.raises(ValueError, match="multiple of chunk_size"):
        chunk.chunk_states(k, v, g, beta, None, 3)


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed (pip install transformers)")
@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("T", [1, 2, 31, 33, 64], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("impl", ["naive", "chunk16", "chunk64"])
def test_matches_transformers_recurrent(impl, T, with_state):
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

    q, k, v, g, beta, s0 = _inputs(T)
    init = s0 if with_state else None
    ref_o, ref_s = qwen.torch_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    if impl == "naive":
        fn, kwargs = naive.gated_delta_rule, {}
    else:
        fn, kwargs = chunk.gated_delta_rule, {"chunk_size": int(impl[5:])}
    o, s = fn(q, k, v, g, beta, initial_state=init, output_final_state=True,
              use_qk_l2norm_in_kernel=True, **kwargs)
    torch.testing.assert_close(o, ref_o, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s, ref_s, atol=1e-4, rtol=1e-4)


def test_initial_state_not_modified():
    q, k, v, g, beta, s0 = _inputs(5)
    before = s0.clone()
    chunk.gated_delta_rule(q, k, v, g, beta, initial_state=s0, use_qk_l2norm_in_kernel=True)
    naive.gated_delta_rule(q, k, v, g, beta, initial_state=s0, use_qk_l2norm_in_kernel=True)
    chunk.chunk_states(k, v, g, beta, s0, 5)
    assert torch.equal(s0, before)
