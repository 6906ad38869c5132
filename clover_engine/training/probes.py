"""Probes of a model in training (docs/architecture.md §9): held-out masked-slot loss, a quick
tool-call decode, and the value-copy probe that `clover_engine.eval` also reports.

All run under ``torch.no_grad()`` and restore the model's train/eval mode.

Wing: ``training``.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import torch
import torch.nn.functional as F

from clover_engine.backbones.base import capabilities_of
from clover_engine.backbones.clover.model import CloverModel
from clover_engine.data.agent import argument_spans, eval_tasks, score_call
from clover_engine.data.open_tools import eval_turns
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig


@torch.no_grad()
def heldout_loss(model: CloverModel, batches: list[tuple[torch.Tensor, torch.Tensor, int]], use_window: bool,
                 with_accuracy: bool = False) -> float | tuple[float, float]:
    """Mean masked-slot cross-entropy (nats) on fixed held-out batches; with `with_accuracy`,
    also the share of masked slots whose argmax is the clean token (all masked at once: the
    first forward of a fully masked block)."""
    model.eval()
    tot, n, ok = 0.0, 0, 0
    dev = next(model.parameters()).device
    for clean, noisy, L in batches:
        clean, noisy = clean.to(dev), noisy.to(dev)
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


def _count_masked_hits(model, clean: torch.Tensor, noisy: torch.Tensor, which: list, block_size: int,
                       modes: list, hits: dict) -> dict:
    """One training-style forward of `noisy` ([1, T]) per memory mode; adds to ``hits[(mode, part)]``
    the [right, total] argmax predictions of ``clean`` at each part's indices (``which``: (part, idx)).
    Returns ``{mode: [T] int64 argmax ids}``."""
    preds = {}
    for mode, win in modes:
        h, _ = model.forward_train(clean, noisy, block_size, win)
        pred = preds[mode] = model.lm_head(h[0]).argmax(-1)
        for part, idx in which:
            hits[(mode, part)][0] += int((pred[idx] == clean[0, idx]).sum())
            hits[(mode, part)][1] += len(idx)
    return preds


def _accuracies(hits: dict) -> dict:
    """``{mode: {part: right / total}}`` from `_count_masked_hits`' tallies (rounded to 4 places)."""
    out: dict = {}
    for (mode, part), (ok, n) in sorted(hits.items()):
        out.setdefault(mode, {})[part] = round(ok / max(n, 1), 4)
    return out


@torch.no_grad()
def value_probe(model, tokenizer, n_tasks: int = 60, block_size: int = 32) -> dict:
    """Copy probe: the ground-truth call is in place, only its values (and the tool name) are
    masked, all at once, and one training-style forward predicts them (argmax).

    Isolates copying from structure: a model that has the layout but cannot copy scores only
    the predictable tokens (``USR-``, ``-``, digits by chance). Token accuracy (share of masked
    value tokens right) by source -- ``request``, ``tool_response``, ``repeat`` (``confirm_*``
    fields), ``name`` -- in both memory modes.

    Args:
        model: a `CloverModel`; tokenizer: its `tokenizers.Tokenizer`; n_tasks: held-out tasks
            (`eval_tasks`, seeds >= 10,000,000); block_size: blocks of the forward (1 =
            teacher-forced: each masked token sees every earlier token clean).

    Returns:
        ``{"window": {source: acc}, "state": {source: acc}}`` (accuracies in [0, 1]).
    """

    was_training = model.training
    model.eval()
    hits: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    modes = [("window", True), ("state", False)] if capabilities_of(model).runs("state+window") else [("state", False)]
    for t in eval_tasks(n=n_tasks):
        enc = tokenizer.encode(t.prompt + t.target)
        p0, tgt = len(t.prompt), t.target
        at = tgt.index('"name": "') + len('"name": "')
        spans = [("name", p0 + at, p0 + at + len(t.name))]
        for f, a, b in argument_spans(tgt, t.fields):
            spans.append(("repeat" if f.is_repeat_of_earlier_field else f.source, p0 + a, p0 + b))
        ids = enc.ids + [model.config.eos_token_id] * (-len(enc.ids) % block_size)
        clean = torch.tensor([ids])
        noisy = clean.clone()
        which = []
        for src, a, b in spans:
            idx = [j for j, (s0, s1) in enumerate(enc.offsets) if s0 < b and s1 > a]
            which.append((src, idx))
            noisy[0, idx] = model.config.mask_token_id
        _count_masked_hits(model, clean, noisy, which, block_size, modes, hits)
    model.train(was_training)
    return _accuracies(hits)


def name_key_tokens(tokenizer, turn) -> tuple:
    """The encoding of ``turn.prompt + turn.target`` and the token indices of its call's name
    and argument keys: ``(encoding, [("name_first", [i]), ("name_rest", [...]), ("keys", [...])])``
    (a token counts when it overlaps the span; keys of nested objects included)."""
    import re

    enc = tokenizer.encode(turn.prompt + turn.target)
    p0, tgt = len(turn.prompt), turn.target
    at = p0 + tgt.index('"name": "') + len('"name": "')
    name_idx = [j for j, (s0, s1) in enumerate(enc.offsets) if s0 < at + len(turn.name) and s1 > at]
    args_at = tgt.index('"arguments": ')
    key_spans = [(p0 + m.start(1), p0 + m.end(1)) for m in re.finditer(r'"([A-Za-z_][A-Za-z0-9_]*)": ', tgt)
                 if m.start() > args_at]
    key_idx = [j for j, (s0, s1) in enumerate(enc.offsets) if any(s0 < b and s1 > a for a, b in key_spans)]
    return enc, [("name_first", name_idx[:1]), ("name_rest", name_idx[1:]), ("keys", key_idx)]


@torch.no_grad()
def open_name_probe(model, tokenizer, n_tasks: int = 60) -> dict:
    """Teacher-forced probe of the open-vocabulary tool calls (`clover_engine.data.open_tools.eval_turns`,
    names and keys never seen in training): the ground-truth call is in place, its tool name and
    argument keys are masked, and a blocks-of-1 forward predicts each masked token from the clean
    text before it (argmax).

    Separates the two skills an unseen call needs: *picking* the tool (``name_first``: the
    name's first token, which only the request can decide among the listed tools) and *copying*
    it from the schema (``name_rest``: the name's later tokens; ``keys``: argument-key tokens).
    A model that copies but cannot pick scores high on the last two and near zero on the first.
    The first token is also the hardest to copy: after the opening quote it is a different
    token from the same letters after a space in the request (``re`` / `` re``); with
    clover-tiny's tokenizer it occurs in the request in 9 % of the eval calls, the later name
    tokens in 47 %; with the same vocabulary cut by the ``--isolate-spaces`` rule
    (`clover_engine.data.tokenizer.with_isolated_spaces`) the first token occurs there in 67 %.

    ``name_first`` needs its baseline: a model that always writes the most common first token
    (``re``: 12 of the first 54 eval calls) scores ``name_first_chance`` (0.222) without picking
    anything. ``name_first_listed`` is the share of first-token predictions that start *some*
    listed tool's name: high when the model picks among the schema's tools, low when it
    invents one.

    Args:
        model: a `CloverModel`; tokenizer: its `tokenizers.Tokenizer`; n_tasks: eval turns
            (turns that call no tool are skipped).

    Returns:
        ``{"window": {"name_first": acc, "name_rest": acc, "keys": acc, "name_first_listed": share,
        "name_first_chance": share}, "state": {...}}`` (in [0, 1]; ``window`` only for models with
        an attention window; the chance share is the same in both modes).
    """

    was_training = model.training
    model.eval()
    hits: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    modes = [("window", True), ("state", False)] if capabilities_of(model).runs("state+window") else [("state", False)]
    firsts: Counter = Counter()
    for t in eval_turns(n_tasks):
        if t.name is None:
            continue
        enc, which = name_key_tokens(tokenizer, t)
        clean = torch.tensor([enc.ids])
        noisy = clean.clone()
        for _, idx in which:
            noisy[0, idx] = model.config.mask_token_id
        preds = _count_masked_hits(model, clean, noisy, which, 1, modes, hits)
        i = which[0][1][0]  # the name's first token
        firsts[enc.ids[i]] += 1
        listed = _listed_first_tokens(enc, t.prompt)
        for mode, _ in modes:
            hits[(mode, "name_first_listed")][0] += int(int(preds[mode][i]) in listed)
            hits[(mode, "name_first_listed")][1] += 1
    model.train(was_training)
    out = _accuracies(hits)
    n = sum(firsts.values())
    for accs in out.values():
        accs["name_first_chance"] = round(max(firsts.values()) / n, 4) if n else 0.0
    return out


def _listed_first_tokens(enc, prompt: str) -> set[int]:
    """Ids of the first token of every tool name listed in the system turn of `prompt`
    (`enc` encodes `prompt` followed by the target)."""
    system_end = prompt.find("<|im_start|>user")
    starts = [m.end() for m in re.finditer(r'\{"name": "', prompt[:system_end if system_end >= 0 else len(prompt)])]
    return {enc.ids[j] for at in starts for j, (s0, s1) in enumerate(enc.offsets) if s0 <= at < s1}
