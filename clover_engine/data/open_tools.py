"""Open-vocabulary tool-call conversations: every tool is new, so the call must be read off
the system turn.

`clover_engine.data.agent` draws from 22 fixed tools; a model trained on it learns their names and
keys by heart and fails on any other schema. Here each conversation builds its tools from
word lists (verb x noun names, attribute-word keys, snake_case or camelCase, typed and
nested parameters, optional parameters), so the only way to write the right name and keys
is to copy them from the schema, and the only way to write the right values is to copy (or,
for dates and booleans, convert) them from the request or from an earlier tool response.

Two vocabularies, **disjoint** word for word (asserted at import): ``split="train"`` for
training, ``split="eval"`` for evaluation. No tool name, argument key, description word or
enum set of the eval split is ever seen in training. A share of training names and keys are
made-up words (`clover_engine.data.open_words.pseudo_word`, "quorbex_flindat"), which only the schema
can supply.

The layout is the chat layout of `clover_engine.data.agent` (system turn listing the tools' JSON
schemas, user request, ``<tool_call>{json}</tool_call>`` turns, ``<tool_response>`` turns),
so the same `clover_engine.data.agent.score_call` scores both. Requests are phrased in two styles:

* ``natural``: English clauses ("with 4 guests", "on December 14, 2026", "with express
  delivery turned on", "tagged red, blue and green");
* ``keyed``: ``key: value`` clauses, as `clover_engine.data.agent` writes them.

A share of turns needs no tool (the user asks what a listed tool does; the answer is its
description, exactly) -- scored by `score_turn`.

Values: strings, integers, floats, booleans, enums (listed in the schema), ISO dates,
arrays of strings, nested objects; optional parameters the request does not mention are
left out of the call. Every example is exactly checkable.

Seeds: `generate_conversation(random.Random(seed), split=...)` is a pure function of the
seed and the split.

Wing: ``ground``.
"""

from __future__ import annotations

import calendar
import datetime as _dt
import random
from dataclasses import dataclass
from typing import Any

from clover_engine.data.agent import (CITIES, FIRST_NAMES, IM_END, IM_START, LAST_NAMES, SYSTEM_HEADER, CallTurn,
                               Conversation, FieldInfo, dumps, parse_call, score_call)
from clover_engine.data import tool_words as _words
from clover_engine.data.open_words import is_near, load_words, pseudo_word

# ------------------------------------------------------------------ vocabularies (disjoint)
# The hand-written tables (clover_engine.data.tool_words), the training verbs and nouns extended below.
SPLITS = _words.SPLITS
ATTRS, ENUMS, MODIFIERS, WORDS = _words.ATTRS, _words.ENUMS, _words.MODIFIERS, _words.WORDS
eval_words = _words.eval_words

# The large training vocabulary: real API words harvested from the training packages' function
# names (clover_engine.data.open_words), so there are too many training names to learn by heart and the
# call has to copy the name from the schema. Eval split unchanged.
_HARVEST = load_words()
HARVESTED = {"verbs": tuple(_HARVEST["verbs"]), "nouns": tuple(_HARVEST["nouns"])}
VERBS = {**_words.VERBS, "train": _words.VERBS["train"] + [w for w in HARVESTED["verbs"]
                                                            if w not in _words.VERBS["train"]]}
NOUNS = {**_words.NOUNS, "train": _words.NOUNS["train"] + [w for w in HARVESTED["nouns"]
                                                            if w not in _words.NOUNS["train"]]}
OPEN_KEY_SHARE = 0.35  # training keys whose attribute is a harvested noun of a random type
OPEN_ENUM_SHARE = 0.5  # training enums drawn from the harvested nouns
OPEN_VALUE_SHARE = 0.5  # training word values drawn from the harvested nouns
PSEUDO_NAME_SHARE = 0.3  # training verbs and nouns (each) replaced by a made-up word (open_words.pseudo_word)
PSEUDO_KEY_SHARE = 0.15  # training key attributes that are made-up words of a random type
_OPEN_KEY_TYPES = ("code", "person", "city", "word", "date", "integer", "number", "boolean", "enum", "array")


def _check_disjoint() -> None:
    for name, table in (("VERBS", VERBS), ("NOUNS", NOUNS), ("ATTRS", ATTRS), ("MODIFIERS", MODIFIERS),
                        ("WORDS", WORDS)):
        both = set(table["train"]) & set(table["eval"])
        if both:
            raise AssertionError(f"{name}: train and eval share {sorted(both)}")
    words = {s: set(VERBS[s]) | set(NOUNS[s]) | set(ATTRS[s]) | set(MODIFIERS[s]) for s in SPLITS}
    if words["train"] & words["eval"]:
        raise AssertionError(f"name/key words shared by the splits: {sorted(words['train'] & words['eval'])}")
    enum_vals = {s: {v for e in ENUMS[s] for v in e} for s in SPLITS}
    if enum_vals["train"] & enum_vals["eval"]:
        raise AssertionError(f"enum values shared by the splits: {sorted(enum_vals['train'] & enum_vals['eval'])}")
    ev = eval_words()
    near = [w for w in HARVESTED["verbs"] + HARVESTED["nouns"] if is_near(w, ev)]
    if near:
        raise AssertionError(f"harvested training words near eval words: {near[:20]}; regenerate "
                             f"clover_engine/data/open_words.json with: python -m clover_engine.data.open_words")


_check_disjoint()
_EVAL_WORDS = frozenset(eval_words())


def _train_word(rng: random.Random, words) -> str:
    """A training name word: a made-up word (`PSEUDO_NAME_SHARE`) or one of `words`."""
    return pseudo_word(rng, _EVAL_WORDS) if rng.random() < PSEUDO_NAME_SHARE else rng.choice(words)


_MONTHS = list(calendar.month_name)[1:]
_ALNUM = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
NO_TOOL_SHARE = 0.1  # share of conversations whose (only) turn needs no tool
NATURAL_SHARE = 0.7  # share of conversations with natural-language requests
DISTINCT_TRIES = 100  # draws of a value that another argument of the call already holds, then keep it


# ------------------------------------------------------------------ tools
@dataclass(frozen=True)
class Param:
    """One parameter of an open-vocabulary tool.

    Attributes:
        key: JSON key as the schema spells it (snake_case or camelCase).
        words: the key's words, as a request says them ("max price").
        type: value type: code, person, city, word, email, date, integer, number, boolean,
            enum, array, object.
        enum: allowed values (type ``enum``), in schema order.
        fields: sub-parameters (type ``object``).
        required: False for an optional parameter (which a request may leave out).
    """

    key: str
    words: str
    type: str
    enum: tuple = ()
    fields: tuple = ()
    required: bool = True

    def schema(self) -> dict:
        """JSON-schema fragment of this parameter."""
        json_type = {"integer": "integer", "number": "number", "boolean": "boolean", "array": "array",
                     "object": "object"}.get(self.type, "string")
        out: dict[str, Any] = {"type": json_type}
        if self.type == "enum":
            out["enum"] = list(self.enum)
        elif self.type == "date":
            out["format"] = "date"
        elif self.type == "array":
            out["items"] = {"type": "string"}
        elif self.type == "object":
            out["properties"] = {f.key: f.schema() for f in self.fields}
        return out


@dataclass(frozen=True)
class OpenTool:
    """A tool made up for one conversation: name, description, parameters, response fields."""

    name: str
    verb: str
    noun: str
    description: str
    params: tuple[Param, ...]
    returns: tuple[Param, ...]

    def schema(self) -> dict:
        """The tool's JSON schema, as listed in the system turn."""
        return {"name": self.name, "description": self.description,
                "parameters": {"type": "object", "properties": {p.key: p.schema() for p in self.params},
                               "required": [p.key for p in self.params if p.required]}}


def _join(words: list[str], camel: bool) -> str:
    return words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:]) if camel else "_".join(words)


def _make_param(rng: random.Random, split: str, camel: bool, used: set[str], nested: bool = True) -> Param:
    attrs = ATTRS[split]
    for _ in range(50):
        r = rng.random() if split == "train" else 1.0
        if r < PSEUDO_KEY_SHARE:  # a made-up key word: copied from the schema or nowhere
            attr, typ = pseudo_word(rng, _EVAL_WORDS, (1, 2)), rng.choice(_OPEN_KEY_TYPES)
        elif r < PSEUDO_KEY_SHARE + OPEN_KEY_SHARE:  # a key word the model cannot know the type of
            attr, typ = rng.choice(HARVESTED["nouns"]), rng.choice(_OPEN_KEY_TYPES)
        else:
            attr = rng.choice(sorted(attrs))
            typ = attrs[attr]
        if typ == "object" and not nested:
            continue
        words = [attr]
        if typ not in ("boolean", "object", "array") and rng.random() < 0.35:
            words = [rng.choice(MODIFIERS[split]), attr]
        key = _join(words, camel)
        if key not in used:
            break
    used.add(key)
    enum: tuple = ()
    if typ == "enum":
        if split == "train" and rng.random() < OPEN_ENUM_SHARE:
            enum = tuple(rng.sample(HARVESTED["nouns"], rng.randint(2, 4)))
        else:
            enum = tuple(rng.choice(ENUMS[split]))
    fields: tuple = ()
    if typ == "object":
        sub_used: set[str] = set()
        fields = tuple(_make_param(rng, split, camel, sub_used, nested=False) for _ in range(2))
    return Param(key, " ".join(words), typ, enum, fields)


def make_tool(rng: random.Random, split: str, taken: set[tuple[str, str]]) -> OpenTool:
    """A new tool from `split`'s vocabulary whose (verb, noun) is not in `taken` (updated).

    Raises:
        ValueError: unknown split.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    while True:
        if split == "train":
            verb, noun = _train_word(rng, VERBS[split]), _train_word(rng, NOUNS[split])
        else:
            verb, noun = rng.choice(VERBS[split]), rng.choice(NOUNS[split])
        if (verb, noun) not in taken and verb not in {v for v, _ in taken} and noun not in {n for _, n in taken}:
            break
    taken.add((verb, noun))
    camel = rng.random() < 0.4
    name_words = [verb, noun] + ([rng.choice(MODIFIERS[split])] if rng.random() < 0.2 else [])
    used: set[str] = set()
    params = [_make_param(rng, split, camel, used) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.4:  # an optional parameter
        p = _make_param(rng, split, camel, used)
        params.insert(rng.randint(0, len(params)), Param(p.key, p.words, p.type, p.enum, p.fields, False))
    ret_used: set[str] = set()
    returns = tuple(_make_param(rng, split, camel, ret_used, nested=False) for _ in range(rng.randint(2, 3)))
    article = "an" if noun[0] in "aeio" else "a"  # "an order", "a user"
    description = f"{verb.capitalize()} {article} {noun}."
    return OpenTool(_join(name_words, camel), verb, noun, description, tuple(params), returns)


# ------------------------------------------------------------------ values and phrases
def _value(rng: random.Random, p: Param, split: str) -> Any:
    t = p.type
    if t == "code":
        return "".join(rng.choice(_ALNUM) for _ in range(3)) + "-" + str(rng.randint(100, 9999))
    if t == "person":
        return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
    if t == "city":
        return rng.choice(CITIES)
    if t == "word":
        if split == "train" and rng.random() < OPEN_VALUE_SHARE:
            return rng.choice(HARVESTED["nouns"])
        return rng.choice(WORDS[split])
    if t == "email":
        return f"{rng.choice(FIRST_NAMES).lower()}{rng.randint(1, 99)}@example.com"
    if t == "date":
        lo, hi = _dt.date(2024, 1, 1).toordinal(), _dt.date(2030, 12, 31).toordinal()
        return _dt.date.fromordinal(rng.randint(lo, hi)).isoformat()
    if t == "integer":
        return rng.choice([rng.randint(1, 12), rng.randint(1, 500), rng.randint(1000, 99999)])
    if t == "number":
        return round(rng.uniform(0.5, 999.0), rng.choice([1, 2]))
    if t == "boolean":
        return rng.random() < 0.5
    if t == "enum":
        return rng.choice(p.enum)
    if t == "array":
        pool = HARVESTED["nouns"] if split == "train" and rng.random() < OPEN_VALUE_SHARE else WORDS[split]
        return rng.sample(pool, rng.randint(2, 3))
    if t == "object":
        return {f.key: _value(rng, f, split) for f in p.fields}
    raise ValueError(f"unknown parameter type {t!r}")


def _natural_date(iso: str, rng: random.Random) -> str:
    d = _dt.date.fromisoformat(iso)
    month = _MONTHS[d.month - 1]
    return rng.choice([f"{month} {d.day}, {d.year}", f"{d.day} {month} {d.year}", iso])


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _phrase(rng: random.Random, p: Param, value: Any, natural: bool) -> str:
    """How a request states `value` for parameter `p`. Keyed phrases write the value in its
    JSON form; natural ones in words (the call still holds the JSON value)."""
    if not natural:
        return f"{p.key}: {dumps(value)}"
    w, t = p.words, p.type
    if t == "boolean":
        on, off = rng.choice([("turned on", "turned off"), ("enabled", "disabled"), ("set to yes", "set to no")])
        return f"with {w} {on if value else off}"
    if t == "date":
        return rng.choice([f"with {w} on {_natural_date(value, rng)}", f"{w} {_natural_date(value, rng)}"])
    if t == "integer":
        return rng.choice([f"with {value} {w}" if w.endswith("s") else f"with {w} {value}",
                           f"{w} of {value}", f"{w} set to {value}"])
    if t == "number":
        return rng.choice([f"{w} of {value}", f"a {w} of {value}", f"{w} {value}"])
    if t == "array":
        return f"{w} {_and(list(value))}"
    if t == "object":
        inner = [_phrase(rng, f, value[f.key], True).removeprefix("with ") for f in p.fields]
        return f"{w} with {_and(inner)}"
    return rng.choice([f"{w} {value}", f"for {w} {value}", f"with {w} {value}", f"the {w} is {value}"])


_OPENERS = ("", "Hi! ", "Hello, ", "Quick one: ", "Hey, ", "Good morning. ")
_ASKS = ("Please {verb} the {noun}", "Can you {verb} a {noun}", "I need you to {verb} the {noun}",
         "Could you {verb} my {noun}", "{Verb} the {noun}")


def _turn(role: str, content: str) -> str:
    return f"{IM_START}{role}\n{content}{IM_END}\n"


@dataclass
class OpenTurn(CallTurn):
    """A completion task of this corpus: a `CallTurn` whose ``name`` is None when the turn
    needs no tool (``target`` is then the plain answer followed by ``<|im_end|>``).

    Attributes:
        category: ``call`` (one tool call), ``chain`` (a later call that copies a value from
            an earlier tool response) or ``no_tool``.
        natural: the request is phrased in English clauses rather than ``key: value``.
    """

    category: str = "call"
    natural: bool = False


def generate_conversation(rng: random.Random, split: str = "train", n_rounds: int | None = None,
                          natural: bool | None = None, no_tool: bool | None = None,
                          n_tools: int | None = None) -> tuple[Conversation, list[OpenTurn]]:
    """One conversation of the open-vocabulary corpus.

    Args:
        rng: the only source of randomness.
        split: ``train`` or ``eval`` (disjoint vocabularies).
        n_rounds: tool calls (1..4); None draws 1 (60 %), 2 (30 %) or 3 (10 %).
        natural: English-clause request (None: with probability `NATURAL_SHARE`).
        no_tool: the user asks what a tool does instead (None: with probability `NO_TOOL_SHARE`).
        n_tools: tools listed, 1..5 (None: 2..5, at least n_rounds); with fewer tools than
            rounds a tool is called more than once.

    Returns:
        (conversation, turns): the full text (for training) and one `OpenTurn` per assistant turn.

    Raises:
        ValueError: unknown split, n_rounds outside 1..4 or n_tools outside 1..5.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if n_rounds is None:
        n_rounds = rng.choices([1, 2, 3], weights=[60, 30, 10])[0]
    if not isinstance(n_rounds, int) or not 1 <= n_rounds <= 4:
        raise ValueError(f"n_rounds must be an int in 1..4, got {n_rounds!r}")
    natural = rng.random() < NATURAL_SHARE if natural is None else natural
    no_tool = rng.random() < NO_TOOL_SHARE if no_tool is None else no_tool
    taken: set[tuple[str, str]] = set()
    if n_tools is not None and (not isinstance(n_tools, int) or not 1 <= n_tools <= 5):
        raise ValueError(f"n_tools must be an int in 1..5, got {n_tools!r}")
    n_tools = rng.randint(max(2, n_rounds), 5) if n_tools is None else n_tools
    tools = [make_tool(rng, split, taken) for _ in range(n_tools)]
    system = _turn("system", SYSTEM_HEADER + "\n" + "\n".join(dumps(t.schema()) for t in tools))

    if no_tool:
        tool = rng.choice(tools)
        ask = rng.choice(["What does the {n} tool do?", "What is {n} for?", "Explain the {n} tool in one line."])
        opener = rng.choice([o for o in _OPENERS if not o.endswith((", ", ": "))])
        prompt = system + _turn("user", opener + ask.format(n=tool.name)) + f"{IM_START}assistant\n"
        target = tool.description + IM_END
        turn = OpenTurn(prompt, target, None, {}, [], 0, "no_tool", natural)
        return Conversation(prompt + target, []), [turn]

    plans = []  # (tool, args, infos, clause, response)
    latest: tuple[OpenTool, dict] | None = None
    for r in range(n_rounds):
        tool = rng.choice([t for t in tools if t not in [p[0] for p in plans]] or tools)
        args: dict[str, Any] = {}
        infos: list[FieldInfo] = []
        phrases: list[str] = []
        for p in tool.params:
            if not p.required and rng.random() < 0.5:
                continue  # optional and not asked for: absent from the call
            from_resp = None
            if latest is not None and p.type not in ("object", "boolean", "array"):
                same = [q for q in latest[0].returns if q.type == p.type and q.enum == p.enum]
                if same and rng.random() < 0.7:
                    from_resp = rng.choice(same)
            if from_resp is not None:
                value = latest[1][from_resp.key]
                phrases.append(f"{p.words if natural else p.key} set to the {from_resp.words} from that result")
                source = "tool_response"
            else:
                value = _value(rng, p, split)
                for _ in range(DISTINCT_TRIES):  # distinct values, where the type has room (not two booleans)
                    if not any(value == v for v in args.values()):
                        break
                    value = _value(rng, p, split)
                phrases.append(_phrase(rng, p, value, natural))
                source = "request"
            args[p.key] = value
            infos.append(FieldInfo(p.key, value, p.type, source, False))
        response = {q.key: _value(rng, q, split) for q in tool.returns}
        ask = rng.choice(_ASKS).format(verb=tool.verb, Verb=tool.verb.capitalize(), noun=tool.noun)
        if r > 0:
            ask = "then " + ask[0].lower() + ask[1:]
        clause = ask + (" " + _and(phrases) if natural else f" ({', '.join(phrases)})") if phrases else ask
        plans.append((tool, args, infos, clause, response))
        latest = (tool, response)

    body = ", ".join(c for *_, c, _ in plans)
    opener = rng.choice(_OPENERS)
    if opener.endswith((", ", ": ")):
        body = body[0].lower() + body[1:]
    request = opener + body + ("?" if plans[0][3].startswith(("Can", "Could")) else ".")
    text = system + _turn("user", request)
    turns: list[OpenTurn] = []
    for i, (tool, args, infos, _, response) in enumerate(plans):
        prompt = text + f"{IM_START}assistant\n"
        target = f"<tool_call>{dumps({'name': tool.name, 'arguments': args})}</tool_call>{IM_END}"
        category = "chain" if any(f.source == "tool_response" for f in infos) else "call"
        turns.append(OpenTurn(prompt, target, tool.name, dict(args), infos, i, category, natural))
        text = prompt + target + "\n" + _turn("user", f"<tool_response>{dumps(response)}</tool_response>")
    key = rng.choice(list(plans[-1][4]))
    text += f"{IM_START}assistant\nDone. The {key} is {dumps(plans[-1][4][key])}.{IM_END}"
    return Conversation(text, list(turns)), turns


def eval_turns(n: int = 200, seed: int = 0) -> list[OpenTurn]:
    """Held-out tasks from the eval vocabulary: one turn per conversation ``seed + i``.

    The mix is fixed by i: i % 10 == 9 asks for no tool; otherwise even i natural and odd i
    keyed requests; every third conversation has two rounds and contributes its second
    call (a chain, when a value could be taken from the first response).
    """
    return _mixed_turns(n, seed, "eval", "open-eval")


def train_turns(n: int, seed: int = 0) -> list[OpenTurn]:
    """Tasks from the training vocabulary, mixed as `eval_turns` (one turn per conversation
    ``open-train-turn-{seed + i}``): prompts for distilling a base's own answers to tool-call chats
    (a drafter's training data); no tool name or key of `eval_turns` occurs in them.

    Raises:
        ValueError: ``n < 0``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return _mixed_turns(n, seed, "train", "open-train-turn")


def _mixed_turns(n: int, seed: int, split: str, rng_prefix: str) -> list[OpenTurn]:
    """The last turn of conversations ``{rng_prefix}-{seed + i}`` of ``split``, in `eval_turns`' mix."""
    return [generate_conversation(random.Random(f"{rng_prefix}-{seed + i}"), split, n_rounds=2 if i % 3 == 2 else 1,
                                  natural=(i % 2 == 0), no_tool=i % 10 == 9)[1][-1] for i in range(n)]


def iter_train_texts(seed: int = 0):
    """Endless training conversations (full text, train vocabulary), seeded ``train-{seed + i}``."""
    i = 0
    while True:
        conv, _ = generate_conversation(random.Random(f"open-train-{seed + i}"), "train")
        yield conv.text
        i += 1


def score_turn(generated_text: str, turn: OpenTurn) -> dict:
    """`clover_engine.data.agent.score_call` for call turns; for a no-tool turn: ``exact_match`` when
    the text equals the answer (with or without ``<|im_end|>``), ``name_correct`` when no tool
    call was written."""
    if turn.name is not None:
        return score_call(generated_text, turn)
    answer = turn.target[: -len(IM_END)]
    called = parse_call(generated_text) is not None or "<tool_call>" in generated_text
    exact = generated_text.strip() in (answer, turn.target)
    return {"exact_match": exact, "text_exact": exact, "json_valid": not called, "name_correct": not called,
            "fields": []}
