"""Per-forward time of a Clover preset with random weights: measured against the cost model's roofline.

    .venv/bin/python benchmarks/gpu_forward.py                       # clover-35b-a3b, bf16, on the GPU
    .venv/bin/python benchmarks/gpu_forward.py --preset clover-test --device cpu --repeats 3   # CPU / CI

The model is built directly on ``--device`` in ``--dtype`` (`clover_engine.backbones.clover.model.random_model`: the
35B-A3B preset in bf16, ~69 GB, never exists on the host). Its state sits at position
``--position`` (history is state: the content does not change the time). Forwards timed, each
the median of ``--repeats`` after ``--warmup``:

* ``AR``: one token plus the commit of the previous one (``block_size=1``, C = 1, L = 1);
* ``block L``: a denoising forward over L = 32 / 64 slots (C = 0);
* ``block L + commit``: the fused commit of the finished block with the next block's first
  forward (C = L, L slots).

Routing is forced through each layer's router (the ``mlp.gate`` linear is swapped for one that
emits chosen logits; the rest of the MoE is the model's own): ``independent`` draws every
token's top-k uniformly at random (expected union ``E (1 - (1 - k/E)^T)``), ``correlated``
lets every token of a forward pick its k experts from one pool of 2k per layer and forward
(union <= 2k), as the tokens of one text tend to.

Columns: the measured expert union (mean over layers), bytes and FLOPs from `clover_engine.cost`
(`forward_cost` with that union, at the weights' dtype), achieved GB/s = bytes / time, the
share of the roofline (roofline time / measured time, `clover_engine.cost.devices`: the H200 / H800
datasheet by the GPU's name, ``this-machine`` on a CPU) and tokens/s at 1, 3, 5 and 10
tokens per forward: AR is 1 / time; a block of L tokens at TPF t takes L / t forwards, one of
them the fused commit, so tokens/s = L / ((L / t - 1) * t_block + t_commit).

On CUDA a second table (`graph_table`, skip with ``--no-graphs``) times each forward eagerly and
replayed from a CUDA graph (`clover_engine.backbones.clover.cuda_graphs`) with the model's own router, beside the kernels
one eager forward launches.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from clover_engine.threads import add_threads_argument, configure_threads

TPFS = (1, 3, 5, 10)
ROUTINGS = ("independent", "correlated")


class ForcedRouter(torch.nn.Module):
    """Stands in for a layer's router linear: logits [T, E] that make the top-k the experts drawn here.

    Args:
        num_experts: E; top_k: k; mode: ``independent`` or ``correlated``; generator: a torch
            generator on the model's device.
    """

    def __init__(self, num_experts: int, top_k: int, mode: str, generator: torch.Generator):
        super().__init__()
        if mode not in ROUTINGS:
            raise ValueError(f"routing must be one of {ROUTINGS}, got {mode!r}")
        self.E, self.k, self.mode, self.gen = num_experts, top_k, mode, generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., D] -> logits [..., E] in x's dtype."""
        T = x.reshape(-1, x.shape[-1]).shape[0]
        noise = torch.rand(T, self.E, device=x.device, generator=self.gen)  # distinct logits, random order
        if self.mode == "correlated":  # one pool of 2k experts per forward, shared by its tokens
            pool = torch.randperm(self.E, device=x.device, generator=self.gen)[: min(2 * self.k, self.E)]
            noise[:, pool] += 2.0
        return (noise * 8.0).to(x.dtype).reshape(*x.shape[:-1], self.E)


def pick_roofline_device(device) -> str:
    """The `clover_engine.cost.devices` entry for the torch device: by GPU name (H200, H800, H100), else
    ``this-machine`` (measured)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device).upper()
        for key, entry in (("H200", "h200"), ("H800", "h800"), ("H100", "h100-sxm")):
            if key in name:
                return entry
        return "h800"
    return "this-machine"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="clover-35b-a3b", help="CloverConfig preset (clover-test for a CPU check)")
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                    help="weights' dtype (default bf16 on a GPU, fp32 on a CPU)")
    ap.add_argument("--blocks", type=int, nargs="+", default=[32, 64], help="block sizes to time")
    ap.add_argument("--position", type=int, default=4096, help="tokens already committed (state position)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--roofline", default=None, help="clover_engine.cost device for the roofline (default: by GPU name)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-graphs", action="store_true",
                    help="skip the CUDA-graph table (eager vs replay; CUDA only, the model's own router)")
    add_threads_argument(ap)
    args = ap.parse_args(argv)
    threads = configure_threads(args.threads)
    if args.repeats < 1 or args.warmup < 0 or args.position < 0 or any(b < 1 for b in args.blocks):
        ap.error("--repeats and --blocks must be >= 1, --warmup and --position >= 0")

    from clover_engine.backbones.clover.config import CloverConfig
    from clover_engine.cost import forward_cost, get_device
    from clover_engine.backbones.clover.model import random_model

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {device}: CUDA is not available here; use --device cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    try:
        cfg = CloverConfig.from_name(args.preset)
    except ValueError as e:
        ap.error(str(e))
    if args.position + 2 * max(args.blocks) > cfg.max_position_embeddings:
        ap.error(f"--position {args.position} leaves no room for the blocks in {cfg.max_position_embeddings} positions")
    roof = get_device(args.roofline or pick_roofline_device(device))

    t0 = time.perf_counter()
    model = random_model(cfg, seed=args.seed, device=device, dtype=dtype)
    build_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    ids = lambda n: torch.randint(0, cfg.vocab_size - 2, (1, n), device=device, generator=gen)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    shapes = [("AR (1 + commit 1)", 1, 1, 1)]  # name, C, L, commit block length
    for b in args.blocks:
        shapes += [(f"block {b}", 0, b, b), (f"block {b} + commit", b, b, b)]
    rows = {}  # (routing, name) -> (median s, mean union, cost)
    for routing in ROUTINGS:
        originals = []
        for layer in model.layers:
            originals.append(layer.mlp.gate)
            layer.mlp.gate = ForcedRouter(cfg.num_experts, cfg.num_experts_per_tok, routing, gen)
        state = model.setup_state(1)
        with torch.inference_mode():
            for name, C, L, blk in shapes:
                times, unions = [], []
                for i in range(args.warmup + args.repeats):
                    block, commit = ids(L), (ids(C) if C else None)
                    state.position = args.position - (args.position % blk)  # a block boundary
                    sync()
                    t = time.perf_counter()
                    out = model(block, state, commit_ids=commit, block_size=blk)
                    sync()
                    if i >= args.warmup:
                        times.append(time.perf_counter() - t)
                        unions.append(out.expert_union.tolist())
                per_layer = [statistics.mean(u[j] for u in unions) for j in range(cfg.num_hidden_layers)]
                cost = forward_cost(cfg, C + L, per_layer, weight_bytes=dtype.itemsize, n_commit_tokens=C,
                                    block_len=L, commit_block_len=blk)
                rows[routing, name] = (statistics.median(times), statistics.mean(per_layer), cost)
        for layer, gate in zip(model.layers, originals):
            layer.mlp.gate = gate

    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {threads} threads"
    print(f"{cfg.name}: {n_params / 1e6:,.1f}M parameters, {str(dtype).replace('torch.', '')} random weights, "
          f"built on {device} ({dev_name}) in {build_s:.1f} s; state at position {args.position}; "
          f"median of {args.repeats} after {args.warmup} warm-up; roofline: {roof.name} "
          f"({roof.bandwidth_bytes_per_s / 1e9:,.0f} GB/s, {roof.peak_flops / 1e9:,.0f} GFLOP/s)")
    print()
    print("| routing | forward | tokens | union (mean/layer) | ms | MB read | GFLOP | GB/s | % roofline | "
          + " | ".join(f"tok/s @TPF {t}" for t in TPFS) + " |")
    print("|---|---|---|---|---|---|---|---|---|" + "---|" * len(TPFS))
    for routing in ROUTINGS:
        for name, C, L, blk in shapes:
            s, union, cost = rows[routing, name]
            if name.startswith("AR"):
                tps = [f"{1 / s:.1f}" if t == 1 else "-" for t in TPFS]
            elif name.endswith("commit"):
                tps = [""] * len(TPFS)
            else:
                s_commit = rows[routing, f"{name} + commit"][0]
                tps = [f"{L / ((L / t - 1) * s + s_commit):.1f}" if t <= L else "-" for t in TPFS]
            print(f"| {routing} | {name} | {C + L} | {union:.1f} | {s * 1e3:.2f} | {cost.bytes_read / 1e6:,.1f} | "
                  f"{cost.flops / 1e9:,.3f} | {cost.bytes_read / s / 1e9:.1f} | "
                  f"{100 * cost.roofline_time_s(roof) / s:.1f} | " + " | ".join(tps) + " |")
    if device.type == "cuda" and not args.no_graphs:
        print()
        graph_table(model, shapes, ids, args.position, args.repeats, args.warmup, sync)
    return 0


def graph_table(model, shapes, ids, position: int, repeats: int, warmup: int, sync) -> None:
    """Eager forward vs CUDA-graph replay (`clover_engine.backbones.clover.cuda_graphs`) per shape, the model's own router:
    median ms of each, kernels launched by one eager forward (torch.profiler's CUDA events) against
    the one graph launch of a replay, and the time a replay saves per eager kernel launch."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    from clover_engine.backbones.clover.cuda_graphs import disable_cuda_graphs, enable_cuda_graphs

    print("| forward | eager ms | graph replay ms | eager / replay | kernels per eager forward | "
          "launches per replay | saved per kernel (us) |")
    print("|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for name, C, L, blk in shapes:
            block, commit = ids(L), (ids(C) if C else None)
            state = model.setup_state(1)
            base = position - (position % blk)

            def forward():
                state.position = base
                return model(block, state, commit_ids=commit, block_size=blk)

            def timed() -> float:
                times = []
                for i in range(warmup + repeats):
                    sync()
                    t = time.perf_counter()
                    forward()
                    sync()
                    if i >= warmup:
                        times.append(time.perf_counter() - t)
                return statistics.median(times)

            eager = timed()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                forward()
                sync()
            kernels = sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)
            runner = enable_cuda_graphs(model)
            try:
                replay = timed()
                replays = runner.replays
            finally:
                disable_cuda_graphs(model)
            if not replays:
                print(f"| {name} | {eager * 1e3:.2f} | (not replayed: a prefill shape runs eagerly) | | {kernels} | | |")
                continue
            saved = (eager - replay) / max(kernels, 1) * 1e6
            print(f"| {name} | {eager * 1e3:.2f} | {replay * 1e3:.2f} | {eager / replay:.2f}x | {kernels} | 1 | "
                  f"{saved:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
