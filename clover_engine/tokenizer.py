"""Tokenizer helpers (the `tokenizers` library; no hub downloads) and the project's one list
of special tokens.

`SPECIAL_TOKENS` is the chat layout's vocabulary of special tokens, in id order: the bundled
model's BPE (`clover_engine.data.tokenizer`) gives them ids 0..7, `byte_tokenizer()` ids 256..263.
Which one ends generation is the model config's ``eos_token_id`` (the bundled model:
``<|im_end|>``; the byte-level ``clover-test`` preset: ``<|endoftext|>``), never a name here.

`byte_tokenizer()` builds the fallback byte-level tokenizer used by the ``clover-test``
preset: one token per byte (ids 0..255, GPT-2 byte alphabet) followed by `SPECIAL_TOKENS`.

Wing: ``ground``.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKENS = (
    "<|endoftext|>", "<|mask|>", "<|im_start|>", "<|im_end|>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
)


def byte_tokenizer() -> Tokenizer:
    """A byte-level tokenizer without merges: ids 0..255 are bytes, then specials.

    Returns:
        `tokenizers.Tokenizer` of 264 tokens; ``<|endoftext|>`` is id 256 and ``<|mask|>`` id 257
        (the ``clover-test`` preset's eos/mask ids).
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # ByteLevel maps byte b to a printable char; order the vocab by byte value.
    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet), "ByteLevel alphabet mismatch"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    assert tok.token_to_id("<|endoftext|>") == 256 and tok.token_to_id("<|mask|>") == 257
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map (as used by ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}
