"""SDAR MoE (SDAR-30B-A3B's layout) as a user meets it: by hub id from a filled cache, from the CLI with SDAR's
sampler, and in the notebook explorer with its expert view.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from clover_engine.backbones.sdar_moe import SDARMoeModel, moe_layer_flags, write_tiny_sdar_moe
from clover_engine.checkpoint import load_model, load_tokenizer
from clover_engine.decoding.block_diffusion_samplers import SDARSampler

from test_hub import ROOT, hub_env, put_in_cache  # noqa: E402

HUB_ID = "JetLM/SDAR-30B-A3B-Chat"
REV = "89abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_sdar_moe(tmp_path_factory.mktemp("sdar-moe") / "tiny-sdar-moe", seed=0)


def test_the_moe_layers_follow_qwen3_moe_rule():
    assert moe_layer_flags(dict(num_hidden_layers=4, num_experts=8)) == [True] * 4
    assert moe_layer_flags(dict(num_hidden_layers=4, num_experts=8, decoder_sparse_step=2)) == [False, True, False, True]
    assert moe_layer_flags(dict(num_hidden_layers=3, num_experts=8, mlp_only_layers=[0])) == [False, True, True]
    assert moe_layer_flags(dict(num_hidden_layers=2, num_experts=0)) == [False, False]


def test_loads_from_its_files_with_the_mask_and_end_of_turn_of_its_tokenizer(tiny):
    model, tok = load_model(tiny), load_tokenizer(tiny)
    assert isinstance(model, SDARMoeModel) and model.config.family == "sdar"
    assert model.config.mask_token_id == tok.token_to_id("<MASK>")
    assert model.config.eos_token_id == tok.token_to_id("<|im_end|>")
    assert model.capabilities.emits("expert_union") and model.config.num_experts == 8


def test_loads_by_hub_id_and_decodes_from_the_cli(tiny, tmp_path):
    hf_home = tmp_path / "hf"
    put_in_cache(hf_home, HUB_ID, REV, {p.name: p.read_bytes() for p in tiny.iterdir() if p.is_file()}, ("main",))
    trace = tmp_path / "sdar-moe.parquet"
    proc = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", HUB_ID, "--prompt", "Hi",
                           "--sampler", "sdar", "--block-size", "8", "--max-new-tokens", "16", "--top-k", "1",
                           "--trace", str(trace)],
                          capture_output=True, text=True, env=hub_env(hf_home), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "sdar sampler" in proc.stdout and "NFE=" in proc.stdout
    from clover_engine.recording.trace import Trace

    steps = Trace.load(trace).steps
    assert steps and all(s.expert_union is not None and s.expert_counts.shape == (2, 8) for s in steps)


def test_the_notebook_explorer_shows_its_expert_union(tiny):
    from clover_viz.figures import expert_union_figure
    from clover_viz.widgets import Explorer

    cfg = SDARSampler(gen_length=16, block_length=8, denoising_steps=8, top_k=1, seed=0)
    ex = Explorer(str(tiny), decode_config=cfg, prompt="Hello there")
    try:
        assert ex.start_decode() and ex.wait(60)
        fig = expert_union_figure(ex.trace)
        z = np.array(fig.data[0].z, dtype=float)
        assert "of 8 experts, top-2" in fig.layout.title.text and z.shape[0] == 2
        assert ((1 <= z) & (z <= 8)).all()
        assert np.array(ex.figures["expert_load"].data[0].z, dtype=float).shape == (2, 8)
    finally:
        ex.close()
