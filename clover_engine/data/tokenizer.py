"""Byte-level BPE for the bundled model, with fixed special-token ids.

Special tokens, ids 0..7 in this order (atomic: never split, never merged)::

    0 <|endoftext|>   1 <|mask|>   2 <|im_start|>   3 <|im_end|>
    4 <tool_call>     5 </tool_call>   6 <tool_response>   7 </tool_response>

The model config uses ``mask_token_id=1`` and ``eos_token_id=3`` (``<|im_end|>``: generation
stops at the end of the assistant turn). The tokens are stored as *added tokens with
``special: false``*: still atomic, but ``tokenizer.decode(ids)`` keeps them (its default
``skip_special_tokens=True`` would otherwise drop the tags that `parse_call` needs), so
``decode(encode(s).ids) == s`` for every string s.

Pre-tokenization: digits split one per token (``Digits(individual_digits=True)``), so
numbers, ids and dates are copied digit by digit, then GPT-2 ByteLevel (no prefix space).

``isolate_spaces=True`` (``--isolate-spaces``) adds one rule in front: a single space before a
non-space character is its own token, never merged into the word after it. Then a word is the
same tokens after a space (in a request: `` reserve``) and after a quote or an underscore (in a
call: ``"reserve_table"``), so copying a name's or a value's first word from the request is the
same lookup as copying its later words. GPT-2 style BPE merges the space into the word (``Ġre``
vs ``re``); runs of spaces (indentation) stay whole.

Build the shipped file (< 1 minute on 2 cores)::

    python -m clover_engine.data.tokenizer --out models/clover-tiny/tokenizer.json --vocab-size 4096

Wing: ``ground``.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from clover_engine.tokenizer import SPECIAL_TOKENS  # noqa: E402  (the one list; ids 0..7 here)
from clover_engine.data.agent import iter_conversations
from clover_engine.data.stdlib import iter_stdlib_text

EOT_ID, MASK_ID, IM_START_ID, IM_END_ID = 0, 1, 2, 3
TOOL_CALL_ID, TOOL_CALL_END_ID, TOOL_RESPONSE_ID, TOOL_RESPONSE_END_ID = 4, 5, 6, 7


# A single space followed by a non-space: its own pre-token (the `isolate_spaces` rule).
LONE_SPACE = r" (?=[^\s])"


def _pre_tokenizer(isolate_spaces: bool = False) -> pre_tokenizers.PreTokenizer:
    steps = [pre_tokenizers.Digits(individual_digits=True),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if isolate_spaces:
        steps.insert(0, pre_tokenizers.Split(Regex(LONE_SPACE), behavior="isolated"))
    return pre_tokenizers.Sequence(steps)


def _empty_tokenizer(isolate_spaces: bool = False) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer(isolate_spaces)
    tok.decoder = decoders.ByteLevel()
    return tok


def with_isolated_spaces(tokenizer: Tokenizer) -> Tokenizer:
    """The same vocabulary and merges with the `isolate_spaces` pre-tokenizer in front.

    For continuing a model trained with the default rule: every id keeps its meaning (the same
    embedding rows), only the way text is cut changes (merges that start with a space go unused).

    Args:
        tokenizer: a tokenizer from `train_tokenizer` (this module's pre-tokenizer).

    Returns:
        A new `tokenizers.Tokenizer`; `tokenizer` is not changed.

    Raises:
        ValueError: if `tokenizer` is not byte-level BPE with this module's pre-tokenizer.
    """
    spec = json.loads(tokenizer.to_str())
    pre = spec.get("pre_tokenizer") or {}
    steps = [p.get("type") for p in pre.get("pretokenizers", [])]
    if steps not in (["Digits", "ByteLevel"], ["Split", "Digits", "ByteLevel"]):  # the second: already isolated
        raise ValueError(f"expected this module's pre-tokenizer (Digits, ByteLevel), got {steps or pre.get('type')}; "
                         "build the tokenizer with clover_engine.data.tokenizer")
    out = Tokenizer.from_str(tokenizer.to_str())
    out.pre_tokenizer = _pre_tokenizer(isolate_spaces=True)
    return out


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, isolate_spaces: bool = False) -> Tokenizer:
    """Train a byte-level BPE on `texts` (deterministic for the same texts).

    Args:
        texts: training documents.
        vocab_size: total size including the 8 special tokens and the 256 byte tokens.
        isolate_spaces: keep a single space before a word as its own token (module docstring).

    Returns:
        A `tokenizers.Tokenizer` with `SPECIAL_TOKENS` at ids 0..7.

    Raises:
        ValueError: if `vocab_size` cannot hold the specials and the byte alphabet.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(SPECIAL_TOKENS) + len(alphabet):
        raise ValueError(f"vocab_size must be >= {len(SPECIAL_TOKENS) + len(alphabet)} "
                         f"(8 specials + 256 bytes), got {vocab_size}")
    tok = _empty_tokenizer(isolate_spaces)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=list(SPECIAL_TOKENS), initial_alphabet=alphabet)
    tok.train_from_iterator(texts, trainer=trainer)
    # Keep the tags in decoded text: same ids, atomic, but not "special" for skip_special_tokens.
    spec = json.loads(tok.to_str())
    for entry in spec["added_tokens"]:
        entry["special"] = False
        entry["normalized"] = False
    tok = Tokenizer.from_str(json.dumps(spec))
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    return tok


def default_training_texts(seed: int = 0, n_conversations: int = 3000,
                           stdlib_bytes: int = 8_000_000) -> list[str]:
    """The tokenizer's training mix: synthetic conversations (seeds seed..seed+n-1, all below
    EVAL_SEED_START) plus stdlib train-split files in a seeded order up to `stdlib_bytes`."""

    texts = [c.text + SPECIAL_TOKENS[0] for c in iter_conversations(seed, n_conversations)]
    total = 0
    for t in iter_stdlib_text("train", seed):
        if total >= stdlib_bytes:
            break
        texts.append(t)
        total += len(t.encode("utf-8"))
    return texts


def build_default_tokenizer(out_path: str | Path, vocab_size: int = 4096, seed: int = 0,
                            isolate_spaces: bool = False) -> Tokenizer:
    """Train on `default_training_texts(seed)` and save ``tokenizer.json`` at `out_path`."""
    tok = train_tokenizer(default_training_texts(seed), vocab_size=vocab_size, isolate_spaces=isolate_spaces)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_path))
    return tok


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m clover_engine.data.tokenizer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="path of the tokenizer.json to write")
    ap.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size in tokens (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the training texts drawn (default %(default)s)")
    ap.add_argument("--isolate-spaces", action="store_true",
                    help="a single space before a word is its own token (the word's tokens do not depend on it)")
    ap.add_argument("--from", dest="from_", type=Path, default=None,
                    help="with --isolate-spaces: keep this tokenizer's vocabulary and merges, change only the "
                         "pre-tokenizer (to continue a model trained with it)")
    args = ap.parse_args(argv)
    if args.from_ is not None:
        if not args.isolate_spaces:
            raise SystemExit("error: --from only changes the pre-tokenizer; add --isolate-spaces")
        tok = with_isolated_spaces(Tokenizer.from_file(str(args.from_)))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        tok.save(str(args.out))
    else:
        tok = build_default_tokenizer(args.out, vocab_size=args.vocab_size, seed=args.seed,
                                      isolate_spaces=args.isolate_spaces)

    sample = [c.text for c in itertools.islice(iter_conversations(args.seed), 200)]
    n_chars = sum(map(len, sample))
    n_tok = sum(len(e.ids) for e in tok.encode_batch(sample))
    print(f"wrote {args.out}: vocab {tok.get_vocab_size()}, conversations {n_chars / n_tok:.2f} chars/token")


if __name__ == "__main__":
    main()
