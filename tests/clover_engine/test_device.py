"""Device and dtype plumbing: random presets built in place, traces that name their device,
``clover_engine.generate --device``, and the benchmark scripts' CPU modes. GPU checks skip without CUDA."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.backbones.clover.model import random_model

ROOT = Path(__file__).resolve().parents[2]
CUDA = torch.cuda.is_available()


def test_random_model_default_device_and_dtype_unchanged():
    a = random_model("clover-test", seed=3)
    b = random_model("clover-test", seed=3, device="cpu", dtype=torch.float32)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert torch.get_default_dtype() == torch.float32  # restored after building


def test_random_model_bf16_decodes_with_fp32_state_and_logits():
    m = random_model("clover-test", seed=0, weight_scale=15.0, dtype="bfloat16")
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32
    st = m.setup_state(1)
    assert all(ls.S.dtype == torch.float32 for ls in st.layers)
    with torch.no_grad():
        out = m(torch.full((1, 4), 257), st, commit_ids=torch.arange(10, 14)[None], block_size=4)
    assert out.logits.dtype == torch.float32 and torch.isfinite(out.logits).all()
    res = BlockDecoder(m).generate([10, 11, 12], record_trace=False, config=DecodeConfig(block_size=4, max_new_tokens=8))
    assert 0 < res.nfe and len(res.tokens) <= 8


def test_full_preset_builds_without_memory_on_meta():
    m = random_model("clover-35b-a3b", device="meta", dtype=torch.bfloat16)
    n = sum(p.numel() for p in m.parameters())
    assert 34e9 < n < 36e9  # ~69 GB in bf16, never allocated here
    assert {p.device.type for p in m.parameters()} == {"meta"}


def test_random_model_bad_input():
    with pytest.raises(ValueError, match="floating"):
        random_model("clover-test", dtype=torch.int64)
    with pytest.raises(ValueError, match="unknown dtype"):
        random_model("clover-test", dtype="bf17")
    with pytest.raises(ValueError, match="unknown preset"):
        random_model("clover-nope")


@pytest.mark.skipif(CUDA, reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="CUDA is not available"):
        random_model("clover-test", device="cuda")
    from clover_engine.checkpoint import save_model
    from clover_engine.tokenizer import byte_tokenizer

    save_model(random_model("clover-test"), tmp_path / "m", tokenizer=byte_tokenizer())
    p = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", str(tmp_path / "m"), "--prompt", "ab",
                        "--device", "cuda", "--threads", "1"], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert p.returncode == 2 and "CUDA is not available" in p.stderr


def test_trace_and_run_stats_name_the_device():
    from clover_viz.runs import run_stats

    m = random_model("clover-test", seed=0, weight_scale=15.0)
    res = BlockDecoder(m).generate([10, 11, 12], config=DecodeConfig(block_size=4, max_new_tokens=4))
    assert res.trace.meta["device"] == "cpu"
    assert run_stats(res.trace)["device"] == "cpu"


def test_gpu_forward_cpu_mode_prints_the_table():
    p = subprocess.run([sys.executable, "benchmarks/gpu_forward.py", "--preset", "clover-test", "--device", "cpu",
                        "--repeats", "1", "--warmup", "0", "--blocks", "8", "--position", "64", "--threads", "1"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith(("| independent", "| correlated"))]
    assert len(rows) == 2 * 3  # AR, block 8, block 8 + commit, per routing
    ar = next(r for r in rows if "correlated | AR" in r).split("|")
    assert float(ar[5]) > 0 and float(ar[10]) > 0  # ms, tokens/s at TPF 1
    corr = next(r for r in rows if "correlated | block 8 |" in r).split("|")
    assert float(corr[4]) <= 4.0  # union <= 2k (k = 2) when routing is correlated


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_random_model_on_gpu_decodes_like_its_own_greedy():
    m = random_model("clover-test", seed=0, weight_scale=15.0, device="cuda", dtype=torch.bfloat16)
    assert {p.device.type for p in m.parameters()} == {"cuda"}
    res = BlockDecoder(m).generate([10, 11, 12], config=DecodeConfig(block_size=1, max_new_tokens=8))
    assert res.trace.meta["device"].startswith("cuda:")
    assert len(res.tokens) <= 8 and res.nfe >= 1
