"""Block-diffusion training of a small Clover model on the CPU (docs/architecture.md §9).

    python -m engine.train --out models/clover-tiny --minutes 100            # fresh run
    python -m engine.train --out models/clover-tiny --minutes 100 --resume   # continue

Objective, per row of T tokens: sample a block size L (mixed, weighted toward
32, so every block_size of the explorer -- 1 included -- is in distribution);
split the row into blocks of L; per block sample a mask ratio t ~ U(0.05, 1)
and mask each slot with probability t (with probability 0.25 the block keeps a
clean prefix, like a prompt-prefilled first block); one pass over the clean row
gives every block-boundary state and the noisy blocks read them
(`CloverModel.forward_train`); loss = cross-entropy on masked slots + 0.01 x
MoE load balancing. The attention window (``state+window`` mode) is dropped on
a share of batches so that the model decodes in both memory modes.

Focus: in agent rows only assistant turns are masked in the blocks that hold
them (the prompt part of such a block stays clean, as at decode time), and the
other blocks only with probability `OTHER_BLOCK_RATE`: the loss goes to the
tool calls, where values must be copied, not to re-predicting system prompts.
The first run without focus (70 min) learned the call template but ignored the
request: it emitted plausible tool names not in the tool list. ``--copy-weight``
further up-weights the masked tokens that are copied argument values.

Later stages: ``--init-from DIR`` starts from a checkpoint's weights with a fresh
optimizer and schedule; ``--attention-conv K`` adds the attention q/k/v conv to
such a checkpoint (identity-initialised) and ``--conv-lr-mult`` lets its taps move
faster than the rest; ``--induction-heads N`` re-initialises the q/k taps of N kv heads
per attention layer to read the preceding tokens (`init_induction_heads`), and
``--block-weights`` changes the block-size mix; ``--front-attention`` puts an
induction-initialised attention layer in front of the stack (`with_front_attention`).

Copy curriculum: ``--recall-share S`` makes a share S of batches associative-recall
rows (`RowSource.recall_row`); ``--recall-block-size``, ``--recall-shape T,B`` and
``--recall-vocab`` give them their own block size, batch shape and cue/value alphabet
(``calls``: format-shifted rows, `RowSource.call_recall_row` -- request-style ``key: "v"``
in the context, a call's ``"key": "v"`` as the query),
and ``--window-drop`` sets the share of `state`-mode batches. A fresh attention-first
model learns the lookup in ~350 such steps (block size 1, 16 x 128); one trained on
language first did not in 400-500 (models/clover-tiny/README.md):

    python -m engine.train --out runs/c4 --attention-first --induction-heads 2 --recall-share 1 \
        --recall-block-size 1 --recall-shape 128,16 --recall-vocab values --window-drop 0 --minutes 25 --lr 2e-3

Data: synthetic tool-call conversations (`engine.data.agent`, seeds <
10,000,000) packed into rows that start at a conversation start, and Python
standard-library sources (`engine.data.stdlib`, train split). The learning rate follows a cosine over
the *time* budget (``--minutes``), so a resumed run continues the same
schedule. Writes ``train_log.jsonl`` (loss, tokens/s, held-out metrics) and,
every ``--save-every-min`` minutes and at the end, the checkpoint
(``config.json``, ``model.safetensors``, ``tokenizer.json``) plus
``train_state.pt`` (optimizer and progress; loaded with ``weights_only=True``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from engine.checkpoint import load_model, save_model
from engine.config import CloverConfig
from engine.data.tokenizer import SPECIAL_TOKENS
from engine.model import CloverModel

# Block sizes and their sampling weights, and the row length / batch used for each.
BLOCK_SIZES = {1: 0.04, 2: 0.04, 4: 0.08, 8: 0.1, 16: 0.14, 32: 0.4, 64: 0.2}
# (row length, rows per batch) per block size: rows long enough to hold a system turn, a request
# and its calls; two rows per step (more, smaller steps learn copying faster per CPU-minute).
ROW_SHAPE = {1: (640, 1), 2: (640, 1), 4: (1024, 1), 8: (1024, 2), 16: (1024, 2), 32: (1024, 2), 64: (1024, 2)}
AGENT_SHARE = 0.9  # rows of agent conversations vs stdlib code
WINDOW_DROP = 0.35  # share of batches trained in `state` mode (window W = 0)
EPS = 0.05
FIRST_ORDINARY_ID = len(SPECIAL_TOKENS)  # ids 0..7 are the special tokens (engine.data.tokenizer)
RECALL_VOCABS = ("code", "uniform", "values", "calls")  # RowSource.recall_row's sources of cue / value ids
OTHER_BLOCK_RATE = 0.15  # agent rows: share of blocks outside assistant turns that are masked at all


def parse_block_weights(spec: str) -> dict[int, float]:
    """``"1:0.25,32:0.5"`` -> {1: 0.25, 32: 0.5}: block sizes (keys of `ROW_SHAPE`) and their sampling weights.

    Raises:
        SystemExit: a malformed entry, a block size without a row shape, or no positive weight.
    """
    out = {}
    for item in spec.split(","):
        try:
            L, w = item.split(":")
            out[int(L)] = float(w)
        except ValueError:
            raise SystemExit(f"--block-weights: expected 'L:weight,...' like '1:0.25,32:0.75', got {item!r}") from None
    bad = [L for L in out if L not in ROW_SHAPE]
    if bad or not any(w > 0 for w in out.values()) or any(w < 0 for w in out.values()):
        raise SystemExit(f"--block-weights: block sizes must be among {sorted(ROW_SHAPE)} with weights >= 0, "
                         f"not all 0; got {spec!r}")
    return out


def tiny_config(vocab_size: int = 4096) -> CloverConfig:
    """`clover-tiny`: 4 layers (GDN, attention) x 2, 8 experts top-2, window 512, a 3-tap conv on the
    attention q/k/v (the shipped model got a 4-tap one in stage 3); ~6.2M parameters (25 MB fp32).
    Sized so that a run fits a CPU session: attention layers every other layer so the window can
    copy, hidden 192 as in the first pilot runs."""
    return CloverConfig(
        name="clover-tiny", vocab_size=vocab_size, hidden_size=192, num_hidden_layers=4,
        full_attention_interval=2, linear_num_key_heads=4, linear_num_value_heads=4,
        linear_key_head_dim=24, linear_value_head_dim=48, linear_conv_kernel_dim=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=48, partial_rotary_factor=0.5,
        rope_theta=10000.0, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=192,
        shared_expert_intermediate_size=192, max_position_embeddings=65536, attention_window=512,
        attention_conv_kernel_dim=3, mask_token_id=1, eos_token_id=3,
    )


ATTENTION_CONV_WEIGHT = "self_attn.conv1d.weight"
"""Name suffix of the attention q/k/v conv taps (`GatedAttention.conv1d`)."""


def with_attention_conv(model: CloverModel, kernel: int) -> CloverModel:
    """A copy of `model` with a `kernel`-tap causal conv on its attention layers' q/k/v
    (``config.attention_conv_kernel_dim``), initialised to the identity so that the new
    model computes exactly what `model` did; every other weight is carried over.

    Raises:
        ValueError: `model` already has an attention conv of another size, or `kernel` < 1.
    """
    if kernel < 1:
        raise ValueError(f"attention conv kernel must be >= 1, got {kernel}")
    old = model.config.attention_conv_kernel_dim
    if old == kernel:
        return model
    if old:
        raise ValueError(f"model already has an attention conv of {old} taps; cannot resize it to {kernel}")
    new = CloverModel(dataclasses.replace(model.config, attention_conv_kernel_dim=kernel))
    return _carry_over(new, model.state_dict(), lambda k: k.endswith(ATTENTION_CONV_WEIGHT))


def _carry_over(new: CloverModel, state: dict, is_new) -> CloverModel:
    """Load `state` into the grown model `new`; the weights it lacks must be exactly those `is_new` names."""
    missing, unexpected = new.load_state_dict(state, strict=False)
    stray = [k for k in missing if not is_new(k)]
    if stray or unexpected:
        raise ValueError(f"weights do not fit the new model: missing {stray}, unexpected {unexpected}")
    return new


INDUCTION_TAPS = (1.0, 0.5, 0.25)
"""Attention-conv taps of an induction head's q and k for lags 1, 2, 3 (lag 0, the token itself,
gets 0): q at slot i then encodes tokens i-1, i-2, i-3 and k at position j tokens j-1, j-2, j-3,
so one q.k match finds the earlier occurrence of the current context and v (the token itself)
copies what followed it."""


def init_induction_heads(model: CloverModel, kv_heads: int, taps: tuple[float, ...] = INDUCTION_TAPS,
                         layers: list[int] | None = None) -> list[str]:
    """Turn the last `kv_heads` key/value heads of every attention layer (and the query heads that
    share them under GQA) into induction-head candidates by re-initialising their q and k conv taps
    in place to read the preceding tokens (`INDUCTION_TAPS`); their v taps and all other weights
    are left as they are. Without this, content-based copying stayed at chance after 500-700 steps
    in `benchmarks/copy_toy.py`; with it, a 4-layer all-attention toy learned it in ~150 steps
    (block_size 1).
    The idea is Primer's (arXiv:2109.08668) shifted/convolved keys; the previous-token q/k init is ours.

    Args:
        model: a CloverModel with ``config.attention_conv_kernel_dim`` >= len(`taps`) + 1
            (conv weight [channels, 1, kernel], channels = (Hq + 2 Hkv) * head_dim, q|k|v order).
        kv_heads: how many kv heads per attention layer, 1..num_key_value_heads.
        taps: the q/k taps for lags 1, 2, ...
        layers: indices of the attention layers to change (default: all of them).

    Returns:
        The names of the conv weights that were changed.

    Raises:
        ValueError: no attention conv, too few taps for `taps`, or `kv_heads` out of range.
    """
    cfg = model.config
    K = cfg.attention_conv_kernel_dim
    if K < len(taps) + 1:
        raise ValueError(f"induction heads need an attention conv of >= {len(taps) + 1} taps, the model has {K}; "
                         f"add one first (--attention-conv {len(taps) + 1})")
    if not 1 <= kv_heads <= cfg.num_key_value_heads:
        raise ValueError(f"kv_heads must be in 1..{cfg.num_key_value_heads}, got {kv_heads}")
    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rep = Hq // Hkv
    changed = []
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            if layer.layer_type != "full_attention" or (layers is not None and i not in layers):
                continue
            w = layer.self_attn.conv1d.weight  # [channels, 1, K]
            for g in range(Hkv - kv_heads, Hkv):
                rows = [slice(Hq * D + g * D, Hq * D + (g + 1) * D)]  # k of kv head g
                rows += [slice(h * D, (h + 1) * D) for h in range(g * rep, (g + 1) * rep)]  # its q heads
                for r in rows:
                    w[r] = 0.0
                    for lag, tap in enumerate(taps, start=1):
                        w[r, 0, K - 1 - lag] = tap
            changed.append(f"layers.{i}.{ATTENTION_CONV_WEIGHT}")
    return changed


def with_front_attention(model: CloverModel) -> CloverModel:
    """A copy of `model` with one more layer in front: a gated-attention layer (with the model's
    attention q/k/v conv) whose every head is an induction-head candidate (`init_induction_heads`)
    and whose outputs (attention o_proj, expert and shared-expert down projections) start at zero,
    so the new model computes exactly what `model` did. Layer i of `model` becomes layer i + 1.

    Why: in `benchmarks/copy_toy.py` (induction task, block_size 1, q/k taps on the preceding
    tokens) the layout attention, GDN, attention, GDN learned content copying by step ~225 while
    GDN, attention, GDN, attention -- clover-tiny's -- was still at chance at step 400: the copy
    head wants to read the token embeddings before a GDN layer has mixed history into them.

    Raises:
        ValueError: `model` has no attention conv of >= 4 taps (add one with `with_attention_conv`).
    """
    cfg = model.config
    if cfg.attention_conv_kernel_dim < len(INDUCTION_TAPS) + 1:
        raise ValueError(f"the front attention layer needs an attention conv of >= {len(INDUCTION_TAPS) + 1} taps, "
                         f"the model has {cfg.attention_conv_kernel_dim}; add one first (--attention-conv 4)")
    new = CloverModel(dataclasses.replace(cfg, num_hidden_layers=cfg.num_hidden_layers + 1,
                                          layer_types=["full_attention", *cfg.layer_types]))
    shifted = {}
    for k, v in model.state_dict().items():
        m = re.match(r"layers\.(\d+)\.(.*)", k)
        shifted[f"layers.{int(m[1]) + 1}.{m[2]}" if m else k] = v
    _carry_over(new, shifted, lambda k: k.startswith("layers.0."))
    front = new.layers[0]
    with torch.no_grad():
        front.self_attn.o_proj.weight.zero_()
        front.mlp.down_proj.zero_()
        front.mlp.shared_down.weight.zero_()
    init_induction_heads(new, cfg.num_key_value_heads, layers=[0])
    return new


# ----------------------------------------------------------------------------- data
class RowSource:
    """Infinite source of [T] token rows: packed agent conversations or stdlib windows."""

    def __init__(self, tokenizer, seed: int, easy_share: float = 0.0):
        from engine.data.agent import iter_conversations
        from engine.data.stdlib import iter_stdlib_text

        self.tok = tokenizer
        self.rng = random.Random(seed)
        self.easy_share = easy_share  # share of agent rows from `easy_conversations`
        self.eot = tokenizer.token_to_id("<|endoftext|>")
        self.vocab = tokenizer.get_vocab_size()
        self._convs = iter_conversations(seed * 1_000_000 % 9_000_000, None, max_rounds=8)
        self._easy = easy_conversations((seed * 1_000_000 + 500_000) % 9_000_000)
        ids = []
        for text in iter_stdlib_text("train", seed):
            ids.extend(tokenizer.encode(text).ids)
        self.code = np.asarray(ids, dtype=np.int64)

    def agent_row(self, T: int) -> tuple[list[int], list[bool], list[bool]]:
        """Conversations packed from a conversation start (a row never begins mid-conversation,
        so every assistant turn in it has its request and tool responses in view). Returns the
        ids and the focus flags: True on assistant-turn tokens (the calls, the answer and their
        ``<|im_end|>``), the tokens a decoder generates; and the copied-value flags."""
        easy = self.rng.random() < self.easy_share
        return pack_conversations(self._easy if easy else self._convs, self.tok, self.eot, T)

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
        `engine.data.agent.generate_conversation`) is followed, within ``span`` tokens, by a call's
        arguments object ``<tool_call>{"arguments": {"key2": "v2", "key1": "v1"}}</tool_call>``
        that repeats a shuffled subset of the pairs. Keys are the 27 distinct argument keys of
        `engine.data.agent.TOOLS`, distinct within a row; values come from the corpus's slot
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
        from engine.data.agent import REQUEST_SEPARATORS, SLOTS, dumps

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
        from engine.data.agent import dumps

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
        """Argument key -> its slot (value generator) over `engine.data.agent.TOOLS`, repeat fields excluded."""
        from engine.data.agent import TOOLS

        return {k: slot for t in TOOLS for k, slot in t.args if not slot.startswith("=")}

    @functools.cached_property
    def value_ids(self) -> list[int]:
        """The sorted distinct ids flagged as copied argument values in 60 1024-token rows of agent
        conversations (a fixed seed, apart from the training stream): ~300 ids."""
        from engine.data.agent import iter_conversations

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
    from engine.data.agent import EVAL_SEED_START, generate_conversation

    i = seed
    while True:
        rng = random.Random(i)
        yield generate_conversation(rng, n_rounds=rng.choice((1, 1, 2)), n_tools=rng.choice((1, 2)))
        i = i + 1 if i + 1 < EVAL_SEED_START else 0


def pack_conversations(convs, tokenizer, eot: int, T: int) -> tuple[list[int], list[bool], list[bool]]:
    """Pack conversations from the iterator `convs` into one row of T ids (each followed by
    `eot`), the last one cut. Returns the ids and, per token, whether it lies in an assistant
    turn (content and its closing ``<|im_end|>``) and whether it is part of a copied argument
    value of a tool call (`engine.data.agent.value_spans`; the tokens `--copy-weight` up-weights)."""
    ids: list[int] = []
    focus: list[bool] = []
    value: list[bool] = []
    from engine.data.agent import value_spans

    while len(ids) < T:
        conv = next(convs)
        enc = tokenizer.encode(conv.text)
        spans = [(m.start(1), m.end()) for m in _ASSISTANT.finditer(conv.text)]
        vspans = [(a, b) for _, a, b in value_spans(conv)]
        ids += enc.ids + [eot]
        focus += [any(a <= o[0] < b for a, b in spans) for o in enc.offsets] + [False]
        value += [any(o[0] < b and o[1] > a for a, b in vspans) for o in enc.offsets] + [False]
    return ids[:T], focus[:T], value[:T]


_ASSISTANT = re.compile(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", re.S)


def mask_blocks(clean: torch.Tensor, L: int, mask_id: int, gen: torch.Generator,
                focus: torch.Tensor | None = None) -> torch.Tensor:
    """Noisy copy of `clean` [B, T] for block size L (see `_mask`). With `focus` [B, T] bool,
    blocks that hold focus tokens mask only those (the rest stay clean, like the prompt tail in
    a prefilled first block), and other blocks are masked only w.p. `OTHER_BLOCK_RATE`, so the
    loss concentrates on what a decoder generates: tool calls whose values must be copied."""
    noisy = _mask(clean, L, mask_id, gen)
    if focus is None:
        return noisy
    B, T = clean.shape
    nb = T // L
    f = focus.view(B, nb, L)
    has = f.any(-1, keepdim=True)  # [B, nb, 1]
    other = torch.rand(B, nb, 1, generator=gen) < OTHER_BLOCK_RATE
    allowed = torch.where(has, f, other.expand(B, nb, L))
    return torch.where(allowed.view(B, T), noisy, clean)


def _mask(clean: torch.Tensor, L: int, mask_id: int, gen: torch.Generator) -> torch.Tensor:
    """Per block of L slots: t ~ U(EPS, 1), mask each slot w.p. t; 25 % of blocks keep a clean
    random-length prefix (as a prompt-prefilled block does). At least one slot per block masked."""
    B, T = clean.shape
    nb = T // L
    t = EPS + (1 - EPS) * torch.rand(B, nb, 1, generator=gen)
    m = torch.rand(B, nb, L, generator=gen) < t
    prefix = torch.randint(0, L, (B, nb, 1), generator=gen)
    keep_prefix = (torch.rand(B, nb, 1, generator=gen) < 0.25) & (torch.arange(L).view(1, 1, L) < prefix)
    m &= ~keep_prefix
    none = ~m.any(-1)  # force one masked slot (the last) where none is
    m[..., -1] |= none
    noisy = clean.clone().view(B, nb, L)
    noisy[m] = mask_id
    return noisy.view(B, T)


# ----------------------------------------------------------------------- evaluation
@torch.no_grad()
def heldout_loss(model: CloverModel, batches: list[tuple[torch.Tensor, torch.Tensor, int]], use_window: bool,
                 with_accuracy: bool = False) -> float | tuple[float, float]:
    """Mean masked-slot cross-entropy (nats) on fixed held-out batches; with `with_accuracy`,
    also the share of masked slots whose argmax is the clean token (all masked at once: the
    first forward of a fully masked block)."""
    model.eval()
    tot, n, ok = 0.0, 0, 0
    for clean, noisy, L in batches:
        h, _ = model.forward_train(clean, noisy, L, use_window)
        msk = noisy == model.config.mask_token_id
        logits = model.lm_head(h[msk]).float()
        tot += float(F.cross_entropy(logits, clean[msk], reduction="sum"))
        ok += int((logits.argmax(-1) == clean[msk]).sum())
        n += int(msk.sum())
    model.train()
    return (tot / max(n, 1), ok / max(n, 1)) if with_accuracy else tot / max(n, 1)


@torch.no_grad()
def quick_agent_eval(model, tokenizer, n: int, memory_mode: str) -> dict:
    """Exact match / value accuracy of tool calls at block 32 / 0.95 on `n` held-out tasks."""
    from engine.data.agent import eval_tasks, score_call
    from engine.decoder import BlockDecoder, DecodeConfig

    model.eval()
    dec = BlockDecoder(model, tokenizer, DecodeConfig(block_size=32, threshold=0.95, max_new_tokens=96,
                                                      memory_mode=memory_mode))
    em = fields = fields_ok = nfe = toks = 0
    for task in eval_tasks(n=n):
        r = dec.generate(task.prompt, record_trace=False)
        s = score_call(r.text, task)
        em += s["exact_match"]
        fields += len(s["fields"])
        fields_ok += sum(f["correct"] for f in s["fields"])
        nfe += r.nfe
        toks += len(r.tokens)
    model.train()
    n = max(n, 1)
    return {"exact_match": em / n, "field_acc": fields_ok / max(fields, 1), "tokens_per_forward": toks / max(nfe, 1)}


# --------------------------------------------------------------------------- train
@dataclass
class Progress:
    step: int = 0
    elapsed_s: float = 0.0
    tokens: int = 0


def lr_at(frac: float, base: float, warmup_frac: float = 0.02) -> float:
    """Linear warm-up then cosine to 10 % of `base`, over the fraction of the time budget."""
    if frac < warmup_frac:
        return base * frac / warmup_frac
    p = min(1.0, (frac - warmup_frac) / (1 - warmup_frac))
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def _hf_objective(argv: list[str] | None) -> bool:
    """``--objective block-diffusion`` with ``--init-from`` naming a pinned pretrained base
    (`engine.hf_adapter.BASES`, e.g. ``smollm2-135m-instruct``): the transformers adaptation recipe."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if "--objective" not in args and not any(a.startswith("--objective=") for a in args):
        return False
    from engine.hf_adapter import BASES

    return any(a in BASES or a.split("=", 1)[-1] in BASES for a in args)


def main(argv: list[str] | None = None) -> int:
    if _hf_objective(argv):  # adapting a pretrained transformers model: engine.hf_train
        from engine.hf_train import main as hf_main

        import sys

        return hf_main(list(sys.argv[1:] if argv is None else argv))
    ap = argparse.ArgumentParser(prog="python -m engine.train", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/clover-train"),
                    help="output checkpoint directory (default runs/clover-train, never the bundled model; "
                         "an existing checkpoint there is refused unless --resume or --overwrite)")
    ap.add_argument("--overwrite", action="store_true",
                    help="allow --out to be a directory that already holds a checkpoint (it is replaced)")
    ap.add_argument("--tokenizer", type=Path, default=Path("models/clover-tiny/tokenizer.json"))
    ap.add_argument("--minutes", type=float, default=100.0, help="total training time budget (all resumes)")
    ap.add_argument("--stop-after-min", type=float, default=None, help="stop this invocation early (resume later)")
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--seed", type=int, default=0)
    from engine.threads import add_threads_argument, configure_threads

    add_threads_argument(ap)  # default 1 on a 2-core machine: fastest when other processes share the cores
    ap.add_argument("--save-every-min", type=float, default=10.0)
    ap.add_argument("--eval-every-min", type=float, default=15.0)
    ap.add_argument("--eval-tasks", type=int, default=24)
    ap.add_argument("--easy-share", type=float, default=0.0,
                    help="share of agent rows drawn from the short curriculum conversations (0..1)")
    ap.add_argument("--recall-share", type=float, default=0.0,
                    help="share of batches of associative-recall rows (RowSource.recall_row: cue -> value pairs "
                         "in stdlib code, queried later; the loss is on the copied values only)")
    ap.add_argument("--window-drop", type=float, default=WINDOW_DROP,
                    help="share of batches trained in `state` mode (window W = 0)")
    ap.add_argument("--recall-vocab", choices=RECALL_VOCABS, default="code",
                    help="where recall cues and values come from (RowSource.recall_row): the code unigram, "
                         "the whole vocabulary uniformly, the ids of tool-call argument values, or 'calls': "
                         "request-style key/value clauses queried by a call's arguments object (call_recall_row)")
    ap.add_argument("--recall-block-size", type=int, default=None,
                    help="block size of every recall batch (e.g. 1: the copy head forms at block size 1 in copy_toy; "
                         "default: drawn like any batch)")
    ap.add_argument("--recall-shape", type=str, default=None,
                    help="'T,B': row length and rows per recall batch (default: ROW_SHAPE of the block size); "
                         "e.g. 128,16 = copy_toy's recall batches")
    ap.add_argument("--attention-conv", type=int, default=0,
                    help="with --init-from: add a causal conv of this many taps on the attention "
                         "layers' q/k/v (identity-initialised; 0 = keep the checkpoint's layout)")
    ap.add_argument("--induction-heads", type=int, default=0,
                    help="fresh run or --init-from: re-initialise the q/k conv taps of this many kv heads per attention "
                         "layer to read the preceding tokens (init_induction_heads)")
    ap.add_argument("--attention-first", action="store_true",
                    help="fresh run: layer order (attention, GDN) x 2 and a 4-tap attention conv instead of "
                         "tiny_config()'s GDN-first order (the order that learned content copying in copy_toy)")
    ap.add_argument("--front-attention", action="store_true",
                    help="with --init-from: put an induction-initialised attention layer in front (with_front_attention)")
    ap.add_argument("--conv-lr-mult", type=float, default=1.0,
                    help="learning-rate multiplier of the attention conv taps (e.g. 10 when they were just "
                         "added identity-initialised by --attention-conv and must move fast)")
    ap.add_argument("--copy-weight", type=float, default=1.0,
                    help="loss weight of masked tokens that are copied argument values of tool calls "
                         "(1 = plain mean over masked slots)")
    ap.add_argument("--block-weights", type=str, default=None,
                    help="sampling weights of the block sizes as 'L:w,...' over " + ",".join(map(str, BLOCK_SIZES))
                         + " (default: BLOCK_SIZES, weighted toward 32)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="start from this checkpoint's weights with a fresh optimizer and schedule "
                         "(a second stage of training)")
    args = ap.parse_args(argv)

    from tokenizers import Tokenizer

    try:
        args.threads = configure_threads(args.threads)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if not 0.0 <= args.easy_share <= 1.0:
        raise SystemExit(f"--easy-share must be in [0, 1], got {args.easy_share}")
    if not 0.0 <= args.window_drop <= 1.0:
        raise SystemExit(f"--window-drop must be in [0, 1], got {args.window_drop}")
    if not 0.0 <= args.recall_share <= 1.0:
        raise SystemExit(f"--recall-share must be in [0, 1], got {args.recall_share}")
    if not args.tokenizer.is_file():
        raise SystemExit(f"no tokenizer at {args.tokenizer}; build it: python -m engine.data.tokenizer --out {args.tokenizer}")
    if args.attention_first and (args.resume or args.init_from is not None):
        raise SystemExit("--attention-first sets the layer order of a fresh run; drop it with --resume / --init-from")
    recall_shape = None
    if args.recall_shape:
        parts = args.recall_shape.split(",")
        recall_shape = tuple(int(x) for x in parts) if all(x.strip().isdigit() for x in parts) else ()
        if len(recall_shape) != 2 or recall_shape[0] < 32 or recall_shape[1] < 1:
            raise SystemExit(f"--recall-shape must be 'T,B' with T >= 32 and B >= 1, e.g. 128,16; got {args.recall_shape!r}")
    if args.recall_block_size is not None and args.recall_block_size not in ROW_SHAPE:
        raise SystemExit(f"--recall-block-size must be one of {list(ROW_SHAPE)}, got {args.recall_block_size}")
    tokenizer = Tokenizer.from_file(str(args.tokenizer))
    block_weights = parse_block_weights(args.block_weights) if args.block_weights else dict(BLOCK_SIZES)
    if (args.out / "model.safetensors").is_file() and not (args.resume or args.overwrite):
        raise SystemExit(f"error: {args.out} already holds a checkpoint; training would overwrite it. Pass another "
                         f"--out, --resume to continue that run, or --overwrite to replace it")
    args.out.mkdir(parents=True, exist_ok=True)
    state_path = args.out / "train_state.pt"
    prog = Progress()
    if args.resume:
        if not state_path.is_file():
            raise SystemExit(f"--resume: no {state_path}; start without --resume")
        model = load_model(args.out)
        saved = torch.load(state_path, weights_only=True)
        prog = Progress(**saved["progress"])
    elif args.init_from is not None:
        torch.manual_seed(args.seed)
        model = load_model(args.init_from)
        if args.attention_conv:
            model = with_attention_conv(model, args.attention_conv)
        if args.front_attention:
            model = with_front_attention(model)
    else:
        torch.manual_seed(args.seed)
        cfg = tiny_config(tokenizer.get_vocab_size())
        if args.attention_first:
            cfg = dataclasses.replace(cfg, layer_types=["full_attention", "linear_attention"] * 2,
                                      attention_conv_kernel_dim=max(4, cfg.attention_conv_kernel_dim))
        model = CloverModel(cfg)
    if args.induction_heads and not args.resume:
        init_induction_heads(model, args.induction_heads)
    cfg = model.config
    model.train()
    decay, no_decay, conv = [], [], []
    for n, p in model.named_parameters():
        (conv if n.endswith(ATTENTION_CONV_WEIGHT) else decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": 0.01, "lr_mult": 1.0},
              {"params": no_decay, "weight_decay": 0.0, "lr_mult": 1.0}]
    if conv:  # a few taps per channel: no decay, their own learning-rate multiplier
        groups.append({"params": conv, "weight_decay": 0.0, "lr_mult": args.conv_lr_mult})
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))
    if args.resume:
        opt.load_state_dict(saved["optimizer"])
    print(f"clover-tiny: {sum(p.numel() for p in model.parameters()):,} parameters; step {prog.step}, "
          f"{prog.elapsed_s / 60:.1f} of {args.minutes} min done", flush=True)

    src = RowSource(tokenizer, args.seed + prog.step, args.easy_share)
    gen = torch.Generator().manual_seed(args.seed * 7919 + prog.step)
    rng = random.Random(args.seed * 31 + prog.step)
    # fixed held-out batches: eval conversations (seeds >= 10M) and held-out stdlib
    from engine.data.agent import EVAL_SEED_START, iter_conversations

    hgen = torch.Generator().manual_seed(123)
    convs = [tokenizer.encode(c.text).ids for c in iter_conversations(EVAL_SEED_START + 50_000, 12)]
    stream = [t for ids in convs for t in ids + [0]]
    held_agent = torch.tensor([stream[i * 512:(i + 1) * 512] for i in range(4)])
    held = [(held_agent, mask_blocks(held_agent, 32, cfg.mask_token_id, hgen), 32),
            (held_agent[:, :256], mask_blocks(held_agent[:, :256], 4, cfg.mask_token_id, hgen), 4)]
    # held-out assistant turns (calls), every call slot masked: the copy task itself
    hconvs = iter_conversations(EVAL_SEED_START + 60_000, None)
    rows = [pack_conversations(hconvs, tokenizer, 0, 1024) for _ in range(4)]
    held_call_clean = torch.tensor([r[0] for r in rows])
    held_call_focus = torch.tensor([r[1] for r in rows])  # r[2]: value flags, unused here
    held_call = [(held_call_clean, held_call_clean.masked_fill(held_call_focus, cfg.mask_token_id), 32)]

    log_path = args.out / "train_log.jsonl"
    log = log_path.open("a")
    budget_s = args.minutes * 60
    stop_s = budget_s if args.stop_after_min is None else min(budget_s, prog.elapsed_s + args.stop_after_min * 60)
    t_start = time.perf_counter() - prog.elapsed_s
    last_save = last_eval = time.perf_counter()
    ema = None
    bar = tqdm(total=int(budget_s), initial=int(prog.elapsed_s), unit="s", desc="train", mininterval=5)

    def save():
        save_model(model, args.out, tokenizer=tokenizer)
        torch.save({"optimizer": opt.state_dict(), "progress": prog.__dict__}, state_path)

    while prog.elapsed_s < stop_s:
        L = rng.choices(list(block_weights), weights=list(block_weights.values()))[0]
        recall = args.recall_share > 0 and rng.random() < args.recall_share
        if recall and args.recall_block_size is not None:
            L = args.recall_block_size
        T, B = recall_shape if recall and recall_shape else ROW_SHAPE[L]
        T -= T % L
        clean, focus, value = src.batch(B, T, recall, args.recall_vocab)
        noisy = mask_blocks(clean, L, cfg.mask_token_id, gen, focus)
        if not bool((noisy == cfg.mask_token_id).any()):
            continue  # nothing to predict in this batch (rare: short rows without assistant turns)
        use_window = rng.random() >= args.window_drop
        for gparam in opt.param_groups:
            gparam["lr"] = lr_at(prog.elapsed_s / budget_s, args.lr) * gparam.get("lr_mult", 1.0)
        h, aux = model.forward_train(clean, noisy, L, use_window)
        msk = noisy == cfg.mask_token_id
        ce = F.cross_entropy(model.lm_head(h[msk]).float(), clean[msk], reduction="none")
        loss = ce.mean()  # logged: the plain masked-slot loss
        w = 1.0 + (args.copy_weight - 1.0) * value[msk].float()  # up-weight copied argument values
        opt.zero_grad(set_to_none=True)
        ((ce * w).sum() / w.sum() + 0.01 * aux).backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        if math.isfinite(gnorm) and math.isfinite(float(loss.detach())):
            opt.step()
        else:  # never let one bad batch poison the weights
            tqdm.write(f"step {prog.step + 1}: non-finite loss/gradient (L={L}); update skipped")
        prog.step += 1
        prog.tokens += B * T
        now = time.perf_counter()
        prog.elapsed_s = now - t_start
        loss_f = float(loss.detach())
        ema = loss_f if ema is None else 0.95 * ema + 0.05 * loss_f
        bar.n = int(prog.elapsed_s)
        bar.set_postfix(step=prog.step, loss=f"{ema:.3f}", L=L, tok_s=f"{prog.tokens / prog.elapsed_s:.0f}")
        rec = {"step": prog.step, "elapsed_s": round(prog.elapsed_s, 1), "loss": round(loss_f, 4),
               "block_size": L, "window": use_window, "grad_norm": round(gnorm, 3),
               "lr": opt.param_groups[0]["lr"], "tokens": prog.tokens}
        if recall:
            rec["recall"] = True  # this step's loss is the associative-recall copy loss
        if now - last_eval > args.eval_every_min * 60 or prog.elapsed_s >= stop_s:
            t_eval = time.perf_counter()
            rec["heldout_loss_window"] = round(heldout_loss(model, held, True), 4)
            rec["heldout_loss_state"] = round(heldout_loss(model, held, False), 4)
            for mode, win in (("window", True), ("state", False)):
                loss_c, acc_c = heldout_loss(model, held_call, win, with_accuracy=True)
                rec[f"heldout_call_loss_{mode}"], rec[f"heldout_call_acc_{mode}"] = round(loss_c, 4), round(acc_c, 4)
            from engine.eval import value_probe

            rec["value_probe"] = value_probe(model, tokenizer, n_tasks=40)
            if args.eval_tasks:
                rec["agent_window"] = quick_agent_eval(model, tokenizer, args.eval_tasks, "state+window")
                rec["agent_state"] = quick_agent_eval(model, tokenizer, max(1, args.eval_tasks // 2), "state")
            tqdm.write(json.dumps({k: rec[k] for k in rec if k.startswith(("step", "heldout", "agent"))}))
            last_eval = time.perf_counter()
            t_start += last_eval - t_eval  # evaluation time does not count toward the training budget
        log.write(json.dumps(rec) + "\n")
        log.flush()
        if now - last_save > args.save_every_min * 60:
            save()
            last_save = time.perf_counter()
    save()
    bar.close()
    print(f"saved {args.out} at step {prog.step} ({prog.elapsed_s / 60:.1f} min, {prog.tokens:,} tokens)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
