"""UI latency of the explorer: scrubbing and playback over a short and a long recorded trace.

Two traces (cached under ``runs/``; recorded here from the bundled model, or from the
labelled clover-test fallback -- random weights scaled x15 -- when ``models/clover-tiny``
is absent), decoded alike (a code prompt, block 32, threshold 1.0: one token per forward,
so every block has 32 iterations): the **short** one of 256 forwards (``--forwards``) and
the **long** one of 2048 (``--long-forwards``). Blocks of the same shape: the ratio of the
two measures what the trace's length costs, nothing else.

Per trace and per front end, the Python time of one step:

* **ipywidgets `Explorer`** (block view, confidence heatmap, text, cumulative-chart
  cursor; FigureWidgets mutated in place): a step-slider change;
* **Panel app** (`clover_viz.panel_views.ExplorerApp`: block view, text, playback bar,
  the visible Confidence tab, each pane handed its figure snapshot): ``state.seek(i)``,
  every watcher run, what a playback tick does;
* for each: **playback** (consecutive steps from the middle of the trace) and **scrub**
  (random jumps), median and p90 in ms;
* a baseline: rebuilding the block figure and heatmap from scratch per frame.

Then the **long / short ratio** of the median per-step time for each row: per-step cost
must not grow with the trace (a ratio near 1; the issue-15 target is <= 1.5), and the
playback median must hold the fastest speed the app offers (60 steps/s -> 16.7 ms) or at
least the default (8 steps/s -> 125 ms). Browser rendering is not included (no browser
here); the numbers are the Python side of a frame.

Run: ``.venv/bin/python benchmarks/ui_latency.py`` (``--rerecord`` to record the traces
again, ``--trace`` / ``--long-trace`` to use other ones, ``--quick`` for fewer steps).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_MEDIAN_MS = 100.0
TARGET_FPS = 30.0
MAX_RATIO = 1.5  # long-trace / short-trace median per-step time
DEFAULT_TRACE = ROOT / "runs" / "ui_latency_256.parquet"
DEFAULT_LONG_TRACE = ROOT / "runs" / "ui_latency_2048.parquet"
PROMPT = "def f(x):\n    return x\n\n"  # code: a trained model does not end it early


def record(path: Path, tokens: int, threshold: float) -> None:
    from clover_viz.models import load_demo_model
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig

    demo = load_demo_model()
    print(f"recording a {tokens}-token trace with {demo.label} (block 32, threshold {threshold}) ...", flush=True)
    t0 = time.perf_counter()
    dc = DecodeConfig(block_size=32, threshold=threshold, max_new_tokens=tokens)
    result = BlockDecoder(demo.model, demo.tokenizer, dc).generate(PROMPT)
    trace = result.trace
    trace.meta["model_config"] = demo.model.config.to_dict()
    trace.meta["label"] = demo.label
    path.parent.mkdir(parents=True, exist_ok=True)
    trace.save(path)
    print(f"  {result.nfe} forwards, {len(result.tokens)} tokens, stop {result.stop_reason}, "
          f"{time.perf_counter() - t0:.1f} s -> {path}", flush=True)


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def ms(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs) * 1e3, xs[int(0.9 * (len(xs) - 1))] * 1e3


def measure(trace, n_play: int, n_jumps: int) -> dict[str, tuple[float, float]]:
    """Per-step times (median, p90 ms) of each front end on one trace."""
    from clover_viz import figures as F
    from clover_viz.panel_views import ExplorerApp
    from clover_viz.state import ExplorerState
    from clover_viz.widgets import Explorer

    S = len(trace)
    rng = random.Random(0)
    jumps = [rng.randrange(S) for _ in range(n_jumps)]
    start = max(0, S // 2 - n_play // 2)
    play = list(range(start, min(S, start + n_play)))
    out: dict[str, tuple[float, float]] = {}

    ex = Explorer(trace)
    set_step = lambda i: setattr(ex.step_slider, "value", i)  # noqa: E731
    out["ipywidgets Explorer: playback"] = ms([timed(set_step, i) for i in play])
    out["ipywidgets Explorer: scrub"] = ms([timed(set_step, i) for i in jumps])
    ex.close()

    state = ExplorerState(model_dir="clover-test", auto_redecode=False)
    app = ExplorerApp(state=state)
    state.trace, state.n_steps = trace, S
    state.seek(start)
    out["Panel app: playback"] = ms([timed(state.seek, i) for i in play])
    out["Panel app: scrub"] = ms([timed(state.seek, i) for i in jumps])
    state.close()
    assert app.block.shown_step == jumps[-1]

    def rebuild(i: int) -> None:
        F.block_figure(trace, i).to_dict()
        F.confidence_heatmap(trace, step=i).to_dict()
        F.text_html(trace, i)

    out["baseline: rebuild figures per step"] = ms([timed(rebuild, i) for i in play[: max(5, n_play // 4)]])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--long-trace", type=Path, default=DEFAULT_LONG_TRACE)
    ap.add_argument("--forwards", type=int, default=256)
    ap.add_argument("--long-forwards", type=int, default=2048)
    ap.add_argument("--rerecord", action="store_true")
    ap.add_argument("--steps", type=int, default=120, help="consecutive playback steps to time")
    ap.add_argument("--jumps", type=int, default=60, help="random scrub jumps to time")
    ap.add_argument("--quick", action="store_true", help="30 steps and 20 jumps")
    from clover_engine.threads import add_threads_argument, configure_threads

    add_threads_argument(ap)
    args = ap.parse_args(argv)
    configure_threads(args.threads)
    if args.quick:
        args.steps, args.jumps = 30, 20

    if args.rerecord or not args.trace.is_file():
        record(args.trace, args.forwards, 1.0)
    if args.rerecord or not args.long_trace.is_file():
        record(args.long_trace, args.long_forwards, 1.0)

    from clover_engine.recording.trace import Trace

    results = {}
    for name, path in (("short", args.trace), ("long", args.long_trace)):
        trace = Trace.load(path)
        s = trace.summary()
        print(f"{name} trace {path.name}: {len(trace)} forwards, {s['n_tokens']} tokens, {s['n_blocks']} blocks "
              f"({trace.meta.get('label', trace.model_id)})", flush=True)
        results[name] = measure(trace, args.steps, args.jumps)

    print(f"\n{'per step (Python side)':<38}{'short med':>10}{'p90':>8}{'long med':>10}{'p90':>8}{'long/short':>12}")
    worst = 0.0
    for row in results["short"]:
        (sm, sp), (lm, lp) = results["short"][row], results["long"][row]
        ratio = lm / sm
        if not row.startswith("baseline"):
            worst = max(worst, ratio)
        print(f"{row:<38}{sm:>10.1f}{sp:>8.1f}{lm:>10.1f}{lp:>8.1f}{ratio:>12.2f}")
    play = max(results[k][r][0] for k in results for r in results[k] if r.endswith("playback"))
    print(f"\nworst long/short ratio: {worst:.2f} (target <= {MAX_RATIO}: {'met' if worst <= MAX_RATIO else 'NOT met'})")
    print(f"slowest playback median {play:.1f} ms per step: holds {1000 / play:.0f} steps/s "
          f"(app speeds 0.5-60 steps/s, default 8)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
