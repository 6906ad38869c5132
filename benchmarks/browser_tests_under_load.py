"""The browser tests on a loaded machine: every core kept busy by a spinning process, the tests run N times in a row.

A browser test that holds an element across a redraw, or waits a fixed time for something a busy machine does
later, passes on a quiet developer machine and fails in CI. This runs the tests the way CI's worst moments look:
one ``python -c "while True: pass"`` per core (``--busy``, default ``os.cpu_count()``) for the whole run, then
the tests (default ``tests/apps``: the explorer in headless Chromium, JupyterLab, the served app) ``--runs``
times in a row, each in a fresh pytest process. It prints one row per run (exit code, wall seconds, pytest's
last line) and exits non-zero when any run failed.

Usage: ``.venv/bin/python benchmarks/browser_tests_under_load.py --runs 3`` (about 10 minutes a run on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clover_engine.threads import add_threads_argument  # noqa: E402


def spin(n: int) -> list[subprocess.Popen]:
    """``n`` processes that each keep one core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def run_once(tests: list[str], log: Path, threads: int | None = None) -> tuple[int, float, str]:
    """One pytest run of ``tests`` (torch ``threads`` per test process: the tests' own default, 1, when None);
    returns (exit code, wall seconds, pytest's last line); the output goes to ``log``."""
    env = dict(os.environ)
    if threads is not None:
        env.update(CLOVER_TORCH_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    t0 = time.monotonic()
    with log.open("w") as out:
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=ROOT,
                            stdout=out, stderr=subprocess.STDOUT, check=False, env=env).returncode
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    return rc, time.monotonic() - t0, lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs in a row (default 3)")
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="spinning processes (default: one per core)")
    ap.add_argument("--logs", type=Path, default=Path("runs/browser-under-load"), help="one pytest log per run")
    ap.add_argument("tests", nargs="*", default=["tests/apps"], help="pytest paths (default tests/apps)")
    add_threads_argument(ap)
    ap.set_defaults(threads=None)  # None: the tests' own setting (tests/conftest.py: one torch thread)
    next(a for a in ap._actions if a.dest == "threads").help = (
        "torch CPU threads in each test process, passed as CLOVER_TORCH_THREADS and OMP_NUM_THREADS (default: "
        "the tests' own setting, one thread)")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.busy < 0:
        ap.error("--runs must be >= 1 and --busy >= 0")
    args.logs.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in tqdm(range(1, args.runs + 1), desc=f"runs with {args.busy} busy cores", unit="run"):
        spinners = spin(args.busy)
        try:
            rc, wall, last = run_once(args.tests, args.logs / f"run{i}.log", args.threads)
        finally:
            for p in spinners:
                p.kill()
                p.wait()
        rows.append((i, rc, wall, last))
    print(f"\n{args.busy} spinning processes on {os.cpu_count()} cores; tests: {' '.join(args.tests)}\n")
    print("| run | exit | wall s | pytest |")
    print("|---|---|---|---|")
    for i, rc, wall, last in rows:
        print(f"| {i} | {rc} | {wall:.0f} | {last.strip('= ')} |")
    failed = [i for i, rc, _, _ in rows if rc != 0]
    print(f"\n{args.runs - len(failed)} of {args.runs} runs passed" + (f"; failed: {failed} (logs in {args.logs})"
                                                                       if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
