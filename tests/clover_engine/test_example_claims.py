"""Every bundled example shows its point, in numbers: each example of the explorer's pickers is decoded
on the bundled model its claim names, with the claim's settings (`clover_engine.examples.EXAMPLE_CLAIMS`),
and must reach the tokens per forward and stay within the forced share its own description states
(the line the picker shows, `example_note`), with the text the claim says the answer holds.

The SmolLM2 examples need the pinned base (`.ci/install` installs it) and skip without it.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_example_claims.py -q``
"""

from __future__ import annotations

import pytest
import torch
from helpers import smollm2_base_installed

from clover_engine.checkpoint import load_model, load_tokenizer
from clover_engine.decoding.decoder import DecodeConfig
from clover_engine.decoding.samplers import decoder_for
from clover_engine.examples import CHAT_EXAMPLE_PROMPTS, EXAMPLE_CLAIMS, EXAMPLE_PROMPTS, example_note, example_prompt
from clover_viz.models import resolve_model

pytestmark = pytest.mark.stored_reference  # .ci/run reruns it on PyTorch's plain kernels


_MODELS: dict = {}


def _model(name: str):
    if name not in _MODELS:
        path = resolve_model(name).path
        _MODELS[name] = (load_model(path), load_tokenizer(path))
    return _MODELS[name]


def test_every_example_has_a_claim_and_its_note_states_the_numbers():
    assert set(EXAMPLE_CLAIMS) == set(EXAMPLE_PROMPTS) | set(CHAT_EXAMPLE_PROMPTS)
    for name, claim in EXAMPLE_CLAIMS.items():
        note = example_note(name)
        assert f"{claim.tokens_per_forward:g} tokens per" in note and claim.model in note
        assert claim.forced_share is None or f"{claim.forced_share:.0%} forced" in note


@pytest.mark.parametrize("name", list(EXAMPLE_CLAIMS))
def test_the_example_decodes_as_its_description_says(name):
    claim = EXAMPLE_CLAIMS[name]
    if claim.model.startswith("smollm2") and not smollm2_base_installed():
        pytest.skip("SmolLM2 base not installed (bash .ci/install installs it)")
    torch.set_num_threads(1)
    model, tok = _model(claim.model)
    result = decoder_for(model, tok, DecodeConfig(**claim.settings)).generate(example_prompt(name), record_trace=False)
    tpf = result.tokens_per_forward
    assert tpf >= claim.tokens_per_forward, f"{name}: {tpf:.2f} tokens per forward < {claim.tokens_per_forward}"
    if claim.forced_share is not None:
        share = result.n_forced / max(len(result.tokens), 1)
        assert share <= claim.forced_share, f"{name}: {share:.0%} forced > {claim.forced_share:.0%}"
    for text in claim.contains:
        assert text in result.text, f"{name}: {text!r} not in {result.text!r}"
