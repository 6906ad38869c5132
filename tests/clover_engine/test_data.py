"""Corpus builders and tokenizer (clover_engine.data): determinism, ground truth, copy property, splits.

Run: .venv/bin/python -m pytest tests/clover_engine/test_data.py -q
"""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path

import pytest

from clover_engine.data import stdlib
from clover_engine.data.agent import (
    EVAL_SEED_START,
    IM_END,
    dumps,
    eval_tasks,
    generate_conversation,
    iter_conversations,
    parse_call,
    score_call,
)
from clover_engine.data.tokenizer import SPECIAL_TOKENS, main as tokenizer_main, train_tokenizer, with_isolated_spaces

REPO = Path(__file__).resolve().parents[2]
SHIPPED_TOKENIZER = REPO / "models" / "clover-tiny" / "tokenizer.json"


@pytest.fixture(scope="module")
def convs():
    return list(iter_conversations(0, 200))


def _request(prompt: str) -> str:
    return prompt.split("<|im_start|>user\n", 1)[1].split(IM_END, 1)[0]


def _responses(prompt: str) -> list[str]:
    return re.findall(r"<tool_response>(.*?)</tool_response>", prompt)


# ----------------------------------------------------------------------------- agent corpus


def test_generator_is_deterministic(convs):
    again = [c.text for c in iter_conversations(0, 200)]
    assert again == [c.text for c in convs]
    assert generate_conversation(random.Random(7)).text == generate_conversation(random.Random(7)).text
    assert generate_conversation(random.Random(7)).text != generate_conversation(random.Random(8)).text
    assert len({c.text for c in convs}) == len(convs)


def test_layout_and_targets_parse(convs):
    for conv in convs:
        assert conv.text.startswith("<|im_start|>system\nYou are a helpful assistant with tools:\n")
        assert conv.text.endswith(IM_END)
        assert 1 <= len(conv.calls) <= 8
        for turn in conv.calls:
            assert turn.prompt.endswith("<|im_start|>assistant\n")
            assert conv.text.startswith(turn.prompt + turn.target)
            assert turn.target.startswith("<tool_call>") and turn.target.endswith("</tool_call>" + IM_END)
            assert parse_call(turn.target) == {"name": turn.name, "arguments": turn.arguments}
            assert turn.target == f"<tool_call>{dumps({'name': turn.name, 'arguments': turn.arguments})}</tool_call>{IM_END}"
            assert [f.key for f in turn.fields] == list(turn.arguments)


def _check_copies(conv, sources):
    for turn in conv.calls:
        request, responses = _request(turn.prompt), _responses(turn.prompt)
        for f in turn.fields:
            assert f.kind in ("string", "number", "date", "id", "name")
            assert str(f.value) in turn.prompt, (f, turn.prompt)
            if f.is_repeat_of_earlier_field:  # written under the repeated key (test below)
                assert dumps(f.value) in (request if f.source == "request" else "".join(responses))
            elif f.source == "request":
                assert re.search(rf"\b{re.escape(f.key)}(: | |=){re.escape(dumps(f.value))}", request), (f, request)
            else:
                # The clause of this call says "<key><sep>the <rkey> from the latest <tool> result":
                # that field of the latest response of <tool> must be the value.
                assert f.source == "tool_response"
                clause = re.split(r", then |, and finally ", request)[turn.index]
                m = re.search(rf"\b{re.escape(f.key)}(: | |=)the (\w+) from the latest (\w+) result", clause)
                assert m, (f, clause)
                rkey, tool = m.group(2), m.group(3)
                pairs = re.findall(r'<tool_call>\{"name": "(\w+)".*?<tool_response>(.*?)</tool_response>',
                                   turn.prompt, re.S)
                latest = [json.loads(r) for name, r in pairs if name == tool][-1]
                assert latest[rkey] == f.value and type(latest[rkey]) is type(f.value), (f, latest)
            sources[f.source] += 1


def test_every_value_is_copied_from_its_source(convs):
    sources = {"request": 0, "tool_response": 0}
    for conv in convs:
        _check_copies(conv, sources)
    assert sources["request"] > 0 and sources["tool_response"] > 0, sources


def test_repeat_fields_are_last_and_repeat(convs):
    repeats = 0
    for conv in convs:
        for turn in conv.calls:
            for i, f in enumerate(turn.fields):
                if f.is_repeat_of_earlier_field:
                    repeats += 1
                    assert i == len(turn.fields) - 1
                    assert f.key.startswith("confirm_")
                    assert any(g.value == f.value and g.source == f.source for g in turn.fields[:i])
    assert repeats >= 20


def test_fifty_round_chain():
    conv = generate_conversation(random.Random(123), n_rounds=50)
    assert len(conv.calls) == 50
    assert [t.index for t in conv.calls] == list(range(50))
    assert conv.text.count("<tool_call>") == 50 and conv.text.count("<tool_response>") == 50
    sources = {"request": 0, "tool_response": 0}
    _check_copies(conv, sources)
    assert sources["tool_response"] > 10, sources
    with pytest.raises(ValueError):
        generate_conversation(random.Random(0), n_rounds=51)


def test_seed_ranges_are_disjoint():
    with pytest.raises(ValueError):
        list(iter_conversations(EVAL_SEED_START - 2, 5))
    with pytest.raises(ValueError):
        eval_tasks(seed=0, n=1)
    tasks = eval_tasks(n=40)
    assert len(tasks) == 40
    assert any(t.index == 0 for t in tasks) and any(t.index > 0 for t in tasks)
    assert [t.target for t in tasks] == [t.target for t in eval_tasks(n=40)]


def test_score_call():
    turn = next(t for c in iter_conversations(0, 50) for t in c.calls
                if any(f.kind in ("number", "id", "date") for f in t.fields))
    ok = score_call(turn.target, turn)
    assert ok["exact_match"] and ok["text_exact"] and ok["json_valid"] and ok["name_correct"]
    assert all(f["correct"] for f in ok["fields"])
    # Change one digit of one value.
    i, f = next((i, f) for i, f in enumerate(turn.fields) if re.search(r"\d", str(f.value)))
    old = str(f.value)
    pos = re.search(r"\d", old).start()
    new = old[:pos] + str((int(old[pos]) + 1) % 10) + old[pos + 1:]
    args = dict(turn.arguments)
    args[f.key] = int(new) if isinstance(f.value, int) else new
    bad_text = f"<tool_call>{dumps({'name': turn.name, 'arguments': args})}</tool_call>{IM_END}"
    bad = score_call(bad_text, turn)
    assert not bad["exact_match"] and bad["json_valid"] and bad["name_correct"]
    assert [g["correct"] for g in bad["fields"]] == [j != i for j in range(len(turn.fields))]
    assert not score_call("<tool_call>{\"name\": ", turn)["json_valid"]
    assert parse_call("no call here") is None
    assert parse_call('<tool_call>{"name": "x", "arguments": []}</tool_call>') is None
    # A key written twice is malformed JSON for a tool call (json.loads would keep the last one).
    assert parse_call('<tool_call>{"name": "x", "arguments": {"a": 1, "a": 1}}</tool_call>') is None
    assert parse_call('<tool_call>{"name": "x", "arguments": {"a": {"b": 1}, "b": 1}}</tool_call>') is not None
    # A number written as a string is wrong: values compare with their JSON type.
    turn = next(t for c in iter_conversations(0, 50) for t in c.calls if any(f.kind == "number" for f in t.fields))
    args = {k: (str(v) if isinstance(v, int) else v) for k, v in turn.arguments.items()}
    assert not score_call(f"<tool_call>{dumps({'name': turn.name, 'arguments': args})}</tool_call>", turn)["exact_match"]


# ----------------------------------------------------------------------------- stdlib corpus


def test_stdlib_split():
    train, held = stdlib.stdlib_files("train"), stdlib.stdlib_files("heldout")
    assert train and held and not set(train) & set(held)
    assert 0.02 < len(held) / (len(train) + len(held)) < 0.10
    m1 = stdlib.manifest()
    stdlib._scan.cache_clear()
    m2 = stdlib.manifest()
    assert m1 == m2 and len(m1["sha256"]) == 64
    assert all(stdlib.split_of(rel) == "heldout" for rel in m1["heldout"])
    assert not any("site-packages" in rel for rel in m1["train"])
    text = next(stdlib.iter_stdlib_text("heldout", seed=1))
    assert text.endswith("<|endoftext|>")
    assert text == next(stdlib.iter_stdlib_text("heldout", seed=1))
    with pytest.raises(ValueError):
        stdlib.stdlib_files("test")


# ----------------------------------------------------------------------------- tokenizer


@pytest.fixture(scope="module")
def tiny_tok():
    texts = [c.text for c in iter_conversations(0, 20)]
    texts.append(Path(stdlib.__file__).read_text())
    return train_tokenizer(texts, vocab_size=300)


@pytest.fixture(scope="module")
def tiny_iso_tok():
    texts = [c.text for c in iter_conversations(0, 20)]
    texts.append(Path(stdlib.__file__).read_text())
    return train_tokenizer(texts, vocab_size=300, isolate_spaces=True)


def _tokenizers(*trained):
    toks = list(trained)
    if SHIPPED_TOKENIZER.exists():
        from tokenizers import Tokenizer
        shipped = Tokenizer.from_file(str(SHIPPED_TOKENIZER))
        toks += [shipped, with_isolated_spaces(shipped)]
    return toks


def test_tokenizer_round_trip_and_specials(tiny_tok, tiny_iso_tok):
    conv = generate_conversation(random.Random(99), n_rounds=3)
    samples = [conv.text, conv.calls[1].target, Path(stdlib.__file__).read_text(),
               "  x\t=\r\n  'ünïcödé' 😀 2024-03-17 ORD-48213 -17 <|mask|><|endoftext|>"]
    for tok in _tokenizers(tiny_tok, tiny_iso_tok):
        for i, t in enumerate(SPECIAL_TOKENS):
            assert tok.token_to_id(t) == i
            assert tok.encode(t).ids == [i]
        assert tok.encode("<tool_call>").ids == [4] and tok.encode("<|mask|>").ids == [1]
        assert tok.encode("<|im_end|>").ids == [3]
        for s in samples:
            assert tok.decode(tok.encode(s).ids) == s
        ids = tok.encode(conv.calls[0].target).ids
        assert ids[0] == 4 and ids[-2:] == [5, 3]
        # Digits are single tokens.
        assert tok.encode("2024").tokens == ["2", "0", "2", "4"]


def test_isolated_spaces_make_a_word_the_same_tokens_after_a_space_and_after_a_quote(tiny_tok, tiny_iso_tok):
    """The rule's point: `` reserve`` in a request and ``"reserve_table"`` in a call share the
    word's tokens, first piece included; the default rule merges the space into the word."""
    for tok in _tokenizers(tiny_iso_tok)[::2]:  # the trained one, and the shipped one converted
        word = tok.encode("reserve").ids
        space = tok.encode(" ").ids
        assert tok.encode("Please reserve it").ids == tok.encode("Please").ids + space + word + space + tok.encode("it").ids
        call = tok.encode('{"name": "reserve_table"}').ids
        assert any(call[i:i + len(word)] == word for i in range(len(call)))
        # Runs of spaces (indentation) are not cut one by one: the run, the lone last space, the word.
        assert [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("        return")] == ["Ġ" * 7, "Ġ", "return"]
    # The default rule: after a space the word's first token differs (the problem the rule fixes).
    assert tiny_tok.encode(" reserve").ids[0] != tiny_tok.encode("reserve").ids[0]


def test_with_isolated_spaces_keeps_every_id_and_refuses_other_tokenizers(tiny_tok, tiny_iso_tok):
    from clover_engine.tokenizer import byte_tokenizer

    iso = with_isolated_spaces(tiny_tok)
    assert iso.get_vocab(with_added_tokens=True) == tiny_tok.get_vocab(with_added_tokens=True)
    pieces = lambda tok: [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("Please reserve")]  # noqa: E731
    assert pieces(iso) == ["Please", "Ġ", "reserve"]
    assert pieces(tiny_tok) == ["Please", "Ġreserve"]  # the input is not changed in place
    twice = with_isolated_spaces(iso)
    assert twice.encode("a b  c").ids == iso.encode("a b  c").ids
    assert with_isolated_spaces(tiny_iso_tok).to_str() == tiny_iso_tok.to_str()
    with pytest.raises(ValueError, match="Digits, ByteLevel"):
        with_isolated_spaces(byte_tokenizer())


def test_tokenizer_cli_converts_a_tokenizer_and_refuses_from_alone(tmp_path, tiny_tok):
    src = tmp_path / "src.json"
    tiny_tok.save(str(src))
    out = tmp_path / "iso" / "tokenizer.json"
    tokenizer_main(["--out", str(out), "--isolate-spaces", "--from", str(src)])
    from tokenizers import Tokenizer
    assert Tokenizer.from_file(str(out)).encode(" go").ids == with_isolated_spaces(tiny_tok).encode(" go").ids
    with pytest.raises(SystemExit, match="--isolate-spaces"):
        tokenizer_main(["--out", str(tmp_path / "x.json"), "--from", str(src)])


def test_shipped_tokenizer_size():
    assert SHIPPED_TOKENIZER.exists(), "models/clover-tiny/tokenizer.json is shipped with the model"
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(SHIPPED_TOKENIZER))
    assert tok.get_vocab_size() == 4096
    added = json.loads(SHIPPED_TOKENIZER.read_text())["added_tokens"]
    assert [a["content"] for a in added] == list(SPECIAL_TOKENS)
