"""Training throughput on this machine: tokens/s and achieved FLOP/s against its measured matmul peak.

    .venv/bin/python benchmarks/train_throughput.py                      # tiny preset, 1 thread, ~2 min
    .venv/bin/python benchmarks/train_throughput.py --threads 2 --steps 4

Each variant runs ``--steps`` optimizer steps of `clover_engine.training.loop.train_step` (the training
loop's own step: block-diffusion forward over clean ++ noisy rows, masked-slot cross-entropy,
backward, clipped AdamW) on the same random batches, after one warm-up step:

* ``loop shape``: the loop's row shape for block 32 (`ROW_SHAPE`: 2 rows x 1024 tokens);
* ``4x rows``: ``--batch-mult 4`` (8 rows x 1024), fewer optimizer steps per token;
* ``short rows``: 8 rows x 256 tokens (the same tokens per step as the loop shape x 1).

FLOPs per step are counted, not estimated: ``torch.utils.flop_counter.FlopCounterMode`` over one
step (every matmul / conv / attention op of forward and backward, 2 FLOPs per multiply-add). The
peak is measured in the same run: the median FLOP/s of a square fp32 ``torch.mm`` (``--peak-n``)
at the same thread count. Achieved / peak says how far the step is from being compute-bound;
tokens/s counts clean tokens (each row's sequence once, not its noisy copy).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tqdm import tqdm

from clover_engine.threads import add_threads_argument, configure_threads


def matmul_peak(n: int, repeats: int = 5) -> float:
    """Median FLOP/s of an [n, n] @ [n, n] fp32 matmul (2 n^3 FLOPs) on this thread count."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n ** 3 / statistics.median(times)


def make_batches(cfg, rows: int, T: int, L: int, n: int, seed: int):
    """`n` random `Batch` es of [rows, T] tokens, each block half masked (the loop's mean noise)."""
    from clover_engine.training.loop import Batch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        clean = torch.randint(8, cfg.vocab_size, (rows, T), generator=g)
        noisy = clean.clone()
        noisy[torch.rand(rows, T, generator=g) < 0.5] = cfg.mask_token_id
        out.append(Batch(clean, noisy, torch.zeros(rows, T, dtype=torch.bool), L, False))
    return out


def measure(model, opt, batches, use_window: bool) -> tuple[float, float]:
    """(median seconds per step over `batches[1:]`, FLOPs of one step counted on batches[0])."""
    from torch.utils.flop_counter import FlopCounterMode

    from clover_engine.training.loop import train_step

    with FlopCounterMode(display=False) as counter:
        train_step(model, opt, batches[0], use_window, 1e-4, 1.0)  # also the warm-up
    times = []
    for b in batches[1:]:
        t = time.perf_counter()
        train_step(model, opt, b, use_window, 1e-4, 1.0)
        times.append(time.perf_counter() - t)
    return statistics.median(times), float(counter.get_total_flops())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", choices=["tiny", "small", "test"],
                    help="clover_engine.train preset (tiny, small) or clover-test (a seconds-long CI check)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per variant (after one warm-up step)")
    ap.add_argument("--peak-n", type=int, default=1024, help="matmul size for the measured peak")
    ap.add_argument("--window", action="store_true", help="train in state+window mode (W = the preset's)")
    ap.add_argument("--seed", type=int, default=0)
    add_threads_argument(ap)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.peak_n < 64:
        ap.error("--steps must be >= 1 and --peak-n >= 64")
    threads = configure_threads(args.threads)

    from clover_engine.backbones.clover.model import CloverModel
    from clover_engine.training.surgery import small_config, tiny_config
    from clover_engine.training.loop import ROW_SHAPE, make_optimizer

    from clover_engine.backbones.clover.config import CloverConfig

    cfg = {"tiny": tiny_config, "small": small_config, "test": lambda: CloverConfig.from_name("clover-test")}[args.size]()
    T, rows = ROW_SHAPE[32]
    if args.size == "test":
        T = 128
    variants = [("loop shape", rows, T), ("4x rows", 4 * rows, T), ("short rows", 4 * rows, T // 4)]
    torch.manual_seed(args.seed)
    model = CloverModel(cfg).train()
    opt = make_optimizer(model, 1e-4, 1.0)
    peak_before = matmul_peak(args.peak_n)
    results = []
    for name, r, t in tqdm(variants, desc="variants"):
        batches = make_batches(cfg, r, t, 32, args.steps + 1, args.seed)
        step_s, flops = measure(model, opt, batches, args.window)
        results.append((name, r, t, step_s, flops))
    peak = (peak_before + matmul_peak(args.peak_n)) / 2  # before and after: the load may move

    n_params = sum(p.numel() for p in model.parameters())
    print(f"{cfg.name} ({n_params / 1e6:.1f}M parameters), fp32, {threads} thread(s), block 32, "
          f"{'state+window' if args.window else 'state'}; median of {args.steps} steps after a warm-up; "
          f"measured matmul peak {peak / 1e9:.1f} GFLOP/s ({args.peak_n}^3 fp32 mm)")
    print()
    print("| rows x tokens | variant | s / step | clean tokens/s | GFLOP / step (counted) | achieved GFLOP/s | "
          "/ matmul peak |")
    print("|---|---|---|---|---|---|---|")
    for name, r, t, step_s, flops in results:
        print(f"| {r} x {t} | {name} | {step_s:.2f} | {r * t / step_s:,.0f} | {flops / 1e9:.4g} | "
              f"{flops / step_s / 1e9:.2f} | {flops / step_s / peak:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
