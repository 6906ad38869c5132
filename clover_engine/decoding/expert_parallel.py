"""Expert parallelism for the public MoE diffusion families (LLaDA-MoE, LLaDA2.0 / 2.1, SDAR-MoE) over
``torch.distributed``: one process per device, each holding its share of every MoE layer's routed experts.

With N ranks, rank r holds routed experts ``[r * E / N, (r + 1) * E / N)`` of every MoE layer and a full copy of
everything else (embeddings, attention, norms, routers, shared experts, dense layers, LM head). It loads them
leanly: `load_expert_parallel` reads only the rank's experts' tensors from the safetensors shards straight to
its device (`clover_engine.backbones.moe.loading_expert_shard`); the others are never read and their modules
are `clover_engine.backbones.moe.RemoteExpert` s. Every rank runs the same decode on the same input: the
router is replicated, so each rank knows every token's top-k; it computes only the (token, slot) pairs routed
to its own experts into a [T, k, H] tensor in the router's order, and one ``all_reduce`` per MoE layer fills in
the rest (`clover_engine.backbones.moe.ExpertSplit`). Each pair is computed by one rank and summed with exact
zeros, so every layer's output -- and every logit, token, router choice and expert union -- is bit for bit a
single process's, with the family's own sampler or with threshold decoding. Rank 0 alone prints and saves the
trace.

Per-rank truth: `rank_unions` gives, per MoE layer, the distinct experts each rank ran in the last forward (a
block's union spread over the N devices); `RankUnionRecorder` keeps them for every forward of a decode and
writes them, with each rank's routed-expert bytes, into the trace (``meta["expert_parallel"]``), where any
machine reads them back.

Launch (gloo on CPUs, NCCL on GPUs):

    torchrun --nproc-per-node 2 -m clover_engine.generate --model inclusionAI/LLaDA2.0-mini --sampler llada2 \\
        --parallel ep=2 --prompt "..."

Not done here: tensor parallelism for these families (the attention stays replicated); all-to-all dispatch
(the [T, k, H] all-reduce moves k times the hidden states of a combined sum, the price of a sum in the router's
order).

Wing: ``decoding``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_expert_parallel_families.py -q``
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from clover_engine.backbones.moe import ExpertSplit, loading_expert_shard, split_layers


def load_expert_parallel(path: str | Path, rank: int, world: int, device: str | torch.device = "cpu",
                         dtype: torch.dtype | str | None = None) -> torch.nn.Module:
    """Load a public MoE checkpoint with only rank ``rank``'s share of its routed experts (module docstring).

    Raises:
        ValueError: a checkpoint with no splittable MoE layer (a dense model, Clover's own: use
            `clover_engine.decoding.parallel`), an expert count ``world`` does not divide, or as
            `clover_engine.checkpoint.load_model`.
    """
    from clover_engine.checkpoint import load_model  # local: the checkpoint registry imports every family

    with loading_expert_shard(rank, world):
        model = load_model(path, device=device, dtype=dtype)
    layers = split_layers(model)
    if not layers or any(getattr(m, "split", None) is None for _, m in layers):
        raise ValueError(f"{path}: no MoE layer of this checkpoint was split over experts; expert parallelism here "
                         "runs LLaDA-MoE, LLaDA2.0 / 2.1 and SDAR-MoE checkpoints (Clover's own: "
                         "clover_engine.decoding.parallel)")
    return model


def rank_unions(model: torch.nn.Module) -> np.ndarray:
    """[N ranks, L MoE layers] int64: the distinct experts each rank ran in this thread's last forward (from the
    replicated router's choices, so every rank can tell every rank's).

    Raises:
        ValueError: a model whose MoE layers are not split, or that recorded no routing yet.
    """
    layers = [m for _, m in split_layers(model)]
    splits: list[ExpertSplit] = [m.split for m in layers]
    if not layers or any(s is None for s in splits):
        raise ValueError("rank_unions needs a model split over experts (load_expert_parallel)")
    world = splits[0].world
    out = np.zeros((world, len(layers)), dtype=np.int64)
    for j, m in enumerate(layers):
        if m.last is None:
            raise ValueError("no routing recorded yet: decode (the backbone records its routing) first")
        chosen = torch.unique(m.last.selected).tolist()
        per = m.num_experts // world
        for e in chosen:
            out[e // per, j] += 1
    return out


class RankUnionRecorder:
    """A decoder hook (``generate(hooks=[...])``) that keeps `rank_unions` after every forward of a decode.

    Attributes:
        unions: one [N ranks, L layers] array per forward, in order.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.unions: list[np.ndarray] = []

    def __call__(self, event: Any) -> None:
        from clover_engine.recording.events import StepEvent  # local: one class, only here

        if isinstance(event, StepEvent):
            self.unions.append(rank_unions(self.model))

    def summary(self, expert_bytes: float | None = None) -> dict[str, Any]:
        """``meta["expert_parallel"]`` of a trace: ranks, the per-forward per-rank per-layer unions, each rank's
        mean union per layer, its routed-expert bytes (union x ``expert_bytes``, one expert's weight bytes in
        one layer), and the load imbalance (the busiest rank's union over the mean: the slowest rank bounds the
        step)."""
        u = np.stack(self.unions) if self.unions else np.zeros((0, 1, 1), dtype=np.int64)
        per_rank = u.sum(axis=2)  # [forwards, ranks]
        mean = per_rank.mean(axis=1, keepdims=True)
        imbalance = np.where(mean > 0, per_rank.max(axis=1, keepdims=True) / np.maximum(mean, 1e-9), 1.0)[:, 0]
        out = {"world": int(u.shape[1]), "rank_unions": u.tolist(),
               "rank_union_mean": per_rank.mean(axis=0).tolist() if len(u) else [],
               "imbalance": imbalance.tolist()}
        if expert_bytes is not None:
            out["expert_bytes"] = float(expert_bytes)
            out["rank_expert_bytes"] = (per_rank.sum(axis=0) * float(expert_bytes)).tolist()
        return out


def expert_weight_bytes(model: torch.nn.Module) -> float:
    """Bytes of one routed expert of one layer on this rank (its first held expert's parameters)."""
    for _, m in split_layers(model):
        for expert in m.experts:
            params = list(expert.parameters())
            if params:
                return float(sum(p.numel() * p.element_size() for p in params))
    return 0.0


__all__ = ["RankUnionRecorder", "expert_weight_bytes", "load_expert_parallel", "rank_unions"]
