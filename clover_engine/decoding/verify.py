"""Verify mode: a drafter proposes a block, the target keeps what it would have written itself.

Wing ``decoding``. `BlockDecoder.generate` runs this loop for ``DecodeConfig(policy="verify")`` on a
backbone that drafts (`clover_engine.backbones.base.Capabilities.drafts`: `clover_engine.backbones.drafter`).
Speculative decoding with greedy verification (Leviathan, Kalman & Matias, ICML 2023; the block
drafter of DFlash, arXiv 2602.06036):

1. **Prefill.** The target reads the prompt (one forward); its argmax is the first token ``t0``.
2. **Draft.** One drafter forward over ``[t0, MASK x k]`` (``k = block_size - 1``, fewer near the
   budget) placed right after the tokens read; each MASK slot's argmax is its draft (MASK and ids
   the tokenizer cannot decode are never candidates, as in the block decoder).
3. **Verify.** One target forward over ``[t0, d_1 .. d_k]`` (causal, KV cache): row ``j`` is the
   target's own prediction for the slot after it. The accepted run is the longest prefix with
   ``d_i == argmax(row i - 1)``; the target's token after it (the correction at the first rejected
   slot, or the bonus after a fully accepted draft) is written too and becomes the next ``t0``.
   The rejected tail leaves the KV cache and the drafter's context (`DraftedLM.rollback`).

The output equals the target's greedy decode token for token (up to floating-point ties between
a one-token and a k-token forward): the draft only decides how many tokens one target forward
writes. No logits processor applies (they would change what the target writes).

Events, one block per round (so the views show each draft): the block's slots are the ``k`` drafted
positions after ``t0`` plus one slot for the bonus. Slot ``i < k`` carries its draft as
``candidate`` with the drafter's confidence; ``accepted`` marks the accepted run; ``forced`` marks
the slot the target wrote itself (the first rejected slot, or the bonus slot); slots after it stay
MASK (discarded). The prefill is block 0 with one slot, forced (the target's first token).
``nfe`` counts target forwards (prefill included), so ``tokens_per_forward`` is tokens per target
forward; `VerifyResult` adds the drafter's forwards and the accepted run of every round.

Cost: each round's event carries the whole round's ``bytes_read`` / ``flops`` -- the drafter forward,
the fuse of the tokens the target read into the drafter's context, and the target's verification
forward (`clover_engine.cost.meter.CostMeter.verify_round`, formulas in `clover_engine.cost.drafter`);
`clover_engine.cost.drafter.verify_trace_costs` splits a recorded run's rounds into the two again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from clover_engine.cost.meter import CostMeter
from clover_engine.decoding.config import DecodeConfig, DecodeResult
from clover_engine.recording.events import BlockEnd, BlockStart, StepEvent
from clover_kernels.confidence import top_candidates


@dataclass
class VerifyResult(DecodeResult):
    """A `DecodeResult` of verify mode (``nfe`` = target forwards) plus:

    Attributes:
        draft_forwards: drafter forwards (one per round).
        accepted_lengths: drafted tokens the target accepted in each round (0 .. k).
        drafted: drafted slots in each round (k).
    """

    draft_forwards: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)


def _pick(logits: torch.Tensor, banned: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The argmax of every row with ``banned`` ids excluded (set to -inf), without a softmax.

    Args:
        logits: [n, V] fp32 logits; banned: [V] bool, the ids never picked (MASK, undecodable ids).

    Returns:
        (ids [n] int64, masked logits [n, V]): the masked logits are what `_probabilities` turns into
        probabilities where they are recorded (the events of an observed decode).
    """
    masked = logits.masked_fill(banned[None, :], float("-inf"))
    return masked.argmax(-1), masked


def _probabilities(masked: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities of ``ids`` [n] fp32, probabilities [n, V] fp32): the softmax of `_pick`'s masked logits."""
    probs = torch.softmax(masked.float(), -1)
    return probs.gather(-1, ids[:, None])[:, 0], probs


def generate_verified(decoder, ids: list[int], dc: DecodeConfig, observers: list[Callable],
                      is_cancelled: Callable[[], bool], trace) -> VerifyResult:
    """The verify-mode loop (module docstring) for a `BlockDecoder` whose model drafts.

    Args:
        decoder: the `clover_engine.decoding.decoder.BlockDecoder` (its model, tokenizer and candidate rule).
        ids: the encoded prompt; dc: the settings (``block_size`` = drafted slots + 1,
            ``max_new_tokens``; threshold and processors do not apply).
        observers: hooks (the trace among them); is_cancelled: checked after every round.
        trace: the `clover_engine.recording.trace.Trace` being recorded, or None.
    """
    model = decoder.model
    cfg = model.config
    mask_id, eos_id = cfg.mask_token_id, cfg.eos_token_id
    banned = decoder._undecodable(cfg.vocab_size, eos_id).to(model.device).clone()
    banned[mask_id] = True
    P = len(ids)
    budget = min(dc.max_new_tokens, cfg.max_position_embeddings - P)
    stop_reason = "max_new_tokens" if budget == dc.max_new_tokens else "context"
    K = min(dc.top_candidates, 8)
    meter = CostMeter(cfg, model.dtype.itemsize, "state", 0, dc.block_size, decoder.capabilities) if observers else None
    observer_s = 0.0

    def emit(ev):
        for fn in observers:
            fn(ev)

    def block_events(index: int, pos0: int, L: int, drafted: np.ndarray, d_conf: np.ndarray, d_top: tuple,
                     written: list[int], n_acc: int, forced_slot: int, wall: float, n_fwd: int, ctx: int,
                     n_draft: int) -> None:
        tokens = np.full(L, mask_id, dtype=np.int64)
        tokens[: len(written)] = written
        masked = np.ones(L, dtype=bool)
        cand = np.full(L, -1, dtype=np.int64)
        conf = np.full(L, np.nan, dtype=np.float32)
        tt = np.full((L, K), -1, dtype=np.int64)
        tp = np.full((L, K), np.nan, dtype=np.float32)
        k = len(drafted)
        cand[:k], conf[:k] = drafted, d_conf
        tt[:k], tp[:k] = d_top
        accepted = np.zeros(L, dtype=bool)
        accepted[:n_acc] = True
        forced = np.zeros(L, dtype=bool)
        if 0 <= forced_slot < L:
            forced[forced_slot] = True
        cost = meter.verify_round(n_fwd, n_draft, context_len=ctx).total
        emit(BlockStart(index, pos0, dc.block_size, L, np.zeros(L, dtype=bool), np.full(L, mask_id, dtype=np.int64)))
        emit(StepEvent(block_index=index, step_index=0, position_start=pos0, tokens=tokens, masked_before=masked,
                       confidence=conf, candidate=cand, top_tokens=tt, top_probs=tp, accepted=accepted, forced=forced,
                       eos_filled=np.zeros(L, dtype=bool), expert_union=None, state_norm=None, memory_share=None,
                       n_tokens_forward=n_fwd, wall_s=wall, bytes_read=float(cost.bytes_read), flops=float(cost.flops),
                       arithmetic_intensity=float(cost.arithmetic_intensity)))
        emit(BlockEnd(index, pos0, tokens.copy(), 1, eos_id in written))

    t_start = time.perf_counter()
    state = model.setup_state(1, "state")
    t0_clock = time.perf_counter()
    logits = model.read(state, ids)
    generated = _pick(logits[-1:], banned)[0].tolist()  # the target's first token
    nfe, draft_forwards, block_index = 1, 0, 0
    accepted_lengths: list[int] = []
    drafted_counts: list[int] = []
    if observers:
        t_obs = time.perf_counter()
        block_events(0, P, 1, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32),
                     (np.zeros((0, K), dtype=np.int64), np.zeros((0, K), dtype=np.float32)),
                     generated[:1], 0, 0, t_obs - t0_clock, P, 0, 0)
        observer_s += time.perf_counter() - t_obs
    hit_eos = generated[0] == eos_id
    cancelled = False
    while not hit_eos and len(generated) < budget:
        if is_cancelled():
            cancelled = True
            break
        t_round = time.perf_counter()
        anchor = generated[-1]
        pos = state.position  # the anchor's position (the target has read everything before it)
        k = max(0, min(dc.block_size - 1, budget - len(generated) - 1))
        if k:
            d_ids, d_masked = _pick(model.draft(state, [anchor] + [mask_id] * k)[1:], banned)
            draft_forwards += 1
            drafted = d_ids.tolist()
        else:
            drafted = []
        v_logits = model.read(state, [anchor] + drafted)
        nfe += 1
        target = _pick(v_logits, banned)[0].tolist()
        n = 0
        while n < k and drafted[n] == target[n]:
            n += 1
        written = drafted[:n] + [target[n]]
        model.rollback(state, pos + 1 + n)
        if eos_id in written:
            written = written[: written.index(eos_id) + 1]
            hit_eos = True
        written = written[: budget - len(generated)]
        generated += written
        accepted_lengths.append(n)
        drafted_counts.append(k)
        block_index += 1
        if observers:
            t_obs = time.perf_counter()
            if k:  # the drafter's probabilities only here, where the events record them
                d_conf, d_probs = _probabilities(d_masked, d_ids)
                tp, tt = top_candidates(d_probs, K)
            else:
                d_conf, tp, tt = torch.zeros(0), torch.zeros(0, K), torch.zeros(0, K, dtype=torch.long)
            block_events(block_index, pos + 1, k + 1, np.asarray(drafted, dtype=np.int64),
                         d_conf.float().cpu().numpy(), (tt.cpu().numpy().astype(np.int64), tp.float().cpu().numpy()),
                         written, min(n, len(written)), n if n < len(written) else -1, t_obs - t_round, k + 1, pos,
                         k + 1 if k else 0)
            observer_s += time.perf_counter() - t_obs
    if eos_id in generated:
        generated = generated[: generated.index(eos_id)]
        stop_reason = "eos"
    elif cancelled:
        stop_reason = "cancelled"
    wall_s = time.perf_counter() - t_start
    n_target = nfe  # tokens the target wrote itself: the first token and one per round (events: ``forced``)
    result = VerifyResult.finished(
        generated, ids, nfe, n_target, wall_s, stop_reason, decoder.tokenizer, trace=trace,
        bytes_read=None if meter is None else meter.bytes_read, flops=None if meter is None else meter.flops,
        observer_s=observer_s, draft_forwards=draft_forwards, accepted_lengths=accepted_lengths,
        drafted=drafted_counts)
    if trace is not None:  # before DecodeEnd: the hooks that end a run read it
        trace.meta["verify"] = {"draft_forwards": draft_forwards, "accepted_lengths": accepted_lengths,
                                "drafted": drafted_counts}
    if observers:
        emit(result.end_event())
    return result
