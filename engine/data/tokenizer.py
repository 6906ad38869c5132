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

Build the shipped file (< 1 minute on 2 cores)::

    python -m engine.data.tokenizer --out models/clover-tiny/tokenizer.json --vocab-size 4096
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from engine.tokenizer import SPECIAL_TOKENS  # noqa: E402  (the one list; ids 0..7 here)

EOT_ID, MASK_ID, IM_START_ID, IM_END_ID = 0, 1, 2, 3
TOOL_CALL_ID, TOOL_CALL_END_ID, TOOL_RESPONSE_ID, TOOL_RESPONSE_END_ID = 4, 5, 6, 7


def _empty_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    """Train a byte-level BPE on `texts` (deterministic for the same texts).

    Args:
        texts: training documents.
        vocab_size: total size including the 8 special tokens and the 256 byte tokens.

    Returns:
        A `tokenizers.Tokenizer` with `SPECIAL_TOKENS` at ids 0..7.

    Raises:
        ValueError: if `vocab_size` cannot hold the specials and the byte alphabet.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(SPECIAL_TOKENS) + len(alphabet):
        raise ValueError(f"vocab_size must be >= {len(SPECIAL_TOKENS) + len(alphabet)} "
                         f"(8 specials + 256 bytes), got {vocab_size}")
    tok = _empty_tokenizer()
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
    from engine.data.agent import iter_conversations
    from engine.data.stdlib import iter_stdlib_text

    texts = [c.text + SPECIAL_TOKENS[0] for c in iter_conversations(seed, n_conversations)]
    total = 0
    for t in iter_stdlib_text("train", seed):
        if total >= stdlib_bytes:
            break
        texts.append(t)
        total += len(t.encode("utf-8"))
    return texts


def build_default_tokenizer(out_path: str | Path, vocab_size: int = 4096, seed: int = 0) -> Tokenizer:
    """Train on `default_training_texts(seed)` and save ``tokenizer.json`` at `out_path`."""
    tok = train_tokenizer(default_training_texts(seed), vocab_size=vocab_size)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_path))
    return tok


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="path of the tokenizer.json to write")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    tok = build_default_tokenizer(args.out, vocab_size=args.vocab_size, seed=args.seed)
    from engine.data.agent import iter_conversations

    sample = [c.text for c in itertools.islice(iter_conversations(args.seed), 200)]
    n_chars = sum(map(len, sample))
    n_tok = sum(len(e.ids) for e in tok.encode_batch(sample))
    print(f"wrote {args.out}: vocab {tok.get_vocab_size()}, conversations {n_chars / n_tok:.2f} chars/token")


if __name__ == "__main__":
    main()
