"""CUDA graphs for the denoising forward (clover_engine.backbones.clover.cuda_graphs).

On the CPU: the graph-safe forward (what a capture records) equals the forward, in both memory
modes and past the window's wrap, and it makes no host sync -- checked by a dispatch mode that
records every op which reads a device value on the host or whose output shape depends on the
data. On a GPU: a decode that replays graphs writes the same tokens as the eager one.

Run: .venv/bin/python -m pytest tests/clover_engine/test_cuda_graphs.py -q
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from clover_engine.backbones.clover.model import random_model

# ops that make the host wait for the device (a value read back, or an output shape that
# depends on the data) or copy a host tensor in: none may run inside a CUDA-graph capture
HOST_SYNC_OPS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
                 "aten.bincount.default", "aten.repeat_interleave.Tensor", "aten.lift_fresh.default",
                 "aten.item.default"}


class HostSyncs(TorchDispatchMode):
    """Records the ops of `HOST_SYNC_OPS` (and unique*) run inside the ``with`` block."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name in HOST_SYNC_OPS or name.startswith(("aten._unique", "aten.unique")):
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def _schedule():
    """(commit length C, block length L) per forward after a 2-block prompt prefill, block_size 8:
    the first block, steady block + commit, repeated steps of one block, a short last block."""
    return [(0, 8), (0, 8), (8, 8), (0, 8), (8, 8), (8, 8), (8, 8), (8, 5), (0, 5)]


@pytest.mark.parametrize("mode", ["state", "state+window"])
def test_graph_safe_forward_equals_the_forward(mode):
    torch.manual_seed(0)
    model = random_model("clover-test", seed=3, weight_scale=8.0)
    V = model.config.vocab_size
    assert model.config.attention_window < 8 * 6  # the schedule runs past the window's wrap
    ref, gs = model.setup_state(1, mode), model.setup_state(1, mode)
    prompt = torch.randint(8, V, (1, 24))
    with torch.no_grad():
        model._run(prompt[:, 16:], ref, prompt[:, :16], 8, False, False)
        model._run(prompt[:, 16:], gs, prompt[:, :16], 8, False, False)  # prefill: eager in both
        for C, L in _schedule():
            blk, com = torch.randint(8, V, (1, L)), (torch.randint(8, V, (1, C)) if C else None)
            pos = torch.arange(gs.position, gs.position + C + L)
            a = model._run(blk, ref, com, 8, True, False)
            b = model._run(blk, gs, com, 8, True, False, pos=pos, graph_safe=True)
            torch.testing.assert_close(b.logits, a.logits, rtol=1e-5, atol=1e-5)
            assert b.expert_union.tolist() == a.expert_union.tolist()
            torch.testing.assert_close(b.memory_share, a.memory_share, rtol=1e-5, atol=1e-6)
            assert gs.position == ref.position
    for la, lb in zip(ref.layers, gs.layers):
        for name in ("S", "conv", "win_k", "win_v"):
            if getattr(la, name) is not None:
                torch.testing.assert_close(getattr(lb, name), getattr(la, name), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["state", "state+window"])
def test_graph_safe_forward_makes_no_host_sync(mode):
    """The decode forward a capture records reads nothing back to the host; the eager forward
    does (the MoE's per-expert loop), which shows the detector sees syncs where there are some."""
    model = random_model("clover-test", seed=1, weight_scale=8.0)
    V = model.config.vocab_size
    st = model.setup_state(1, mode)
    ids = torch.randint(8, V, (1, 40))
    with torch.no_grad():
        model._run(ids[:, 32:], st, ids[:, :32], 8, False, False)
        blk, com = torch.randint(8, V, (1, 8)), torch.randint(8, V, (1, 8))
        pos = torch.arange(st.position, st.position + 16)
        with HostSyncs() as safe:
            model._run(blk, st, com, 8, True, False, pos=pos, graph_safe=True)
        with HostSyncs() as eager:
            model._run(blk, st, com, 8, True, False)
    assert safe.ops == []
    assert "aten.bincount.default" in eager.ops or "aten._local_scalar_dense.default" in eager.ops


def test_sync_free_experts_need_a_sync_free_impl():
    from clover_kernels.moe import routed_experts

    x, w = torch.randn(3, 64), torch.full((3, 2), 0.5)
    ids = torch.tensor([[0, 1], [1, 2], [0, 3]])
    gu, down = torch.randn(4, 64, 64), torch.randn(4, 64, 32)
    with pytest.raises(ValueError, match="sync-free"):
        routed_experts(x, w, ids, gu, down, impl="torch", union_as_tensor=True)
    out, hit = routed_experts(x, w, ids, gu, down, union_as_tensor=True)
    ref, ref_hit = routed_experts(x, w, ids, gu, down, impl="torch")
    assert isinstance(hit, torch.Tensor) and hit.dim() == 0 and int(hit) == ref_hit == 4
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)


def test_enable_refuses_a_model_off_cuda():
    from clover_engine.backbones.clover.cuda_graphs import enable_cuda_graphs

    model = random_model("clover-test")
    with pytest.raises(ValueError, match="CUDA device"):
        enable_cuda_graphs(model)
    assert model.cuda_graphs is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("mode", ["state", "state+window"])
def test_decode_with_cuda_graphs_writes_the_eager_tokens(mode):
    from clover_engine.backbones.clover.cuda_graphs import disable_cuda_graphs, enable_cuda_graphs
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
    from clover_engine.tokenizer import byte_tokenizer

    model = random_model("clover-test", seed=5, weight_scale=15.0, device="cuda")
    dec = BlockDecoder(model, byte_tokenizer(), DecodeConfig(block_size=8, threshold=0.9, max_new_tokens=48,
                                                              memory_mode=mode))
    eager = dec.generate("def f(x):\n    return", record_trace=True)
    runner = enable_cuda_graphs(model)
    try:
        graphed = dec.generate("def f(x):\n    return", record_trace=True)
        again = dec.generate("def f(x):\n    return", record_trace=False)  # a new state: captured anew
    finally:
        disable_cuda_graphs(model)
    assert graphed.tokens == eager.tokens == again.tokens
    assert runner.replays > 0 and runner.captures >= 2
    assert [s.expert_union.tolist() for s in graphed.trace.steps()] == \
        [s.expert_union.tolist() for s in eager.trace.steps()]
