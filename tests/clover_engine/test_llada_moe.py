"""LLaDA-MoE as a user meets it: by hub id from a filled cache, from the CLI, in the notebook explorer with its
expert view, and with the expert union behind the bytes of every forward.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from clover_engine.backbones.llada_moe import LLaDAMoEModel, write_tiny_llada_moe
from clover_engine.checkpoint import load_model, load_tokenizer
from clover_engine.decoding.masked_diffusion_samplers import LLaDASampler

from test_hub import ROOT, hub_env, put_in_cache  # noqa: E402

HUB_IDS = {"lladamoe": "inclusionAI/LLaDA-MoE-7B-A1B-Instruct", "llada": "inclusionAI/LLaDA-MoE-7B-A1B-Base"}
REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = write_tiny_llada_moe(tmp_path_factory.mktemp("lladamoe") / "tiny-lladamoe", seed=0)
    return d


def test_the_mask_and_the_end_of_turn_come_from_the_checkpoint_files(tiny):
    model, tok = load_model(tiny), load_tokenizer(tiny)
    assert isinstance(model, LLaDAMoEModel)
    assert model.config.mask_token_id == tok.token_to_id("<|mask|>")
    assert model.config.eos_token_id == tok.token_to_id("<|im_end|>")
    assert model.capabilities.emits("expert_union") and model.checkpoint_chat is not None


def test_both_hub_layouts_load_by_hub_id_and_decode_from_the_cli(tiny, tmp_path):
    hf_home = tmp_path / "hf"
    for model_type, repo in HUB_IDS.items():
        files = {p.name: p.read_bytes() for p in tiny.iterdir() if p.is_file()}
        data = json.loads(files["config.json"])
        data["model_type"] = model_type  # some copies of the hub config say "llada"
        files["config.json"] = json.dumps(data).encode()
        put_in_cache(hf_home, repo, REV, files, ("main",))
    env = hub_env(hf_home)
    for repo in HUB_IDS.values():
        trace = tmp_path / (repo.split("/")[1] + ".parquet")
        proc = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", repo, "--prompt", "Hi",
                               "--sampler", "llada", "--block-size", "8", "--max-new-tokens", "16", "--trace", str(trace)],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "NFE=" in proc.stdout and trace.is_file()
        from clover_engine.recording.trace import Trace

        steps = Trace.load(trace).steps
        assert steps and all(s.expert_union is not None and s.expert_counts.shape == (2, 8) for s in steps)


def test_the_notebook_explorer_shows_the_expert_union_with_the_blocks_share_and_the_router_entropy(tiny):
    from clover_viz.figures import expert_union_figure
    from clover_viz.widgets import Explorer

    ex = Explorer(str(tiny), decode_config=LLaDASampler(gen_length=16, block_length=8, steps=16), prompt="Hello there")
    try:
        assert ex.start_decode() and ex.wait(60)
        trace = ex.trace
        assert len(trace) == 16
        fig = expert_union_figure(trace)
        heat = fig.data[0]
        assert "of 8 experts, top-2" in fig.layout.title.text
        assert list(heat.y) == ["layer 0 MoE", "layer 1 MoE"]
        z = np.array(heat.z, dtype=float)
        assert z.shape == (2, 16) and ((1 <= z) & (z <= 8)).all()
        custom = np.array(heat.customdata, dtype=float)  # [layer, forward, (block union, entropy)]
        assert (custom[..., 0] <= z).all() and (custom[..., 1] >= 0).all()
        assert "router entropy" in heat.hovertemplate
        assert all(s.bytes_read > 0 for s in trace.steps)
        ex.show_step(3)
        load = ex.figures["expert_load"]  # tokens per expert over the run, in the widget the explorer shows
        counts = np.array(load.data[0].z, dtype=float)
        assert counts.shape == (2, 8) and (counts.sum(axis=1) == sum(s.n_tokens_forward for s in trace.steps) * 2).all()
        assert "router entropy" in load.layout.title.text
    finally:
        ex.close()


def test_the_block_decoder_records_the_routing_too(tiny):
    """Threshold decoding (the block decoder, not LLaDA's sampler) records what the router chose as LLaDA's
    sampler does: the union of the block's slots, the tokens per expert and the router's entropy (the
    explorer's "tokens per expert" read "not applicable" for such a run)."""
    from clover_engine.decoding import decoder_for
    from clover_engine.decoding.config import DecodeConfig

    model = load_model(tiny)
    k = model.config.num_experts_per_tok
    trace = decoder_for(model, None, DecodeConfig(block_size=8, threshold=0.9, max_new_tokens=24)).generate(
        list(range(40, 60))).trace
    assert len(trace) >= 3
    for st in trace.steps:
        counts = np.asarray(st.expert_counts)
        assert counts.shape == (len(st.expert_union), model.config.num_experts)
        # every position is recomputed (masked diffusion): history and block, k experts each
        assert (counts.sum(1) == (st.position_start + len(st.tokens)) * k).all()
        assert ((counts > 0).sum(1) == st.expert_union).all()
        assert (st.expert_union_block <= st.expert_union).all() and (st.expert_union_block >= k).all()
        assert np.isfinite(st.router_entropy).all() and (st.router_entropy >= 0).all()
