"""Sweep results (experiments wing): the results and summary tables of a sweep's output folder --
their schemas and file names, reading and atomic writing, one grid's rows out of a folder that holds
several, the fingerprint that names a folder, the run-independent bytes two runs compare by, and
the per-setting summary.

Part of `clover_engine.experiments.sweep` (the package docstring describes the folder); re-exported by `clover_engine.sweep`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from clover_engine.experiments.sweep.grid import make_cells

RESULTS_NAME = "results.parquet"
SUMMARY_NAME = "summary.parquet"
TRACES_DIR = "traces"
VOLATILE_COLUMNS = ("wall_s", "worker")
"""Columns that change from run to run (timing, which worker ran the cell); every other column
is identical whatever the backend and the number of workers."""

RESULT_SCHEMA = pa.schema([
    ("cell_id", pa.string()), ("model", pa.string()), ("task_set", pa.string()), ("task_id", pa.int64()),
    ("setting", pa.string()), ("sampler", pa.string()), ("block_size", pa.int64()), ("threshold", pa.float64()),
    ("policy", pa.string()),
    ("memory_mode", pa.string()), ("max_new_tokens", pa.int64()), ("max_steps", pa.int64()),
    ("decode_config", pa.string()), ("prompt_tokens", pa.int64()), ("tokens", pa.int64()), ("nfe", pa.int64()),
    ("tokens_per_forward", pa.float64()), ("forced_fills", pa.int64()), ("stop_reason", pa.string()),
    ("text", pa.string()), ("exact_match", pa.bool_()), ("json_valid", pa.bool_()), ("name_correct", pa.bool_()),
    ("fields_correct", pa.int64()), ("fields_total", pa.int64()), ("field_acc", pa.float64()),
    ("careful", pa.bool_()), ("agreement", pa.float64()), ("first_difference", pa.int64()),
    ("common_prefix", pa.int64()), ("identical", pa.bool_()),
    ("bytes_read", pa.float64()), ("flops", pa.float64()), ("trace_path", pa.string()),
    ("wall_s", pa.float64()), ("worker", pa.string()),
])
"""One row per decode. ``sampler`` is ``block`` (threshold decoding) or the public family's own sampler; the
setting columns (``block_size`` ... ``max_steps``) are null where that sampler has no such knob (a family
sampler's ``policy`` is its name); ``decode_config`` is the full setting as JSON (a `DecodeConfig`, or the
sampler's ``to_dict()``); the score columns (``exact_match`` ... ``field_acc``) are null for unscored task sets;
``careful`` (the cell is its own careful decode), ``agreement`` (% of the answer's slots equal to the careful
decode's), ``first_difference`` (first differing slot, null when identical), ``common_prefix`` and ``identical``
compare the answer with the same model's careful decode of the same prompt (`clover_engine.decoding.careful`);
``bytes_read`` / ``flops``
(cost model estimates, bytes and FLOPs summed over the forwards) and ``trace_path`` are null
without traces; ``wall_s`` is the decode's wall time in seconds."""


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
    decoder. Naming the folder after ``fingerprint([model_dir, "clover_engine", "clover_kernels"])`` makes any
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


def _compared(rs: list[dict]) -> dict:
    """The summary's agreement columns over rows ``rs`` (null when the sweep was run without ``careful``)."""
    measured = [r for r in rs if r["agreement"] is not None]
    if not measured:
        return dict(agreement=None, identical_rate=None, careful=None)
    return dict(agreement=sum(r["agreement"] for r in measured) / len(measured),
                identical_rate=sum(r["identical"] for r in measured) / len(measured),
                careful=all(r["careful"] for r in measured))


def summarize(results: pa.Table) -> pa.Table:
    """One row per (model, task set, setting), in the order they first appear in `results`.

    Columns: model, task_set, setting, cells; tokens_per_forward (generated tokens / forwards,
    summed), nfe_mean, tokens_mean, forced_fill_rate (forced slots / generated tokens), eos_rate
    (share of decodes stopped at EOS); exact_match (share of scored cells; null if none) and
    field_acc (right fields / fields, pooled); agreement (mean % of an answer's slots equal to its careful
    decode's), identical_rate (share of answers equal to it) and careful (the setting is its own careful
    decode); wall_s (summed seconds) and tokens_per_s (generated tokens / wall_s): the only machine-dependent
    columns.
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
            wall_s=wall, **_compared(rs), tokens_per_s=toks / wall if wall > 0 else None))
    return pa.Table.from_pylist(rows, schema=SUMMARY_SCHEMA)


FRONTIER_NAME = "frontier.parquet"
FRONTIER_SCHEMA = pa.schema([
    ("model", pa.string()), ("task_set", pa.string()), ("setting", pa.string()), ("cells", pa.int64()),
    ("tokens_per_forward", pa.float64()), ("agreement", pa.float64()), ("identical_rate", pa.float64()),
    ("careful", pa.bool_()), ("pareto", pa.bool_()),
])
"""One row per (model, task set, setting) of a sweep's summary: its speed (tokens per forward) against what
the speed cost (mean agreement with the careful decode, share of identical answers), ``pareto`` marking the
settings no other setting of that model and task set beats on both."""


def frontier_table(summary: pa.Table) -> pa.Table:
    """The frontier of each (model, task set) in a `summarize` table (`FRONTIER_SCHEMA`), rows in the summary's
    order; a setting with no forwards (tokens_per_forward null) counts as speed 0. A group swept without the
    careful decode (agreement null) has no frontier and no rows."""
    from clover_engine.decoding.frontier import pareto_mask  # local: the decoding wing, only here

    rows = summary.to_pylist()
    out = []
    for key in dict.fromkeys((r["model"], r["task_set"]) for r in rows):
        group = [r for r in rows if (r["model"], r["task_set"]) == key]
        if any(r["agreement"] is None for r in group):  # swept without the careful decode: no frontier
            continue
        mask = pareto_mask([r["tokens_per_forward"] or 0.0 for r in group], [r["agreement"] for r in group])
        out += [dict(model=r["model"], task_set=r["task_set"], setting=r["setting"], cells=r["cells"],
                     tokens_per_forward=r["tokens_per_forward"], agreement=r["agreement"],
                     identical_rate=r["identical_rate"], careful=r["careful"], pareto=on) for r, on in zip(group, mask)]
    return pa.Table.from_pylist(out, schema=FRONTIER_SCHEMA)


def format_frontier(frontier: pa.Table) -> str:
    """The frontier as plain text: per (model, task set), its settings from the fastest down, ``*`` on the
    Pareto-optimal ones."""
    lines = []
    rows = frontier.to_pylist()
    for key in dict.fromkeys((r["model"], r["task_set"]) for r in rows):
        group = sorted((r for r in rows if (r["model"], r["task_set"]) == key),
                       key=lambda r: -(r["tokens_per_forward"] or 0.0))
        ws = max(7, *(len(r["setting"]) for r in group))
        lines += [f"frontier of {key[0]} on {key[1]} (* Pareto-optimal: no setting is both faster and closer):",
                  f"  {'setting':{ws}s} {'TPF':>6s} {'agree%':>7s} {'ident':>6s}"]
        lines += [f"{'*' if r['pareto'] else ' '} {r['setting']:{ws}s} {r['tokens_per_forward'] or 0.0:6.2f} "
                  f"{'careful' if r['careful'] else format(r['agreement'], '7.1f'):>7s} {r['identical_rate']:6.2f}"
                  for r in group]
    return "\n".join(lines)


SUMMARY_SCHEMA = pa.schema([
    ("model", pa.string()), ("task_set", pa.string()), ("setting", pa.string()), ("cells", pa.int64()),
    ("tokens_per_forward", pa.float64()), ("nfe_mean", pa.float64()), ("tokens_mean", pa.float64()),
    ("forced_fill_rate", pa.float64()), ("eos_rate", pa.float64()), ("exact_match", pa.float64()),
    ("field_acc", pa.float64()), ("agreement", pa.float64()), ("identical_rate", pa.float64()),
    ("careful", pa.bool_()), ("wall_s", pa.float64()), ("tokens_per_s", pa.float64()),
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
              f"{'forced':>7s} {'exact':>6s} {'fields':>6s} {'agree%':>7s} {'ident':>6s} {'tok/s':>7s}")
    lines = [header]
    for r in rows:
        lines.append(f"{r['model']:{wm}s} {r['task_set']:{wt}s} {r['setting']:{ws}s} {r['cells']:5d} "
                     f"{f(r['tokens_per_forward'], '{:6.2f}')} {f(r['nfe_mean'], '{:6.1f}')} "
                     f"{f(r['forced_fill_rate'], '{:7.3f}')} {f(r['exact_match'], '{:6.3f}')} "
                     f"{f(r['field_acc'], '{:6.3f}')} "
                     f"{'careful' if r['careful'] else f(r['agreement'], '{:7.1f}'):>7s} "
                     f"{f(r['identical_rate'], '{:6.2f}')} {f(r['tokens_per_s'], '{:7.1f}')}")
    return "\n".join(lines)
