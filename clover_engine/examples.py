"""Example prompts, shared by the command line (``python -m clover_engine.generate --example NAME``),
the Panel app's picker and the notebook `Explorer` (`clover_viz.examples` re-exports them).

`EXAMPLE_PROMPTS` maps a name to prompt text for the bundled clover-tiny -- two agent conversations
in the chat layout it is trained on; `DEFAULT_EXAMPLE` names the one a new session starts with (and
the README's first decode). `CHAT_EXAMPLE_PROMPTS` are ordinary questions and instructions in
SmolLM2's ChatML with its default system turn, for chat models adapted from a pretrained base
(``models/smollm2-bd``, ``models/smollm2-drafter``);
`CHAT_QUESTIONS` are the same questions as plain text, for models with their own chat template.
`WEATHER_PROMPT` is a short one-tool agent prompt. `example_prompt` looks any of them up by name.

`EXAMPLE_CLAIMS` says what each example shows, on which bundled model and settings, with the numbers a
decode must reach (tokens per forward, forced share): the picker shows `example_note`, and
``tests/clover_engine/test_example_claims.py`` decodes every example and checks them. Two examples were
dropped because they showed nothing but noise: a code completion (clover-tiny: 128 of 128 tokens forced)
and a tool call with an unseen tool (smollm2-bd: "Sure, I can. that."; smollm2-bd-tools: a call missing
one argument, 0.96 tokens per forward).

Wing: ``ground``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The agent prompts are in the chat layout the bundled model is trained on (clover_engine.data.agent); each
# ends at "<|im_start|>assistant\n", where the tool call starts. "agent tool call" is the held-out
# task `clover_engine.data.agent.eval_tasks()[3]` (conversation seed EVAL_SEED_START + 3, never trained on),
# kept verbatim here (a test checks it still equals the generator's): clover-tiny writes its call
# exactly at block 32 / threshold 0.95, 6.4 tokens per forward in state+window, and breaks it at 0.60
# (`"city": "Nap",`) -- the threshold's trade-off in one picture. Most held-out tasks it gets wrong
# (29 % exact, its card): this one is chosen to show what block diffusion does when the model is right.
# "long tool chain" is a longer conversation of the same kind, from an earlier version of the generator.
_TOOLS_REFUND = (
    '{"name": "refund_order", "description": "Refund an order; confirm_order_id must repeat order_id.", '
    '"parameters": {"type": "object", "properties": {"order_id": {"type": "string"}, "amount": '
    '{"type": "integer"}, "confirm_order_id": {"type": "string", "description": "repeat order_id"}}, '
    '"required": ["order_id", "amount", "confirm_order_id"]}}\n'
)
EXAMPLE_PROMPTS: dict[str, str] = {
    "agent tool call": (
        "<|im_start|>system\nYou are a helpful assistant with tools:\n"
        '{"name": "get_weather", "description": "Weather forecast for a city and date.", "parameters": {"type": '
        '"object", "properties": {"city": {"type": "string"}, "date": {"type": "string"}}, "required": ["city", '
        '"date"]}}\n'
        + _TOOLS_REFUND
        + '{"name": "update_address", "description": "Move a customer to a city; confirm_customer_id must repeat '
        'customer_id.", "parameters": {"type": "object", "properties": {"customer_id": {"type": "string"}, "city": '
        '{"type": "string"}, "confirm_customer_id": {"type": "string", "description": "repeat customer_id"}}, '
        '"required": ["customer_id", "city", "confirm_customer_id"]}}<|im_end|>\n'
        '<|im_start|>user\nHey. Please update an address (customer_id="USR-38475", city="Naples").<|im_end|>\n'
        "<|im_start|>assistant\n"
    ),
    "long tool chain": (
        "<|im_start|>system\nYou are a helpful assistant with tools:\n"
        '{"name": "cancel_booking", "description": "Cancel a booking; confirm_booking_id must repeat '
        'booking_id.", "parameters": {"type": "object", "properties": {"booking_id": {"type": "string"}, '
        '"passenger": {"type": "string"}, "confirm_booking_id": {"type": "string", "description": '
        '"repeat booking_id"}}, "required": ["booking_id", "passenger", "confirm_booking_id"]}}\n'
        '{"name": "add_ticket_note", "description": "Add a note to a ticket.", "parameters": {"type": '
        '"object", "properties": {"ticket_id": {"type": "string"}, "author": {"type": "string"}}, '
        '"required": ["ticket_id", "author"]}}\n'
        '{"name": "get_order", "description": "Look up an order.", "parameters": {"type": "object", '
        '"properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}\n'
        + _TOOLS_REFUND.rstrip("\n")
        + "<|im_end|>\n<|im_start|>user\nHey. Please refund an order (order_id=ORD-14712, amount=18859), "
        "then add a note to a ticket (ticket_id=TCK-514151, author=Ivan Larsen), then refund an order "
        "(order_id=ORD-47154, amount=5426), then add a note to a ticket (ticket_id=TCK-678677, author=Emil "
        "Torres), then cancel a booking (booking_id=3QNX29, passenger=Jonas Costa), and finally look up an "
        "order (order_id=ORD-44840).<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>{"name": "refund_order", "arguments": {"order_id": "ORD-14712", "amount": 18859, '
        '"confirm_order_id": "ORD-14712"}}</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>{"status": "ok", "refund_date": "2028-12-26"}</tool_response>'
        "<|im_end|>\n<|im_start|>assistant\n"
        '<tool_call>{"name": "add_ticket_note", "arguments": {"ticket_id": "TCK-514151", "author": '
        '"Ivan Larsen"}}</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>{"ticket_id": "TCK-514151", "note_id": "NOTE-55310"}'
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
        '<tool_call>{"name": "refund_order", "arguments": {"order_id": "ORD-47154", "amount": 5426, '
        '"confirm_order_id": "ORD-47154"}}</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>{"status": "ok", "refund_date": "2029-07-17"}</tool_response>'
        "<|im_end|>\n<|im_start|>assistant\n"
        '<tool_call>{"name": "add_ticket_note", "arguments": {"ticket_id": "TCK-678677", "author": '
        '"Emil Torres"}}</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>{"ticket_id": "TCK-678677", "note_id": "NOTE-54110"}'
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
        '<tool_call>{"name": "cancel_booking", "arguments": {"booking_id": "3QNX29", "passenger": '
        '"Jonas Costa", "confirm_booking_id": "3QNX29"}}</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>{"status": "ok", "refund": 66491}</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    ),
}
DEFAULT_EXAMPLE = "agent tool call"

_SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def _chat(user: str) -> str:
    return (f"<|im_start|>system\n{_SMOLLM2_SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")


CHAT_QUESTIONS: dict[str, str] = {
    "question": "How many legs does a spider have?",
    "explanation": "Explain in two sentences why the sky is blue.",
    "instruction": "Write a short poem about the sea.",
    "code": "Write a Python function that returns the factorial of n.",
}
"""Plain questions, for a model with its own chat template (LLaDA / Dream Instruct): the template is
applied at decode time (`clover_engine.prompting.model_input`), so the picker shows the user's words."""

CHAT_EXAMPLE_PROMPTS: dict[str, str] = {
    **{name: _chat(question) for name, question in CHAT_QUESTIONS.items()},
}
DEFAULT_CHAT_EXAMPLE = "question"

WEATHER_PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant with tools:\n"
    '{"name": "get_weather", "description": "Current weather for a city.", "parameters": {"type": "object", '
    '"properties": {"city": {"type": "string"}}, "required": ["city"]}}<|im_end|>\n'
    '<|im_start|>user\nWhat is the weather (city: "Lisbon")?<|im_end|>\n<|im_start|>assistant\n'
)


def example_names() -> list[str]:
    """Every example's name: `EXAMPLE_PROMPTS` (clover-tiny's) first, then `CHAT_EXAMPLE_PROMPTS`
    (a chat model's, e.g. smollm2-bd)."""
    return [*EXAMPLE_PROMPTS, *CHAT_EXAMPLE_PROMPTS]


@dataclass(frozen=True)
class ExampleClaim:
    """What an example shows, measured: decoded by ``model`` (a bundled model's name) with ``settings``
    (`clover_engine.decoding.config.DecodeConfig` fields), it reaches at least ``tokens_per_forward``
    (tokens per base forward for policy ``verify``) with at most ``forced_share`` of its tokens forced fills
    (None: not a claim -- under verify the base writes every token itself). ``shows`` is the point in words;
    ``contains`` text the answer must hold. Numbers measured on this repository's CPU decode (greedy,
    deterministic) with a little room below."""

    model: str
    settings: dict = field(default_factory=dict)
    tokens_per_forward: float = 1.0
    forced_share: float | None = None
    shows: str = ""
    contains: tuple[str, ...] = ()

    def note(self) -> str:
        """One line for the picker: the point, the model and settings, the numbers."""
        s = self.settings
        how = (f"policy verify, blocks of {s.get('block_size')}" if s.get("policy") == "verify"
               else f"block {s.get('block_size')} / threshold {s.get('threshold')}")
        unit = "tokens per base forward" if s.get("policy") == "verify" else "tokens per forward"
        forced = "" if self.forced_share is None else f", at most {self.forced_share:.0%} forced"
        return f"{self.shows} -- {self.model}, {how}: at least {self.tokens_per_forward:g} {unit}{forced}"


_TINY = dict(block_size=32, threshold=0.95, memory_mode="state+window", max_new_tokens=128)
_VERIFY = dict(block_size=8, policy="verify", max_new_tokens=64)
EXAMPLE_CLAIMS: dict[str, ExampleClaim] = {
    # measured: 51 tokens in 8 forwards, 0 forced, the call exact
    "agent tool call": ExampleClaim("clover-tiny", _TINY, 6.0, 0.0, "the held-out tool call, written exactly, a "
                                    "block at a time", ('"customer_id": "USR-38475", "city": "Naples"',)),
    # measured: 53 tokens in 27 forwards, 11 forced; the sixth call repeats the first refund
    "long tool chain": ExampleClaim("clover-tiny", _TINY, 1.8, 0.25, "where a 6 M model fails: deep in a chain "
                                    "its sixth call repeats an earlier one (wrong on purpose)",
                                    ('"name": "refund_order"',)),
    # smollm2-bd answers it right (measured: 13 tokens in 14 forwards, 10 forced, "A spider has 8 legs."); the
    # drafter's base, SmolLM2-135M itself, answers it wrong ("two pairs of legs")
    "question": ExampleClaim("smollm2-bd", dict(block_size=32, threshold=0.95, max_new_tokens=64), 0.9, 0.8,
                             "a plain question answered right by the adapter -- mostly forced fills: it is unsure",
                             ("8 legs",)),
    # smollm2-drafter, verify: the base's own greedy answer; measured 1.10 / 1.45 / 2.21 tokens per base forward
    "explanation": ExampleClaim("smollm2-drafter", _VERIFY, 1.05, None, "the base's own explanation, drafted ahead",
                                ("Rayleigh scattering",)),
    "instruction": ExampleClaim("smollm2-drafter", _VERIFY, 1.35, None, "the base's own poem, drafted ahead"),
    "code": ExampleClaim("smollm2-drafter", _VERIFY, 2.0, None, "code drafts well: the base accepts long runs",
                         ("def factorial(n):",)),
}
"""Example name -> `ExampleClaim` (every example of `EXAMPLE_PROMPTS` and `CHAT_EXAMPLE_PROMPTS` has one)."""


def example_note(name: str) -> str:
    """The picker's line for an example (`ExampleClaim.note`), or "" for a name with no claim."""
    claim = EXAMPLE_CLAIMS.get(name)
    return claim.note() if claim is not None else ""


def example_prompt(name: str) -> str:
    """The prompt text of the example called ``name`` (from `EXAMPLE_PROMPTS` or `CHAT_EXAMPLE_PROMPTS`).

    Raises:
        ValueError: ``name`` is no example's name (the message lists them).
    """
    if name in EXAMPLE_PROMPTS:
        return EXAMPLE_PROMPTS[name]
    if name in CHAT_EXAMPLE_PROMPTS:
        return CHAT_EXAMPLE_PROMPTS[name]
    raise ValueError(f"no example prompt called {name!r}; the examples are: "
                     f"{', '.join(repr(n) for n in example_names())}")


__all__ = ["CHAT_EXAMPLE_PROMPTS", "CHAT_QUESTIONS", "DEFAULT_CHAT_EXAMPLE", "DEFAULT_EXAMPLE", "EXAMPLE_CLAIMS",
           "EXAMPLE_PROMPTS", "ExampleClaim", "WEATHER_PROMPT", "example_names", "example_note", "example_prompt"]
