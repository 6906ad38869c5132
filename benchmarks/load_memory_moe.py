"""Peak memory of loading LLaDA-MoE-7B-A1B in bf16, and of its first decode: does it fit a 24 GB machine?

    .venv/bin/python benchmarks/load_memory_moe.py [--layers 16] [--shards 4] [--threads 2] [--tmp DIR]

Writes a checkpoint of LLaDA-MoE-7B-A1B's published shape itself (the hub layout: ``config.json`` with
``model_type: "lladamoe"``, bf16 ``*.safetensors`` shards and ``model.safetensors.index.json``; hidden
2048, 16 layers of 16 heads, 64 experts of 1024 with top-8, vocabulary 157,184 -- about 7.4 B
parameters, 14.7 GB) with random weights: load memory does not depend on the values. ``--layers`` writes
fewer layers (a quicker check; the ratio is the figure). Then, in a **fresh subprocess** (the resident set
starts clean; a parent's peak would carry over fork + exec), it loads it with
``clover_engine.checkpoint.load_model(dir)`` -- the lean LLaDA-MoE loader
(`clover_engine.backbones.llada_moe.load_llada_moe`: meta-device build, shard by shard, tensor by tensor
straight into bf16) -- and runs one decode of a 32-slot block with LLaDA's sampler (4 forwards) on it.

Printed: the weights' bytes, the load's peak resident set over the process's baseline after its imports
(``VmHWM``) and its ratio to the weights, the peak after the decode, and the arithmetic for the whole model:
baseline + weights x the load's ratio + the decode's extra, against 24 GB (22.35 GiB; what ``free`` reports
of a 24 GB machine is less still). With ``--layers 16`` that is the measured peak itself. The checkpoint is
deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from clover_engine.backbones.llada_moe import LLaDAMoEArch, LLaDAMoELM  # noqa: E402
from clover_engine.threads import add_threads_argument, resolve_threads  # noqa: E402

GIB = 2**30
MACHINE_24GB = 24e9
LLADA_MOE_7B_CONFIG = dict(
    vocab_size=157184, hidden_size=2048, dense_intermediate_size=8192, expert_intermediate_size=1024,
    shared_expert_intermediate_size=None, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
    hidden_act="silu", max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False,
    rope_theta=50000.0, partial_rotary_factor=1.0, rope_scaling=None, attention_bias=False, clip_qkv=None,
    num_experts_per_tok=8, num_experts=64, norm_topk_prob=False, qk_layernorm=True, moe_layer_freq=[1] * 16,
    moe_router_enable_expert_bias=False, routed_scaling_factor=1, pad_token_id=156892, eos_token_id=156892,
    mask_token_id=156895, use_cache=False, torch_dtype="bfloat16")
"""inclusionAI/LLaDA-MoE-7B-A1B-Instruct's ``config.json`` dimensions (every layer MoE, no shared expert)."""


def write_checkpoint(root: Path, layers: int, shards: int) -> tuple[int, int]:
    """Write the checkpoint into ``root``; -> (parameters, bytes of weights)."""
    from safetensors.torch import save_file
    from tqdm import tqdm

    data = dict(LLADA_MOE_7B_CONFIG, num_hidden_layers=layers, moe_layer_freq=[1] * layers)
    with torch.device("meta"):
        meta = LLaDAMoELM(LLaDAMoEArch.from_config(data))
    specs = [(k, tuple(v.shape)) for k, v in meta.state_dict().items() if not k.endswith("expert_bias")]
    total = sum(int(torch.Size(s).numel()) for _, s in specs)
    groups, acc = [[]], 0
    for name, s in specs:
        if acc >= total / shards and len(groups) < shards:
            groups.append([])
            acc = 0
        groups[-1].append((name, s))
        acc += int(torch.Size(s).numel())
    gen = torch.Generator().manual_seed(0)
    weight_map, nbytes = {}, 0
    bar = tqdm(total=2 * total, desc="writing the checkpoint", unit="B", unit_scale=True)
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        part = {}
        for name, s in group:
            part[name] = (torch.randn(s, generator=gen) * 0.02).to(torch.bfloat16)
            bar.update(2 * part[name].numel())
        nbytes += sum(t.numel() * 2 for t in part.values())
        save_file(part, str(root / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in part})
        del part
    bar.close()
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": nbytes},
                                                                   "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps(dict(data, model_type="lladamoe",
                                                      architectures=["LLaDAMoEModelLM"]), indent=1))
    return total, nbytes


def _status_bytes(field: str) -> int:
    """A ``/proc/self/status`` field (kB there) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status (Linux only)")


def child(directory: str, threads: int) -> None:
    """Load and decode in this (fresh) process; print one JSON line of bytes and seconds."""
    # local: the child imports everything before it reads its baseline; the parent never loads the model
    from clover_engine.checkpoint import load_model
    from clover_engine.decoding import decoder_for
    from clover_engine.decoding.masked_diffusion_samplers import LLaDASampler
    from clover_engine.threads import configure_threads

    configure_threads(threads)
    base = _status_bytes("VmHWM")
    t0 = time.perf_counter()
    model = load_model(directory)
    load_s = time.perf_counter() - t0
    load_peak = _status_bytes("VmHWM")
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    dtype = str(next(model.parameters()).dtype)
    t1 = time.perf_counter()
    with torch.no_grad():
        res = decoder_for(model, None, LLaDASampler(gen_length=32, block_length=32, steps=4)).generate(
            list(range(100, 116)), record_trace=False)
    decode_s = time.perf_counter() - t1
    print(json.dumps(dict(base=base, load_peak=load_peak, decode_peak=_status_bytes("VmHWM"), weights=weights,
                          load_s=load_s, decode_s=decode_s, nfe=res.nfe, dtype=dtype)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=16, help="layers written (16: the whole model)")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--tmp", default=None, help="folder for the temporary checkpoint (default: the system's)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    add_threads_argument(p)
    args = p.parse_args(argv)
    threads = resolve_threads(args.threads)
    if args.child:
        child(args.child, threads)
        return 0
    root = Path(tempfile.mkdtemp(prefix="load_memory_moe_", dir=args.tmp))
    try:
        n_params, nbytes = write_checkpoint(root, args.layers, args.shards)
        os.sync()  # no write-back of the fresh shards during the load
        print(f"checkpoint: LLaDA-MoE-7B-A1B shape, {args.layers} of 16 layers, {n_params / 1e9:.2f} B parameters, "
              f"bf16, {nbytes / 1e9:.2f} GB ({nbytes / GIB:.2f} GiB) in {args.shards} shards; threads {threads}",
              flush=True)
        out = subprocess.run([sys.executable, __file__, "--child", str(root), "--threads", str(threads)],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
        if out.returncode:
            print(f"the load failed (exit {out.returncode})")
            return 1
        r = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load_ratio = (r["load_peak"] - r["base"]) / r["weights"]
    decode_ratio = (r["decode_peak"] - r["base"]) / r["weights"]
    print(f"loaded: {r['weights'] / GIB:.2f} GiB of weights ({r['dtype']}) in {r['load_s']:.1f} s; baseline after "
          f"imports {r['base'] / GIB:.2f} GiB; peak over it {(r['load_peak'] - r['base']) / GIB:.2f} GiB = "
          f"{load_ratio:.3f} x the weights")
    print(f"decoded 32 slots in {r['nfe']} forwards ({r['decode_s']:.1f} s): peak over the baseline "
          f"{(r['decode_peak'] - r['base']) / GIB:.2f} GiB = {decode_ratio:.3f} x the weights")
    with torch.device("meta"):  # the whole model's weights, whatever --layers wrote
        whole = LLaDAMoELM(LLaDAMoEArch.from_config(LLADA_MOE_7B_CONFIG))
    full = 2 * sum(t.numel() for k, t in whole.state_dict().items() if not k.endswith("expert_bias"))
    extra = max(0, r["decode_peak"] - r["load_peak"])  # the decode's activations: not a share of the weights
    need = r["base"] + full * load_ratio + extra
    how = "measured" if args.layers == 16 else f"from {args.layers} layers"
    print(f"the whole model ({how}): {full / GIB:.2f} GiB of weights x {load_ratio:.3f} + {r['base'] / GIB:.2f} GiB "
          f"baseline + {extra / GIB:.2f} GiB for the decode = {need / GIB:.2f} GiB peak, against 24 GB = "
          f"{MACHINE_24GB / GIB:.2f} GiB: "
          f"{'fits' if need < MACHINE_24GB else 'does NOT fit'} ({need / MACHINE_24GB:.2f} of it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
