"""CUDA graphs for the denoising forward: capture once per shape, replay for every later forward.

A decode step of a large MoE model launches thousands of small kernels (norms, projections,
routing, the experts' grouped GEMMs, the gated delta rule, the block attention); on a GPU the
host's launch cost then rivals the kernels' own time. A CUDA graph records the launches of one
forward once and replays them with a single launch.

What makes the forward capturable (``Pass.graph_safe``, tested on the CPU by
`tests/clover_engine/test_cuda_graphs.py` with a dispatch mode that fails on any host sync):

* the MoE's routed experts take a sync-free path (``grouped_mm`` or Triton, counts by
  ``index_add_`` instead of ``bincount``) and return the expert union as a device tensor;
* positions are a device tensor computed inside the graph from a static ``start`` buffer, and
  the attention window's ring-buffer slots and valid mask are computed from them on the device;
* every state update is in place (``LayerState`` tensors keep their addresses), so a graph
  captured for one `CloverState` reads and writes that state at every replay.

Shapes: one graph per (commit length C, block length L, block_size, observe) of one state --
a decode at block_size 32 needs about three (the first block after the prompt, the steady
block + commit, a shorter last block). The prompt's prefill (several committed blocks from a
fresh state) and the reference forward run eagerly. The first forward of a shape runs eagerly
(it is also the warm-up the capture needs), the next ones replay.

Use::

    from clover_engine.backbones.clover.cuda_graphs import enable_cuda_graphs
    enable_cuda_graphs(model)          # model on CUDA; BlockDecoder then replays graphs
    # ... decode as usual; disable_cuda_graphs(model) goes back to eager

Only CUDA devices; `enable_cuda_graphs` raises ValueError elsewhere.

Wing: ``backbones``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from clover_engine.backbones.clover.state import CloverState, ModelOutput


@dataclass
class _Graph:
    graph: "torch.cuda.CUDAGraph"
    ids: torch.Tensor  # [B, C + L] int64 static input: commit ++ block
    start: torch.Tensor  # 0-d int64 static input: state.position
    out: ModelOutput  # static outputs, overwritten by each replay


class CUDAGraphForward:
    """Replays `CloverModel.forward` from CUDA graphs (see the module docstring).

    Called like ``model.forward`` (``block_ids`` [B, L] int64, ``state``, ``commit_ids`` [B, C]
    or None, ``block_size``, ``observe``) and returns the same `ModelOutput`: logits [B, L,
    vocab] fp32, expert_union [N] int64 (on the device), memory_share / state_norm with
    `observe`. Outputs are copies, safe to keep across forwards.

    Args:
        model: a `CloverModel` on a CUDA device.
        max_graphs: graphs kept for one state; a shape past it runs eagerly.

    Raises:
        ValueError: the model is not on a CUDA device.
    """

    def __init__(self, model, max_graphs: int = 8):
        if model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device (it is on {model.device}); load it "
                             "with load_model(..., device='cuda') (command line: --device cuda)")
        self.model = model
        self.max_graphs = max_graphs
        self._state: CloverState | None = None
        self._graphs: dict[tuple, _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self.replays = 0  # forwards served by a replay (for tests and benchmarks)
        self.captures = 0

    def reset(self) -> None:
        """Drop every captured graph (they reference the current state's tensors)."""
        self._graphs.clear()
        self._state = None

    def __call__(self, block_ids: torch.Tensor, state: CloverState, commit_ids: torch.Tensor | None = None,
                 block_size: int | None = None, observe: bool = False) -> ModelOutput:
        C = 0 if commit_ids is None else commit_ids.shape[1]
        bs = block_size or max(C, 1)
        prefill = state.position == 0 and C > bs
        if prefill or not block_ids.is_cuda or torch.is_grad_enabled() and self.model.training:
            return self.model._run(block_ids, state, commit_ids, block_size, observe, reference=False)
        if state is not self._state:  # a new decode: graphs of the old state would write into it
            self.reset()
            self._state = state
        key = (C, block_ids.shape[0], block_ids.shape[1], bs, observe)
        g = self._graphs.get(key)
        if g is None:
            out = self._eager(block_ids, state, commit_ids, bs, observe)  # the result, and the warm-up
            if len(self._graphs) < self.max_graphs:
                self._graphs[key] = self._capture(state, C, block_ids.shape, bs, observe)
            return out
        if C:
            g.ids[:, :C].copy_(commit_ids)
        g.ids[:, C:].copy_(block_ids)
        g.start.fill_(state.position)
        g.graph.replay()
        state.position += C
        self.replays += 1
        o = g.out
        return ModelOutput(logits=o.logits.clone(), expert_union=o.expert_union.clone(),
                           memory_share=None if o.memory_share is None else o.memory_share.clone(),
                           state_norm=None if o.state_norm is None else o.state_norm.clone())

    def _eager(self, block_ids, state, commit_ids, bs, observe) -> ModelOutput:
        """The graph-safe forward run eagerly: this shape's result, and the warm-up before its
        capture (every kernel and library handle of the forward initialised once). It runs on the
        current stream, so its outputs need no cross-stream care; the capture itself records on
        `torch.cuda.graph`'s own stream."""
        with torch.no_grad():
            return self.model._run(block_ids, state, commit_ids, bs, observe, reference=False, graph_safe=True)

    def _capture(self, state: CloverState, C: int, block_shape: torch.Size, bs: int, observe: bool) -> _Graph:
        """Record one forward of this shape reading `state` (no kernel runs during a capture, so
        the state is not advanced; `state.position`, a host int the forward bumps, is restored)."""
        B, L = block_shape
        dev = self.model.device
        ids = torch.zeros(B, C + L, dtype=torch.int64, device=dev)
        start = torch.full((), state.position, dtype=torch.int64, device=dev)
        offsets = torch.arange(C + L, device=dev)
        graph = torch.cuda.CUDAGraph()
        position = state.position
        try:
            with torch.no_grad(), torch.cuda.graph(graph, pool=self._pool):
                out = self.model._run(ids[:, C:], state, ids[:, :C] if C else None, bs, observe, reference=False,
                                      pos=start + offsets, graph_safe=True)
        finally:
            state.position = position
        self.captures += 1
        return _Graph(graph, ids, start, out)


def enable_cuda_graphs(model, max_graphs: int = 8) -> CUDAGraphForward:
    """Make ``model.forward`` replay CUDA graphs (`CUDAGraphForward`); returns the runner.

    Raises:
        ValueError: the model is not on a CUDA device.
    """
    runner = CUDAGraphForward(model, max_graphs)
    model.cuda_graphs = runner
    return runner


def disable_cuda_graphs(model) -> None:
    """Back to the eager forward (drops the captured graphs)."""
    runner = getattr(model, "cuda_graphs", None)
    if runner is not None:
        runner.reset()
    model.cuda_graphs = None


__all__ = ["CUDAGraphForward", "disable_cuda_graphs", "enable_cuda_graphs"]
