"""Expert parallelism for the Clover model over ``torch.distributed``.

With ``ep = N`` ranks, rank r keeps routed experts ``[r * E/N, (r + 1) * E/N)`` of every MoE layer
and a full copy of everything else (embeddings, mixers, norms, routers, shared experts, LM head).
Every rank runs the same decode on the same input: the router is replicated, so each rank knows
every token's top-k; it runs only the (token, slot) pairs routed to its own experts and the
ranks' partial outputs are summed with one ``all_reduce`` per MoE layer (plus one for the expert
union). Outputs therefore equal the single-process model up to the order of the final sum
(float rounding, ~1e-7 relative), and the decode's control flow -- accepted slots, blocks,
stopping -- is the same on every rank, so rank 0 alone prints and saves the trace.

Launch (one process per GPU; on the CPU the backend is gloo):

    torchrun --nproc-per-node 2 -m engine.generate --model models/clover-tiny --prompt "..." --parallel ep=2

Collectives run under a timeout (`DEFAULT_TIMEOUT_S`, ``--parallel-timeout``): when a rank dies,
the others fail their next collective with an error instead of waiting forever, and torchrun
exits naming the failed rank.

Bytes per rank (`rank_bytes_read`). Under the split, rank r reads every replicated weight, the
state and activations (what a single process reads, less the routed experts) plus the routed
experts of its own shard that the forward hits. Rank r's routed-expert bytes are
``sum over forwards and layers of union_r * 3 * F * D * wb``; the shards are disjoint, so these
sum over the ranks to the single-process routed-expert bytes exactly. The replicated bytes are
read once per rank: the ranks' totals sum to the single-process total plus ``(N - 1)`` times the
replicated bytes.

Not done here: tensor parallelism; loading only a rank's experts from disk (each rank loads the
full checkpoint, then drops the other experts); saving a sharded model.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 60.0
"""Seconds a collective may wait for the other ranks before failing (a dead rank ends the run)."""


def parse_parallel(text: str) -> dict[str, int]:
    """``"ep=2"`` -> ``{"ep": 2}``.

    Raises:
        ValueError: not ``ep=N`` with an int N >= 1 (tensor parallel ``tp=`` is not implemented).
    """
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, eq, val = part.partition("=")
        if key == "tp":
            raise ValueError("--parallel tp=N (tensor parallel) is not implemented; use ep=N (expert parallel)")
        try:
            n = int(val) if eq else 0
        except ValueError:
            n = 0
        if key != "ep" or n < 1 or key in out:
            raise ValueError(f"--parallel expects ep=N with N >= 1 (e.g. ep=2), got {text!r}")
        out[key] = n
    if not out:
        raise ValueError(f"--parallel expects ep=N with N >= 1 (e.g. ep=2), got {text!r}")
    return out


def init_distributed(timeout_s: float = DEFAULT_TIMEOUT_S, backend: str | None = None) -> tuple[int, int, str]:
    """Join the process group torchrun describes (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ... in the
    environment), with a collective timeout.

    Args:
        timeout_s: seconds a collective waits for the other ranks (> 0).
        backend: ``"gloo"`` or ``"nccl"``; None: nccl when CUDA is available, else gloo.

    Returns:
        ``(rank, world_size, device)``: device is ``cuda:LOCAL_RANK`` under nccl, else ``cpu``.

    Raises:
        RuntimeError: not launched by torchrun (no ``RANK`` / ``WORLD_SIZE``), naming the command.
        ValueError: timeout_s <= 0.
    """
    if not timeout_s > 0:
        raise ValueError(f"the collective timeout must be > 0 seconds, got {timeout_s!r}")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise RuntimeError("--parallel needs one process per rank: launch with "
                           "torchrun --nproc-per-node N -m engine.generate ... --parallel ep=N")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = "cpu"
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), device


@dataclass
class ExpertShard:
    """One rank's share of one MoE layer's routed experts (set as ``SparseMoE.expert_parallel``).

    Attributes:
        lo, hi: this rank holds experts ``[lo, hi)`` (its ``gate_up_proj`` / ``down_proj`` rows
            0 .. hi - lo); group: the process group (None = the default one).
        local_unions, unions: per call (one per forward), the distinct experts hit on this rank
            and over all ranks.
    """

    lo: int
    hi: int
    group: object = None

    def __post_init__(self):
        self.local_unions: list[int] = []
        self.unions: list[int] = []

    def routed(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up_proj: torch.Tensor,
               down_proj: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The routed-expert output of all ranks together.

        Args:
            x: [T, D] activations; weights: [T, k] fp32 router weights; ids: [T, k] int64 global
            expert ids; gate_up_proj: [hi - lo, 2F, D] and down_proj: [hi - lo, D, F], this rank's experts.

        Returns:
            ([T, D] in x's dtype, summed over the ranks; the expert union over all ranks, an int).
        """
        from kernels.moe import routed_experts

        T, k = ids.shape
        flat = ids.reshape(-1)
        pairs = ((flat >= self.lo) & (flat < self.hi)).nonzero().squeeze(1)  # this rank's (token, slot) pairs
        out = x.new_zeros(T, x.shape[-1])
        hit = 0
        if pairs.numel():
            tok = pairs // k
            y, hit = routed_experts(x[tok], weights.reshape(-1)[pairs, None], (flat[pairs] - self.lo)[:, None],
                                    gate_up_proj, down_proj)  # [P, D], one pair per row
            out.index_add_(0, tok, y)
        union = torch.tensor([hit], dtype=torch.int64, device=x.device)
        dist.all_reduce(out, group=self.group)
        dist.all_reduce(union, group=self.group)
        self.local_unions.append(hit)
        self.unions.append(int(union))
        return out, int(union)


def shard_experts(model: torch.nn.Module, group=None) -> torch.nn.Module:
    """Keep only this rank's routed experts in every MoE layer of a `CloverModel` (in place).

    Args:
        model: a `engine.model.CloverModel` with all its experts.
        group: the process group to split over (None = the default group; must be initialised).

    Returns:
        `model`, with ``model.expert_shards`` = the `ExpertShard` of each layer.

    Raises:
        RuntimeError: torch.distributed is not initialised.
        ValueError: the model has no MoE layers, or E is not divisible by the world size.
    """
    if not dist.is_initialized():
        raise RuntimeError("shard_experts needs torch.distributed initialised (init_distributed, or torchrun)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    E = getattr(getattr(model, "config", None), "num_experts", 0)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not E or layers is None:
        raise ValueError("shard_experts needs a Clover model with routed experts (engine.model.CloverModel)")
    if E % world:
        raise ValueError(f"expert parallel over {world} ranks needs the expert count ({E}) divisible by it")
    lo, hi = rank * E // world, (rank + 1) * E // world
    shards = []
    with torch.no_grad():
        for layer in layers:
            moe = layer.mlp
            for name in ("gate_up_proj", "down_proj"):
                full = getattr(moe.experts, name)
                setattr(moe.experts, name, torch.nn.Parameter(full[lo:hi].clone(), requires_grad=full.requires_grad))
            moe.expert_parallel = ExpertShard(lo, hi, group)
            shards.append(moe.expert_parallel)
    model.expert_shards = shards
    return model


def reset_shards(model: torch.nn.Module) -> None:
    """Forget the unions recorded by `model`'s expert shards (call before a decode)."""
    for s in getattr(model, "expert_shards", ()):
        s.local_unions.clear()
        s.unions.clear()


def rank_bytes_read(model: torch.nn.Module, result, group=None) -> dict:
    """Bytes each rank read in the decode that produced `result` (module docstring), gathered on every rank.

    The last ``nfe`` calls of each layer's shard are the decode's forwards (a chunked prompt
    prefill runs before them and is not priced by the decoder's cost meter either).

    Args:
        model: the sharded model (`shard_experts`), its shards' unions from this decode only
            (`reset_shards` before it); result: the `engine.decoder.DecodeResult` (decoded with a
            trace or hooks, so ``bytes_read`` is filled).
        group: the process group (None = default).

    Returns:
        dict: ``bytes_read`` (the single-process figure of the decoder's cost meter),
        ``routed_expert_bytes`` (over all ranks), ``routed_expert_bytes_per_rank`` and
        ``bytes_read_per_rank`` (lists, one per rank).

    Raises:
        ValueError: `result` has no ``bytes_read`` (decoded without observers), or the shards
            recorded fewer calls than forwards.
    """
    from engine.cost.formulas import param_counts

    if result.bytes_read is None:
        raise ValueError("rank_bytes_read needs a decode with record_trace=True (or a hook): bytes_read is None")
    shards = model.expert_shards
    nfe = result.nfe
    if any(len(s.unions) < nfe for s in shards):
        raise ValueError(f"the expert shards recorded fewer calls than the decode's {nfe} forwards; "
                         "call reset_shards(model) before the decode")
    per_expert = param_counts(model.config)["expert"] * model.dtype.itemsize
    local = sum(sum(s.local_unions[-nfe:]) for s in shards) * per_expert
    total = sum(sum(s.unions[-nfe:]) for s in shards) * per_expert
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, local, group=group)
    replicated = result.bytes_read - total
    return {"bytes_read": float(result.bytes_read), "routed_expert_bytes": float(total),
            "routed_expert_bytes_per_rank": [float(b) for b in gathered],
            "bytes_read_per_rank": [float(replicated + b) for b in gathered]}
