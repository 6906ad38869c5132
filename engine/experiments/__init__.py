"""Measurements behind the tutorial notebooks (``notebooks/01`` to ``04``).

Decode held-out agent tasks (`engine.data.agent.eval_tasks`) in several decode settings on
the same prompts, keep what every forward wrote (`TaskRun`), and reduce the runs to the
numbers the notebooks draw and assert:

* `decode_tasks` -- each task in each setting, interleaved task by task (so a busy machine
  slows every setting alike and the tokens/s of the settings compare);
* `task_run_from_trace` -- the same `TaskRun` rebuilt from a saved trace (an `engine.sweep`
  decode), with no decode;
* `summarize` -- exact match, field accuracy, tokens per forward, NFE, forced fills, tokens/s;
* `calibration` -- wrong share among written tokens by the confidence at which they were
  written;
* `slot_errors` -- error rate of the decoded answer by slot index (absolute position mod
  block_size); `distance_errors` -- of the writes by distance from the last clean token
  (`clean_distance`); `first_forward_errors` -- the same for the argmax of each block's first
  forward (every slot masked at once);
* `forced_fill_table` / `forced_fill_excess` / `independent_forced_fill` -- forced fills per
  iteration beside what independent slots would give, ``(1 - p) ** m``;
* `knee_index` -- the knee of a trade-off curve.

A decoded token is *right* when it is part of the best alignment of the decoded answer with
the target (`difflib.SequenceMatcher` matching blocks; the target is the ground-truth
completion ``<tool_call>{...}</tool_call><|im_end|>``, tokenized -- prompt and target
tokenize apart exactly, as `engine.data.agent` writes them). Aligning, not comparing
position by position, keeps one dropped or doubled character from marking everything after
it wrong. A first-forward prediction (`first_forward_errors`) is compared position by
position, in blocks whose history is the target's. Everything but wall time is
deterministic: greedy decoding of fixed tasks.

Terms (docs/architecture.md §5): *iteration* = one forward of the current block; NFE =
forwards per answer; tokens per forward = generated tokens / NFE; *forced fill* = the
single most confident masked slot written because none reached the threshold.

Tests: ``.venv/bin/python -m pytest tests/engine/test_experiments.py -q``
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]

KIND_ACCEPTED, KIND_FORCED, KIND_EOS = 0, 1, 2
"""`TaskRun.write_kind` codes: accepted by the policy, forced fill (or ``max_steps``), EOS-filled."""


def bundled_model_dir() -> Path:
    """The bundled model's directory (``models/clover-tiny`` of this checkout), whatever the
    working directory (a notebook runs in ``notebooks/``)."""
    from engine.checkpoint import DEFAULT_MODEL_DIR

    return REPO_ROOT / DEFAULT_MODEL_DIR


def load_bundled(model_dir: str | Path | None = None, threads: int | None = 1):
    """Load a model and its tokenizer for a measurement.

    Args:
        model_dir: a checkpoint directory; a relative path is taken from the repository
            root, not the working directory (default: `bundled_model_dir`).
        threads: torch CPU threads to set (None: leave torch's setting alone). One thread
            is the right count on a small shared machine (see `engine.threads`).

    Returns:
        ``(model, tokenizer)``, the model in eval mode.

    Raises:
        ValueError: no checkpoint there (from `engine.checkpoint.load_model`, naming the path).
    """
    import torch

    from engine.checkpoint import load_model, load_tokenizer

    if threads is not None:
        torch.set_num_threads(int(threads))
    path = bundled_model_dir() if model_dir is None else Path(model_dir)
    if not path.is_absolute():
        path = REPO_ROOT / path
    return load_model(path), load_tokenizer(path)


@dataclass
class TaskRun:
    """One decode of one task in one setting, with every write it made.

    Attributes (W = written answer slots, S = iterations = NFE, F = slots masked at the
    blocks' first forwards):
        setting: the setting's name; task: index into the task list.
        block_size, threshold: the decode's settings.
        prompt_len: P, prompt tokens (answer position j sits at absolute position P + j).
        target: (A,) int64 -- the ground-truth answer ids, ending with EOS.
        tokens: (G,) int64 -- generated ids up to and excluding the first EOS.
        hit_eos: the decode stopped at an EOS (which is then answer position G).
        text: the decoded text; nfe, n_forced: forwards and forced slots; wall_s: seconds of the
            decode without the recording hook's own time (`engine.decoding.decoder.DecodeResult.observer_s`;
            from a trace: its ``DecodeEnd.wall_s`` less its ``observer_s``).
        exact_match, json_valid, name_correct: `engine.data.agent.score_call`'s verdicts.
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
    from engine.recording.events import StepEvent

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
    """Decode one `engine.data.agent.CallTurn` with `config` and score it.

    Args:
        model, tokenizer: as `engine.decoding.decoder.BlockDecoder` takes them.
        task: a `CallTurn` (``prompt``, ``target``).
        config: an `engine.decoding.decoder.DecodeConfig`.
        setting, index: labels stored in the run.
        score: ``score(text, task)`` returning ``exact_match``, ``json_valid``, ``name_correct`` and
            ``fields`` (default `engine.data.agent.score_call`; e.g. `engine.data.open_tools.score_turn`).

    Returns:
        A `TaskRun`.
    """
    from engine.decoding.decoder import BlockDecoder
    from engine.prompting import model_input

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
    from engine.data.agent import score_call

    s = (score or score_call)(text, task)
    return TaskRun(
        setting=setting, task=index, block_size=int(block_size), threshold=float(threshold),
        prompt_len=int(prompt_len), target=np.asarray(tokenizer.encode(task.target).ids, np.int64),
        tokens=np.asarray(tokens, np.int64), hit_eos=hit_eos, text=text, nfe=int(nfe), n_forced=int(n_forced),
        wall_s=float(wall_s), exact_match=bool(s["exact_match"]), json_valid=bool(s["json_valid"]),
        name_correct=bool(s["name_correct"]), fields=s["fields"], **extra)


def task_run_from_trace(trace, task, tokenizer, setting: str = "", index: int = 0) -> TaskRun:
    """The `TaskRun` of a decode recorded as an `engine.recording.trace.Trace` (e.g. one that `engine.sweep`
    saved under ``traces/`` and `engine.recording.trace.Trace.load` read back), without decoding again.

    The trace's `StepEvent`s are replayed through the same collector `decode_task` hooks into a
    live decode, so a trace of the same decode gives the same `TaskRun` (wall time aside: the
    trace's ``DecodeEnd.wall_s`` less its ``observer_s``); the text is ``tokenizer.decode`` of the generated tokens (what
    the decoder returns), scored again by `engine.data.agent.score_call`.

    Args:
        trace: a finished `Trace` of a `BlockDecoder` decode (its ``decode_config`` holds
            ``block_size`` and ``threshold``, ``prompt_ids`` the prompt).
        task: the `engine.data.agent.CallTurn` that was decoded (its target and scoring).
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


def summarize(runs: Sequence[TaskRun]) -> dict:
    """The headline metrics of one setting's runs.

    Returns:
        dict: ``n_tasks``; ``exact_match``, ``json_valid``, ``name_correct`` (shares of tasks);
        ``field_acc`` (share of ground-truth arguments right); ``tokens_per_forward``
        (generated tokens / forwards, summed over tasks); ``nfe_mean`` (forwards per
        answer); ``forced_fill_rate`` (forced slots / generated tokens);
        ``forced_iteration_rate`` (iterations ending in a forced fill / iterations);
        ``token_error_rate`` (share of answer tokens outside the alignment); ``wall_s`` (summed
        seconds); ``tokens_per_s`` (generated tokens / wall_s; the only machine-dependent number).

    Raises:
        ValueError: no runs.
    """
    if not runs:
        raise ValueError("summarize needs at least one TaskRun")
    n = len(runs)
    toks = sum(len(r.tokens) for r in runs)
    nfe = sum(r.nfe for r in runs)
    wall = sum(r.wall_s for r in runs)
    fields = [f["correct"] for r in runs for f in r.fields]
    steps = np.concatenate([r.step_forced for r in runs])
    ans_ok = sum(int(r.answer_correct.sum()) for r in runs)
    ans_n = sum(len(r.answer) for r in runs)
    return {
        "n_tasks": n,
        "exact_match": sum(r.exact_match for r in runs) / n,
        "json_valid": sum(r.json_valid for r in runs) / n,
        "name_correct": sum(r.name_correct for r in runs) / n,
        "field_acc": sum(fields) / len(fields) if fields else math.nan,
        "token_error_rate": 1 - ans_ok / ans_n if ans_n else math.nan,
        "tokens_per_forward": toks / nfe if nfe else 0.0,
        "nfe_mean": nfe / n,
        "forced_fill_rate": sum(r.n_forced for r in runs) / toks if toks else math.nan,
        "forced_iteration_rate": float(steps.mean()) if len(steps) else math.nan,
        "wall_s": wall,
        "tokens_per_s": toks / wall if wall > 0 else math.nan,
    }


def calibration(runs: Sequence[TaskRun], edges: Sequence[float] = (0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 1.0)) -> dict:
    """Wrong share among written tokens, binned by the confidence at which each was written.

    Every accepted and forced write counts (EOS-filled slots have no confidence and are left
    out); a write is wrong when it is not part of its answer's alignment with the target
    (`TaskRun.write_correct`).

    Args:
        runs: `TaskRun`s (any settings, pooled).
        edges: increasing bin edges in [0, 1]; bin i is ``[edges[i], edges[i+1])``, the last
            one closed (1.0 falls in it).

    Returns:
        dict of arrays of length ``len(edges) - 1``: ``lo``, ``hi`` (edges), ``n`` (writes),
        ``n_wrong``, ``wrong_share`` (NaN for an empty bin), ``mean_conf``, ``n_forced``
        (of the writes, how many were forced fills).

    Raises:
        ValueError: fewer than two edges, edges not increasing, or outside [0, 1].
    """
    e = np.asarray(edges, np.float64)
    if e.ndim != 1 or len(e) < 2 or np.any(np.diff(e) <= 0) or e[0] < 0 or e[-1] > 1:
        raise ValueError(f"edges must be >= 2 increasing numbers in [0, 1], got {list(edges)}")
    conf = np.concatenate([r.write_conf for r in runs]).astype(np.float64) if runs else np.zeros(0)
    wrong = ~np.concatenate([r.write_correct for r in runs]) if runs else np.zeros(0, bool)
    forced = np.concatenate([r.write_kind == KIND_FORCED for r in runs]) if runs else np.zeros(0, bool)
    keep = ~np.isnan(conf)
    conf, wrong, forced = conf[keep], wrong[keep], forced[keep]
    b = np.clip(np.searchsorted(e, conf, side="right") - 1, 0, len(e) - 2)
    k = len(e) - 1
    n = np.bincount(b, minlength=k)
    n_wrong = np.bincount(b, weights=wrong, minlength=k).astype(np.int64)
    csum = np.bincount(b, weights=conf, minlength=k)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"lo": e[:-1], "hi": e[1:], "n": n, "n_wrong": n_wrong,
                "wrong_share": np.where(n > 0, n_wrong / np.maximum(n, 1), np.nan),
                "mean_conf": np.where(n > 0, csum / np.maximum(n, 1), np.nan),
                "n_forced": np.bincount(b, weights=forced, minlength=k).astype(np.int64)}


def slot_errors(runs: Sequence[TaskRun], block_size: int = 32) -> dict:
    """Error rate of the decoded answers by slot index: every answer token, grouped by its
    absolute position mod `block_size` (the slot it occupies in a block decode of that size,
    whatever setting decoded it -- so a block_size-1 control is counted on the same slots).

    A token is an error when it is not part of the answer's alignment with the target
    (`TaskRun.answer_correct`; the EOS counts as a token).

    Args:
        runs: `TaskRun`s of one setting.
        block_size: the slot grouping (>= 1).

    Returns:
        dict: ``n`` (block_size,) int64 answer tokens per slot index, ``errors``
        (block_size,) int64, ``rate`` (block_size,) float64 (NaN where n == 0).

    Raises:
        ValueError: block_size < 1.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    pairs = [((r.prompt_len + np.arange(len(r.answer))) % block_size, ~r.answer_correct) for r in runs]
    return _by_slot(pairs, block_size)


def clean_distance(run: TaskRun) -> np.ndarray:
    """Distance of each write from the last clean token before it when it was written.

    A token is clean for a write when it was fixed before the forward that wrote it: the
    prompt, earlier blocks, and slots of the same block written at an earlier iteration
    (slots written by the same forward were masked when it predicted them). Distance 1 is
    the slot right after a clean token -- every write of a block_size-1 decode; a block's
    first forward writing slot j of an empty block has distance j + 1.

    Args:
        run: a `TaskRun` (blocks are aligned to absolute positions: a write at answer position
            a in slot s belongs to the block starting at answer position ``a - s``).

    Returns:
        (W,) int64 distances >= 1, one per write (`TaskRun.write_pos` order).
    """
    pos, slot, it = run.write_pos, run.write_slot, run.write_iter
    out = np.zeros(len(pos), np.int64)
    start = pos - slot  # the block's first answer position (negative: the block begins in the prompt)
    for i in range(len(pos)):
        earlier = (start == start[i]) & (it < it[i]) & (pos < pos[i])
        last = pos[earlier].max() if earlier.any() else max(int(start[i]), 0) - 1
        out[i] = pos[i] - last
    return out


def distance_errors(runs: Sequence[TaskRun], edges: Sequence[int] = (1, 2, 3, 5, 9, 17, 33)) -> dict:
    """Wrong share of the written tokens by their distance from the last clean token
    (`clean_distance`); accepted and forced writes count, EOS-filled slots do not.

    Args:
        runs: `TaskRun`s (pooled); edges: increasing integer bin edges >= 1, bin i is
            ``[edges[i], edges[i+1])`` (distances past the last edge fall in the last bin).

    Returns:
        dict of arrays of length ``len(edges) - 1``: ``lo``, ``hi``, ``n``, ``n_wrong``,
        ``wrong_share`` (NaN for an empty bin).

    Raises:
        ValueError: fewer than two edges, not increasing, or below 1.
    """
    e = np.asarray(edges, np.int64)
    if e.ndim != 1 or len(e) < 2 or np.any(np.diff(e) <= 0) or e[0] < 1:
        raise ValueError(f"edges must be >= 2 increasing integers >= 1, got {list(edges)}")
    keep = [r.write_kind != KIND_EOS for r in runs]
    d = np.concatenate([clean_distance(r)[k] for r, k in zip(runs, keep)]) if runs else np.zeros(0, np.int64)
    wrong = np.concatenate([~r.write_correct[k] for r, k in zip(runs, keep)]) if runs else np.zeros(0, bool)
    b = np.clip(np.searchsorted(e, d, side="right") - 1, 0, len(e) - 2)
    k = len(e) - 1
    n = np.bincount(b, minlength=k)
    n_wrong = np.bincount(b, weights=wrong, minlength=k).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"lo": e[:-1], "hi": e[1:], "n": n, "n_wrong": n_wrong,
                "wrong_share": np.where(n > 0, n_wrong / np.maximum(n, 1), np.nan)}


def first_forward_errors(runs: Sequence[TaskRun], block_size: int = 32) -> dict:
    """Error rate of each block's first forward by slot index: the argmax of every masked
    slot when the block starts (all generation slots masked at once), against the target token
    at that position, grouped by absolute position mod `block_size`.

    Only blocks whose history is the target's count (the answer before the block equals the
    target there, position by position; always true of the first block), so a position is
    the one the target puts there. With block_size-1 runs this is the teacher-forced
    next-token error on the same slot grouping. Positions past the target's end are errors.

    Args:
        runs: `TaskRun`s of one setting; block_size: the slot grouping (>= 1).

    Returns:
        dict like `slot_errors`: ``n``, ``errors``, ``rate`` of shape (block_size,).

    Raises:
        ValueError: block_size < 1.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    pairs = []
    for r in runs:
        ans = r.answer
        for b in np.unique(r.first_block):
            sel = r.first_block == b
            pos, tok = r.first_pos[sel], r.first_token[sel]
            q = int(pos.min())
            if len(ans) < q or not np.array_equal(ans[:q], r.target[:q]):
                continue  # the block starts from a wrong history
            inside = pos < len(r.target)
            wrong = np.ones(len(pos), bool)
            wrong[inside] = r.target[pos[inside]] != tok[inside]
            pairs.append(((r.prompt_len + pos) % block_size, wrong))
    return _by_slot(pairs, block_size)


def _by_slot(pairs, block_size: int) -> dict:
    """Sum ``(slot, wrong)`` array pairs into ``n``, ``errors``, ``rate`` per slot index."""
    n = np.zeros(block_size, np.int64)
    err = np.zeros(block_size, np.int64)
    for slot, wrong in pairs:
        n += np.bincount(slot, minlength=block_size)
        err += np.bincount(slot, weights=wrong, minlength=block_size).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(n > 0, err / np.maximum(n, 1), np.nan)
    return {"n": n, "errors": err, "rate": rate}


def grouped_rate(errors: np.ndarray, n: np.ndarray, group: int) -> np.ndarray:
    """Pool per-slot counts into consecutive groups of `group` slots: (len // group,) rates
    (``errors.sum / n.sum`` per group; NaN for an empty group).

    Raises:
        ValueError: shapes differ, or `group` does not divide their length.
    """
    errors, n = np.asarray(errors), np.asarray(n)
    if errors.shape != n.shape or errors.ndim != 1 or group < 1 or len(n) % group:
        raise ValueError(f"need equal 1-D shapes divisible by group={group}, got {errors.shape} and {n.shape}")
    e, m = errors.reshape(-1, group).sum(1), n.reshape(-1, group).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(m > 0, e / np.maximum(m, 1), np.nan)


def independent_forced_fill(p, m=32):
    """Probability that no masked slot reaches the threshold when each of `m` slots passes
    independently with probability `p`: ``(1 - p) ** m`` (a forced fill follows).

    Args:
        p: per-slot pass probability in [0, 1] (scalar or array).
        m: masked slots (scalar or array, >= 0).

    Raises:
        ValueError: p outside [0, 1] or m < 0.
    """
    p, m = np.asarray(p, np.float64), np.asarray(m, np.float64)
    if np.any((p < 0) | (p > 1)) or np.any(m < 0):
        raise ValueError(f"need 0 <= p <= 1 and m >= 0, got p={p}, m={m}")
    out = (1.0 - p) ** m
    return float(out) if out.ndim == 0 else out


def forced_fill_table(runs: Sequence[TaskRun], edges: Sequence[float] = (0.0, 0.05, 0.1, 0.2, 0.5, 1.0),
                      min_masked: int = 2, max_masked: int | None = None) -> dict:
    """Forced fills per iteration, binned by the per-slot pass rate of the rest of the decode.

    For iteration i of a decode with m_i masked slots of which k_i reached the threshold,
    the pass rate is measured *leaving that iteration out*:
    ``p_i = (sum_j k_j - k_i) / (sum_j m_j - m_i)`` over the decode's iterations j (binning
    by the iteration's own k_i / m_i would be circular: a forced fill is k_i == 0).
    Independent slots would give a forced fill with probability ``(1 - p_i) ** m_i``.
    Only iterations with ``min_masked <= m_i <= max_masked`` count (one masked slot is forced
    or accepted, nothing to compare; ``max_masked=None``: no upper bound).

    Args:
        runs: `TaskRun`s (block decodes; pooled).
        edges: increasing bin edges of p in [0, 1] (last bin closed).
        min_masked, max_masked: the range of m_i counted (min_masked >= 1).

    Returns:
        dict of arrays of length ``len(edges) - 1``: ``lo``, ``hi``, ``n`` (iterations),
        ``mean_p``, ``mean_masked``, ``measured`` (share of the iterations that ended in a
        forced fill), ``independent`` (mean of ``(1 - p_i) ** m_i``), ``n_forced``; NaN
        where n == 0.

    Raises:
        ValueError: bad edges or min_masked < 1.
    """
    e = np.asarray(edges, np.float64)
    if e.ndim != 1 or len(e) < 2 or np.any(np.diff(e) <= 0) or e[0] < 0 or e[-1] > 1:
        raise ValueError(f"edges must be >= 2 increasing numbers in [0, 1], got {list(edges)}")
    p, m, f = _iteration_pass_rates(runs, min_masked, max_masked)
    k = len(e) - 1
    b = np.clip(np.searchsorted(e, p, side="right") - 1, 0, k - 1)
    n = np.bincount(b, minlength=k)
    ind = (1.0 - p) ** m

    def mean(w):
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, np.bincount(b, weights=w, minlength=k) / np.maximum(n, 1), np.nan)

    return {"lo": e[:-1], "hi": e[1:], "n": n, "mean_p": mean(p), "mean_masked": mean(m),
            "measured": mean(f.astype(np.float64)), "independent": mean(ind),
            "n_forced": np.bincount(b, weights=f, minlength=k).astype(np.int64)}


def _iteration_pass_rates(runs: Sequence[TaskRun], min_masked: int, max_masked: int | None):
    """(p, m, forced) per counted iteration: leave-one-out pass rate, masked slots, forced fill
    (see `forced_fill_table`)."""
    if min_masked < 1:
        raise ValueError(f"min_masked must be >= 1, got {min_masked}")
    ps, ms, fs = [], [], []
    for r in runs:
        m, k = r.step_masked.astype(np.float64), r.step_passed.astype(np.float64)
        rest = m.sum() - m
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.where(rest > 0, (k.sum() - k) / np.maximum(rest, 1), np.nan)
        keep = (r.step_masked >= min_masked) & ~np.isnan(p)
        if max_masked is not None:
            keep &= r.step_masked <= max_masked
        ps.append(p[keep]), ms.append(m[keep]), fs.append(r.step_forced[keep])
    return _cat(ps, np.float64), _cat(ms, np.float64), _cat(fs, bool)


def forced_fill_excess(runs: Sequence[TaskRun], min_masked: int = 2, max_masked: int | None = None) -> dict:
    """Forced fills counted against what independent slots would give, over the iterations
    `forced_fill_table` counts.

    Under independence, iteration i ends in a forced fill with probability
    ``q_i = (1 - p_i) ** m_i``; the count of forced fills then has mean ``sum q_i`` and
    standard deviation ``sqrt(sum q_i (1 - q_i))`` (a sum of independent Bernoulli draws).

    Returns:
        dict: ``n`` iterations, ``measured`` forced fills, ``expected`` (sum q_i), ``sd``,
        ``z`` = (measured - expected) / sd (NaN when sd == 0), ``ratio`` = measured / expected.

    Raises:
        ValueError: min_masked < 1.
    """
    p, m, f = _iteration_pass_rates(runs, min_masked, max_masked)
    q = (1.0 - p) ** m
    exp, sd = float(q.sum()), float(np.sqrt((q * (1 - q)).sum()))
    meas = int(f.sum())
    return {"n": len(f), "measured": meas, "expected": exp, "sd": sd,
            "z": (meas - exp) / sd if sd > 0 else math.nan, "ratio": meas / exp if exp > 0 else math.nan}


def knee_index(x: Sequence[float], y: Sequence[float], bend: str = "above") -> int:
    """The knee of a curve, after Satopaa et al., "Finding a 'Kneedle' in a Haystack" (2011):
    scale x and y to [0, 1] over their ranges and return the index of the interior point
    farthest from the straight line (chord) through the first and last points, on one side.

    For a trade-off such as accuracy (y) against tokens per forward (x) the knee is the
    point farthest *above* the chord: past it, more of one buys little of the other.

    Args:
        x, y: equal-length sequences, >= 3 points, x strictly monotone (either direction).
        bend: ``"above"`` (y highest over the chord, a concave bend), ``"below"`` (lowest
            under it, a convex bend) or ``"either"`` (farthest on either side).

    Returns:
        An index in ``1 .. len(x) - 2`` (end points are never the knee; ties go to the lower
        index; when no interior point lies on the asked side, the one closest to it).

    Raises:
        ValueError: fewer than 3 points, unequal lengths, NaN, x not strictly monotone, or an
            unknown `bend`.
    """
    if bend not in ("above", "below", "either"):
        raise ValueError(f"bend must be 'above', 'below' or 'either', got {bend!r}")
    xa, ya = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if xa.shape != ya.shape or xa.ndim != 1 or len(xa) < 3:
        raise ValueError(f"need two equal 1-D sequences of >= 3 points, got {xa.shape} and {ya.shape}")
    if np.isnan(xa).any() or np.isnan(ya).any():
        raise ValueError("x and y must not hold NaN")
    d = np.diff(xa)
    if not (np.all(d > 0) or np.all(d < 0)):
        raise ValueError("x must be strictly monotone")

    def unit(a):
        span = a.max() - a.min()
        return (a - a.min()) / span if span > 0 else np.zeros_like(a)

    xs, ys = unit(xa), unit(ya)
    chord = ys[0] + (ys[-1] - ys[0]) * (xs - xs[0]) / (xs[-1] - xs[0])
    over = (ys - chord)[1:-1]  # vertical distance; the perpendicular one is proportional to it
    score = {"above": over, "below": -over, "either": np.abs(over)}[bend]
    return int(1 + np.argmax(score))
