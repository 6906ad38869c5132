"""Block-diffusion noise for training (docs/architecture.md §9): which slots of a [B, T] batch are MASK.

Per block of L slots a mask ratio t ~ U(`EPS`, 1); with focus flags the loss is concentrated
on the tokens a decoder generates (assistant turns, copied values).

Wing: ``training``.
"""

from __future__ import annotations

import torch

EPS = 0.05  # smallest mask ratio of a block
OTHER_BLOCK_RATE = 0.15  # agent rows: share of blocks outside assistant turns that are masked at all


def mask_blocks(clean: torch.Tensor, L: int, mask_id: int, gen: torch.Generator,
                focus: torch.Tensor | None = None) -> torch.Tensor:
    """Noisy copy of `clean` [B, T] for block size L (see `_mask`). With `focus` [B, T] bool,
    blocks that hold focus tokens mask only those (the rest stay clean, like the prompt tail in
    a prefilled first block), and other blocks are masked only w.p. `OTHER_BLOCK_RATE`, so the
    loss concentrates on what a decoder generates: tool calls whose values must be copied."""
    noisy = _mask(clean, L, mask_id, gen)
    if focus is None:
        return noisy
    B, T = clean.shape
    nb = T // L
    f = focus.view(B, nb, L)
    has = f.any(-1, keepdim=True)  # [B, nb, 1]
    other = torch.rand(B, nb, 1, generator=gen) < OTHER_BLOCK_RATE
    allowed = torch.where(has, f, other.expand(B, nb, L))
    return torch.where(allowed.view(B, T), noisy, clean)


def _mask(clean: torch.Tensor, L: int, mask_id: int, gen: torch.Generator) -> torch.Tensor:
    """Per block of L slots: t ~ U(EPS, 1), mask each slot w.p. t; 25 % of blocks keep a clean
    random-length prefix (as a prompt-prefilled block does). At least one slot per block masked."""
    B, T = clean.shape
    nb = T // L
    t = EPS + (1 - EPS) * torch.rand(B, nb, 1, generator=gen)
    m = torch.rand(B, nb, L, generator=gen) < t
    prefix = torch.randint(0, L, (B, nb, 1), generator=gen)
    keep_prefix = (torch.rand(B, nb, 1, generator=gen) < 0.25) & (torch.arange(L).view(1, 1, L) < prefix)
    m &= ~keep_prefix
    none = ~m.any(-1)  # force one masked slot (the last) where none is
    m[..., -1] |= none
    noisy = clean.clone().view(B, nb, L)
    noisy[m] = mask_id
    return noisy.view(B, T)
