"""Per-slot confidence, plain torch -- the definition (docs/architecture.md §5, rule 2).

After the logits processors, ids that may never be written (MASK, ids the tokenizer
cannot decode, e.g. an LM head wider than the tokenizer) get logit -inf; the
confidence of a slot is the largest softmax probability and its candidate the argmax:

    p = softmax(logits.masked_fill(never, -inf)),   conf = max_v p_v,   cand = argmax_v p_v
"""

from __future__ import annotations

import torch


def never_mask(vocab_size: int, mask_id: int, tokenizer_vocab: int | None = None,
               device: torch.device | str | None = None) -> torch.Tensor:
    """[vocab_size] bool: True for MASK and for ids >= `tokenizer_vocab` (None: no such ids).

    Raises:
        ValueError: mask_id outside [0, vocab_size).
    """
    if not 0 <= mask_id < vocab_size:
        raise ValueError(f"mask_id={mask_id} is outside the vocabulary [0, {vocab_size})")
    ids = torch.arange(vocab_size, device=device)
    never = ids == mask_id
    if tokenizer_vocab is not None:
        never |= ids >= tokenizer_vocab
    return never


def confidence_step(logits: torch.Tensor, never: torch.Tensor, with_probs: bool = True
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Confidence and candidate per slot.

    Args:
        logits: [L, V] float (the decoder's are fp32), after the logits processors.
        never: [V] bool, ids that are never candidates.
        with_probs: also return the probabilities (policies and step events read them).

    Returns:
        conf: [L] in logits' dtype, the max probability (in (0, 1]);
        cand: [L] int64, its id;
        probs: [L, V] in logits' dtype, or None when `with_probs` is False.
    """
    probs = torch.softmax(logits.masked_fill(never, float("-inf")), dim=-1)
    conf, cand = probs.max(-1)
    return conf, cand, (probs if with_probs else None)


def top_candidates(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K most probable ids per slot, the definition: ``probs.topk(k, dim=-1)``.

    Args:
        probs: [L, V] probabilities (any float dtype). k: 1 <= k <= V.

    Returns:
        values [L, k] (probs' dtype, descending), ids [L, k] int64. Among tied values the
        order of ids is unspecified (as in ``torch.topk``).
    """
    return probs.topk(k, dim=-1)
