"""Decodes of the bundled model on repetitive code equal the reference decode at the
block sizes where a commit folds 32 or 64 tokens at once.

A repeated token gives near-identical keys; a chunked delta-rule commit that inverted
``(I + A)`` explicitly lost all precision there at chunk 32 / 64 (logit differences up to
2.2 at block 32 and 21 at block 64 on these prompts, output turning into
``propertiesproperties...``) while block 16 matched. Every forward here is answered by
`CloverModel.forward_reference` (token-loop recurrence, states recomputed from scratch)
and the fast path's logits are held to it.

Run: .venv/bin/python -m pytest tests/clover_engine/test_repetitive_commit.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_engine.checkpoint import load_model, load_tokenizer
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from helpers import ReferenceDriven

MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / "clover-tiny"
SEPARATOR = "import os\n\n" + "#" + "-" * 78 + "\n# helpers\n" + "#" + "-" * 78 + "\ndef main():\n"
REPEATED = "def f(x):\n    return x\n\n" * 12
# (prompt, block_size, max_new_tokens): enough new tokens that at least one block of
# generated text is committed through the fused commit path (the separator prompt is
# 26 tokens; the repeated one 119, whose first 64 go through that path at block 64).
CASES = [("separator", SEPARATOR, 32, 40), ("separator", SEPARATOR, 64, 48),
         ("repeated", REPEATED, 32, 40), ("repeated", REPEATED, 64, 24)]


@pytest.fixture(scope="module")
def bundled():
    return load_model(MODEL_DIR), load_tokenizer(MODEL_DIR)


@pytest.mark.parametrize("mode", ["state", "state+window"])
@pytest.mark.parametrize("name, prompt, block_size, max_new", CASES,
                         ids=[f"{n}-bs{b}" for n, _, b, _ in CASES])
def test_decode_equals_reference_on_repetitive_code(bundled, name, prompt, block_size, max_new, mode):
    model, tok = bundled
    dc = DecodeConfig(block_size=block_size, max_new_tokens=max_new, memory_mode=mode)
    fast = BlockDecoder(model, tok, dc).generate(prompt, record_trace=False)
    wrapped = ReferenceDriven(model)
    ref = BlockDecoder(wrapped, tok, dc).generate(prompt, record_trace=False)
    assert wrapped.max_diff < 1e-3, f"fast path logits differ from the reference by {wrapped.max_diff:.3g}"
    assert fast.tokens == ref.tokens
    assert fast.nfe == ref.nfe
