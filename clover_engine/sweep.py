"""Sweeps: decode settings x task sets x models -> one results table, on one machine or a Ray cluster.

    python -m clover_engine.sweep --models models/clover-tiny,random:clover-test --tasks agent-eval:20 \\
        --block-size 8,32 --threshold 0.8,0.95 --memory-mode state,state+window --max-new-tokens 64 \\
        --out runs/sweep [--workers 2 | --ray local|auto|ADDRESS] [--threads N] [--no-traces] [--interleave]

    python -m clover_engine.sweep --models inclusionAI/LLaDA2.0-mini --sampler llada2,block \\
        --threshold 0.7,0.9,0.95 --block-size 32 --tasks chat-eval:20 --out runs/llada2

The command line (an entry point, above the wings) of `clover_engine.experiments.sweep`, whose package
docstring says what a setting and a cell are, what the output folder holds, the task sets and
model specs, and how cells run and resume. This module is also the sweep's public API: it
re-exports the names of `clover_engine.experiments.sweep.grid`, `.runner` and `.results` (`run_sweep`,
`settings_grid`, `grid_rows`, `read_results`, `fingerprint`, `canonical_bytes`, ...) that tests,
notebooks 02 and 03, `clover_engine.eval` users and the benchmarks reach as ``from clover_engine import sweep``.

``--threads`` is per worker (default: ``OMP_NUM_THREADS`` if set, else
`clover_engine.threads.default_threads` divided among the workers, at least 1).

Wing: ``entry points``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clover_engine.experiments.sweep.grid import (
    GRID_AXES,
    OFFICIAL_AXES,
    Cell,
    SweepTask,
    load_sweep_model,
    load_task_set,
    make_cells,
    setting_from_dict,
    setting_label,
    setting_of,
    setting_to_dict,
    settings_grid,
)
from clover_engine.experiments.sweep.results import (
    FRONTIER_NAME,
    FRONTIER_SCHEMA,
    RESULT_SCHEMA,
    RESULTS_NAME,
    SUMMARY_NAME,
    SUMMARY_SCHEMA,
    TRACES_DIR,
    VOLATILE_COLUMNS,
    canonical_bytes,
    deterministic_columns,
    fingerprint,
    format_frontier,
    format_summary,
    frontier_table,
    grid_rows,
    read_results,
    summarize,
)
from clover_engine.experiments.sweep.runner import CellRunner, SweepResult, run_cell, run_sweep
from clover_engine.checkpoint import DEFAULT_MODEL_DIR, find_model_dir
from clover_engine.threads import add_threads_argument

__all__ = [
    "GRID_AXES", "OFFICIAL_AXES", "FRONTIER_NAME", "FRONTIER_SCHEMA", "frontier_table", "format_frontier", "setting_of",
    "setting_to_dict", "setting_from_dict", "Cell", "SweepTask", "load_sweep_model", "load_task_set", "make_cells",
    "setting_label",
    "settings_grid", "RESULT_SCHEMA", "RESULTS_NAME", "SUMMARY_NAME", "SUMMARY_SCHEMA", "TRACES_DIR",
    "VOLATILE_COLUMNS", "canonical_bytes", "deterministic_columns", "fingerprint", "format_summary", "grid_rows",
    "read_results", "summarize", "CellRunner", "SweepResult", "run_cell", "run_sweep", "build_parser", "main",
]


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
    """The ``python -m clover_engine.sweep`` argument parser."""

    p = argparse.ArgumentParser(prog="python -m clover_engine.sweep", description=__doc__.splitlines()[0])
    p.add_argument("--models", type=_list(str), default=[DEFAULT_MODEL_DIR],
                   help="comma list of checkpoint directories or random:PRESET[:SCALE] (default %(default)s)")
    p.add_argument("--tasks", type=_list(str), default=["agent-eval:20"],
                   help="comma list of task sets: agent-eval:N, chat-eval:N, prompts:FILE (default agent-eval:20)")
    for field, typ in GRID_AXES.items():
        what = ("block (threshold decoding, the default) or a public family's own sampler on its checkpoints: "
                "llada, dream, fast_dllm_v2, sdar, llada2, llada21 (they read --max-new-tokens, --block-size, "
                "--threshold)") if field == "sampler" else f"{field} values (default: DecodeConfig's)"
        p.add_argument("--" + field.replace("_", "-"), dest=field, type=_list(typ), default=None,
                       help=f"comma list of {what}")
    p.add_argument("--out", type=Path, required=True, help="output folder; an existing results table there is resumed")
    p.add_argument("--workers", type=int, default=1, help="worker processes / Ray actors (default 1: in process)")
    p.add_argument("--ray", default=None, metavar="local|auto|ADDRESS",
                   help="run on Ray: a new local instance, the running cluster, or the cluster at ADDRESS")
    p.add_argument("--no-traces", dest="traces", action="store_false", help="do not save each decode's trace")
    p.add_argument("--interleave", action="store_true",
                   help="run task by task (each task in every setting, then the next) rather than setting by setting")
    p.add_argument("--no-careful", dest="careful", action="store_false",
                   help="do not compare the cells with the careful decode (one slot per forward): no agreement "
                        "columns, no frontier, no reference decodes")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_threads_argument(p)  # per worker
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.models = [find_model_dir(m) for m in args.models]  # a bundled model by name, from any directory
    axes = {f: getattr(args, f) for f in GRID_AXES if getattr(args, f) is not None}
    try:
        res = run_sweep(args.models, args.tasks, settings_grid(axes), args.out, workers=args.workers,
                        ray_address=args.ray, threads=args.threads, traces=args.traces, progress=args.progress,
                        interleave=args.interleave, careful=args.careful)
    except (ValueError, RuntimeError, ConnectionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_summary(res.summary))
    frontier = frontier_table(res.summary)
    if frontier.num_rows:
        print(format_frontier(frontier))
    print(f"{res.ran} cells decoded, {res.skipped} already done; results in {res.out_dir / RESULTS_NAME}, "
          f"summary in {res.out_dir / SUMMARY_NAME}, frontier in {res.out_dir / FRONTIER_NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
