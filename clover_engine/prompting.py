"""How a user's prompt becomes the text a model decodes: one rule for every front end.

A chat model was trained on conversations, not on bare text: a plain question decoded as is
reads to it as the middle of a document, and it writes end-of-text or noise. Such a prompt is
wrapped in the model's chat template -- (a system turn,) the question as one user turn, and the
assistant header the answer starts after. Two kinds of template:

* ``"checkpoint"``: the checkpoint's own Jinja template (``chat_template.jinja``,
  ``chat_template.json`` or ``tokenizer_config.json``'s ``chat_template``, as transformers looks
  for it), rendered by transformers' chat-template renderer -- the function its
  ``apply_chat_template`` calls -- with the checkpoint's special tokens (`CheckpointChatTemplate`).
  LLaDA-8B-Instruct, Dream-v0-Instruct and any later hub checkpoint that ships a template are
  rendered exactly as their own tokenizer renders them.
* ``"chatml"``: the fallback rule, for models that declare ChatML but bring no template file
  (the SmolLM2 adapters, ``models/smollm2-bd``, whose layout is SmolLM2-Instruct's ChatML with its
  default system turn).

A prompt already in chat layout (for ChatML: it starts with ``<|im_start|>``; for a checkpoint
template: it holds one of the special tokens the template writes) is decoded as given: wrapping
it again would nest one conversation inside another. A model without a chat template (Clover
checkpoints such as ``models/clover-tiny``: its agent prompts carry their own layout, its code
prompts none) decodes the text as given.

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

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clover_engine.backbones.base import capabilities_of

CHATML = "chatml"
CHECKPOINT = "checkpoint"
CHAT_TURN_START = "<|im_start|>"
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")
"""Where a checkpoint keeps its chat template, in the order transformers 5 reads them."""

_PROBE = "\x00user text\x00"  # stands for the user's text when the template's own parts are looked for


class CheckpointChatTemplate:
    """A checkpoint's own chat template: its Jinja source and the special tokens it is rendered with.

    Rendering is transformers' (``transformers.utils.chat_template_utils.render_jinja_template``, what
    ``PreTrainedTokenizerBase.apply_chat_template(..., tokenize=False)`` calls), given the checkpoint's
    special tokens (``bos_token``, ``eos_token``, ...) as ``apply_chat_template`` gives them, so the text
    is the one the checkpoint's own tokenizer would produce -- without building that tokenizer (Dream's
    needs remote code).

    Args:
        template: the Jinja source.
        special_tokens: name -> text (``{"bos_token": "<|startoftext|>", ...}``), passed to the template.
        markers: special tokens the template writes around a turn; a prompt holding one is already in
            chat layout.
        source: the file it came from (for notes and errors).
    """

    def __init__(self, template: str, special_tokens: dict[str, str], markers: tuple[str, ...] = (),
                 source: str = "chat_template.jinja") -> None:
        self.template, self.special_tokens, self.source = template, dict(special_tokens), source
        probe = self.render(_PROBE)  # raises ValueError on a template that does not render
        self.markers = tuple(m for m in dict.fromkeys(markers) if m and m in probe)
        self.head = probe.split(_PROBE, 1)[0]  # what the template writes before the user's text

    @classmethod
    def from_directory(cls, directory: str | Path) -> CheckpointChatTemplate | None:
        """The chat template of the checkpoint in ``directory``, or None when it ships none.

        Looks in `TEMPLATE_FILES` (``chat_template.jinja``; ``chat_template.json``'s ``chat_template``;
        ``tokenizer_config.json``'s ``chat_template``, a string or a list of ``{"name", "template"}`` of
        which ``default`` is taken). Special tokens: ``tokenizer_config.json`` and
        ``special_tokens_map.json`` (strings or ``{"content": ...}``); markers: those and the
        ``added_tokens_decoder`` entries marked ``special``.

        Raises:
            ValueError: a template file that is not valid JSON, holds no template, or whose template
                does not render (the message names the file).
        """
        d = Path(directory)
        config = _read_json(d / "tokenizer_config.json") if (d / "tokenizer_config.json").is_file() else {}
        template, source = None, None
        if (d / "chat_template.jinja").is_file():
            template, source = (d / "chat_template.jinja").read_text(encoding="utf-8"), "chat_template.jinja"
        elif (d / "chat_template.json").is_file():
            template, source = _read_json(d / "chat_template.json").get("chat_template"), "chat_template.json"
        elif config.get("chat_template"):
            template, source = config["chat_template"], "tokenizer_config.json"
        if source is None:
            return None
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if not isinstance(template, str) or not template.strip():
            raise ValueError(f"{d / source} holds no chat template (expected Jinja text, or a list of named "
                             "templates with a 'default' one); fix the file or remove it to decode prompts as given")
        specials: dict[str, str] = {}
        for data in (_read_json(d / "special_tokens_map.json") if (d / "special_tokens_map.json").is_file() else {},
                     config):
            for key, value in data.items():
                text = value.get("content") if isinstance(value, dict) else value
                if key.endswith("_token") and isinstance(text, str):
                    specials[key] = text
        added = config.get("added_tokens_decoder") or {}
        markers = [*specials.values(), *(t.get("content") for t in added.values()
                                         if isinstance(t, dict) and t.get("special"))]
        try:
            return cls(template, specials, tuple(m for m in markers if isinstance(m, str)), source)
        except ValueError as exc:
            raise ValueError(f"{d / source}: {exc}") from None

    def render(self, user: str) -> str:
        """The text of one user turn ``user`` and the assistant header (``add_generation_prompt=True``).

        Raises:
            ValueError: the template does not render (a Jinja error, or ``raise_exception`` in it).
        """
        from transformers.utils.chat_template_utils import render_jinja_template

        try:
            rendered, _ = render_jinja_template([[{"role": "user", "content": user}]], chat_template=self.template,
                                                add_generation_prompt=True, **self.special_tokens)
        except Exception as exc:  # noqa: BLE001  jinja2's TemplateError, or what the template raises
            raise ValueError(f"the checkpoint's chat template does not render a user turn: {exc}") from None
        return rendered[0]

    def in_layout(self, text: str) -> bool:
        """True when ``text`` is already a conversation in this template's layout: it holds one of its
        special tokens (`markers`), or -- a template without special tokens -- starts with its head."""
        if self.markers:
            return any(m in text for m in self.markers)
        return bool(self.head.strip()) and text.lstrip().startswith(self.head.strip())


def trained_context_note(prompt_tokens: int, capabilities: Any) -> str:
    """One sentence when a prompt is longer than the sequences the model was trained on, else ``""``.

    Args:
        prompt_tokens: the prompt's length in the model's tokens.
        capabilities: the model's `clover_engine.backbones.base.Capabilities` (its ``trained_context``:
            tokens per training row, prompt and answer together; None: nothing to say).

    Returns:
        e.g. ``"the prompt has 1,406 tokens; this model was trained on sequences of at most 256 tokens
        (prompt and answer): it is decoded whole, but expect worse text"`` -- the front ends print it (CLI:
        stderr) or append it to the status line; the prompt is never cut. A prompt past the hard context
        is refused by the decoder instead, with its numbers.
    """
    trained = getattr(capabilities, "trained_context", None)
    if not trained or prompt_tokens <= trained:
        return ""
    return (f"the prompt has {prompt_tokens:,} tokens; this model was trained on sequences of at most {trained:,} "
            "tokens (prompt and answer): it is decoded whole, but expect worse text")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); fix or remove it") from None
    return data if isinstance(data, dict) else {}


def checkpoint_chat_of(model: Any) -> CheckpointChatTemplate | None:
    """The `CheckpointChatTemplate` a model (or a decoder holding it as ``.model``) carries, or None."""
    for obj in (model, getattr(model, "model", None)):
        chat = getattr(obj, "checkpoint_chat", None)
        if isinstance(chat, CheckpointChatTemplate):
            return chat
    return None


def chat_template_of(model: Any) -> str | None:
    """The chat template a model decodes in: ``"checkpoint"`` (its own, `CheckpointChatTemplate`),
    ``"chatml"``, or None for a model without one -- what its `clover_engine.backbones.base.Capabilities`
    declare (a decoder-like object answers for its ``.model``)."""
    template = capabilities_of(model).chat_template
    if template == CHECKPOINT:
        return CHECKPOINT if checkpoint_chat_of(model) is not None else None
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
        template: the chat template applied (``"checkpoint"`` or ``"chatml"``), or None when ``text == prompt``.
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
        user turn (after the model's system turn, where its template writes one), ending at the
        assistant header; otherwise the prompt unchanged.

    Raises:
        TypeError: when ``prompt`` is not a str.
        ValueError: the checkpoint's own template does not render the turn.
    """
    if not isinstance(prompt, str):
        raise TypeError(f"the prompt must be text (str), got {type(prompt).__name__}")
    template = chat_template_of(model)
    if template is None:
        return ModelInput(prompt, prompt, None, "decoded as given (this model has no chat template)")
    if raw:
        return ModelInput(prompt, prompt, None, "decoded as given (raw prompt: no chat template applied)")
    if template == CHECKPOINT:
        chat = checkpoint_chat_of(model)
        if chat.in_layout(prompt):
            found = sorted((prompt.find(m), m) for m in chat.markers if m in prompt)
            return ModelInput(prompt, prompt, None, "decoded as given: the prompt is already a conversation in the "
                              f"model's chat layout (it holds {found[0][1] if found else chat.head.strip()!r})")
        return ModelInput(prompt, chat.render(prompt), CHECKPOINT,
                          f"wrapped in the model's own chat template ({chat.source}): your text as the user turn, "
                          "then the assistant header")
    if in_chat_layout(prompt):
        return ModelInput(prompt, prompt, None,
                          "decoded as given: the prompt is already a conversation in chat layout (<|im_start|>)")
    system = capabilities_of(model).chat_system
    return ModelInput(prompt, chatml_prompt(prompt, system), template,
                      "wrapped in the model's chat template (ChatML: system turn, your text as the user turn, "
                      "assistant header)")
