"""Acceptance policies: which masked slots one iteration writes.

Each policy is a small class with one method
``select(confidence, masked, probs) -> accepted`` over the L slots of the
current block. The decoder applies the forced fill (most confident masked
slot) when a policy accepts nothing, so no policy can stall a block.

Sources: LowConfidence -- the Clover threshold rule with ``>=`` (Clover's
model card; Fast-dLLM v2 and SGLang use ``>``); TopK -- LLaDA's fixed quota
per step; Margin and Entropy -- Dream's ``topk_margin`` / ``entropy``
algorithms (as thresholds); Factor -- Fast-dLLM v1's factor rule.

Wing: ``decoding``.
"""

from __future__ import annotations

import functools
import math
from typing import Protocol

import torch


@functools.lru_cache(maxsize=256)  # a pure function of hashable arguments, asked once per decode step
def _bound(bound: float, dtype: torch.dtype, up: bool) -> float:
    """`bound` rounded to `dtype` toward +inf (`up`) or -inf, as a Python float.

    For x of that dtype: ``x >= b  <=>  x >= _bound(b, up=True)``, ``x < b <=> x < _bound(b, up=True)``,
    ``x <= b <=> x <= _bound(b, up=False)``, ``x > b <=> x > _bound(b, up=False)`` -- exact, while
    torch's ``x >= b`` rounds b to x's dtype first (fp32: 0.949999988 >= 0.95 is True).
    """
    b = float(bound)
    if dtype == torch.float64 or not math.isfinite(b):
        return b
    t = torch.tensor(b, dtype=dtype)
    r = float(t)
    if (up and r < b) or (not up and r > b):
        r = float(torch.nextafter(t, torch.tensor(math.inf if up else -math.inf, dtype=dtype)))
    return r


def _as_float(x: torch.Tensor) -> torch.Tensor:
    """fp16 / bf16 -> fp32 (exact); fp32 / fp64 unchanged."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def at_least(x: torch.Tensor, bound: float) -> torch.Tensor:
    """``x >= bound`` evaluated exactly: `bound` as given (a Python or NumPy number), not
    rounded to x's dtype. x: any float tensor (fp16/bf16 upcast to fp32); returns bool, x's shape."""
    x = _as_float(x)
    return x >= _bound(bound, x.dtype, up=True)


def at_most(x: torch.Tensor, bound: float) -> torch.Tensor:
    """``x <= bound`` evaluated exactly (see `at_least`)."""
    x = _as_float(x)
    return x <= _bound(bound, x.dtype, up=False)


def below(x: torch.Tensor, bound: float) -> torch.Tensor:
    """``x < bound`` evaluated exactly (see `at_least`)."""
    x = _as_float(x)
    return x < _bound(bound, x.dtype, up=True)


class Policy(Protocol):
    """What the decoder needs of a policy.

    ``select`` args: confidence [L] fp32 (probability of the argmax candidate),
    masked [L] bool (slots still MASK), probs [L, V] fp32 (post-processor
    distribution). Returns accepted [L] bool, a subset of `masked`.
    """

    name: str

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, probs: torch.Tensor) -> torch.Tensor: ...


class LowConfidence:
    """Write every masked slot with confidence >= `threshold` (equality accepted).

    The comparison is exact: the fp32 confidence against the threshold as given
    (0.949999988 does not pass 0.95), see `at_least`.
    """

    name = "low_confidence"

    def __init__(self, threshold: float):
        self.threshold = threshold

    def select(self, confidence, masked, probs):
        return masked & at_least(confidence, self.threshold)


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
        top2 = probs.topk(2, dim=-1).values.double()  # the difference of two fp32 values, in fp64
        return masked & at_least(top2[:, 0] - top2[:, 1], self.threshold)


class Entropy:
    """Write masked slots whose predictive entropy (nats) is <= `max_entropy`."""

    name = "entropy"

    def __init__(self, max_entropy: float):
        self.max_entropy = max_entropy

    def select(self, confidence, masked, probs):
        ent = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
        return masked & at_most(ent, self.max_entropy)


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
        c64 = c.double()  # (n + 1) * (1 - c) exactly for fp32 c, compared with the factor as given
        n = torch.arange(1, c.numel() + 1, device=c.device, dtype=torch.float64)
        ok = below(n * (1 - c64), self.factor)
        prefix = int(ok.long().cumprod(0).sum())
        accepted[idx[order[:prefix]]] = True
        return accepted


SLOT_POLICIES = ("low_confidence", "top_k", "margin", "entropy", "factor")
"""Policies that choose slots by the model's own confidences (`make_policy`)."""

POLICIES = SLOT_POLICIES + ("verify",)
"""Every value of ``DecodeConfig.policy``: the slot policies, and ``verify`` -- a drafter proposes, the
target keeps what it would write itself (`clover_engine.decoding.verify`; models that declare
``Capabilities.drafts``)."""


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
    if name == "verify":
        raise ValueError("'verify' is not a slot policy: the target verifies a drafted block "
                         "(clover_engine.decoding.verify, run by BlockDecoder on a model that drafts)")
    raise ValueError(f"unknown policy {name!r}; choose one of {POLICIES}")
