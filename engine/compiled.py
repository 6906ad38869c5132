"""`torch.compile` for the Clover decode on the CPU: fewer, fused kernels per forward.

A tiny model's forward at block_size 1 is bound by dispatch: about a thousand small torch ops
of a few microseconds each (benchmarks/RESULTS.md). `compile_layers` hands each decoder layer's
forward to TorchInductor, which fuses the element-wise chains between the matmuls into
generated C++ loops. The MoE of a few tokens runs inside the graph as
`engine.clover.moe.pairwise_experts` (each routed expert id traced as a symbolic scalar, so one
graph fits every routing; the eager decode's host-side grouping, `few_token_experts`, would make
the graph specialise on the ids); the many-token loop of a prefill stays eager.

Opt-in, for a process that decodes many times (a notebook, a sweep, a server;
``benchmarks/vs_transformers.py --compile``): the first decode compiles (about a minute on a
small CPU; a new shape may compile again), which a single command-line decode would never win
back, and it needs a C++ compiler. Decoding is unchanged: the same tokens as eager (tested),
the same events.
"""

from __future__ import annotations

import functools
import shutil

import torch


def compiler_available() -> bool:
    """Whether TorchInductor can build CPU kernels here (a C++ compiler on PATH)."""
    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


def compile_layers(model, dynamic: bool | None = None):
    """Compile every decoder layer's ``forward`` of a Clover model in place; returns the model.

    Args:
        model: an `engine.model.CloverModel` (its ``layers``).
        dynamic: `torch.compile`'s ``dynamic`` (None: specialise first, generalise a shape
            that changes).

    Raises:
        TypeError: a model without Clover decoder layers (the transformers backbones run
            transformers' own modules).
        RuntimeError: no C++ compiler for TorchInductor's CPU kernels.
    """
    layers = getattr(model, "layers", None)
    if layers is None or not hasattr(model, "setup_state"):
        raise TypeError(f"compile_layers takes a Clover model (engine.model.CloverModel), got {type(model).__name__}")
    if not compiler_available():
        raise RuntimeError("torch.compile needs a C++ compiler for CPU kernels (g++ / clang++ on PATH); "
                           "install one (e.g. `apt-get install g++`) or decode without --compile")
    for layer in layers:
        layer.forward = _capturing_scalars(torch.compile(layer.forward, dynamic=dynamic))
    return model


def _capturing_scalars(fn):
    """Run `fn` with Dynamo tracing ``Tensor.item()`` into the graph, so the few-token MoE path
    (`engine.clover.moe.pairwise_experts`) reads each routed expert id without a graph break."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with torch._dynamo.config.patch(capture_scalar_outputs=True):
            return fn(*args, **kwargs)

    return run


__all__ = ["compile_layers", "compiler_available"]
