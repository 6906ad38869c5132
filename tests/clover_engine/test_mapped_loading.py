"""Weights mapped, not copied: what `load_model` of a hub-family checkpoint costs in private memory.

A Fast-dLLM v2 checkpoint of about 60 MB (hidden 512, 4 layers, fp32) is split into three shards with
the hub's index. Each measurement runs in a fresh Python process (``/proc/self/status``: ``RssAnon`` is
private memory, ``RssFile`` the file-backed pages the process has mapped in), after one warm-up load of
a tiny checkpoint of the same family so that imports are not counted:

* fp32 on CPU: the load adds at most 5 % of the weights as anonymous memory; reading every weight
  then makes about the weights' bytes resident as file-backed pages, still not anonymous;
* the same weights stored in bf16 and run in fp32 are converted: one private copy, as expected;
* a weight changed in the model never reaches the file (the mapping is private), and a checkpoint
  written over the file a live model maps leaves that model's logits as they were.

Linux only (``/proc``). Run: ``.venv/bin/python -m pytest -q tests/clover_engine/test_mapped_loading.py``
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from clover_engine.backbones.block_causal import write_tiny_block_causal  # noqa: E402
from clover_engine.checkpoint import load_model  # noqa: E402
from tests.helpers import split_into_shards  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")

ROOT = Path(__file__).resolve().parents[2]
DIMS = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8, head_dim=64)

CHILD = r"""
import json, sys, torch
from clover_engine.checkpoint import load_model

def mem():
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("RssAnon:", "RssFile:")):
            key, value = line.split(":")
            out[key] = int(value.split()[0]) * 1024
    return out

load_model(sys.argv[2])  # warm-up: the family's imports
before = mem()
model = load_model(sys.argv[1], dtype=sys.argv[3] if len(sys.argv) > 3 else None)
loaded = mem()
with torch.no_grad():
    total = sum(float(p.sum()) for p in model.parameters())  # reads every weight, copies none
touched = mem()
weights = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps(dict(weights=weights, dtype=str(next(model.parameters()).dtype),
                      anon_load=loaded["RssAnon"] - before["RssAnon"],
                      anon_touch=touched["RssAnon"] - before["RssAnon"],
                      file_touch=touched["RssFile"] - before["RssFile"])))
"""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("mapped")
    fp32 = write_tiny_block_causal(root / "fp32", "Fast_dLLM_Qwen", **DIMS)
    split_into_shards(fp32, 3)
    bf16 = write_tiny_block_causal(root / "bf16", "Fast_dLLM_Qwen", **DIMS)
    model = load_model(bf16, dtype=torch.bfloat16)
    from safetensors.torch import save_file

    (bf16 / "model.safetensors").unlink()
    save_file({k: v.contiguous() for k, v in model.lm.state_dict().items()}, str(bf16 / "model.safetensors"))
    del model
    warm = write_tiny_block_causal(root / "warm", "Fast_dLLM_Qwen")
    return {"fp32": fp32, "bf16": bf16, "warm": warm}


def _measure(path: Path, warm: Path, *dtype: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(warm), *dtype], capture_output=True, text=True,
                         cwd=ROOT, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_fp32_load_maps_the_shards_and_adds_almost_no_private_memory(checkpoints):
    got = _measure(checkpoints["fp32"], checkpoints["warm"])
    w = got["weights"]
    assert got["dtype"] == "torch.float32" and w > 50e6, got
    assert got["anon_load"] <= 0.05 * w, f"the load added {got['anon_load'] / w:.1%} of the weights as private memory"
    # every weight read: the pages are the file's (page cache), not private copies
    assert got["anon_touch"] <= 0.05 * w, got
    assert got["file_touch"] >= 0.9 * w, got


def test_a_weight_stored_in_another_dtype_is_converted_into_one_private_copy(checkpoints):
    got = _measure(checkpoints["bf16"], checkpoints["warm"], "float32")
    w = got["weights"]  # stored in bf16, run in fp32: converted
    assert got["dtype"] == "torch.float32"
    assert 0.9 * w <= got["anon_load"] <= 1.2 * w, got


def test_a_mapped_model_never_writes_its_file_and_survives_a_save_over_it(checkpoints, tmp_path):
    d = write_tiny_block_causal(tmp_path / "live", "Fast_dLLM_Qwen")
    f = d / "model.safetensors"
    before = f.read_bytes()
    model = load_model(d)
    ids = torch.tensor([[5, 9, 33, 17, 60, 4]])
    with torch.no_grad():
        logits = model.lm(ids).logits.clone()
        model.lm.lm_head.weight.mul_(2.0)  # private copy-on-write: the file keeps its bytes
    assert f.read_bytes() == before
    # a checkpoint written over the file the model maps (atomically: a new file renamed over it)
    from clover_engine.backbones.block_causal import save_block_causal

    other = write_tiny_block_causal(tmp_path / "other", "Fast_dLLM_Qwen", seed=3)
    save_block_causal(load_model(other).lm, d, "Fast_dLLM_Qwen", model.config.mask_token_id)
    assert f.read_bytes() != before
    with torch.no_grad():
        model.lm.lm_head.weight.mul_(0.5)
        torch.testing.assert_close(model.lm(ids).logits, logits, rtol=0, atol=0)
