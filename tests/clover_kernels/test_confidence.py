"""Confidence step: the Triton kernel (under TRITON_INTERPRET=1 on the CPU) against the
plain-torch definition over awkward sizes, with NaN-poisoned outputs; the dispatcher.

Run: .venv/bin/python -m pytest tests/clover_kernels/test_confidence.py -q
"""

import importlib.util

import pytest
import torch

from clover_kernels import confidence
from clover_kernels.confidence import naive

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton)")

MASK_ID = 5


def _case(L, V, dtype, seed=0, tokenizer_vocab=None):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(L, V, generator=gen) * 4).to(dtype)
    # the excluded ids carry the largest logits: a kernel that forgets them picks them
    logits[:, MASK_ID] = 30.0
    if tokenizer_vocab is not None:
        logits[:, tokenizer_vocab:] = 40.0
    return logits, naive.never_mask(V, MASK_ID, tokenizer_vocab)


# slots x vocabulary (tiles of 256: one partial tile, 2 tiles, 5 tiles with a partial last one)
GRID = [(L, V, tv, dtype) for L, V, tv in ((1, 37, 30), (33, 300, None), (7, 1030, 1000))
        for dtype in (torch.float32, torch.float16)]


@needs_triton
@pytest.mark.parametrize("with_probs", [True, False], ids=["probs", "no_probs"])
@pytest.mark.parametrize("L, V, tok_vocab, dtype", GRID,
                         ids=[f"L{L}-V{V}-{str(d)[6:]}" for L, V, _, d in GRID])
def test_triton_equals_torch(L, V, tok_vocab, dtype, with_probs):
    from clover_kernels.confidence import triton_confidence

    logits, never = _case(L, V, dtype, seed=L * V, tokenizer_vocab=tok_vocab)
    nan = float("nan")
    out = (torch.full((L,), nan, dtype=dtype), torch.full((L,), -7, dtype=torch.int64),
           torch.full((L, V), nan, dtype=dtype) if with_probs else None)
    conf, cand, probs = triton_confidence.confidence_step(logits, never, with_probs, out=out, block_v=256)
    ref_conf, ref_cand, ref_probs = naive.confidence_step(logits.float(), never, True)
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-3, rtol=1e-3)
    assert conf is out[0] and conf.dtype == dtype
    torch.testing.assert_close(conf.float(), ref_conf, **tol)
    assert torch.equal(cand, ref_cand)
    assert not bool(never[cand].any())
    if with_probs:
        assert probs is out[2]
        torch.testing.assert_close(probs.float(), ref_probs, **tol)
        assert bool((probs[:, never] == 0).all())
    else:
        assert probs is None


@needs_triton
def test_triton_first_max_wins_and_later_tiles():
    """Ties go to the smallest id (torch's CPU argmax does too); a max in the last, partial tile is found."""
    from clover_kernels.confidence import triton_confidence

    V = 600
    logits = torch.zeros(3, V)
    logits[0, [3, 400]] = 2.0  # tie across tiles
    logits[1, 599] = 1.0  # last element of a partial tile
    logits[2, [17, 18]] = 3.0  # tie within a tile
    never = naive.never_mask(V, MASK_ID)
    conf, cand, _ = triton_confidence.confidence_step(logits, never, False, block_v=128)
    assert cand.tolist() == [3, 599, 17]
    torch.testing.assert_close(conf, naive.confidence_step(logits, never)[0])


def test_dispatcher_cpu_is_the_definition():
    """On CPU tensors the dispatcher returns exactly the plain-torch results (the decoder's tokens)."""
    logits, never = _case(9, 123, torch.float32, tokenizer_vocab=100)
    got = confidence.confidence_step(logits, never)
    ref = naive.confidence_step(logits, never)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    for impl in ("torch", "host"):
        for a, b in zip(confidence.confidence_step(logits, never, impl=impl), ref):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="impl"):
        confidence.confidence_step(logits, never, impl="cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.bfloat16],
                         ids=lambda d: str(d)[6:])
def test_host_equals_torch_bit_for_bit(dtype):
    """The CPU path (amax + numpy argmax) returns the definition's tensors exactly, ties and NaN
    included: the first of tied maxima, the first NaN; bfloat16 (no numpy dtype) falls back."""
    from clover_kernels.confidence import host

    logits, never = _case(33, 300, dtype, seed=3, tokenizer_vocab=290)
    logits[0, 10] = logits[0, 20] = 50.0  # a tie at the top: the first index wins
    logits[1, 7] = logits[1, 9] = logits[1, 40] = 0.0
    logits[1] = logits[1].masked_fill(torch.arange(300) != 7, -1e4)  # ties after the softmax too
    logits[2, 33] = logits[2, 44] = float("nan")  # a NaN row: max and argmax point at the first NaN
    got = host.confidence_step(logits, never)
    ref = naive.confidence_step(logits, never)
    assert got[1].tolist()[:2] == [10, 7] and got[1].dtype == torch.int64
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype and torch.equal(a.nan_to_num(-1.0), b.nan_to_num(-1.0))
    assert host.confidence_step(logits, never, with_probs=False)[2] is None
    none = torch.zeros_like(never)  # nothing excluded: the logits are not copied, results still equal
    for a, b in zip(host.confidence_step(logits, none), naive.confidence_step(logits, none)):
        assert torch.equal(a.nan_to_num(-1.0), b.nan_to_num(-1.0))


def test_never_mask():
    m = naive.never_mask(10, 2, tokenizer_vocab=8)
    assert m.tolist() == [False, False, True] + [False] * 5 + [True, True]
    with pytest.raises(ValueError, match="mask_id"):
        naive.never_mask(10, 10)


@pytest.mark.parametrize("L, V, k", [(1, 4096, 5), (33, 4096, 1), (7, 640, 5), (32, 49152, 8), (5, 1000, 3)])
def test_host_top_candidates_equal_topk(L, V, k):
    """The chunked top-K equals ``torch.topk``: the same values, and the same ids wherever the
    values are distinct (several maxima in one chunk and near-ties across chunks included);
    vocabularies that are not a multiple of the chunk take the definition."""
    from clover_kernels.confidence import host

    gen = torch.Generator().manual_seed(L * V + k)
    logits = torch.randn(L, V, generator=gen) * 3
    logits[0, :8] = 20.0 + torch.arange(8.0) * 1e-3  # one chunk holds the whole top-K of row 0
    probs = torch.softmax(logits, -1)
    values, ids = host.top_candidates(probs, k)
    ref_values, ref_ids = naive.top_candidates(probs, k)
    assert ids.dtype == torch.int64 and values.shape == ref_values.shape == (L, k)
    assert torch.equal(values, ref_values)
    assert torch.equal(probs.gather(1, ids), values)  # each id carries its value
    distinct = torch.cat([values[:, :-1] != values[:, 1:], torch.ones(L, 1, dtype=torch.bool)], 1)
    distinct[:, 1:] &= values[:, 1:] != values[:, :-1]
    assert torch.equal(ids[distinct], ref_ids[distinct])
    assert ids[0].tolist()[:min(k, 8)] == list(range(7, 7 - min(k, 8), -1))


def test_host_top_candidates_ties():
    """Tied values: the same multiset of values, every id one of the tied ones."""
    from clover_kernels.confidence import host

    probs = torch.zeros(2, 1024)
    probs[:, [3, 200, 640, 1000]] = 0.25
    values, ids = host.top_candidates(probs, 3)
    assert torch.equal(values, torch.full((2, 3), 0.25))
    assert set(ids.flatten().tolist()) <= {3, 200, 640, 1000} and len(set(ids[0].tolist())) == 3
