"""Expert parallel at real dimensions: LLaDA2.0-mini or SDAR-30B-A3B shapes, random weights, on the GPUs it finds.

    torchrun --standalone --nproc-per-node N benchmarks/moe_ep_gpu.py --shape llada2-mini [--layers L] \\
        [--window 544] [--block 32] [--repeats 5] [--threads 1]
    torchrun --standalone --nproc-per-node 2 benchmarks/moe_ep_gpu.py --small --threads 1   # CPU, gloo (CI)

Each of the N ranks builds the model from the published config (``tests/data/hub_configs``: LLaDA2.0-mini's
hub ``config.json``, SDAR-30B-A3B-Chat's) on the meta device, keeps only its share of every MoE layer's routed
experts (`clover_engine.backbones.moe.split_moe_layers`, the split of ``--parallel ep=N``), and makes its
weights on its device (``cuda:LOCAL_RANK``, bf16; fp32 on the CPU) from a generator seeded by each tensor's
name, so the replicated weights are the same on every rank. ``--layers L`` keeps the first L layers (a
model too large for the devices' memory). Each forward runs a window of ``--window`` tokens, as LLaDA2.0's
sampler recomputes its window every step (history and the current block of ``--block`` slots; full
attention: the FLOPs and bytes of the block-causal mask), and its MoE layers combine the ranks' experts with
one all-reduce each.

Per rank and forward it prints: the weight bytes it reads (its replicated weights, plus its own routed experts
the window's tokens chose times one expert's bytes; activations and the KV working set left out), the
measured time (median of ``--repeats``), the roofline time (bytes / the device's HBM bandwidth,
`clover_engine.cost.DEVICES` by the GPU's name; on the CPU this machine's measured bandwidth), what share of
the roofline it reaches, and ``--block`` slots per forward as tokens per second. The slowest rank bounds the
step: the last line gives the busiest rank's bytes over the mean.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import zlib
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clover_engine.backbones.moe import RemoteExpert, split_layers, split_moe_layers  # noqa: E402
from clover_engine.backbones.safetensors_shards import materialize_buffers  # noqa: E402
from clover_engine.cost import DEVICES  # noqa: E402
from clover_engine.threads import add_threads_argument, configure_threads  # noqa: E402

SHAPES = {"llada2-mini": "inclusionAI--LLaDA2.0-mini", "sdar-30b": "JetLM--SDAR-30B-A3B-Chat"}
GPU_NAMES = {"H100": "h100-sxm", "H200": "h200", "H800": "h800", "A100": "a100-80gb", "B200": "b200",
             "4090": "rtx-4090"}


def build(config: dict, layers: int | None) -> torch.nn.Module:
    """The model's LM of ``config`` (its first ``layers`` layers) on the meta device."""
    config = dict(config, num_hidden_layers=layers or config["num_hidden_layers"])
    with torch.device("meta"):
        if config["model_type"] == "llada2_moe":
            from clover_engine.backbones.llada2_moe import LLaDA2Arch, LLaDA2LM

            return LLaDA2LM(LLaDA2Arch.from_config(config))
        from clover_engine.backbones.sdar_moe import build_tiny

        return build_tiny(dict(config, mlp_only_layers=[], decoder_sparse_step=1))


def materialize(lm: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Random weights on ``device`` for every meta parameter, each from a generator seeded by its name (the same
    values on every rank): norms 1, routers N(0, 0.5), the rest N(0, 0.02); stored buffers zero, the others
    recomputed."""
    for mod_name, module in lm.named_modules():
        for name, p in list(module._parameters.items()):
            if p is None or not p.is_meta:
                continue
            full = f"{mod_name}.{name}"
            g = torch.Generator(device=device).manual_seed(zlib.crc32(full.encode()))
            if "norm" in full:
                t = torch.ones(p.shape, device=device, dtype=dtype)
            else:
                std = 0.5 if full.endswith("gate.weight") else 0.02
                t = torch.randn(p.shape, generator=g, device=device, dtype=torch.float32).mul_(std).to(dtype)
            module._parameters[name] = torch.nn.Parameter(t, requires_grad=False)
        for name, b in list(module._buffers.items()):  # stored buffers (a router's expert bias): zeros
            if b is not None and b.is_meta and name not in module._non_persistent_buffers_set:
                module._buffers[name] = torch.zeros(b.shape, dtype=b.dtype, device=device)
    materialize_buffers(lm, device)  # the rest (rotary inv_freq) as their modules compute them


def held_bytes(lm: torch.nn.Module) -> tuple[int, int]:
    """(replicated weight bytes on this rank, bytes of one routed expert of one layer)."""
    expert_ids = set()
    expert = 0
    for _, layer in split_layers(lm):
        for e in layer.experts:
            if not isinstance(e, RemoteExpert):
                expert_ids.update(id(p) for p in e.parameters())
                expert = expert or sum(p.numel() * p.element_size() for p in e.parameters())
    replicated = sum(p.numel() * p.element_size() for p in lm.parameters() if id(p) not in expert_ids)
    return replicated, expert


def bandwidth(device: torch.device) -> tuple[str, float]:
    """(device name, HBM bytes per second): the datasheet's for a known GPU, else this machine's measured."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, dev in GPU_NAMES.items():
            if key in name:
                return dev, DEVICES[dev].bandwidth_bytes_per_s
        return name, float("nan")
    from clover_engine.cost.devices import measure_this_machine  # local: a probe of about a second

    return "this CPU", measure_this_machine().bandwidth_bytes_per_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llada2-mini")
    ap.add_argument("--small", action="store_true", help="a tiny LLaDA2.0 on the CPU (gloo): seconds, for CI")
    ap.add_argument("--layers", type=int, default=None, help="keep the first L layers (default: all)")
    ap.add_argument("--window", type=int, default=544, help="tokens per forward (history + block; default 544)")
    ap.add_argument("--block", type=int, default=32, help="slots of the current block (default 32)")
    ap.add_argument("--repeats", type=int, default=5)
    add_threads_argument(ap)
    args = ap.parse_args()
    configure_threads(args.threads)
    cuda = torch.cuda.is_available() and not args.small
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if args.small:
        from clover_engine.backbones.llada2_moe import tiny_config

        config, window, block = dict(tiny_config(256), model_type="llada2_moe"), min(args.window, 48), min(args.block, 8)
    else:
        config = json.loads((ROOT / "tests" / "data" / "hub_configs" / SHAPES[args.shape] / "config.json").read_text())
        window, block = args.window, args.block
    lm = build(config, args.layers)
    split_moe_layers(lm, rank, world)
    materialize(lm, device, torch.bfloat16 if cuda else torch.float32)
    lm.eval()
    layers = [m for _, m in split_layers(lm)]
    for m in layers:
        m.record = True
    replicated, expert = held_bytes(lm)
    ids = torch.randint(0, config["vocab_size"], (1, window), generator=torch.Generator().manual_seed(0)).to(device)
    times, ran = [], []
    with torch.inference_mode():
        for i in range(args.repeats + 1):  # the first forward warms up
            dist.barrier()
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            lm(ids, use_cache=False)
            if cuda:
                torch.cuda.synchronize(device)
            if i:
                times.append(time.perf_counter() - t0)
            split = layers[0].split
            ran.append(sum(sum(1 for e in torch.unique(m.last.selected).tolist() if split.owns(e)) for m in layers))
    name, bw = bandwidth(device)
    mine = dict(rank=rank, experts_held=layers[0].split.hi - layers[0].split.lo, ran=statistics.mean(ran[1:] or ran),
                bytes=replicated + statistics.mean(ran[1:] or ran) * expert, seconds=statistics.median(times),
                device=name, bandwidth=bw)
    rows = [None] * world
    dist.all_gather_object(rows, mine)
    if rank == 0:
        shape = "tiny LLaDA2.0 (CPU)" if args.small else f"{args.shape}" + (f", first {args.layers} layers" if args.layers
                                                                             else "")
        print(f"{shape}: {world} ranks, window {window} tokens, block {block} slots, {len(layers)} MoE layers of "
              f"{layers[0].num_experts} experts; replicated weights {replicated / 1e6:,.1f} MB per rank, one expert "
              f"{expert / 1e6:,.2f} MB")
        print("| rank | device | experts held per layer | experts run per forward (all layers) | weight bytes per "
              "forward | measured | roofline | share of roofline | tokens/s (block slots) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            roof = r["bytes"] / r["bandwidth"]
            print(f"| {r['rank']} | {r['device']} | {r['experts_held']} | {r['ran']:.1f} | {r['bytes'] / 1e6:,.1f} MB | "
                  f"{r['seconds'] * 1e3:.2f} ms | {roof * 1e3:.3f} ms | {100 * roof / r['seconds']:.1f} % | "
                  f"{block / r['seconds']:,.1f} |")
        byte = [r["bytes"] for r in rows]
        print(f"busiest rank / mean bytes: {max(byte) / statistics.mean(byte):.3f}; the step takes the slowest rank's "
              f"{max(r['seconds'] for r in rows) * 1e3:.2f} ms")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
