"""Training rows (docs/architecture.md §9): [T] token ids with per-token focus and copied-value flags.

Three kinds of row, all python lists of length T:

* agent rows -- synthetic tool-call conversations (`clover_engine.data.agent`, training seeds
  < 10,000,000) packed from a conversation start (`pack_conversations`); focus = assistant turns;
* code rows -- windows of Python source: the standard library (`clover_engine.data.stdlib`, train
  split) and/or third-party packages (`clover_engine.data.packages`, train packages), per
  ``code_source``;
* recall rows -- associative recall on real tokens (`RowSource.recall_row`,
  `RowSource.call_recall_row`); focus = the queried values.

Wing: ``training``.
"""

from __future__ import annotations

import functools
import random
import re

import numpy as np
import torch

from clover_engine.data.tokenizer import SPECIAL_TOKENS
from clover_engine.data.agent import (
    Conversation,
    EVAL_SEED_START,
    REQUEST_SEPARATORS,
    SLOTS,
    TOOLS,
    dumps,
    generate_conversation,
    iter_conversations,
    value_spans,
)
from clover_engine.data.open_tools import generate_conversation as generate_open_conversation
from clover_engine.data.packages import iter_package_text
from clover_engine.data.stdlib import iter_stdlib_text

AGENT_SHARE = 0.9  # rows of agent conversations vs stdlib code
FIRST_ORDINARY_ID = len(SPECIAL_TOKENS)  # ids 0..7 are the special tokens (clover_engine.data.tokenizer)
RECALL_VOCABS = ("code", "uniform", "values", "calls")  # RowSource.recall_row's sources of cue / value ids
CODE_SOURCES = ("stdlib", "packages", "both")  # RowSource's code corpora
PACKAGE_CODE_CHARS = 12_000_000  # characters of package code tokenised per RowSource (memory and start-up)


class RowSource:
    """Infinite source of [T] token rows: packed agent conversations or stdlib windows."""

    def __init__(self, tokenizer, seed: int, easy_share: float = 0.0, open_tools_share: float = 0.0,
                 code_source: str = "stdlib", package_chars: int = PACKAGE_CODE_CHARS, open_easy_share: float = 0.0):
        """Args:
            tokenizer: a `tokenizers.Tokenizer` with the project's special tokens.
            seed: row randomness and the corpora's file order.
            easy_share, open_tools_share: shares of agent rows from `easy_conversations` and from
                the open-vocabulary corpus (the rest: `clover_engine.data.agent`).
            code_source: ``"stdlib"`` (the standard library's train split), ``"packages"``
                (`clover_engine.data.packages` train packages, never the held-out ones) or ``"both"``
                (the two streams, concatenated).
            package_chars: characters of package code read (files in seeded order until the
                budget; the whole train split is ~60 MB).
            open_easy_share: share of the open-vocabulary conversations that list 1 or 2 tools
                and make one call (`open_tool_conversations`).

        Raises:
            ValueError: an unknown ``code_source``, or no code found for it."""

        if code_source not in CODE_SOURCES:
            raise ValueError(f"code_source must be one of {CODE_SOURCES}, got {code_source!r}")

        self.tok = tokenizer
        self.rng = random.Random(seed)
        self.easy_share = easy_share  # share of agent rows from `easy_conversations`
        self.open_tools_share = open_tools_share  # share of agent rows from `clover_engine.data.open_tools`
        self._open = open_tool_conversations(seed, open_easy_share)
        self.eot = tokenizer.token_to_id("<|endoftext|>")
        self.vocab = tokenizer.get_vocab_size()
        self._convs = iter_conversations(seed * 1_000_000 % 9_000_000, None, max_rounds=8)
        self._easy = easy_conversations((seed * 1_000_000 + 500_000) % 9_000_000)
        ids = []
        if code_source in ("stdlib", "both"):
            for text in iter_stdlib_text("train", seed):
                ids.extend(tokenizer.encode(text).ids)
        if code_source in ("packages", "both"):
            n = 0
            for text in iter_package_text("train", seed):
                if n >= package_chars:
                    break
                ids.extend(tokenizer.encode(text).ids)
                n += len(text)
        if len(ids) < 4096:
            raise ValueError(f"code_source={code_source!r}: only {len(ids)} code tokens found (is the "
                             "project installed with `bash .ci/install`?)")
        self.code_source = code_source
        self.code = np.asarray(ids, dtype=np.int64)

    def agent_row(self, T: int) -> tuple[list[int], list[bool], list[bool]]:
        """Conversations packed from a conversation start (a row never begins mid-conversation,
        so every assistant turn in it has its request and tool responses in view). Returns the
        ids and the focus flags: True on assistant-turn tokens (the calls, the answer and their
        ``<|im_end|>``), the tokens a decoder generates; and the copied-value flags."""
        u = self.rng.random()
        convs = (self._open if u < self.open_tools_share else
                 self._easy if u < self.open_tools_share + self.easy_share else self._convs)
        return pack_conversations(convs, self.tok, self.eot, T)

    def code_row(self, T: int) -> tuple[list[int], list[bool], list[bool]]:
        s = self.rng.randrange(0, len(self.code) - T)
        return self.code[s: s + T].tolist(), [True] * T, [False] * T

    def recall_row(self, T: int, n_pairs: tuple[int, int] = (4, 8), cue_len: int = 2,
                   value_len: tuple[int, int] = (2, 10), span: int = 384,
                   vocab: str = "code") -> tuple[list[int], list[bool], list[bool]]:
        """Multi-query associative recall (MQAR, Arora et al. 2023, "Zoology") on real tokens: a
        stdlib-code background of T ids with a recall segment of ``span`` ids at a random offset;
        ``n_pairs`` key-value pairs are written in its first half (a cue of ``cue_len`` ids, then a
        value of 2-10 ids, all drawn iid from the code stream) and queried in its second half in
        shuffled order (the same cue, then the value again). ``span`` is kept under the attention
        window (512 in clover-tiny) so the window can see the pairs; in `state` mode only the
        recurrent state can. Focus and copied-value flags are True on the queried values only, so the loss is
        the copy itself: find the cue earlier in the row and copy what followed it -- the lookup a
        tool-call argument needs (``"flight": "`` -> the value after ``flight "`` in the request).

        Rows shorter than ``span`` are one recall segment, with pairs dropped until they fit
        its halves. ``vocab``: where cue and value ids come from -- ``"code"``, the code
        stream's unigram; ``"uniform"``, uniformly from the ordinary vocabulary (ids
        `FIRST_ORDINARY_ID`.. ``self.vocab - 1``); ``"values"``, uniformly from the ids that
        occur in tool-call argument values (`value_ids`: ~300 digits, letters, name pieces),
        the alphabet the copy has to work on.

        ``"calls"`` is the format-shifted variant, `call_recall_row`.

        Raises:
            ValueError: an unknown ``vocab``."""
        rng = self.rng
        if vocab == "calls":
            return self.call_recall_row(T, span=span)
        if vocab == "code":
            pick = lambda n: [int(self.code[rng.randrange(len(self.code))]) for _ in range(n)]
        elif vocab == "uniform":
            pick = lambda n: [rng.randrange(FIRST_ORDINARY_ID, self.vocab) for _ in range(n)]
        elif vocab == "values":
            alphabet = self.value_ids
            pick = lambda n: [alphabet[rng.randrange(len(alphabet))] for _ in range(n)]
        else:
            raise ValueError(f"vocab must be one of {RECALL_VOCABS}, got {vocab!r}")
        span = min(span, T)
        half = span // 2
        pairs = [(pick(cue_len), pick(rng.randint(*value_len))) for _ in range(rng.randint(*n_pairs))]
        while len(pairs) > 1 and sum(len(c) + len(v) for c, v in pairs) > half:
            pairs.pop()
        s = rng.randrange(0, len(self.code) - T)
        ids = self.code[s: s + T].tolist()  # the background, overwritten where pairs go
        focus = [False] * T
        off = rng.randrange(0, T - span + 1)
        for start, end, items, query in ((off, off + half, pairs, False),
                                         (off + half, off + span, rng.sample(pairs, len(pairs)), True)):
            room = end - start - sum(len(c) + len(v) for c, v in items)
            at, prev = start, 0
            for gap, (c, v) in zip(sorted(rng.randrange(max(1, room)) for _ in items), items):
                at, prev = at + gap - prev, gap
                ids[at: at + len(c) + len(v)] = c + v
                focus[at + len(c): at + len(c) + len(v)] = [query] * len(v)
                at += len(c) + len(v)
        return ids, focus, focus

    def call_recall_row(self, T: int, n_pairs: tuple[int, int] = (3, 8),
                        span: int = 384) -> tuple[list[int], list[bool], list[bool]]:
        """Format-shifted associative recall: the lookup a tool call makes, with the cue written
        differently on the two sides. A request-style context ``Please key1: "v1", key2: "v2".``
        (one of the request separators ``" "``, ``": "``, ``"="`` per row, as in
        `clover_engine.data.agent.generate_conversation`) is followed, within ``span`` tokens, by a call's
        arguments object ``<tool_call>{"arguments": {"key2": "v2", "key1": "v1"}}</tool_call>``
        that repeats a shuffled subset of the pairs. Keys are the 27 distinct argument keys of
        `clover_engine.data.agent.TOOLS`, distinct within a row; values come from the corpus's slot
        generators (ids, names, dates, amounts ...). Unlike `recall_row`, the query cue
        (``"key2": "``) is not a verbatim copy of the context cue (``key2: "``), so an induction
        head that matches the preceding token alone cannot solve it. The rest of the T ids is
        stdlib code. Focus and copied-value flags are True on the queried values' tokens.

        Args:
            T: row length in tokens; 256 holds 3-8 pairs, and pairs are dropped until both parts fit.
            n_pairs: (min, max) pairs in the context.
            span: the context and query lie within this many tokens (kept under the window).

        Returns:
            ids [T], focus flags [T], copied-value flags [T] (python lists).
        """

        rng = self.rng
        keys = self._argument_keys
        span = min(span, T)
        names = rng.sample(sorted(keys), rng.randint(*n_pairs))
        values: dict[str, object] = {}
        for k in names:
            v = SLOTS[keys[k]][1](rng)
            while v in values.values():
                v = SLOTS[keys[k]][1](rng)
            values[k] = v
        sep = rng.choice(REQUEST_SEPARATORS)
        while True:
            queried = rng.sample(names, rng.randint(max(1, len(names) // 2), len(names)))
            context = self.tok.encode("Please " + ", ".join(f"{k}{sep}{dumps(values[k])}" for k in names) + ".").ids
            query, focus = self._encode_arguments(queried, values)
            if len(context) + len(query) <= span or len(names) == 1:
                break
            names.pop()
        n = len(context) + len(query)
        if n > T:
            raise ValueError(f"T={T} cannot hold even one pair ({n} tokens); use T >= 256, e.g. --recall-shape 256,8")
        s = rng.randrange(0, len(self.code) - T)
        ids = self.code[s: s + T].tolist()
        off = rng.randrange(0, T - n + 1)
        gap = rng.randrange(0, min(span, T - off) - n + 1)  # code between the context and the call
        q0 = off + len(context) + gap
        ids[off: off + len(context)] = context
        ids[q0: q0 + len(query)] = query
        flags = [False] * T
        flags[q0: q0 + len(query)] = focus
        return ids, flags, flags

    def _encode_arguments(self, keys: list[str], values: dict) -> tuple[list[int], list[bool]]:
        """``<tool_call>{"arguments": {...}}</tool_call>`` over ``keys`` -> ids and per-id flags
        (True where the id overlaps a value's characters, quotes excluded)."""

        text, spans = '<tool_call>{"arguments": {', []
        for i, k in enumerate(keys):
            text += ("" if i == 0 else ", ") + f'"{k}": '
            v = dumps(values[k])
            q = 1 if v.startswith('"') else 0
            spans.append((len(text) + q, len(text) + len(v) - q))
            text += v
        enc = self.tok.encode(text + "}}</tool_call>")
        return enc.ids, [any(a < o[1] and o[0] < b for a, b in spans) for o in enc.offsets]

    @functools.cached_property
    def _argument_keys(self) -> dict[str, str]:
        """Argument key -> its slot (value generator) over `clover_engine.data.agent.TOOLS`, repeat fields excluded."""

        return {k: slot for t in TOOLS for k, slot in t.args if not slot.startswith("=")}

    @functools.cached_property
    def value_ids(self) -> list[int]:
        """The sorted distinct ids flagged as copied argument values in 60 1024-token rows of agent
        conversations (a fixed seed, apart from the training stream): ~300 ids."""

        convs = iter_conversations(9_500_000, None, max_rounds=8)
        ids = set()
        for _ in range(60):
            row, _, value = pack_conversations(convs, self.tok, self.eot, 1024)
            ids.update(t for t, v in zip(row, value) if v)
        return sorted(ids)

    def batch(self, B: int, T: int, recall: bool = False,
              recall_vocab: str = "code") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[B, T] int64 ids, [B, T] bool focus (see `agent_row`; all True on code rows) and
        [B, T] bool copied-value flags. With ``recall`` every row is a `recall_row` of ``recall_vocab``."""
        if recall:
            rows = [self.recall_row(T, vocab=recall_vocab) for _ in range(B)]
        else:
            rows = [self.agent_row(T) if self.rng.random() < AGENT_SHARE else self.code_row(T) for _ in range(B)]
        return (torch.tensor([r[0] for r in rows], dtype=torch.long),
                torch.tensor([r[1] for r in rows], dtype=torch.bool),
                torch.tensor([r[2] for r in rows], dtype=torch.bool))


def easy_conversations(seed: int):
    """Curriculum stream: 1-2 tools listed, 1-2 calls, so a 1024-token row holds ~6x more calls
    whose values sit a few dozen tokens back -- meant to make the copy (induction) circuit form
    sooner. Measured (models/clover-tiny card): with half the agent rows from here, stage 2
    reached the same call-slot loss ~37 minutes sooner than without; copying did not form in
    either. Training seeds only."""

    i = seed
    while True:
        rng = random.Random(i)
        yield generate_conversation(rng, n_rounds=rng.choice((1, 1, 2)), n_tools=rng.choice((1, 2)))
        i = i + 1 if i + 1 < EVAL_SEED_START else 0


def open_tool_conversations(seed: int, easy_share: float = 0.0):
    """Endless open-vocabulary training conversations (`clover_engine.data.open_tools`, train vocabulary),
    seeded ``open-train-{seed + i}``, each with only its tool-call turns in ``calls`` (the turns
    `value_spans` pairs with the ``<tool_call>`` blocks of the text). A share `easy_share` of
    them (drawn per conversation) lists only 1 or 2 tools and makes one call."""

    i = 0
    pick = random.Random(f"open-easy-{seed}")
    while True:
        rng = random.Random(f"open-train-{seed + i}")
        if easy_share and pick.random() < easy_share:
            conv, turns = generate_open_conversation(rng, "train", n_rounds=1, n_tools=rng.choice((1, 2)))
        else:
            conv, turns = generate_open_conversation(rng, "train")
        yield Conversation(conv.text, [t for t in turns if t.name is not None])
        i += 1


def pack_conversations(convs, tokenizer, eot: int, T: int) -> tuple[list[int], list[bool], list[bool]]:
    """Pack conversations from the iterator `convs` into one row of T ids (each followed by
    `eot`), the last one cut. Returns the ids and, per token, whether it lies in an assistant
    turn (content and its closing ``<|im_end|>``) and whether it is part of a copied argument
    value of a tool call (`clover_engine.data.agent.value_spans`; the tokens `--copy-weight` up-weights)."""
    ids: list[int] = []
    focus: list[bool] = []
    value: list[bool] = []

    while len(ids) < T:
        conv = next(convs)
        enc = tokenizer.encode(conv.text)
        spans = [(m.start(1), m.end()) for m in _ASSISTANT.finditer(conv.text)]
        vspans = [(a, b) for _, a, b in value_spans(conv)]
        ids += enc.ids + [eot]
        focus += [any(a <= o[0] < b for a, b in spans) for o in enc.offsets] + [False]
        value += [any(o[0] < b and o[1] > a for a, b in vspans) for o in enc.offsets] + [False]
    return ids[:T], focus[:T], value[:T]


_ASSISTANT = re.compile(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", re.DOTALL)
