"""Expert and tensor parallelism for the Clover model over ``torch.distributed``.

With ``ep = N`` ranks, rank r keeps routed experts ``[r * E/N, (r + 1) * E/N)`` of every MoE layer
and a full copy of everything else (embeddings, mixers, norms, routers, shared experts, LM head).
Every rank runs the same decode on the same input: the router is replicated, so each rank knows
every token's top-k; it runs only the (token, slot) pairs routed to its own experts and the
ranks' partial outputs are summed with one ``all_reduce`` per MoE layer (plus one for the expert
union). Outputs therefore equal the single-process model up to the order of the final sum
(float rounding, ~1e-7 relative), and the decode's control flow -- accepted slots, blocks,
stopping -- is the same on every rank, so rank 0 alone prints and saves the trace.

Launch (one process per GPU; on the CPU the backend is gloo):

    torchrun --nproc-per-node 2 -m clover_engine.generate --model models/clover-tiny --prompt "..." --parallel ep=2

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

Tensor parallel (`shard_heads`, ``--parallel tp=N`` or ``ep=N,tp=N`` over the same N ranks): the
mixers' heads and the shared experts' hidden units split over the ranks (DTensor plans where the
layout allows, by hand for GDN's fused q/k/v projection and conv and the per-head parameters of the
memory unit and the state gates); see `shard_heads` for what stays replicated. Under a head split
`rank_bytes_read` subtracts from each rank the share of the mixers, states and shared experts it
does not hold, priced per forward by `clover_engine.cost.parallel.project_parallel` (which also
projects whole splits onto GPUs).

Not done here: loading only a rank's experts or heads from disk (each rank loads the full
checkpoint, then drops the rest); saving a sharded model; a vocabulary-parallel LM head and
embedding; all-to-all expert dispatch (the routed outputs are all_reduced); training under a split
(only decoding is tested); tensor parallel on NCCL (written for it -- the mesh takes the group's
device type -- but run on gloo / CPU only so far).

Wing: ``decoding``.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from clover_engine.backbones.base import capabilities_of
from clover_engine.cost.formulas import param_counts
from clover_engine.cost.parallel import project_parallel
from clover_engine.backbones.clover.parallel_syntax import parse_parallel  # re-exported: clover_engine.generate reads --parallel here
from clover_kernels.moe import routed_experts

__all__ = ["DEFAULT_TIMEOUT_S", "ExpertShard", "init_distributed", "parse_parallel", "rank_bytes_read",
           "reset_shards", "shard_experts", "shard_heads"]

DEFAULT_TIMEOUT_S = 60.0
"""Seconds a collective may wait for the other ranks before failing (a dead rank ends the run)."""


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
                           "torchrun --nproc-per-node N -m clover_engine.generate ... --parallel ep=N")
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
        model: a `clover_engine.backbones.clover.model.CloverModel` with all its experts.
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
    E = model.config.num_experts if capabilities_of(model).family == "clover" else 0  # routed experts: Clover's
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not E or layers is None:
        raise ValueError("shard_experts needs a Clover model with routed experts (clover_engine.backbones.clover.model.CloverModel)")
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


def _head_split_saving(model: torch.nn.Module, result, tp: int) -> float:
    """Bytes one rank does not read in the decode of `result` because the heads are split over `tp`
    ranks: per forward, the single-process bytes less the per-GPU bytes of
    `clover_engine.cost.parallel.project_parallel` (tp only), priced from the trace's forwards as the
    decoder's cost meter prices them.

    Raises:
        ValueError: the trace's forwards do not add up to the decode's ``bytes_read`` (relative 1e-9).
    """
    trace, cfg = result.trace, model.config
    if trace is None:
        raise ValueError("rank_bytes_read under tensor parallel needs the decode's trace (record_trace=True)")
    dc = trace.decode_config
    mode = dc["memory_mode"]
    window = cfg.attention_window if mode == "state+window" else 0
    wb = model.dtype.itemsize
    single = saved = 0.0
    memo: dict = {}
    for n, toks, union in zip(trace.column("n_tokens_forward"), trace.column("tokens"), trace.column("expert_union")):
        L = len(toks)
        key = (int(n), L, tuple(np.asarray(union).tolist()))
        if key not in memo:
            pf = project_parallel(cfg, ep=1, tp=tp, n_tokens=key[0], expert_union=list(key[2]),
                                  n_commit_tokens=key[0] - L, weight_bytes=wb, block_len=L, memory_mode=mode,
                                  window=window, commit_block_len=dc["block_size"])
            memo[key] = (pf.single.bytes_read, pf.single.bytes_read - pf.bytes_per_gpu)
        single += memo[key][0]
        saved += memo[key][1]
    if abs(single - result.bytes_read) > 1e-9 * result.bytes_read:
        raise ValueError(f"the trace's forwards price to {single:.6g} bytes, the decode's meter to "
                         f"{result.bytes_read:.6g}: cannot split them per rank")
    return saved


def rank_bytes_read(model: torch.nn.Module, result, group=None) -> dict:
    """Bytes each rank read in the decode that produced `result` (module docstring), gathered on every rank.

    Expert split (`shard_experts`): the last ``nfe`` calls of each layer's shard are the decode's
    forwards (a chunked prompt prefill runs before them and is not priced by the decoder's cost
    meter either); without it every rank reads the whole union. Head split (`shard_heads`): each
    rank reads 1/tp of the mixer weights, states, window K/V and shared experts (less their gate
    rows), priced per forward by `clover_engine.cost.parallel.project_parallel`.

    Args:
        model: the split model (`shard_experts` and / or `shard_heads`), its shards' unions from this
            decode only (`reset_shards` before it); result: the `clover_engine.decoding.decoder.DecodeResult` (decoded
            with a trace or hooks, so ``bytes_read`` is filled; with a trace under a head split).
        group: the process group (None = default).

    Returns:
        dict: ``bytes_read`` (the single-process figure of the decoder's cost meter),
        ``routed_expert_bytes`` (over all ranks; None without an expert split),
        ``routed_expert_bytes_per_rank``, ``bytes_read_per_rank`` (lists, one per rank) and
        ``head_split_saving`` (bytes a rank does not read thanks to the head split; 0 without one).

    Raises:
        ValueError: `result` has no ``bytes_read`` (decoded without observers), the shards recorded
            fewer calls than forwards, or the model is not split.
    """

    if result.bytes_read is None:
        raise ValueError("rank_bytes_read needs a decode with record_trace=True (or a hook): bytes_read is None")
    shards = getattr(model, "expert_shards", None)
    tp = getattr(model, "tensor_parallel", (0, 1))[1]
    if not shards and tp == 1:
        raise ValueError("rank_bytes_read needs a split model (shard_experts and / or shard_heads)")
    world = dist.get_world_size(group)
    saving = _head_split_saving(model, result, tp) if tp > 1 else 0.0
    if not shards:
        per_rank = float(result.bytes_read - saving)
        return {"bytes_read": float(result.bytes_read), "routed_expert_bytes": None,
                "routed_expert_bytes_per_rank": None, "bytes_read_per_rank": [per_rank] * world,
                "head_split_saving": float(saving)}
    nfe = result.nfe
    if any(len(s.unions) < nfe for s in shards):
        raise ValueError(f"the expert shards recorded fewer calls than the decode's {nfe} forwards; "
                         "call reset_shards(model) before the decode")
    per_expert = param_counts(model.config)["expert"] * model.dtype.itemsize
    local = sum(sum(s.local_unions[-nfe:]) for s in shards) * per_expert
    total = sum(sum(s.unions[-nfe:]) for s in shards) * per_expert
    gathered = [None] * world
    dist.all_gather_object(gathered, local, group=group)
    replicated = result.bytes_read - total - saving
    return {"bytes_read": float(result.bytes_read), "routed_expert_bytes": float(total),
            "routed_expert_bytes_per_rank": [float(b) for b in gathered],
            "bytes_read_per_rank": [float(replicated + b) for b in gathered], "head_split_saving": float(saving)}


# ------------------------------------------------------------------------------- tensor parallel
def _mesh(group):
    """A 1-D DeviceMesh over `group` (None = the default group), on the device type of its backend."""
    from torch.distributed.device_mesh import DeviceMesh

    group = group or dist.group.WORLD
    device_type = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    return DeviceMesh.from_group(group, device_type)


def _rows(t: torch.Tensor, blocks: list[tuple[int, int]], rank: int, world: int) -> torch.Tensor:
    """This rank's rows of `t` when dim 0 is the concatenation of ``blocks`` = ``[(heads, rows per head), ...]``
    (e.g. GDN's ``in_proj_qkv`` = q heads ++ k heads ++ v heads): the rank's contiguous 1/world of the
    heads of every block, blocks kept in order. Returns a new tensor [sum(heads * rows) / world, ...]."""
    parts, start = [], 0
    for heads, per in blocks:
        n = heads // world * per
        parts.append(t[start + rank * n: start + (rank + 1) * n])
        start += heads * per
    if start != t.shape[0]:
        raise ValueError(f"a tensor with {t.shape[0]} rows does not split as {blocks}")
    return torch.cat(parts).clone()


def _set_param(module: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    old = getattr(module, name)
    setattr(module, name, torch.nn.Parameter(value.contiguous(), requires_grad=old.requires_grad))


def _check_divisible(what: str, counts: dict[str, int], world: int) -> None:
    bad = {k: v for k, v in counts.items() if v % world}
    if bad:
        raise ValueError(f"tensor parallel over {world} ranks needs the {what} counts divisible by {world}, "
                         f"got {bad}")


def shard_heads(model: torch.nn.Module, group=None) -> torch.nn.Module:
    """Tensor parallel: split every mixer's heads and every shared expert's hidden units over the ranks
    of `group` (in place). Every rank must call it, on the same full model.

    What is split, rank r of M holding the r-th contiguous 1/M of each:

    * attention layers (`clover_engine.backbones.clover.attention.GatedAttention`): query heads Hq and KV heads Hkv
      (GQA groups stay whole: local query head j reads local KV head j // (Hq / Hkv)). DTensor plans
      (``torch.distributed.tensor.parallel.parallelize_module``): ``q_proj`` (query + gate rows, per
      head), ``k_proj``, ``v_proj``, ``mem_a``, ``mem_b`` `ColwiseParallel`; ``o_proj``
      `RowwiseParallel` (its output summed over the ranks, one all_reduce). The memory unit and the
      delta-rule state need the heads local: ``mem_w``, ``mem_b_logit`` [Hq], ``mem_A_log``,
      ``mem_dt_bias`` [Hkv] and the optional q/k/v conv are sliced by hand; the state S
      [B, Hkv/M, D, D] and window ring [B, Hkv/M, W, D] are allocated per rank by ``init_state``.
    * GDN layers (`clover_engine.backbones.clover.gdn.GatedDeltaNet`): key heads Hk and value heads Hv. ``in_proj_qkv``
      and the depthwise ``conv1d`` hold q heads ++ k heads ++ v heads on one axis, which a contiguous
      DTensor shard would cut wrongly: sliced by hand (plain local weights). ``in_proj_z``,
      ``in_proj_b``, ``in_proj_a`` `ColwiseParallel`, ``out_proj`` `RowwiseParallel` (all_reduce).
      ``A_log``, ``dt_bias``, ``block_temperature``, ``mem_w``, ``mem_logit_bias`` [Hv] sliced by hand;
      the gated delta rule state S [B, Hv/M, K, V] and conv tail [B, k-1, channels/M] are local.
    * shared experts: ``gate_proj``, ``up_proj`` `ColwiseParallel`, ``down_proj`` `RowwiseParallel`
      (all_reduce); the scalar ``shared_expert_gate`` is replicated and applied after the sum.

    Replicated on every rank: the embedding, every RMSNorm (including GDN's gated output norm and the
    attention q/k norms: per head-dim weights shared by all heads), the routers, the routed experts
    (split them with `shard_experts`, over the same ranks) and the LM head. Every rank runs the same
    decode; each forward makes 2 all_reduces of [B, T, hidden] per layer (mixer, shared expert), so the
    outputs equal one process's up to the order of the final sums (float rounding).

    Observations are per rank: a forward's ``memory_share`` is the mean over this rank's heads and
    ``state_norm`` the norm of this rank's share of the state (rank 0's appear in its trace).

    Args:
        model: a `clover_engine.backbones.clover.model.CloverModel` with all its weights.
        group: the process group (None = the default group; torch.distributed must be initialised).

    Returns:
        `model`, with ``model.tensor_parallel = (rank, world)``.

    Raises:
        RuntimeError: torch.distributed is not initialised.
        ValueError: not a Clover model, or a head count (Hq, Hkv, Hk, Hv) or the shared expert's
            intermediate size not divisible by the world size.
    """
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if not dist.is_initialized():
        raise RuntimeError("shard_heads needs torch.distributed initialised (init_distributed, or torchrun)")
    cfg = getattr(model, "config", None)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if cfg is None or layers is None or not hasattr(cfg, "linear_num_value_heads"):
        raise ValueError("shard_heads needs a Clover model (clover_engine.backbones.clover.model.CloverModel)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    _check_divisible("head", {"num_attention_heads": cfg.num_attention_heads,
                              "num_key_value_heads": cfg.num_key_value_heads,
                              "linear_num_key_heads": cfg.linear_num_key_heads,
                              "linear_num_value_heads": cfg.linear_num_value_heads,
                              "shared_expert_intermediate_size": cfg.shared_expert_intermediate_size}, world)
    mesh = _mesh(group)
    col, row = ColwiseParallel(), RowwiseParallel()
    with torch.no_grad():
        for layer in layers:
            if layer.layer_type == "full_attention":
                a = layer.self_attn
                Hq, Hkv, D = a.Hq, a.Hkv, a.D
                if a.conv1d is not None:  # channels: q heads (query part only) ++ k heads ++ v heads
                    _set_param(a.conv1d, "weight", _rows(a.conv1d.weight, [(Hq, D), (Hkv, D), (Hkv, D)], rank, world))
                    a.conv_channels //= world
                    a.conv1d.in_channels = a.conv1d.out_channels = a.conv1d.groups = a.conv_channels
                for name, heads in (("mem_w", Hq), ("mem_b_logit", Hq), ("mem_A_log", Hkv), ("mem_dt_bias", Hkv)):
                    _set_param(a, name, _rows(getattr(a, name), [(heads, 1)], rank, world))
                parallelize_module(a, mesh, {"q_proj": col, "k_proj": col, "v_proj": col, "mem_a": col,
                                             "mem_b": col, "o_proj": row})
                a.Hq, a.Hkv = Hq // world, Hkv // world
            else:
                g = layer.linear_attn
                Hk, Hv, K, V = g.Hk, g.Hv, g.K, g.V
                qkv = [(Hk, K), (Hk, K), (Hv, V)]
                _set_param(g.in_proj_qkv, "weight", _rows(g.in_proj_qkv.weight, qkv, rank, world))
                _set_param(g.conv1d, "weight", _rows(g.conv1d.weight, qkv, rank, world))
                g.channels //= world
                g.in_proj_qkv.out_features = g.channels
                g.conv1d.in_channels = g.conv1d.out_channels = g.conv1d.groups = g.channels
                for name in ("A_log", "dt_bias", "block_temperature", "mem_w", "mem_logit_bias"):
                    _set_param(g, name, _rows(getattr(g, name), [(Hv, 1)], rank, world))
                parallelize_module(g, mesh, {"in_proj_z": col, "in_proj_b": col, "in_proj_a": col, "out_proj": row})
                g.Hk, g.Hv = Hk // world, Hv // world
            parallelize_module(layer.mlp.shared_expert, mesh,
                               {"gate_proj": col, "up_proj": col, "down_proj": row})
    model.tensor_parallel = (rank, world)
    return model
