"""The block-diffusion byte argument on a real router: how the expert union of a block grows with its size,
what a forward then reads, and the tokens per second that bounds.

Wing: ``cost``. A forward over a block of B slots reads the weights of the **union** of the experts its
slots chose (docs/architecture.md §7). Three prices for the routed experts of one B-slot forward, per
MoE layer:

* ``union``: the measured union (what the model's router chose);
* ``top-k x slots``: ``min(E, k * B)`` -- no two slots share an expert (the pessimist's assumption);
* ``all experts``: E -- what a dense implementation reads.

`block_union_growth` measures the union of a MoE diffusion backbone (`clover_engine.backbones.llada_moe`)
for block sizes 1 .. 64 over the tokens of one text (a trace's prompt and answer): the answer is cut into
blocks of B, each block is one forward with the text before it as history, and the union of its slots
is averaged over the blocks. `bytes_per_step` prices a B-slot forward under the three unions
(`clover_engine.cost.dense.dense_forward_cost`, weights only: attention, norms, embedding rows, the
head and the feed-forwards), and `tokens_per_s_bound` turns bytes into the roofline's tokens-per-second
bound on a device (`clover_engine.cost.devices`: H200, H800).

On a tiny random router the union is meaningless (every slot routes at random); the method is the
point, and ``benchmarks/moe_union_gpu.py`` runs it on LLaDA-MoE-7B-A1B by hub id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from clover_engine.cost.dense import dense_forward_cost
from clover_engine.cost.devices import get_device, roofline_time_s

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)
"""The block sizes of the union-growth curve (slots per forward)."""


@torch.inference_mode()
def block_union_growth(model: Any, token_ids: Sequence[int], start: int,
                       block_sizes: Sequence[int] = BLOCK_SIZES) -> dict[int, np.ndarray]:
    """Mean expert union of a block's slots per MoE layer, for each block size, over one text.

    Args:
        model: a MoE diffusion backbone that records its routing (`clover_engine.backbones.llada_moe.LLaDAMoEModel`:
            ``setup_state``, ``forward`` and ``last_routing``).
        token_ids: the text (prompt then answer) as token ids.
        start: where the answer starts (the prompt's length); the blocks cut ``token_ids[start:]``.
        block_sizes: the B to measure (each at most the answer's length).

    Returns:
        B -> [N MoE layers] float64, the union of the B slots averaged over the answer's whole blocks.

    Raises:
        ValueError: a model that records no routing, an answer shorter than a block size, or a block size < 1.
    """
    if not hasattr(model, "last_routing"):
        raise ValueError(f"{type(model).__name__} records no routing; use a MoE diffusion backbone "
                         "(clover_engine.backbones.llada_moe)")
    ids = [int(t) for t in token_ids]
    answer = len(ids) - int(start)
    out: dict[int, np.ndarray] = {}
    for B in block_sizes:
        if B < 1 or B > answer:
            raise ValueError(f"block size {B} must be in [1, {answer}] (the answer's length); decode a longer "
                             "answer or drop the larger block sizes")
        unions = []
        for lo in range(int(start), len(ids) - B + 1, B):
            state = model.setup_state(1, "state")
            history = torch.tensor([ids[:lo]], dtype=torch.long)
            model(torch.tensor([ids[lo:lo + B]], dtype=torch.long), state, commit_ids=history)
            unions.append(model.last_routing.union_block.numpy().astype(np.float64))
        out[B] = np.mean(unions, axis=0)
    return out


def bytes_per_step(config: Any, block_size: int, union: Sequence[float] | float,
                   weight_bytes: float = 2) -> dict[str, float]:
    """Weight bytes of one ``block_size``-slot forward under three unions (module docstring).

    Args:
        config: the model's config (`clover_engine.backbones.llada_moe.LLaDAMoEConfig` or its dict).
        block_size: B, slots in the forward.
        union: the measured union per MoE layer (or one number).
        weight_bytes: bytes per weight (2 = bf16).

    Returns:
        ``{"union": ..., "top-k x slots": ..., "all experts": ...}`` in bytes, plus the FLOPs under
        ``"flops"`` (the same for all three: each slot computes k experts).
    """
    g = (lambda k: config[k]) if isinstance(config, dict) else (lambda k: getattr(config, k))
    E, k = g("num_experts"), g("num_experts_per_tok")
    out = {}
    for name, u in (("union", union), ("top-k x slots", float(min(E, k * block_size))), ("all experts", float(E))):
        cost = dense_forward_cost(config, block_size, weight_bytes, 0, block_size, include_kv=False, expert_union=u)
        out[name] = cost.bytes_read
        out["flops"] = cost.flops
    return out


def tokens_per_s_bound(bytes_read: float, flops: float, tokens_per_forward: float, device: str) -> float:
    """Roofline bound on tokens per second: ``tokens_per_forward / max(bytes / BW, flops / peak)``.

    Raises:
        ValueError: an unknown device name (`clover_engine.cost.devices.get_device`).
    """
    return float(tokens_per_forward) / roofline_time_s(bytes_read, flops, get_device(device))


__all__ = ["BLOCK_SIZES", "block_union_growth", "bytes_per_step", "tokens_per_s_bound"]
