"""`torch.compile` for the Clover decode on the CPU: fewer, fused kernels per forward.

A tiny model's forward at block_size 1 is bound by dispatch: about a thousand small torch ops
of a few microseconds each (benchmarks/RESULTS.md). `compile_layers` hands the decoder layers
to TorchInductor, which fuses the element-wise chains between the matmuls into generated C++
loops: the whole stack as one graph for a forward of a few tokens (`CompiledLayers`; larger
forwards stay eager). The MoE runs inside the graph as `clover_engine.backbones.clover.moe.pairwise_experts`
(each routed expert id traced as a symbolic scalar, so one graph fits every routing; the eager
decode's host-side grouping, `few_token_experts`, would make the graph specialise on the ids).

Opt-in, for a process that decodes many times (a notebook, a sweep, a server;
``benchmarks/vs_transformers.py --compile``): the first decode compiles (10-60 s on a
small CPU; a new shape may compile again), which a single command-line decode would never win
back, and it needs a C++ compiler. Decoding is unchanged: the same tokens as eager (tested),
the same events.

Wing: ``backbones``.
"""

from __future__ import annotations

import shutil

import torch

from clover_engine.backbones.base import capabilities_of
from clover_engine.backbones.clover.moe import SMALL_PAIRS


def compiler_available() -> bool:
    """Whether TorchInductor can build CPU kernels here (a C++ compiler on PATH)."""
    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


def compile_layers(model, dynamic: bool | None = None):
    """Compile a Clover model's decoder stack in place for forwards of a few tokens; returns the model.

    A forward of at most ``clover_engine.backbones.clover.moe.SMALL_PAIRS`` (token, expert) pairs without
    autograd on the CPU (an autoregressive step: the committed token and the next masked
    slot; a first small block) runs the whole layer stack as one compiled graph, its MoE as
    `clover_engine.backbones.clover.moe.pairwise_experts`. Any other forward (a prompt's prefill, a block of
    32 with its commit) runs eagerly: its expert loop branches on the routing on the host,
    and compiling the layers around it cost minutes of compile for what it saved.

    Each new forward shape compiles once (B*T: at block_size 1 the two-token step; a small
    block and its commit are two more; ~10-60 s each on a small CPU, state+window included).
    Dynamo keeps at most ``torch._dynamo.config.recompile_limit`` (8) graphs of the stack per
    process, over all shapes and compiled models; past that it warns and runs the stack
    eagerly: the same tokens, the eager speed.

    Args:
        model: an `clover_engine.backbones.clover.model.CloverModel` (its ``layers`` and ``run_layers``).
        dynamic: `torch.compile`'s ``dynamic`` (None: specialise first, generalise a shape
            that changes).

    Raises:
        TypeError: a model without Clover decoder layers (the transformers backbones run
            transformers' own modules).
        ValueError: a model that is not on the CPU.
        RuntimeError: no C++ compiler for TorchInductor's CPU kernels.
    """
    try:
        family = capabilities_of(model).family
    except TypeError:  # not a backbone at all
        family = None
    if family != "clover":
        raise TypeError(f"compile_layers takes a Clover model (clover_engine.backbones.clover.model.CloverModel), got {type(model).__name__}")
    layers = model.layers
    device = torch.device(model.device)
    if device.type != "cpu":
        raise ValueError(f"compile_layers compiles the CPU decode; this model is on {device}. On CUDA, "
                         "replay the forward from CUDA graphs instead (clover_engine.backbones.clover.cuda_graphs, --cuda-graphs)")
    if not compiler_available():
        raise RuntimeError("torch.compile needs a C++ compiler for CPU kernels (g++ / clang++ on PATH); "
                           "install one (e.g. `apt-get install g++`) or decode without --compile")
    if not isinstance(model.run_layers, CompiledLayers):  # compiling twice keeps the first
        model.run_layers = CompiledLayers(model.run_layers, layers, dynamic)
    return model


class CompiledLayers:
    """``run_layers`` of a compiled model: ``(x [B, T, hidden], Pass, layer states) -> [B, T, hidden]``.

    The stack as one compiled graph where every layer's MoE can trace (B * T * top_k <=
    ``SMALL_PAIRS``, no autograd, CPU), the eager stack otherwise. The graph is traced with
    Dynamo capturing ``Tensor.item()`` (``capture_scalar_outputs``), which is how
    `clover_engine.backbones.clover.moe.pairwise_experts` reads a routed expert id without a graph break.
    One graph for the stack, not one per layer: a forward pays one Dynamo cache lookup
    (75-82 us each were measured with four per-layer graphs, whose lookups walk each other's
    entries) and one switch of that setting (``config.patch`` costs ~150 us, so it is set by
    hand). On clover-tiny at block_size 1 the stack decoded 1.23x faster than per-layer graphs
    that paid four lookups and four ``config.patch`` calls (benchmarks/RESULTS.md).
    """

    def __init__(self, eager_stack, layers, dynamic: bool | None = None):
        self.eager_stack, self.layers = eager_stack, layers
        self.max_rows = SMALL_PAIRS // layers[0].mlp.top_k  # B * T of a forward the graph takes
        self.graph = torch.compile(eager_stack, dynamic=dynamic)

    def __call__(self, x: torch.Tensor, p, states) -> torch.Tensor:
        if (x.shape[0] * x.shape[1] > self.max_rows or x.device.type != "cpu"
                or torch.is_grad_enabled() or p.kind == "reference" or p.graph_safe
                or any(layer.mlp.expert_parallel is not None for layer in self.layers)):
            # many pairs: a host-driven expert loop; the reference stays the eager definition;
            # expert parallel is host-driven collectives
            return self.eager_stack(x, p, states)
        config = torch._dynamo.config
        # set by hand: config.patch costs ~150 us a call. Dynamo's config overrides are per thread
        # in recent torch, so a decode in the explorer's worker thread does not leak it.
        before = config.capture_scalar_outputs
        config.capture_scalar_outputs = True
        try:
            return self.graph(x, p, states)
        finally:
            config.capture_scalar_outputs = before


__all__ = ["CompiledLayers", "compile_layers", "compiler_available"]
