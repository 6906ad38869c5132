"""The decoder that runs Fast-dLLM v2's, SDAR's and LLaDA2.0's official samplers on a block-causal model
(`clover_engine.backbones.block_causal.BlockCausalModel`) and reports them as the project's events.

`BlockDiffusionDecoder.generate` prefills the prompt's whole blocks into the KV cache (one forward),
then decodes block after block: denoising forwards over the block against the cache
(`BlockCausalModel.block_logits`, nothing kept), the family's step
(`clover_engine.decoding.block_diffusion_samplers`), and one commit forward over the finished block
(`BlockCausalModel.extend`, its K/V kept). Every forward counts in ``nfe``, the prefill and the commits
included, as they are real forwards of the originals.

Events: a `BlockStart` / `BlockEnd` pair per block at its absolute position (the prompt's tail, when the
prompt does not end on a block boundary, is the block's prefilled head), a `StepEvent` per denoising
forward with the candidates, their probabilities (``confidence``), the slots written (``accepted``) and the
slots written only by the always-one / quota rule (``forced``). Fast-dLLM v2's autoregressive first slot is
written by the commit forward; it shows as the next block's prefilled slot 0.

The result's ``tokens`` follow the project's rule (cut before the first EOS / stop token); ``canvas``
holds the answer exactly as the original returns it after the prompt (Fast-dLLM v2: through the stop
token; SDAR: every slot of the blocks, MASK ids of blocks never decoded included; LLaDA2.0: the first
``gen_length`` slots, through the first end-of-text).

LLaDA2.0's original has no KV cache: each step recomputes the prompt, the finished blocks and the block
under its block-causal mask, and so does this decoder by default (``LLaDA2Sampler.kv_cache`` False: NFE = the
denoising forwards, each priced over the whole window). With ``kv_cache`` the finished blocks are committed to
the cache once, as for SDAR (one more forward per block, each denoising forward over the block only): the same
logits in exact arithmetic (in fp32 both paths give the official answers in 36 of 36 fidelity cases), but in
bf16 a forward over fewer rows rounds differently, so a near tie can part the answer from the original's.

Wing ``decoding``. `clover_engine.decoding.samplers.decoder_for` gives this decoder for a
`FastDLLMv2Sampler` / `SDARSampler` / `LLaDA2Sampler` config.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from clover_engine.backbones.safetensors_shards import PageMeter
from clover_engine.cost.meter import CostMeter
from clover_engine.decoding.block_diffusion_samplers import (
    BlockStep, FastDLLMv2Sampler, SDARSampler, fast_dllm_v2_step, sdar_num_transfer_tokens, sdar_step,
)
from clover_engine.decoding.llada2_samplers import LLaDA21Sampler, LLaDA2Sampler, llada21_step, llada2_step
from clover_engine.decoding.config import DecodeResult
from clover_engine.decoding.hooks import Hook
from clover_engine.decoding.official_sampler import OfficialSamplerDecoder, SamplerRun
from clover_engine.recording.events import BlockEnd, BlockStart, StepEvent
from clover_kernels.confidence import top_candidates


@dataclass
class BlockDiffusionResult(DecodeResult):
    """What `BlockDiffusionDecoder.generate` returns: a `clover_engine.decoding.config.DecodeResult` plus:

    Attributes:
        canvas: the answer as the original returns it after the prompt (module docstring).
        settings: the sampler's settings (``to_dict()``).
        n_edits: written tokens replaced by another (LLaDA2.1's token editing; 0 for the other samplers).
    """

    canvas: list[int] = dataclasses.field(default_factory=list)
    settings: dict = dataclasses.field(default_factory=dict)
    n_edits: int = 0


class BlockDiffusionDecoder(OfficialSamplerDecoder):
    """Runs Fast-dLLM v2's, SDAR's or LLaDA2.0's official sampler on a block-causal model, with the project's events.

    Args:
        model: a `clover_engine.backbones.block_causal.BlockCausalModel`.
        tokenizer: for text prompts and answers, or None (prompts are token ids).
        config: the default sampler: a `FastDLLMv2Sampler`, `SDARSampler` or `LLaDA2Sampler` (None: the family's own,
            with the originals' defaults and the checkpoint's trained block size).

    Raises:
        TypeError: a model that is not block-causal, or a config of another type.
    """

    family = "block_causal"
    configs = (FastDLLMv2Sampler, SDARSampler, LLaDA2Sampler, LLaDA21Sampler)
    runs = "Fast-dLLM v2's / SDAR's / LLaDA2.0's / LLaDA2.1's samplers"

    def __init__(self, model, tokenizer=None, config: FastDLLMv2Sampler | SDARSampler | None = None):
        super().__init__(model, tokenizer)
        mcfg = model.config
        self.config = self._own(config) or (
            FastDLLMv2Sampler(block_size=mcfg.block_size, max_new_tokens=2048 // mcfg.block_size * mcfg.block_size,
                              small_block_size=8 if mcfg.block_size % 8 == 0 else mcfg.block_size)
            if mcfg.family == "fast_dllm_v2"
            else LLaDA2Sampler(block_length=mcfg.block_size, steps=mcfg.block_size) if mcfg.family == "llada2"
            else SDARSampler(block_length=mcfg.block_size, denoising_steps=mcfg.block_size))

    @torch.inference_mode()
    def generate(self, prompt: str | Sequence[int] | torch.Tensor, hooks: Iterable[Hook] = (),
                 record_trace: bool = True, cancel: threading.Event | Callable[[], bool] | None = None,
                 config: FastDLLMv2Sampler | SDARSampler | None = None) -> BlockDiffusionResult:
        """Decode a continuation of ``prompt`` with the sampler of ``config`` (default: the decoder's).

        Args:
            prompt: text (needs a tokenizer) or token ids (P of them).
            hooks: callables receiving every event of this decode only.
            record_trace: record a `clover_engine.recording.trace.Trace`.
            cancel: checked after every forward; when set, decoding stops (the block keeps its MASKs).
            config: a `FastDLLMv2Sampler`, `SDARSampler` or `LLaDA2Sampler` for this call.

        Returns:
            `BlockDiffusionResult`; ``nfe`` counts every forward (prefill, denoising, commits).

        Raises:
            TypeError / ValueError: a bad prompt or config, a sampler of the other family, or a decode
                that would pass the model's ``max_position_embeddings``.
        """
        cfg = self._own(config) or self.config
        mcfg = self.model.config
        if cfg.family != mcfg.family:
            raise ValueError(f"a {cfg.family} sampler cannot drive a {mcfg.family} checkpoint (its attention, shift and "
                             f"MASK differ); use the {mcfg.family} sampler")
        ids = self.encode_prompt(prompt)
        budget = cfg.max_new_tokens + cfg.block_size if isinstance(cfg, FastDLLMv2Sampler) else cfg.gen_length + cfg.block_length
        if len(ids) + budget > mcfg.max_position_embeddings:
            raise ValueError(f"the prompt ({len(ids)} tokens) plus up to {budget} answer slots passes the model's "
                             f"{mcfg.max_position_embeddings} positions (max_position_embeddings); shorten the prompt "
                             "or the answer budget")
        observers, trace, is_cancelled = self._observers(cfg, ids, hooks, record_trace, cancel)
        run = _Run(self, cfg, ids, observers, is_cancelled)
        t0 = time.perf_counter()
        canvas, cancelled = (run.fast_dllm_v2() if isinstance(cfg, FastDLLMv2Sampler)
                             else run.llada2() if isinstance(cfg, LLaDA2Sampler)
                             else run.llada21() if isinstance(cfg, LLaDA21Sampler) else run.sdar())
        wall_s = time.perf_counter() - t0
        stops = run.stop_ids
        tokens, stop = [], "max_new_tokens"
        for t in canvas:
            if t in stops:
                stop = "eos"
                break
            if t == mcfg.mask_token_id:
                break
            tokens.append(t)
        if cancelled:
            stop = "cancelled"
        result = BlockDiffusionResult.finished(
            tokens, ids, run.nfe, run.n_forced, wall_s, stop, self.tokenizer, trace=trace,
            bytes_read=None if run.meter is None else run.meter.bytes_read,
            flops=None if run.meter is None else run.meter.flops, observer_s=run.observer_s,
            canvas=canvas, settings=cfg.to_dict(), n_edits=run.n_edits)
        if observers:
            run.emit(dataclasses.replace(result.end_event(), unstepped_forwards=tuple(run.unstepped)))
        return result


class _Run(SamplerRun):
    """One decode: the model state, the forwards, the steps and the events."""

    def __init__(self, dec: BlockDiffusionDecoder, cfg, ids: list[int], observers: list, is_cancelled):
        super().__init__(observers, is_cancelled)
        self.dec, self.cfg = dec, cfg
        self.model = dec.model
        mcfg = self.model.config
        self.mask_id, self.P, self.ids = mcfg.mask_token_id, len(ids), list(ids)
        if isinstance(cfg, FastDLLMv2Sampler):
            self.stop_ids = {mcfg.eos_token_id if cfg.stop_token is None else cfg.stop_token}
            self.bs = cfg.block_size
        else:
            self.stop_ids = set((mcfg.eos_token_id,) if cfg.stop_token_ids is None else cfg.stop_token_ids)
            self.bs = cfg.block_length
        self.device = self.model.device
        self.state = self.model.setup_state()
        self.generator = None if cfg.seed is None else torch.Generator().manual_seed(cfg.seed)
        self.meter = (CostMeter(mcfg, self.model.dtype.itemsize, "state", 0, self.bs, dec.capabilities)
                      if observers else None)
        # a MoE model left mapped: the checkpoint bytes each step really paged in, beside the cost model's
        self.pages = (PageMeter.of(dec.model) if observers and dec.capabilities.emits("expert_union") else None)
        self.n_forced, self.n_blocks, self.n_edits = 0, 0, 0
        self.n_steps = 0  # step events so far (the position of a prefill / commit forward among them)
        self.unstepped: list[tuple] = []  # forwards no step event reports (DecodeEnd.unstepped_forwards)

    # ------------------------------------------------------------------ forwards
    def commit(self, ids) -> torch.Tensor:
        """Prefill / commit ``ids`` (block-causal, kept); logits [1, n, V]."""
        before = self.state.position
        logits = self.model.extend(self.state, ids, self.bs)
        self.nfe += 1
        union = self._union()  # the experts this forward's tokens chose (an SDAR MoE model), else None
        cost = None if self.meter is None else self.meter.forward(len(ids), 0, union, context_len=before)
        self.unstepped.append(("commit" if self.n_steps else "prefill", len(ids), before, self.n_steps, union,
                               None if cost is None else float(cost.bytes_read)))
        return logits

    def _union(self) -> list[int] | None:
        """The expert union per MoE layer of the forward just run (an SDAR MoE model), else None."""
        routing = getattr(self.model, "last_routing", None)
        return None if routing is None else routing.union.tolist()

    def denoise(self, block: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """One denoising forward over ``block`` [1, L]; raw logits [1, L, V], or [1, len(rows), V] for the
        output rows ``rows`` only (`BlockCausalModel.block_logits`)."""
        logits = self.model.block_logits(self.state, block) if rows is None else \
            self.model.block_logits(self.state, block, rows=rows)
        self.nfe += 1
        self._routing = getattr(self.model, "last_routing", None)  # SDAR MoE: what the block's slots chose
        self._cost = None if self.meter is None else self.meter.forward(0, block.shape[1], self._union(),
                                                                          context_len=self.state.position)
        self._last, self._n_forward = logits, block.shape[1]
        return logits

    def recompute(self, window: torch.Tensor, L: int) -> torch.Tensor:
        """One forward over the whole ``window`` [1, W] (prompt, finished blocks, the block: block-causal, no
        cache, as LLaDA2.0's original runs every step); raw logits [1, L, V] of the block's slots."""
        logits = self.model.recompute_logits(window, L)
        self.nfe += 1
        self._routing = getattr(self.model, "last_routing", None)
        W = window.shape[1]
        self._cost = None if self.meter is None else self.meter.forward(W - L, L, self._union(), context_len=0)
        self._last, self._n_forward = logits, W
        return logits

    # ------------------------------------------------------------------ Fast-dLLM v2
    def fast_dllm_v2(self) -> tuple[list[int], bool]:
        """Fast-dLLM v2's ``generate`` loop: (the answer after the prompt, cancelled?)."""
        cfg, bs, mask_id = self.cfg, self.bs, self.mask_id
        x = torch.tensor([self.ids], dtype=torch.long, device=self.device)
        stop = next(iter(self.stop_ids))
        # the original prefills only a prompt LONGER than one block (``input_ids.shape[1] > block_size``): a prompt
        # of exactly one block would then be skipped by every forward; it is prefilled here (P >= block_size)
        if x.shape[1] >= bs:
            logits = self.commit(x[0, : x.shape[1] // bs * bs])
            if x.shape[1] % bs == 0:
                x = torch.cat([x, logits[:, -1:].argmax(dim=-1)], dim=1)
        n_sub = bs // cfg.small_block_size
        for block_idx in range(cfg.max_new_tokens // bs):
            if stop in x[:, self.P:]:
                break
            prompt_length = x.shape[1]
            x_t = torch.cat([x, torch.full((1, bs - prompt_length % bs), mask_id, dtype=torch.long,
                                           device=self.device)], dim=1)
            lo = x_t.shape[1] - bs
            self._block_start(lo, x_t[0, lo:])
            n_steps = 0
            while True:
                if self._stopped(x_t, prompt_length, stop):
                    break
                if not (x_t[:, -bs:] == mask_id).any():
                    logits = self.commit(x_t[0, -bs:])
                    x_t = torch.cat([x_t, logits[:, -1:].argmax(dim=-1)], dim=1)
                    break
                for s in range(n_sub):
                    a, b = s * cfg.small_block_size, (s + 1) * cfg.small_block_size
                    while (x_t[:, lo + a: lo + b] == mask_id).any() and not self._stopped(x_t, prompt_length, stop):
                        t0 = time.perf_counter()
                        masked_before = x_t[0, lo:lo + bs] == mask_id
                        slots, rows, inv = self._fast_dllm_v2_rows(masked_before, a, b)
                        logits = self.denoise(x_t[:, lo:lo + bs], rows)  # [1, len(rows), V]
                        sub = x_t[:, lo + a: lo + b]
                        at = torch.searchsorted(slots, torch.arange(a, b, device=slots.device))
                        step = fast_dllm_v2_step(sub, logits[:, inv[at]], mask_id, cfg, self.generator)
                        x_t[:, lo + a: lo + b] = sub
                        self._step_event(lo, n_steps, x_t[0, lo:lo + bs], masked_before, step, a,
                                         logits[0, inv] if self.observers else logits[0], t0, slots=slots)
                        n_steps += 1
                        if self.is_cancelled():
                            self._block_end(lo, x_t[0, lo:lo + bs], n_steps)
                            return x_t[0, self.P:].tolist(), True
            self._block_end(lo, x_t[0, lo:lo + bs], n_steps)
            x = x_t
        out = x[0, self.P:].tolist()
        if stop in out:
            out = out[: out.index(stop) + 1]
        return out, False

    def _fast_dllm_v2_rows(self, masked_before: torch.Tensor, a: int, b: int):
        """The output rows a Fast-dLLM v2 step reads: (slots [S] whose logits are needed, sorted; rows [R] the
        distinct raw output rows that predict them; inv [S]: slot i's row is ``rows[inv[i]]``).

        Under the logit shift slot j is predicted by the output at slot j - 1 (slot 0 by its own output, as
        the original's ``cat([logits[:, :1], logits[:, :-1]])``). The step reads its sub-block ``a..b``; the
        explorer's events also show every masked slot of the block. The original computes all L rows over
        the whole vocabulary in every forward; this computes only these (the sub-block's alone without events).
        """
        want = torch.zeros_like(masked_before)
        want[a:b] = True
        if self.observers:
            want |= masked_before
        slots = want.nonzero()[:, 0]
        rows, inv = torch.unique((slots - 1).clamp(min=0), sorted=True, return_inverse=True)
        return slots, rows, inv

    def _stopped(self, x_t: torch.Tensor, prompt_length: int, stop: int) -> bool:
        """The original's stop test: the stop token written after ``prompt_length`` with no MASK before it."""
        new = x_t[0, prompt_length:]
        hits = (new == stop).nonzero()
        return bool(len(hits)) and not (new[: int(hits[0, 0])] == self.mask_id).any()

    # ------------------------------------------------------------------ SDAR
    def sdar(self) -> tuple[list[int], bool]:
        """SDAR's ``block_diffusion_generate`` loop: (the answer after the prompt, cancelled?)."""
        cfg, bs, mask_id, P = self.cfg, self.bs, self.mask_id, self.P
        num_blocks = (P + cfg.gen_length + bs - 1) // bs
        x = torch.full((1, num_blocks * bs), mask_id, dtype=torch.long, device=self.device)
        x[0, :P] = torch.tensor(self.ids, dtype=torch.long, device=self.device)
        prefill_blocks = P // bs
        if prefill_blocks:
            self.commit(x[0, : prefill_blocks * bs])
        quotas = sdar_num_transfer_tokens(bs, cfg.denoising_steps)
        for nb in range(prefill_blocks, num_blocks):
            lo = nb * bs
            cur = x[:, lo:lo + bs].clone()
            self._block_start(lo, cur[0])
            n_steps = 0
            for step_i in range(cfg.denoising_steps + 1):
                if not (cur == mask_id).any():
                    self.commit(cur[0])
                    break
                t0 = time.perf_counter()
                masked_before = cur[0] == mask_id
                logits = self.denoise(cur)
                step = sdar_step(cur, logits, mask_id, int(quotas[step_i]), cfg, self.generator)
                self._step_event(lo, n_steps, cur[0], masked_before, step, 0, logits[0], t0)
                n_steps += 1
                if self.is_cancelled():
                    x[:, lo:lo + bs] = cur
                    self._block_end(lo, cur[0], n_steps)
                    return x[0, P:].tolist(), True
            x[:, lo:lo + bs] = cur
            self._block_end(lo, cur[0], n_steps)
            if any(int(t) in self.stop_ids for t in x[0, P:].tolist()):
                break
        return x[0, P:].tolist(), False

    # ------------------------------------------------------------------ LLaDA2.0
    def llada2(self) -> tuple[list[int], bool]:
        """LLaDA2.0's ``generate`` loop (with the finished blocks in the KV cache: module docstring):
        (the answer after the prompt, cancelled?)."""
        cfg, bs, mask_id, P = self.cfg, self.bs, self.mask_id, self.P
        num_blocks = (P + cfg.gen_length + bs - 1) // bs
        x = torch.full((1, num_blocks * bs), mask_id, dtype=torch.long, device=self.device)
        x[0, :P] = torch.tensor(self.ids, dtype=torch.long, device=self.device)
        prefill_blocks = P // bs
        if prefill_blocks and cfg.kv_cache:
            self.commit(x[0, : prefill_blocks * bs])
        steps = cfg.steps_per_block
        quotas = sdar_num_transfer_tokens(bs, steps) if steps else []
        for nb in range(prefill_blocks, num_blocks):
            lo = nb * bs
            if nb > prefill_blocks and cfg.kv_cache:
                self.commit(x[0, lo - bs:lo])
            cur = x[:, lo:lo + bs]
            self._block_start(lo, cur[0])
            n_steps = 0
            for step_i in range(steps):
                if not (cur == mask_id).any():
                    break
                t0 = time.perf_counter()
                masked_before = cur[0] == mask_id
                logits = self.denoise(cur) if cfg.kv_cache else self.recompute(x[:, :lo + bs], bs)
                step = llada2_step(cur, logits, mask_id, int(quotas[step_i]), cfg, self.generator)
                self._step_event(lo, n_steps, cur[0], masked_before, step, 0, logits[0], t0)
                n_steps += 1
                if self.is_cancelled():
                    self._block_end(lo, cur[0], n_steps)
                    return x[0, P:P + cfg.gen_length].tolist(), True
                if cfg.eos_early_stop and any(int(t) in self.stop_ids for t in cur[0][step.transfer].tolist()):
                    hits = [i for i, t in enumerate(x[0, :lo + bs].tolist()) if t in self.stop_ids]
                    if not (x[0, P:hits[0]] == mask_id).any():
                        self._block_end(lo, cur[0], n_steps)
                        return x[0, P:hits[0] + 1].tolist(), False
            self._block_end(lo, cur[0], n_steps)
            if any(int(t) in self.stop_ids for t in x[0, P:lo + bs].tolist()):
                break
        out = x[0, P:P + cfg.gen_length].tolist()
        ends = [i for i, t in enumerate(out) if t in self.stop_ids]
        return (out[: ends[0] + 1] if ends else out), False

    # ------------------------------------------------------------------ LLaDA2.1
    def llada21(self) -> tuple[list[int], bool]:
        """LLaDA2.1's ``generate`` loop, with token editing (`LLaDA21Sampler`): (the answer after the prompt,
        cancelled?)."""
        cfg, bs, mask_id, P = self.cfg, self.bs, self.mask_id, self.P
        num_blocks = (P + cfg.gen_length + bs - 1) // bs
        x = torch.full((1, num_blocks * bs), mask_id, dtype=torch.long, device=self.device)
        x[0, :P] = torch.tensor(self.ids, dtype=torch.long, device=self.device)
        for nb in range(P // bs, num_blocks):
            lo = nb * bs
            cur = x[:, lo:lo + bs]
            editable = torch.arange(lo, lo + bs, device=self.device) >= P  # the prompt is never edited
            self._block_start(lo, cur[0])
            post_steps, n_steps = 0, 0
            while True:
                before, masked_before = cur[0].clone(), cur[0] == mask_id
                if not masked_before.any():
                    post_steps += 1
                if post_steps > cfg.max_post_steps:
                    break
                t0 = time.perf_counter()
                logits = self.recompute(x[:, :lo + bs], bs)
                step, edited = llada21_step(cur, logits, mask_id, editable, cfg, self.generator)
                self._step_event(lo, n_steps, cur[0], masked_before, step, 0, logits[0], t0, edited=edited,
                                 before=before, shown=editable)
                self.n_edits += int(edited.sum())
                n_steps += 1
                if self.is_cancelled():
                    self._block_end(lo, cur[0], n_steps)
                    return x[0, P:P + cfg.gen_length].tolist(), True
                if not masked_before.any() and not edited.any():
                    break
            self._block_end(lo, cur[0], n_steps)
            answer = x[0, P:lo + bs]
            if cfg.eos_early_stop and not (answer == mask_id).any() and any(int(t) in self.stop_ids for t in answer.tolist()):
                break
        out = x[0, P:P + cfg.gen_length].tolist()
        ends = [i for i, t in enumerate(out) if t in self.stop_ids]
        return (out[: ends[0] + 1] if ends else out), False

    # ------------------------------------------------------------------ events
    def _block_start(self, lo: int, block: torch.Tensor) -> None:
        if self.observers:
            tokens = block.cpu().numpy().copy()
            self.emit(BlockStart(self.n_blocks, lo, self.bs, len(tokens), tokens != self.mask_id, tokens))

    def _block_end(self, lo: int, block: torch.Tensor, n_steps: int) -> None:
        if self.observers:
            tokens = block.cpu().numpy().copy()
            hit = any(int(t) in self.stop_ids for t in tokens.tolist())
            self.emit(BlockEnd(self.n_blocks, lo, tokens, n_steps, hit))
        self.n_blocks += 1

    def _step_event(self, lo: int, i: int, block: torch.Tensor, masked_before: torch.Tensor, step: BlockStep,
                    offset: int, logits: torch.Tensor, t0: float, edited: torch.Tensor | None = None,
                    before: torch.Tensor | None = None, shown: torch.Tensor | None = None,
                    slots: torch.Tensor | None = None) -> None:
        """A `StepEvent` over the whole block; ``step`` covers slots ``offset ..`` (a Fast-dLLM v2 sub-block).
        ``logits`` [L, V] predicts every slot, or [S, V] only the slots ``slots`` [S] (the others' candidates
        are then unknown, -1 / NaN). LLaDA2.1's edits: ``edited`` [L] the written slots given another token
        (``rewritten``, or ``remasked`` when that token is MASK), ``before`` [L] the block before the step,
        ``shown`` [L] the slots whose candidates the event keeps (every slot the sampler re-predicts)."""
        n = step.transfer.shape[0]
        self.n_steps += 1
        self.n_forced += int((step.forced & masked_before[offset:offset + n]).sum())
        if not self.observers:
            return
        L, k = block.shape[0], self.cfg.top_candidates
        mb = masked_before.cpu().numpy()
        span = slice(offset, offset + n)
        revised = {}
        if edited is not None:
            ed, now = edited.cpu().numpy(), block.cpu().numpy()
            revised = dict(rewritten=ed & (now != self.mask_id), remasked=ed & (now == self.mask_id),
                           previous_tokens=np.where(ed, before.cpu().numpy(), -1).astype(np.int64))
        seen = mb | (shown.cpu().numpy() if shown is not None else False)

        def full(values, fill, dtype):
            out = np.full(L, fill, dtype=dtype)
            out[span] = values
            return out

        wrote = full(step.transfer.cpu().numpy(), False, bool) & mb
        forced = full(step.forced.cpu().numpy(), False, bool) & wrote
        if revised:
            wrote = wrote | revised["rewritten"]
        cand = full(step.candidate.cpu().numpy(), -1, np.int64)
        prob = full(step.prob.float().cpu().numpy(), np.nan, np.float32)
        probs = torch.softmax(logits.float(), dim=-1)
        tp, tt = top_candidates(probs, min(k, probs.shape[-1]))
        tops, topt = tp.float().cpu().numpy(), tt.cpu().numpy().astype(np.int64)
        if slots is not None:  # rows for some slots only: the rest have no candidates
            at = slots.cpu().numpy()
            tops = np.full((L, tops.shape[1]), np.nan, np.float32)
            topt = np.full((L, topt.shape[1]), -1, np.int64)
            tops[at], topt[at] = tp.float().cpu().numpy(), tt.cpu().numpy()
            seen = seen & np.isin(np.arange(L), at)
        cost, routing = self._cost, self._routing
        self.emit(StepEvent(
            block_index=self.n_blocks, step_index=i, position_start=lo, tokens=block.cpu().numpy().copy(),
            masked_before=mb, confidence=np.where(seen, prob, np.float32(np.nan)).astype(np.float32),
            candidate=np.where(seen, cand, -1), top_tokens=np.where(seen[:, None], topt, -1),
            top_probs=np.where(seen[:, None], tops, np.float32(np.nan)).astype(np.float32), accepted=wrote & ~forced,
            forced=forced, eos_filled=np.zeros(L, dtype=bool),
            expert_union=None if routing is None else routing.union.numpy(),
            expert_union_block=None if routing is None else routing.union_block.numpy(),
            expert_counts=None if routing is None else routing.counts.numpy(),
            router_entropy=None if routing is None else routing.entropy.numpy(), state_norm=None,
            memory_share=None, n_tokens_forward=int(self._n_forward), wall_s=float(time.perf_counter() - t0), firings=(),
            bytes_read=float(cost.bytes_read), flops=float(cost.flops),
            arithmetic_intensity=float(cost.arithmetic_intensity), **revised,
            bytes_paged_in=None if self.pages is None else float(self.pages.paged_in())))


__all__ = ["BlockDiffusionDecoder", "BlockDiffusionResult"]
