"""How a user's prompt becomes the text a model decodes: one rule for every front end.

A chat model (one whose capabilities declare the ``"chatml"`` chat template: the SmolLM2
adapters, ``models/smollm2-bd``) was trained on conversations, not on bare text: a plain question
decoded as is reads to it as the middle of a document, and it writes end-of-text or
noise. Such a prompt is wrapped in the model's chat template -- a system turn, the
question as one user turn, and the assistant header the answer starts after. A prompt
already in chat layout (it starts with ``<|im_start|>``) is decoded as given: wrapping
it again would nest one conversation inside another. A model without a chat template
(Clover checkpoints such as ``models/clover-tiny``: its agent prompts carry their own
layout, its code prompts none) decodes the text as given.

`model_input` is that rule. The CLI (`clover_engine.generate`), the explorer's session state
(`clover_viz.state.ExplorerState`, behind both the Panel app and the notebook
``Explorer``), `clover_engine.sweep` and `clover_engine.eval.chat` all call it, and the explorer records
its result in the trace (``meta["model_input"]``) so the views can show the exact text
that was decoded.

ChatML (``<|im_start|>role\\n...<|im_end|>\\n``) is the layout of SmolLM2-Instruct's
tokenizer chat template (``tokenizer_config.json`` of HuggingFaceTB/SmolLM2-135M-Instruct).

Wing: ``backbones``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clover_engine.backbones.base import capabilities_of

CHATML = "chatml"
CHAT_TURN_START = "<|im_start|>"


def chat_template_of(model: Any) -> str | None:
    """The chat template a model decodes in (``"chatml"``), or None for a model without one: what its
    `clover_engine.backbones.base.Capabilities` declare (a decoder-like object answers for its ``.model``)."""
    template = capabilities_of(model).chat_template
    return template if template == CHATML else None


def in_chat_layout(text: str) -> bool:
    """True when ``text`` is already a conversation in chat layout (starts with ``<|im_start|>``)."""
    return text.lstrip().startswith(CHAT_TURN_START)


def chatml_prompt(user: str, system: str | None = None) -> str:
    """ChatML text of one user turn and the assistant header (plus a system turn when ``system``).

    Returns:
        ``"<|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{user}<|im_end|>\\n"
        "<|im_start|>assistant\\n"`` (no system part when ``system`` is None or empty).
    """
    sys_part = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{sys_part}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True)
class ModelInput:
    """What a prompt became for one model.

    Attributes:
        prompt: the text the user gave (unchanged).
        text: the exact text the decoder encodes.
        template: the chat template applied (``"chatml"``), or None when ``text == prompt``.
        note: one line saying what was done and why (for a status line or stderr).
    """

    prompt: str
    text: str
    template: str | None
    note: str

    @property
    def wrapped(self) -> bool:
        """The prompt was wrapped in a chat template (``text != prompt``)."""
        return self.template is not None


def model_input(prompt: str, model: Any, raw: bool = False) -> ModelInput:
    """The text ``model`` decodes for the user's ``prompt``.

    Args:
        prompt: the user's text (a question, an instruction, a conversation in chat layout,
            or text to continue).
        model: the model (or a decoder holding it as ``.model``); its chat template and default
            system turn are what its capabilities declare (`clover_engine.backbones.base.Capabilities`).
        raw: decode the prompt as given even for a chat model (the CLI's ``--raw-prompt``).

    Returns:
        a `ModelInput`: for a chat model and a prompt not in chat layout, the prompt as one
        user turn after the model's system turn, ending at the assistant header; otherwise
        the prompt unchanged.

    Raises:
        TypeError: when ``prompt`` is not a str.
    """
    if not isinstance(prompt, str):
        raise TypeError(f"the prompt must be text (str), got {type(prompt).__name__}")
    template = chat_template_of(model)
    if template is None:
        return ModelInput(prompt, prompt, None, "decoded as given (this model has no chat template)")
    if raw:
        return ModelInput(prompt, prompt, None, "decoded as given (raw prompt: no chat template applied)")
    if in_chat_layout(prompt):
        return ModelInput(prompt, prompt, None,
                          "decoded as given: the prompt is already a conversation in chat layout (<|im_start|>)")
    system = capabilities_of(model).chat_system
    return ModelInput(prompt, chatml_prompt(prompt, system), template,
                      "wrapped in the model's chat template (ChatML: system turn, your text as the user turn, "
                      "assistant header)")
