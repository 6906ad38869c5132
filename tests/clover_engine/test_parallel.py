"""clover_engine.decoding.parallel: the Clover model's experts split over 2 processes (gloo, CPU) decode what one
process decodes, the per-rank bytes add up, and a dead rank ends the run instead of hanging."""

from __future__ import annotations

import os
import socket
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from clover_engine.cost.formulas import param_counts
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.backbones.clover.model import random_model

PROMPT = list(b"The quick brown fox jumps over the lazy dog. " * 2)
MODES = ("state", "state+window")


def _config(mode: str) -> DecodeConfig:
    return DecodeConfig(block_size=8, threshold=0.5, max_new_tokens=24, memory_mode=mode)


def _model():
    return random_model("clover-test", seed=0, weight_scale=15.0)  # peaked logits: accepted and forced slots


def _decode(model, mode):
    r = BlockDecoder(model, None, _config(mode)).generate(PROMPT, record_trace=True)
    conf = np.concatenate([np.asarray(c, np.float32) for c in r.trace.column("confidence")])  # every step, every slot
    union = np.stack([np.asarray(u) for u in r.trace.column("expert_union")])
    return {"tokens": list(r.tokens), "confidence": conf, "union": union, "bytes_read": r.bytes_read, "result": r}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)


def _ep_rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from clover_engine.decoding import parallel

    _env(rank, port)
    parallel.init_distributed(30.0, backend="gloo")
    model = parallel.shard_experts(_model())
    assert all(layer.mlp.experts.gate_up_proj.shape[0] == 4 for layer in model.model.layers)  # 8 experts / 2
    res = {}
    for mode in MODES:
        parallel.reset_shards(model)
        d = _decode(model, mode)
        d["ranks"] = parallel.rank_bytes_read(model, d.pop("result"))
        res[mode] = d
    if rank == 0:
        torch.save(res, out)
    dist.destroy_process_group()


def test_ep2_decodes_like_one_process(tmp_path):
    out = tmp_path / "ep2.pt"
    mp.spawn(_ep_rank, args=(_free_port(), str(out)), nprocs=2, join=True)
    ep = torch.load(out, weights_only=False)
    model = _model()
    per_expert = param_counts(model.config)["expert"] * model.dtype.itemsize
    for mode in MODES:
        one = _decode(model, mode)
        got = ep[mode]
        assert got["tokens"] == one["tokens"], mode
        assert got["confidence"].shape == one["confidence"].shape
        assert np.array_equal(np.isnan(got["confidence"]), np.isnan(one["confidence"]))
        assert np.nanmax(np.abs(got["confidence"] - one["confidence"])) <= 1e-5, mode
        assert np.array_equal(got["union"], one["union"])  # the union over both ranks is the model's own
        ranks = got["ranks"]
        assert ranks["bytes_read"] == one["bytes_read"]
        routed = float(one["union"].sum()) * per_expert
        assert ranks["routed_expert_bytes"] == routed
        assert sum(ranks["routed_expert_bytes_per_rank"]) == pytest.approx(routed, rel=1e-12)
        assert all(b > 0 for b in ranks["routed_expert_bytes_per_rank"])  # both shards did work
        replicated = one["bytes_read"] - routed
        assert ranks["bytes_read_per_rank"] == pytest.approx(
            [replicated + b for b in ranks["routed_expert_bytes_per_rank"]], rel=1e-12)
        assert sum(ranks["bytes_read_per_rank"]) == pytest.approx(one["bytes_read"] + replicated, rel=1e-12)


def _dying_rank(rank: int, port: int, out: str, how: str) -> None:
    from clover_engine.decoding import parallel

    _env(rank, port)
    parallel.init_distributed(5.0, backend="gloo")
    model = parallel.shard_experts(_model())
    if rank == 1 and how == "exit":
        os._exit(3)  # a rank lost mid-run
    if rank == 1:
        time.sleep(45)  # a rank alive but stuck: only the collective timeout ends rank 0's wait
        os._exit(3)
    try:
        _decode(model, "state")
    except Exception as e:  # what torch.distributed raises when the peer is gone or the timeout passes
        with open(out, "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        raise
    with open(out, "w") as f:
        f.write("finished")


@pytest.mark.parametrize("how", ["exit", "stall"])
def test_dead_rank_fails_instead_of_hanging(tmp_path, how):
    out = tmp_path / "rank0.txt"
    t0 = time.monotonic()
    ctx = mp.spawn(_dying_rank, args=(_free_port(), str(out), how), nprocs=2, join=False)
    ctx.processes[0].join(30)
    alive = ctx.processes[0].is_alive()
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    assert not alive, f"rank 0 still waiting 30 s after rank 1 stopped ({how})"
    assert ctx.processes[0].exitcode != 0
    assert out.read_text() != "finished"
    assert time.monotonic() - t0 < 30


def test_parse_parallel():
    from clover_engine.decoding.parallel import parse_parallel

    assert parse_parallel("ep=2") == {"ep": 2}
    assert parse_parallel("tp=2") == {"tp": 2}
    assert parse_parallel("ep=2, tp=2") == {"ep": 2, "tp": 2}
    for bad in ("ep=0", "ep", "ep=x", "dp=2", "", "tp=0", "ep=2,ep=2"):
        with pytest.raises(ValueError, match="ep=N and/or tp=M"):
            parse_parallel(bad)


def test_generate_cli_under_torchrun():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    torchrun = Path(sys.executable).with_name("torchrun")
    args = ["-m", "clover_engine.generate", "--model", "models/clover-tiny", "--prompt", "<|im_start|>user\nhello<|im_end|>\n",
            "--block-size", "8", "--max-new-tokens", "16", "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=root, env=env)
    ep = subprocess.run([str(torchrun), "--nproc-per-node", "2", *args, "--parallel", "ep=2"], capture_output=True,
                        text=True, timeout=120, cwd=root, env=env)
    assert one.returncode == 0 and ep.returncode == 0, ep.stderr[-2000:]
    text_one, summary_one = one.stdout.rsplit("\n[clover-tiny]", 1)
    text_ep, summary_ep = ep.stdout.rsplit("\n[clover-tiny]", 1)
    assert text_ep == text_one  # rank 0 alone prints, the same text
    assert "ep=2" in summary_ep and "read per rank (MB): " in summary_ep
    assert summary_ep.split("tokens=")[1].split(" tokens/s")[0] == summary_one.split("tokens=")[1].split(" tokens/s")[0]
    alone = subprocess.run([sys.executable, *args, "--parallel", "ep=2"], capture_output=True, text=True, timeout=120,
                           cwd=root, env=env)
    assert alone.returncode == 2 and "torchrun --nproc-per-node N" in alone.stderr
