"""Computing only the routed experts against computing all of them, at LLaDA-MoE-7B-A1B's dimensions, on the CPU.

One MoE feed-forward (`clover_engine.backbones.moe.MoEFeedForward`) at LLaDA-MoE-7B-A1B's published size
(hidden 2048, 64 experts of intermediate 1024, top-8; random weights -- the time of a forward does not
depend on their values, only the router's choices do, and a random router spreads the tokens about as
independent uniform routing would) runs forwards of T tokens in both modes, round-robin in one run,
and prints the median times, their ratio and the experts the T tokens chose (the union):

* ``routed``: only the experts some token chose run, each on its rows (the CPU path of the backbone);
* ``all``: every expert on every token, combined by the sparse routing weights (what a dense
  implementation pays).

The routed path reads the weights of the union and computes ``T * k`` expert rows; the all path reads
all E experts and computes ``T * E`` rows. A one-token forward (an autoregressive step) touches k of E
experts; a 32-slot block under random routing touches nearly all of them -- real routing within one text
is correlated, and the backbone measures its union per forward (`clover_engine.backbones.llada_moe`).

It also prints the memory arithmetic of the whole model in bf16 (the weights a lean load holds, against a
24 GB machine).

    .venv/bin/python benchmarks/moe_routed_experts.py [--tokens 1 8 32 128] [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tqdm import tqdm

from clover_engine.backbones.moe import MoEFeedForward
from clover_engine.cost.formulas import expected_union
from clover_engine.threads import add_threads_argument, configure_threads

LLADA_MOE_7B = dict(vocab_size=157184, hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
                    expert_intermediate_size=1024, num_experts=64, num_experts_per_tok=8)
"""inclusionAI/LLaDA-MoE-7B-A1B-Instruct's config.json dimensions (16 MoE layers, no shared expert)."""


def parameters(c: dict) -> dict[str, int]:
    """Parameter counts of the whole model: total and active per token (k of E experts)."""
    H, N, E, k, I, V = (c[x] for x in ("hidden_size", "num_hidden_layers", "num_experts", "num_experts_per_tok",
                                       "expert_intermediate_size", "vocab_size"))
    attention, expert, router, norms = 4 * H * H, 3 * H * I, E * H, 2 * H + 2 * (H // c["num_attention_heads"])
    total = 2 * V * H + N * (attention + router + E * expert + norms) + H
    active = 2 * V * H + N * (attention + router + k * expert + norms) + H
    return dict(total=total, active=active)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32, 128], help="tokens per forward (T)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    add_threads_argument(ap)
    args = ap.parse_args()
    configure_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    c = LLADA_MOE_7B
    H, E, k = c["hidden_size"], c["num_experts"], c["num_experts_per_tok"]
    torch.manual_seed(0)
    layer = MoEFeedForward(H, c["expert_intermediate_size"], E, k).to(dtype).eval()
    with torch.no_grad():
        layer.gate.weight.normal_(0, 0.02)
        for p in layer.experts.parameters():
            p.normal_(0, 0.02)
    layer.record = True
    rows = []
    with torch.inference_mode():
        for T in tqdm(args.tokens, desc="tokens per forward"):
            x = torch.randn(1, T, H, dtype=dtype)
            times = {"routed": [], "all": []}
            outs = {}
            for _ in range(args.repeats + 1):  # the first round warms up
                for mode in ("routed", "all"):
                    layer.mode = mode
                    t0 = time.perf_counter()
                    outs[mode] = layer(x)
                    times[mode].append(time.perf_counter() - t0)
            union = int(torch.unique(layer.last.selected).numel())
            err = float((outs["routed"].float() - outs["all"].float()).abs().max())
            t_r, t_a = statistics.median(times["routed"][1:]), statistics.median(times["all"][1:])
            rows.append((T, union, expected_union(E, k, T), t_r, t_a, err))
    print(f"\nOne MoE layer at LLaDA-MoE-7B-A1B size ({E} experts of {c['expert_intermediate_size']}, top-{k}, "
          f"hidden {H}), {args.dtype}, {torch.get_num_threads()} threads, median of {args.repeats}:")
    print(f"{'T':>5} {'union':>6} {'E[union]':>9} {'routed ms':>10} {'all ms':>9} {'all/routed':>11} "
          f"{'E/union':>8} {'max |diff|':>11}")
    for T, union, exp, t_r, t_a, err in rows:
        print(f"{T:>5} {union:>6} {exp:>9.1f} {t_r * 1e3:>10.2f} {t_a * 1e3:>9.2f} {t_a / t_r:>10.2f}x "
              f"{E / union:>7.2f}x {err:>11.2e}")
    n = parameters(c)
    gib = 2 ** 30
    print(f"\nLLaDA-MoE-7B-A1B: {n['total'] / 1e9:.2f} B parameters, {n['active'] / 1e9:.2f} B active per token; "
          f"bf16 weights {2 * n['total'] / gib:.1f} GiB. A lean load peaks at the weights plus the largest tensor "
          f"(benchmarks/load_memory.py), {2 * n['total'] / gib + 2 * c['vocab_size'] * H / gib:.1f} GiB "
          f"against a 24 GB machine's {24e9 / gib:.1f} GiB.")


if __name__ == "__main__":
    main()
