"""torch.compile of the Clover decode (engine.compiled): the same tokens as eager, refused where it cannot run."""

from __future__ import annotations

import pytest
import torch

from engine.compiled import compile_layers, compiler_available


def test_refuses_a_model_without_clover_layers():
    with pytest.raises(TypeError, match="Clover model"):
        compile_layers(torch.nn.Linear(2, 2))


@pytest.mark.skipif(not compiler_available(), reason="no C++ compiler for TorchInductor's CPU kernels")
def test_compiled_decode_writes_the_eager_tokens():
    """The bundled model, compiled layer by layer: block_size 1 and block 8 decode the eager tokens
    (compiling takes about a minute on a small CPU)."""
    import engine
    from engine.decoder import BlockDecoder, DecodeConfig

    torch.set_num_threads(1)
    model = engine.load_model("models/clover-tiny")
    tok = engine.load_tokenizer("models/clover-tiny")
    prompt = tok.encode("def fibonacci(n):\n    ").ids
    configs = [DecodeConfig(block_size=b, threshold=0.9, max_new_tokens=12, memory_mode="state") for b in (1, 8)]
    eager = [BlockDecoder(model, None, dc).generate(prompt, record_trace=False).tokens for dc in configs]
    compile_layers(model)
    try:
        compiled = [BlockDecoder(model, None, dc).generate(prompt, record_trace=False).tokens for dc in configs]
    except torch._dynamo.exc.BackendCompilerFailed as exc:  # the toolchain, not the decode (e.g. no Python headers)
        pytest.skip(f"TorchInductor cannot build CPU kernels here: {str(exc).splitlines()[0][:200]}")
    assert compiled == eager
