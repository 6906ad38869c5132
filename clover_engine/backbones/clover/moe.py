"""Sparse mixture of experts, Qwen3.5-MoE layout (docs/architecture.md §3). Wing: ``backbones``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.backbones.moe import PerThread
from clover_kernels.moe import routed_experts


class Experts(nn.Module):
    """The E routed SwiGLU experts as two stacked tensors (transformers' ``Qwen3_5MoeExperts`` layout):
    ``gate_up_proj`` [E, 2F, D] (gate rows then up rows) and ``down_proj`` [E, D, F]."""

    def __init__(self, cfg: CloverConfig):
        super().__init__()
        D, F_, E = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
        self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * F_, D) * 0.02)
        self.down_proj = nn.Parameter(torch.randn(E, D, F_) * 0.02)


class SharedExpert(nn.Module):
    """The shared SwiGLU expert: ``down_proj(silu(gate_proj(x)) * up_proj(x))`` (``Qwen3_5MoeMLP``)."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


SMALL_PAIRS = 16
"""At most this many (token, expert) pairs in a CPU inference forward take the few-token path:
`few_token_experts` eagerly, `pairwise_experts` in a compiled graph (`clover_engine.backbones.clover.compiled`, which
compiles only forwards this small)."""


@torch.compiler.disable  # host-side grouping on the routing's values: torch.compile would specialise on them
def few_token_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up_proj: torch.Tensor,
                      down_proj: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The routed experts of a few tokens (autoregressive decoding: 1 or 2 tokens a forward), grouped
    by expert on the host: the same [n, D] products per hit expert, in the same order, as the
    grouped loop of `clover_kernels.moe.naive.routed_experts` (equal bit for bit), without its argsort,
    bincount and scatter, whose fixed cost dominates at a handful of pairs.

    Args:
        x: [T, D]; weights: [T, k] fp32 routing weights; ids: [T, k] int64 expert ids (distinct per token);
        gate_up_proj: [E, 2F, D]; down_proj: [E, D, F].

    Returns:
        ([T, D] in x's dtype, the expert union: distinct experts over the T*k pairs).
    """
    T, k = ids.shape
    flat = [e for row in ids.tolist() for e in row]  # pair p = t * k + j
    order = sorted(range(T * k), key=flat.__getitem__)  # stable, as argsort(stable=True)
    ys, i = [], 0
    while i < len(order):
        e, j = flat[order[i]], i
        while j < len(order) and flat[order[j]] == e:
            j += 1
        rows = [p // k for p in order[i:j]]
        xs = x[rows[0]:rows[0] + 1] if len(rows) == 1 else x[torch.tensor(rows, device=x.device)]  # [n, D]
        gate, up = (xs @ gate_up_proj[e].t()).chunk(2, -1)  # [n, F] each
        ys.append((F.silu(gate) * up) @ down_proj[e].t())  # [n, D]
        i = j
    y = torch.cat(ys)  # [T*k, D], pairs in expert order
    if order != sorted(order):
        inverse = [0] * len(order)
        for pos, pair in enumerate(order):
            inverse[pair] = pos
        y = y[torch.tensor(inverse, device=x.device)]  # back to (token, slot) order
    out = (y * weights.reshape(-1, 1).to(x.dtype)).view(T, k, -1).sum(1)
    return out, len(ys)


def pairwise_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up_proj: torch.Tensor,
                     down_proj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The routed experts of a few tokens, one (token, expert) pair at a time: the form of
    `few_token_experts` that torch.compile traces without specialising on the routed ids.

    Each pair's expert id is read as a scalar (``.item()``; traced as an unbacked symbolic int
    under ``torch._dynamo.config.capture_scalar_outputs``, see `clover_engine.backbones.clover.compiled`) and selects
    that expert's weights as a view, so the compiled graph holds T*k fixed matmul pairs and
    fits every routing. A pair that shares its expert with another runs on its own row where
    `few_token_experts` stacks the rows, so the two agree to float rounding (a one-row and an
    n-row product may round differently; tested), and the compiled decode writes the eager
    tokens (tested). The expert union stays a tensor, so the graph does not break for it.

    Args:
        x: [T, D]; weights: [T, k] fp32 routing weights; ids: [T, k] int64 expert ids in [0, E);
        gate_up_proj: [E, 2F, D]; down_proj: [E, D, F].

    Returns:
        ([T, D] in x's dtype, the expert union as a 0-d int64 tensor).
    """
    T, k = ids.shape
    E = gate_up_proj.shape[0]
    flat = ids.reshape(-1)  # pair p = t * k + j
    ys = []
    for pair in range(T * k):
        e = flat[pair].item()
        torch._check(e >= 0)
        torch._check(e < E)
        t = pair // k
        gate, up = (x[t:t + 1] @ gate_up_proj[e].t()).chunk(2, -1)  # [1, F] each
        ys.append((F.silu(gate) * up) @ down_proj[e].t())  # [1, D]
    out = (torch.cat(ys) * weights.reshape(-1, 1).to(x.dtype)).view(T, k, -1).sum(1)
    union = torch.zeros(E, dtype=torch.int64, device=x.device).index_fill_(0, flat, 1).sum()
    return out, union


class SparseMoE(nn.Module):
    """Softmax router over E experts (fp32), top-k, renormalised; SwiGLU experts;
    a shared SwiGLU expert scaled by ``sigmoid(Linear(x))`` (Qwen3.5-MoE).

    Parameter names are transformers' ``Qwen3_5MoeSparseMoeBlock`` ones, so a Qwen3.5-MoE
    state dict maps by key: ``gate.weight`` [E, D] (router), ``experts.gate_up_proj`` [E, 2F, D],
    ``experts.down_proj`` [E, D, F], ``shared_expert.{gate,up,down}_proj.weight``,
    ``shared_expert_gate.weight`` [1, D].

    Returns the output and the expert union (distinct routed experts over all
    tokens of the forward) as a Python int -- the host sync is needed anyway to
    loop over the hit experts -- or as a 0-d int64 tensor where the forward must
    not sync or break a graph (`graph_safe`; a compiled few-token forward).
    """

    last_topk = PerThread()  # each thread's own last forward (a served model decodes for several sessions)

    def __init__(self, cfg: CloverConfig):
        super().__init__()
        D, E = cfg.hidden_size, cfg.num_experts
        self.top_k, self.norm_topk = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = nn.Linear(D, E, bias=False)  # router
        self.experts = Experts(cfg)
        self.shared_expert = SharedExpert(D, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(D, 1, bias=False)
        self.last_topk: torch.Tensor | None = None  # [T, k] ids of the last forward (for hooks/tests)
        self.aux_loss: torch.Tensor | None = None  # load-balancing loss of the last training forward
        # Expert parallel (clover_engine.decoding.parallel.shard_experts): this rank holds experts [lo, hi) only and the
        # shard sums the ranks' partial outputs; None = every expert here.
        self.expert_parallel = None

    def forward(self, x: torch.Tensor, graph_safe: bool = False) -> tuple[torch.Tensor, int | torch.Tensor]:
        """x: [..., D] -> ([..., D], expert union). With `graph_safe` (CUDA-graph capture,
        `clover_engine.backbones.clover.cuda_graphs`) the routed experts take a sync-free path and the union is a 0-d
        int64 tensor; likewise inside a compiled graph that traces ``Tensor.item()``
        (`clover_engine.backbones.clover.compiled`: `pairwise_experts`); otherwise a Python int."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [T, D]
        probs = torch.softmax(self.gate(x).float(), dim=-1)  # [T, E]
        w, idx = probs.topk(self.top_k, dim=-1)  # [T, k]
        if self.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        self.last_topk = idx.detach()
        if self.training:  # Switch-Transformer load balancing: E * sum_e f_e * P_e (1.0 when uniform)
            E = probs.shape[-1]
            f = torch.zeros(E, device=x.device).index_add_(0, idx.reshape(-1), torch.ones(idx.numel(), device=x.device))
            self.aux_loss = E * (f / idx.numel() * probs.mean(0)).sum()
        if graph_safe:
            if self.expert_parallel is not None:
                raise ValueError("CUDA graphs do not cover expert parallel (its collectives are host-driven)")
            out, hit = routed_experts(x, w, idx, self.experts.gate_up_proj, self.experts.down_proj,
                                      union_as_tensor=True)
        elif self.expert_parallel is not None:  # this rank's experts; partial outputs summed across ranks
            out, hit = self.expert_parallel.routed(x, w, idx, self.experts.gate_up_proj, self.experts.down_proj)
        elif idx.numel() <= SMALL_PAIRS and x.device.type == "cpu" and not torch.is_grad_enabled():
            # traced by clover_engine.backbones.clover.compiled, which captures .item(); any other compile runs few_token_experts eagerly
            traced = torch.compiler.is_compiling() and torch._dynamo.config.capture_scalar_outputs
            few = pairwise_experts if traced else few_token_experts
            out, hit = few(x, w, idx, self.experts.gate_up_proj, self.experts.down_proj)
        else:
            out, hit = routed_experts(x, w, idx, self.experts.gate_up_proj, self.experts.down_proj)  # [T, D]
        shared = self.shared_expert(x) * torch.sigmoid(self.shared_expert_gate(x))
        return (out + shared).reshape(shape), hit
