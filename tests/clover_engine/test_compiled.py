"""torch.compile of the Clover decode (clover_engine.backbones.clover.compiled): the same tokens as eager, refused where it cannot run."""

from __future__ import annotations

import pytest
import torch

from clover_engine.backbones.base import Capabilities
from clover_engine.backbones.clover.compiled import compile_layers, compiler_available


def test_refuses_a_model_without_clover_layers():
    with pytest.raises(TypeError, match="Clover model"):
        compile_layers(torch.nn.Linear(2, 2))


def test_refuses_a_model_off_the_cpu():
    class OnMeta:  # what compile_layers reads of a Clover model, on another device
        layers, device = [object()], torch.device("meta")
        capabilities = Capabilities(family="clover")

        def setup_state(self):
            pass

        def run_layers(self, x, p, states):
            return x

    with pytest.raises(ValueError, match="CPU decode"):
        compile_layers(OnMeta())


@pytest.mark.skipif(not compiler_available(), reason="no C++ compiler for TorchInductor's CPU kernels")
def test_compiled_decode_writes_the_eager_tokens(monkeypatch):
    """The bundled model, its few-token forwards compiled as one graph of the layer stack:
    block_size 1 and block 8 decode the eager tokens with the same expert unions, and the graph really ran (Dynamo compiled
    it, and the step forwards went through it rather than the eager stack)."""
    import clover_engine
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig

    torch.set_num_threads(1)
    model = clover_engine.load_model("models/clover-tiny")
    tok = clover_engine.load_tokenizer("models/clover-tiny")
    prompt = tok.encode("def fibonacci(n):\n    ").ids
    configs = [DecodeConfig(block_size=b, threshold=0.9, max_new_tokens=12, memory_mode="state") for b in (1, 8)]

    def decode(dc):  # the tokens, and the expert union per layer of every step (a tensor in the graph)
        unions = []
        res = BlockDecoder(model, None, dc).generate(prompt, record_trace=False,
                                                     hooks=(lambda ev: unions.append(getattr(ev, "expert_union", None)),))
        unions = [u.tolist() for u in unions if u is not None]
        return res.tokens, unions

    eager = [decode(dc) for dc in configs]
    assert all(len(unions) >= 2 for _, unions in eager)  # steps with unions to compare
    compile_layers(model)
    first = model.run_layers
    assert compile_layers(model).run_layers is first  # a second call keeps the compiled stack
    calls = {"graph": 0, "eager": 0}
    graph, eager_stack = model.run_layers.graph, model.run_layers.eager_stack

    def counting(name, fn):
        def run(*args):
            calls[name] += 1
            return fn(*args)
        return run

    model.run_layers.graph, model.run_layers.eager_stack = counting("graph", graph), counting("eager", eager_stack)
    # the eager few-token path must not run: a forward the graph takes runs pairwise_experts inside
    # it, and one it leaves eager has more pairs (the grouped loop); were Dynamo to give up on the
    # graph (a recompile limit, a skipped frame), the wrapper would run the stack eagerly, here
    import clover_engine.backbones.clover.moe as moe

    monkeypatch.setattr(moe, "few_token_experts", counting("few_token_experts", moe.few_token_experts))
    calls["few_token_experts"] = 0
    torch._dynamo.utils.counters.clear()
    try:
        compiled = [decode(dc) for dc in configs]
    except torch._dynamo.exc.BackendCompilerFailed as exc:  # the toolchain, not the decode (e.g. no Python headers)
        pytest.skip(f"TorchInductor cannot build CPU kernels here: {str(exc).splitlines()[0][:200]}")
    assert compiled == eager
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    # block_size 1: 12 steps of 2 tokens through the graph (the prompt's prefill is eager); block 8:
    # its commit forwards (16 tokens, 32 pairs) are eager
    assert calls["graph"] >= 12 and calls["eager"] >= 2
    assert calls["few_token_experts"] == 0
