"""Decode speed of this engine against transformers' own ``generate``, side by side in one run.

    .venv/bin/python benchmarks/vs_transformers.py [--model models/clover-tiny] [--prompt-tokens 64] \\
        [--new-tokens 128] [--rounds 3] [--threads 1] [--device cpu] [--compile]

Four decodes of ``--new-tokens`` tokens after the same ``--prompt-tokens``-token prompt:

* **transformers**: ``Qwen3_5MoeForCausalLM.generate`` (greedy, EOS ignored via
  ``min_new_tokens``), random weights, a config with the model's own dimensions (hidden,
  layers and their types, heads, experts, vocabulary); on a machine without
  flash-linear-attention / causal-conv1d it runs its plain-torch fallbacks;
* **engine bs1**: `clover_engine.decoding.decoder.BlockDecoder` at ``block_size=1`` (greedy autoregressive),
  no hooks, no trace;
* **engine b32**: block 32 / threshold 0.95 without hooks and without a trace;
* **engine b32 + hooks**: the same with a counting hook and the full trace recorded;
* with ``--compile`` (CPU only), also **engine bs1, torch.compile**: a second copy of the model
  whose few-token forwards run the layer stack as one TorchInductor graph (`clover_engine.backbones.clover.compiled`;
  compiled during the warm-up round, which is not counted).

The rounds interleave the four decodes (one warm-up round first, not counted); tokens/s is the
median over rounds of generated tokens / seconds, by wall time and by this process's CPU time (on
a loaded shared machine the CPU time drifts less: waiting for a core is not counted). Ratios are taken within each round (its
decodes run back to back) and their median over rounds is printed: engine / transformers, and
the hooks' overhead ``1 - hooks / no hooks`` at block 32 (tokens per forward are equal, the
decodes being identical: checked and printed; the script exits 1 if they differ, and likewise if
the compiled block_size-1 decode writes other tokens than the eager one). Only ratios
from one run mean anything on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clover_engine.checkpoint import DEFAULT_MODEL_DIR
from clover_engine.threads import add_threads_argument, configure_threads

PROMPT_TEXT = (
    "def parse_args(argv):\n    parser = argparse.ArgumentParser(description='Copy files.')\n"
    "    parser.add_argument('src', help='source directory')\n    parser.add_argument('dst')\n"
    "    parser.add_argument('--dry-run', action='store_true')\n    return parser.parse_args(argv)\n\n\n"
    "def main(argv=None):\n    args = parse_args(argv)\n    for name in sorted(os.listdir(args.src)):\n"
)


def transformers_model(cfg, device: str = "cpu"):
    """A random-weight transformers ``Qwen3_5MoeForCausalLM`` with `cfg`'s dimensions.

    Args:
        cfg: a `clover_engine.backbones.clover.config.CloverConfig` (its hidden size, layer types, GDN and attention heads,
            experts, vocabulary and RoPE settings are copied; Clover's own additions are not).
        device: where to build it.

    Returns:
        The model in eval mode, fp32.
    """
    import torch
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    hf = Qwen3_5MoeTextConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
        layer_types=list(cfg.layer_types), num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        linear_num_key_heads=cfg.linear_num_key_heads, linear_num_value_heads=cfg.linear_num_value_heads,
        linear_key_head_dim=cfg.linear_key_head_dim, linear_value_head_dim=cfg.linear_value_head_dim,
        linear_conv_kernel_dim=cfg.linear_conv_kernel_dim, num_experts=cfg.num_experts,
        num_experts_per_tok=cfg.num_experts_per_tok, moe_intermediate_size=cfg.moe_intermediate_size,
        shared_expert_intermediate_size=cfg.shared_expert_intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta,
                         "partial_rotary_factor": cfg.partial_rotary_factor},
        eos_token_id=cfg.eos_token_id, pad_token_id=cfg.eos_token_id, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return Qwen3_5MoeForCausalLM(hf).to(device).eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL_DIR, help="Clover checkpoint directory")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    ap.add_argument("--device", default="cpu", help="torch device for both models (cpu, cuda)")
    ap.add_argument("--compile", action="store_true",
                    help="add engine block_size 1 with torch.compile'd layers (clover_engine.backbones.clover.compiled; needs a C++ compiler)")
    add_threads_argument(ap)
    args = ap.parse_args(argv)
    threads = configure_threads(args.threads)
    if args.prompt_tokens < 1 or args.new_tokens < 1 or args.rounds < 1:
        ap.error("--prompt-tokens, --new-tokens and --rounds must be >= 1")

    import torch

    from clover_engine.checkpoint import load_model, load_tokenizer
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig

    model = load_model(args.model, device=args.device)
    tok = load_tokenizer(args.model)
    cfg = model.config
    ids = tok.encode(PROMPT_TEXT * 4).ids[: args.prompt_tokens]
    if len(ids) < args.prompt_tokens:
        ap.error(f"the built-in prompt has only {len(ids)} tokens; use --prompt-tokens <= {len(ids)}")
    hf = transformers_model(cfg, args.device)
    hf_ids = torch.tensor([ids], device=args.device)

    def run_hf() -> tuple[int, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.no_grad():
            out = hf.generate(hf_ids, attention_mask=torch.ones_like(hf_ids), max_new_tokens=args.new_tokens,
                              min_new_tokens=args.new_tokens, do_sample=False)
        if args.device != "cpu":
            torch.cuda.synchronize()
        return out.shape[1] - hf_ids.shape[1], time.perf_counter() - t0, time.process_time() - c0

    dec = BlockDecoder(model, tok)
    written: dict[tuple[int, bool], list[int]] = {}  # (block_size, hooks) -> tokens of the last decode
    n_events = [0]

    def count(ev) -> None:
        n_events[0] += 1

    def run_engine(block: int, hooks: bool) -> tuple[int, float]:
        dc = DecodeConfig(block_size=block, threshold=0.95, max_new_tokens=args.new_tokens)
        t0, c0 = time.perf_counter(), time.process_time()
        res = dec.generate(ids, hooks=(count,) if hooks else (), record_trace=hooks, config=dc)
        if args.device != "cpu":
            torch.cuda.synchronize()
        written[(block, hooks)] = res.tokens
        return len(res.tokens), time.perf_counter() - t0, time.process_time() - c0

    runs = {
        "transformers generate": run_hf,
        "engine block_size 1": lambda: run_engine(1, False),
        "engine block 32, no hooks": lambda: run_engine(32, False),
        "engine block 32, hooks + trace": lambda: run_engine(32, True),
    }
    if args.compile:
        if args.device != "cpu":
            ap.error("--compile compiles the CPU decode; on CUDA use clover_engine.backbones.clover.cuda_graphs (gpu_forward.py)")
        from clover_engine.backbones.clover.compiled import compile_layers

        compiled = BlockDecoder(compile_layers(load_model(args.model, device=args.device)), tok)

        def run_compiled() -> tuple[int, float, float]:
            dc = DecodeConfig(block_size=1, threshold=0.95, max_new_tokens=args.new_tokens)
            t0, c0 = time.perf_counter(), time.process_time()
            res = compiled.generate(ids, record_trace=False, config=dc)
            if args.device != "cpu":
                torch.cuda.synchronize()
            written[(1, "compiled")] = res.tokens
            return len(res.tokens), time.perf_counter() - t0, time.process_time() - c0

        runs["engine block_size 1, torch.compile"] = run_compiled
    wall: dict[str, list[float]] = {k: [] for k in runs}  # tokens/s by wall time, per round
    cpu: dict[str, list[float]] = {k: [] for k in runs}  # tokens/s by this process's CPU time
    n_tok: dict[str, int] = {}
    for r in range(args.rounds + 1):
        for name, fn in runs.items():
            n, wall_s, cpu_s = fn()
            n_tok[name] = n
            if r:  # round 0 warms up
                wall[name].append(n / wall_s)
                cpu[name].append(n / max(cpu_s, 1e-9))

    # ratios of the decodes of one round (run back to back), then the median over rounds: the
    # machine's load drifts between rounds more than within one
    def ratios(tps: dict[str, list[float]]) -> tuple[dict[str, float], float]:
        ref = tps["transformers generate"]
        ratio = {k: statistics.median(a / h for a, h in zip(v, ref)) for k, v in tps.items()}
        overhead = statistics.median(1.0 - h / n for h, n in zip(tps["engine block 32, hooks + trace"],
                                                              tps["engine block 32, no hooks"]))
        return ratio, overhead

    r_wall, o_wall = ratios(wall)
    r_cpu, o_cpu = ratios(cpu)
    print(f"{cfg.name}: hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, {cfg.num_experts} experts "
          f"top-{cfg.num_experts_per_tok}, vocab {cfg.vocab_size}; prompt {len(ids)} tokens, {args.new_tokens} new; "
          f"device {args.device}, threads {threads}, median of {args.rounds} rounds")
    print()
    print("| decode | tokens | tokens/s (wall) | / transformers (wall) | tokens/s (CPU time) | / transformers (CPU) |")
    print("|---|---|---|---|---|---|")
    for name in runs:
        print(f"| {name} | {n_tok[name]} | {statistics.median(wall[name]):.1f} | {r_wall[name]:.2f}x | "
              f"{statistics.median(cpu[name]):.1f} | {r_cpu[name]:.2f}x |")
    print()
    print(f"engine block_size 1 / transformers: {r_wall['engine block_size 1']:.2f}x wall, "
          f"{r_cpu['engine block_size 1']:.2f}x CPU time (target >= 1.5x)")
    if args.compile:
        key = "engine block_size 1, torch.compile"
        print(f"{key} / transformers: {r_wall[key]:.2f}x wall, {r_cpu[key]:.2f}x CPU time")
    print(f"hooks + trace overhead at block 32: {100 * o_wall:.1f} % wall, {100 * o_cpu:.1f} % CPU time (target <= 5 %)")
    same = written[(32, True)] == written[(32, False)]
    print(f"block 32 with and without hooks + trace wrote the same tokens: {same}")
    if args.compile:
        same_compiled = written[(1, "compiled")] == written[(1, False)]
        print(f"block_size 1 compiled and eager wrote the same tokens: {same_compiled}")
        same = same and same_compiled
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
