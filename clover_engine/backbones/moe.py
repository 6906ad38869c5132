"""The mixture-of-experts feed-forward of the MoE diffusion backbones, with its routing made visible.

Wing: ``backbones``. A MoE layer sends each of the T tokens of a forward to its own top-k of E
experts (Shazeer et al., "Outrageously Large Neural Networks", 2017; the softmax-then-top-k router of
OLMoE, Muennighoff et al. 2024, which LLaDA-MoE keeps). One forward therefore reads the weights of the
**union** of the experts its tokens chose -- the number the block-diffusion byte argument turns on
(docs/architecture.md §7): a 32-slot block may touch far more than the k experts of one
autoregressive token, or, when its tokens agree, barely more.

`MoEFeedForward` computes the layer and keeps what the router chose in `Routing` (per token: the k
experts in the router's order, and the router's probabilities over all E), so the backbone can report,
per forward and per layer, the union over the block's slots, over the history and over both, the
tokens each expert got, and the router's entropy (`routing_stats`).

Two ways to compute the experts, same result (to float rounding):

* ``routed`` (the default): only the experts some token chose run, each on the rows that chose it
  (a per-expert loop over the union) -- on a CPU this reads and computes about the active share
  (``benchmarks/moe_routed_experts.py`` measures it at LLaDA-MoE-7B-A1B's dimensions);
* ``all``: every expert runs on every token and the router's sparse weights combine them -- the
  reference, and what a dense implementation pays.

Shape letters: T tokens, H hidden size, I expert intermediate size, E experts, k experts per token.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

EXPERT_MODES = ("routed", "all")
"""How `MoEFeedForward` computes its experts (module docstring)."""


@dataclass(frozen=True)
class ExpertSplit:
    """This process's share of a MoE layer's routed experts under expert parallelism
    (`clover_engine.decoding.expert_parallel`): experts ``[lo, hi)`` of E, on rank ``rank`` of ``world``.

    Every rank routes every token (the router is replicated) and computes only the (token, slot) pairs of its
    own experts into a [T, k, H] tensor in the router's order, zeros elsewhere; one ``all_reduce`` (sum) per
    layer fills in the other ranks' pairs. Each pair is computed by one rank and the others add exact zeros, so
    the combined tensor is bit for bit what one process computes, and the layer combines it in one process's
    order: outputs, and so tokens, equal a single process's in any dtype.
    """

    lo: int
    hi: int
    rank: int
    world: int

    def owns(self, expert: int) -> bool:
        return self.lo <= expert < self.hi

    def combine(self, per_slot: torch.Tensor) -> torch.Tensor:
        """Sum ``per_slot`` [T, k, H] over the ranks in place (the default process group) and return it."""
        import torch.distributed as dist  # local: only a split layer communicates

        dist.all_reduce(per_slot)
        return per_slot


def owned_experts(num_experts: int, rank: int, world: int) -> ExpertSplit:
    """Rank ``rank``'s contiguous share of ``num_experts`` over ``world`` ranks (the split of
    `clover_engine.decoding.parallel`: ``[rank * E / world, (rank + 1) * E / world)``).

    Raises:
        ValueError: ``world`` not dividing ``num_experts`` (an uneven split would leave a rank idle or
            doubled), or a rank outside ``[0, world)``.
    """
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not one of {world} ranks")
    if num_experts % world:
        raise ValueError(f"{num_experts} routed experts do not split evenly over {world} processes; use a process "
                         f"count that divides {num_experts}")
    per = num_experts // world
    return ExpertSplit(rank * per, (rank + 1) * per, rank, world)


class RemoteExpert(nn.Module):
    """Stands in for a routed expert another rank holds (no weights): calling it is a bug in the split."""

    def __init__(self, index: int):
        super().__init__()
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(f"expert {self.index} is held by another rank; a split layer runs only its own experts")


_LOADING = threading.local()


class loading_expert_shard:
    """Within the block, `clover_engine.backbones.safetensors_shards.load_shards` loads only rank ``rank``'s share
    of every MoE layer's routed experts (`owned_experts`) and marks the layers split (`split_moe_layers`): the
    other experts' tensors are never read, their modules are `RemoteExpert` s. Thread-local."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def __enter__(self) -> "loading_expert_shard":
        self._before = getattr(_LOADING, "shard", None)
        _LOADING.shard = (self.rank, self.world)
        return self

    def __exit__(self, *exc: object) -> None:
        _LOADING.shard = self._before


def loading_shard() -> tuple[int, int] | None:
    """(rank, world) of the `loading_expert_shard` block this thread is in, or None."""
    return getattr(_LOADING, "shard", None)


def split_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, layer) of every MoE layer in ``module`` that expert parallelism can split: it has a
    ``num_experts``, an ``experts`` ModuleList of that length and a ``split`` attribute."""
    return [(n, m) for n, m in module.named_modules()
            if hasattr(m, "split") and isinstance(getattr(m, "experts", None), nn.ModuleList)
            and len(m.experts) == getattr(m, "num_experts", -1)]


def split_moe_layers(module: nn.Module, rank: int, world: int) -> dict[str, ExpertSplit]:
    """Split every MoE layer of ``module`` (`split_layers`) over ``world`` ranks: set its ``split`` to this rank's
    `ExpertSplit` and replace the experts it does not own by `RemoteExpert` s (their weights are dropped).

    Returns:
        layer name -> its split (what `clover_engine.backbones.safetensors_shards.load_shards` skips).

    Raises:
        ValueError: no splittable MoE layer, or an expert count ``world`` does not divide.
    """
    layers = split_layers(module)
    if not layers:
        raise ValueError(f"{type(module).__name__} has no MoE layer to split over experts (expert parallelism "
                         "runs LLaDA-MoE, LLaDA2.0 / 2.1, SDAR-MoE and Clover checkpoints)")
    out = {}
    for name, layer in layers:
        split = owned_experts(layer.num_experts, rank, world)
        for e in range(layer.num_experts):
            if not split.owns(e) and not isinstance(layer.experts[e], RemoteExpert):
                layer.experts[e] = RemoteExpert(e)
        layer.split = split
        out[name] = split
    return out


class PerThread:
    """An instance attribute each thread reads and writes on its own: what one forward recorded.

    A loaded model is shared by every session of a served explorer and by a session's background careful
    decode, so two decodes can run forwards of the same modules at once, each from its own thread. What a
    forward records for the decoder to read right after it (a MoE layer's `Routing`, a backbone's
    `RoutingStats`) must then be the caller's own forward's: a plain attribute would hold the other
    thread's tokens (a routing mask of 96 rows against 88 tokens was seen). Use as a class attribute::

        class Layer(nn.Module):
            last = PerThread()

    Reads give None in a thread that has not set it. Values are held per (thread, instance), weakly on the
    instance, so a model that is dropped frees what its forwards recorded; ``copy.deepcopy`` and pickling of
    the module are unaffected (nothing is stored in its ``__dict__``).
    """

    _local = threading.local()

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def _values(self) -> weakref.WeakKeyDictionary:
        values = getattr(self._local, "values", None)
        if values is None:
            values = self._local.values = weakref.WeakKeyDictionary()
        return values

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return self._values().get(obj, {}).get(self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        self._values().setdefault(obj, {})[self.name] = value


class GatedMLP(nn.Module):
    """SwiGLU feed-forward ``down(silu(gate(x)) * up(x))`` (Shazeer, "GLU Variants Improve Transformer",
    2020), the shape of every expert, shared expert and dense layer here.

    Args:
        hidden_size: H. intermediate_size: I (the weights are ``gate_proj`` / ``up_proj`` [I, H] and
            ``down_proj`` [H, I], without biases -- the hub names of LLaDA-MoE's experts).
    """

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., H] in the weights' dtype."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass(kw_only=True)
class MoEDims:
    """The MoE dimensions a MoE backbone's config adds (a mixin of `clover_engine.backbones.llada_moe.LLaDAMoEConfig`
    and `clover_engine.backbones.sdar_moe.SDARMoeConfig`), which the cost model prices by the measured union
    (`clover_engine.cost.dense.moe_mlp_cost`).

    Attributes:
        num_experts, num_experts_per_tok: E and k.
        moe_intermediate_size: I of each routed expert.
        shared_expert_intermediate_size: I of the shared expert (0: none).
        moe_layer_flags: per layer, 1 for a MoE feed-forward, 0 for a dense one (``intermediate_size``).
    """

    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    moe_layer_flags: list[int] = field(default_factory=list)


@dataclass
class Routing:
    """What one MoE layer's router chose in one forward.

    Attributes:
        selected: [T, k] int64 experts per token, in the router's order (highest score first).
        weights: [T, k] the weights the chosen experts' outputs are summed with (input dtype).
        probs: [T, E] fp32 router probabilities (softmax of the router logits), for the entropy.
    """

    selected: torch.Tensor
    weights: torch.Tensor
    probs: torch.Tensor


def softmax_top_k(router_logits: torch.Tensor, top_k: int, expert_bias: torch.Tensor | None = None,
                  norm_topk_prob: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LLaDA-MoE's router: softmax over the E logits (fp32), plus the expert bias when the checkpoint has
    one, then the top-k; the k (biased) values are the weights, renormalised to sum 1 only with
    ``norm_topk_prob`` (LLaDA-MoE: off; OLMoE's router, Muennighoff et al. 2024).

    Args:
        router_logits: [T, E] any float dtype.
        top_k: k, in [1, E].
        expert_bias: [E] or None.
        norm_topk_prob: renormalise the k weights.

    Returns:
        (weights [T, k] fp32, selected [T, k] int64, probs [T, E] fp32 -- unbiased).

    Raises:
        ValueError: ``top_k`` outside [1, E].
    """
    E = router_logits.shape[-1]
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k must be in [1, num_experts={E}], got {top_k}")
    probs = F.softmax(router_logits, dim=-1, dtype=torch.float32)
    scores = probs if expert_bias is None else probs + expert_bias.float()
    weights, selected = torch.topk(scores, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, selected, probs


class MoEFeedForward(nn.Module):
    """A routed MoE feed-forward: ``gate`` (the router, [E, H]), ``experts`` (E `GatedMLP`) and, when
    the checkpoint has one, ``expert_bias`` [E] (a buffer added to the router probabilities before the
    top-k). Weight names are LLaDA-MoE's hub names (``mlp.gate.weight``, ``mlp.experts.{e}.gate_proj.weight``, ...).

    Args:
        hidden_size: H. intermediate_size: I of each expert. num_experts: E. top_k: k.
        expert_bias: register the ``expert_bias`` buffer (zeros until loaded).
        norm_topk_prob: renormalise the k weights (`softmax_top_k`).

    Attributes:
        mode: one of `EXPERT_MODES` (module docstring); ``routed`` by default.
        record: keep the last forward's `Routing` in ``last`` (the backbone turns it on while it
            observes; off, nothing is kept).
        last: the last recorded `Routing`, or None.
        split: this rank's `ExpertSplit` under expert parallelism (then ``mode`` is not read: only the
            rank's experts run), or None.

    Raises:
        ValueError: ``top_k`` outside [1, E].
    """

    last = PerThread()  # each thread's own last forward (a served model decodes for several sessions)

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 expert_bias: bool = False, norm_topk_prob: bool = False):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, num_experts={num_experts}], got {top_k}")
        self.num_experts, self.top_k, self.norm_topk_prob = int(num_experts), int(top_k), bool(norm_topk_prob)
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = nn.ModuleList(GatedMLP(hidden_size, intermediate_size) for _ in range(num_experts))
        if expert_bias:
            self.register_buffer("expert_bias", torch.zeros(num_experts))
        else:
            self.expert_bias = None
        self.mode = "routed"
        self.record = False
        self.last: Routing | None = None
        self.split: ExpertSplit | None = None  # expert parallel: this rank's experts (split_moe_layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, H] -> [B, T, H] (input dtype); records the routing when ``record`` is on.

        Raises:
            ValueError: ``mode`` not one of `EXPERT_MODES`.
        """
        shape = x.shape
        h = x.reshape(-1, shape[-1])
        weights, selected, probs = softmax_top_k(self.gate(h), self.top_k, self.expert_bias, self.norm_topk_prob)
        weights = weights.to(h.dtype)
        if self.record:
            self.last = Routing(selected=selected, weights=weights, probs=probs)
        if self.split is not None:  # expert parallel: this rank's experts, then one all-reduce
            out = self._split(h, weights, selected)
        elif self.mode == "routed":
            out = self._routed(h, weights, selected)
        elif self.mode == "all":
            out = self._all(h, weights, selected)
        else:
            raise ValueError(f"MoEFeedForward.mode must be one of {EXPERT_MODES}, got {self.mode!r}")
        return out.reshape(shape)

    def _routed(self, h: torch.Tensor, weights: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
        """Only the chosen experts, each on its rows (a loop over the union)."""
        out = torch.zeros_like(h)
        for e in torch.unique(selected).tolist():
            rows, slot = torch.where(selected == e)
            y = self.experts[e](h[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, y)
        return out

    def _split(self, h: torch.Tensor, weights: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
        """`_routed` under expert parallelism (`ExpertSplit`): this rank fills its experts' weighted outputs into
        [T, k, H] (router order), the ranks sum it, and the rows are added in `_routed`'s order (bit for bit)."""
        split = self.split
        per_slot = h.new_zeros(*selected.shape, h.shape[-1])
        experts = torch.unique(selected).tolist()
        for e in experts:
            if split.owns(e):
                rows, slot = torch.where(selected == e)
                per_slot[rows, slot] = self.experts[e](h[rows]) * weights[rows, slot, None]
        split.combine(per_slot)
        out = torch.zeros_like(h)
        for e in experts:
            rows, slot = torch.where(selected == e)
            out.index_add_(0, rows, per_slot[rows, slot])
        return out

    def _all(self, h: torch.Tensor, weights: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
        """Every expert on every token, combined by the sparse [T, E] weight matrix."""
        dense = torch.zeros(h.shape[0], self.num_experts, dtype=h.dtype, device=h.device)
        dense.scatter_(1, selected, weights)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            out += expert(h) * dense[:, e, None]
        return out


@dataclass
class RoutingStats:
    """Routing of one forward, per MoE layer (N layers), over the forward's T tokens, of which the
    last ``block_len`` are the current block's slots.

    Attributes:
        union: [N] int64 distinct experts chosen by all T tokens (the experts whose weights the forward read).
        union_block: [N] int64 distinct experts chosen by the block's slots alone.
        union_history: [N] int64 distinct experts chosen by the other tokens (history, canvas tail).
        counts: [N, E] int64 tokens routed to each expert (all T tokens; each token counts in k experts).
        entropy: [N] fp32 router entropy in nats, averaged over the block's slots (ln E = uniform).
        experts_block: N int64 arrays, the experts the block's slots chose (sorted).
    """

    union: torch.Tensor
    union_block: torch.Tensor
    union_history: torch.Tensor
    counts: torch.Tensor
    entropy: torch.Tensor
    experts_block: list[torch.Tensor]


def routing_stats(routings: list[Routing], block_rows: slice) -> RoutingStats:
    """`RoutingStats` of the layers' `Routing` records of one forward.

    Args:
        routings: one per MoE layer, each over the same T tokens.
        block_rows: the rows of the block's slots among the T (``slice(lo, hi)``).

    Raises:
        ValueError: no routing recorded (the model did not observe this forward).
    """
    if not routings:
        raise ValueError("no routing was recorded for this forward; the backbone records it while observing")
    union, ub, uh, counts, ent, experts = [], [], [], [], [], []
    T = routings[0].selected.shape[0]
    hist = torch.ones(T, dtype=torch.bool)
    hist[block_rows] = False
    for r in routings:
        sel = r.selected.detach().cpu()
        union.append(torch.unique(sel).numel())
        blk = torch.unique(sel[block_rows])
        experts.append(blk)
        ub.append(blk.numel())
        uh.append(torch.unique(sel[hist]).numel())
        counts.append(torch.bincount(sel.reshape(-1), minlength=r.probs.shape[-1]))
        p = r.probs[block_rows].detach().float().cpu()
        ent.append(float(-(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean()) if p.numel() else 0.0)
    return RoutingStats(union=torch.tensor(union), union_block=torch.tensor(ub), union_history=torch.tensor(uh),
                        counts=torch.stack(counts), entropy=torch.tensor(ent, dtype=torch.float32),
                        experts_block=experts)


__all__ = ["EXPERT_MODES", "GatedMLP", "MoEDims", "MoEFeedForward", "Routing", "RoutingStats", "routing_stats", "softmax_top_k"]
