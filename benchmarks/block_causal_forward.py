"""The shape of the win of a block-causal diffusion LM (Fast-dLLM v2 / SDAR), measured side by side.

On one model at Fast-dLLM v2 1.5B's real dimensions (Qwen2.5-1.5B: 28 layers, hidden 1536, 12 / 2 heads,
MLP 8960, vocabulary 151936; random weights -- the time of a forward does not depend on their values),
after a cached history of ``--history`` tokens, this times, round-robin in one run (medians):

* ``t_ar``: one autoregressive step (a one-token forward against the KV cache);
* ``t_block``: one denoising forward of a ``--block``-slot block against the cache (nothing kept);
* ``t_commit``: the commit forward of a finished block (the same shape, its K/V kept).

The originals decode a block of L tokens in n denoising forwards plus one commit forward, against L
autoregressive steps, so block decoding breaks even at

    tokens per denoising forward = L * t_block / (L * t_ar - t_commit)

It then decodes the tiny Fast-dLLM v2 checkpoint (`clover_engine.backbones.block_causal.write_tiny_block_causal`)
with the family's sampler and prints its measured tokens per forward, and projects the same forwards onto an
H200 from the cost model's bytes and FLOPs (`clover_engine.cost.dense_forward_cost`, roofline: a projection,
not a measurement).

    .venv/bin/python benchmarks/block_causal_forward.py [--block 32] [--history 512] [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from clover_engine.backbones.block_causal import BlockCausalConfig, BlockCausalModel, write_tiny_block_causal
from clover_engine.backbones.causal_lm.model import HFBlockConfig, count_parameters
from clover_engine.backbones.safetensors_shards import materialize_buffers
from clover_engine.checkpoint import load_model, load_tokenizer
from clover_engine.cost import dense_forward_cost, roofline_time_s
from clover_engine.decoding.block_diffusion_decoder import BlockDiffusionDecoder
from clover_engine.decoding.block_diffusion_samplers import FastDLLMv2Sampler
from clover_engine.threads import add_threads_argument, configure_threads

QWEN25_15B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, eos_token_id=151645, bos_token_id=151643)
"""Qwen2.5-1.5B-Instruct's config.json dimensions, the base of Efficient-Large-Model/Fast_dLLM_v2_1.5B."""


def real_size_model(dtype: torch.dtype) -> BlockCausalModel:
    """The 1.5B model with random weights (built on the meta device, then filled: no init pass)."""
    import transformers

    hf = transformers.Qwen2Config(**QWEN25_15B)
    with torch.device("meta"):
        lm = transformers.Qwen2ForCausalLM(hf)
    lm = lm.to_empty(device="cpu").to(dtype)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in tqdm(list(lm.named_parameters()), desc="random weights", leave=False):
            p.copy_(torch.randn(p.shape, generator=g) * (0.02 if p.dim() > 1 else 1.0))
    materialize_buffers(lm, "cpu")  # the rotary tables, recomputed (to_empty left them uninitialised)
    lm.eval()
    base = HFBlockConfig.from_hf(hf, "fast-dllm-v2-1.5B-dims", 151665, num_parameters=count_parameters(lm))
    return BlockCausalModel(lm, BlockCausalConfig(**base.__dict__, family="fast_dllm_v2", logit_shift=True,
                                                  block_size=32)).eval()


@torch.inference_mode()
def time_forwards(model: BlockCausalModel, block: int, history: int, repeats: int) -> dict[str, float]:
    state = model.setup_state()
    ids = torch.randint(10, 150000, (1, history + block))
    for i in range(0, history, 256):  # the cached history, committed in chunks
        model.extend(state, ids[0, i: min(i + 256, history)], block)
    times: dict[str, list[float]] = {"ar": [], "block": [], "commit": []}
    for r in tqdm(range(repeats + 1), desc="round-robin forwards", leave=False):
        for kind in times:
            t0 = time.perf_counter()
            if kind == "ar":
                model.block_logits(state, ids[:, history: history + 1])
            elif kind == "block":
                model.block_logits(state, ids[:, history: history + block])
            else:
                model.extend(state, ids[0, history: history + block], block)
                state.cache.crop(-block)
                del state.committed[-block:]
            if r:  # the first round warms up
                times[kind].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--history", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    add_threads_argument(ap)
    args = ap.parse_args()
    configure_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    model = real_size_model(dtype)
    L = args.block
    t = time_forwards(model, L, args.history, args.repeats)
    print(f"Fast-dLLM v2 1.5B dimensions, {args.dtype}, random weights, history {args.history} cached tokens, "
          f"{torch.get_num_threads()} threads, medians of {args.repeats}")
    print(f"  AR step (1 token)          {t['ar'] * 1e3:9.1f} ms")
    print(f"  block forward ({L} slots)  {t['block'] * 1e3:9.1f} ms   = {t['block'] / t['ar']:.2f} x the AR step")
    print(f"  commit forward ({L} tokens) {t['commit'] * 1e3:9.1f} ms   = {t['commit'] / t['ar']:.2f} x the AR step")
    denom = L * t["ar"] - t["commit"]
    be = L * t["block"] / denom if denom > 0 else float("inf")
    print(f"  break-even on this machine: {be:.2f} tokens per denoising forward "
          f"(L*t_block / (L*t_ar - t_commit))")

    cfg = model.config
    del model
    bytes_per = 2  # bf16 weights and activations on the GPU
    fwd = {
        "ar": dense_forward_cost(cfg, 1, bytes_per, 0, 1, context_len=args.history),
        "block": dense_forward_cost(cfg, L, bytes_per, 0, L, context_len=args.history),
        "commit": dense_forward_cost(cfg, L, bytes_per, L, 0, context_len=args.history),
    }
    proj = {k: roofline_time_s(c.bytes_read, c.flops, "h200") for k, c in fwd.items()}
    denom = L * proj["ar"] - proj["commit"]
    be_h200 = L * proj["block"] / denom if denom > 0 else float("inf")
    print(f"projection, H200 (bf16, roofline of the cost model's bytes and FLOPs; not measured): AR step "
          f"{proj['ar'] * 1e6:.0f} us, block forward {proj['block'] * 1e6:.0f} us "
          f"(= {proj['block'] / proj['ar']:.2f} x), commit {proj['commit'] * 1e6:.0f} us; break-even {be_h200:.2f} "
          "tokens per denoising forward")

    with tempfile.TemporaryDirectory() as tmp:
        d = write_tiny_block_causal(Path(tmp) / "tiny", "Fast_dLLM_Qwen")
        tiny, tok = load_model(d), load_tokenizer(d)
        r = BlockDiffusionDecoder(tiny, tok, FastDLLMv2Sampler(max_new_tokens=128, block_size=32, threshold=0.9)).generate(
            "What is the capital of France?", record_trace=False)
        print(f"tiny random Fast-dLLM v2 checkpoint, its sampler (threshold > 0.9, sub-blocks of 8): {len(r.tokens)} "
              f"tokens in {r.nfe} forwards = {r.tokens_per_forward:.2f} tokens per forward (commits included); "
              f"break-even here {be:.2f}, projected on H200 {be_h200:.2f}")


if __name__ == "__main__":
    main()
