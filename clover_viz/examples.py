"""The explorer's example prompts.

The prompts themselves live in `clover_engine.examples` (the command line's ``--example NAME`` reads the
same ones) and are re-exported here: `EXAMPLE_PROMPTS` (agent conversations in the chat layout the
bundled model is trained on, and a code completion) for the Panel app's picker, with
`DEFAULT_EXAMPLE` the one a new session starts with; `CHAT_EXAMPLE_PROMPTS` (ordinary questions
and instructions in SmolLM2's ChatML) for chat models adapted from a pretrained base
(``models/smollm2-bd``); `CHAT_QUESTIONS` (the same questions as plain text) for a model with its own
chat template (LLaDA / Dream Instruct); `examples_for` picks the set that fits a loaded model. `WEATHER_PROMPT`
is the short one-tool agent prompt the notebook `Explorer` decodes when given none.
"""

from __future__ import annotations

from clover_engine.examples import (
    CHAT_EXAMPLE_PROMPTS,
    CHAT_QUESTIONS,
    DEFAULT_CHAT_EXAMPLE,
    DEFAULT_EXAMPLE,
    EXAMPLE_PROMPTS,
    WEATHER_PROMPT,
)

# The picker's entry for a prompt the user wrote (not one of the examples).
YOUR_PROMPT = "(your prompt)"


def examples_for(capabilities: object) -> tuple[dict[str, str], str]:
    """(example prompts, default name) for a model's `clover_engine.backbones.base.Capabilities`:
    `CHAT_EXAMPLE_PROMPTS` (in ChatML) for a model that declares the ChatML template, `CHAT_QUESTIONS`
    (plain text; its template is applied at decode time) for one with its own checkpoint template,
    else `EXAMPLE_PROMPTS`."""
    template = getattr(capabilities, "chat_template", None)
    if template == "chatml":
        return CHAT_EXAMPLE_PROMPTS, DEFAULT_CHAT_EXAMPLE
    if template is not None:
        return CHAT_QUESTIONS, DEFAULT_CHAT_EXAMPLE
    return EXAMPLE_PROMPTS, DEFAULT_EXAMPLE


__all__ = ["CHAT_EXAMPLE_PROMPTS", "CHAT_QUESTIONS", "DEFAULT_CHAT_EXAMPLE", "DEFAULT_EXAMPLE", "EXAMPLE_PROMPTS",
           "WEATHER_PROMPT", "YOUR_PROMPT", "examples_for"]
