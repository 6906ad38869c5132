"""The block decoder: LowConfidence block diffusion (docs/architecture.md §5), with hooks.

Per block, exactly:

1. all generation slots start as MASK (a partial last prompt block pre-fills
   the head of the first generation block; blocks sit at positions k * block_size);
2. each iteration runs one forward over the block and takes, per masked slot,
   the argmax token and its probability after the logits processors (MASK and
   ids the tokenizer cannot decode -- an LM head wider than the tokenizer --
   are never candidates);
3. the policy accepts slots (LowConfidence: confidence >= threshold, compared
   exactly: the fp32 confidence against the threshold as given);
4. if it accepts none, the single most confident masked slot is written
   (forced fill);
5. written slots never change;
6. a block with no masked slot is final and becomes history (its commit is
   fused with the next block's first forward);
7. generation stops at the first EOS (masked slots after an accepted EOS in
   its block are resolved as EOS without more forwards; text after the first
   EOS is dropped) or at ``max_new_tokens``.

``max_steps`` bounds iterations per block; on the last allowed iteration every
remaining slot is written with its argmax and recorded as forced.
``block_size = 1`` is greedy autoregressive decoding.

A final block shorter than block_size (``max_new_tokens`` not a multiple of block_size, or the
context limit) runs with only the slots it needs: no slot is computed and
then thrown away.

Wing ``decoding``. This module is the loop (`BlockDecoder`); the settings and result live in
`clover_engine.decoding.config`, the hooks in `clover_engine.decoding.hooks`, the public step in
`clover_engine.decoding.step`. ``DecodeConfig``, ``DecodeResult`` and ``HookRegistry`` are re-exported
here: ``from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig`` is the decoding API.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from clover_engine.backbones.base import OBSERVABLES, capabilities_of
from clover_engine.cost.meter import CostMeter
from clover_engine.recording.events import BlockEnd, BlockStart, StepEvent
from clover_engine.backbones.clover.model import CloverModel
from clover_engine.decoding.config import DecodeConfig, DecodeResult, prompt_token_ids
from clover_engine.decoding.hooks import Hook, HookRegistry
from clover_engine.decoding.verify import generate_verified
from clover_engine.decoding.branch import Branch, DecodeStart, resume_point
from clover_engine.decoding.step import BlockSlots, SlotSelector, StepDecision, finished_tokens, split_prompt
from clover_kernels.confidence import top_candidates
from clover_engine.recording.trace import Trace

__all__ = ["BlockDecoder", "DecodeConfig", "DecodeResult", "HookRegistry"]


class BlockDecoder(HookRegistry):
    """Block-diffusion decoder over a `CloverModel`.

    Args:
        model: the model (eval mode is set here).
        tokenizer: a `tokenizers.Tokenizer` (needed for text prompts and output text) or None.
        config: a `DecodeConfig` (default: block 32, threshold 0.95).
    """

    def __init__(self, model: CloverModel, tokenizer=None, config: DecodeConfig | None = None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a block-diffusion backbone (a CloverModel, or a transformers-backed "
                            f"model from clover_engine.load_model), got {type(model).__name__}")
        self.capabilities = capabilities_of(model)  # TypeError for a module that implements no backbone
        if self.capabilities.sampler != "block":
            raise TypeError(f"{type(model).__name__} runs its own sampler ({self.capabilities.sampler!r}), not the "
                            "block decoder's accept-once rule: decode it with clover_engine.decoding.decoder_for(model)")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = config or DecodeConfig()
        if not isinstance(self.config, DecodeConfig):
            raise TypeError(f"config must be a DecodeConfig, got {type(self.config).__name__}")
        self._hooks: list[Hook] = []

    # ------------------------------------------------------------------ input
    def _undecodable(self, vocab_size: int, eos_id: int) -> torch.Tensor:
        """[vocab_size] bool: ids the tokenizer has no token for (an LM head wider than the
        tokenizer), which are never candidates. EOS stays a candidate. All False without a
        tokenizer. Cached per tokenizer."""
        tok = self.tokenizer
        key = (id(tok), vocab_size, eos_id)
        cached = getattr(self, "_undecodable_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        out = torch.zeros(vocab_size, dtype=torch.bool)
        if tok is not None:
            try:
                known = tok.get_vocab(with_added_tokens=True)  # tokenizers.Tokenizer
            except TypeError:
                known = tok.get_vocab()  # transformers tokenizers (added tokens included)
            has = torch.zeros(vocab_size, dtype=torch.bool)
            ids = torch.tensor([i for i in known.values() if 0 <= i < vocab_size], dtype=torch.long)
            has[ids] = True
            out = ~has
            if 0 <= eos_id < vocab_size:
                out[eos_id] = False
        self._undecodable_cache = (key, out)
        return out

    def encode_prompt(self, prompt: str | Sequence[int] | torch.Tensor) -> list[int]:
        """Validate a prompt and return its ids.

        Raises:
            TypeError: not a str / int sequence / 1-D int tensor, or a str without tokenizer.
            ValueError: empty prompt, text that is not valid Unicode (lone surrogates),
                ids outside the vocabulary, the MASK token inside the prompt, or a prompt
                at/over the model's context.
        """
        cfg = self.model.config
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise TypeError("a text prompt needs a tokenizer: BlockDecoder(model, tokenizer) "
                                "or pass token ids")
            if not prompt:
                raise ValueError("the prompt is empty; give at least one token of text")
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(
                    f"the prompt is not valid text: character {e.start} ({prompt[e.start:e.end]!r}) is a lone "
                    "surrogate, which is what decoding non-UTF-8 bytes with errors='surrogateescape' leaves; "
                    "decode the bytes with their real encoding (or errors='replace') before passing the prompt"
                ) from None
            prompt = self.tokenizer.encode(prompt).ids
        ids = prompt_token_ids(prompt, cfg.vocab_size)
        if cfg.mask_token_id in ids:
            raise ValueError(
                f"the prompt contains the MASK token (id {cfg.mask_token_id}) at index "
                f"{ids.index(cfg.mask_token_id)}; MASK is reserved for undecoded slots -- remove it"
            )
        if len(ids) >= cfg.max_position_embeddings:
            raise ValueError(
                f"the prompt has {len(ids)} tokens but the model's context is "
                f"{cfg.max_position_embeddings} (max_position_embeddings); shorten it to at most "
                f"{cfg.max_position_embeddings - 1} tokens"
            )
        return ids

    # ----------------------------------------------------------------- decode
    @torch.inference_mode()  # no autograd bookkeeping at all: ~10 % less fixed cost per op than no_grad
    def generate(
        self,
        prompt: str | Sequence[int] | torch.Tensor,
        hooks: Iterable[Hook] = (),
        record_trace: bool = True,
        cancel: threading.Event | Callable[[], bool] | None = None,
        config: DecodeConfig | None = None,
    ) -> DecodeResult:
        """Decode a continuation of `prompt`.

        Args:
            prompt: text (needs a tokenizer) or token ids.
            hooks: callables receiving every event of this decode only.
            record_trace: record an `clover_engine.recording.trace.Trace` (a hook like any other).
            cancel: a `threading.Event` (or callable returning True) checked after
                every forward; when set, decoding stops and keeps what was written
                (the finished blocks and the written prefix of the current block).
            config: overrides the decoder's `DecodeConfig` for this call.

        Returns:
            `DecodeResult`. Never prints. ``bytes_read`` / ``flops`` are filled when
            events are observed (a hook or the trace); a bare decode does no cost work.

        Raises:
            TypeError / ValueError: a bad prompt (see `encode_prompt`), or a ``block_size``
                above the model's context (``max_position_embeddings``).
        """
        dc = self._check_config(config)
        ids = self.encode_prompt(prompt)
        is_cancelled = (cancel.is_set if isinstance(cancel, threading.Event) else cancel) or (lambda: False)
        observers = list(self._hooks) + list(hooks)
        trace = self._new_trace(dc, ids) if record_trace else None
        if trace is not None:
            observers.append(trace)
        if dc.policy == "verify":  # a drafter proposes, the target verifies: its own loop
            if not self.capabilities.drafts:
                raise ValueError(f"policy 'verify' needs a model that drafts blocks for a target to verify "
                                 f"(a block drafter, model_type 'block-drafter'); {getattr(self.model, 'model_id', 'this model')} "
                                 "does not -- choose a slot policy such as 'low_confidence'")
            return generate_verified(self, ids, dc, observers, is_cancelled, trace)
        committed, head = split_prompt(ids, dc.block_size)
        start = DecodeStart(state=self.model.setup_state(1, dc.memory_mode),
                            commit=torch.tensor([committed], device=self.model.device) if committed else None,
                            head=head, seq=list(committed))
        return self._run(ids, dc, start, observers, is_cancelled, trace)

    @torch.inference_mode()
    def branch(self, trace: Trace, at: "Branch", hooks: Iterable[Hook] = (), record_trace: bool = True,
               cancel: threading.Event | Callable[[], bool] | None = None) -> DecodeResult:
        """Resume the decode recorded in `trace` from one of its steps, with a change: a slot's token
        chosen, a written slot re-masked, or other settings from that step on (`clover_engine.decoding.branch`).

        The model's state is rebuilt from the trace's tokens through its own commit path (one forward
        per finished block, the same inputs as the recorded first step of each block), so a branch with
        no change reproduces the recorded decode token for token. The result's trace holds the
        parent's events up to the branch point, then the branch's own; ``nfe`` counts both (the whole
        answer's forwards; the rebuild forwards are not counted). ``trace.meta["branch"]`` records the
        parent, the step and what was changed.

        Args:
            trace: a trace recorded by a block decoder on this model (or loaded from a file).
            at: the `clover_engine.decoding.branch.Branch` (block, step, slot edits, settings).
            hooks, record_trace, cancel: as for `generate`; the hooks see the parent's events up to
                the branch point first.

        Raises:
            ValueError: the trace is from another model, from a sampler that cannot resume (verify,
                DiffusionGemma), or the branch point or an edit does not fit the trace (each message
                says what was expected).
        """
        ids, dc, start, copied, branch_meta = resume_point(self, trace, at)
        is_cancelled = (cancel.is_set if isinstance(cancel, threading.Event) else cancel) or (lambda: False)
        observers = list(self._hooks) + list(hooks)
        new_trace = None
        if record_trace:
            new_trace = self._new_trace(dc, ids)
            for key, value in trace.meta.items():
                new_trace.meta.setdefault(key, value)
            new_trace.meta["branch"] = branch_meta
            observers.append(new_trace)
        for ev in copied:
            for fn in observers:
                fn(ev)
        return self._run(ids, dc, start, observers, is_cancelled, new_trace)

    def _run(self, ids: list[int], dc: DecodeConfig, start: "DecodeStart", observers: list, is_cancelled,
             trace) -> DecodeResult:
        """The block loop from `start` (a fresh decode, or a branch's resume point) to the end."""
        cfg = self.model.config
        block_size, P = dc.block_size, len(ids)

        def emit(ev):
            for fn in observers:
                fn(ev)

        state = start.state
        undeclared = {name: None for name in OBSERVABLES if not self.capabilities.emits(name)}
        meter = (CostMeter(cfg, self.model.dtype.itemsize, dc.memory_mode, state.window, block_size, self.capabilities)
                 if observers else None)
        select = SlotSelector(dc, cfg, self._undecodable(cfg.vocab_size, cfg.eos_token_id).to(self.model.device))
        commit, head, seq = start.commit, start.head, start.seq
        budget = min(dc.max_new_tokens, cfg.max_position_embeddings - P)
        stop_reason = "max_new_tokens" if budget == dc.max_new_tokens else "context"
        budget -= start.n_written
        generated: list[int] = list(start.generated)
        nfe, n_forced, block_index = start.nfe, start.n_forced, start.block_index
        resumed = start.block
        observer_s = 0.0  # seconds in the `if observers:` blocks below (DecodeResult.observer_s)
        t_start = time.perf_counter()
        while budget > 0 or resumed is not None:
            fwd_bs = block_size
            if resumed is not None:  # a branch: the block it resumes, its start already recorded
                blk, resumed, fwd_bs = resumed, None, start.block_size or block_size
                n_gen = int((~blk.prefilled).sum())
            else:
                # blocks sit at multiples of block_size: a branch that changed block_size realigns with one
                # shorter block (a plain decode always starts its blocks on the grid)
                n_gen = min(block_size - len(seq) % block_size - len(head), budget)
                blk = BlockSlots(block_index, len(seq), head, n_gen, cfg.mask_token_id, self.model.device)
                if observers:
                    t_obs = time.perf_counter()
                    emit(BlockStart(block_index, blk.pos0, block_size, blk.L, blk.prefilled.cpu().numpy().copy(),
                                    blk.ids[0].cpu().numpy().copy()))  # copies: the block is filled in place
                    observer_s += time.perf_counter() - t_obs
            cancelled = False
            while bool(blk.masked.any()):
                t0 = time.perf_counter()
                n_commit = 0 if commit is None else commit.shape[1]
                out = self.model(blk.ids, state, commit_ids=commit, block_size=fwd_bs, observe=bool(observers))
                commit = None
                step = select.step(out.logits[0], blk, seq, P, last_step=dc.max_steps is not None
                                   and blk.step + 1 >= dc.max_steps)
                nfe += 1
                n_forced += step.n_forced
                if observers:
                    t_obs = time.perf_counter()
                    if undeclared:  # record only what the backbone declares it observes (its Capabilities)
                        out = dataclasses.replace(out, **undeclared)
                    cost = meter.forward(n_commit, blk.L, None if out.expert_union is None else
                                         out.expert_union.tolist(), context_len=blk.pos0 - n_commit)
                    emit(self._step_event(blk, step, out, n_commit + blk.L, t_obs - t0, dc.top_candidates, cost,
                                          getattr(self.model, "last_routing", None)))
                    observer_s += time.perf_counter() - t_obs
                blk.step += 1
                if is_cancelled():
                    cancelled = True
                    break
            if observers:
                t_obs = time.perf_counter()
                emit(BlockEnd(block_index, blk.pos0, blk.ids[0].cpu().numpy().copy(), blk.step,
                              cfg.eos_token_id in blk.ids[0, len(head):].tolist()))
                observer_s += time.perf_counter() - t_obs
            tokens, hit_eos = finished_tokens(blk.ids[0].tolist()[len(head):], cfg.eos_token_id,
                                              cfg.mask_token_id, cancelled)
            generated += tokens
            if hit_eos or cancelled:
                stop_reason = "eos" if hit_eos else "cancelled"
                break
            budget -= n_gen
            seq += blk.ids[0].tolist()
            commit, head = blk.ids, []
            block_index += 1

        wall_s = time.perf_counter() - t_start
        result = DecodeResult.finished(
            generated, ids, nfe, n_forced, wall_s, stop_reason, self.tokenizer, trace=trace,
            bytes_read=None if meter is None else meter.bytes_read + start.bytes_read,
            flops=None if meter is None else meter.flops + start.flops, observer_s=observer_s)
        if observers:
            emit(result.end_event())
        return result

    def _check_config(self, config: DecodeConfig | None) -> DecodeConfig:
        """The decode's settings (`config` or the decoder's), checked against the model."""
        dc = config or self.config
        if not isinstance(dc, DecodeConfig):
            raise TypeError(f"config must be a DecodeConfig, got {type(dc).__name__}")
        ctx_len = self.model.config.max_position_embeddings
        if dc.block_size > ctx_len:
            raise ValueError(
                f"block_size {dc.block_size} is larger than the model's context of {ctx_len} positions "
                f"(max_position_embeddings); use a block_size of at most {ctx_len}"
            )
        return dc

    def _new_trace(self, dc: DecodeConfig, ids: list[int]):
        """An empty `clover_engine.recording.trace.Trace` for this decode (settings, model id and config in its metadata)."""

        cfg = self.model.config
        tok_text = (lambda i: self.tokenizer.decode([i], skip_special_tokens=False)) if self.tokenizer else None
        return Trace(decode_config=dc.to_dict(), model_id=getattr(self.model, "model_id", cfg.name),
                     token_text=tok_text, prompt_ids=ids,
                     meta={"model_config": cfg.to_dict(), "device": _device_name(self.model),
                           "capabilities": self.capabilities.to_dict()})

    @staticmethod
    def _step_event(blk: "BlockSlots", st: "StepDecision", out, n_fwd: int, wall_s: float, top_k: int, cost,
                    routing=None) -> StepEvent:
        """Copy one iteration's tensors to the host (only called when a hook is registered). ``routing``: a MoE
        diffusion backbone's `RoutingStats` of this forward (``last_routing``: the block's own union, tokens per
        expert, router entropy), None for any other backbone."""
        # three host copies (masks, ids, fp32 values): each torch op costs microseconds on the CPU and
        # each copy a sync on a GPU, so the [L] vectors and the top-K columns travel together
        k = min(top_k, st.probs.shape[-1])
        tp, tt = top_candidates(st.probs, k)  # [L, k] over every slot; masked rows kept below
        mb, accepted, forced, eos_filled = torch.stack(
            [st.masked_before, st.accepted, st.forced, st.eos_filled]).cpu().numpy()
        ints = torch.cat([blk.ids[0, :, None], st.cand[:, None].to(blk.ids.dtype), tt.to(blk.ids.dtype)], 1)
        ints = ints.cpu().numpy().astype(np.int64, copy=False)  # [L, 2 + k]: ids, candidate, top-K ids
        vals = torch.cat([st.conf[:, None].float(), tp.float()], 1).cpu().numpy()  # [L, 1 + k]
        tokens, m2 = ints[:, 0].copy(), mb[:, None]  # unmasked slots have no candidates: -1 / NaN
        confidence = np.where(mb, vals[:, 0], np.float32(np.nan))
        candidate = np.where(mb, ints[:, 1], -1)
        top_tokens = np.where(m2, ints[:, 2:], -1)
        top_probs = np.where(m2, vals[:, 1:], np.float32(np.nan))
        return StepEvent(
            block_index=blk.index, step_index=blk.step, position_start=blk.pos0,
            tokens=tokens, masked_before=mb, confidence=confidence, candidate=candidate,
            top_tokens=top_tokens, top_probs=top_probs, accepted=accepted, forced=forced, eos_filled=eos_filled,
            # None where the backbone has no such thing (a transformers model: no experts, no recurrent state)
            expert_union=None if out.expert_union is None else out.expert_union.cpu().numpy(),
            state_norm=None if out.state_norm is None else out.state_norm.cpu().numpy().astype(np.float32),
            memory_share=None if out.memory_share is None else out.memory_share[:, 0].float().cpu().numpy(),
            n_tokens_forward=int(n_fwd), wall_s=float(wall_s), firings=tuple(st.firings),
            bytes_read=float(cost.bytes_read), flops=float(cost.flops),
            arithmetic_intensity=float(cost.arithmetic_intensity),
            expert_union_block=None if routing is None or out.expert_union is None else routing.union_block.numpy(),
            expert_counts=None if routing is None or out.expert_union is None else routing.counts.numpy(),
            router_entropy=None if routing is None or out.expert_union is None else routing.entropy.numpy(),
        )



# ---------------------------------------------------------------------- helpers
def _device_name(model) -> str:
    """Where `model` runs, as the trace records it: ``"cpu"``, or ``"cuda:0 (NVIDIA H200)"`` on a GPU."""
    dev = getattr(model, "device", None)
    if dev is None:
        return "unknown"
    dev = torch.device(dev)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(dev)
