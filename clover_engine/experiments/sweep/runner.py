"""Sweep runner (experiments wing): decode and score one cell, the worker that keeps its models
loaded, the three backends that hand cells to workers (in this process, a ``spawn`` process pool,
Ray actors) and `run_sweep`, the driver that resumes a folder and writes its tables as cells finish.

Part of `clover_engine.experiments.sweep` (the package docstring describes execution and resuming);
re-exported by `clover_engine.sweep`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from clover_engine.experiments.sweep.grid import Cell, load_sweep_model, make_cells, setting_from_dict
from clover_engine.experiments.sweep.results import (
    FRONTIER_NAME,
    RESULT_SCHEMA,
    RESULTS_NAME,
    SUMMARY_NAME,
    TRACES_DIR,
    _write_atomic,
    frontier_table,
    read_results,
    summarize,
)
from clover_engine.decoding.careful import CarefulReferences, agreement, is_careful
from clover_engine.decoding.samplers import OFFICIAL_SAMPLERS, decoder_for
from clover_engine.threads import configure_threads, default_threads, resolve_threads
from clover_engine.data.agent import score_call
from clover_engine.prompting import model_input


def _knobs(setting: Any) -> dict:
    """The results table's setting columns of a `DecodeConfig` or an official sampler (null where it has none)."""
    name = getattr(setting, "sampler", None)
    if name not in OFFICIAL_SAMPLERS:
        return dict(sampler="block", block_size=setting.block_size, threshold=setting.threshold,
                    policy=setting.policy, memory_mode=setting.memory_mode, max_new_tokens=setting.max_new_tokens,
                    max_steps=setting.max_steps)
    d = setting.to_dict()
    block = d.get("block_length", d.get("block_size"))
    threshold = d.get("threshold", d.get("confidence_threshold"))
    return dict(sampler=name, block_size=block, threshold=None if threshold is None else float(threshold),
                policy=name, memory_mode=None, max_new_tokens=d.get("gen_length", d.get("max_new_tokens")),
                max_steps=d.get("steps", d.get("denoising_steps")))


def run_cell(cell: Cell, model, tokenizer, traces: bool = True, references: CarefulReferences | None = None,
             careful: bool = True) -> tuple[dict, bytes | None]:
    """Decode one cell, score it, and compare its answer with the careful decode's.

    Args:
        cell: the `Cell`; model, tokenizer: loaded from ``cell.model`` (`load_sweep_model`).
        traces: record the decode's `clover_engine.recording.trace.Trace` (and the cost model's bytes / FLOPs).
        references: the careful decodes already made (`clover_engine.decoding.careful.CarefulReferences`, keyed by
            model spec, prompt ids and careful setting); None: a new cache for this cell.
        careful: compare with the careful decode (False: the agreement columns are null, no reference decoded).

    Returns:
        ``(row, trace_parquet_bytes)``: the row as a dict with the `RESULT_SCHEMA` columns (``worker``
        is filled by the caller), and the trace as Parquet file bytes (None without traces). The row's
        ``careful`` / ``agreement`` / ``first_difference`` / ``common_prefix`` / ``identical`` compare the answer
        with the same model's careful decode of the same prompt (`clover_engine.decoding.careful`), decoded
        once per (model, prompt, careful setting) and seeded from that key, so every worker gets the same one.
    """
    import torch

    setting = setting_from_dict(cell.config)
    prompt = cell.task.prompt
    if cell.task.kind == "chat":  # a user request: the chat template where the model has one
        prompt = model_input(prompt, model).text
    decoder = decoder_for(model, tokenizer, setting)  # the block decoder, or the family's own sampler
    torch.manual_seed(int(cell.cell_id, 16) % (2 ** 63))
    r = decoder.generate(prompt, record_trace=traces)
    own = is_careful(setting)
    if own or not careful:
        reference = [int(t) for t in r.tokens]
    else:
        references = CarefulReferences() if references is None else references
        key = references.key(cell.model, r.prompt_ids, setting)

        def careful(care):
            torch.manual_seed(int(hashlib.sha256(repr(key).encode()).hexdigest()[:15], 16))
            return decoder_for(model, tokenizer, care).generate(prompt, record_trace=False).tokens

        reference = references.reference(cell.model, r.prompt_ids, setting, careful)
    agree = agreement(r.tokens, reference, own=own)
    compared = dict(careful=own, agreement=float(agree.token_agreement), first_difference=agree.first_difference,
                    common_prefix=agree.common_prefix, identical=agree.identical) if careful else {}
    score: dict = {}
    if cell.task.kind == "agent":
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
        setting=cell.setting, **_knobs(setting),
        decode_config=json.dumps(cell.config, sort_keys=True), prompt_tokens=len(r.prompt_ids),
        tokens=len(r.tokens), nfe=r.nfe, tokens_per_forward=float(r.tokens_per_forward), forced_fills=r.n_forced,
        stop_reason=r.stop_reason, text=r.text, **compared, bytes_read=r.bytes_read, flops=r.flops,
        trace_path=f"{TRACES_DIR}/{cell.cell_id}.parquet" if trace_bytes is not None else None,
        wall_s=float(r.wall_s), worker=None, **score)
    return row, trace_bytes


class CellRunner:
    """What a worker keeps: its thread count, the models it has loaded (each once), and the
    fault-injection hook.

    Args:
        threads: torch CPU threads of this worker (>= 1).
        traces: record traces (see `run_cell`).
        careful: compare every cell with its careful decode (see `run_cell`).
        kill_once: test hook, ``(marker_path, cell_index)``: the first worker to start the cell of
            that index creates the marker file and exits the process at once (``os._exit``);
            later attempts find the marker and run the cell. None (the default) does nothing.
    """

    def __init__(self, threads: int, traces: bool = True, kill_once: tuple[str, int] | None = None,
                 careful: bool = True):
        configure_threads(threads)
        self.traces, self.kill_once, self.careful = traces, kill_once, careful
        self.models: dict[str, tuple] = {}
        self.references = CarefulReferences()  # each (model, prompt, careful setting) decoded once per worker
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
        row, trace = run_cell(cell, *self.models[cell.model], traces=self.traces, references=self.references,
                              careful=self.careful)
        row["worker"] = self.name
        return row, trace


_POOL_RUNNER: list[CellRunner] = []


def _pool_init(threads: int, traces: bool, kill_once, careful: bool) -> None:
    _POOL_RUNNER[:] = [CellRunner(threads, traces, kill_once, careful)]


def _pool_run(cell: Cell):
    return _POOL_RUNNER[0].run(cell)


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


def _run_serial(cells, sink, bar, threads, traces, careful):
    runner = CellRunner(threads, traces, careful=careful)
    for cell in cells:
        try:
            out = runner.run(cell)
        except Exception as e:
            raise _cell_failed(cell, e) from e
        sink.add(*out)
        bar.update()


def _run_pool(cells, sink, bar, workers, threads, traces, kill_once, careful, max_pool_restarts: int = 3):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    todo = {c.cell_id: c for c in cells}
    for attempt in range(max_pool_restarts + 1):
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_pool_init, initargs=(threads, traces, kill_once, careful))
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


def _run_ray(cells, sink, bar, workers, threads, traces, kill_once, careful, address: str, max_restarts: int = 3):
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
        actors += [Worker.remote(threads, traces, kill_once, careful) for _ in range(workers)]
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
              interleave: bool = False, careful: bool = True) -> SweepResult:
    """Run (or resume) a sweep and write its tables (module docstring).

    Args:
        models, task_sets, settings: as `make_cells`.
        out_dir: output folder (created); an existing ``results.parquet`` there is resumed.
        workers: processes (or Ray actors) decoding at once, >= 1; 1 without Ray runs in this process.
        ray_address: None (no Ray), ``"local"``, ``"auto"`` or a cluster address (``ray.init(address=...)``).
            When Ray is already initialised in this process, that instance is used.
        threads: torch threads per worker (None: `clover_engine.threads` default divided among the workers).
        traces: save every cell's trace under ``traces/``.
        progress: show a tqdm bar (cells done, rate, ETA) on stderr.
        kill_once: test hook, see `CellRunner` (process pool or Ray only).
        interleave: hand the cells out task by task -- task 0 of every task set in every setting
            (and model), then task 1, ... -- instead of in grid order, so a machine load that changes during
            the sweep slows every setting alike and their wall times compare. The rows are the
            same and still written in grid order.
        careful: compare every cell with the same model's careful decode of its prompt (the agreement columns;
            each worker decodes a reference once per model, prompt and careful setting). False: those columns
            are null and no reference is decoded (a sweep about speed alone).

    Returns:
        A `SweepResult`.

    Raises:
        ValueError: bad models / task sets / settings (see `make_cells`), workers < 1, or an
            existing results table of another shape.
        RuntimeError: a cell raised (the message names it) or workers kept dying; the finished
            cells are saved either way (re-run to resume).
    """
    from tqdm import tqdm

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
                _run_ray(todo, sink, bar, workers, threads, traces, kill_once, careful, ray_address)
            elif workers == 1:
                _run_serial(todo, sink, bar, threads, traces, careful)
            else:
                _run_pool(todo, sink, bar, min(workers, len(todo)), threads, traces, kill_once, careful)
        finally:
            results = sink.flush()
    summary = summarize(results)
    _write_atomic(summary, out_dir / SUMMARY_NAME)
    _write_atomic(frontier_table(summary), out_dir / FRONTIER_NAME)
    return SweepResult(results, summary, len(todo), len(cells) - len(todo), out_dir)

