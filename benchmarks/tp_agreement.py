"""Tensor parallel agreement: the random ``clover-test`` (weights x15, peaked logits) decoded by 2
gloo processes on the CPU with its heads split (``tp=2``, `clover_engine.decoding.parallel.shard_heads`) and with
heads and experts split (``ep=2,tp=2``), against one process: same tokens?, forwards, and the largest
|confidence difference| over every step and slot, in both memory modes.

Prompt: "The quick brown fox jumps over the lazy dog. " x 2 (byte ids); block 8, threshold 0.5,
24 new tokens.

Run: ``.venv/bin/python benchmarks/tp_agreement.py --threads 1``
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
import torch.multiprocessing as mp

PROMPT = list(b"The quick brown fox jumps over the lazy dog. " * 2)
MODES = ("state", "state+window")


def _model():
    from clover_engine.backbones.clover.model import random_model

    return random_model("clover-test", seed=0, weight_scale=15.0).eval()


def _decode(model, mode):
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig

    cfg = DecodeConfig(block_size=8, threshold=0.5, max_new_tokens=24, memory_mode=mode)
    r = BlockDecoder(model, None, cfg).generate(PROMPT, record_trace=True)
    conf = np.concatenate([np.asarray(c, np.float32) for c in r.trace.column("confidence")])
    return {"tokens": list(r.tokens), "confidence": conf, "nfe": r.nfe, "n_forced": r.n_forced}


def _rank(rank: int, port: int, out: str, ep: bool, threads: int) -> None:
    import torch.distributed as dist

    from clover_engine.decoding import parallel

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    parallel.init_distributed(60.0, backend="gloo")
    model = _model()
    if ep:
        parallel.shard_experts(model)
    parallel.shard_heads(model)
    res = {mode: _decode(model, mode) for mode in MODES}
    if rank == 0:
        torch.save(res, out)
    dist.barrier()  # both ranks done before either tears down; the model's DTensor meshes dropped first
    del model
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    import argparse

    from clover_engine.threads import add_threads_argument, configure_threads

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_threads_argument(p)
    threads = configure_threads(p.parse_args(argv).threads)  # this process and each rank
    one = {mode: _decode(_model(), mode) for mode in MODES}
    print("| split | memory mode | tokens | same tokens | forwards | forced | confidences compared | max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for ep in (False, True):
        with tempfile.TemporaryDirectory() as d, socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
            out = str(Path(d) / "res.pt")
            mp.spawn(_rank, args=(port, out, ep, threads), nprocs=2, join=True)
            got = torch.load(out, weights_only=False)
        for mode in MODES:
            a, b = one[mode], got[mode]
            diff = float(np.nanmax(np.abs(a["confidence"] - b["confidence"])))
            print(f"| {'ep=2,tp=2' if ep else 'tp=2'} | {mode} | {len(a['tokens'])} | {a['tokens'] == b['tokens']} | "
                  f"{b['nfe']} (one process {a['nfe']}) | {a['n_forced']} | {int(np.isfinite(a['confidence']).sum())} "
                  f"| {diff:.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
