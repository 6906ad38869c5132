"""UI latency of the explorer: scrubbing and playback over a recorded 512-token trace.

Measures, on a trace of ``--tokens`` generated tokens (recorded here from the
bundled model, or from the labelled clover-test fallback -- random weights
scaled x15 -- when ``models/clover-tiny`` is absent; cached under ``runs/``):

* **scrub latency**: median (and p90) time from a change of the step slider
  to updated figure objects, for random jumps -- the ipywidgets `Explorer`
  (block view, confidence heatmap, text, cumulative-chart cursor, all
  FigureWidgets mutated in place) and the bare figure path the Panel app uses
  (`update_block_figure` + `update_confidence_heatmap` + `text_html`, plus
  serialising the block figure to JSON, what a server sends);
* **playback**: frames per second stepping through every step in order;
* a baseline measured in the same run: rebuilding the block figure from
  scratch per frame instead of updating it in place.

Browser rendering is not included (no browser here); the numbers are the
Python side of a frame. Targets (issue 4): median <= 100 ms, >= 30 fps;
the script prints ratios against them (>= 1.0 meets the target).

Run: ``.venv/bin/python benchmarks/ui_latency.py`` (``--rerecord`` to record
the trace again, ``--trace PATH`` to use another one).
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
DEFAULT_TRACE = ROOT / "runs" / "ui_latency_512.parquet"
PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant with tools:\n"
    '{"name": "search_orders", "description": "Find orders.", "parameters": {"type": "object", '
    '"properties": {"customer": {"type": "string"}}, "required": ["customer"]}}<|im_end|>\n'
    '<|im_start|>user\nFind the orders of (customer: "Maria Lopez").<|im_end|>\n<|im_start|>assistant\n'
)


def record(path: Path, tokens: int, threshold: float) -> None:
    from clover_viz.demo import load_demo_model
    from engine.decoder import BlockDecoder, DecodeConfig

    demo = load_demo_model()
    print(f"recording a {tokens}-token trace with {demo.label} (block 32, threshold {threshold}) ...", flush=True)
    t0 = time.perf_counter()
    dc = DecodeConfig(block_size=32, threshold=threshold, max_new_tokens=tokens)
    result = BlockDecoder(demo.model, demo.tokenizer, dc).generate(PROMPT)
    trace = result.trace
    trace.meta["model_config"] = demo.model.config.to_dict()
    trace.meta["label"] = demo.label
    trace.save(path)
    print(f"  {result.nfe} forwards, {len(result.tokens)} tokens, stop {result.stop_reason}, "
          f"{time.perf_counter() - t0:.1f} s -> {path}", flush=True)


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threshold", type=float, default=0.4,
                    help="threshold of the recording (low, so a random model accepts slots)")
    ap.add_argument("--rerecord", action="store_true")
    ap.add_argument("--jumps", type=int, default=100, help="random scrub jumps to time")
    from engine.threads import add_threads_argument, configure_threads

    add_threads_argument(ap)
    args = ap.parse_args(argv)
    configure_threads(args.threads)

    if args.rerecord or not args.trace.is_file():
        record(args.trace, args.tokens, args.threshold)

    import plotly.graph_objects as go

    from clover_viz import figures as F
    from clover_viz.widgets import Explorer
    from engine.trace import Trace

    trace = Trace.load(args.trace)
    s = trace.summary()
    S = len(trace)
    print(f"trace {args.trace.name}: {S} steps, {s['n_tokens']} tokens, {s['n_blocks']} blocks "
          f"({trace.meta.get('label', trace.model_id)})")
    rng = random.Random(0)
    jumps = [rng.randrange(S) for _ in range(args.jumps)]

    # --- ipywidgets Explorer: slider change -> figure widgets updated in place
    t0 = time.perf_counter()
    ex = Explorer(trace)
    build_s = time.perf_counter() - t0

    def scrub(i: int) -> None:
        ex.step_slider.value = i

    ex_times = [timed(scrub, i) for i in jumps]
    t0 = time.perf_counter()
    for i in range(S):
        scrub(i)
    ex_fps = S / (time.perf_counter() - t0)

    # --- bare figures (the Panel path): in place, and the rebuild-per-frame baseline
    block = F.block_figure(trace, 0)
    conf = F.confidence_heatmap(trace, 0, step=0)

    def frame_in_place(i: int) -> None:
        F.update_block_figure(block, trace, i)
        F.update_confidence_heatmap(conf, trace, trace.step(i).block_index, step=i)
        F.text_html(trace, i)
        block.to_json()

    def frame_rebuild(i: int) -> None:
        F.block_figure(trace, i).to_json()
        F.confidence_heatmap(trace, trace.step(i).block_index, step=i)
        F.text_html(trace, i)

    fig_times = [timed(frame_in_place, i) for i in jumps]
    rebuild_times = [timed(frame_rebuild, i) for i in jumps]
    t0 = time.perf_counter()
    for i in range(S):
        frame_in_place(i)
    fig_fps = S / (time.perf_counter() - t0)
    assert isinstance(block, go.Figure)

    def ms(xs: list[float]) -> tuple[float, float]:
        xs = sorted(xs)
        return statistics.median(xs) * 1e3, xs[int(0.9 * (len(xs) - 1))] * 1e3

    print(f"\nExplorer built in {build_s:.2f} s (figure widgets created once)")
    print(f"{'path':<40}{'median ms':>10}{'p90 ms':>9}{'fps':>8}{'median/target':>15}{'fps/target':>12}")
    rows = [
        ("ipywidgets Explorer (FigureWidgets)", ms(ex_times), ex_fps),
        ("figures in place + JSON (Panel path)", ms(fig_times), fig_fps),
    ]
    for name, (med, p90), fps in rows:
        print(f"{name:<40}{med:>10.1f}{p90:>9.1f}{fps:>8.1f}{TARGET_MEDIAN_MS / med:>15.2f}{fps / TARGET_FPS:>12.2f}")
    med_rebuild, p90_rebuild = ms(rebuild_times)
    print(f"{'baseline: rebuild figures per frame':<40}{med_rebuild:>10.1f}{p90_rebuild:>9.1f}")
    print(f"\nin-place vs rebuild speed-up (median): {med_rebuild / ms(fig_times)[0]:.2f}x")
    ok = all(TARGET_MEDIAN_MS / m[0] >= 1 and f / TARGET_FPS >= 1 for _, m, f in rows)
    print(f"targets (median <= {TARGET_MEDIAN_MS:.0f} ms, >= {TARGET_FPS:.0f} fps): {'met' if ok else 'NOT met'} "
          "(Python side of a frame: no browser, and outside a kernel widget messages are not serialised)")
    ex.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
