"""``python -m clover_engine.plan`` (``clover-explorer plan``): a checkpoint's memory per device before any load.

    clover-explorer plan inclusionAI/LLaDA2.0-flash --devices 8 --dtype bfloat16
    clover-explorer plan ./LLaDA-MoE-7B-A1B-Instruct --devices 1,2,4 --device rtx-4090

Reads only the safetensors headers (a hub id's from the hub, by range requests, or from the local cache),
never a weight, and needs no GPU (`clover_engine.cost.plan`). Prints the checkpoint's
parameters and bytes, the largest per-device share for each device count when the routed experts split
over the devices (`clover_engine.decoding.parallel`'s split), what it needs with the measured x1.05 peak,
which listed devices hold it, and the smallest device count that fits each.

Wing: ``entry points``.
"""

from __future__ import annotations

import argparse
import sys

from clover_engine.checkpoint import find_model_dir
from clover_engine.cost.plan import DEVICE_MEMORY_BYTES, format_plan, plan, read_layout


def _counts(text: str) -> list[int]:
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected device counts >= 1, e.g. 8 or 1,2,4,8; got {text!r}")
    return counts


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m clover_engine.plan`` argument parser."""
    p = argparse.ArgumentParser(prog="python -m clover_engine.plan", description=__doc__.splitlines()[0])
    p.add_argument("model", help="a checkpoint directory, a bundled model's name, or a hub id org/name[@revision]")
    p.add_argument("--devices", type=_counts, default=[1, 2, 4, 8], metavar="N[,N...]",
                   help="device counts to plan (a single N plans 1, 2, 4 ... up to N; default 1,2,4,8)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="count the floating weights at this dtype, as a load with --dtype makes them (default: as "
                        "stored)")
    p.add_argument("--device", choices=sorted(DEVICE_MEMORY_BYTES), default=None,
                   help="report the smallest count of this device alone (default: every listed device)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    counts = args.devices
    if len(counts) == 1 and counts[0] > 1:  # --devices 8: the powers of two up to it, and 8 itself
        n = counts[0]
        counts = sorted({2 ** k for k in range(n.bit_length()) if 2 ** k <= n} | {n})
    try:
        layout = read_layout(find_model_dir(args.model), args.dtype)
        print(format_plan(layout, plan(layout, counts), args.device))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
