"""The decoder that runs LLaDA's and Dream's official samplers on a masked diffusion model
(`clover_engine.backbones.masked_diffusion.MaskedDiffusionModel`) and reports them as the project's events.

`MaskedDiffusionDecoder.generate` builds ``x = prompt ++ [MASK] * canvas_length`` and runs one
forward over the whole of ``x`` per step (the model's own forward, with the prompt as history and
the canvas as the block, so no ``canvas_tail`` is added), then the step of
`clover_engine.decoding.masked_diffusion_samplers` (`llada_step` / `dream_step`). The events are the
project's: LLaDA's blocks are `BlockStart` / `BlockEnd` pairs at ``P + b * block_length`` (right after
the prompt, not aligned to multiples of the block length), Dream's canvas is one block of
``max_new_tokens`` slots; a `StepEvent` per forward holds the slots' candidates, the probability of
each candidate (``confidence``), the top candidates, and the slots the step wrote (``accepted``;
``forced`` is always False: these samplers write a fixed quota per step). A slot a step writes with
the MASK id itself (the originals do not exclude it) stays masked and is not marked accepted.

The result's ``tokens`` follow the project's rule (cut before the first EOS); ``canvas`` holds the
whole canvas exactly as the original returns it after the prompt.

Wing ``decoding``. `clover_engine.decoding.samplers.decoder_for` gives this decoder for a
`LLaDASampler` / `DreamSampler` config.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from clover_engine.backbones.safetensors_shards import PageMeter
from clover_engine.cost.meter import CostMeter
from clover_engine.decoding.config import DecodeResult
from clover_engine.decoding.hooks import Hook
from clover_engine.decoding.official_sampler import OfficialSamplerDecoder, SamplerRun
from clover_engine.decoding.masked_diffusion_samplers import (
    DreamSampler, LLaDASampler, SamplerStep, dream_step, dream_timesteps, llada_num_transfer_tokens, llada_step,
)
from clover_engine.recording.events import BlockEnd, BlockStart, StepEvent
from clover_kernels.confidence import top_candidates


@dataclass
class MaskedDiffusionResult(DecodeResult):
    """What `MaskedDiffusionDecoder.generate` returns: a `clover_engine.decoding.config.DecodeResult`
    (``tokens`` cut before the first EOS, ``n_forced`` 0) plus:

    Attributes:
        canvas: every canvas slot after the prompt as the sampler left it (EOS and what follows
            included; a MASK where the sampler wrote the MASK id, or where a cancel stopped it).
        settings: the sampler's settings (``to_dict()`` of the `LLaDASampler` / `DreamSampler`).
    """

    canvas: list[int] = dataclasses.field(default_factory=list)
    settings: dict = dataclasses.field(default_factory=dict)


class MaskedDiffusionDecoder(OfficialSamplerDecoder):
    """Runs LLaDA's or Dream's official sampler on a masked diffusion model, with the project's events.

    Args:
        model: a `clover_engine.backbones.masked_diffusion.MaskedDiffusionModel` (eval mode is set here).
        tokenizer: for text prompts and answers, or None (prompts are token ids).
        config: the default sampler: an `LLaDASampler` or a `DreamSampler` (None: the family's own,
            LLaDA's for a LLaDA checkpoint, Dream's for a Dream one, with the originals' defaults).

    Raises:
        TypeError: a model that is not a masked diffusion backbone, or a config of another type.
    """

    family = "masked_diffusion"
    configs = (LLaDASampler, DreamSampler)
    runs = "LLaDA's / Dream's samplers"

    def __init__(self, model, tokenizer=None, config: LLaDASampler | DreamSampler | None = None):
        super().__init__(model, tokenizer)
        self.config = self._own(config) or (DreamSampler() if model.config.logit_shift else LLaDASampler())
        # the sampler's canvas is the whole answer: a forward adds no canvas tail of its own
        self._lm = model
        if getattr(model.config, "canvas_tail", 0):
            self._lm = copy.copy(model)  # shares the weights; only the config differs
            self._lm.config = dataclasses.replace(model.config, canvas_tail=0)

    @torch.inference_mode()
    def generate(self, prompt: str | Sequence[int] | torch.Tensor, hooks: Iterable[Hook] = (),
                 record_trace: bool = True, cancel: threading.Event | Callable[[], bool] | None = None,
                 config: LLaDASampler | DreamSampler | None = None) -> MaskedDiffusionResult:
        """Decode a continuation of ``prompt`` with the sampler of ``config`` (default: the decoder's).

        Args:
            prompt: text (needs a tokenizer) or token ids (P of them).
            hooks: callables receiving every event of this decode only.
            record_trace: record a `clover_engine.recording.trace.Trace`.
            cancel: checked after every forward; when set, decoding stops (the canvas keeps its MASKs).
            config: an `LLaDASampler` or a `DreamSampler` for this call.

        Returns:
            `MaskedDiffusionResult`; ``nfe`` = forwards run (LLaDA: ``steps``; Dream: ``steps``).

        Raises:
            TypeError / ValueError: a bad prompt or config, or P + canvas beyond the model's
                ``max_position_embeddings``.
        """
        cfg = self._own(config) or self.config
        ids = self.encode_prompt(prompt)
        mcfg = self.model.config
        P, G = len(ids), cfg.canvas_length
        if P + G > mcfg.max_position_embeddings:
            raise ValueError(f"the prompt ({P} tokens) plus the canvas of {G} slots needs {P + G} positions, more than "
                             f"the model's {mcfg.max_position_embeddings} (max_position_embeddings); shorten the "
                             "prompt or the canvas")
        observers, trace, is_cancelled = self._observers(cfg, ids, hooks, record_trace, cancel)
        run = _Run(self, cfg, ids, observers, is_cancelled)
        t0 = time.perf_counter()
        cancelled = run.llada() if isinstance(cfg, LLaDASampler) else run.dream()
        wall_s = time.perf_counter() - t0
        canvas = run.x[0, P:].tolist()
        tokens, stop = list(canvas), "max_new_tokens"
        if cancelled:
            stop = "cancelled"
            if mcfg.mask_token_id in tokens:
                tokens = tokens[: tokens.index(mcfg.mask_token_id)]
        if mcfg.eos_token_id in tokens:
            tokens, stop = tokens[: tokens.index(mcfg.eos_token_id)], "eos"
        result = MaskedDiffusionResult.finished(
            tokens, ids, run.nfe, 0, wall_s, stop, self.tokenizer, trace=trace,
            bytes_read=None if run.meter is None else run.meter.bytes_read,
            flops=None if run.meter is None else run.meter.flops, observer_s=run.observer_s,
            canvas=canvas, settings=cfg.to_dict())
        if observers:
            run.emit(result.end_event())
        return result


class _Run(SamplerRun):
    """One decode: the canvas ``x`` [1, P + G], the forwards, the steps and the events."""

    def __init__(self, dec: MaskedDiffusionDecoder, cfg, ids: list[int], observers: list, is_cancelled):
        super().__init__(observers, is_cancelled)
        self.dec, self.cfg = dec, cfg
        mcfg = dec.model.config
        self.mask_id, self.eos_id, self.P = mcfg.mask_token_id, mcfg.eos_token_id, len(ids)
        device = dec.model.device
        self.x = torch.full((1, self.P + cfg.canvas_length), self.mask_id, dtype=torch.long, device=device)
        self.x[0, : self.P] = torch.tensor(ids, dtype=torch.long, device=device)
        self.prompt = self.x[:, : self.P].clone()
        self.generator = None if cfg.seed is None else torch.Generator(device=device).manual_seed(cfg.seed)
        block = cfg.block_length if isinstance(cfg, LLaDASampler) else cfg.canvas_length
        self.meter = (CostMeter(mcfg, dec.model.dtype.itemsize, "state", 0, block, dec.capabilities)
                      if observers else None)
        # a MoE model left mapped: the checkpoint bytes each step really paged in, beside the cost model's
        self.pages = (PageMeter.of(dec.model) if observers and dec.capabilities.emits("expert_union") else None)

    def logits(self, lo: int | None = None, hi: int | None = None) -> torch.Tensor:
        """[1, T, V] fp32 over the whole of ``x``: the model's forward with the prompt as history and the
        canvas as the block (the logit shift, if any, already applied); prompt rows are zeros. With ``lo`` /
        ``hi`` (absolute positions of one block of the canvas): only that block's rows, [1, hi - lo, V] --
        the whole canvas still runs through the model, the output layer only over the block."""
        state = self.dec._lm.setup_state(1, "state")
        if lo is None:
            out = self.dec._lm(self.x[:, self.P:], state, commit_ids=self.prompt)
        else:
            out = self.dec._lm(self.x[:, self.P:], state, commit_ids=self.prompt, rows=slice(lo - self.P, hi - self.P))
        self._last_union = out.expert_union  # [N] distinct experts of this forward (MoE backbones), else None
        self.nfe += 1
        if lo is not None:
            self._origin, self._last_logits = lo, out.logits.float()
            return self._last_logits
        canvas_logits = out.logits.float()
        head = canvas_logits.new_zeros(1, self.P, canvas_logits.shape[-1])
        self._origin, self._last_logits = 0, torch.cat([head, canvas_logits], 1)
        return self._last_logits

    def llada(self) -> bool:
        """LLaDA's ``generate`` loop; True when cancelled."""
        cfg, P = self.cfg, self.P
        steps = cfg.steps // cfg.num_blocks
        # greedy with low_confidence remasking draws nothing: a step reads its block alone (every slot outside it
        # has confidence -inf in the original), so the output layer runs over the block's rows only
        block_only = cfg.temperature == 0 and cfg.remasking == "low_confidence"
        for b in range(cfg.num_blocks):
            lo, hi = P + b * cfg.block_length, P + (b + 1) * cfg.block_length
            block_mask_index = self.x[:, lo:hi] == self.mask_id
            num_transfer_tokens = llada_num_transfer_tokens(block_mask_index, steps)
            self._block_start(b, lo, hi, cfg.block_length)
            for i in range(steps):
                t0 = time.perf_counter()
                masked_before = self.x[0, lo:hi] == self.mask_id
                if block_only:
                    step = llada_step(self.x[:, lo:hi], self.logits(lo, hi), self.mask_id, hi - lo,
                                      int(num_transfer_tokens[0, i]), cfg, self.generator,
                                      within=(lo, self.x.shape[1]))
                else:
                    step = llada_step(self.x, self.logits(), self.mask_id, hi, int(num_transfer_tokens[0, i]), cfg,
                                      self.generator)
                self._step_event(b, i, lo, hi, masked_before, step, t0)
                if self.is_cancelled():
                    self._block_end(b, lo, hi, i + 1)
                    return True
            self._block_end(b, lo, hi, steps)
        return False

    def dream(self) -> bool:
        """Dream's ``_sample`` loop; True when cancelled."""
        cfg, lo, hi = self.cfg, self.P, self.x.shape[1]
        timesteps = dream_timesteps(cfg.steps, cfg.eps, device=self.x.device)
        self._block_start(0, lo, hi, cfg.canvas_length)
        for i in range(cfg.steps):
            t0 = time.perf_counter()
            masked_before = self.x[0, lo:hi] == self.mask_id
            step = dream_step(self.x, self.logits(), self.mask_id, i, timesteps, cfg, self.generator)
            self._step_event(0, i, lo, hi, masked_before, step, t0)
            if self.is_cancelled():
                self._block_end(0, lo, hi, i + 1)
                return True
        self._block_end(0, lo, hi, cfg.steps)
        return False

    # ------------------------------------------------------------------ events
    def _block_start(self, b: int, lo: int, hi: int, block_size: int) -> None:
        if self.observers:
            self.emit(BlockStart(b, lo, block_size, hi - lo, np.zeros(hi - lo, dtype=bool),
                                 self.x[0, lo:hi].cpu().numpy().copy()))

    def _block_end(self, b: int, lo: int, hi: int, n_steps: int) -> None:
        if self.observers:
            tokens = self.x[0, lo:hi].cpu().numpy().copy()
            before = self.x[0, self.P:lo].tolist()
            self.emit(BlockEnd(b, lo, tokens, n_steps, self.eos_id not in before and self.eos_id in tokens.tolist()))

    def _step_event(self, b: int, i: int, lo: int, hi: int, masked_before: torch.Tensor, step: SamplerStep,
                    t0: float) -> None:
        if not self.observers:
            return
        t_obs = time.perf_counter()
        L, k = hi - lo, self.cfg.top_candidates
        mb = masked_before.cpu().numpy()
        a, b_ = lo - self._origin, hi - self._origin  # the block in the step's columns (its own, or of all of x)
        wrote = (step.transfer[0, a:b_] & masked_before & (self.x[0, lo:hi] != self.mask_id)).cpu().numpy()
        # the top candidates for hovers: the softmax of this forward's logits is not kept by the step;
        # the candidate's own probability is (step.prob)
        cand = step.candidate[0, a:b_].cpu().numpy().astype(np.int64)
        prob = step.prob[0, a:b_].float().cpu().numpy()
        tops, topt = self._tops(lo, hi, k)
        union = getattr(self, "_last_union", None)
        routing = getattr(self.dec._lm, "last_routing", None)  # LLaDA-MoE: block / history unions, counts
        cost = self.meter.forward(self.P, self.x.shape[1] - self.P, None if union is None else union.tolist(),
                                  context_len=0)
        self.emit(StepEvent(
            block_index=b, step_index=i, position_start=lo, tokens=self.x[0, lo:hi].cpu().numpy().copy(),
            masked_before=mb, confidence=np.where(mb, prob, np.float32(np.nan)).astype(np.float32),
            candidate=np.where(mb, cand, -1), top_tokens=np.where(mb[:, None], topt, -1),
            top_probs=np.where(mb[:, None], tops, np.float32(np.nan)).astype(np.float32), accepted=wrote,
            forced=np.zeros(L, dtype=bool), eos_filled=np.zeros(L, dtype=bool),
            expert_union=None if union is None else union.cpu().numpy(),
            expert_union_block=None if routing is None else routing.union_block.numpy(),
            expert_counts=None if routing is None else routing.counts.numpy(),
            router_entropy=None if routing is None else routing.entropy.numpy(), state_norm=None, memory_share=None, n_tokens_forward=int(self.x.shape[1]), wall_s=float(t_obs - t0),
            firings=(), bytes_read=float(cost.bytes_read), flops=float(cost.flops),
            arithmetic_intensity=float(cost.arithmetic_intensity),
            bytes_paged_in=None if self.pages is None else float(self.pages.paged_in())))

    def _tops(self, lo: int, hi: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(top_probs [L, k] fp32, top_tokens [L, k] int64) of the last forward's softmax over the block."""
        logits = self._last_logits[0, lo - self._origin:hi - self._origin].float()
        probs = torch.softmax(logits, dim=-1)
        tp, tt = top_candidates(probs, min(k, probs.shape[-1]))
        return tp.float().cpu().numpy(), tt.cpu().numpy().astype(np.int64)


__all__ = ["MaskedDiffusionDecoder", "MaskedDiffusionResult"]
