"""LLaDA2.0's sampler as the original runs it (every forward recomputes the prompt and the finished blocks) against
the same sampler with the finished blocks in a KV cache, measured side by side on one model.

The model is a LLaDA2.0 of reduced size in the hub layout (`clover_engine.backbones.llada2_moe`: hidden
``--hidden``, ``--layers`` layers with the first dense, 32 experts in 8 groups of which 4 are kept, top-4, one
shared expert, 8 / 2 heads, a 4096-token vocabulary) with random weights, the output layer sharpened so that
slots pass the threshold; loaded in bf16, as the hub checkpoints are. For each mode it decodes the same prompt
``--repeats`` times (round-robin, medians) and prints:

* NFE (denoising forwards; with the cache, plus the prefill and one commit per finished block);
* wall time per decode and the ratio recompute / cache on this machine;
* the cost model's bytes read and FLOPs over the decode (`clover_engine.cost`), and their ratios;
* how many of the answer's tokens the two modes share (in bf16 a forward over fewer rows rounds differently, so
  they may part on a near tie: the reason recompute is the default).

    .venv/bin/python benchmarks/llada2_recompute_vs_cache.py [--gen-length 128] [--prompt 96] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from clover_engine.backbones.llada2_moe import LLaDA2Arch, LLaDA2LM, save_llada2_moe, tiny_config
from clover_engine.backbones.llada_moe import fill_random
from clover_engine.checkpoint import load_model
from clover_engine.decoding.block_diffusion_decoder import BlockDiffusionDecoder
from clover_engine.decoding.llada2_samplers import LLaDA2Sampler
from clover_engine.threads import add_threads_argument, configure_threads


def write_model(directory: Path, hidden: int, layers: int) -> Path:
    """The reduced LLaDA2.0 of the module docstring, written in the hub layout."""
    data = tiny_config(4096, hidden_size=hidden, intermediate_size=4 * hidden, moe_intermediate_size=hidden // 2,
                       num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2, head_dim=hidden // 8,
                       num_experts=32, n_group=8, topk_group=4, num_experts_per_tok=4, num_shared_experts=1,
                       first_k_dense_replace=1, mask_token_id=4095, eos_token_id=4094, max_position_embeddings=4096)
    lm = LLaDA2LM(LLaDA2Arch.from_config(data))
    fill_random(lm, 7, sharpen=60.0)
    return save_llada2_moe(lm.eval(), directory, data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=96, help="prompt tokens (default %(default)s)")
    ap.add_argument("--gen-length", type=int, default=128)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    add_threads_argument(ap)
    args = ap.parse_args()
    threads = configure_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(write_model(Path(tmp) / "llada2-reduced", args.hidden, args.layers), dtype=torch.bfloat16)
    prompt = torch.randint(10, 4000, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    decoder = BlockDiffusionDecoder(model)
    modes = {"recompute (original)": False, "kv cache": True}
    walls = {m: [] for m in modes}
    results = {}
    for _ in tqdm(range(args.repeats), desc="round-robin decodes"):
        for name, cache in modes.items():
            cfg = LLaDA2Sampler(gen_length=args.gen_length, block_length=args.block, steps=args.block, kv_cache=cache)
            t0 = time.perf_counter()
            results[name] = decoder.generate(prompt, config=cfg)
            walls[name].append(time.perf_counter() - t0)
    print(f"LLaDA2.0 reduced: hidden {args.hidden}, {args.layers} layers, {model.config.num_parameters / 1e6:.1f} M "
          f"parameters, bf16; prompt {args.prompt}, gen_length {args.gen_length}, block {args.block}; "
          f"threads={threads}, {args.repeats} rounds (medians)")
    print(f"{'mode':<22} {'NFE':>5} {'tokens':>7} {'wall s':>8} {'bytes read':>12} {'FLOPs':>12}")
    for name in modes:
        r = results[name]
        print(f"{name:<22} {r.nfe:>5} {len(r.tokens):>7} {statistics.median(walls[name]):>8.3f} "
              f"{r.bytes_read / 1e6:>10.1f}MB {r.flops / 1e9:>10.2f}G")
    a, b = results["recompute (original)"], results["kv cache"]
    same = sum(x == y for x, y in zip(a.canvas, b.canvas))
    print(f"recompute / cache: {statistics.median(walls['recompute (original)']) / statistics.median(walls['kv cache']):.2f}x "
          f"wall, {a.flops / b.flops:.2f}x FLOPs, {a.bytes_read / b.bytes_read:.2f}x bytes read")
    print(f"answers agree on {same} of {max(len(a.canvas), len(b.canvas))} tokens")


if __name__ == "__main__":
    main()
