"""Acceptance policies: which masked slots one iteration writes.

Each policy is a small class with one method
``select(confidence, masked, probs) -> accepted`` over the L slots of the
current block. The decoder applies the forced fill (most confident masked
slot) when a policy accepts nothing, so no policy can stall a block.

Sources: LowConfidence -- the Clover/SGLang threshold rule with ``>=`` (the
seed's rule; Fast-dLLM v2 and SGLang use ``>``); TopK -- LLaDA's fixed quota
per step; Margin and Entropy -- Dream's ``topk_margin`` / ``entropy``
algorithms (as thresholds); Factor -- Fast-dLLM v1's factor rule.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Policy(Protocol):
    """What the decoder needs of a policy.

    ``select`` args: confidence [L] fp32 (probability of the argmax candidate),
    masked [L] bool (slots still MASK), probs [L, V] fp32 (post-processor
    distribution). Returns accepted [L] bool, a subset of `masked`.
    """

    name: str

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, probs: torch.Tensor) -> torch.Tensor: ...


class LowConfidence:
    """Write every masked slot with confidence >= `threshold` (equality accepted)."""

    name = "low_confidence"

    def __init__(self, threshold: float):
        self.threshold = threshold

    def select(self, confidence, masked, probs):
        return masked & (confidence >= self.threshold)


class TopK:
    """Write the `k` most confident masked slots every step (LLaDA-style fixed quota)."""

    name = "top_k"

    def __init__(self, k: int):
        self.k = k

    def select(self, confidence, masked, probs):
        score = torch.where(masked, confidence, torch.full_like(confidence, -1.0))
        n = min(self.k, int(masked.sum()))
        accepted = torch.zeros_like(masked)
        accepted[score.topk(n).indices] = True
        return accepted & masked


class Margin:
    """Write masked slots whose top1 - top2 probability margin is >= `threshold`."""

    name = "margin"

    def __init__(self, threshold: float):
        self.threshold = threshold

    def select(self, confidence, masked, probs):
        top2 = probs.topk(2, dim=-1).values
        return masked & ((top2[:, 0] - top2[:, 1]) >= self.threshold)


class Entropy:
    """Write masked slots whose predictive entropy (nats) is <= `max_entropy`."""

    name = "entropy"

    def __init__(self, max_entropy: float):
        self.max_entropy = max_entropy

    def select(self, confidence, masked, probs):
        ent = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
        return masked & (ent <= self.max_entropy)


class Factor:
    """Fast-dLLM v1 factor rule: sort masked confidences descending and write the
    longest prefix whose n-th entry (0-based) satisfies ``(n + 1) * (1 - c_n) < factor``."""

    name = "factor"

    def __init__(self, factor: float):
        self.factor = factor

    def select(self, confidence, masked, probs):
        idx = masked.nonzero(as_tuple=True)[0]
        accepted = torch.zeros_like(masked)
        if idx.numel() == 0:
            return accepted
        c, order = confidence[idx].sort(descending=True)
        n = torch.arange(1, c.numel() + 1, device=c.device, dtype=c.dtype)
        ok = (n * (1 - c)) < self.factor
        prefix = int(ok.long().cumprod(0).sum())
        accepted[idx[order[:prefix]]] = True
        return accepted


POLICIES = ("low_confidence", "top_k", "margin", "entropy", "factor")


def make_policy(name: str, *, threshold: float, tokens_per_step: int, max_entropy: float,
                factor: float) -> Policy:
    """Build a policy by name. Raises ValueError for an unknown name."""
    if name == "low_confidence":
        return LowConfidence(threshold)
    if name == "top_k":
        return TopK(tokens_per_step)
    if name == "margin":
        return Margin(threshold)
    if name == "entropy":
        return Entropy(max_entropy)
    if name == "factor":
        return Factor(factor)
    raise ValueError(f"unknown policy {name!r}; choose one of {POLICIES}")
