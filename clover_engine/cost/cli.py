"""Text reports of the cost model and ``python -m clover_engine.cost``.

    python -m clover_engine.cost --config clover-35b-a3b --device h800 --tokens 32 --union 32
    python -m clover_engine.cost --list-devices
    python -m clover_engine.cost --trace runs/example.parquet --device h800
    python -m clover_engine.cost --parallel ep=8 [--device h200 --tokens 32 --union 32 --tpf 1 4 8]

Wing: ``cost``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.checkpoint import find_model_dir, load_model
from clover_engine.cost.devices import DEFAULT_DEVICE, DEVICES, Device, get_device, ridge_point
from clover_engine.cost.formulas import (
    MEMORY_MODES,
    UNION_ASSUMPTIONS,
    ForwardCost,
    _as_config,
    ar_step_cost,
    expected_union,
    forward_cost,
)
from clover_engine.cost.parallel import ParallelForward, project_parallel_table
from clover_engine.cost.trace_projection import TraceProjection, project_trace
from clover_engine.recording.trace import Trace
from clover_engine.units import format_si


def format_breakdown(fc: ForwardCost) -> str:
    """Plain aligned table: component, bytes, FLOPs, and the totals."""
    lines = [f"{'component':<18}{'bytes':>14}{'share':>8}{'flops':>16}{'share':>8}"]
    lines.append("-" * len(lines[0]))
    for key in fc.bytes_by_component:  # COMPONENTS order (DENSE_COMPONENTS for a dense transformer)
        bb, ff = fc.bytes_by_component[key], fc.flops_by_component[key]
        lines.append(
            f"{key:<18}{format_si(bb, 'B'):>14}{bb / fc.bytes_read:>8.1%}"
            f"{format_si(ff, 'FLOP'):>16}{ff / fc.flops:>8.1%}"
        )
    lines.append("-" * len(lines[0]))
    lines.append(f"{'total':<18}{format_si(fc.bytes_read, 'B'):>14}{'':>8}{format_si(fc.flops, 'FLOP'):>16}")
    lines.append(f"{'  weights only':<18}{format_si(fc.weights_bytes_read, 'B'):>14}")
    return "\n".join(lines)


def format_forward_report(
    config: CloverConfig, device: Device, fc: ForwardCost, weight_bytes: float, tpf: Sequence[float] | None = None
) -> str:
    ar = ar_step_cost(config, weight_bytes)
    t = fc.roofline_time_s(device)
    t_ar = ar.roofline_time_s(device)
    ridge = ridge_point(device)
    bound = "bandwidth" if fc.arithmetic_intensity < ridge else "compute"
    out = [
        f"config {config.name}, {weight_bytes:g} bytes/weight; forward of {fc.n_tokens} tokens "
        f"({fc.n_commit_tokens} committed + {fc.block_len} block slots), "
        f"expert union {fc.mean_expert_union:.1f}/{config.num_experts} per layer",
        "",
        format_breakdown(fc),
        "",
        f"arithmetic intensity   {fc.arithmetic_intensity:.1f} FLOP/byte "
        f"({device.name} ridge point {ridge:.1f} -> {bound} bound)",
        f"roofline time          {t * 1e3:.3f} ms on {device.name} "
        f"(bytes {fc.bytes_read / device.bandwidth_bytes_per_s * 1e3:.3f} ms, "
        f"flops {fc.flops / device.peak_flops * 1e3:.3f} ms)",
        f"forwards/s bound       {1 / t:.1f}",
        "",
        f"AR step (1 token, union {config.num_experts_per_tok}, weights only, the write-ups' baseline): "
        f"{format_si(ar.bytes_read, 'B')}, {format_si(ar.flops, 'FLOP')}, "
        f"bound {1 / t_ar:.1f} tokens/s",
        f"bytes ratio vs AR      {fc.bytes_read / ar.bytes_read:.3f}x "
        f"(weights only {fc.weights_bytes_read / ar.weights_bytes_read:.3f}x)",
        f"break-even             {t / t_ar:.2f} tokens per forward to match AR",
    ]
    tpfs = list(tpf) if tpf else sorted({1, 2, 4, 8, fc.block_len} - {0})
    out.append("projected tokens/s bound by tokens per forward (TPF):")
    out.append("  " + "  ".join(f"TPF {x:g}: {x / t:.0f} ({x / t * t_ar:.2f}x AR)" for x in tpfs))
    return "\n".join(out)


def format_devices() -> str:
    lines = [f"{'device':<12}{'bandwidth':>12}{'BF16 dense':>14}{'ridge':>10}  source"]
    for d in DEVICES.values():
        lines.append(
            f"{d.name:<12}{d.bandwidth_bytes_per_s / 1e12:>8.3f} TB/s{d.peak_flops / 1e12:>8.1f} TFLOPS"
            f"{ridge_point(d):>7.0f} F/B  {d.source}"
        )
    lines.append(f"{'this-machine':<12}  measured on demand (--device this-machine), cached")
    return "\n".join(lines)


def format_trace_projection(p: TraceProjection, label: str = "") -> str:
    """`project_trace`'s report as text: the whole run (prompt forward included), then its decode
    phase (the prompt forward left out: the figures to set beside an autoregressive line)."""
    lines = [
        f"trace {label}, whole run (prompt forward included): {p.n_forwards} forwards, {p.tokens_written} tokens "
        f"written, {p.tokens_per_forward:.2f} tokens per forward",
        f"{'':<34}{'tokens/s':>12}{'bytes/forward':>16}{'union/layer':>13}",
    ]
    if p.measured_tokens_per_s is not None:
        lines.append(f"{'measured (this machine)':<34}{p.measured_tokens_per_s:>12.1f}")
    else:
        lines.append(f"{'measured (this machine)':<34}{'n/a':>12}")
    for proj, note in ((p.source, "trace model, measured unions"), (p.target, f"union: {p.union_assumption}")):
        if proj is None:
            lines.append(f"{'projected (source model unknown)':<34}{'n/a':>12}")
            continue
        name = f"projected {proj.config_name} on {proj.device}"
        lines.append(
            f"{name:<34}{proj.tokens_per_s:>12.1f}{format_si(proj.bytes_read / proj.n_forwards, 'B'):>16}"
            f"{proj.mean_expert_union:>13.1f}  ({note})"
        )
    d = p.decode_phase
    if d is not None and d.prompt_forwards:
        lines.append(
            f"decode phase (forward(s) {', '.join(str(i + 1) for i in d.prompt_forwards)} left out: the "
            f"{d.prompt_tokens}-token prompt's forward): {d.n_forwards} forwards, {d.tokens_written} tokens written, "
            f"{d.tokens_per_forward:.2f} tokens per forward")
        rate = "n/a" if d.measured_tokens_per_s is None else f"{d.measured_tokens_per_s:.1f}"
        lines.append(f"{'measured (this machine)':<34}{rate:>12}")
        for proj in (d.source, d.target):
            if proj is not None:
                name = f"projected {proj.config_name} on {proj.device}"
                per_fw = format_si(proj.bytes_read / proj.n_forwards, "B")
                lines.append(f"{name:<34}{proj.tokens_per_s:>12.1f}{per_fw:>16}{proj.mean_expert_union:>13.1f}")
    elif d is not None:
        lines.append("decode phase = whole run (the prompt was shorter than one block: no prompt forward)")
    lines.append("projected = roofline bound (max of bytes/bandwidth, flops/peak) per forward, BF16 weights")
    return "\n".join(lines)


def format_parallel_table(rows: Sequence[ParallelForward], tpf: Sequence[float]) -> str:
    """Per-GPU bytes, FLOPs, roofline, communication and per-forward time of each split in `rows`
    (`project_parallel_table`), with projected tokens/s at each tokens-per-forward in `tpf`."""
    first = rows[0]
    fc = first.single
    head = (f"{'GPUs':>4} {'split':<10}{'bytes/GPU':>12}{'FLOPs/GPU':>14}{'memory':>10}{'compute':>10}"
            f"{'comm':>10}{'forward':>10}" + "".join(f"{f'tok/s@{x:g}':>12}" for x in tpf))
    lines = [
        (f"projection (not measured): {first.config_name} on {first.device}, forward of {fc.n_tokens} tokens "
         f"({fc.n_commit_tokens} committed), expert union {fc.mean_expert_union:.1f}/layer, per GPU"),
        head, "-" * len(head),
    ]
    for r in rows:
        split = ",".join(f"{k}={v}" for k, v in (("ep", r.ep), ("tp", r.tp)) if v > 1) or "-"
        lines.append(
            f"{r.gpus:>4} {split:<10}{format_si(r.bytes_per_gpu, 'B'):>12}{format_si(r.flops_per_gpu, 'FLOP'):>14}"
            f"{r.memory_time_s * 1e3:>8.3f}ms{r.compute_time_s * 1e3:>8.3f}ms{r.comm_time_s * 1e3:>8.3f}ms"
            f"{r.time_s * 1e3:>8.3f}ms" + "".join(f"{r.tokens_per_s(x):>12.1f}" for x in tpf))
    last = rows[-1]
    lines += [
        "forward = max(bytes/GPU / bandwidth, FLOPs/GPU / peak) + comm (roofline per GPU, no overlap);",
        (f"comm = ring all-reduces of the [T, hidden] outputs ({last.n_collectives} collectives per forward at "
         f"{last.gpus} GPUs) at {last.link_bytes_per_s / 1e9:.0f} GB/s each way ({last.link_source or 'n/a'}); "
         "collective latency not modelled"),
        "routed experts split evenly over the ep shards; embedding, norms, routers, LM head replicated",
    ]
    return "\n".join(lines)


from clover_engine.cost.break_even import MAX_PREFIX, format_break_even, measure_break_even  # noqa: E402
from clover_engine.threads import configure_threads


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m clover_engine.cost``: breakdown table, device list, or trace projection."""
    ap = argparse.ArgumentParser(prog="python -m clover_engine.cost", description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="clover-35b-a3b",
                    help="preset name or config.json path (with --trace: the target model projected)")
    ap.add_argument("--device", default=DEFAULT_DEVICE, help=f"one of {', '.join(DEVICES)}, this-machine")
    ap.add_argument("--tokens", type=int, default=32, help="tokens in the forward (commit + block)")
    ap.add_argument("--union", default="expected",
                    help="routed experts hit per layer: a number, or 'expected' (independent routing, the default)")
    ap.add_argument("--commit", type=int, default=0, help="committed tokens among --tokens (fused commit)")
    ap.add_argument("--weight-bytes", type=float, default=2, help="bytes per weight (2 = BF16)")
    ap.add_argument("--memory-mode", default="state", choices=MEMORY_MODES,
                    help="history mode (also the mode --break-even sets up)")
    ap.add_argument("--window", type=int, default=0, help="W for state+window (0 = config's)")
    ap.add_argument("--tpf", type=float, nargs="*", default=None, help="tokens per forward for the tokens/s lines")
    ap.add_argument("--list-devices", action="store_true", help="print the device table and exit")
    ap.add_argument("--trace", default=None, help="a recorded run (Parquet/Arrow): measured vs projected")
    ap.add_argument("--trace-config", default=None,
                    help="config of the model that recorded --trace, if the trace does not name a preset")
    ap.add_argument("--union-assumption", default="measured_vs_independent",
                    help=f"35B union for --trace: {', '.join(UNION_ASSUMPTIONS)} or a number")
    ap.add_argument("--parallel", default=None, metavar="ep=N[,tp=N]",
                    help="per-GPU projection for 1, 2, 4 ... N GPUs, experts (ep) and / or heads (tp) split")
    ap.add_argument("--break-even", action="store_true",
                    help="measure, on this machine, how many tokens per forward block decoding of --model needs "
                         "to match autoregressive decoding (clover_engine.cost.break_even)")
    ap.add_argument("--model", default=None, type=find_model_dir, help="model directory for --break-even (e.g. models/smollm2-bd)")
    ap.add_argument("--block-sizes", default="4,8,16,32", help="--break-even: block sizes to time")
    ap.add_argument("--prefix", type=int, default=256,
                    help=f"--break-even: committed tokens before the block (at most {MAX_PREFIX})")
    ap.add_argument("--repeats", type=int, default=5, help="--break-even: timed forwards per median")
    ap.add_argument("--threads", type=int, default=None, help="--break-even: torch threads (default: clover_engine.threads)")
    args = ap.parse_args(argv)

    if args.break_even:
        return _break_even_main(args, ap)
    if args.list_devices:
        print(format_devices())
        return 0
    try:
        device = get_device(args.device)
        if args.trace:
            trace = Trace.load(args.trace)
            ua: str | float = args.union_assumption
            try:
                ua = float(ua)
            except ValueError:
                pass
            # a trace of another cost family (a causal LM) has no measured unions: independent routing
            p = project_trace(trace, device, args.config, ua, source_config=args.trace_config,
                              fallback_union="independent")
            print(format_trace_projection(p, args.trace))
            return 0
        cfg = _as_config(args.config)
        if args.parallel:
            union = None if args.union == "expected" else float(args.union)
            rows = project_parallel_table(args.parallel, cfg, device, n_tokens=args.tokens, expert_union=union,
                                          n_commit_tokens=args.commit, weight_bytes=args.weight_bytes,
                                          memory_mode=args.memory_mode, window=args.window)
            print(format_parallel_table(rows, args.tpf or (1, 4, 8)))
            return 0
        if args.union == "expected":
            union = expected_union(cfg.num_experts, cfg.num_experts_per_tok, args.tokens)
        else:
            union = float(args.union)
        fc = forward_cost(cfg, args.tokens, union, args.weight_bytes, args.commit,
                          memory_mode=args.memory_mode, window=args.window)
        print(format_forward_report(cfg, device, fc, args.weight_bytes, args.tpf))
        return 0
    except (ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _break_even_main(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """``--break-even``: load ``--model`` and print `format_break_even` of its measured points."""
    if not args.model:
        ap.error("--break-even needs --model DIR (a checkpoint directory, e.g. models/smollm2-bd)")

    try:
        sizes = [int(b) for b in args.block_sizes.split(",") if b.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        ap.error(f"--block-sizes {args.block_sizes!r}: give comma-separated ints >= 1, e.g. 4,8,16,32")
    if args.repeats < 1 or args.prefix < 1:
        ap.error(f"--repeats and --prefix must be >= 1 (got {args.repeats}, {args.prefix})")
    try:
        configure_threads(args.threads)
        model = load_model(args.model)
        points = measure_break_even(model, sizes, prefix_len=args.prefix, repeats=args.repeats,
                                    memory_mode=args.memory_mode)
    except (ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # e.g. out of memory for a very long --prefix
        print(f"error: the measurement failed ({str(e).splitlines()[0][:200]}); try a shorter --prefix or smaller "
              "--block-sizes", file=sys.stderr)
        return 2
    print(format_break_even(points, str(args.model)))
    return 0
