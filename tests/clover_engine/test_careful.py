"""The careful decode (`clover_engine.decoding.careful`, issue 63): one slot per forward for every decoder, and the
agreement of a faster decode's answer with it.

* `careful_setting` changes only the parallelism knob of each setting, and a careful setting is its own;
* `agreement` on hand-made answers: identical, a difference made on purpose at a known slot, one answer ending
  early;
* on real decodes -- Clover's random test model with threshold decoding, and each public family's tiny
  checkpoint with its own sampler -- the careful decode writes at most one slot per forward, agrees with itself
  100 %, and a faster setting's agreement is computed against it;
* `CarefulReferences` decodes a reference once however many times it is asked for, and caches nothing from a
  decode that failed.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_careful.py -q``
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

from clover_engine.decoding.block_diffusion_samplers import FastDLLMv2Sampler, SDARSampler
from clover_engine.decoding.careful import CarefulReferences, agreement, careful_setting, is_careful
from clover_engine.decoding.config import DecodeConfig
from clover_engine.decoding.llada2_samplers import LLaDA21Sampler, LLaDA2Sampler
from clover_engine.decoding.masked_diffusion_samplers import DreamSampler, LLaDASampler


def test_the_careful_setting_changes_only_the_parallelism():
    dc = DecodeConfig(block_size=32, threshold=0.7, policy="margin", max_new_tokens=64, repetition_penalty=1.5)
    care = careful_setting(dc)
    assert (care.block_size, care.policy, care.tokens_per_step) == (32, "top_k", 1)
    assert dataclasses.replace(care, policy="margin", tokens_per_step=dc.tokens_per_step) == dc  # nothing else changed
    assert is_careful(care) and not is_careful(dc) and careful_setting(care) is care
    assert is_careful(DecodeConfig(block_size=1, policy="margin"))  # one slot a forward whatever the policy
    assert is_careful(DecodeConfig(policy="verify"))  # the base's own answer: its own reference
    cases = [(LLaDASampler(gen_length=64, block_length=32, steps=16), dict(steps=64)),
             (DreamSampler(max_new_tokens=64, steps=8), dict(steps=64)),
             (FastDLLMv2Sampler(max_new_tokens=64, block_size=32, threshold=0.9), dict(threshold=1.0)),
             (SDARSampler(gen_length=64, block_length=8, denoising_steps=4, confidence_threshold=0.8),
              dict(remasking_strategy="low_confidence_static", denoising_steps=8)),
             (LLaDA2Sampler(gen_length=64, block_length=32, steps=8, threshold=0.9), dict(threshold=1.0, steps=32)),
             (LLaDA21Sampler(gen_length=64, block_length=32, threshold=0.9, num_to_transfer=2),
              dict(threshold=1.0, num_to_transfer=1))]
    for setting, changed in cases:
        care = careful_setting(setting)
        assert care == dataclasses.replace(setting, **changed), setting
        assert is_careful(care) and not is_careful(setting)
    with pytest.raises(TypeError, match="DecodeConfig or an official sampler"):
        careful_setting({"block_size": 1})


def test_agreement_on_answers_made_to_differ():
    ref = [5, 6, 7, 8, 9, 10]
    same = agreement(ref, ref)
    assert same.identical and same.token_agreement == 100.0 and same.first_difference is None
    assert same.common_prefix == 6 and "100 %" in same.describe()
    off = list(ref)
    off[3] = 99  # a difference made on purpose at slot 3
    a = agreement(off, ref)
    assert (a.first_difference, a.common_prefix, a.matching, a.identical) == (3, 3, 5, False)
    assert a.token_agreement == pytest.approx(500 / 6)
    assert a.describe() == "agrees with the careful decode: 83 % (first difference at slot 3)"
    short = agreement(ref[:4], ref)  # the answer ended early (an EOS the reference did not write there)
    assert (short.first_difference, short.matching, short.token_agreement) == (4, 4, pytest.approx(400 / 6))
    assert agreement([], []).identical and agreement([], []).token_agreement == 100.0
    own = agreement(ref, ref, own=True)
    assert "its own careful decode" in own.describe()
    assert type(a).from_dict({**a.to_dict(), "later_field": 1}) == a


@pytest.fixture(scope="module")
def clover_tiny():
    from clover_viz.models import load_model_cached, resolve_model

    loaded = load_model_cached(resolve_model("clover-tiny"))
    return loaded.model, loaded.tokenizer


def _decode(model, tok, setting, prompt):
    from clover_engine.decoding.samplers import decoder_for

    return decoder_for(model, tok, config=setting).generate(prompt, record_trace=True)


def _from_mask(st) -> int:
    """Masked slots a step wrote (LLaDA2.1's edits of written slots are not new slots)."""
    return int(((st.accepted | st.forced | st.eos_filled) & st.masked_before).sum())


def _one_slot_per_forward(result) -> bool:
    return all(_from_mask(st) <= 1 for st in result.trace.steps)


def test_threshold_decodings_careful_decode_agrees_with_itself_and_measures_a_fast_one(clover_tiny):
    model, tok = clover_tiny
    fast = DecodeConfig(block_size=8, threshold=0.5, max_new_tokens=24, memory_mode="state")
    prompt = "def add(a, b):\n    return"
    care = _decode(model, tok, careful_setting(fast), prompt)
    again = _decode(model, tok, careful_setting(fast), prompt)
    assert _one_slot_per_forward(care) and care.nfe == len(care.tokens)
    assert agreement(again.tokens, care.tokens).identical
    run = _decode(model, tok, fast, prompt)
    a = agreement(run.tokens, care.tokens)
    assert run.nfe < care.nfe and 0.0 <= a.token_agreement <= 100.0
    assert a.identical == (list(run.tokens) == list(care.tokens))


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    pytest.importorskip("transformers")
    from clover_engine.backbones.block_causal import write_tiny_block_causal
    from clover_engine.backbones.llada2_moe import write_tiny_llada2_moe
    from clover_engine.backbones.llada_moe import write_tiny_llada_moe
    from clover_engine.checkpoint import load_model, load_tokenizer

    root = tmp_path_factory.mktemp("careful")
    dirs = {"fast_dllm_v2": write_tiny_block_causal(root / "fd", "Fast_dLLM_Qwen"),
            "sdar": write_tiny_block_causal(root / "sdar", "SDAR"),
            "llada2": write_tiny_llada2_moe(root / "llada2"), "llada": write_tiny_llada_moe(root / "llada")}
    return {k: (load_model(d), load_tokenizer(d)) for k, d in dirs.items()}


FAMILY_CASES = [
    ("llada", LLaDASampler(gen_length=16, block_length=8, steps=4)),
    ("llada", DreamSampler(max_new_tokens=16, steps=4, alg="maskgit_plus")),
    ("fast_dllm_v2", FastDLLMv2Sampler(max_new_tokens=16, block_size=8, small_block_size=8, threshold=0.3)),
    ("sdar", SDARSampler(gen_length=16, block_length=8, denoising_steps=8, confidence_threshold=0.3, seed=0)),
    ("llada2", LLaDA2Sampler(gen_length=16, block_length=8, steps=8, threshold=0.3)),
    ("llada2", LLaDA21Sampler(gen_length=16, block_length=8, threshold=0.3)),
]


@pytest.mark.parametrize("family,setting", FAMILY_CASES, ids=[f"{f}-{s.sampler}" for f, s in FAMILY_CASES])
def test_each_familys_careful_decode_writes_one_slot_a_forward_and_agrees_with_itself(families, family, setting):
    model, tok = families[family]
    prompt = "Explain block diffusion in one line."
    care = _decode(model, tok, careful_setting(setting), prompt)
    written = [_from_mask(st) for st in care.trace.steps]
    assert sum(written) <= len(written)  # no more tokens than forwards over the run
    if setting.sampler == "dream":  # its schedule's int() writes 0 at first and catches up at its last step
        assert len(care.trace) == setting.max_new_tokens and max(written[:-1]) <= 1, written
    else:
        assert _one_slot_per_forward(care), written
    assert agreement(_decode(model, tok, careful_setting(setting), prompt).tokens, care.tokens).identical
    run = _decode(model, tok, setting, prompt)
    a = agreement(run.tokens, care.tokens)
    assert len(run.trace) <= len(care.trace)  # the faster setting takes no more steps
    assert a.identical == (list(run.tokens) == list(care.tokens)) and a.n_reference == len(care.tokens)


def test_references_are_decoded_once_and_a_failed_decode_caches_nothing():
    refs = CarefulReferences()
    calls = []
    setting = DecodeConfig(block_size=8)

    def decode(care):
        calls.append(care)
        return [1, 2, 3]

    threads = [threading.Thread(target=refs.reference, args=("m", [4, 5], setting, decode)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    # another threshold at the same block size: the same careful decode, not decoded again
    assert refs.reference("m", [4, 5], DecodeConfig(block_size=8, threshold=0.5), decode) == [1, 2, 3]
    assert len(calls) == 1 and (calls[0].policy, calls[0].tokens_per_step) == ("top_k", 1)
    assert refs.get("m", [4, 5], setting) == [1, 2, 3] and refs.get("m", [4, 6], setting) is None

    def fails(care):
        raise KeyboardInterrupt("cancelled")

    with pytest.raises(KeyboardInterrupt):
        refs.reference("m", [9], setting, fails)
    assert refs.get("m", [9], setting) is None
    assert refs.reference("m", [9], setting, decode) == [1, 2, 3]


def test_a_caller_waiting_for_anothers_reference_can_be_cancelled():
    """A second caller of the same reference waits for the first one's decode; its cancel ends the wait at once
    (the first decode goes on and is cached for its own caller)."""
    from clover_engine.decoding.careful import CarefulCancelled

    refs, release, started = CarefulReferences(), threading.Event(), threading.Event()

    def slow(care):
        started.set()
        release.wait(10)
        return [7]

    first = threading.Thread(target=refs.reference, args=("m", [1], DecodeConfig(), slow))
    first.start()
    assert started.wait(10)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(CarefulCancelled):
        refs.reference("m", [1], DecodeConfig(), slow, cancel=cancel)
    release.set()
    first.join(10)
    assert refs.get("m", [1], DecodeConfig()) == [7]
