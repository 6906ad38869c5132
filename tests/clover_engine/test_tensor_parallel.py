"""clover_engine.decoding.parallel.shard_heads: the Clover model's heads (attention and GDN) and shared experts split
over 2 processes (gloo, CPU) decode the tokens one process decodes, confidences within 1e-5, in both
memory modes; with the experts split as well (ep=2,tp=2) too."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from helpers import free_port, loud_model

from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig

PROMPT = list(b"The quick brown fox jumps over the lazy dog. " * 2)
MODES = ("state", "state+window")


def _decode(model, mode):
    cfg = DecodeConfig(block_size=8, threshold=0.5, max_new_tokens=24, memory_mode=mode)
    r = BlockDecoder(model, None, cfg).generate(PROMPT, record_trace=True)
    conf = np.concatenate([np.asarray(c, np.float32) for c in r.trace.column("confidence")])  # every step, slot
    return {"tokens": list(r.tokens), "confidence": conf, "n_forced": r.n_forced, "nfe": r.nfe,
            "bytes_read": r.bytes_read, "result": r}


def _head_bytes(model, r) -> float:
    """Bytes of the decode that sit in split heads: mixers, states, window K/V, shared experts less their
    gate rows, per forward from the cost model's breakdown (what a tp rank reads 1/tp of)."""
    from clover_engine.cost import forward_cost

    cfg, dc, total = model.config, r.trace.decode_config, 0.0
    gate = cfg.num_hidden_layers * cfg.hidden_size * 4  # fp32 weights
    for n, toks, union in zip(r.trace.column("n_tokens_forward"), r.trace.column("tokens"),
                              r.trace.column("expert_union")):
        fc = forward_cost(cfg, int(n), list(union), 4, int(n) - len(toks), len(toks), dc["memory_mode"],
                          cfg.attention_window if dc["memory_mode"] == "state+window" else 0,
                          commit_block_len=dc["block_size"])
        b = fc.bytes_by_component
        total += sum(b[k] for k in ("gdn_mixers", "attention_mixers", "state_read", "state_write", "window_kv"))
        total += b["shared_experts"] - gate
    return total


def _tp_rank(rank: int, port: int, out: str, ep: bool) -> None:
    import torch.distributed as dist

    from clover_engine.decoding import parallel

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    parallel.init_distributed(30.0, backend="gloo")
    model = loud_model()
    full_qkv = model.layers[0].linear_attn.in_proj_qkv.weight.clone()
    if ep:
        parallel.shard_experts(model)
    parallel.shard_heads(model)
    g, a = model.layers[0].linear_attn, model.layers[3].self_attn
    assert (g.Hk, g.Hv, a.Hq, a.Hkv) == (1, 2, 2, 1)  # clover-test: Hk 2, Hv 4, Hq 4, Hkv 2 over 2 ranks
    # the rank's q, k and v head rows of the fused projection (16 = head dim)
    q, k, v = full_qkv[:32], full_qkv[32:64], full_qkv[64:]
    assert torch.equal(g.in_proj_qkv.weight, torch.cat([q[16 * rank:16 * rank + 16], k[16 * rank:16 * rank + 16],
                                                        v[32 * rank:32 * rank + 32]]))
    assert a.o_proj.weight.to_local().shape == (64, 32)  # hidden x (Hq/2 * D): input columns split
    res = {}
    for mode in MODES:
        parallel.reset_shards(model)
        d = _decode(model, mode)
        d["ranks"] = parallel.rank_bytes_read(model, d.pop("result"))
        res[mode] = d
    st = model.setup_state(1, "state+window")
    assert st.layers[0].S.shape[1] == 2 and st.layers[3].S.shape[1] == 1 and st.layers[3].win_k.shape[1] == 1
    if rank == 0:
        torch.save(res, out)
    dist.barrier()  # both ranks done before either tears down; the model's DTensor meshes dropped first
    del model
    dist.destroy_process_group()


@pytest.mark.parametrize("ep", [False, True], ids=["tp2", "ep2-tp2"])
def test_tp2_decodes_like_one_process(tmp_path, ep):
    out = tmp_path / "tp2.pt"
    mp.spawn(_tp_rank, args=(free_port(), str(out), ep), nprocs=2, join=True)
    got_all = torch.load(out, weights_only=False)
    model = loud_model()
    for mode in MODES:
        one, got = _decode(model, mode), got_all[mode]
        assert one["n_forced"] < len(one["tokens"])  # the loud model accepts slots: confidences matter
        assert got["tokens"] == one["tokens"], mode
        assert got["nfe"] == one["nfe"], mode
        assert got["confidence"].shape == one["confidence"].shape
        assert np.array_equal(np.isnan(got["confidence"]), np.isnan(one["confidence"]))
        assert np.nanmax(np.abs(got["confidence"] - one["confidence"])) <= 1e-5, mode
        # bytes per rank: each reads half of the split heads' bytes; experts as the expert split says
        ranks, saving = got["ranks"], _head_bytes(model, one["result"]) / 2
        assert ranks["bytes_read"] == one["bytes_read"] and ranks["head_split_saving"] == pytest.approx(saving)
        assert 0 < saving < one["bytes_read"] / 2
        if not ep:
            assert ranks["bytes_read_per_rank"] == pytest.approx([one["bytes_read"] - saving] * 2, rel=1e-12)
        else:
            local, routed = ranks["routed_expert_bytes_per_rank"], ranks["routed_expert_bytes"]
            assert sum(local) == pytest.approx(routed, rel=1e-12) and all(b > 0 for b in local)
            assert ranks["bytes_read_per_rank"] == pytest.approx(
                [one["bytes_read"] - routed - saving + b for b in local], rel=1e-12)


def _bad_rank(rank: int, port: int, out: str) -> None:
    import dataclasses

    import torch.distributed as dist

    from clover_engine.decoding import parallel
    from clover_engine.backbones.clover.config import CloverConfig
    from clover_engine.backbones.clover.model import random_model

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    parallel.init_distributed(30.0, backend="gloo")
    cfg = dataclasses.replace(CloverConfig.from_name("clover-test"), name="odd", num_attention_heads=3,
                              num_key_value_heads=1)
    try:
        parallel.shard_heads(random_model(cfg))
    except ValueError as e:
        if rank == 0:
            with open(out, "w") as f:
                f.write(str(e))
    dist.destroy_process_group()


def test_tp_refuses_indivisible_heads(tmp_path):
    out = tmp_path / "err.txt"
    mp.spawn(_bad_rank, args=(free_port(), str(out)), nprocs=2, join=True)
    msg = out.read_text()
    assert "divisible by 2" in msg and "num_attention_heads" in msg and "num_key_value_heads" in msg


def test_shard_heads_needs_distributed():
    from clover_engine.decoding import parallel

    with pytest.raises(RuntimeError, match="torch.distributed"):
        parallel.shard_heads(loud_model())


def test_generate_cli_tp2_under_torchrun():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    torchrun = Path(sys.executable).with_name("torchrun")
    args = ["-m", "clover_engine.generate", "--model", "models/clover-tiny", "--prompt", "<|im_start|>user\nhello<|im_end|>\n",
            "--block-size", "8", "--max-new-tokens", "16", "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, *args], check=False, capture_output=True, text=True, timeout=120, cwd=root, env=env)
    tp = subprocess.run([str(torchrun), "--nproc-per-node", "2", "--master-port", str(free_port()), *args,
                         "--parallel", "tp=2"], check=False,
                        capture_output=True, text=True, timeout=120, cwd=root, env=env)
    assert one.returncode == 0 and tp.returncode == 0, tp.stderr[-2000:]
    text_one, summary_one = one.stdout.rsplit("\n[clover-tiny]", 1)
    text_tp, summary_tp = tp.stdout.rsplit("\n[clover-tiny]", 1)
    assert text_tp == text_one  # rank 0 alone prints, the same text
    assert " tp=2 " in summary_tp and "read per rank (MB): " in summary_tp
    assert summary_tp.split("tokens=")[1].split(" tokens/s")[0] == summary_one.split("tokens=")[1].split(" tokens/s")[0]
