"""The public step of block decoding: one block's slots (`BlockSlots`), one step's decisions
(`StepDecision`) and the selector that makes them from a forward's logits (`SlotSelector`: rules
2-7 of `clover_engine.decoding.decoder`'s docstring), plus `split_prompt` and `finished_tokens`. The
decoder's loop and `clover_engine.experiments.chains` both drive it. Wing ``decoding``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from clover_engine.decoding.config import DecodeConfig
from clover_engine.decoding.policies import make_policy
from clover_engine.decoding.processors import ProgressiveEOSBias, RepetitionControl
from clover_kernels.confidence import confidence_step


def split_prompt(ids: list[int], block_size: int) -> tuple[list[int], list[int]]:
    """Split a prompt at the last block boundary (blocks sit at absolute positions k * block_size).

    Returns:
        (committed, head): the whole blocks, committed into history by the first forward, and
        the partial last block, which pre-fills the head of the first generation block.
    """
    n_full = (len(ids) // block_size) * block_size
    return list(ids[:n_full]), list(ids[n_full:])


def finished_tokens(gen_part: list[int], eos_id: int, mask_id: int, cancelled: bool) -> tuple[list[int], bool]:
    """The answer tokens of a finished (or cancelled) block's generation slots.

    Args:
        gen_part: the block's generation slots (prompt head excluded).
        cancelled: the decode was cancelled mid-block: keep the written prefix, up to the
            first slot still MASK.

    Returns:
        (tokens, hit_eos): the slots up to and excluding the first EOS, and whether there was one.
    """
    if cancelled and mask_id in gen_part:
        gen_part = gen_part[: gen_part.index(mask_id)]
    if eos_id in gen_part:
        return gen_part[: gen_part.index(eos_id)], True
    return gen_part, False


class BlockSlots:
    """The block being denoised (the public step's state; `clover_engine.experiments.chains` drives it too).

    Attributes:
        index: block index; pos0: absolute position of slot 0; step: iterations run so far.
        L: slots (prompt head + generation slots).
        ids: [1, L] int64 token ids, MASK where undecided, filled in place by `SlotSelector.step`.
        prefilled: [L] bool, slots holding prompt tokens; masked: [L] bool, slots still MASK.
    """

    def __init__(self, index: int, pos0: int, head: list[int], n_gen: int, mask_id: int, device):
        self.index, self.pos0, self.step = index, pos0, 0
        self.L = len(head) + n_gen
        self.ids = torch.tensor([head + [mask_id] * n_gen], device=device)  # [1, L]
        self.prefilled = torch.zeros(self.L, dtype=torch.bool, device=device)
        self.prefilled[: len(head)] = True
        self.masked = ~self.prefilled


@dataclass
class StepDecision:
    """What one denoising step decided, per slot ([L] tensors; ``probs`` [L, V] fp32): the slots
    masked before it, each slot's confidence and top candidate, which slots were accepted, forced,
    or filled with EOS after an EOS, and the processors that fired."""

    masked_before: torch.Tensor
    conf: torch.Tensor
    cand: torch.Tensor
    probs: torch.Tensor  # [L, V]
    accepted: torch.Tensor
    forced: torch.Tensor
    eos_filled: torch.Tensor
    firings: list
    n_forced: int = 0  # forced.sum(), known on the host without reading the tensor


class SlotSelector:
    """The public decoding step: rules 2-7 of `clover_engine.decoding.decoder`'s docstring for one decode
    (processors, candidates, the policy, the forced fill, the EOS fill). `step` takes a forward's
    logits and writes a `BlockSlots` in place; the decoder's loop and `clover_engine.experiments.chains`
    both call it.

    Args:
        dc: the decode's `DecodeConfig`; cfg: the model config (``mask_token_id``, ``eos_token_id``);
        undecodable: [V] bool, ids that are never candidates (besides MASK).
    """

    def __init__(self, dc: DecodeConfig, cfg, undecodable: torch.Tensor):
        self.dc, self.mask_id, self.eos_id = dc, cfg.mask_token_id, cfg.eos_token_id
        self.policy = make_policy(dc.policy, threshold=dc.threshold, tokens_per_step=dc.tokens_per_step,
                                  max_entropy=dc.max_entropy, factor=dc.factor)
        self.rep = (RepetitionControl(dc.repetition_penalty, dc.repetition_ngram, dc.repetition_window)
                    if dc.repetition_penalty > 0 else None)
        self.eos_bias = (ProgressiveEOSBias(dc.eos_bias_soft_limit, dc.eos_bias_rate)
                         if dc.eos_bias_soft_limit is not None else None)
        self.never = undecodable.clone()  # [V] ids that are never candidates: MASK, ids without a token
        self.never[self.mask_id] = True

    def step(self, logits: torch.Tensor, blk: BlockSlots, seq: list[int], prompt_len: int, last_step: bool) -> StepDecision:
        """One iteration's decisions from the forward's logits [L, V]; writes `blk` in place.

        Args:
            seq: every token of the finished blocks (the processors' history).
            prompt_len: P, the prompt's length (processors never act on prompt tokens).
            last_step: `max_steps` runs out here: every remaining slot is written (forced).
        """
        firings: list = []
        if self.rep is not None or self.eos_bias is not None:
            cur = seq + blk.ids[0].tolist()
            mlist = blk.masked.tolist()
            if self.rep is not None:
                firings += self.rep(logits, cur, blk.pos0, mlist, self.mask_id, prompt_len)
            if self.eos_bias is not None:
                firings += self.eos_bias(logits, cur, blk.pos0, mlist, self.mask_id, prompt_len, self.eos_id)
        conf, cand, probs = confidence_step(logits, self.never)  # [L], [L], [L, V]; host path on CPU, Triton on CUDA
        masked = blk.masked
        accepted = self.policy.select(conf, masked, probs) & masked
        forced = torch.zeros_like(masked)
        n_forced = 0
        if last_step:
            forced = masked & ~accepted
            n_forced = int(forced.sum())
        elif not bool(accepted.any()):  # forced fill: the most confident masked slot
            forced[torch.where(masked, conf, torch.full_like(conf, -1.0)).argmax()] = True
            n_forced = 1
        write = accepted | forced
        blk.ids[0] = torch.where(write, cand, blk.ids[0])
        blk.masked = masked & ~write
        eos_filled = torch.zeros_like(masked)
        is_eos = (blk.ids[0] == self.eos_id) & ~blk.masked & ~blk.prefilled
        if bool(is_eos.any()):  # slots after the first EOS are EOS, without more forwards
            first = int(is_eos.nonzero()[0, 0])
            eos_filled = blk.masked & (torch.arange(blk.L, device=blk.ids.device) > first)
            blk.ids[0] = torch.where(eos_filled, torch.full_like(cand, self.eos_id), blk.ids[0])
            blk.masked = blk.masked & ~eos_filled
        return StepDecision(masked, conf, cand, probs, accepted, forced, eos_filled, firings, n_forced)
