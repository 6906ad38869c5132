"""`clover_engine.experiments.memory`: the allocation tracker and chunked prefill behind notebook 06.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_experiments_memory.py -q``
"""

from __future__ import annotations

import pytest
import torch

from clover_engine.experiments.memory import PeakMemory, decode_step_s, long_context_model, prefill, prefill_peak_bytes


def test_peak_memory_counts_allocations_views_and_frees():
    with PeakMemory() as pm:
        a = torch.ones(1000)  # 4,000 bytes
        b = torch.ones(2000)  # 8,000
        del a
        c = torch.ones(500)  # 2,000
        v = b[:10]  # a view: no allocation
        del b  # the view keeps b's storage alive
        assert pm.current_bytes == 10_000
        del v
        assert pm.current_bytes == 2_000
        c.add_(1)  # in place: nothing new
        assert pm.current_bytes == 2_000
        d = c + 1  # noqa: F841 -- a new 2,000-byte tensor
        assert pm.current_bytes == 4_000
    assert pm.peak_bytes == 12_000


def test_peak_memory_ignores_tensors_from_before():
    w = torch.ones(10_000)
    with PeakMemory() as pm:
        w.mul_(2)
        _ = w.t()
        s = w.sum()  # 4 bytes
    assert pm.peak_bytes == s.untyped_storage().nbytes() == 4


@pytest.fixture(scope="module")
def model():
    return long_context_model("clover-test", context=4096)


def test_prefill_chunks_give_the_same_state_and_constant_bytes(model):
    ids = torch.randint(0, 256, (1, 1024), generator=torch.Generator().manual_seed(0))
    one = prefill(model, ids, chunk=1024)
    four = prefill(model, ids, chunk=256)
    assert one.positions.tolist() == [1024] and four.positions.tolist() == [256, 512, 768, 1024]
    assert (four.state_bytes == model.setup_state(1).nbytes()).all()
    for t in (four.wall_s, four.cpu_s):
        assert (t >= 0).all() and (t[1:] >= t[:-1]).all() and t[-1] > 0
    for a, b in zip(one.state.layers, four.state.layers):
        torch.testing.assert_close(a.S, b.S, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.conv, b.conv) if a.conv is not None else None
    with pytest.raises(ValueError, match="multiple"):
        prefill(model, ids[:, :100], chunk=64)
    with pytest.raises(ValueError, match="fresh"):
        prefill(model, ids, chunk=256, state=one.state)


def test_prefill_peak_grows_with_the_chunk_not_the_prompt(model):
    ids = torch.randint(0, 256, (1, 1024), generator=torch.Generator().manual_seed(1))
    whole_half = prefill_peak_bytes(model, ids[:, :512], chunk=512)
    whole = prefill_peak_bytes(model, ids, chunk=1024)
    chunked_half = prefill_peak_bytes(model, ids[:, :512], chunk=128)
    chunked = prefill_peak_bytes(model, ids, chunk=128)
    assert whole == pytest.approx(2 * whole_half, rel=0.1)
    assert chunked == pytest.approx(chunked_half, rel=0.05)
    assert chunked < whole_half / 2


def test_decode_step_s_reads_the_states_without_changing_them(model):
    ids = torch.randint(0, 256, (1, 512), generator=torch.Generator().manual_seed(2))
    short, long = prefill(model, ids[:, :64], chunk=64).state, prefill(model, ids, chunk=256).state
    before = [layer.S.clone() for layer in long.layers]
    got = decode_step_s(model, {"short": short, "long": long}, ids[:, :32], n=3)
    assert set(got) == {"short", "long"} and all(v > 0 for v in got.values())
    assert long.position == 512 and short.position == 64
    for b, layer in zip(before, long.layers):
        assert torch.equal(b, layer.S)
