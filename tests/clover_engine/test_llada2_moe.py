"""LLaDA2.0 (``llada2_moe``) as a user meets it: by hub id from a filled cache, from the CLI with its own sampler,
and in the notebook explorer with its expert view.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from clover_engine.backbones.llada2_moe import LLaDA2MoeModel, group_limited_top_k, write_tiny_llada2_moe
from clover_engine.checkpoint import load_model, load_tokenizer
from clover_engine.decoding.llada2_samplers import LLaDA2Sampler

from test_hub import ROOT, hub_env, put_in_cache  # noqa: E402

HUB_ID = "inclusionAI/LLaDA2.0-mini"
REV = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llada2_moe(tmp_path_factory.mktemp("llada2") / "tiny-llada2", seed=0)


def test_the_router_keeps_whole_groups_and_weights_the_unbiased_scores():
    # 8 experts in 4 groups of 2; group scores (sum of the two best): g0 .9+.8, g1 .1+.1, g2 .7+.6, g3 .5+.2
    logits = torch.logit(torch.tensor([[.9, .8, .1, .1, .7, .6, .5, .2]]))
    w, sel, scores = group_limited_top_k(logits, 3, n_group=4, topk_group=2, expert_bias=None, routed_scaling_factor=2.0)
    assert sel.tolist() == [[0, 1, 4]]  # expert 6 (0.5) is out: its group is not among the best two
    np.testing.assert_allclose(w[0].numpy(), 2.0 * np.array([.9, .8, .7]) / 2.4, rtol=1e-5)
    # the bias moves the choice (expert 4's biased score 0.2 drops below expert 5's 0.6; group 2 still beats
    # group 3, 0.8 to 0.7) but the weights are the unbiased scores
    bias = torch.tensor([0, 0, 0, 0, -0.5, 0, 0, 0])
    w, sel, scores = group_limited_top_k(logits, 3, n_group=4, topk_group=2, expert_bias=bias, routed_scaling_factor=1.0)
    assert sel.tolist() == [[0, 1, 5]]
    np.testing.assert_allclose(w[0].numpy(), np.array([.9, .8, .6]) / 2.3, rtol=1e-5)
    np.testing.assert_allclose(scores.numpy(), torch.sigmoid(logits).numpy(), rtol=1e-6)


def test_loads_from_its_files_with_the_mask_and_end_of_turn_of_its_tokenizer(tiny):
    model, tok = load_model(tiny), load_tokenizer(tiny)
    assert isinstance(model, LLaDA2MoeModel) and model.config.family == "llada2"
    assert model.config.mask_token_id == tok.token_to_id("<|mask|>")
    assert model.config.eos_token_id == tok.token_to_id("<|im_end|>")
    assert model.capabilities.emits("expert_union") and model.config.num_experts == 8
    assert model.config.block_size == 32  # LLaDA2.0's block when the config names none


def test_loads_by_hub_id_and_decodes_from_the_cli(tiny, tmp_path):
    hf_home = tmp_path / "hf"
    put_in_cache(hf_home, HUB_ID, REV, {p.name: p.read_bytes() for p in tiny.iterdir() if p.is_file()}, ("main",))
    trace = tmp_path / "llada2.parquet"
    proc = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", HUB_ID, "--prompt", "Hi",
                           "--sampler", "llada2", "--block-size", "8", "--max-new-tokens", "16",
                           "--trace", str(trace)],
                          capture_output=True, text=True, env=hub_env(hf_home), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "llada2 sampler" in proc.stdout and "NFE=" in proc.stdout and "kv_cache=False" in proc.stdout
    from clover_engine.recording.trace import Trace

    steps = Trace.load(trace).steps
    assert steps and all(s.expert_union is not None and s.expert_counts.shape == (2, 8) for s in steps)
    assert Trace.load(trace).model_id == HUB_ID


def test_the_notebook_explorer_shows_its_expert_union(tiny):
    from clover_viz.figures import expert_union_figure
    from clover_viz.widgets import Explorer

    cfg = LLaDA2Sampler(gen_length=16, block_length=8, steps=8)
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


def test_a_bf16_checkpoint_loads_as_bf16_and_a_broken_one_is_named(tiny, tmp_path):
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    d = tmp_path / "bf16"
    shutil.copytree(tiny, d)
    state = load_file(str(d / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in state.items()}, str(d / "model.safetensors"))
    data = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(data, torch_dtype="bfloat16")))
    model = load_model(d)
    assert model.dtype == torch.bfloat16
    assert model.lm.model.layers[1].mlp.gate.expert_bias.dtype == torch.bfloat16  # buffers follow, as the hub's
    out = model(torch.tensor([[model.config.mask_token_id] * 8]), model.setup_state(), block_size=8)
    assert out.logits.dtype == torch.float32 and out.logits.shape == (1, 8, data["vocab_size"])
    save_file({k: v for k, v in state.items() if "gate.expert_bias" not in k}, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match="expert_bias"):
        load_model(d)
    (d / "model.safetensors").write_bytes((tiny / "model.safetensors").read_bytes()[:5000])
    with pytest.raises(ValueError, match="model.safetensors"):
        load_model(d)


def test_llada21_edits_from_the_cli_and_in_the_notebook_explorer(tiny, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", str(tiny), "--prompt", "Hi",
                           "--sampler", "llada21", "--block-size", "8", "--max-new-tokens", "16", "--threshold", "0.5",
                           "--editing-threshold", "0.3", "--threads", "1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "llada21 sampler" in proc.stdout and "editing_threshold=0.3" in proc.stdout and " edits=" in proc.stdout
    from clover_viz.session_settings import controls_of, official_sampler, sampler_summary, with_controls
    from clover_viz.widgets import Explorer

    from clover_engine.decoding.llada2_samplers import LLaDA21Sampler

    cfg = LLaDA21Sampler(gen_length=16, block_length=8, threshold=0.5, editing_threshold=0.3)
    assert controls_of(cfg) == (8, 0.5) and with_controls(cfg, 16, 0.7).block_length == 16
    assert "edited > 0.30" in sampler_summary(cfg)
    ex = Explorer(str(tiny), decode_config=cfg, prompt="Hello there")
    try:
        assert ex.start_decode() and ex.wait(60)
        assert sum(int(s.rewritten.sum()) for s in ex.trace.steps) > 0  # the edits are the trace's revisions
        from clover_engine.recording.slot_index import SlotIndex

        assert SlotIndex(ex.trace).revised
    finally:
        ex.close()
    from clover_viz.models import LoadedModel

    loaded = LoadedModel.in_memory(load_model(tiny), load_tokenizer(tiny))  # the app's policy llada21 on this model
    assert isinstance(official_sampler("llada21", loaded, 16, 8, 0.9), LLaDA21Sampler)


def test_llada21_step_never_writes_mask_for_ever():
    """The original at temperature 0 repeats a forward whose only write is the MASK id itself for ever; here the
    slot takes its best other token, a forced fill."""
    from clover_engine.decoding.llada2_samplers import LLaDA21Sampler, llada21_step

    mask_id = 5
    cur = torch.tensor([[7, mask_id, mask_id]])
    logits = torch.zeros(1, 3, 8)
    logits[0, 1, mask_id], logits[0, 1, 3] = 10.0, 9.0  # MASK is slot 1's argmax (p 0.73), 3 its best other token
    logits[0, 2, mask_id], logits[0, 2, 4] = 6.0, 5.5  # and slot 2's, less sure (p 0.6): not the one written
    logits[0, 0, 7] = 12.0  # slot 0 (written) keeps its token: no edit
    step, edited = llada21_step(cur, logits, mask_id, torch.tensor([True, True, True]), LLaDA21Sampler(), None)
    assert cur.tolist() == [[7, 3, mask_id]] and not edited.any()
    assert step.transfer.tolist() == [False, True, False] and step.forced.tolist() == [False, True, False]
