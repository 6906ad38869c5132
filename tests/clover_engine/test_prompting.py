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


# ----------------------------------------------------------------------------- a checkpoint's own template
# The Llama-3 layout LLaDA-8B-Instruct's tokenizer renders (BOS <|startoftext|>, header tokens, <|eot_id|>),
# and a Qwen2-style layout with a default system turn (Dream-v0-Instruct's kind), written here as data.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3_SPECIALS = ["<|startoftext|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def llama3_checkpoint_files(directory):
    """tokenizer.json (bytes plus LLaMA-3's header tokens) and a tokenizer_config.json holding the template,
    as a LLaDA-8B-Instruct snapshot holds them; returns the tokenizer."""
    import json

    tok = byte_tokenizer()
    tok.add_special_tokens(LLAMA3_SPECIALS)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                      "normalized": False, "single_word": False} for t in LLAMA3_SPECIALS}
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|startoftext|>", "eos_token": "<|eot_id|>", "added_tokens_decoder": added,
        "chat_template": LLAMA3_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"}))
    return tok


def test_a_checkpoints_own_template_renders_as_its_tokenizer_does(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from clover_engine.prompting import CheckpointChatTemplate

    d = tmp_path / "llada-like"
    llama3_checkpoint_files(d)
    chat = CheckpointChatTemplate.from_directory(d)
    assert chat is not None and chat.source == "tokenizer_config.json"
    expected = ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n" + QUESTION
                + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert chat.render(QUESTION) == expected
    # the same text transformers' own tokenizer of that folder renders
    hf = PreTrainedTokenizerFast.from_pretrained(str(d))
    msgs = [{"role": "user", "content": QUESTION}]
    assert hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == expected
    # a model carrying it: model_input renders, says so, and leaves a conversation in its layout alone
    model = _Declares(Capabilities(family="masked_diffusion", chat_template="checkpoint"))
    model.checkpoint_chat = chat
    given = model_input(QUESTION, model)
    assert given.wrapped and given.template == "checkpoint" and given.text == expected
    assert "own chat template (tokenizer_config.json)" in given.note
    assert model_input(expected + "Sure.", model).text == expected + "Sure."
    assert "<|startoftext|>" in model_input(expected, model).note
    no_bos = expected.removeprefix("<|startoftext|>")
    assert model_input(no_bos, model).text == no_bos and "<|start_header_id|>" in model_input(no_bos, model).note
    assert model_input("a plain <|im_start|> is no marker here", model).wrapped  # not this template's token
    assert model_input(QUESTION, model, raw=True).text == QUESTION
    # a model declaring "checkpoint" but carrying no template decodes as given
    bare = _Declares(Capabilities(family="masked_diffusion", chat_template="checkpoint"))
    assert model_input(QUESTION, bare).text == QUESTION


def test_template_files_in_transformers_order_and_clear_errors(tmp_path):
    import json

    from clover_engine.prompting import CheckpointChatTemplate

    d = tmp_path / "dream-like"
    d.mkdir()
    assert CheckpointChatTemplate.from_directory(d) is None  # a base checkpoint: no template, decoded as given
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"},
                                                         "chat_template": [{"name": "default", "template": QWEN_TEMPLATE},
                                                                           {"name": "tool_use", "template": "x"}]}))
    chat = CheckpointChatTemplate.from_directory(d)
    assert chat.render("Hi") == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi"
                                 "<|im_end|>\n<|im_start|>assistant\n")
    assert chat.markers == ("<|im_end|>",) and chat.in_layout("<|im_start|>user\nHi<|im_end|>\n")
    (d / "chat_template.jinja").write_text("{{ bos_token }}Q: {{ messages[0]['content'] }}\nA:")
    (d / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>"}))
    chat = CheckpointChatTemplate.from_directory(d)  # the .jinja file wins, as in transformers 5
    assert chat.source == "chat_template.jinja" and chat.render("Hi") == "<s>Q: Hi\nA:"
    (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(ValueError, match="chat_template.jinja: the checkpoint's chat template does not render"):
        CheckpointChatTemplate.from_directory(d)
    (d / "chat_template.jinja").unlink()
    (d / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer_config.json is not valid JSON"):
        CheckpointChatTemplate.from_directory(d)
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "x"}]}))
    with pytest.raises(ValueError, match="holds no chat template"):
        CheckpointChatTemplate.from_directory(d)


def test_a_llada_checkpoint_with_its_template_is_asked_a_plain_question_everywhere(tmp_path, capsys):
    """A tiny LLaDA checkpoint in the hub layout with its tokenizer_config.json template: the loader
    picks the template up, the explorer (app and notebook) and the CLI decode the same rendered text,
    the trace records it, the done line says so, and the picker offers plain questions."""
    import torch
    import transformers

    from clover_engine.backbones.masked_diffusion import save_masked_diffusion
    from clover_engine.checkpoint import load_model
    from clover_engine.examples import CHAT_QUESTIONS
    from clover_engine.generate import main
    from clover_engine.recording.trace import Trace
    from clover_viz.state import ExplorerState

    d = tmp_path / "tiny-llada-instruct"
    tok = llama3_checkpoint_files(d)
    torch.manual_seed(4)
    lm = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tok.token_to_id("<|startoftext|>"), eos_token_id=tok.token_to_id("<|eot_id|>"))).eval()
    save_masked_diffusion(lm, d, "llada", tok.token_to_id("<|mask|>"))
    expected = ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n" + QUESTION
                + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")

    model = load_model(d)
    assert model.capabilities.chat_template == "checkpoint" and model_input(QUESTION, model).text == expected

    s = ExplorerState(model_dir=str(d), prompt=QUESTION, max_new_tokens=8, block_size=8, threshold=0.5,
                      memory_mode="state", auto_redecode=False)
    try:
        assert s.generate(), s.error
        assert s.wait(60) and s.status.startswith("done"), s.status
        s.tick(0.02)
        assert list(s.param.example.objects)[:len(CHAT_QUESTIONS)] == list(CHAT_QUESTIONS)
        assert s.prompt == QUESTION  # a typed prompt is kept when the picker changes
        assert s.trace.meta["model_input"] == expected and s.trace.meta["chat_template"] == "checkpoint"
        assert s.trace.prompt_ids == tok.encode(expected).ids
        assert "the model's own chat template" in s.status, s.status
    finally:
        s.close()
        s.wait(5)

    out = tmp_path / "cli.parquet"
    assert main(["--model", str(d), "--prompt", QUESTION, "--block-size", "8", "--max-new-tokens", "8",
                 "--threads", "1", "--trace", str(out)]) == 0
    assert Trace.load(out).prompt_ids == tok.encode(expected).ids
    capsys.readouterr()
    assert main(["--model", str(d), "--prompt", expected, "--max-new-tokens", "8", "--threads", "1"]) == 0
    assert "already a conversation" in capsys.readouterr().err  # given in its layout: decoded as given


def test_the_trained_context_note_gives_both_numbers_only_past_the_training_rows():
    from clover_engine.prompting import trained_context_note

    caps = Capabilities(family="causal_lm", trained_context=256)
    assert trained_context_note(256, caps) == "" and trained_context_note(1406, Capabilities(family="clover")) == ""
    note = trained_context_note(1406, caps)
    assert "the prompt has 1,406 tokens" in note and "at most 256 tokens" in note and "decoded whole" in note
    assert Capabilities.from_dict(caps.to_dict()).trained_context == 256  # kept in a trace's capabilities
