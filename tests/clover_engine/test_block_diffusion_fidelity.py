"""Fast-dLLM v2's and SDAR's samplers decode token for token as their official code, on the project's
block-causal backbone (`clover_engine.backbones.block_causal`).

The tiny checkpoints of ``tests/fidelity/block_diffusion_cases.py`` are re-created from their seeds in each
family's hub layout and opened with `clover_engine.checkpoint.load_model`; every case is decoded by
`clover_engine.decoding.block_diffusion_decoder.BlockDiffusionDecoder` with the case's sampler, and the answer
must equal, token for token, the one the official code wrote into ``tests/data/block_diffusion_fidelity.json``
(``tests/fidelity/make_block_diffusion_expected.py`` made it, at the commits the file names). The logits of
a cached block step must match the official model's to 1e-4 (fp32). No network and no official code here.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_block_diffusion_fidelity.py -q``
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from clover_engine.backbones.block_causal import BlockCausalModel, block_causal_mask  # noqa: E402
from clover_engine.checkpoint import load_model  # noqa: E402
from clover_engine.decoding.block_diffusion_decoder import BlockDiffusionDecoder  # noqa: E402
from clover_engine.decoding.block_diffusion_samplers import FastDLLMv2Sampler, SDARSampler  # noqa: E402
from clover_engine.decoding.samplers import decoder_for  # noqa: E402
from clover_engine.recording.events import BlockStart, StepEvent  # noqa: E402
from fidelity.block_diffusion_cases import build_checkpoint, cases  # noqa: E402

pytestmark = pytest.mark.stored_reference  # .ci/run reruns it on PyTorch's plain kernels

DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "block_diffusion_fidelity.json").read_text())
CASES = {c["id"]: c for c in DATA["cases"]}
FAMILIES = sorted({c["family"] for c in DATA["cases"]})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("block-fidelity")
    return {(family, seed): load_model(build_checkpoint(family, seed, root / f"{family}-{seed}"))
            for family in FAMILIES for seed in sorted({c["seed"] for c in DATA["cases"]})}


def _sampler(case: dict):
    return (FastDLLMv2Sampler if case["family"] == "fast_dllm_v2" else SDARSampler)(**case["sampler"])


def test_the_data_covers_the_cases_the_generator_defines():
    mine = [c for c in cases() if c["family"] in FAMILIES]
    assert [c["id"] for c in mine] == list(CASES)
    assert [c["prompt"] for c in mine] == [c["prompt"] for c in DATA["cases"]]
    for family in FAMILIES:
        got = [c for c in DATA["cases"] if c["family"] == family]
        assert {c["seed"] for c in got} == {0, 1, 2}
        lengths = {len(c["prompt"]) for c in got}
        assert 16 in lengths and 13 in lengths  # prompts on a block boundary and off it
        blocks = {c["sampler"].get("block_size", c["sampler"].get("block_length")) for c in got}
        assert {4, 8} <= blocks
    sdar = [c["sampler"] for c in DATA["cases"] if c["family"] == "sdar"]
    assert {s.get("confidence_threshold") for s in sdar} >= {0.85, 0.5}
    assert {s.get("remasking_strategy", "low_confidence_dynamic") for s in sdar} == {
        "low_confidence_dynamic", "low_confidence_static", "sequential"}


def test_loads_as_the_block_causal_backbone(models):
    for (family, _), model in models.items():
        assert isinstance(model, BlockCausalModel)
        assert model.config.family == family and model.config.mask_token_id == DATA["model"]["mask_token_id"]
        assert model.config.logit_shift is (family == "fast_dllm_v2")
        assert model.capabilities.family == "block_causal" and model.capabilities.cost_family == "kv_cache"


@pytest.mark.parametrize("case_id", [c["id"] for c in DATA["cases"] if "step_logits" in c])
def test_a_cached_block_step_has_the_official_logits(models, case_id):
    case = CASES[case_id]
    model = models[case["family"], case["seed"]]
    block = case["sampler"].get("block_length") or case["sampler"]["block_size"]
    prompt = case["prompt"]
    pre = len(prompt) // block * block
    state = model.setup_state()
    model.extend(state, prompt[:pre], block)
    cur = torch.full((1, block), model.config.mask_token_id)
    tail = prompt[pre:]
    cur[0, : len(tail)] = torch.tensor(tail, dtype=torch.long)
    logits = model.block_logits(state, cur)[0, :, :64].detach().numpy()
    want = np.asarray(case["step_logits"], dtype=np.float32)
    assert np.abs(logits - want).max() <= 1e-4, np.abs(logits - want).max()
    assert state.position == pre  # the denoising forward kept nothing in the cache


@pytest.mark.parametrize("events", [False, True], ids=["events-off", "events-on"])
@pytest.mark.parametrize("case_id", [k for k, c in CASES.items() if not c.get("hangs")])
def test_decodes_token_for_token_as_the_official_code(models, case_id, events):
    # events off: a Fast-dLLM v2 step computes the output layer over its sub-block's rows only; events on,
    # over every masked slot of the block too (the explorer shows them) -- the same tokens either way
    case = CASES[case_id]
    model = models[case["family"], case["seed"]]
    result = BlockDiffusionDecoder(model).generate(case["prompt"], config=_sampler(case), record_trace=events)
    matched = sum(a == b for a, b in zip(result.canvas, case["canvas"]))
    assert result.canvas == case["canvas"], f"{matched}/{len(case['canvas'])} tokens match"


@pytest.mark.parametrize("case_id", [k for k, c in CASES.items() if c.get("hangs")])
def test_where_the_official_code_never_returns_the_decode_ends_with_a_forced_fill(models, case_id):
    # Fast-dLLM v2's generate writes the MASK id when the model predicts it, and at temperature 0 repeats that
    # forward for ever (the generator of the data stopped it after 60 s); here the slot takes its best other token
    case = CASES[case_id]
    model = models[case["family"], case["seed"]]
    result = BlockDiffusionDecoder(model).generate(case["prompt"], config=_sampler(case), record_trace=False)
    assert result.n_forced >= 1 and model.config.mask_token_id not in result.tokens
    assert len(result.canvas) >= min(case["sampler"]["max_new_tokens"], len(result.tokens))


def test_block_causal_mask_is_full_within_a_block_and_causal_across():
    m = block_causal_mask(4, 6, 4, torch.float32)[0, 0] == 0  # positions 4..9 after 4 cached
    assert m.shape == (6, 10)
    assert m[0, :8].all() and not m[0, 8:].any()  # position 4 (block 1) sees blocks 0 and 1
    assert m[4, :10].all()  # position 8 (block 2) sees everything so far, itself and position 9


def test_events_show_the_blocks_the_steps_and_the_kv_cache(models):
    case = next(c for c in DATA["cases"] if c["family"] == FAMILIES[-1] and len(c["prompt"]) == 13)
    model = models[case["family"], case["seed"]]
    events = []
    dec = decoder_for(model, config=_sampler(case))
    assert isinstance(dec, BlockDiffusionDecoder)
    result = dec.generate(case["prompt"], hooks=[events.append])
    starts = [e for e in events if isinstance(e, BlockStart)]
    steps = [e for e in events if isinstance(e, StepEvent)]
    block = starts[0].block_size
    assert all(s.position_start % block == 0 for s in starts)  # aligned to absolute positions
    assert starts[0].prefilled.sum() == 13 % block  # the prompt's tail heads the first block
    # every forward counts: the prefill of the prompt's whole blocks, each denoising step, each block's commit
    assert result.nfe == (1 if 13 >= block else 0) + len(steps) + len(starts)
    assert all(ev.accepted[~ev.masked_before].sum() == 0 for ev in steps)
    assert result.canvas == case["canvas"]
    assert result.bytes_read > 0 and result.trace is not None


def test_bad_settings_say_what_is_wrong():
    with pytest.raises(ValueError, match="multiple of small_block_size"):
        FastDLLMv2Sampler(block_size=32, small_block_size=5)
    with pytest.raises(ValueError, match="NameError"):
        SDARSampler(remasking_strategy="entropy_bounded")
    with pytest.raises(ValueError, match="temperature"):
        SDARSampler(temperature=0)
    with pytest.raises(ValueError, match="threshold"):
        FastDLLMv2Sampler(threshold=1.5)
