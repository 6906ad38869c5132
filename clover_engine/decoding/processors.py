"""Logits processors from the Clover model card: repetition control and
progressive EOS bias. Both are off by default and record every firing.

They act on the logits of the current block's masked slots, given the whole
sequence so far (prompt + committed blocks + the block's written slots).

Wing: ``decoding``.
"""

from __future__ import annotations

import torch

from clover_engine.recording.events import ProcessorFiring


class RepetitionControl:
    """n-gram repeat penalty over a recent window.

    For a masked slot at absolute position p whose previous ``n - 1`` tokens are
    all known, every token that followed the same (n-1)-gram within the last
    `window` positions before p has its logit lowered by `penalty`. A slot
    whose context still holds a MASK is left alone (its n-gram is not yet
    defined).

    Args:
        penalty: logit subtracted (> 0).
        ngram: n (>= 2).
        window: how many preceding positions to search (>= n).
    """

    name = "repetition"

    def __init__(self, penalty: float, ngram: int = 3, window: int = 64):
        if penalty <= 0 or ngram < 2 or window < ngram:
            raise ValueError(
                f"repetition control needs penalty > 0, ngram >= 2, window >= ngram; "
                f"got penalty={penalty}, ngram={ngram}, window={window}"
            )
        self.penalty, self.ngram, self.window = penalty, ngram, window

    def __call__(self, logits, seq: list[int], block_start: int, masked: list[bool], mask_id: int,
                 n_prompt: int) -> list[ProcessorFiring]:
        firings = []
        n = self.ngram
        for i, is_masked in enumerate(masked):
            if not is_masked:
                continue
            p = block_start + i
            ctx = seq[p - n + 1: p] if p - n + 1 >= 0 else None
            if not ctx or mask_id in ctx:
                continue
            banned = set()
            for q in range(max(n - 1, p - self.window), p):
                if seq[q - n + 1: q] == ctx and seq[q] != mask_id:
                    banned.add(seq[q])
            for tok in sorted(banned):
                logits[i, tok] -= self.penalty
                firings.append(ProcessorFiring(self.name, i, tok, -self.penalty))
        return firings


class ProgressiveEOSBias:
    """EOS logit bias growing linearly past a soft length limit.

    For a slot that would be generated token number g (0-based, prompt not
    counted), ``bias = rate * (g - soft_limit)`` when ``g > soft_limit``.

    Args:
        soft_limit: generated length after which the bias starts (>= 0).
        rate: logit added per token past the limit (> 0).
    """

    name = "eos_bias"

    def __init__(self, soft_limit: int, rate: float = 0.1):
        if soft_limit < 0 or rate <= 0:
            raise ValueError(f"EOS bias needs soft_limit >= 0 and rate > 0; got {soft_limit}, {rate}")
        self.soft_limit, self.rate = soft_limit, rate

    def __call__(self, logits, seq, block_start, masked, mask_id, n_prompt, eos_id) -> list[ProcessorFiring]:
        firings = []
        for i, is_masked in enumerate(masked):
            g = block_start + i - n_prompt
            if is_masked and g > self.soft_limit:
                bias = self.rate * (g - self.soft_limit)
                logits[i, eos_id] += bias
                firings.append(ProcessorFiring(self.name, i, eos_id, float(bias)))
        return firings
