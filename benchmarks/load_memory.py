"""Peak memory and time of loading a multi-shard bf16 checkpoint: ours against transformers', in one run.

    .venv/bin/python benchmarks/load_memory.py [--params 1.5e9] [--shards 4] [--threads 2] [--rounds 1]

Writes a synthetic Dream-format checkpoint itself (Qwen2 weight names, ``model_type: "Dream"``,
bf16, few wide layers, ``--shards`` files plus the hub's ``model.safetensors.index.json``) into a
temporary folder, and a sibling folder whose ``config.json`` says ``qwen2`` and whose shards are
symbolic links to the same files. Then, each in a **fresh subprocess** (so the resident set starts
clean), it loads:

* **ours (Dream)**: ``clover_engine.checkpoint.load_model(dream_dir)`` -- the masked diffusion
  loader: meta-device build, shard by shard, tensor by tensor straight into bf16
  (`clover_engine.backbones.safetensors_shards`);
* **transformers**: ``Qwen2ForCausalLM.from_pretrained(qwen2_dir, dtype=torch.bfloat16)``;
* **ours (causal LM)**: ``load_model(qwen2_dir, dtype="bfloat16")`` -- the llama / qwen2 / qwen3
  path (`clover_engine.backbones.causal_lm.model.load_pretrained_backbone`, over ``from_pretrained``).

Each child reports its peak resident set (``getrusage(RUSAGE_SELF).ru_maxrss``) minus its baseline
after the imports, over the weights' bytes, and its load time; the parent prints them side by side
with the ratios ours / transformers, then the 8B arithmetic. The checkpoint (about 2 bytes per
parameter on disk) is synced and read once before the loads (every loader reads from a warm page
cache) and deleted at the end. The rounds interleave the loaders; medians are printed.

Transformers' ``from_pretrained`` and ours both leave weights stored in the dtype they run in as
views of a private, read-only file mapping of the shards, resident only when read, so each child
also reads every weight once and reports the peak, the private (``RssAnon``) part of it and the
time after that: the figures to compare. The private part is what a second process loading the
same files would add; the rest is page cache the processes share and the OS may drop.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clover_engine.threads import add_threads_argument, resolve_threads  # noqa: E402

GIB = 2**30
LOADERS = ("ours (Dream)", "transformers", "ours (causal LM)")


def qwen2_shape(params: float) -> dict:
    """A Qwen2 config with few wide layers and about `params` parameters (at least 1 layer)."""
    hidden, inter, vocab, heads, kv = 4096, 11008, 32000, 32, 8
    head = hidden // heads
    per_layer = 2 * hidden * hidden + 2 * hidden * kv * head + hidden + 2 * kv * head + 3 * hidden * inter + 2 * hidden
    outside = 2 * vocab * hidden + hidden
    layers = max(1, round((params - outside) / per_layer))
    return dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=4096,
                rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def write_checkpoint(root: Path, params: float, shards: int) -> tuple[Path, Path, int, int]:
    """Write the Dream dir and its qwen2 twin under `root`; -> (dream_dir, qwen2_dir, parameters, bytes)."""
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = qwen2_shape(params)
    cfg = Qwen2Config(**shape)
    with torch.device("meta"):
        meta = Qwen2ForCausalLM(cfg)
    specs = [(k, tuple(v.shape)) for k, v in meta.state_dict().items()]
    total = sum(t.numel() for t in meta.state_dict().values())
    target = total / shards
    groups, acc = [[]], 0
    for name, s in specs:
        n = 1
        for d in s:
            n *= d
        if acc >= target and len(groups) < shards:
            groups.append([])
            acc = 0
        groups[-1].append((name, s))
        acc += n
    dream, qwen2 = root / "dream", root / "qwen2"
    dream.mkdir()
    qwen2.mkdir()
    gen = torch.Generator().manual_seed(0)
    weight_map, nbytes = {}, 0
    for i, group in enumerate(tqdm(groups, desc="writing shards", unit="shard")):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        part = {name: (torch.randn(s, generator=gen) * 0.02).to(torch.bfloat16) for name, s in group}
        nbytes += sum(t.numel() * 2 for t in part.values())
        save_file(part, str(dream / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in part})
        del part
        (qwen2 / fname).symlink_to(dream / fname)
    index = json.dumps({"metadata": {"total_size": nbytes}, "weight_map": weight_map})
    data = cfg.to_dict()
    data.pop("dtype", None)
    for d, extra in ((dream, dict(model_type="Dream", architectures=["DreamModel"], mask_token_id=151666 % shape["vocab_size"])),
                     (qwen2, dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"]))):
        (d / "model.safetensors.index.json").write_text(index)
        (d / "config.json").write_text(json.dumps({**data, **extra, "torch_dtype": "bfloat16"}, indent=1))
    return dream, qwen2, total, nbytes


def _status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (0 where there is no /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def child(loader: str, directory: str, threads: int) -> None:
    """Run one loader in this (fresh) process; print one JSON line with peak RSS over the baseline and seconds."""
    # local: the child imports everything before it reads its baseline RSS; the parent never loads a model
    import torch
    import transformers
    from transformers import Qwen2ForCausalLM

    from clover_engine.backbones.safetensors_shards import meta_tensors
    from clover_engine.checkpoint import load_model
    from clover_engine.threads import configure_threads

    import clover_engine.backbones.causal_lm.model  # noqa: F401  (imported before the baseline, as for transformers)
    import clover_engine.backbones.masked_diffusion  # noqa: F401
    from transformers.models.qwen2 import modeling_qwen2  # noqa: F401

    configure_threads(threads)
    transformers.logging.set_verbosity_error()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    base_hwm = _status_kib("VmHWM") * 1024
    base_anon = _status_kib("RssAnon") * 1024
    t0 = time.perf_counter()
    if loader == "transformers":
        lm = Qwen2ForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
    elif loader == "ours (Dream)":
        lm = load_model(directory).lm
    else:
        lm = load_model(directory, dtype="bfloat16").lm
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    hwm = _status_kib("VmHWM") * 1024  # the same peak as the kernel keeps it for this address space
    t1 = time.perf_counter()
    with torch.no_grad():  # read every weight once: a model backed by a file mapping becomes resident now
        touched = sum(float(t.sum()) for t in lm.state_dict().values())
    touch_s = time.perf_counter() - t1
    peak_touched = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    anon = _status_kib("RssAnon") * 1024 - base_anon  # private memory the load and the reads added
    layer = lm.model.layers[0].self_attn.q_proj.weight
    print(json.dumps(dict(loader=loader, base=base, peak=peak, base_hwm=base_hwm, hwm=hwm, seconds=seconds, touch_s=touch_s,
                          peak_touched=peak_touched, anon=anon, touched=touched, meta=len(meta_tensors(lm)),
                          dtype=str(next(lm.parameters()).dtype), check=float(layer[:4, :4].float().sum()))))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--params", type=float, default=1.5e9, help="parameters of the synthetic checkpoint (>= 1.5e9 "
                                                                 "for the reported figure)")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--rounds", type=int, default=1, help="loads per loader (interleaved; medians printed)")
    p.add_argument("--tmp", default=None, help="folder for the temporary checkpoint (default: the system's)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    add_threads_argument(p)
    args = p.parse_args(argv)
    threads = resolve_threads(args.threads)
    if args.child == "write":
        print(json.dumps([str(x) for x in write_checkpoint(Path(args.dir), args.params, args.shards)]))
        return 0
    if args.child:
        child(args.child, args.dir, threads)
        return 0
    from tqdm import tqdm

    root = Path(tempfile.mkdtemp(prefix="load_memory_", dir=args.tmp))
    try:
        # written by a child too: the parent stays small, since Linux carries a parent's peak RSS
        # (ru_maxrss) over fork + exec into its children
        out = subprocess.run([sys.executable, __file__, "--child", "write", "--dir", str(root), "--params",
                              str(args.params), "--shards", str(args.shards)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        if out.returncode:
            return 1
        d, q, n, b = json.loads(out.stdout.strip().splitlines()[-1])
        dream, qwen2, n_params, nbytes = Path(d), Path(q), int(n), int(b)
        os.sync()  # no write-back of the fresh shards during the first load
        for f in sorted(dream.glob("*.safetensors")):  # warm the page cache alike for every loader
            with open(f, "rb") as fh:
                while fh.read(64 * 2**20):
                    pass
        print(f"checkpoint: {n_params / 1e9:.2f} B parameters, bf16, {nbytes / 1e9:.2f} GB ({nbytes / GIB:.2f} GiB) "
              f"in {args.shards} shards + index; threads {threads}")
        runs: dict[str, list[dict]] = {k: [] for k in LOADERS}
        jobs = [(r, k) for r in range(args.rounds) for k in LOADERS]
        for _, loader in tqdm(jobs, desc="loading (fresh processes)", unit="load"):
            directory = dream if loader == "ours (Dream)" else qwen2
            out = subprocess.run([sys.executable, __file__, "--child", loader, "--dir", str(directory),
                                  "--threads", str(threads)], capture_output=True, text=True, cwd=ROOT)
            if out.returncode:
                print(out.stdout + out.stderr, file=sys.stderr)
                return 1
            runs[loader].append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    checks = {(round(r["check"], 4), round(r["touched"], 1)) for rs in runs.values() for r in rs}
    rows = {}
    for loader, rs in runs.items():
        ratio = statistics.median((r["peak"] - r["base"]) / nbytes for r in rs)
        hwm = statistics.median((r["hwm"] - r["base_hwm"]) / nbytes for r in rs)
        touched = statistics.median((r["peak_touched"] - r["base"]) / nbytes for r in rs)
        ready = statistics.median(r["seconds"] + r["touch_s"] for r in rs)
        anon = statistics.median(r["anon"] / nbytes for r in rs)
        rows[loader] = (ratio, statistics.median(r["seconds"] for r in rs), rs[0]["base"], rs[0]["dtype"],
                        max(r["meta"] for r in rs), hwm, touched, ready, anon)
    print()
    print("| loader | load: (peak RSS - baseline) / weight bytes | (VmHWM check) | load s | after reading every "
          "weight once: (peak RSS - baseline) / weight bytes | of which private (RssAnon) / weight bytes | load + read s "
          "| baseline RSS (GiB) | dtype | on meta |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for loader, (ratio, secs, base, dt, meta, hwm, touched, ready, anon) in rows.items():
        print(f"| {loader} | {ratio:.3f} | ({hwm:.3f}) | {secs:.1f} | {touched:.3f} | {anon:.3f} | {ready:.1f} "
              f"| {base / GIB:.2f} | {dt} | {meta} |")
    ours, theirs = rows["ours (Dream)"], rows["transformers"]
    causal = rows["ours (causal LM)"]
    print(f"\nours (Dream) / transformers, once every weight has been read: peak {ours[6] / theirs[6]:.2f}x, time "
          f"{ours[7] / theirs[7]:.2f}x (load alone: {ours[1] / theirs[1]:.2f}x; transformers' weights are views of "
          f"a file mapping, resident only when read); causal LM path / transformers: peak "
          f"{causal[6] / theirs[6]:.2f}x, time {causal[7] / theirs[7]:.2f}x")
    print(f"same weights loaded by all: {'yes' if len(checks) == 1 else 'NO ' + str(sorted(checks))}")
    b8 = 8e9 * 2
    print(f"8B arithmetic: an 8B bf16 model = {b8 / 1e9:.1f}e9 bytes = {b8 / GIB:.1f} GiB of weights; "
          f"peak at 1.2x = {1.2 * b8 / GIB:.1f} GiB < 24 GB ({24e9 / GIB:.1f} GiB); at the measured "
          f"{ours[0]:.2f}x: {ours[0] * b8 / GIB:.1f} GiB")
    ok = max(ours[0], ours[6]) <= 1.2 and ours[4] == 0 and len(checks) == 1 and ours[8] <= 0.05
    print(f"ours (Dream): within 1.2x of the weights, at most 5 % of them private ({ours[8]:.1%}):",
          "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
