"""The explorer offers example prompts that fit the loaded model."""

from __future__ import annotations

from types import SimpleNamespace

from clover_viz.examples import (
    CHAT_EXAMPLE_PROMPTS,
    DEFAULT_CHAT_EXAMPLE,
    DEFAULT_EXAMPLE,
    EXAMPLE_PROMPTS,
    YOUR_PROMPT,
    examples_for,
)
from clover_viz.models import LoadedModel
from clover_engine.backbones.base import Capabilities
from clover_viz.state import ExplorerState


class _TinyChat:
    """A stand-in chat model: a config and the capabilities it declares (a chat template)."""

    config = SimpleNamespace(name="tiny-chat")
    capabilities = Capabilities(family="causal_lm", chat_template="chatml")


def _chat_model():
    return LoadedModel.in_memory(_TinyChat(), None, label="tiny chat model")


def test_chat_models_get_chatml_questions():
    examples, default = examples_for(_chat_model().capabilities)
    assert examples is CHAT_EXAMPLE_PROMPTS and default == DEFAULT_CHAT_EXAMPLE
    for text in examples.values():
        assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert examples_for(Capabilities(family="clover"))[0] is EXAMPLE_PROMPTS


def test_switching_to_a_chat_model_switches_examples_but_keeps_a_typed_prompt():
    s = ExplorerState(prompt=EXAMPLE_PROMPTS["long tool chain"], example="long tool chain")
    s.use_model(_chat_model())
    assert s.param.example.objects == [*CHAT_EXAMPLE_PROMPTS, YOUR_PROMPT]
    assert s.example == DEFAULT_CHAT_EXAMPLE and s.prompt == CHAT_EXAMPLE_PROMPTS[DEFAULT_CHAT_EXAMPLE]
    s.example = "instruction"
    assert s.prompt == CHAT_EXAMPLE_PROMPTS["instruction"]

    typed = ExplorerState(prompt="my own words")
    typed.use_model(_chat_model())
    assert typed.prompt == "my own words" and typed.param.example.objects == [*CHAT_EXAMPLE_PROMPTS, YOUR_PROMPT]
    assert typed.example == YOUR_PROMPT


def test_the_picker_follows_the_prompt_and_brings_a_typed_prompt_back():
    s = ExplorerState()
    assert s.example == DEFAULT_EXAMPLE and s.prompt == EXAMPLE_PROMPTS[DEFAULT_EXAMPLE]
    s.prompt = "def fib(n):\n"
    assert s.example == YOUR_PROMPT and s.prompt == "def fib(n):\n"  # typing does not reset the text
    s.example = "long tool chain"
    assert s.prompt == EXAMPLE_PROMPTS["long tool chain"]
    s.example = YOUR_PROMPT  # back to what the user wrote
    assert s.prompt == "def fib(n):\n"
    s.prompt = EXAMPLE_PROMPTS[DEFAULT_EXAMPLE]  # pasting an example's text names that example
    assert s.example == DEFAULT_EXAMPLE
    given = ExplorerState(prompt="my own words")  # a prompt given at construction
    assert given.example == YOUR_PROMPT
    given.example = "long tool chain"
    given.example = YOUR_PROMPT
    assert given.prompt == "my own words"
    fresh = ExplorerState()
    fresh.example = YOUR_PROMPT  # nothing typed yet: the prompt stays, the picker names its example
    assert fresh.prompt == EXAMPLE_PROMPTS[DEFAULT_EXAMPLE] and fresh.example == DEFAULT_EXAMPLE


def test_the_sidebar_picker_offers_the_new_examples_and_keeps_the_prompt():
    """With the sidebar's widgets linked (`clover_viz.panel_checks.bind`), a model's new example list
    reaches the picker, the picker shows the state's choice, and a prompt the user typed survives.
    (Before, the picker kept the old list; Panel's Select then took its first option, the check
    refused it, and the two sides set each other back until a RecursionError.)"""
    from clover_viz.panel_settings import SettingsPanel

    s = ExplorerState(prompt=EXAMPLE_PROMPTS["long tool chain"], example="long tool chain", auto_redecode=False)
    panel = SettingsPanel(state=s)
    s.use_model(_chat_model())
    assert panel.example.options == [*CHAT_EXAMPLE_PROMPTS, YOUR_PROMPT]
    assert panel.example.value == s.example == DEFAULT_CHAT_EXAMPLE
    assert panel.prompt.value == s.prompt == CHAT_EXAMPLE_PROMPTS[DEFAULT_CHAT_EXAMPLE]
    panel.example.value = "instruction"  # the user picks another one
    assert s.prompt == CHAT_EXAMPLE_PROMPTS["instruction"]

    typed = ExplorerState(prompt="my own words", auto_redecode=False)
    typed_panel = SettingsPanel(state=typed)
    typed.use_model(_chat_model())
    assert typed_panel.example.options == [*CHAT_EXAMPLE_PROMPTS, YOUR_PROMPT]
    assert typed_panel.example.value == YOUR_PROMPT and typed.prompt == typed_panel.prompt.value == "my own words"
