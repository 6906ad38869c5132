"""Decoder events: what one denoising iteration (and each block / the run) did.

Events are small frozen dataclasses holding host (NumPy) arrays, built only
when at least one hook is registered on the decoder. Shapes use the project
letter table: L = slots in the current block (== block_size except for a
shorter last block), N = number of layers.

A hook is any callable ``fn(event) -> None``; see `clover_engine.decoding.decoder.BlockDecoder.add_hook`.

Wing: ``recording``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


def _short(a: Any) -> str:
    if isinstance(a, np.ndarray):
        if a.size <= 8:
            return np.array2string(a, precision=3, separator=",")
        return f"array(shape={a.shape}, dtype={a.dtype})"
    return repr(a)


class _Repr:
    def __repr__(self) -> str:  # compact, so `print(event)` stays readable
        parts = ", ".join(f"{k}={_short(v)}" for k, v in self.__dict__.items())
        return f"{type(self).__name__}({parts})"


@dataclass(frozen=True, repr=False)
class ProcessorFiring(_Repr):
    """One logits-processor intervention on one slot.

    Attributes:
        name: ``"repetition"`` or ``"eos_bias"``.
        slot: slot index inside the block (0-based).
        token: the token id whose logit was changed.
        value: the logit change applied (negative = penalty, positive = bias).
    """

    name: str
    slot: int
    token: int
    value: float


@dataclass(frozen=True, repr=False)
class BlockStart(_Repr):
    """A new block begins.

    Attributes:
        block_index: 0-based index of the generation block.
        position_start: absolute position of slot 0 (a multiple of block_size).
        block_size: the decode's block_size.
        length: slots in this block, L (< block_size only for a final, shorter block).
        prefilled: (L,) bool -- slots holding prompt tokens (never masked).
        tokens: (L,) int64 -- block contents at start (prompt tokens or MASK).
    """

    block_index: int
    position_start: int
    block_size: int
    length: int
    prefilled: np.ndarray
    tokens: np.ndarray


@dataclass(frozen=True, repr=False)
class StepEvent(_Repr):
    """One forward of the current block (one NFE) and what it wrote.

    Attributes:
        block_index, step_index: which block, which iteration inside it (0-based).
        position_start: absolute position of slot 0.
        tokens: (L,) int64 -- block contents *after* this step's writes.
        masked_before: (L,) bool -- slots still masked when the forward ran.
        confidence: (L,) float32 -- probability of the candidate (after the
            logits processors); NaN where the slot was not masked.
        candidate: (L,) int64 -- argmax token per slot; -1 where not masked.
        top_tokens: (L, top_candidates) int64 and top_probs: (L, top_candidates)
            float32 -- the most
            likely tokens per masked slot (-1 / NaN elsewhere), for hovers.
        accepted: (L,) bool -- written because the policy accepted them.
        forced: (L,) bool -- written by the forced fill (none passed) or by
            `max_steps` exhaustion.
        eos_filled: (L,) bool -- masked slots after an accepted EOS, resolved as
            EOS without a forward (docs/architecture.md §5, rule 7).
        expert_union: (N,) int64 -- distinct routed experts hit by all tokens of
            this forward, per layer (committed + block tokens; -1 = no MoE).
        expert_union_block: (N,) int64 -- distinct routed experts chosen by the block's
            slots alone (the rest of ``expert_union`` is the history's); None without it.
        expert_counts: (N, E) int64 -- tokens of this forward routed to each expert, per
            layer (each token counts in its k experts); None without it.
        router_entropy: (N,) float32 -- the router's entropy in nats over the E experts,
            averaged over the block's slots (ln E: uniform); None without it.
            These three are recorded by the MoE diffusion backbones
            (`clover_engine.backbones.llada_moe`); a trace saved before them reads None.
        state_norm: (N,) float32 -- Frobenius norm of each layer's recurrent
            state that this block reads (after the fused commit).
        memory_share: (N, L) float32 -- softmax mass on the memory unit per layer
            and slot, averaged over heads.
            These three are None for a backbone that has no such thing (a
            transformers model, `clover_engine.backbones.causal_lm.model`: no experts, no recurrent
            state, no memory unit); the views then say "not applicable to this model".
        n_tokens_forward: tokens that went through this forward (commit + block).
        bytes_read, flops, arithmetic_intensity: the cost model's estimate for
            this forward (bytes, FLOPs, FLOPs/byte); None until filled.
        bytes_paged_in: bytes of the checkpoint's file mapping that became resident in this process
            since the previous step (this forward, and a commit forward run before it), measured from
            ``/proc/self/smaps`` (`clover_engine.backbones.safetensors_shards.PageMeter`): what the forward
            really read from the page cache or the disk, beside the cost model's ``bytes_read``. Recorded
            for a mixture-of-experts model loaded mapped on Linux; None otherwise.
        wall_s: wall time of this iteration in seconds (forward + selection).
        firings: logits-processor interventions of this step.
        rewritten: (L,) bool -- slots that held a written (non-MASK) token before this
            step and hold a *different* token after it. Always False for an accept-once
            decoder (Clover's rule 5, docs/architecture.md §5); a revisable decoder
            (`clover_engine.backbones.diffusion_gemma`) sets it. A rewritten slot is also marked
            ``accepted`` or ``forced`` (it was written this step).
        remasked: (L,) bool -- slots that held a written token before this step and are
            masked again after it (a revisable sampler withdrew them). Always False for
            an accept-once decoder.
        previous_tokens: (L,) int64 -- the token a rewritten or remasked slot held
            before this step; -1 elsewhere.
            These three default to "nothing rewritten" (all False / all -1, shaped like
            ``tokens``) when not given, which is what every accept-once decoder and
            every trace saved before they existed reads as.

    A revisable decoder re-predicts every slot at every step, so it records
    ``confidence`` / ``candidate`` / top candidates for every slot, not only the masked ones.

    Raises:
        ValueError: when ``rewritten``, ``remasked`` or ``previous_tokens`` is given with a
            shape other than ``tokens``'s (L,).
    """

    block_index: int
    step_index: int
    position_start: int
    tokens: np.ndarray
    masked_before: np.ndarray
    confidence: np.ndarray
    candidate: np.ndarray
    top_tokens: np.ndarray
    top_probs: np.ndarray
    accepted: np.ndarray
    forced: np.ndarray
    eos_filled: np.ndarray
    expert_union: np.ndarray | None
    state_norm: np.ndarray | None
    memory_share: np.ndarray | None
    n_tokens_forward: int
    wall_s: float
    bytes_read: float | None = None
    flops: float | None = None
    arithmetic_intensity: float | None = None
    firings: tuple[ProcessorFiring, ...] = field(default_factory=tuple)
    rewritten: np.ndarray | None = None
    remasked: np.ndarray | None = None
    previous_tokens: np.ndarray | None = None
    expert_union_block: np.ndarray | None = None
    expert_counts: np.ndarray | None = None
    router_entropy: np.ndarray | None = None
    bytes_paged_in: float | None = None

    def __post_init__(self) -> None:
        L = np.shape(self.tokens)[0] if np.ndim(self.tokens) else 0
        for name, fill, dtype in (("rewritten", False, bool), ("remasked", False, bool),
                                  ("previous_tokens", -1, np.int64)):
            value = getattr(self, name)
            if value is None:
                object.__setattr__(self, name, np.full(L, fill, dtype=dtype))
                continue
            value = np.asarray(value, dtype=dtype)
            if value.shape != (L,):
                raise ValueError(f"StepEvent.{name} must have shape ({L},) like tokens, got {value.shape}")
            object.__setattr__(self, name, value)

    @property
    def n_rewritten(self) -> int:
        """Slots whose written token this step replaced by another one (0 for accept-once decoders)."""
        return int(np.sum(self.rewritten))

    @property
    def n_written(self) -> int:
        """Slots finalised by this step (accepted + forced + EOS-filled)."""
        return int(self.accepted.sum() + self.forced.sum() + self.eos_filled.sum())


@dataclass(frozen=True, repr=False)
class BlockEnd(_Repr):
    """A block is final (it becomes history at the next forward).

    Attributes:
        block_index: 0-based block index.
        position_start: absolute position of slot 0.
        tokens: (L,) int64 -- final block contents (prompt head included).
        n_steps: forwards spent on this block.
        hit_eos: whether the block contains the first EOS (decoding stops).
    """

    block_index: int
    position_start: int
    tokens: np.ndarray
    n_steps: int
    hit_eos: bool


@dataclass(frozen=True, repr=False)
class DecodeEnd(_Repr):
    """The decode finished (or was cancelled).

    Attributes:
        tokens: (T,) int64 -- generated tokens, up to and excluding the first EOS.
        nfe: number of forwards (function evaluations).
        tokens_per_forward: len(tokens) / nfe (generated tokens only).
        n_forced: slots written by forced fill.
        wall_s: total wall time in seconds.
        stop_reason: ``"eos"``, ``"max_new_tokens"``, ``"context"`` or ``"cancelled"``.
        bytes_read, flops: sums over forwards (None until the cost model fills them).
        observer_s: of `wall_s`, the seconds the decoder spent on its observers (events, cost
            estimates, hooks, this trace); 0.0 in traces saved before it was recorded.
        unstepped_forwards: the forwards counted in ``nfe`` that no `StepEvent` reports -- a block-causal
            family's prefill of the prompt's whole blocks and its commit of each finished block into the KV
            cache, which are forwards of their own (Clover fuses both into the next step). One
            ``(kind, n_tokens, context_len, steps_before, expert_union, bytes_read)`` each: ``"prefill"`` or
            ``"commit"``, the tokens it ran, the cached tokens it attended to, how many steps came before it, the
            distinct experts per MoE layer its tokens chose (a list; None for a dense model), and the cost
            model's bytes for it (as `StepEvent.bytes_read`; None without observers, absent in traces saved
            before it was recorded). So
            ``nfe == steps + len(unstepped_forwards)`` for every decoder, and every view counts the same
            forwards (`clover_engine.cost.project_trace` prices these too). () where there are none, and in
            traces saved before it was recorded.
    """

    tokens: np.ndarray
    nfe: int
    tokens_per_forward: float
    n_forced: int
    wall_s: float
    stop_reason: str
    bytes_read: float | None = None
    flops: float | None = None
    observer_s: float = 0.0
    unstepped_forwards: tuple = ()


Event = BlockStart | StepEvent | BlockEnd | DecodeEnd
