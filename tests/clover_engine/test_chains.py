"""Long tool-call chains (`clover_engine.experiments.chains`): each round, decoded from the carried state, equals
`BlockDecoder.generate` on the same prompt, with the same processor firings.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_chains.py -q``
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from clover_engine import experiments as X
from clover_engine.experiments.chains import chain_prompts, decode_chain
from clover_engine.data.agent import EVAL_SEED_START, generate_conversation
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig

BASE = {"block_size": 32, "threshold": 0.95, "max_new_tokens": 64, "memory_mode": "state+window"}
SETTINGS = {"off": DecodeConfig(**BASE), "repetition": DecodeConfig(**BASE, repetition_penalty=2.0),
            "eos bias": DecodeConfig(**BASE, eos_bias_soft_limit=16, eos_bias_rate=0.5)}


@pytest.fixture(scope="module")
def bundled():
    return X.load_bundled(threads=None)


def test_rounds_equal_fresh_decodes_of_the_same_prompt(bundled):
    model, tok = bundled
    conv = generate_conversation(random.Random(EVAL_SEED_START + 7), n_rounds=4)
    runs = decode_chain(model, tok, conv, SETTINGS, rounds=[0, 3])
    prompts = chain_prompts(tok, conv)
    for name, dc in SETTINGS.items():
        assert [r.round for r in runs[name]] == [0, 3]
        for r in runs[name]:
            fresh = BlockDecoder(model, tok, dc).generate(prompts[r.round])
            assert r.tokens.tolist() == fresh.tokens and r.nfe == fresh.nfe and r.n_forced == fresh.n_forced
            fired = [f for ev in fresh.trace.steps for f in ev.firings]
            assert len(r.fire_name) == len(fired)
            for want in ("repetition", "eos_bias"):
                assert r.firings(want) == sum(f.name == want for f in fired)
            assert r.prompt_len == len(prompts[r.round]) and r.target[-1] == model.config.eos_token_id
    eos = runs["eos bias"]
    assert sum(r.firings("eos_bias") for r in eos) > 0 and np.all(np.concatenate([r.fire_pos for r in eos]) > 16)
    assert all(r.firings("repetition") == 0 and r.firings("eos_bias") == 0 for r in runs["off"])
    # the first setting runs every forward; the others reuse the forwards they share with it
    assert all(r.n_reused == 0 for r in runs["off"]) and sum(r.n_reused for r in runs["eos bias"]) > 0


def test_eos_written_under_the_bias_is_found(bundled):
    model, tok = bundled
    conv = generate_conversation(random.Random(EVAL_SEED_START + 8), n_rounds=1)
    dc = DecodeConfig(**{**BASE, "eos_bias_soft_limit": 0, "eos_bias_rate": 50.0})
    r = decode_chain(model, tok, conv, {"x": dc})["x"][0]
    assert r.hit_eos and len(r.tokens) <= 2 and r.eos_written_biased(model.config.eos_token_id)
    off = decode_chain(model, tok, conv, {"off": SETTINGS["off"]})["off"][0]
    assert not off.eos_written_biased(model.config.eos_token_id)


def test_prompts_extend_each_other_and_errors(bundled):
    model, tok = bundled
    conv = generate_conversation(random.Random(EVAL_SEED_START + 9), n_rounds=3)
    p = chain_prompts(tok, conv)
    assert all(b[: len(a)] == a for a, b in itertools.pairwise(p))
    with pytest.raises(ValueError, match="at least one setting"):
        decode_chain(model, tok, conv, {})
    with pytest.raises(ValueError, match="share block_size"):
        decode_chain(model, tok, conv, {"a": DecodeConfig(block_size=32), "b": DecodeConfig(block_size=16)})


def test_turn_per_call_chain_keeps_calls_and_responses(bundled):
    from clover_engine.experiments.chains import turn_per_call_chain

    _, tok = bundled
    conv = generate_conversation(random.Random(EVAL_SEED_START + 11), n_rounds=6)
    chain = turn_per_call_chain(conv)
    assert [c.target for c in chain.calls] == [c.target for c in conv.calls]
    assert [c.arguments for c in chain.calls] == [c.arguments for c in conv.calls]
    assert chain.text.count("<tool_response>") == conv.text.count("<tool_response>")
    for i, call in enumerate(chain.calls):
        last_user = call.prompt.rsplit("<|im_start|>user\n", 1)[1]
        assert last_user.startswith("Please ") and last_user.endswith(".<|im_end|>\n<|im_start|>assistant\n")
        for f in call.fields:  # a value written in the request sits in this round's own turn
            if f.source == "request" and not f.is_repeat_of_earlier_field:
                assert str(f.value) in last_user
        if i:
            assert call.prompt.startswith(chain.calls[i - 1].prompt + chain.calls[i - 1].target)
    p = chain_prompts(tok, chain)
    assert all(b[: len(a)] == a for a, b in itertools.pairwise(p))
