"""The project's decoder against each family's official code: same weights, prompt, settings and threads, in one run.

    .venv/bin/python benchmarks/vs_official.py --official-python /tmp/official-venv/bin/python \\
        [--mirrors /work/.mirror | --official-dir DIR] [--families fast_dllm_v2,sdar,llada,dream,llada_moe] \\
        [--layers 4] [--tokens 64] [--rounds 2] [--threads 2]
    .venv/bin/python benchmarks/vs_official.py --small --threads 1      # what CI runs: tiny dims, ours only

For every family it writes one random checkpoint **at the published dimensions** of a real model (hidden size,
heads, feed-forward and vocabulary of the hub config named in `FAMILIES`), its layer count cut to ``--layers``
(said in the output; ``--layers 0`` keeps the published depth), fp32, one ``model.safetensors``. Then, rounds
interleaved, each decode in a fresh process:

* **official**: the family's official modeling file and sampler at the commits the fidelity data pins
  (`OFFICIAL`, fetched from GitHub, from local git mirrors with ``--mirrors``, or already laid out in
  ``--official-dir``), run by ``tests/fidelity/run_official_decode.py`` in the official code's own virtualenv
  (``--official-python``: ``python -m venv /tmp/official-venv && /tmp/official-venv/bin/pip install torch
  transformers==4.53.3 einops safetensors``);
* **ours, events on**: ``clover_engine.checkpoint.load_model`` and the family's sampler with a trace recorded
  (every step event the explorer draws);
* **ours, events off**: the same decode with no observer.

Each reports wall seconds, CPU seconds (``time.process_time`` over the decode), NFE (forwards) and the tokens.
The table gives the medians, per-forward time, ours / official speed (official time / ours: > 1 is faster) and
whether the tokens are identical, and the events' overhead (events on / events off). Without
``--official-python`` (CI: ``--small``) only our side runs, so the harness is known to work; the ratios need
the official side.

Exit status 1 when a side fails or the tokens differ.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "fidelity"))

from clover_engine.threads import add_threads_argument, resolve_threads  # noqa: E402

FAMILIES: dict[str, dict] = {
    # Efficient-Large-Model/Fast_dLLM_v2_1.5B (Qwen2.5-1.5B's config.json)
    "fast_dllm_v2": dict(model="Fast_dLLM_v2_1.5B", dims=dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        head_dim=128, vocab_size=151936, rope_theta=1e6)),
    # JetLM/SDAR-1.7B-Chat (Qwen3-1.7B's config.json)
    "sdar": dict(model="SDAR-1.7B-Chat", dims=dict(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, rope_theta=1e6)),
    # GSAI-ML/LLaDA-8B-Instruct (d_model 4096, 32 heads, mlp 12288, 32 layers, vocab 126464)
    "llada": dict(model="LLaDA-8B-Instruct", dims=dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
        vocab_size=126464, rope_theta=500000.0)),
    # Dream's architecture at Qwen2.5-0.5B's dimensions (Dream-v0 is Qwen2.5-7B; 0.5B keeps this run short)
    "dream": dict(model="Dream (Qwen2.5-0.5B dims)", dims=dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        vocab_size=151936, rope_theta=1e6)),
    # inclusionAI/LLaDA-MoE-7B-A1B-Instruct (every layer MoE, no shared expert: load_memory_moe.py's config)
    "llada_moe": dict(model="LLaDA-MoE-7B-A1B", dims=dict(
        hidden_size=2048, dense_intermediate_size=8192, expert_intermediate_size=1024,
        shared_expert_intermediate_size=None, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
        partial_rotary_factor=1.0, num_experts=64, num_experts_per_tok=8, vocab_size=157184, rope_theta=50000.0)),
}
"""Family -> the real model whose dimensions its checkpoint takes (hub config values)."""

SMALL = dict(hidden_size=64, intermediate_size=128, dense_intermediate_size=128, expert_intermediate_size=32,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512, num_experts=8,
             num_experts_per_tok=2)
"""``--small``: tiny dimensions (CI)."""


def official_files() -> dict:
    """Every official file the five families need, at the fidelity data's pinned commits."""
    from make_block_diffusion_expected import OFFICIAL as BLOCK
    from make_masked_diffusion_expected import OFFICIAL as MASKED
    from make_moe_expected import OFFICIAL as MOE

    return {**BLOCK, **MASKED, **{k: v for k, v in MOE.items() if k != "sdar"}}


def settings(family: str, tokens: int, eos: int) -> dict:
    """The decode settings, the same on both sides (greedy, the families' usual knobs)."""
    if family == "fast_dllm_v2":
        return dict(max_new_tokens=tokens, block_size=32, small_block_size=8, threshold=0.9, stop_token=eos)
    if family == "sdar":
        return dict(gen_length=tokens, block_length=4, denoising_steps=4, top_k=1, confidence_threshold=0.85,
                    remasking_strategy="low_confidence_dynamic", stop_token_ids=[eos])
    if family in ("llada", "llada_moe"):
        return dict(gen_length=tokens, block_length=32, steps=tokens, temperature=0.0, remasking="low_confidence")
    return dict(max_new_tokens=tokens, steps=tokens, alg="entropy", temperature=0.0, top_p=None, top_k=None)


def official_settings(family: str, s: dict) -> dict:
    """`settings` under the official functions' argument names."""
    s = dict(s)
    if family == "sdar":
        s["stopping_criteria_idx"] = s.pop("stop_token_ids")
    return s


def write_checkpoint(family: str, directory: Path, layers: int, small: bool) -> Path:
    """A random fp32 checkpoint of `family` at its `FAMILIES` dimensions (or `SMALL`), ``layers`` layers."""
    # local: transformers and the writers are heavy; the parent imports them only here
    import torch
    import transformers

    dims = dict(FAMILIES[family]["dims"])
    if small:
        dims.update({k: v for k, v in SMALL.items() if k in dims or k == "head_dim"})
    if layers:
        dims["num_hidden_layers"] = layers
    if family in ("fast_dllm_v2", "sdar"):
        from clover_engine.backbones.block_causal import write_tiny_block_causal

        return write_tiny_block_causal(directory, "Fast_dLLM_Qwen" if family == "fast_dllm_v2" else "SDAR",
                                       block_size=32 if family == "fast_dllm_v2" else 4, **dims)
    if family == "llada_moe":
        from clover_engine.backbones.llada_moe import write_tiny_llada_moe

        n = dims.pop("num_hidden_layers")
        dims.pop("head_dim", None)
        return write_tiny_llada_moe(directory, num_hidden_layers=n, moe_layer_freq=[1] * n, **dims)
    from clover_engine.backbones.masked_diffusion import save_masked_diffusion
    from masked_diffusion_cases import fill_random

    torch.manual_seed(0)
    common = dict(max_position_embeddings=4096, eos_token_id=2, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False,
                  rms_norm_eps=1e-5 if family == "llada" else 1e-6)
    if family == "llada":
        with torch.device("meta"):
            lm = transformers.LlamaForCausalLM(transformers.LlamaConfig(**dims, **common))
        mask = 126336 if not small else dims["vocab_size"] - 2
    else:
        with torch.device("meta"):
            lm = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**dims, **common))
        mask = 151666 if not small else dims["vocab_size"] - 2
    lm = lm.to_empty(device="cpu")
    fill_random(lm, 1000, 100.0)
    return save_masked_diffusion(lm.eval(), directory, family, mask)


def ours(family: str, directory: str, job: dict, events: bool) -> dict:
    """One decode by this project (in this fresh process); the official child's JSON fields."""
    # local: the child imports the engine; the parent stays small
    import time

    import torch

    from clover_engine.checkpoint import load_model
    from clover_engine.decoding import block_diffusion_samplers as bds
    from clover_engine.decoding import masked_diffusion_samplers as mds
    from clover_engine.decoding.block_diffusion_decoder import BlockDiffusionDecoder
    from clover_engine.decoding.masked_diffusion_decoder import MaskedDiffusionDecoder
    from clover_engine.threads import configure_threads

    configure_threads(job["threads"])
    model = load_model(directory)
    s = dict(job["settings"])
    if family == "fast_dllm_v2":
        dec = BlockDiffusionDecoder(model, None, bds.FastDLLMv2Sampler(**s))
    elif family == "sdar":
        dec = BlockDiffusionDecoder(model, None, bds.SDARSampler(**s, seed=job["seed"]))
    elif family in ("llada", "llada_moe"):
        dec = MaskedDiffusionDecoder(model, None, mds.LLaDASampler(**s))
    else:
        dec = MaskedDiffusionDecoder(model, None, mds.DreamSampler(**s))
    torch.manual_seed(job["seed"])
    with torch.no_grad():
        t0, c0 = time.perf_counter(), time.process_time()
        result = dec.generate(job["prompt"], record_trace=events)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return dict(wall_s=wall, cpu_s=cpu, nfe=result.nfe, tokens=list(result.canvas))


def _config_ids(directory: Path) -> tuple[int, int]:
    """(mask id, end id) of a written checkpoint, as the project reads them."""
    from clover_engine.checkpoint import load_model

    cfg = load_model(directory).config
    return int(cfg.mask_token_id), int(cfg.eos_token_id)


def _child(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, of {', '.join(FAMILIES)}")
    p.add_argument("--layers", type=int, default=4, help="layers per checkpoint (0: the published depth)")
    p.add_argument("--tokens", type=int, default=64, help="answer length (a multiple of 32)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (medians printed)")
    p.add_argument("--small", action="store_true", help="tiny dimensions (CI): the harness runs, the ratios mean little")
    p.add_argument("--official-python", default=None, help="python of the official code's virtualenv "
                                                          "(transformers 4.53); without it only our side runs")
    p.add_argument("--official-dir", type=Path, default=None, help="the official files already laid out")
    p.add_argument("--mirrors", type=Path, default=None, help="local git mirrors (DIR/<owner>+<name>/repo)")
    p.add_argument("--tmp", default=None, help="folder for the temporary checkpoints")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--job", default=None, help=argparse.SUPPRESS)
    add_threads_argument(p)
    args = p.parse_args(argv)
    if args.child:
        family, events = args.child.split(":")
        print(json.dumps(ours(family, args.dir, json.loads(Path(args.job).read_text()), events == "on")))
        return 0
    from tqdm import tqdm

    threads = resolve_threads(args.threads)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        p.error(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
    if args.tokens % 32:
        p.error(f"--tokens must be a multiple of 32 (the block of Fast-dLLM v2 and LLaDA here), got {args.tokens}")
    root = Path(tempfile.mkdtemp(prefix="vs_official_", dir=args.tmp))
    official_dir = args.official_dir
    sides = ["ours, events on", "ours, events off"]
    if args.official_python:
        sides.insert(0, "official")
        if official_dir is None:
            from make_masked_diffusion_expected import fetch_official

            official_dir = root / "official"
            fetch_official(official_dir, args.mirrors, official_files())
    runs = {(f, side): [] for f in families for side in sides}
    facts = {}
    try:
        for family in families:
            d = write_checkpoint(family, root / family, args.layers, args.small)
            mask_id, eos = _config_ids(d)
            s = settings(family, args.tokens, eos)
            prompt = [10 + (7 * i) % 200 for i in range(40)]
            cfg = json.loads((d / "config.json").read_text())
            layers = cfg.get("num_hidden_layers", cfg.get("n_layers"))
            nbytes = sum(f.stat().st_size for f in d.glob("*.safetensors"))
            facts[family] = dict(layers=layers, gb=nbytes / 1e9)
            for side in sides:
                job = dict(settings=official_settings(family, s) if side == "official" else s, prompt=prompt,
                           mask_id=mask_id, threads=threads, seed=0)
                (root / f"{family}-{side[:4]}.json").write_text(json.dumps(job))
            jobs = [(r, side) for r in range(args.rounds) for side in sides]
            for _, side in tqdm(jobs, desc=f"{family} ({layers} layers, {nbytes / 1e9:.2f} GB)", unit="decode"):
                job_path = root / f"{family}-{side[:4]}.json"
                if side == "official":
                    runner = ROOT / "tests" / "fidelity" / "run_official_decode.py"
                    cmd = [args.official_python, str(runner), str(official_dir), family, str(d), str(job_path)]
                else:
                    cmd = [sys.executable, __file__, "--child", f"{family}:{'on' if 'on' in side else 'off'}",
                           "--dir", str(d), "--job", str(job_path)]
                runs[family, side].append(_child(cmd))
            shutil.rmtree(d, ignore_errors=True)
            report(runs, [family], sides, facts, args, threads)  # each family's table as soon as it is done
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report(runs, families, sides, facts, args, threads)


def report(runs: dict, families: list[str], sides: list[str], facts: dict, args, threads: int) -> int:
    """Print the table; 1 when the tokens of any two runs of a family differ."""
    print(f"\nthreads {threads}, {args.tokens} new tokens, {args.rounds} round(s) interleaved, fp32, medians"
          + (", SMALL dimensions" if args.small else ""))
    print("| family (dims of) | layers | weights GB | side | wall s | CPU s | NFE | ms per forward | speed vs official "
          "| same tokens |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for family in families:
        ref = runs[family, sides[0]][0]["tokens"]
        base = statistics.median(r["wall_s"] / r["nfe"] for r in runs[family, "official"]) \
            if "official" in sides else None
        for side in sides:
            rs = runs[family, side]
            same = all(r["tokens"] == ref for r in rs)
            ok &= same
            per = statistics.median(r["wall_s"] / r["nfe"] for r in rs)
            speed = f"{base / per:.2f}x" if base else "-"
            print(f"| {family} ({FAMILIES[family]['model']}) | {facts[family]['layers']} | {facts[family]['gb']:.2f} "
                  f"| {side} | {statistics.median(r['wall_s'] for r in rs):.2f} "
                  f"| {statistics.median(r['cpu_s'] for r in rs):.2f} | {rs[0]['nfe']} | {1000 * per:.1f} | {speed} "
                  f"| {'yes' if same else 'NO'} |")
        on = statistics.median(r["wall_s"] / r["nfe"] for r in runs[family, "ours, events on"])
        off = statistics.median(r["wall_s"] / r["nfe"] for r in runs[family, "ours, events off"])
        print(f"|  |  |  | events' overhead (on / off) |  |  |  | {on / off:.3f}x |  |  |")
    if "official" not in sides:
        print("\nofficial side not run (no --official-python): the ratios need it")
    print("\ntokens identical across every side and round:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
