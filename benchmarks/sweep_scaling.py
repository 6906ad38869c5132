"""Sweep throughput at 1 and 2 workers: the same 64-cell `clover_engine.sweep` run twice, side by side.

64 cells = 16 held-out agent tasks (``agent-eval:16``) x 4 settings (block_size 4 / 8 x threshold
0.5 / 0.9, 16 new tokens) on the random ``clover-test`` (weights x15; byte tokenizer, so each
prompt is 1-2K tokens of prefill). Each run writes to its own fresh folder; the wall time counts
everything a user waits for (worker start-up, model loads, decodes, tables). The script prints
both times, the ratio measured in this run, the mean decode time per cell at each count (when it
grows with the workers, the cores were not free: the workers slowed each other), and checks that the two results tables agree
(`clover_engine.sweep.canonical_bytes`). ``--ray`` runs the 2-worker sweep on a local Ray instance
instead of the process pool (its start-up is then inside the 2-worker time).

``--threads`` is per worker (default 1). On a machine with fewer free cores than workers the
ratio stays near 1: it measures the machine as much as the sweep.

Run: ``.venv/bin/python benchmarks/sweep_scaling.py [--ray] [--tasks 16] [--threads 1]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clover_engine import sweep  # noqa: E402
from clover_engine.threads import add_threads_argument, resolve_threads, usable_cpus  # noqa: E402

MODEL = "random:clover-test:15"
AXES = {"block_size": [4, 8], "threshold": [0.5, 0.9], "max_new_tokens": [16]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/sweep_scaling.py", description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=16, help="agent-eval tasks (cells = 4 x tasks; default 16 -> 64)")
    ap.add_argument("--ray", action="store_true", help="2 workers on a local Ray instance instead of a process pool")
    add_threads_argument(ap)  # per worker
    args = ap.parse_args(argv)
    if args.tasks < 1:
        ap.error(f"--tasks must be >= 1, got {args.tasks}")
    try:
        threads = resolve_threads(args.threads if args.threads is not None else 1)
    except ValueError as e:
        ap.error(str(e))
    settings = sweep.settings_grid(AXES)
    tasks = [f"agent-eval:{args.tasks}"]
    times, tables = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (1, 2):
            t0 = time.perf_counter()
            res = sweep.run_sweep([MODEL], tasks, settings, Path(tmp) / f"w{workers}", workers=workers,
                                  ray_address="local" if args.ray and workers == 2 else None, threads=threads,
                                  traces=True, progress=True)
            times[workers] = time.perf_counter() - t0
            tables[workers] = res.results
    n = tables[1].num_rows
    same = sweep.canonical_bytes(tables[1]) == sweep.canonical_bytes(tables[2])
    backend = "Ray (local)" if args.ray else "process pool"
    print(f"{n} cells, {threads} thread(s) per worker, {usable_cpus()} usable CPUs")
    for w in (1, 2):
        per_cell = sum(tables[w].column("wall_s").to_pylist()) / n
        where = "in process" if w == 1 else backend
        print(f"{w} worker{'s' if w > 1 else ''} ({where}): {times[w]:7.1f} s end to end ({n / times[w]:.2f} cells/s); "
              f"decode {per_cell * 1e3:.0f} ms per cell")
    print(f"speed-up 2 vs 1 workers: {times[1] / times[2]:.2f}x   results identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
