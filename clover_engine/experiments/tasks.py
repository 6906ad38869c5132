"""Decode held-out agent tasks in several decode settings on the same prompts and keep every write
each forward made (`TaskRun`): `decode_task`, `decode_tasks` (interleaved task by task, so a busy
machine slows every setting alike) and `task_run_from_trace` (the same `TaskRun` from a saved
trace, with no decode). Wing ``experiments``.

A decoded token is *right* when it is part of the best alignment of the decoded answer with
the target (`TaskRun.answer_correct`: `difflib.SequenceMatcher` matching blocks; the target is the
ground-truth completion, tokenized -- prompt and target tokenize apart exactly, as
`clover_engine.data.agent` writes them).

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_experiments.py -q``
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from clover_engine.data.agent import score_call
from clover_engine.decoding.decoder import BlockDecoder
from clover_engine.prompting import model_input
from clover_engine.recording.events import StepEvent

KIND_ACCEPTED, KIND_FORCED, KIND_EOS = 0, 1, 2
"""`TaskRun.write_kind` codes: accepted by the policy, forced fill (or ``max_steps``), EOS-filled."""


@dataclass
class ScoredAnswer:
    """One decoded answer scored against its target: what a `TaskRun` and a chain's round
    (`clover_engine.experiments.chains.RoundRun`) share.

    Attributes:
        prompt_len: P, prompt tokens (answer position j sits at absolute position P + j).
        target: (A,) int64 -- the ground-truth answer ids, ending with EOS.
        tokens: (G,) int64 -- generated ids up to and excluding the first EOS.
        hit_eos: the decode stopped at an EOS (which is then answer position G).
        text: the decoded text; nfe, n_forced: forwards and forced slots; wall_s: seconds.
        exact_match, json_valid, name_correct: `clover_engine.data.agent.score_call`'s verdicts.
    """

    prompt_len: int
    target: np.ndarray
    tokens: np.ndarray
    hit_eos: bool
    text: str
    nfe: int
    n_forced: int
    wall_s: float
    exact_match: bool
    json_valid: bool
    name_correct: bool


def score_answer(text: str, task, tokenizer, score: Callable | None = None) -> tuple[dict, list]:
    """The `ScoredAnswer` fields that scoring ``text`` against ``task`` gives (``target``, ``text`` and the
    verdicts of ``score``, default `clover_engine.data.agent.score_call`), and the per-argument ``fields`` list."""
    s = (score or score_call)(text, task)
    return dict(target=np.asarray(tokenizer.encode(task.target).ids, np.int64), text=text,
                exact_match=bool(s["exact_match"]), json_valid=bool(s["json_valid"]),
                name_correct=bool(s["name_correct"])), s["fields"]


@dataclass
class TaskRun(ScoredAnswer):
    """One decode of one task in one setting, with every write it made (a `ScoredAnswer`).

    Attributes (W = written answer slots, S = iterations = NFE, F = slots masked at the
    blocks' first forwards):
        setting: the setting's name; task: index into the task list.
        block_size, threshold: the decode's settings.
        prompt_len, target, tokens, hit_eos, text, nfe, n_forced, exact_match, json_valid,
            name_correct: as `ScoredAnswer`; wall_s: seconds of the decode without the recording
            hook's own time (`clover_engine.decoding.decoder.DecodeResult.observer_s`; from a trace: its
            ``DecodeEnd.wall_s`` less its ``observer_s``).
        fields: ``score_call(...)["fields"]`` (one dict per ground-truth argument).
        write_pos: (W,) int64 -- answer position of each write (only writes at or before the
            first EOS: text after it is dropped).
        write_token: (W,) int64; write_conf: (W,) float32 confidence when written (NaN for
            EOS-filled slots); write_kind: (W,) int8, `KIND_ACCEPTED` / `KIND_FORCED` /
            `KIND_EOS`; write_slot: (W,) int64 slot index in its block (0 .. block_size - 1);
            write_iter: (W,) int64 iteration of its block that wrote it.
        step_masked: (S,) int64 -- masked slots when the forward ran (m);
        step_passed: (S,) int64 -- masked slots whose confidence reached the threshold (k);
        step_forced: (S,) bool -- the iteration ended with a forced fill;
        step_block: (S,) int64 -- block index of the iteration.
        first_pos, first_token, first_conf, first_block: (F,) int64 / int64 / float32 / int64 --
            for each of the F slots masked at a block's first forward (slots past the answer's
            end included): its answer position, argmax token, confidence and block index.
    """

    setting: str
    task: int
    block_size: int
    threshold: float
    fields: list = field(default_factory=list)
    write_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    write_token: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    write_conf: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    write_kind: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    write_slot: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    write_iter: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    step_masked: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    step_passed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    step_forced: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    step_block: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    first_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    first_token: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    first_conf: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    first_block: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def answer(self) -> np.ndarray:
        """(G or G + 1,) int64 -- the decoded answer as positions: `tokens`, then the EOS if
        the decode stopped at one."""
        eos = self.target[-1:] if self.hit_eos else self.target[:0]
        return np.concatenate([self.tokens, eos]).astype(np.int64)

    @property
    def answer_correct(self) -> np.ndarray:
        """(len(answer),) bool -- each answer token is part of the best alignment with the target
        (`difflib.SequenceMatcher` matching blocks, no junk heuristic)."""
        ans = self.answer.tolist()
        ok = np.zeros(len(ans), bool)
        for m in difflib.SequenceMatcher(None, ans, self.target.tolist(), autojunk=False).get_matching_blocks():
            ok[m.a:m.a + m.size] = True
        return ok

    @property
    def write_correct(self) -> np.ndarray:
        """(W,) bool -- each write is right (`answer_correct` at its answer position)."""
        return self.answer_correct[self.write_pos]


def _cat(parts: list, dtype) -> np.ndarray:
    """Concatenate 1-D arrays as `dtype` (an empty array of it when there are none)."""
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


def _collect(run_fields: dict, threshold: float, prompt_len: int):
    """A decoder hook filling the write / step arrays of a `TaskRun` from `StepEvent`s."""
    pos, tok, conf, kind, slot, it = [], [], [], [], [], []
    masked, passed, forced, block = [], [], [], []
    f_pos, f_tok, f_conf, f_block = [], [], [], []

    def hook(ev) -> None:
        if not isinstance(ev, StepEvent):
            return
        mb = np.asarray(ev.masked_before, bool)
        c = np.asarray(ev.confidence, np.float32)
        masked.append(int(mb.sum()))
        passed.append(int((mb & (np.nan_to_num(c, nan=-1.0) >= threshold)).sum()))
        forced.append(bool(np.asarray(ev.forced).any()))
        block.append(int(ev.block_index))
        if ev.step_index == 0:  # the block's first forward: every generation slot masked
            s0 = np.flatnonzero(mb)
            f_pos.append(ev.position_start + s0 - prompt_len)
            f_tok.append(np.asarray(ev.candidate, np.int64)[s0])
            f_conf.append(c[s0])
            f_block.append(np.full(len(s0), int(ev.block_index), np.int64))
        for code, mask in ((KIND_ACCEPTED, ev.accepted), (KIND_FORCED, ev.forced), (KIND_EOS, ev.eos_filled)):
            s = np.flatnonzero(np.asarray(mask, bool))
            pos.append(ev.position_start + s - prompt_len)
            tok.append(np.asarray(ev.tokens, np.int64)[s])
            conf.append(c[s] if code != KIND_EOS else np.full(len(s), np.nan, np.float32))
            kind.append(np.full(len(s), code, np.int8))
            slot.append(s.astype(np.int64))
            it.append(np.full(len(s), int(ev.step_index), np.int64))

    def finish(n_answer: int) -> None:
        p = _cat(pos, np.int64)
        keep = p < n_answer  # writes after the first EOS are dropped text
        run_fields.update(
            write_pos=p[keep], write_token=_cat(tok, np.int64)[keep], write_conf=_cat(conf, np.float32)[keep],
            write_kind=_cat(kind, np.int8)[keep], write_slot=_cat(slot, np.int64)[keep],
            write_iter=_cat(it, np.int64)[keep],
            step_masked=np.asarray(masked, np.int64), step_passed=np.asarray(passed, np.int64),
            step_forced=np.asarray(forced, bool), step_block=np.asarray(block, np.int64),
            first_pos=_cat(f_pos, np.int64), first_token=_cat(f_tok, np.int64), first_conf=_cat(f_conf, np.float32),
            first_block=_cat(f_block, np.int64))

    return hook, finish


def decode_task(model, tokenizer, task, config, setting: str = "", index: int = 0,
                score: Callable | None = None) -> TaskRun:
    """Decode one `clover_engine.data.agent.CallTurn` with `config` and score it.

    Args:
        model, tokenizer: as `clover_engine.decoding.decoder.BlockDecoder` takes them.
        task: a `CallTurn` (``prompt``, ``target``).
        config: an `clover_engine.decoding.decoder.DecodeConfig`.
        setting, index: labels stored in the run.
        score: ``score(text, task)`` returning ``exact_match``, ``json_valid``, ``name_correct`` and
            ``fields`` (default `clover_engine.data.agent.score_call`; e.g. `clover_engine.data.open_tools.score_turn`).

    Returns:
        A `TaskRun`.
    """
    dec = BlockDecoder(model, tokenizer, config)
    prompt_ids = dec.encode_prompt(model_input(task.prompt, model).text)  # the one prompt rule
    extra: dict = {}
    hook, finish = _collect(extra, config.threshold, len(prompt_ids))
    r = dec.generate(prompt_ids, hooks=[hook], record_trace=False)
    hit_eos = r.stop_reason == "eos"
    finish(len(r.tokens) + int(hit_eos))
    return _task_run(task, tokenizer, setting, index, config.block_size, config.threshold, len(prompt_ids),
                     r.tokens, hit_eos, r.text, r.nfe, r.n_forced, r.wall_s - r.observer_s, extra, score)


def _task_run(task, tokenizer, setting, index, block_size, threshold, prompt_len, tokens, hit_eos, text, nfe,
              n_forced, wall_s, extra, score: Callable | None = None) -> TaskRun:
    """A `TaskRun` from a finished decode's numbers and its `_collect` arrays, scored by `score`
    (default `score_call`)."""
    verdicts, fields = score_answer(text, task, tokenizer, score)
    return TaskRun(
        setting=setting, task=index, block_size=int(block_size), threshold=float(threshold),
        prompt_len=int(prompt_len), tokens=np.asarray(tokens, np.int64), hit_eos=hit_eos, nfe=int(nfe),
        n_forced=int(n_forced), wall_s=float(wall_s), fields=fields, **verdicts, **extra)


def task_run_from_trace(trace, task, tokenizer, setting: str = "", index: int = 0) -> TaskRun:
    """The `TaskRun` of a decode recorded as an `clover_engine.recording.trace.Trace` (e.g. one that `clover_engine.sweep`
    saved under ``traces/`` and `clover_engine.recording.trace.Trace.load` read back), without decoding again.

    The trace's `StepEvent`s are replayed through the same collector `decode_task` hooks into a
    live decode, so a trace of the same decode gives the same `TaskRun` (wall time aside: the
    trace's ``DecodeEnd.wall_s`` less its ``observer_s``); the text is ``tokenizer.decode`` of the generated tokens (what
    the decoder returns), scored again by `clover_engine.data.agent.score_call`.

    Args:
        trace: a finished `Trace` of a `BlockDecoder` decode (its ``decode_config`` holds
            ``block_size`` and ``threshold``, ``prompt_ids`` the prompt).
        task: the `clover_engine.data.agent.CallTurn` that was decoded (its target and scoring).
        tokenizer: the model's tokenizer (the target's ids and the text).
        setting, index: labels stored in the run.

    Returns:
        A `TaskRun`.

    Raises:
        ValueError: the trace holds no finished decode (no `DecodeEnd`), no decode config or
            no prompt.
    """
    end, cfg = trace.decode_end, trace.decode_config or {}
    if end is None or trace.prompt_ids is None or "threshold" not in cfg or "block_size" not in cfg:
        raise ValueError(f"{trace!r} is not a finished BlockDecoder decode (needs a DecodeEnd, the prompt ids "
                         "and a decode config with block_size and threshold)")
    extra: dict = {}
    hook, finish = _collect(extra, cfg["threshold"], len(trace.prompt_ids))
    for ev in trace.steps:
        hook(ev)
    tokens = np.asarray(end.tokens, np.int64).tolist()
    hit_eos = end.stop_reason == "eos"
    finish(len(tokens) + int(hit_eos))
    return _task_run(task, tokenizer, setting, index, cfg["block_size"], cfg["threshold"], len(trace.prompt_ids),
                     tokens, hit_eos, tokenizer.decode(tokens), end.nfe, end.n_forced, end.wall_s - end.observer_s,
                     extra)


def decode_tasks(model, tokenizer, tasks: Sequence, settings: Mapping[str, object],
                 progress: Callable[[int, int], None] | None = None) -> dict[str, list[TaskRun]]:
    """Decode every task in every setting, interleaved: task 0 in each setting, then task 1, ...

    Args:
        tasks: `CallTurn` list (e.g. ``eval_tasks(n=40)``).
        settings: ``{name: DecodeConfig}``, in the order to run them.
        progress: optional ``progress(done, total)`` called after each decode.

    Returns:
        ``{name: [TaskRun per task, in task order]}``.

    Raises:
        ValueError: no settings or no tasks.
    """
    if not settings or not len(tasks):
        raise ValueError(f"need at least one setting and one task, got {len(settings)} settings, {len(tasks)} tasks")
    out: dict[str, list[TaskRun]] = {name: [] for name in settings}
    total, done = len(tasks) * len(settings), 0
    for i, task in enumerate(tasks):
        for name, cfg in settings.items():
            out[name].append(decode_task(model, tokenizer, task, cfg, setting=name, index=i))
            done += 1
            if progress is not None:
                progress(done, total)
    return out
