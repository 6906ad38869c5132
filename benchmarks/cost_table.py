"""Projected tokens/s of block diffusion vs autoregressive decoding, 35B-A3B on H800 (no timing).

The seed's argument as one table: each row is a tokens-per-forward (TPF) that
the decoder achieves at block size 32; each column an assumption for the
expert union per layer of a 32-token forward (8 = a single token's top-8, the
best case; 17 = what the write-ups' "1.4x the AR bytes" implies; 32 = the
seed's example, 2.02x; "expected" = independent top-8-of-256 routing, 163.3).
Cells are the roofline-bound tokens/s as a ratio to the AR bound (568 tokens/s,
`clover_engine.cost.ar_step_cost`), both projected from `clover_engine.cost`.

A block of 32 tokens takes ``32 / TPF`` forwards of 32 slots; one of them
also carries the fused commit of the previous block (64 tokens: the commit's
state write and extra FLOPs, the same union assumption applied to 64 tokens,
capped at 256). A ratio above 1.00 means block diffusion beats AR on this
device at that TPF.

Run: ``.venv/bin/python benchmarks/cost_table.py [--device h800] [--config clover-35b-a3b]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clover_engine.backbones.clover.config import CloverConfig  # noqa: E402
from clover_engine.cost import ar_step_cost, expected_union, forward_cost, get_device  # noqa: E402
from clover_engine.threads import add_threads_argument, configure_threads  # noqa: E402

BLOCK = 32
TPFS = (1, 2, 3, 4, 6, 8)
UNIONS = (8, 17, 32, "expected")


def block_tokens_per_s(cfg: CloverConfig, device, tpf: float, union: int | str) -> float:
    """Roofline tokens/s of decoding blocks of `BLOCK` tokens at `tpf` tokens per forward."""
    E, k = cfg.num_experts, cfg.num_experts_per_tok

    def u(n_tokens: int) -> float:
        if union == "expected":
            return expected_union(E, k, n_tokens)
        return min(float(union), E, n_tokens * k)

    plain = forward_cost(cfg, BLOCK, u(BLOCK)).roofline_time_s(device)
    fused = forward_cost(cfg, 2 * BLOCK, u(2 * BLOCK), n_commit_tokens=BLOCK, commit_block_len=BLOCK)
    n_forwards = BLOCK / tpf
    block_s = (n_forwards - 1) * plain + fused.roofline_time_s(device)
    return BLOCK / block_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="h800")
    ap.add_argument("--config", default="clover-35b-a3b")
    add_threads_argument(ap)
    args = ap.parse_args(argv)
    configure_threads(args.threads)
    cfg = CloverConfig.from_name(args.config)
    device = get_device(args.device)
    ar = 1 / ar_step_cost(cfg).roofline_time_s(device)

    print(f"{cfg.name} on {device.name}, BF16, block {BLOCK}: projected tokens/s bound, ratio vs AR")
    print(f"AR baseline (1 token, union {cfg.num_experts_per_tok}, weights only): {ar:.1f} tokens/s")
    expected = expected_union(cfg.num_experts, cfg.num_experts_per_tok, BLOCK)
    labels = [f"union {x}" if x != "expected" else f"union {expected:.1f}*" for x in UNIONS]
    print(f"{'TPF':>5}" + "".join(f"{label:>16}" for label in labels))
    for tpf in TPFS:
        cells = []
        for union in UNIONS:
            tps = block_tokens_per_s(cfg, device, tpf, union)
            cells.append(f"{tps / ar:>8.2f}x {tps:>6.0f}")
        print(f"{tpf:>5}" + "".join(f"{c:>16}" for c in cells))
    print("* expected union of 32 tokens under independent top-8-of-256 routing; cells: ratio, tokens/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
