"""One rule for how a prompt becomes model input (`clover_engine.prompting.model_input`), used by every
front end: the explorer's session state (the Panel app and the notebook `Explorer`), the CLI,
`clover_engine.sweep` and `clover_engine.eval` (through `clover_engine.experiments.decode_task`).

A chat model is stood in for by the random ``clover-test`` declaring the ChatML template in its
capabilities: its byte tokenizer knows the ChatML special tokens, so the exact ids of the wrapped
prompt can be checked, in seconds.

Run: .venv/bin/python -m pytest tests/clover_engine/test_prompting.py -q
"""

from __future__ import annotations

import types

import pytest

from clover_engine.backbones.base import Capabilities
from clover_engine.backbones.clover.model import CloverModel, random_model
from clover_engine.prompting import chatml_prompt, in_chat_layout, model_input
from clover_engine.tokenizer import byte_tokenizer

SYSTEM = "You are a test assistant"
QUESTION = "What is the boiling point of water in Celsius?"


class _ChatClover(CloverModel):
    """clover-test declaring a chat template (what an adapter over a chat base declares)."""

    @property
    def capabilities(self) -> Capabilities:
        return super().capabilities.replace(chat_template="chatml", chat_system=SYSTEM)


class _Declares:
    """A stand-in that only declares capabilities (what `model_input` reads)."""

    def __init__(self, caps: Capabilities):
        self._caps = caps

    @property
    def capabilities(self) -> Capabilities:
        return self._caps


@pytest.fixture(scope="module")
def chat_model():
    src = random_model("clover-test", seed=3, weight_scale=15.0)
    m = _ChatClover(src.config)
    m.load_state_dict(src.state_dict())
    return m.eval()


def test_the_rule():
    chat = _Declares(Capabilities(family="causal_lm", chat_template="chatml", chat_system=SYSTEM))
    plain = _Declares(Capabilities(family="clover"))
    wrapped = model_input(QUESTION, chat)
    assert wrapped.wrapped and wrapped.template == "chatml" and wrapped.prompt == QUESTION
    assert wrapped.text == (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n"
                            "<|im_start|>assistant\n")
    # already a conversation: as given (wrapping would nest it); leading blank lines do not hide it
    convo = "\n " + chatml_prompt(QUESTION)
    assert in_chat_layout(convo) and model_input(convo, chat).text == convo and not model_input(convo, chat).wrapped
    assert "already a conversation" in model_input(convo, chat).note
    # no chat template (Clover checkpoints): as given; raw: as given
    assert model_input(QUESTION, plain).text == QUESTION and "no chat template" in model_input(QUESTION, plain).note
    assert model_input(QUESTION, chat, raw=True).text == QUESTION
    # a decoder holding the model is looked through
    assert model_input(QUESTION, types.SimpleNamespace(model=chat)).text == wrapped.text
    with pytest.raises(TypeError, match="must be text"):
        model_input([1, 2], chat)
    with pytest.raises(TypeError, match="declares no capabilities"):
        model_input(QUESTION, types.SimpleNamespace(chat_format="chatml"))  # never sniffed


def test_the_adapter_template_is_the_same_text():
    from clover_engine.backbones.causal_lm.adapter import SMOLLM2_SYSTEM, chat_prompt

    chat = _Declares(Capabilities(family="causal_lm", chat_template="chatml", chat_system=SMOLLM2_SYSTEM))
    assert chat_prompt(QUESTION) == model_input(QUESTION, chat).text


def test_the_explorer_decodes_a_plain_question_in_the_chat_template(chat_model):
    """The app and the notebook `Explorer` drive `ExplorerState.generate`: a plain question to a
    chat model is decoded inside the chat template (it used to be decoded bare: a chat model then
    wrote end-of-text at once -- '0 tokens in 15 forwards'), the trace records the exact input,
    and the done line says so. A conversation already in chat layout is decoded as given."""
    from clover_viz.models import LoadedModel
    from clover_viz.state import ExplorerState

    tok = byte_tokenizer()
    s = ExplorerState(max_new_tokens=8, block_size=8)
    s.use_model(LoadedModel.in_memory(chat_model, tok))
    try:
        for prompt, text in ((QUESTION, chatml_prompt(QUESTION, SYSTEM)),
                             (chatml_prompt("Hi", None), chatml_prompt("Hi", None))):
            s.prompt = prompt
            assert s.generate(), s.error
            assert s.wait(60) and s.status.startswith("done"), s.status
            assert s.trace.prompt_ids == tok.encode(text).ids
            assert s.trace.meta["model_input"] == text and s.trace.meta["prompt"] == prompt
            assert ("ChatML chat template" in s.status) is (prompt == QUESTION), s.status
    finally:
        s.close()
        s.wait(5)


def test_sweep_and_eval_use_the_same_rule(chat_model, tmp_path):
    """`clover_engine.sweep` (chat tasks) decodes the same ids as the explorer; `clover_engine.eval`'s
    `decode_task` decodes an agent prompt (already a conversation) as given, for a chat model too."""
    from clover_engine import sweep
    from clover_engine.data.agent import eval_tasks
    from clover_engine.decoding.decoder import DecodeConfig
    from clover_engine.experiments import decode_task
    from clover_engine.recording.trace import Trace

    tok = byte_tokenizer()
    task = sweep.SweepTask("chat-eval:1", 0, QUESTION, "chat")
    cell = sweep.Cell(0, "0" * 16, "in-memory", "b8", {"block_size": 8, "max_new_tokens": 4}, task)
    _row, trace_bytes = sweep.run_cell(cell, chat_model, tok, traces=True)
    (tmp_path / "t.parquet").write_bytes(trace_bytes)
    assert Trace.load(tmp_path / "t.parquet").prompt_ids == tok.encode(chatml_prompt(QUESTION, SYSTEM)).ids

    turn = eval_tasks()[0]
    assert in_chat_layout(turn.prompt)
    run = decode_task(chat_model, tok, turn, DecodeConfig(block_size=8, max_new_tokens=4))
    assert run.prompt_len == len(tok.encode(turn.prompt).ids)
