"""Long tool-call chains: decode every assistant call of one multi-round conversation, in several
decode settings, carrying the history as recurrent state from round to round.

A chain (`clover_engine.data.agent.generate_conversation` with ``n_rounds`` up to 50) is a system turn
listing tools, one user request naming every call, then per round: the assistant's call, and a
user turn with the tool's response. Round i's prompt is the conversation up to
``<|im_start|>assistant\\n`` before call i; it holds the *script's* earlier calls and responses
(the ground truth), so every setting sees the same prompts and each answer has a twin in every
other setting.

Re-encoding the whole prompt every round costs a forward over the whole history (about 0.2 ms
per token on this CPU for the bundled model: 50 rounds of a 6,000-token chain spend most of
their time re-reading it). Clover keeps history as state (docs/architecture.md §3), so
`decode_chain` commits only what each round adds -- the previous call, the tool response, the
next turn's header -- into one shared state (one forward per round, counted apart from the
settings' NFE, as `BlockDecoder.generate` fuses it into its first forward), and each setting
decodes from a copy of it. Settings decode one after another, and a forward whose inputs a
setting shares with an earlier setting's forward of the same round -- the same answer so far,
the same block -- is not run again: its logits (and, for a forward that commits, the state after
it) are taken from the earlier one, bit for bit what running it would give
(`RoundRun.n_reused`). Settings that differ only in a logits processor share every forward up to
the first decision the processor changes. The blocks, the partial-block head and every decoding rule are the
decoder's: each iteration is `clover_engine.decoding.decoder`'s own step (the same selector, processors,
forced fill and EOS fill), so a round's answer is what `BlockDecoder.generate` gives for the same
prompt ids, up to the floating-point order of committing the history in pieces instead of at
once (`tests/clover_engine/test_chains.py` holds them equal on the bundled model).

Every processor firing (`clover_engine.recording.events.ProcessorFiring`: repetition control, progressive EOS
bias) is kept with its forward, answer position and token.

Wing: ``experiments``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_chains.py -q``
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from clover_engine.data.agent import IM_END, IM_START, CallTurn, Conversation
from clover_engine.decoding.decoder import BlockDecoder
from clover_engine.decoding.step import BlockSlots, SlotSelector, finished_tokens, split_prompt
from clover_engine.experiments.tasks import ScoredAnswer, score_answer


@dataclass
class RoundRun(ScoredAnswer):
    """One round of a chain decoded in one setting (a `clover_engine.experiments.tasks.ScoredAnswer`).

    Attributes (F = processor firings):
        setting: the setting's name; round: the call's index in the conversation.
        prompt_len, target, tokens, hit_eos, text, nfe, n_forced, wall_s, exact_match, json_valid,
            name_correct: as `ScoredAnswer`.
        complete: the text holds a closed ``<tool_call>...</tool_call>``.
        fire_name: (F,) str -- ``repetition`` or ``eos_bias``; fire_pos: (F,) int64 answer position
            of the slot; fire_token: (F,) int64 the token whose logit changed; fire_value: (F,)
            float32 the change; fire_forward: (F,) int64 the answer's forward (0-based).
        write_pos, write_token: (W,) int64 -- every written answer slot and its token (writes after
            the first EOS included); write_forward: (W,) int64 the forward that wrote it.
        n_fields, n_fields_correct: ground-truth arguments, and how many the call got right.
        n_reused: of the `nfe` forwards, how many were taken from an earlier setting's identical
            forward instead of being run (`decode_chain`).
    """

    setting: str
    round: int
    complete: bool
    fire_name: np.ndarray = field(default_factory=lambda: np.zeros(0, "<U12"))
    fire_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    fire_token: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    fire_value: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    fire_forward: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    write_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    write_token: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    write_forward: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    n_fields: int = 0
    n_fields_correct: int = 0
    n_reused: int = 0

    def firings(self, name: str) -> int:
        """How many firings of processor `name` this answer's forwards recorded."""
        return int(np.sum(self.fire_name == name))

    def eos_written_biased(self, eos_id: int) -> bool:
        """The answer's EOS was written at a slot where the EOS bias fired in the forward that
        wrote it (an EOS-filled slot after it does not count)."""
        if not self.hit_eos:
            return False
        g = len(self.tokens)
        w = np.flatnonzero((self.write_pos == g) & (self.write_token == eos_id))
        if not len(w):
            return False
        f = self.write_forward[w[0]]
        return bool(np.any((self.fire_name == "eos_bias") & (self.fire_pos == g) & (self.fire_forward == f)))


def chain_prompts(tokenizer, conversation) -> list[list[int]]:
    """Each round's prompt ids; every one extends the one before (checked).

    Raises:
        ValueError: a prompt's ids do not start with the previous prompt's ids (the history
            could not be carried as state).
    """
    out: list[list[int]] = []
    for i, call in enumerate(conversation.calls):
        ids = tokenizer.encode(call.prompt).ids
        if out and ids[: len(out[-1])] != out[-1]:
            raise ValueError(f"round {i}'s prompt ids do not extend round {i - 1}'s; the tokenizer merges across "
                             "the turn boundary, so the history cannot be carried as state")
        out.append(ids)
    return out


def decode_chain(model, tokenizer, conversation, settings: Mapping[str, object], rounds=None,
                 progress=None) -> dict[str, list[RoundRun]]:
    """Decode the calls of `conversation` in every setting, history carried as state.

    Args:
        model, tokenizer: as `clover_engine.decoding.decoder.BlockDecoder` takes them.
        conversation: an `clover_engine.data.agent.Conversation` (``calls`` in order).
        settings: ``{name: DecodeConfig}``; all must share ``block_size`` and ``memory_mode``
            (they share the history's state).
        rounds: the call indices to decode (default: all); the history is committed for every
            round up to the last one either way.
        progress: optional ``progress(done, total)`` after each round.

    Returns:
        ``{name: [RoundRun per decoded round, in order]}``.

    Raises:
        ValueError: no settings, settings that differ in block_size or memory_mode, or prompts
            that do not extend each other (`chain_prompts`).
    """
    if not settings:
        raise ValueError("decode_chain needs at least one setting")
    cfgs = list(settings.values())
    bs, mode = cfgs[0].block_size, cfgs[0].memory_mode
    if any(c.block_size != bs or c.memory_mode != mode for c in cfgs):
        raise ValueError("every setting of a chain must share block_size and memory_mode (they share the "
                         f"history's state); got {[(c.block_size, c.memory_mode) for c in cfgs]}")
    prompts = chain_prompts(tokenizer, conversation)
    todo = set(range(len(prompts)) if rounds is None else rounds)
    dec = BlockDecoder(model, tokenizer)
    mcfg = model.config
    never = dec._undecodable(mcfg.vocab_size, mcfg.eos_token_id).to(model.device)
    state = model.setup_state(1, mode)
    committed: list[int] = []
    out: dict[str, list[RoundRun]] = {name: [] for name in settings}
    with torch.no_grad():
        for i, ids in enumerate(prompts):
            if i > max(todo, default=-1):
                break
            full, head = split_prompt(ids, bs)
            new = full[len(committed):]
            if new:  # fold what this round adds into the shared state
                model(torch.tensor([[mcfg.mask_token_id]], device=model.device), state,
                      commit_ids=torch.tensor([new], device=model.device), block_size=bs)
                committed = list(full)
            if i not in todo:
                continue
            shared: dict = {}  # (answer so far, block) -> (logits, state after the forward or None)
            for name, dc in settings.items():
                select = SlotSelector(dc, mcfg, never)
                out[name].append(_decode_round(model, tokenizer, copy.deepcopy(state), committed, head, len(ids), dc,
                                               select, name, i, conversation.calls[i], shared))
            if progress is not None:
                progress(i + 1, len(prompts))
    return out


def _decode_round(model, tokenizer, state, committed, head, P, dc, select, name, index, call, shared) -> RoundRun:
    """`BlockDecoder.generate`'s block loop from a state that already holds `committed`; forwards
    found in `shared` (this round's earlier settings) are reused, new ones added to it."""
    cfg = model.config
    budget = min(dc.max_new_tokens, cfg.max_position_embeddings - P)
    seq, commit, head = list(committed), None, list(head)
    generated: list[int] = []
    nfe = n_forced = block_index = n_reused = 0
    n0 = len(committed)
    fires, writes = [], []
    t0 = time.perf_counter()
    hit_eos = False
    while budget > 0:
        n_gen = min(dc.block_size - len(head), budget)
        blk = BlockSlots(block_index, len(seq), head, n_gen, cfg.mask_token_id, model.device)
        while bool(blk.masked.any()):
            key = (tuple(seq[n0:]), tuple(blk.ids[0].tolist()))
            if key in shared:  # the same inputs as an earlier setting's forward: the same outputs
                logits, after = shared[key]
                if after is not None:
                    state = copy.deepcopy(after)
                n_reused += 1
            else:
                logits = model(blk.ids, state, commit_ids=commit, block_size=dc.block_size).logits[0]
                shared[key] = (logits.clone(), None if commit is None else copy.deepcopy(state))
            commit = None
            st = select.step(logits.clone(), blk, seq, P, last_step=dc.max_steps is not None
                             and blk.step + 1 >= dc.max_steps)
            for f in st.firings:
                fires.append((f.name, blk.pos0 + f.slot - P, f.token, f.value, nfe))
            w = (st.accepted | st.forced | st.eos_filled).nonzero()[:, 0].tolist()
            ids_now = blk.ids[0].tolist()
            writes += [(blk.pos0 + s - P, ids_now[s], nfe) for s in w]
            nfe += 1
            n_forced += int(st.forced.sum())
            blk.step += 1
        tokens, hit_eos = finished_tokens(blk.ids[0].tolist()[len(head):], cfg.eos_token_id, cfg.mask_token_id, False)
        generated += tokens
        if hit_eos:
            break
        budget -= n_gen
        seq += blk.ids[0].tolist()
        commit, head = blk.ids, []
        block_index += 1
    wall = time.perf_counter() - t0
    text = tokenizer.decode(generated)
    verdicts, fields = score_answer(text, call, tokenizer)
    fa = list(zip(*fires)) if fires else [[], [], [], [], []]
    wa = list(zip(*writes)) if writes else [[], [], []]
    return RoundRun(
        setting=name, round=index, prompt_len=P, tokens=np.asarray(generated, np.int64), hit_eos=hit_eos, nfe=nfe,
        n_forced=n_forced, wall_s=wall, **verdicts, complete="</tool_call>" in text and "<tool_call>" in text,
        n_fields=len(fields), n_fields_correct=sum(f["correct"] for f in fields), n_reused=n_reused,
        fire_name=np.asarray(fa[0], "<U12"), fire_pos=np.asarray(fa[1], np.int64),
        fire_token=np.asarray(fa[2], np.int64), fire_value=np.asarray(fa[3], np.float32),
        fire_forward=np.asarray(fa[4], np.int64), write_pos=np.asarray(wa[0], np.int64),
        write_token=np.asarray(wa[1], np.int64), write_forward=np.asarray(wa[2], np.int64))


_CLAUSE_SPLIT = re.compile(r", then |, and finally ")


def turn_per_call_chain(conversation):
    """The same calls and tool responses as `conversation`, with the request split into one user
    turn per call: system, then per round ``user: Please <clause>.``, the assistant's call, the
    tool's response (a user turn, as in the training layout); each call's values sit in the turn
    just before it or in a recent tool response, instead of in one request at the top of the chain.

    Args:
        conversation: from `clover_engine.data.agent.generate_conversation` (two rounds or more).

    Returns:
        An `clover_engine.data.agent.Conversation` whose `calls` hold the new prompts (targets, names,
        arguments and fields unchanged); its text ends with the last tool response.

    Raises:
        ValueError: the request does not split into one clause per call.
    """
    text = conversation.text
    system_end = text.index(IM_END) + len(IM_END) + 1
    user = text[system_end:].split(IM_END, 1)[0].split("\n", 1)[1]  # the request turn's content
    body = user.split("Please ", 1)[1].rstrip(".")
    clauses = _CLAUSE_SPLIT.split(body)
    responses = re.findall(r"<tool_response>.*?</tool_response>", text)
    n = len(conversation.calls)
    if len(clauses) != n or len(responses) < n - 1:
        raise ValueError(f"the request splits into {len(clauses)} clauses and {len(responses)} responses for "
                         f"{n} calls; cannot build one turn per call")
    out = text[:system_end]
    calls = []
    for i, (call, clause) in enumerate(zip(conversation.calls, clauses)):
        out += f"{IM_START}user\nPlease {clause}.{IM_END}\n{IM_START}assistant\n"
        calls.append(CallTurn(out, call.target, call.name, dict(call.arguments), list(call.fields), i))
        out += call.target + "\n"
        if i < len(responses):
            out += f"{IM_START}user\n{responses[i]}{IM_END}\n"
    return Conversation(out, calls)
