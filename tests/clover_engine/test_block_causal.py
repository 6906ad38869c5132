"""Fast-dLLM v2 and SDAR checkpoints as a user meets them: by hub id from a filled cache, in the explorer
(policies ``fast_dllm_v2`` / ``sdar``: the threshold and block controls become the family's own
parameters), on the command line (``--sampler``), and under the project's own threshold decode
(`clover_engine.decoding.decoder.BlockDecoder` drives the backbone protocol). Token-for-token fidelity
with the official code is ``test_block_diffusion_fidelity.py``.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_block_causal.py -q``
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from clover_engine.backbones.block_causal import BlockCausalModel, write_tiny_block_causal  # noqa: E402
from clover_engine.checkpoint import load_model, load_tokenizer  # noqa: E402
from clover_engine.decoding.block_diffusion_decoder import BlockDiffusionDecoder  # noqa: E402
from clover_engine.decoding.block_diffusion_samplers import FastDLLMv2Sampler, SDARSampler  # noqa: E402
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig  # noqa: E402
from clover_engine.recording.events import StepEvent  # noqa: E402

from test_hub import ROOT, hub_env, put_in_cache  # noqa: E402

HUB_IDS = {"sdar": "JetLM/SDAR-1.7B-Chat", "Fast_dLLM_Qwen": "Efficient-Large-Model/Fast_dLLM_v2_1.5B"}
REV = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("block-causal")
    return {mt: write_tiny_block_causal(root / mt, mt) for mt in HUB_IDS}


def test_the_mask_and_the_end_of_turn_come_from_the_checkpoint_files(tiny):
    for mt, d in tiny.items():
        model, tok = load_model(d), load_tokenizer(d)
        assert isinstance(model, BlockCausalModel)
        assert "mask_token_id" not in json.loads((d / "config.json").read_text())  # as the hub ships them
        mask = "|<MASK>|" if mt == "Fast_dLLM_Qwen" else "<MASK>"
        assert model.config.mask_token_id == tok.token_to_id(mask)
        assert model.config.eos_token_id == tok.token_to_id("<|im_end|>")  # generation_config.json's first eos
        assert model.config.block_size == 8 and model.checkpoint_chat is not None


def test_the_projects_threshold_decode_runs_on_both_families(tiny):
    for d in tiny.values():
        model = load_model(d)
        events = []
        r = BlockDecoder(model, load_tokenizer(d), DecodeConfig(block_size=8, threshold=0.5, max_new_tokens=16)).generate(
            "Hello there", hooks=[events.append])
        steps = [e for e in events if isinstance(e, StepEvent)]
        assert r.nfe == len(steps) and 1 <= len(r.tokens) <= 16
        assert all(ev.accepted.any() or ev.forced.any() for ev in steps)  # every forward writes at least one slot


def test_a_cached_block_step_equals_a_full_recompute_with_the_block_causal_mask(tiny):
    # the KV cache holds each finished block exactly as a forward over the whole sequence computes it
    model = load_model(tiny["sdar"])
    ids = list(range(10, 34))  # three blocks of 8
    state = model.setup_state()
    model.extend(state, ids[:16], 8)
    cached = model.block_logits(state, torch.tensor([ids[16:]]))
    full = model.setup_state()
    every = model.extend(full, ids, 8, all_logits=True)
    assert torch.allclose(cached[0], every[0, 16:], atol=1e-5)


def test_explorer_policies_map_the_controls_onto_the_family(tiny):
    from clover_viz.panel_settings import SettingsPanel
    from clover_viz.state import ExplorerState

    for mt, policy in (("sdar", "sdar"), ("Fast_dLLM_Qwen", "fast_dllm_v2")):
        d = tiny[mt]
        s = ExplorerState(model_dir=str(d), prompt="Hello, diffusion", max_new_tokens=16, block_size=8,
                          threshold=0.6, memory_mode="state", auto_redecode=False)
        panel = SettingsPanel(state=s)
        try:
            s.policy = policy
            panel._sync()
            assert not panel.threshold.disabled  # both samplers read the threshold (with >)
            assert s.generate(), s.error
            assert s.wait(60) and s.status.startswith("done"), s.status
            dc = s.trace.decode_config
            assert dc["sampler"] == policy
            if policy == "sdar":
                assert dc["block_length"] == 8 and dc["confidence_threshold"] == 0.6 and dc["seed"] == 0
                cfg = SDARSampler(gen_length=16, block_length=8, denoising_steps=8, confidence_threshold=0.6, seed=0)
            else:
                assert dc["block_size"] == 8 and dc["threshold"] == 0.6 and dc["small_block_size"] == 8
                cfg = FastDLLMv2Sampler(max_new_tokens=16, block_size=8, small_block_size=8, threshold=0.6)
            want = BlockDiffusionDecoder(load_model(d), load_tokenizer(d), cfg).generate(s.trace.prompt_ids)
            assert list(s.trace.generated_tokens) == list(want.tokens)
            # the list offers only what this checkpoint runs: its own sampler, not the other family's
            wrong = "sdar" if policy == "fast_dllm_v2" else "fast_dllm_v2"
            assert policy in s.param.policy.objects and wrong not in s.param.policy.objects
            assert list(panel.policy.options) == list(s.param.policy.objects)
            assert "verify" not in panel.policy.options and "llada" not in panel.policy.options
            with pytest.raises(ValueError):
                s.policy = wrong
        finally:
            s.close()
            s.wait(5)


def test_cli_sampler_flags_and_hub_ids_from_a_filled_cache(tiny, tmp_path):
    hf_home = tmp_path / "hf"
    for mt, repo in HUB_IDS.items():
        files = {p.name: p.read_bytes() for p in tiny[mt].iterdir() if p.is_file()}
        put_in_cache(hf_home, repo, REV, files, ("main",))
    env = hub_env(hf_home)
    outs = {}
    for sampler, repo in (("sdar", HUB_IDS["sdar"]), ("fast_dllm_v2", HUB_IDS["Fast_dLLM_Qwen"])):
        trace = tmp_path / f"{sampler}.parquet"
        proc = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", repo, "--prompt", "Hi",
                               "--sampler", sampler, "--block-size", "8", "--max-new-tokens", "16", "--threshold", "0.5",
                               "--seed", "1", "--trace", str(trace)],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs[sampler] = proc.stdout
        assert f"{sampler} sampler" in proc.stdout and "NFE=" in proc.stdout and "forced=" in proc.stdout
        assert trace.is_file()
    assert "block_length=8" in outs["sdar"] and "confidence_threshold=0.5" in outs["sdar"]
    assert "small_block_size=8" in outs["fast_dllm_v2"] and "threshold=0.5" in outs["fast_dllm_v2"]
    wrong = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", HUB_IDS["sdar"], "--prompt", "Hi",
                            "--sampler", "llada"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert wrong.returncode == 2 and "runs on a LLaDA or Dream checkpoint" in wrong.stderr


def test_the_notebook_explorer_decodes_both_families_and_its_sliders_set_their_parameters(tiny):
    from clover_viz.widgets import Explorer

    for mt, cfg in (("sdar", SDARSampler(gen_length=16, block_length=8, denoising_steps=8, seed=0)),
                    ("Fast_dLLM_Qwen", FastDLLMv2Sampler(max_new_tokens=16, block_size=8, threshold=0.9))):
        ex = Explorer(str(tiny[mt]), decode_config=cfg, prompt="Hello there")
        try:
            assert ex.start_decode() and ex.wait(60)
            assert ex.trace.decode_config["sampler"] == cfg.sampler and len(ex.trace) > 0
            assert not ex.threshold.disabled and ex.block_size.value == 8
            ex.threshold.value = 0.5  # a slider move re-decodes with the family's own parameter set
            assert ex.wait(60)
            dc = ex.trace.decode_config
            assert dc.get("confidence_threshold", dc.get("threshold")) == 0.5
            ex.show_step(1)
        finally:
            ex.close()
