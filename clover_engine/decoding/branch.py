"""Branching a decode: resume from any recorded step with a slot's token chosen, a written slot
re-masked, or other settings from that step on. Wing ``decoding``; `BlockDecoder.branch` drives it.

Block diffusion writes for good (docs/architecture.md §5, rule 5): a token written early conditions
every later forward of its block and, once the block is history, every later block. A branch asks
"what if" of one step: the block as it stood after step ``s`` of block ``b``, with the edits applied,
is decoded from step ``s + 1`` by the rule (with the parent's settings, or new ones), and every later
block follows.

Exactness. The model's state is rebuilt from the trace's tokens through the model's own commit
path: for each finished block ``k < b`` one forward over block ``k``'s recorded start contents with
the recorded commit (the prompt's whole blocks for ``k = 0``, else block ``k - 1``'s final tokens),
which is exactly the first forward the decode ran on that block; for ``s >= 0`` block ``b``'s own
first forward is replayed the same way. Forwards without a commit leave every backbone's state as
it was (the block protocol, `clover_engine.backbones.base`), so the rebuilt state equals the recorded
decode's state bit for bit, and a branch with no change reproduces it token for token (tested for
Clover in both memory modes, the causal-LM adapter and masked diffusion). A sampler that is not the
block rule (DiffusionGemma's revisions, a drafter's verify rounds) cannot resume and says so.

What a branch's trace records: the parent's events up to the branch point (the step ``s`` event
carrying the edits: a chosen token is marked ``forced`` -- written without passing the policy --
and, where the slot held another written token, ``rewritten`` with ``previous_tokens``; a re-masked
slot is ``remasked``), then the branch's own events; ``meta["branch"]`` says which step and what
changed (`branch_label` writes it as one line).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from clover_engine.backbones.base import capabilities_of
from clover_engine.decoding.config import DecodeConfig
from clover_engine.decoding.step import BlockSlots, split_prompt
from clover_engine.recording.branches import branch_label, first_difference
from clover_engine.recording.events import BlockEnd, BlockStart, StepEvent

__all__ = ["Branch", "DecodeStart", "SlotEdit", "branch_label", "first_difference", "resume_point"]


@dataclass(frozen=True)
class SlotEdit:
    """One slot changed at the branch point.

    Attributes:
        slot: the slot's index inside its block (0-based; prompt slots cannot be edited).
        token: the token id to write there, or None to re-mask the slot (it is decoded again by the rule).
    """

    slot: int
    token: int | None = None


@dataclass(frozen=True)
class Branch:
    """Where a branch leaves its parent decode, and what it changes.

    Attributes:
        block_index: the block (0-based) of the branch point.
        step_index: the step of that block (0-based) after which the change applies; the branch's
            first forward is that block's step ``step_index + 1``. ``-1``: before the block's first
            forward (settings only: a token is chosen among a step's candidates, so edits need a step).
        edits: slot edits applied to the block as it stood after that step (`SlotEdit`).
        config: the settings from the branch point on (None: the parent's). ``block_size`` applies to
            the blocks after the branch point's block (the first of them is shorter where needed, so
            blocks keep sitting at multiples of block_size); ``memory_mode`` rebuilds the state in the
            new mode; policy, threshold, processors apply from the next forward.
    """

    block_index: int
    step_index: int
    edits: tuple[SlotEdit, ...] = ()
    config: DecodeConfig | None = None

    @classmethod
    def choose(cls, block_index: int, step_index: int, slot: int, token: int, config: DecodeConfig | None = None):
        """A branch that writes ``token`` at ``slot`` at that step (any id: a top-K candidate or another)."""
        return cls(block_index, step_index, (SlotEdit(slot, token),), config)

    @classmethod
    def remask(cls, block_index: int, step_index: int, slot: int, config: DecodeConfig | None = None):
        """A branch that re-masks ``slot`` (written at or before that step) and decodes it again."""
        return cls(block_index, step_index, (SlotEdit(slot, None),), config)


@dataclass
class DecodeStart:
    """Where the block loop of `BlockDecoder` starts: a fresh decode's defaults, or a branch's rebuilt point.

    Attributes:
        state: the model's state (history committed so far).
        commit: [1, C] int64 tokens the next forward commits first, or None.
        head: prompt tokens pre-filling the first block the loop runs (the resumed block's, if any).
        seq: every token of finished blocks (prompt's whole blocks included), for the processors.
        block: a partly decoded `BlockSlots` to continue (its BlockStart already recorded), or None.
        block_size: the block_size that block's forwards pass (its recorded one; None: the decode's).
        block_index: index of the next block the loop runs.
        generated: answer tokens of the finished blocks.
        n_written: generation slots already budgeted (finished blocks' slots; max_new_tokens counts them).
        nfe, n_forced, bytes_read, flops: the parent's totals up to the branch point.
    """

    state: Any
    commit: torch.Tensor | None
    head: list[int]
    seq: list[int]
    block: BlockSlots | None = None
    block_size: int | None = None
    block_index: int = 0
    generated: list[int] = field(default_factory=list)
    n_written: int = 0
    nfe: int = 0
    n_forced: int = 0
    bytes_read: float = 0.0
    flops: float = 0.0


def parent_config(trace) -> DecodeConfig:
    """The `DecodeConfig` a trace was recorded with (keys a later version added are dropped).

    Raises:
        ValueError: the trace records no decode settings.
    """
    if not trace.decode_config:
        raise ValueError("this trace records no decode settings (decode_config), so it cannot be resumed; "
                         "record it with BlockDecoder.generate")
    known = {f.name for f in dataclasses.fields(DecodeConfig)}
    return DecodeConfig(**{k: v for k, v in trace.decode_config.items() if k in known})


def _check_resumable(decoder, trace) -> None:
    """Refuse a trace this decoder's model cannot resume (each message says why and what to do)."""
    caps = trace.meta.get("capabilities") or {}
    if caps.get("sampler", "block") != "block":
        raise ValueError(f"this trace was decoded by the {caps['sampler']!r} sampler, which can revise what it wrote; "
                         "a branch resumes only block-rule decodes (accept-once), so it cannot resume this one")
    model = decoder.model
    model_id = getattr(model, "model_id", model.config.name)
    if trace.model_id is not None and str(trace.model_id) != str(model_id):
        raise ValueError(f"this trace was recorded with model {trace.model_id!r}, but the decoder holds {model_id!r}; "
                         "a branch rebuilds the recorded state, so open the trace's model first")
    rec_cfg = trace.meta.get("model_config") or {}
    for key in ("vocab_size", "mask_token_id", "eos_token_id"):
        if key in rec_cfg and rec_cfg[key] != getattr(model.config, key):
            raise ValueError(f"this trace's model has {key}={rec_cfg[key]} but the decoder's has "
                             f"{getattr(model.config, key)}; open the model the trace was recorded with")
    if not trace.prompt_ids:
        raise ValueError("this trace records no prompt ids, so its state cannot be rebuilt")
    if not trace.steps:
        raise ValueError("this trace has no recorded step to branch from")


def _blocks(trace) -> tuple[dict[int, BlockStart], dict[int, BlockEnd], dict[int, list[StepEvent]]]:
    starts = {b.block_index: b for b in trace.block_starts}
    ends = {b.block_index: b for b in trace.block_ends}
    steps: dict[int, list[StepEvent]] = {}
    for ev in trace.steps:
        steps.setdefault(ev.block_index, []).append(ev)
    return starts, ends, steps


def resume_point(decoder, trace, at: Branch):
    """Rebuild the state of `trace`'s decode at ``at`` and apply its edits.

    Args:
        decoder: the `clover_engine.decoding.decoder.BlockDecoder` over the trace's model.
        trace: an `clover_engine.recording.trace.Trace` recorded by the block rule on that model.
        at: the `Branch`.

    Returns:
        ``(ids, dc, start, events, meta)``: the prompt ids, the branch's `DecodeConfig`, the
        `DecodeStart`, the parent's events up to the branch point (the edited step included) and the
        ``meta["branch"]`` record.

    Raises:
        ValueError: see `BlockDecoder.branch`.
        TypeError: ``at`` is not a `Branch`.
    """
    if not isinstance(at, Branch):
        raise TypeError(f"at must be an clover_engine.decoding.branch.Branch, got {type(at).__name__}")
    _check_resumable(decoder, trace)
    parent = parent_config(trace)
    if parent.policy == "verify":
        raise ValueError("this trace was decoded in verify mode (a drafter's rounds checked by the target): "
                         "the target decides every token, so there is no slot decision to branch from; "
                         "branch a commit-mode decode instead")
    dc = decoder._check_config(at.config or parent)
    if dc.policy == "verify":
        raise ValueError("a branch continues by the block rule; choose a slot policy such as 'low_confidence'")
    model, cfg = decoder.model, decoder.model.config
    if not decoder.capabilities.runs(dc.memory_mode):
        raise ValueError(f"memory_mode {dc.memory_mode!r} is not one this model runs "
                         f"({', '.join(decoder.capabilities.memory_modes)})")
    starts, ends, steps = _blocks(trace)
    b, s = int(at.block_index), int(at.step_index)
    if b not in starts:
        raise ValueError(f"block {b} is not in this trace (blocks 0..{max(starts)}); pick a recorded block")
    n_steps = len(steps.get(b, []))
    if not -1 <= s < n_steps:
        raise ValueError(f"block {b} has {n_steps} recorded steps (0..{n_steps - 1}); step_index must be in "
                         f"-1..{n_steps - 1} (-1 = before its first forward)")
    if s == -1 and at.edits:
        raise ValueError("a token is chosen among a step's candidates: give the step (0-based) whose forward "
                         "the edit follows, not -1")
    for k in range(b):
        if k not in ends:
            raise ValueError(f"block {k} of this trace never ended, so block {b} cannot follow it")

    ids = list(trace.prompt_ids)
    device = model.device
    pb = starts[0].block_size
    committed, _ = split_prompt(ids, pb)
    state = model.setup_state(1, dc.memory_mode)
    commit = torch.tensor([committed], device=device) if committed else None
    seq, generated, n_written = list(committed), [], 0
    replay = list(range(b)) + ([b] if s >= 0 else [])
    for k in replay:  # each block's first forward as recorded: commits the history exactly as the decode did
        st = starts[k]
        model(torch.as_tensor(st.tokens, device=device)[None], state, commit_ids=commit, block_size=st.block_size)
        commit = None
        if k < b:
            end = ends[k].tokens
            n_pre = int(np.sum(st.prefilled))
            generated += [int(t) for t in end[n_pre:]]
            n_written += len(end) - n_pre
            seq += [int(t) for t in end]
            commit = torch.tensor([end.tolist()], device=device)

    st = starts[b]
    if decoder.capabilities.commits_whole_blocks and dc.block_size != st.block_size and st.length % dc.block_size:
        raise ValueError(f"{decoder.capabilities.family} folds history in whole blocks of block_size, and block {b} "
                         f"has {st.length} slots: a branch here can change block_size only to a divisor of "
                         f"{st.length} (e.g. {st.length // 2 if st.length % 2 == 0 else 1}); "
                         "for another block_size start a new decode")
    head = [int(t) for t in st.tokens[st.prefilled]]
    blk = BlockSlots(b, st.position_start, head, st.length - len(head), cfg.mask_token_id, device)
    copied: list = []
    for k in range(b):
        copied += [starts[k], *steps.get(k, []), ends[k]]
    copied.append(st)
    edited, change = None, []
    if s >= 0:
        prior = steps[b][: s + 1]
        edited, change = _apply_edits(prior, st, at.edits, decoder, trace)
        copied += prior[:-1] + [edited]
        tokens = edited.tokens
        blk.ids[0] = torch.as_tensor(tokens, device=device)
        blk.masked = (blk.ids[0] == cfg.mask_token_id) & ~blk.prefilled
        blk.step = s + 1
    done = [e for e in copied if isinstance(e, StepEvent)]
    start = DecodeStart(
        state=state, commit=commit, head=head, seq=seq, block=blk, block_size=st.block_size, block_index=b, generated=generated,
        n_written=n_written, nfe=len(done), n_forced=sum(int(np.sum(e.forced)) for e in done),
        bytes_read=sum(e.bytes_read or 0.0 for e in done), flops=sum(e.flops or 0.0 for e in done))
    settings = {k: [v, getattr(dc, k)] for k, v in parent.to_dict().items() if getattr(dc, k) != v}
    meta = {
        "parent_model_id": trace.model_id,
        "parent_label": (trace.meta.get("branch") or {}).get("label", "original"),
        "block_index": b, "step_index": s, "position": int(st.position_start),
        "edits": change, "settings": settings, "parent_nfe": len(done),
    }
    meta["label"] = branch_label(meta)
    return ids, dc, start, copied, meta


def _apply_edits(prior: list[StepEvent], st: BlockStart, edits, decoder, trace):
    """The step ``s`` event with the edits applied (the last of ``prior``), and the edits as recorded.

    EOS fill (rule 7) is redone on the edited block: slots the parent EOS-filled are masked again,
    then every masked slot after the block's first written EOS is EOS -- with no edit, the same slots.
    """
    ev = prior[-1]
    cfg = decoder.model.config
    mask, eos, L = cfg.mask_token_id, cfg.eos_token_id, len(ev.tokens)
    tokens = ev.tokens.copy()
    accepted, forced, eos_filled = ev.accepted.copy(), ev.forced.copy(), ev.eos_filled.copy()
    rewritten, remasked, previous = ev.rewritten.copy(), ev.remasked.copy(), ev.previous_tokens.copy()
    prefilled = np.asarray(st.prefilled, dtype=bool)
    never = decoder._undecodable(cfg.vocab_size, eos).cpu().numpy()
    change = []
    seen = set()
    for e in edits:
        if not isinstance(e, SlotEdit):
            raise TypeError(f"edits must be SlotEdit records, got {type(e).__name__}")
        j = int(e.slot)
        if not 0 <= j < L:
            raise ValueError(f"slot {j} is outside block {ev.block_index} (slots 0..{L - 1})")
        if j in seen:
            raise ValueError(f"slot {j} is edited twice; give one edit per slot")
        seen.add(j)
        if prefilled[j]:
            raise ValueError(f"slot {j} of block {ev.block_index} holds a prompt token; only generated slots "
                             "can be chosen or re-masked")
        old = int(tokens[j])
        if e.token is None:
            if old == mask:
                raise ValueError(f"slot {j} is still masked after step {ev.step_index} of block {ev.block_index}; "
                                 "there is nothing to re-mask (choose a token for it instead)")
            tokens[j] = mask
            accepted[j] = forced[j] = eos_filled[j] = False
            if not ev.masked_before[j]:  # written by an earlier step: withdrawn here
                remasked[j], previous[j] = True, old
        else:
            t = int(e.token)
            if not 0 <= t < cfg.vocab_size or t == mask or bool(never[t]):
                raise ValueError(f"token {t} cannot be written: expected an id in [0, {cfg.vocab_size}) that "
                                 f"the tokenizer can decode, not MASK ({mask})")
            if t == old:
                raise ValueError(f"slot {j} already holds token {t} ({trace.token_str(t)!r}) after step "
                                 f"{ev.step_index}; choose another token")
            tokens[j] = t
            accepted[j], forced[j], eos_filled[j] = False, True, False
            if not ev.masked_before[j]:
                rewritten[j], previous[j] = True, old
        change.append({"slot": j, "position": int(ev.position_start) + j, "token": None if e.token is None else int(e.token),
                       "previous": old, "text": "" if e.token is None else trace.token_str(int(e.token)),
                       "previous_text": trace.token_str(old) if old != mask else ""})
    if change:  # rule 7 again on the edited block
        filled_before = np.zeros(L, dtype=bool)
        for p in prior:
            filled_before |= p.eos_filled
        refill = filled_before & (tokens == eos) & ~np.isin(np.arange(L), list(seen))
        tokens[refill] = mask
        eos_filled &= ~refill
        earlier_fill = refill & ~ev.masked_before  # EOS-filled by an earlier step, now withdrawn
        remasked |= earlier_fill
        previous = np.where(earlier_fill, eos, previous)
        gen = ~prefilled & (tokens == eos)
        if gen.any():
            first = int(np.flatnonzero(gen)[0])
            fill = (tokens == mask) & (np.arange(L) > first)
            tokens[fill] = eos
            eos_filled |= fill & ev.masked_before
            back = fill & ~ev.masked_before  # masked again above, filled again: no change at all
            remasked &= ~back
            previous = np.where(back, -1, previous)
    edited = dataclasses.replace(ev, tokens=tokens, accepted=accepted, forced=forced, eos_filled=eos_filled,
                                 rewritten=rewritten, remasked=remasked, previous_tokens=previous)
    return edited, change
