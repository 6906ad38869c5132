"""Sweeps: decode settings x task sets x models -> one results table, on one machine or a Ray cluster.

    python -m engine.sweep --models models/clover-tiny,random:clover-test --tasks agent-eval:20 \\
        --block-size 8,32 --threshold 0.8,0.95 --memory-mode state,state+window --max-new-tokens 64 \\
        --out runs/sweep [--workers 2 | --ray local|auto|ADDRESS] [--threads N] [--no-traces] [--interleave]

Every combination of the comma lists (``--block-size``, ``--threshold``, ``--policy``,
``--memory-mode``, ...) is one *setting*; every (model, setting, task) is one *cell*, one
`engine.decoding.decoder.BlockDecoder.generate` call. The output folder holds

* ``results.parquet`` -- one row per cell (`RESULT_SCHEMA`): model, setting, task, generated
  tokens, NFE, tokens per forward, forced fills, stop reason, text, the agent scores where the
  task is checkable (exact match and field accuracy as `engine.data.agent.score_call` gives
  them), the cost model's bytes and FLOPs, the path of the saved trace (relative to the
  folder), and the volatile columns `VOLATILE_COLUMNS` (wall time, worker);
* ``summary.parquet`` -- one row per (model, task set, setting), printed at the end;
* ``traces/<cell_id>.parquet`` -- each cell's `engine.recording.trace.Trace` (unless ``--no-traces``).

Task sets: ``agent-eval:N`` (the first N held-out tool-call tasks of
`engine.data.agent.eval_tasks`, scored), ``chat-eval:N`` (the first N fixed chat prompts of
`engine.data.chat_prompts.eval_prompts`, wrapped in a user turn for chat models, unscored) and
``prompts:FILE`` (one prompt per line, ``#`` lines skipped, unscored). Models: checkpoint
directories (`engine.checkpoint.load_model`) or ``random:PRESET[:SCALE]`` (`engine.backbones.clover.model.random_model`
with seed 0 and weight scale SCALE, default 1, with the byte tokenizer).

Execution. Cells run serially (``--workers 1``), on a local process pool (``--workers N``,
``spawn`` processes), or on Ray (``--ray local`` starts a local Ray instance, ``--ray auto``
joins the running cluster, ``--ray ADDRESS`` a given one): one actor per worker loads each
model once and runs cells one at a time; an actor that dies is restarted and its cell retried
(``max_restarts`` / ``max_task_retries``), and a cell whose actor cannot come back goes to
another. Checkpoint paths must exist on every node; prompts travel with the cells, and traces
come back to the driver, which alone writes the output folder.

Resuming. The results table is rewritten (atomically) as cells finish; a re-run with the same
``--out`` reads it and skips every cell already there (cells are keyed by `cell_id`, a hash of
model, task set, task index, prompt and the full `DecodeConfig`). Decoding is greedy and each
cell is seeded from its id, so rows are identical whatever the number of workers or the backend;
rows are written in grid order. Only the `VOLATILE_COLUMNS` differ between runs. ``--interleave``
hands the cells out task by task (task 0 in every setting, then task 1, ...) so a changing machine
load slows every setting alike; the rows are the same. A folder keeps the rows of every grid run into
it: `grid_rows` picks one grid's. A cell id does not cover the checkpoint's weights or the code, so
`fingerprint` (a hash of files) can name a folder per version of them.

``--threads`` is per worker (default: ``OMP_NUM_THREADS`` if set, else
`engine.threads.default_threads` divided among the workers, at least 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

RESULTS_NAME = "results.parquet"
SUMMARY_NAME = "summary.parquet"
TRACES_DIR = "traces"
VOLATILE_COLUMNS = ("wall_s", "worker")
"""Columns that change from run to run (timing, which worker ran the cell); every other column
is identical whatever the backend and the number of workers."""

GRID_AXES: dict[str, type] = {
    "block_size": int, "threshold": float, "policy": str, "memory_mode": str, "max_new_tokens": int,
    "max_steps": int, "tokens_per_step": int, "max_entropy": float, "factor": float,
    "repetition_penalty": float, "eos_bias_soft_limit": int,
}
"""`DecodeConfig` fields a sweep can vary (CLI: ``--block-size 8,32`` ...), with their types."""

RESULT_SCHEMA = pa.schema([
    ("cell_id", pa.string()), ("model", pa.string()), ("task_set", pa.string()), ("task_id", pa.int64()),
    ("setting", pa.string()), ("block_size", pa.int64()), ("threshold", pa.float64()), ("policy", pa.string()),
    ("memory_mode", pa.string()), ("max_new_tokens", pa.int64()), ("max_steps", pa.int64()),
    ("decode_config", pa.string()), ("prompt_tokens", pa.int64()), ("tokens", pa.int64()), ("nfe", pa.int64()),
    ("tokens_per_forward", pa.float64()), ("forced_fills", pa.int64()), ("stop_reason", pa.string()),
    ("text", pa.string()), ("exact_match", pa.bool_()), ("json_valid", pa.bool_()), ("name_correct", pa.bool_()),
    ("fields_correct", pa.int64()), ("fields_total", pa.int64()), ("field_acc", pa.float64()),
    ("bytes_read", pa.float64()), ("flops", pa.float64()), ("trace_path", pa.string()),
    ("wall_s", pa.float64()), ("worker", pa.string()),
])
"""One row per decode. ``decode_config`` is the full `DecodeConfig` as JSON; the score columns
(``exact_match`` ... ``field_acc``) are null for unscored task sets, ``bytes_read`` / ``flops``
(cost model estimates, bytes and FLOPs summed over the forwards) and ``trace_path`` are null
without traces; ``wall_s`` is the decode's wall time in seconds."""


# ----------------------------------------------------------------------------- tasks and models

@dataclass(frozen=True)
class SweepTask:
    """One prompt of a task set.

    Attributes:
        task_set: the set's name (``agent-eval:20``); task_id: index in the set.
        prompt: the prompt text.
        kind: ``agent`` (scored against `turn`), ``chat`` (a user request: chat models get it as a
            ChatML user turn) or ``text`` (passed as is).
        turn: the `engine.data.agent.CallTurn` scored against (``agent`` only).
    """

    task_set: str
    task_id: int
    prompt: str
    kind: str
    turn: Any = None


def _count(name: str, text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"task set {name!r}: expected a count >= 1 after the colon, e.g. 'agent-eval:20'")
    return n


def load_task_set(name: str) -> list[SweepTask]:
    """The prompts of a named task set (see the module docstring for the names).

    Raises:
        ValueError: an unknown name, a count that is not an int >= 1, a missing or empty prompt file.
    """
    kind, _, arg = name.partition(":")
    if kind == "agent-eval":
        from engine.data.agent import eval_tasks

        return [SweepTask(name, i, t.prompt, "agent", t) for i, t in enumerate(eval_tasks(n=_count(name, arg)))]
    if kind == "chat-eval":
        from engine.data.chat_prompts import eval_prompts

        prompts = eval_prompts()
        n = _count(name, arg)
        if n > len(prompts):
            raise ValueError(f"task set {name!r}: only {len(prompts)} chat-eval prompts exist")
        return [SweepTask(name, i, p, "chat") for i, p in enumerate(prompts[:n])]
    if kind == "prompts":
        path = Path(arg)
        if not path.is_file():
            raise ValueError(f"task set {name!r}: no prompt file {arg!r} (one prompt per line)")
        lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if not lines:
            raise ValueError(f"task set {name!r}: {arg} holds no prompt (one per line, '#' lines skipped)")
        return [SweepTask(name, i, p, "text") for i, p in enumerate(lines)]
    raise ValueError(f"unknown task set {name!r}; expected 'agent-eval:N', 'chat-eval:N' or 'prompts:FILE'")


def load_sweep_model(spec: str):
    """``(model, tokenizer)`` for a model spec: a checkpoint directory or ``random:PRESET[:SCALE]``.

    Raises:
        ValueError: no checkpoint there, an unknown preset, a scale that is not a positive number,
            a preset the byte tokenizer does not fit, or a model `BlockDecoder` cannot drive
            (DiffusionGemma runs its own sampler).
    """
    if spec.startswith("random:"):
        from engine.backbones.clover.model import random_model
        from engine.tokenizer import byte_tokenizer

        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"model {spec!r}: expected 'random:PRESET' or 'random:PRESET:SCALE'")
        try:
            scale = float(parts[2]) if len(parts) == 3 else 1.0
        except ValueError:
            scale = -1.0
        if not scale > 0:
            raise ValueError(f"model {spec!r}: the weight scale must be a number > 0, e.g. 'random:clover-test:15'")
        model, tok = random_model(parts[1], seed=0, weight_scale=scale), byte_tokenizer()
        if model.config.vocab_size < tok.get_vocab_size() or model.config.mask_token_id != tok.token_to_id("<|mask|>"):
            raise ValueError(f"model {spec!r}: preset {parts[1]!r} does not fit the byte tokenizer "
                             "(use 'random:clover-test' or a checkpoint directory)")
        model.model_id = spec
        return model, tok
    from engine.checkpoint import load_model, load_tokenizer

    if not Path(spec).is_dir():
        raise ValueError(f"model {spec!r}: no checkpoint directory there (or use 'random:clover-test')")
    model = load_model(spec)
    from engine.backbones.base import capabilities_of

    if capabilities_of(model).revises_commits:
        raise ValueError(f"model {spec!r}: a revisable sampler (DiffusionGemma) has its own generate; "
                         "sweeps drive engine.decoding.decoder.BlockDecoder")
    return model, load_tokenizer(spec)


def _decode_config(values: dict):
    from engine.decoding.decoder import DecodeConfig

    return DecodeConfig(**values)


def settings_grid(axes: dict[str, Sequence]) -> list[dict]:
    """Every combination of the axes' values, in order (the last axis varies fastest).

    Args:
        axes: ``{DecodeConfig field: [values]}`` for fields in `GRID_AXES`.

    Returns:
        One ``{field: value}`` dict per combination (validated by `DecodeConfig`).

    Raises:
        ValueError: an unknown field, an empty value list, a repeated combination, or a value
            `DecodeConfig` refuses (its message names the field and the valid range).
    """
    bad = [k for k in axes if k not in GRID_AXES]
    if bad:
        raise ValueError(f"unknown sweep axes {bad}; expected some of {list(GRID_AXES)}")
    empty = [k for k, v in axes.items() if not len(v)]
    if empty:
        raise ValueError(f"sweep axes {empty} have no values; give at least one each")
    keys = list(axes)
    grid = [dict(zip(keys, combo)) for combo in itertools.product(*(axes[k] for k in keys))]
    for g in grid:
        try:
            _decode_config(g)
        except TypeError as e:
            raise ValueError(str(e)) from None
    if len({json.dumps(g, sort_keys=True) for g in grid}) != len(grid):
        raise ValueError(f"the sweep axes repeat a value: {axes}")
    return grid


def setting_label(values: dict) -> str:
    """``block_size=8,threshold=0.9`` -- the swept values of one setting, in axis order."""
    return ",".join(f"{k}={v}" for k, v in values.items()) or "default"


# ----------------------------------------------------------------------------- cells

@dataclass(frozen=True)
class Cell:
    """One decode of a sweep: `task` decoded by `model` with `config` (a `DecodeConfig` as a dict).

    Attributes:
        index: position in grid order (model, then setting, then task set, then task).
        cell_id: 16 hex digits, a hash of model, task set, task index, prompt and full config.
        model: the model spec; setting: `setting_label`; config: ``dataclasses.asdict(DecodeConfig)``.
        task: the `SweepTask`.
    """

    index: int
    cell_id: str
    model: str
    setting: str
    config: dict
    task: SweepTask


def make_cells(models: Sequence[str], task_sets: Sequence[str], settings: Sequence[dict]) -> list[Cell]:
    """The cells of a sweep, in grid order.

    Args:
        models: model specs (`load_sweep_model`); task_sets: task set names (`load_task_set`);
        settings: ``{field: value}`` dicts (`settings_grid`), unset fields at `DecodeConfig`'s defaults.

    Raises:
        ValueError: an empty or repeated list, or as `load_task_set` / `DecodeConfig`.
    """
    for what, xs in (("models", models), ("task sets", task_sets), ("settings", settings)):
        if not len(xs):
            raise ValueError(f"a sweep needs at least one of {what}")
        keys = [json.dumps(x, sort_keys=True) for x in xs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"the sweep's {what} repeat an entry: {list(xs)}")
    tasks = {name: load_task_set(name) for name in task_sets}
    cells = []
    for model in models:
        for values in settings:
            cfg = dataclasses.asdict(_decode_config(values))
            for name in task_sets:
                for t in tasks[name]:
                    key = json.dumps([model, name, t.task_id, t.prompt, cfg], sort_keys=True)
                    cid = hashlib.sha256(key.encode()).hexdigest()[:16]
                    cells.append(Cell(len(cells), cid, model, setting_label(values), cfg, t))
    return cells


def run_cell(cell: Cell, model, tokenizer, traces: bool = True) -> tuple[dict, bytes | None]:
    """Decode one cell and score it.

    Args:
        cell: the `Cell`; model, tokenizer: loaded from ``cell.model`` (`load_sweep_model`).
        traces: record the decode's `engine.recording.trace.Trace` (and the cost model's bytes / FLOPs).

    Returns:
        ``(row, trace_parquet_bytes)``: the row as a dict with the `RESULT_SCHEMA` columns (``worker``
        is filled by the caller), and the trace as Parquet file bytes (None without traces).
    """
    import torch

    from engine.decoding.decoder import BlockDecoder, DecodeConfig

    cfg = DecodeConfig(**cell.config)
    prompt = cell.task.prompt
    if cell.task.kind == "chat":  # a user request: the chat template where the model has one
        from engine.prompting import model_input

        prompt = model_input(prompt, model).text
    torch.manual_seed(int(cell.cell_id, 16) % (2 ** 63))
    r = BlockDecoder(model, tokenizer, cfg).generate(prompt, record_trace=traces)
    score: dict = {}
    if cell.task.kind == "agent":
        from engine.data.agent import score_call

        s = score_call(r.text, cell.task.turn)
        right = sum(bool(f["correct"]) for f in s["fields"])
        score = dict(exact_match=bool(s["exact_match"]), json_valid=bool(s["json_valid"]),
                     name_correct=bool(s["name_correct"]), fields_correct=right, fields_total=len(s["fields"]),
                     field_acc=right / len(s["fields"]) if s["fields"] else None)
    trace_bytes = None
    if traces and r.trace is not None:
        with tempfile.TemporaryDirectory() as d:
            trace_bytes = r.trace.save(Path(d) / "trace.parquet").read_bytes()
    row = dict(
        cell_id=cell.cell_id, model=cell.model, task_set=cell.task.task_set, task_id=cell.task.task_id,
        setting=cell.setting, block_size=cfg.block_size, threshold=cfg.threshold, policy=cfg.policy,
        memory_mode=cfg.memory_mode, max_new_tokens=cfg.max_new_tokens, max_steps=cfg.max_steps,
        decode_config=json.dumps(cell.config, sort_keys=True), prompt_tokens=len(r.prompt_ids),
        tokens=len(r.tokens), nfe=r.nfe, tokens_per_forward=float(r.tokens_per_forward), forced_fills=r.n_forced,
        stop_reason=r.stop_reason, text=r.text, bytes_read=r.bytes_read, flops=r.flops,
        trace_path=f"{TRACES_DIR}/{cell.cell_id}.parquet" if trace_bytes is not None else None,
        wall_s=float(r.wall_s), worker=None, **score)
    return row, trace_bytes


class CellRunner:
    """What a worker keeps: its thread count, the models it has loaded (each once), and the
    fault-injection hook.

    Args:
        threads: torch CPU threads of this worker (>= 1).
        traces: record traces (see `run_cell`).
        kill_once: test hook, ``(marker_path, cell_index)``: the first worker to start the cell of
            that index creates the marker file and exits the process at once (``os._exit``);
            later attempts find the marker and run the cell. None (the default) does nothing.
    """

    def __init__(self, threads: int, traces: bool = True, kill_once: tuple[str, int] | None = None):
        from engine.threads import configure_threads

        configure_threads(threads)
        self.traces, self.kill_once = traces, kill_once
        self.models: dict[str, tuple] = {}
        self.name = f"{os.uname().nodename}:{os.getpid()}"

    def run(self, cell: Cell) -> tuple[dict, bytes | None]:
        """`run_cell` with this worker's cached model; the row's ``worker`` is ``host:pid``."""
        if self.kill_once is not None and cell.index == self.kill_once[1]:
            try:
                os.close(os.open(self.kill_once[0], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                os._exit(17)
        if cell.model not in self.models:
            self.models[cell.model] = load_sweep_model(cell.model)
        row, trace = run_cell(cell, *self.models[cell.model], traces=self.traces)
        row["worker"] = self.name
        return row, trace


_POOL_RUNNER: list[CellRunner] = []


def _pool_init(threads: int, traces: bool, kill_once) -> None:
    _POOL_RUNNER[:] = [CellRunner(threads, traces, kill_once)]


def _pool_run(cell: Cell):
    return _POOL_RUNNER[0].run(cell)


# ----------------------------------------------------------------------------- tables

def _write_atomic(table: pa.Table, path: Path) -> None:
    import pyarrow.parquet as pq

    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def read_results(out_dir: str | Path) -> pa.Table | None:
    """The results table of an output folder, or None when it has none.

    Raises:
        ValueError: the table's columns are not `RESULT_SCHEMA`'s (a folder from another tool or
            version: pass a new ``--out``).
    """
    import pyarrow.parquet as pq

    path = Path(out_dir) / RESULTS_NAME
    if not path.is_file():
        return None
    table = pq.read_table(path)
    if table.schema.names != RESULT_SCHEMA.names:
        raise ValueError(f"{path} has columns {table.schema.names}, not a sweep results table's "
                         f"{RESULT_SCHEMA.names}; pass another --out")
    return table.cast(RESULT_SCHEMA)


def grid_rows(results: pa.Table, models: Sequence[str], task_sets: Sequence[str],
              settings: Sequence[dict]) -> pa.Table:
    """The rows of one grid in a results table, in grid order.

    A resumed output folder keeps every row it ever received, so its ``results.parquet`` (and
    `SweepResult.results`) can also hold the cells of an earlier, different grid written to the
    same folder (fewer tasks, another setting). This picks exactly the cells `make_cells` gives
    for these arguments.

    Args:
        results: a results table (`RESULT_SCHEMA`, e.g. `read_results` or `SweepResult.results`).
        models, task_sets, settings: the grid, as `run_sweep` takes it.

    Returns:
        One row per cell of the grid, in grid order (model, setting, task set, task).

    Raises:
        ValueError: as `make_cells`, or a cell of the grid missing from `results` (the message
            counts them: run the sweep first).
    """
    ids = [c.cell_id for c in make_cells(models, task_sets, settings)]
    have = {cid: i for i, cid in enumerate(results.column("cell_id").to_pylist())}
    missing = [cid for cid in ids if cid not in have]
    if missing:
        raise ValueError(f"{len(missing)} of the grid's {len(ids)} cells are not in the results table "
                         f"(first: {missing[0]}); run the sweep into that folder first")
    return results.take(pa.array([have[cid] for cid in ids], type=pa.int64()))


def fingerprint(paths: Sequence[str | Path], length: int = 12) -> str:
    """A short hex digest of files, to key a sweep's output folder to what produced it.

    A cell's id hashes its model spec, prompt and `DecodeConfig` -- not the checkpoint's weights
    nor the code that decodes -- so a resumed folder would keep rows decoded by an older model or
    decoder. Naming the folder after ``fingerprint([model_dir, "engine", "kernels"])`` makes any
    change to those start a new folder, and an unchanged re-run resume.

    Args:
        paths: files or directories; a directory counts every file under it (``__pycache__``
            folders and ``.pyc`` files left out), by path relative to it and content.
        length: hex digits kept (1 to 64).

    Returns:
        ``length`` hex digits of a SHA-256 over the paths in the order given.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: `length` outside 1 to 64.
    """
    if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= 64:
        raise ValueError(f"length must be an int from 1 to 64, got {length!r}")
    h = hashlib.sha256()
    for root in map(Path, paths):
        if not root.exists():
            raise FileNotFoundError(f"fingerprint: no file or directory at {str(root)!r}")
        files = [root] if root.is_file() else sorted(
            f for f in root.rglob("*") if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc")
        h.update(b"\0root\0")
        for f in files:
            rel = f.name if f == root else f.relative_to(root).as_posix()
            data = f.read_bytes()
            h.update(f"\0{rel}\0{len(data)}\0".encode())
            h.update(data)
    return h.hexdigest()[:length]


def deterministic_columns(table: pa.Table) -> pa.Table:
    """`table` without the `VOLATILE_COLUMNS`: what must be identical between any two runs of a sweep."""
    return table.drop_columns([c for c in VOLATILE_COLUMNS if c in table.schema.names])


def canonical_bytes(table: pa.Table) -> bytes:
    """The `deterministic_columns` of `table` as Arrow IPC stream bytes, rebuilt from their values
    (one chunk, no optional buffers left over from how the table was made or read): two runs of a
    sweep agree exactly when these bytes are equal."""
    import io

    t = deterministic_columns(table)
    t = pa.Table.from_pylist(t.to_pylist(), schema=t.schema.remove_metadata())
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, t.schema) as writer:
        writer.write_table(t)
    return sink.getvalue()


def summarize(results: pa.Table) -> pa.Table:
    """One row per (model, task set, setting), in the order they first appear in `results`.

    Columns: model, task_set, setting, cells; tokens_per_forward (generated tokens / forwards,
    summed), nfe_mean, tokens_mean, forced_fill_rate (forced slots / generated tokens), eos_rate
    (share of decodes stopped at EOS); exact_match (share of scored cells; null if none) and
    field_acc (right fields / fields, pooled); wall_s (summed seconds) and tokens_per_s
    (generated tokens / wall_s): the only machine-dependent columns.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in results.to_pylist():
        groups.setdefault((r["model"], r["task_set"], r["setting"]), []).append(r)
    rows = []
    for (model, task_set, setting), rs in groups.items():
        toks, nfe, wall = sum(r["tokens"] for r in rs), sum(r["nfe"] for r in rs), sum(r["wall_s"] for r in rs)
        scored = [r for r in rs if r["exact_match"] is not None]
        f_tot = sum(r["fields_total"] for r in scored)
        rows.append(dict(
            model=model, task_set=task_set, setting=setting, cells=len(rs),
            tokens_per_forward=toks / nfe if nfe else None, nfe_mean=nfe / len(rs), tokens_mean=toks / len(rs),
            forced_fill_rate=sum(r["forced_fills"] for r in rs) / toks if toks else None,
            eos_rate=sum(r["stop_reason"] == "eos" for r in rs) / len(rs),
            exact_match=sum(r["exact_match"] for r in scored) / len(scored) if scored else None,
            field_acc=sum(r["fields_correct"] for r in scored) / f_tot if f_tot else None,
            wall_s=wall, tokens_per_s=toks / wall if wall > 0 else None))
    return pa.Table.from_pylist(rows, schema=SUMMARY_SCHEMA)


SUMMARY_SCHEMA = pa.schema([
    ("model", pa.string()), ("task_set", pa.string()), ("setting", pa.string()), ("cells", pa.int64()),
    ("tokens_per_forward", pa.float64()), ("nfe_mean", pa.float64()), ("tokens_mean", pa.float64()),
    ("forced_fill_rate", pa.float64()), ("eos_rate", pa.float64()), ("exact_match", pa.float64()),
    ("field_acc", pa.float64()), ("wall_s", pa.float64()), ("tokens_per_s", pa.float64()),
])


def format_summary(summary: pa.Table) -> str:
    """The summary as a plain-text table (one line per model / task set / setting)."""
    def f(v, fmt):
        return "-" if v is None else fmt.format(v)

    rows = summary.to_pylist()
    wm = max([5] + [len(r["model"]) for r in rows])
    wt = max([8] + [len(r["task_set"]) for r in rows])
    ws = max([7] + [len(r["setting"]) for r in rows])
    header = (f"{'model':{wm}s} {'task set':{wt}s} {'setting':{ws}s} {'cells':>5s} {'TPF':>6s} {'NFE':>6s} "
              f"{'forced':>7s} {'exact':>6s} {'fields':>6s} {'tok/s':>7s}")
    lines = [header]
    for r in rows:
        lines.append(f"{r['model']:{wm}s} {r['task_set']:{wt}s} {r['setting']:{ws}s} {r['cells']:5d} "
                     f"{f(r['tokens_per_forward'], '{:6.2f}')} {f(r['nfe_mean'], '{:6.1f}')} "
                     f"{f(r['forced_fill_rate'], '{:7.3f}')} {f(r['exact_match'], '{:6.3f}')} "
                     f"{f(r['field_acc'], '{:6.3f}')} {f(r['tokens_per_s'], '{:7.1f}')}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the driver

@dataclass
class SweepResult:
    """What `run_sweep` returns.

    Attributes:
        results: the full results table (`RESULT_SCHEMA`), in grid order; summary: `summarize` of it.
        ran: cells decoded by this call; skipped: cells found finished in the existing table.
        out_dir: the output folder.
    """

    results: pa.Table
    summary: pa.Table
    ran: int
    skipped: int
    out_dir: Path


class _Sink:
    """Collects finished rows, writes traces as they come, rewrites the results table at most
    every `flush_s` seconds (and at the end): an interrupted sweep keeps its finished cells."""

    def __init__(self, out_dir: Path, existing: list[dict], order: dict[str, int], flush_s: float = 1.0):
        self.out_dir, self.rows, self.order, self.flush_s = out_dir, list(existing), order, flush_s
        self.last = time.monotonic()

    def add(self, row: dict, trace: bytes | None) -> None:
        if trace is not None:
            path = self.out_dir / row["trace_path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(trace)
            os.replace(tmp, path)
        self.rows.append(row)
        if time.monotonic() - self.last >= self.flush_s:
            self.flush()

    def table(self) -> pa.Table:
        pos = {r["cell_id"]: i for i, r in enumerate(self.rows)}
        big = len(self.order)
        rows = sorted(self.rows, key=lambda r: (self.order.get(r["cell_id"], big), pos[r["cell_id"]]))
        return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)

    def flush(self) -> pa.Table:
        table = self.table()
        _write_atomic(table, self.out_dir / RESULTS_NAME)
        self.last = time.monotonic()
        return table


def _cell_failed(cell: Cell, err: BaseException) -> RuntimeError:
    return RuntimeError(f"cell {cell.cell_id} (model {cell.model}, {cell.setting}, {cell.task.task_set} task "
                        f"{cell.task.task_id}) failed: {type(err).__name__}: {err}; the finished cells are saved, "
                        "fix the cause and re-run the same command to resume")


def _run_serial(cells, sink, bar, threads, traces):
    runner = CellRunner(threads, traces)
    for cell in cells:
        try:
            out = runner.run(cell)
        except Exception as e:
            raise _cell_failed(cell, e) from e
        sink.add(*out)
        bar.update()


def _run_pool(cells, sink, bar, workers, threads, traces, kill_once, max_pool_restarts: int = 3):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    todo = {c.cell_id: c for c in cells}
    for attempt in range(max_pool_restarts + 1):
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_pool_init, initargs=(threads, traces, kill_once))
        try:
            futures = {pool.submit(_pool_run, c): c.cell_id for c in todo.values()}
            for fut in as_completed(futures):
                try:
                    out = fut.result()
                except BrokenProcessPool:
                    raise
                except Exception as e:
                    raise _cell_failed(todo[futures[fut]], e) from e
                sink.add(*out)
                del todo[futures[fut]]
                bar.update()
            return
        except BrokenProcessPool:  # a worker died: finished cells are kept, the rest run on a new pool
            if attempt == max_pool_restarts:
                raise RuntimeError(f"the process pool broke {attempt + 1} times; {len(todo)} cells not run "
                                   "(re-run the same command to resume)") from None
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _run_ray(cells, sink, bar, workers, threads, traces, kill_once, address: str, max_restarts: int = 3):
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray needs Ray: pip install 'clover-explorer[scale]' (or: pip install ray)") from None
    started = False
    if not ray.is_initialized():
        if address == "local":
            ray.init(num_cpus=workers * threads, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
        started = True
    actors: list = []
    try:
        Worker = ray.remote(CellRunner).options(num_cpus=threads, max_restarts=max_restarts,
                                                max_task_retries=max_restarts)
        actors += [Worker.remote(threads, traces, kill_once) for _ in range(workers)]
        queue = list(reversed(cells))  # pop() takes them in grid order
        inflight: dict = {}  # ObjectRef -> (actor, cell)
        tries: dict[str, int] = {}

        def submit(actor):
            cell = queue.pop()
            inflight[actor.run.remote(cell)] = (actor, cell)

        for actor in actors[:len(queue)]:
            submit(actor)
        while inflight:
            [ref], _ = ray.wait(list(inflight), num_returns=1)
            actor, cell = inflight.pop(ref)
            try:
                row, trace = ray.get(ref)
            except ray.exceptions.RayTaskError as e:  # the cell itself raised
                raise _cell_failed(cell, getattr(e, "cause", None) or e) from None
            except ray.exceptions.RayActorError:  # restarts used up: drop the actor, give the cell to another
                actors.remove(actor)
                tries[cell.cell_id] = tries.get(cell.cell_id, 0) + 1
                if not actors or tries[cell.cell_id] > max_restarts:
                    raise RuntimeError(f"cell {cell.cell_id} ({cell.model}, {cell.setting}, task {cell.task.task_id}) "
                                       "lost its worker too often; re-run the same command to resume") from None
                queue.append(cell)
                busy = {a for a, _ in inflight.values()}
                for a in actors:
                    if a not in busy and queue:
                        submit(a)
                continue
            sink.add(row, trace)
            bar.update()
            if queue:
                submit(actor)
    finally:
        for actor in actors:
            ray.kill(actor)
        if started:
            ray.shutdown()


def run_sweep(models: Sequence[str], task_sets: Sequence[str], settings: Sequence[dict], out_dir: str | Path,
              workers: int = 1, ray_address: str | None = None, threads: int | None = None, traces: bool = True,
              progress: bool = True, kill_once: tuple[str, int] | None = None,
              interleave: bool = False) -> SweepResult:
    """Run (or resume) a sweep and write its tables (module docstring).

    Args:
        models, task_sets, settings: as `make_cells`.
        out_dir: output folder (created); an existing ``results.parquet`` there is resumed.
        workers: processes (or Ray actors) decoding at once, >= 1; 1 without Ray runs in this process.
        ray_address: None (no Ray), ``"local"``, ``"auto"`` or a cluster address (``ray.init(address=...)``).
            When Ray is already initialised in this process, that instance is used.
        threads: torch threads per worker (None: `engine.threads` default divided among the workers).
        traces: save every cell's trace under ``traces/``.
        progress: show a tqdm bar (cells done, rate, ETA) on stderr.
        kill_once: test hook, see `CellRunner` (process pool or Ray only).
        interleave: hand the cells out task by task -- task 0 of every task set in every setting
            (and model), then task 1, ... -- instead of in grid order, so a machine load that changes during
            the sweep slows every setting alike and their wall times compare. The rows are the
            same and still written in grid order.

    Returns:
        A `SweepResult`.

    Raises:
        ValueError: bad models / task sets / settings (see `make_cells`), workers < 1, or an
            existing results table of another shape.
        RuntimeError: a cell raised (the message names it) or workers kept dying; the finished
            cells are saved either way (re-run to resume).
    """
    from tqdm import tqdm

    from engine.threads import default_threads, resolve_threads

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if kill_once is not None and workers == 1 and ray_address is None:
        raise ValueError("kill_once kills a worker process: it needs workers >= 2 or Ray (1 worker runs in this process)")
    if threads is None and not os.environ.get("OMP_NUM_THREADS"):
        threads = max(1, default_threads() // workers)
    threads = resolve_threads(threads)
    cells = make_cells(models, task_sets, settings)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    existing = read_results(out_dir)
    old_rows = existing.to_pylist() if existing is not None else []
    done = {r["cell_id"] for r in old_rows}
    todo = [c for c in cells if c.cell_id not in done]
    if interleave:
        todo.sort(key=lambda c: (c.task.task_id, c.index))  # task 0 in every setting, then task 1, ...
    sink = _Sink(out_dir, old_rows, {c.cell_id: c.index for c in cells})
    with tqdm(total=len(cells), initial=len(cells) - len(todo), desc="sweep", unit="cell", disable=not progress,
              dynamic_ncols=True) as bar:
        try:
            if not todo:
                pass
            elif ray_address is not None:
                _run_ray(todo, sink, bar, workers, threads, traces, kill_once, ray_address)
            elif workers == 1:
                _run_serial(todo, sink, bar, threads, traces)
            else:
                _run_pool(todo, sink, bar, min(workers, len(todo)), threads, traces, kill_once)
        finally:
            results = sink.flush()
    summary = summarize(results)
    _write_atomic(summary, out_dir / SUMMARY_NAME)
    return SweepResult(results, summary, len(todo), len(cells) - len(todo), out_dir)


# ----------------------------------------------------------------------------- command line

def _list(typ):
    def parse(text: str) -> list:
        out = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if typ is str:
                out.append(part)
                continue
            try:
                out.append(typ(part))
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected a comma list of {typ.__name__}s, got {text!r}") from None
        if not out:
            raise argparse.ArgumentTypeError(f"expected at least one value, got {text!r}")
        return out
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m engine.sweep`` argument parser."""
    from engine.checkpoint import DEFAULT_MODEL_DIR
    from engine.threads import add_threads_argument

    p = argparse.ArgumentParser(prog="python -m engine.sweep", description=__doc__.splitlines()[0])
    p.add_argument("--models", type=_list(str), default=[DEFAULT_MODEL_DIR],
                   help="comma list of checkpoint directories or random:PRESET[:SCALE] (default %(default)s)")
    p.add_argument("--tasks", type=_list(str), default=["agent-eval:20"],
                   help="comma list of task sets: agent-eval:N, chat-eval:N, prompts:FILE (default agent-eval:20)")
    for field, typ in GRID_AXES.items():
        p.add_argument("--" + field.replace("_", "-"), dest=field, type=_list(typ), default=None,
                       help=f"comma list of {field} values (default: DecodeConfig's)")
    p.add_argument("--out", type=Path, required=True, help="output folder; an existing results table there is resumed")
    p.add_argument("--workers", type=int, default=1, help="worker processes / Ray actors (default 1: in process)")
    p.add_argument("--ray", default=None, metavar="local|auto|ADDRESS",
                   help="run on Ray: a new local instance, the running cluster, or the cluster at ADDRESS")
    p.add_argument("--no-traces", dest="traces", action="store_false", help="do not save each decode's trace")
    p.add_argument("--interleave", action="store_true",
                   help="run task by task (each task in every setting, then the next) rather than setting by setting")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_threads_argument(p)  # per worker
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    axes = {f: getattr(args, f) for f in GRID_AXES if getattr(args, f) is not None}
    try:
        res = run_sweep(args.models, args.tasks, settings_grid(axes), args.out, workers=args.workers,
                        ray_address=args.ray, threads=args.threads, traces=args.traces, progress=args.progress,
                        interleave=args.interleave)
    except (ValueError, RuntimeError, ConnectionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_summary(res.summary))
    print(f"{res.ran} cells decoded, {res.skipped} already done; results in {res.out_dir / RESULTS_NAME}, "
          f"summary in {res.out_dir / SUMMARY_NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
