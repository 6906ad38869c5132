"""The bundled model: it loads, and decodes a held-out agent prompt into a tool call.

Run: .venv/bin/python -m pytest tests/engine/test_bundled_model.py -q

`models/clover-tiny` is a short training run (see its README): it has learned
the tool-call layout and mostly picks the right tool, but does not yet copy
argument values (exact match 0), so this checks the structure of the call (valid
JSON inside <tool_call>, stop at <|im_end|>) and the tool name, not its values.
"""

from pathlib import Path

import pytest

from engine.checkpoint import load_model, load_tokenizer
from engine.data.agent import eval_tasks, parse_call
from engine.decoder import BlockDecoder, DecodeConfig

MODEL = Path(__file__).resolve().parents[2] / "models" / "clover-tiny"


def test_bundled_model_loads_with_its_card_and_decodes_a_tool_call():
    assert (MODEL / "README.md").is_file() and (MODEL / "eval.json").is_file()
    model, tok = load_model(MODEL), load_tokenizer(MODEL)
    cfg = model.config
    assert (cfg.mask_token_id, cfg.eos_token_id) == (tok.token_to_id("<|mask|>"), tok.token_to_id("<|im_end|>"))
    assert sum(p.numel() * p.element_size() for p in model.parameters()) <= 40 * 2**20
    dec = BlockDecoder(model, tok, DecodeConfig(block_size=32, threshold=0.95, max_new_tokens=96,
                                                memory_mode="state+window"))
    calls = []
    for task in eval_tasks(n=6):
        res = dec.generate(task.prompt, record_trace=False)
        assert res.text.startswith('<tool_call>{"name": "')
        assert res.stop_reason == "eos" and res.text.endswith("</tool_call>")
        assert tok.token_to_id("<|mask|>") not in res.tokens
        calls.append((task, parse_call(res.text)))
    # eval.json: 84 % valid JSON and 67 % right tool at 32 / 0.95; here 4 of these 6 name the right
    # tool with exactly its argument keys (values are not copied yet); ask for 3
    right = [c is not None and c["name"] == t.name and set(c["arguments"]) == set(t.arguments) for t, c in calls]
    assert sum(right) >= 3, [(t.name, c) for t, c in calls]
