"""Synthetic tool-using conversations with checkable answers (Qwen chat layout).

A conversation::

    <|im_start|>system
    You are a helpful assistant with tools:
    {"name": "get_order", "description": "...", "parameters": {...}}
    ...<|im_end|>
    <|im_start|>user
    Please look up an order (order_id: "ORD-48213"), then ...<|im_end|>
    <|im_start|>assistant
    <tool_call>{"name": "get_order", "arguments": {"order_id": "ORD-48213"}}</tool_call><|im_end|>
    <|im_start|>user
    <tool_response>{"order_id": "ORD-48213", "customer": "Maria Lopez", ...}</tool_response><|im_end|>
    <|im_start|>assistant
    <tool_call>...</tool_call><|im_end|>
    ... (n_rounds calls) ...
    <|im_start|>assistant
    Done. The ship_date is 2024-03-19.<|im_end|>

Rules that make every call an exact copy task:

- The user request names the calls in order, one clause per call. Each argument is either
  written out in the clause, in its JSON form (``order_id: "ORD-48213"``, ``amount: 348``) so
  that it tokenizes exactly as in the call (``source="request"``), or referred to as "the <key> from the
  latest <tool> result" (``source="tool_response"``): the value is then that field of the most
  recent response of that tool. No argument value is ever invented.
- ``confirm_*`` arguments (always the *last* JSON field) repeat an earlier argument of the
  same call; the request does not mention them, the schema's description does.
- Values come from large random spaces (5-digit ids, dates 2015..2030, amounts up to 99999,
  2500 first+last names, random emails, phones), so they cannot be memorised.

Seeds: conversation ``i`` of `iter_conversations(seed, ...)` is
``generate_conversation(random.Random(seed + i))``. Training uses seeds < `EVAL_SEED_START`;
`eval_tasks` uses seeds >= it. A range that crosses the boundary is refused.

JSON everywhere is ``json.dumps(obj, separators=(", ", ": "), ensure_ascii=False)``.

Wing: ``ground``.
"""

from __future__ import annotations

import datetime as _dt
import json
import random
import re
import string
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

EVAL_SEED_START = 10_000_000
"""Conversation seeds >= this are held out for evaluation; training uses seeds below it."""

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SYSTEM_HEADER = "You are a helpful assistant with tools:"

FIELD_KINDS = ("string", "number", "date", "id", "name")


def dumps(obj: Any) -> str:
    """The one JSON style of the corpus: ``{"a": 1, "b": "x"}``."""
    return json.dumps(obj, separators=(", ", ": "), ensure_ascii=False)


# ----------------------------------------------------------------------------- data classes


@dataclass(frozen=True)
class FieldInfo:
    """One argument of a ground-truth call.

    Attributes:
        key: JSON key.
        value: the exact value (str or int).
        kind: "string" | "number" | "date" | "id" | "name".
        source: "request" (written in the user request) or "tool_response" (a field of an
            earlier tool response). A repeat field has the source of the field it repeats.
        is_repeat_of_earlier_field: True for ``confirm_*`` fields that repeat an earlier
            argument of the same call.
    """

    key: str
    value: Any
    kind: str
    source: str
    is_repeat_of_earlier_field: bool = False


@dataclass
class CallTurn:
    """One assistant tool-call turn, as a completion task.

    Attributes:
        prompt: conversation text up to and including ``<|im_start|>assistant\\n``.
        target: the exact completion: ``<tool_call>{json}</tool_call><|im_end|>``.
        name: tool name.
        arguments: ground-truth arguments (JSON key order is the target's).
        fields: one `FieldInfo` per argument, in order.
        index: 0-based index of this call in its conversation.
    """

    prompt: str
    target: str
    name: str
    arguments: dict
    fields: list[FieldInfo]
    index: int = 0


@dataclass
class Conversation:
    """A full conversation (`text` ends with ``<|im_end|>``) and its ground-truth calls."""

    text: str
    calls: list[CallTurn] = field(default_factory=list)


# ----------------------------------------------------------------------------- value pools

FIRST_NAMES = (
    "Maria Lucas Aisha Kenji Olga Pedro Fatima Liam Chloe Mateo Ingrid Ravi Sofia Tomas Amara Yusuf "
    "Elena Noah Priya Diego Hana Omar Greta Felix Leila Marco Nadia Jonas Mei Ahmed Clara Ivan Zara "
    "Pablo Anika Hugo Lena Samir Rosa Victor Daria Emil Naomi Kofi Ines Arjun Freya Tariq Julia Boris"
).split()
LAST_NAMES = (
    "Lopez Schmidt Okafor Tanaka Ivanova Silva Haddad Murphy Dubois Garcia Larsen Patel Rossi Novak "
    "Mensah Demir Petrova Kim Sharma Torres Sato Khan Berg Weber Nasser Bianchi Kowalski Fischer Chen "
    "Hassan Moreau Popov Ali Ortiz Jensen Meyer Kaur Romero Costa Wagner Nowak Lindqvist Adeyemi Park "
    "Yilmaz Horvat Moretti Nguyen Eriksen Alvarez"
).split()
CITIES = (
    "Lisbon Madrid Berlin Oslo Cairo Lagos Nairobi Mumbai Delhi Tokyo Osaka Seoul Manila Jakarta Sydney "
    "Auckland Lima Bogota Quito Santiago Toronto Denver Boston Austin Chicago Seattle Dublin Leeds Paris "
    "Lyon Milan Naples Vienna Prague Warsaw Krakow Athens Istanbul Ankara Dubai Doha Riyadh Karachi Dhaka "
    "Hanoi Bangkok Taipei Beijing Shanghai Perth Havana Dakar Accra Tunis Rabat Porto Seville Zurich "
    "Geneva Munich Hamburg Helsinki Riga Tallinn Vilnius Sofia Bucharest Belgrade Zagreb Kyiv Minsk"
).split()
DOMAINS = ("example.com", "mail.net", "corp.org", "inbox.io", "post.dev", "web.co")
AIRLINES = ("LH", "BA", "AF", "KL", "IB", "TP", "AZ", "OS", "SK", "AY", "UA", "DL", "AA", "QR", "EK", "NH")
CURRENCIES = ("EUR", "USD", "GBP", "JPY", "CHF", "SEK", "NOK", "PLN", "INR", "BRL", "CAD", "AUD")
ORDER_STATUS = ("pending", "shipped", "delivered", "returned", "cancelled")
FLIGHT_STATUS = ("on_time", "delayed", "boarding", "departed", "cancelled")
CONDITIONS = ("sunny", "cloudy", "rain", "snow", "fog", "windy", "storm")
PRIORITIES = ("low", "normal", "high", "urgent")
_ALNUM = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"


def _date(rng: random.Random) -> str:
    lo, hi = _dt.date(2015, 1, 1).toordinal(), _dt.date(2030, 12, 31).toordinal()
    return _dt.date.fromordinal(rng.randint(lo, hi)).isoformat()


def _prefixed(prefix: str, lo: int, hi: int) -> Callable[[random.Random], str]:
    return lambda rng: f"{prefix}{rng.randint(lo, hi)}"


def _email(rng: random.Random) -> str:
    return (f"{rng.choice(FIRST_NAMES).lower()}.{rng.choice(LAST_NAMES).lower()}"
            f"{rng.randint(1, 99)}@{rng.choice(DOMAINS)}")


# slot -> (kind, generator). A slot is a semantic type: an argument of slot S can only be
# filled with a value of slot S (from the request or from a response field of slot S).
SLOTS: dict[str, tuple[str, Callable[[random.Random], Any]]] = {
    "order_id": ("id", _prefixed("ORD-", 10000, 99999)),
    "customer_id": ("id", _prefixed("USR-", 10000, 99999)),
    "account_id": ("id", _prefixed("AC-", 1000, 9999)),
    "ticket_id": ("id", _prefixed("TCK-", 100000, 999999)),
    "invoice_id": ("id", _prefixed("INV-", 100000, 999999)),
    "tracking_id": ("id", _prefixed("TRK-", 10000000, 99999999)),
    "booking_id": ("id", lambda rng: "".join(rng.choice(_ALNUM) for _ in range(6))),
    "flight": ("id", lambda rng: f"{rng.choice(AIRLINES)}{rng.randint(100, 9999)}"),
    "sku": ("id", lambda rng: f"SKU-{rng.randint(1000, 9999)}{rng.choice(string.ascii_uppercase)}"),
    "room": ("id", _prefixed("R-", 100, 999)),
    "message_id": ("id", _prefixed("MSG-", 100000, 999999)),
    "transfer_id": ("id", _prefixed("TRX-", 100000, 999999)),
    "note_id": ("id", _prefixed("NOTE-", 10000, 99999)),
    "meeting_id": ("id", _prefixed("MTG-", 10000, 99999)),
    "reservation_id": ("id", _prefixed("RSV-", 10000, 99999)),
    "date": ("date", _date),
    "person": ("name", lambda rng: f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"),
    "email": ("string", _email),
    "phone": ("string", lambda rng: f"+1-{rng.randint(200, 999)}-{rng.randint(200, 999)}-{rng.randint(1000, 9999)}"),
    "city": ("string", lambda rng: rng.choice(CITIES)),
    "time": ("string", lambda rng: f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"),
    "gate": ("string", lambda rng: f"{rng.choice('ABCDEF')}{rng.randint(1, 60)}"),
    "currency": ("string", lambda rng: rng.choice(CURRENCIES)),
    "order_status": ("string", lambda rng: rng.choice(ORDER_STATUS)),
    "flight_status": ("string", lambda rng: rng.choice(FLIGHT_STATUS)),
    "condition": ("string", lambda rng: rng.choice(CONDITIONS)),
    "priority": ("string", lambda rng: rng.choice(PRIORITIES)),
    "ok": ("string", lambda rng: "ok"),
    "amount": ("number", lambda rng: rng.randint(1, 99999)),
    "quantity": ("number", lambda rng: rng.randint(1, 500)),
    "guests": ("number", lambda rng: rng.randint(1, 12)),
    "table": ("number", lambda rng: rng.randint(1, 60)),
    "temp": ("number", lambda rng: rng.randint(-25, 45)),
}


# ----------------------------------------------------------------------------- tools


@dataclass(frozen=True)
class Tool:
    """A tool template.

    args: (key, slot) in JSON order; a slot ``"=other"`` repeats argument ``other`` (must be last).
    returns: (key, slot) of the response; ``"=arg"`` echoes that argument.
    ask: the verb phrase of the request clause ("look up an order").
    """

    name: str
    description: str
    args: tuple[tuple[str, str], ...]
    returns: tuple[tuple[str, str], ...]
    ask: str

    def schema(self) -> dict:
        props, required = {}, []
        for key, slot in self.args:
            if slot.startswith("="):
                props[key] = {"type": "string", "description": f"repeat {slot[1:]}"}
            else:
                props[key] = {"type": "integer" if SLOTS[slot][0] == "number" else "string"}
            required.append(key)
        return {"name": self.name, "description": self.description,
                "parameters": {"type": "object", "properties": props, "required": required}}


def _t(name, description, args, returns, ask) -> Tool:
    return Tool(name, description, tuple(args), tuple(returns), ask)


TOOLS: tuple[Tool, ...] = (
    _t("get_order", "Look up an order.", [("order_id", "order_id")],
       [("order_id", "=order_id"), ("customer", "person"), ("ship_date", "date"), ("total", "amount"),
        ("status", "order_status")], "look up an order"),
    _t("find_customer", "Find a customer by name.", [("name", "person")],
       [("customer_id", "customer_id"), ("name", "=name"), ("email", "email"), ("city", "city")],
       "find a customer"),
    _t("get_customer", "Get a customer's contact details.", [("customer_id", "customer_id")],
       [("customer_id", "=customer_id"), ("name", "person"), ("email", "email"), ("phone", "phone")],
       "get a customer's details"),
    _t("send_email", "Send an email.", [("to", "email"), ("recipient_name", "person")],
       [("status", "ok"), ("message_id", "message_id")], "send an email"),
    _t("get_weather", "Weather forecast for a city and date.", [("city", "city"), ("date", "date")],
       [("city", "=city"), ("date", "=date"), ("temp_c", "temp"), ("condition", "condition")],
       "check the weather"),
    _t("book_flight", "Book a flight.",
       [("origin", "city"), ("destination", "city"), ("date", "date"), ("passenger", "person")],
       [("booking_id", "booking_id"), ("flight", "flight"), ("price", "amount"), ("date", "=date")],
       "book a flight"),
    _t("get_flight_status", "Status of a flight on a date.", [("flight", "flight"), ("date", "date")],
       [("flight", "=flight"), ("status", "flight_status"), ("gate", "gate"), ("departure", "time")],
       "check a flight's status"),
    _t("cancel_booking", "Cancel a booking; confirm_booking_id must repeat booking_id.",
       [("booking_id", "booking_id"), ("passenger", "person"), ("confirm_booking_id", "=booking_id")],
       [("status", "ok"), ("refund", "amount")], "cancel a booking"),
    _t("get_account", "Get a customer's bank account.", [("customer_id", "customer_id")],
       [("account_id", "account_id"), ("balance", "amount"), ("currency", "currency")], "get an account"),
    _t("transfer_funds", "Transfer money; confirm_account must repeat from_account.",
       [("from_account", "account_id"), ("to_account", "account_id"), ("amount", "amount"),
        ("confirm_account", "=from_account")],
       [("status", "ok"), ("transfer_id", "transfer_id"), ("date", "date")], "transfer money"),
    _t("create_ticket", "Open a support ticket for an order.",
       [("customer_id", "customer_id"), ("order_id", "order_id")],
       [("ticket_id", "ticket_id"), ("created", "date"), ("priority", "priority")], "open a support ticket"),
    _t("add_ticket_note", "Add a note to a ticket.", [("ticket_id", "ticket_id"), ("author", "person")],
       [("ticket_id", "=ticket_id"), ("note_id", "note_id")], "add a note to a ticket"),
    _t("refund_order", "Refund an order; confirm_order_id must repeat order_id.",
       [("order_id", "order_id"), ("amount", "amount"), ("confirm_order_id", "=order_id")],
       [("status", "ok"), ("refund_date", "date")], "refund an order"),
    _t("check_stock", "Stock of a product in a city.", [("sku", "sku"), ("city", "city")],
       [("sku", "=sku"), ("quantity", "quantity"), ("warehouse", "city")], "check stock"),
    _t("place_order", "Place an order for a customer.",
       [("sku", "sku"), ("quantity", "quantity"), ("customer_id", "customer_id")],
       [("order_id", "order_id"), ("total", "amount"), ("ship_date", "date")], "place an order"),
    _t("track_package", "Track a package.", [("tracking_id", "tracking_id")],
       [("tracking_id", "=tracking_id"), ("city", "city"), ("eta", "date")], "track a package"),
    _t("schedule_meeting", "Schedule a meeting.", [("attendee", "email"), ("date", "date"), ("time", "time")],
       [("meeting_id", "meeting_id"), ("room", "room")], "schedule a meeting"),
    _t("get_invoice", "Look up an invoice.", [("invoice_id", "invoice_id")],
       [("invoice_id", "=invoice_id"), ("customer_id", "customer_id"), ("amount", "amount"),
        ("due_date", "date")], "look up an invoice"),
    _t("pay_invoice", "Pay an invoice; confirm_invoice_id must repeat invoice_id.",
       [("invoice_id", "invoice_id"), ("account_id", "account_id"), ("amount", "amount"),
        ("confirm_invoice_id", "=invoice_id")],
       [("status", "ok"), ("paid_on", "date")], "pay an invoice"),
    _t("update_address", "Move a customer to a city; confirm_customer_id must repeat customer_id.",
       [("customer_id", "customer_id"), ("city", "city"), ("confirm_customer_id", "=customer_id")],
       [("status", "ok"), ("customer_id", "=customer_id")], "update an address"),
    _t("reserve_table", "Reserve a restaurant table.",
       [("city", "city"), ("date", "date"), ("time", "time"), ("guests", "guests"), ("name", "person")],
       [("reservation_id", "reservation_id"), ("table", "table")], "reserve a table"),
    _t("convert_currency", "Convert an amount between currencies.",
       [("amount", "amount"), ("from_currency", "currency"), ("to_currency", "currency")],
       [("converted", "amount"), ("currency", "=to_currency")], "convert money"),
)
TOOLS_BY_NAME = {t.name: t for t in TOOLS}
assert all(not s.startswith("=") or i == len(t.args) - 1 for t in TOOLS for i, (_, s) in enumerate(t.args)), \
    "a repeat field must be the last argument"

_OPENERS = ("", "Hi! ", "Hello, ", "Hey. ", "Good morning. ", "I need some help. ")
REQUEST_SEPARATORS = (" ", ": ", "=")  # between a key and its value in a request: `key: "v"`
_ANSWERS = ("Done. The {k} is {v}.", "All set: {k} {v}.", "Finished, {k}: {v}.", "Here you go: {k} is {v}.")
_RESPONSE_P = 0.8  # chance an argument is taken from an earlier response when one fits
_CHAIN_P = 0.75  # chance to pick a tool (for the toolset, for a call) that can consume a returned value


# ----------------------------------------------------------------------------- generator


def _default_rounds(rng: random.Random, max_rounds: int) -> int:
    """Mostly 1-4 rounds: weights 30/30/20/10 %, the remaining 10 % spread over 5..max_rounds."""
    weights = [30.0, 30.0, 20.0, 10.0][:max_rounds]
    if max_rounds > 4:
        weights += [10.0 / (max_rounds - 4)] * (max_rounds - 4)
    return rng.choices(range(1, max_rounds + 1), weights=weights)[0]


def _turn(role: str, content: str) -> str:
    return f"{IM_START}{role}\n{content}{IM_END}\n"


def generate_conversation(rng: random.Random, n_rounds: int | None = None, max_rounds: int = 8,
                          n_tools: int | None = None) -> Conversation:
    """One conversation with `n_rounds` tool calls (1..50); None draws from the default mix.

    Args:
        rng: the only source of randomness (same state -> same bytes).
        n_rounds: number of tool calls, 1..50; None draws 1..`max_rounds`, mostly 1-4.
        max_rounds: upper bound of the default draw.
        n_tools: tools listed in the system turn (1..len(TOOLS)); None draws 3..5. Fewer tools
            and rounds make the short conversations of the training curriculum.

    Returns:
        `Conversation` with text and one `CallTurn` per call.
    """
    if n_rounds is None:
        n_rounds = _default_rounds(rng, max_rounds)
    if not isinstance(n_rounds, int) or not 1 <= n_rounds <= 50:
        raise ValueError(f"n_rounds must be an int in 1..50, got {n_rounds!r}")
    if n_tools is not None and not (isinstance(n_tools, int) and 1 <= n_tools <= len(TOOLS)):
        raise ValueError(f"n_tools must be an int in 1..{len(TOOLS)}, got {n_tools!r}")
    toolset = _pick_toolset(rng, rng.randint(3, 5) if n_tools is None else n_tools)
    sep = rng.choice(REQUEST_SEPARATORS)

    # Plan the calls first (the request refers to them), then write the text.
    latest: dict[str, dict] = {}  # tool name -> its latest response
    plans: list[tuple[Tool, dict, list[FieldInfo], list[str], dict]] = []
    for _ in range(n_rounds):
        available = {slot for name, resp in latest.items() for _, slot in _response_slots(TOOLS_BY_NAME[name], resp)}
        chaining = [t for t in toolset if _arg_slots(t) & available]
        tool = rng.choice(chaining if chaining and rng.random() < _CHAIN_P else toolset)
        args: dict[str, Any] = {}
        infos: list[FieldInfo] = []
        phrases: list[str] = []
        for key, slot in tool.args:
            if slot.startswith("="):
                ref = next(f for f in infos if f.key == slot[1:])
                args[key] = ref.value
                infos.append(FieldInfo(key, ref.value, ref.kind, ref.source, True))
                continue
            kind = SLOTS[slot][0]
            cands = [(name, rkey, resp[rkey]) for name, resp in latest.items()
                     for rkey, rslot in _response_slots(TOOLS_BY_NAME[name], resp)
                     if rslot == slot and resp[rkey] not in args.values()]
            if cands and rng.random() < _RESPONSE_P:
                name, rkey, value = rng.choice(cands)
                phrases.append(f"{key}{sep}the {rkey} from the latest {name} result")
                source = "tool_response"
            else:
                value = SLOTS[slot][1](rng)
                while value in args.values():  # distinct values within one call
                    value = SLOTS[slot][1](rng)
                # Written as in JSON (strings quoted) so its tokens match the call's tokens.
                phrases.append(f"{key}{sep}{dumps(value)}")
                source = "request"
            args[key] = value
            infos.append(FieldInfo(key, value, kind, source, False))
        response = {rkey: (args[rslot[1:]] if rslot.startswith("=") else SLOTS[rslot][1](rng))
                    for rkey, rslot in tool.returns}
        latest.pop(tool.name, None)
        latest[tool.name] = response  # dict order = recency
        plans.append((tool, args, infos, phrases, response))

    clauses = [f"{tool.ask} ({', '.join(phrases)})" for tool, _, _, phrases, _ in plans]
    if len(clauses) == 1:
        body = clauses[0]
    else:
        body = ", then ".join(clauses[:-1]) + ", and finally " + clauses[-1]
    request = f"{rng.choice(_OPENERS)}Please {body}."

    system = SYSTEM_HEADER + "\n" + "\n".join(dumps(t.schema()) for t in toolset)
    text = _turn("system", system) + _turn("user", request)
    calls: list[CallTurn] = []
    for i, (tool, args, infos, _, response) in enumerate(plans):
        prompt = text + f"{IM_START}assistant\n"
        target = f"<tool_call>{dumps({'name': tool.name, 'arguments': args})}</tool_call>{IM_END}"
        calls.append(CallTurn(prompt, target, tool.name, dict(args), infos, i))
        text = prompt + target + "\n" + _turn("user", f"<tool_response>{dumps(response)}</tool_response>")
    last_tool, last_resp = plans[-1][0], plans[-1][4]
    fresh = [k for k, s in last_tool.returns if not s.startswith("=")] or list(last_resp)
    k = rng.choice(fresh)
    answer = rng.choice(_ANSWERS).format(k=k, v=last_resp[k])
    text += f"{IM_START}assistant\n{answer}{IM_END}"
    return Conversation(text, calls)


def _arg_slots(tool: Tool) -> set[str]:
    return {s for _, s in tool.args if not s.startswith("=")}


def _return_slots(tool: Tool) -> set[str]:
    arg_slot = dict(tool.args)
    return {arg_slot[s[1:]] if s.startswith("=") else s for _, s in tool.returns}


def _pick_toolset(rng: random.Random, k: int) -> list[Tool]:
    """k distinct tools; each after the first, with chance `_CHAIN_P`, one that can consume a
    value returned by a tool already picked (so later calls copy from tool responses)."""
    picked = [rng.choice(TOOLS)]
    while len(picked) < k:
        rest = [t for t in TOOLS if t not in picked]
        returned = set().union(*(_return_slots(t) for t in picked))
        chaining = [t for t in rest if _arg_slots(t) & returned]
        picked.append(rng.choice(chaining if chaining and rng.random() < _CHAIN_P else rest))
    rng.shuffle(picked)
    return picked


def _response_slots(tool: Tool, response: dict) -> list[tuple[str, str]]:
    """(key, slot) of a response, with echoes resolved to the echoed argument's slot."""
    arg_slot = dict(tool.args)
    return [(k, arg_slot[s[1:]] if s.startswith("=") else s) for k, s in tool.returns if k in response]


def iter_conversations(seed: int, n: int | None = None, max_rounds: int = 8) -> Iterator[Conversation]:
    """Conversations ``generate_conversation(random.Random(seed + i), max_rounds=...)``, i = 0.. n-1.

    Args:
        seed: first conversation seed. All seeds of the range must lie on one side of
            `EVAL_SEED_START` (training below it, evaluation at or above).
        n: number of conversations; None = until the side's boundary.
        max_rounds: upper bound of the default rounds draw (1..50).

    Raises:
        ValueError: if the seed range crosses `EVAL_SEED_START` or `max_rounds` is out of 1..50.
    """
    if not 1 <= max_rounds <= 50:
        raise ValueError(f"max_rounds must be in 1..50, got {max_rounds}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    stop = (EVAL_SEED_START if seed < EVAL_SEED_START else None)
    if n is not None:
        end = seed + n
        if stop is not None and end > stop:
            raise ValueError(f"training seeds {seed}..{end - 1} cross EVAL_SEED_START={EVAL_SEED_START}; "
                             f"use n <= {stop - seed}")
        stop = end
    i = seed
    while stop is None or i < stop:
        yield generate_conversation(random.Random(i), max_rounds=max_rounds)
        i += 1


def eval_tasks(seed: int = EVAL_SEED_START, n: int = 300, max_rounds: int = 8) -> list[CallTurn]:
    """Held-out call turns: one per conversation seed ``seed + i`` (must be >= `EVAL_SEED_START`).

    Even i takes the first call (copies from the request only); odd i takes a random later
    call when the conversation has one, preferring calls with a field copied from a tool
    response (so both sources are well represented in the per-field metrics).
    """
    if seed < EVAL_SEED_START:
        raise ValueError(f"eval seeds must be >= EVAL_SEED_START={EVAL_SEED_START}, got {seed}")
    tasks = []
    for i in range(n):
        rng = random.Random(seed + i)
        conv = generate_conversation(rng, max_rounds=max_rounds)
        if i % 2 == 0 or len(conv.calls) == 1:
            tasks.append(conv.calls[0])
        else:
            later = conv.calls[1:]
            from_resp = [t for t in later if any(f.source == "tool_response" for f in t.fields)]
            tasks.append(rng.choice(from_resp or later))
    return tasks


# ----------------------------------------------------------------------------- scoring

_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def argument_spans(text: str, fields: list[FieldInfo], start: int = 0,
                   end: int | None = None) -> list[tuple[FieldInfo, int, int]]:
    """Where each argument value of one serialised call sits in `text`.

    Args:
        text: text holding the call's ``"arguments": {...}`` (a conversation or a target);
        fields: the call's `FieldInfo` list, in argument order; start, end: the call's
            character range in `text` (search window).

    Returns:
        ``(field, a, b)`` per field: character span ``[a, b)`` of its value, string values
        without their quotes.

    Raises:
        ValueError: a field's ``"key": value`` is not in the range (text and ground truth disagree).
    """
    end = len(text) if end is None else end
    cur = text.index('"arguments"', start, end)
    out = []
    for f in fields:
        js, key = dumps(f.value), f'"{f.key}": '
        i = text.index(key, cur, end) + len(key)
        cur = i
        q = 1 if js.startswith('"') else 0
        out.append((f, i + q, i + len(js) - q))
    return out


def value_spans(conv: Conversation) -> list[tuple[FieldInfo, int, int]]:
    """`argument_spans` of every tool call in ``conv.text`` (``conv.calls`` holds one
    `CallTurn` per ``<tool_call>``, in order): the values that must be copied from the
    request or an earlier tool response."""
    return [span for call, m in zip(conv.calls, _CALL_RE.finditer(conv.text))
            for span in argument_spans(conv.text, call.fields, m.start(), m.end())]


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """``json.loads`` object hook: a dict, or ValueError when a key repeats."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError(f"repeated key in {[k for k, _ in pairs]}")
    return obj


def parse_call(text: str) -> dict | None:
    """``<tool_call>{json}</tool_call>...`` -> ``{"name": str, "arguments": dict}``, else None.

    The first ``<tool_call>`` block is parsed; None if there is none, its JSON is invalid
    (a key repeated within one object counts as invalid: ``json.loads`` would silently keep
    the last value, so ``{"a": 1, "a": 1}`` would score as a correct call), or it lacks a
    string ``name`` and a dict ``arguments``.
    """
    m = _CALL_RE.search(text)
    if m is None:
        return None
    try:
        obj = json.loads(m.group(1), object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError):  # json.JSONDecodeError is a ValueError
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(obj.get("arguments"), dict):
        return None
    return {"name": obj["name"], "arguments": obj["arguments"]}


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def score_call(generated_text: str, turn: CallTurn) -> dict:
    """Exact comparison of a generated completion with the ground truth of `turn`.

    Returns:
        dict with ``exact_match`` (name and arguments equal, types included, no extra keys),
        ``text_exact`` (the text equals the target, with or without the trailing ``<|im_end|>``),
        ``json_valid``, ``name_correct``, and ``fields``: one dict per ground-truth argument with
        ``key, kind, source, is_repeat, correct``.
    """
    call = parse_call(generated_text)
    args = call["arguments"] if call else {}
    fields = [{"key": f.key, "kind": f.kind, "source": f.source, "is_repeat": f.is_repeat_of_earlier_field,
               "correct": f.key in args and _same(args[f.key], f.value)} for f in turn.fields]
    name_ok = call is not None and call["name"] == turn.name
    exact = name_ok and set(args) == set(turn.arguments) and all(f["correct"] for f in fields)
    body = turn.target[: -len(IM_END)]
    return {"exact_match": exact, "text_exact": generated_text in (turn.target, body),
            "json_valid": call is not None, "name_correct": name_ok, "fields": fields}
