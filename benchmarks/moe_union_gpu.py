"""The expert union of LLaDA-MoE-7B-A1B against block size, on a lent GPU, from its hub id.

Loads ``--model`` (default ``inclusionAI/LLaDA-MoE-7B-A1B-Instruct``, bf16, about 15 GB; a path works
too), decodes ``--prompt`` with LLaDA's sampler (greedy, low-confidence remasking, as its model card
runs it), then measures on that text the mean union of a block's slots per MoE layer for block sizes
1 .. 64 (`clover_engine.cost.moe_union.block_union_growth`), prices a forward of each size under the
measured union, under top-k x slots and under all experts (`bytes_per_step`), prints the bytes and the
tokens-per-second bounds on H200 and H800 (roofline, at the decode's measured tokens per forward
for B = its block length, B slots per forward otherwise), and writes ``union_vs_block_size.html`` /
``.json`` into ``--out``. Run it where the hub (or a filled cache) and a GPU are:

    .venv/bin/python benchmarks/moe_union_gpu.py --out "$OUT" [--model ID] [--device cuda] [--threads 8]

On a CPU it runs too (``--device cpu``, slowly: the 7B checkpoint's 14 GiB fit a 24 GB machine).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch
from tqdm import tqdm

from clover_engine.checkpoint import load_model, load_tokenizer
from clover_engine.cost.moe_union import BLOCK_SIZES, block_union_growth, bytes_per_step, tokens_per_s_bound
from clover_engine.decoding.masked_diffusion_decoder import MaskedDiffusionDecoder
from clover_engine.decoding.masked_diffusion_samplers import LLaDASampler
from clover_engine.threads import add_threads_argument, configure_threads

PROMPT = "Explain in a few sentences why the sky is blue, then give one everyday example of the same effect."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="inclusionAI/LLaDA-MoE-7B-A1B-Instruct")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gen-length", type=int, default=128)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--out", type=Path, default=Path("."))
    add_threads_argument(ap)
    args = ap.parse_args()
    configure_threads(args.threads)
    model = load_model(args.model, device=args.device, dtype=torch.bfloat16)
    tok = load_tokenizer(args.model)
    cfg = LLaDASampler(gen_length=args.gen_length, block_length=args.block_length, steps=args.gen_length)
    result = MaskedDiffusionDecoder(model, tok).generate(args.prompt, config=cfg)
    prompt_ids = list(result.trace.prompt_ids)
    tpf = len(result.canvas) / max(result.nfe, 1)
    print(f"{args.model}: NFE={result.nfe}, {tpf:.2f} tokens per forward\n{result.text[:300]}")
    sizes = [b for b in BLOCK_SIZES if b <= len(result.canvas)]
    growth = {}
    for B in tqdm(sizes, desc="block sizes"):
        growth.update(block_union_growth(model, prompt_ids + list(result.canvas), len(prompt_ids), [B]))
    mc = model.config
    rows = []
    for B, u in growth.items():
        b = bytes_per_step(mc, B, u)
        per_forward = tpf if B == args.block_length else B
        rows.append(dict(block_size=B, union_mean=float(np.mean(u)), union_per_layer=u.tolist(),
                         bytes_union=b["union"], bytes_topk_slots=b["top-k x slots"], bytes_all=b["all experts"],
                         **{f"tokens_per_s_{d}": tokens_per_s_bound(b["union"], b["flops"], per_forward, d)
                            for d in ("H200", "H800")}))
    print(f"\n{'B':>3} {'union':>6} {'GB union':>9} {'GB k*B':>8} {'GB all':>8} {'tok/s H200':>11} {'tok/s H800':>11}")
    for r in rows:
        print(f"{r['block_size']:>3} {r['union_mean']:>6.1f} {r['bytes_union'] / 1e9:>9.2f} "
              f"{r['bytes_topk_slots'] / 1e9:>8.2f} {r['bytes_all'] / 1e9:>8.2f} {r['tokens_per_s_H200']:>11.0f} "
              f"{r['tokens_per_s_H800']:>11.0f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "union_vs_block_size.json").write_text(json.dumps(dict(model=args.model, rows=rows), indent=1))
    k, E = mc.num_experts_per_tok, mc.num_experts
    fig = go.Figure([go.Scatter(x=sizes, y=[r["union_mean"] for r in rows], mode="lines+markers", name="measured"),
                     go.Scatter(x=sizes, y=[min(E, k * b) for b in sizes], mode="lines", name="top-k x slots",
                                line=dict(dash="dot")),
                     go.Scatter(x=sizes, y=[E] * len(sizes), mode="lines", name="all experts", line=dict(dash="dash"))])
    fig.update_layout(title=f"Expert union of a block vs block size -- {args.model}", xaxis_title="block size (slots)",
                      yaxis_title="distinct experts per MoE layer (mean)", xaxis_type="log")
    fig.write_html(args.out / "union_vs_block_size.html")
    print(f"wrote {args.out / 'union_vs_block_size.html'}")


if __name__ == "__main__":
    main()
