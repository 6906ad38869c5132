"""The open-vocabulary tool-call corpus: deterministic, exactly checkable, and the eval
split's names and keys never occur in training text.

Run: .venv/bin/python -m pytest tests/clover_engine/test_open_tools.py -q
"""

import itertools
import random
import re

import pytest

from clover_engine.data import open_tools as ot
from clover_engine.data.agent import parse_call


def _names_and_keys(turns):
    names, keys = set(), set()
    for t in turns:
        if t.name is None:
            continue
        names.add(t.name)
        stack = [t.arguments]
        while stack:
            d = stack.pop()
            keys.update(d)
            stack += [v for v in d.values() if isinstance(v, dict)]
    return names, keys


def test_deterministic():
    a = ot.generate_conversation(random.Random(7), "train")[0].text
    b = ot.generate_conversation(random.Random(7), "train")[0].text
    assert a == b
    assert [t.target for t in ot.eval_turns(30)] == [t.target for t in ot.eval_turns(30)]


def test_targets_score_exact_and_wrong_answers_do_not():
    for t in ot.eval_turns(200):
        assert ot.score_turn(t.target, t)["exact_match"], t.target
        if t.name is not None:
            wrong = t.target.replace(t.name, t.name + "X", 1)
            s = ot.score_turn(wrong, t)
            assert not s["exact_match"] and not s["name_correct"]
        else:
            assert not ot.score_turn('<tool_call>{"name": "x", "arguments": {}}</tool_call>', t)["name_correct"]


def test_eval_names_and_keys_never_in_training_text():
    names, keys = _names_and_keys(ot.eval_turns(200))
    assert len(names) > 100 and len(keys) > 30
    train_text = "\n".join(itertools.islice(ot.iter_train_texts(), 400))
    train_tokens = set(re.findall(r"[A-Za-z_]+", train_text))
    assert not names & train_tokens
    assert not keys & train_tokens


def test_every_call_copies_from_the_system_turn():
    """Names and keys of a call appear in the schema listed in its prompt; every request value
    is stated in the request (dates as ISO or in words, booleans in words)."""
    for t in ot.eval_turns(100):
        if t.name is None:
            continue
        system = t.prompt.split("<|im_start|>user")[0]
        assert f'"name": "{t.name}"' in system
        request = t.prompt.split("<|im_start|>user")[1]
        for f in t.fields:
            assert f'"{f.key}"' in system
            if f.source == "request" and isinstance(f.value, (str, int, float)) and not isinstance(f.value, bool) \
                    and f.kind != "date":
                assert str(f.value) in request, (f, request)


def test_mix_of_the_eval_set():
    turns = ot.eval_turns(200)
    cats = {c: sum(t.category == c for t in turns) for c in ("call", "chain", "no_tool")}
    assert cats["no_tool"] == 20 and cats["chain"] >= 10 and cats["call"] >= 100
    types = {f.kind for t in turns for f in t.fields}
    assert {"integer", "number", "boolean", "enum", "date", "array", "object", "code"} <= types
    assert any(t.natural for t in turns) and any(not t.natural for t in turns)
    assert all(parse_call(t.target)["arguments"] == t.arguments for t in turns if t.name is not None)


def test_bad_arguments():
    with pytest.raises(ValueError, match="split"):
        ot.generate_conversation(random.Random(0), "test")
    with pytest.raises(ValueError, match="n_rounds"):
        ot.generate_conversation(random.Random(0), "train", n_rounds=9)


def test_eval_summarises_open_tool_rows_by_group():
    from clover_engine.eval import format_table, summarise_open

    def row(cat, natural, exact, name):
        return dict(setting="bd32-window", task=0, text="", nfe=2, n_tokens=6, n_forced=1, wall_s=0.5,
                    exact_match=exact, json_valid=True, name_correct=name, fields=[], category=cat, natural=natural)

    rows = [row("call", True, True, True), row("call", False, False, True), row("chain", True, False, False),
            row("no_tool", False, True, True)]
    s = summarise_open(rows)
    assert s["exact_match"] == 0.5 and s["tokens_per_forward"] == 3.0
    assert s["by_group"]["call"] == {"n": 2, "exact_match": 0.5, "name_correct": 1.0}
    assert s["by_group"]["natural"] == {"n": 2, "exact_match": 0.5, "name_correct": 0.5}
    assert s["by_group"]["keyed"]["n"] == 1  # the no-tool turn is in neither phrasing group
    table = format_table({"agent": {}, "open_tools": {"bd32-window": s}})
    assert "open-vocabulary tools" in table and "chain exact / name" in table


def test_a_call_whose_values_cannot_all_differ_still_ends():
    """open-train-2640 draws a call whose arguments cannot all take distinct values (booleans, a small
    enum): the generator used to redraw forever -- it hung a training run on that conversation (its
    2,641st). It now keeps the value after `DISTINCT_TRIES` draws."""
    import random
    import signal

    from clover_engine.data.open_tools import generate_conversation

    def too_long(*_):
        raise TimeoutError("generate_conversation did not end")

    old = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(20)
    try:
        conv, turns = generate_conversation(random.Random("open-train-2640"), "train")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert turns and all(t.target.endswith("<|im_end|>") for t in turns)


def test_the_eval_split_is_frozen():
    """The eval tasks are the ones every earlier eval.json scored (sha256 of prompts + targets
    pinned when the training vocabulary grew): growing the training split must not move them."""
    import hashlib

    text = "\n".join(t.prompt + t.target for t in ot.eval_turns(200))
    assert hashlib.sha256(text.encode()).hexdigest() == \
        "09655cec401d86793aa6bc0d8c43e2c70b44d5681a51d24cff6a13b476bdc663"


def test_training_names_are_too_many_to_learn_by_heart():
    """Training tools are drawn from the harvested API vocabulary (clover_engine.data.open_words): 300
    conversations list hundreds of distinct names, most of them outside the small base lists,
    and keys / enums / values come from it too."""
    from clover_engine.data.open_words import load_words

    words = load_words()
    assert len(words["verbs"]) >= 200 and len(words["nouns"]) >= 800
    harvested = set(words["verbs"]) | set(words["nouns"])
    names, keys = set(), set()
    for i in range(300):
        _, turns = ot.generate_conversation(random.Random(f"open-train-{i}"), "train")
        n, k = _names_and_keys(turns)
        names |= n
        keys |= k
    assert len(names) > 250
    assert sum(any(w in harvested for w in re.split(r"_|(?=[A-Z])", n.lower() if "_" in n else n)) for n in names) \
        > len(names) // 2
    base_attrs = set(ot.ATTRS["train"])
    assert len({k for k in keys if not any(a in k.lower() for a in base_attrs)}) > 50


def test_harvested_words_stay_away_from_the_eval_vocabulary():
    from clover_engine.data.open_words import is_near, load_words

    words = load_words()
    ev = ot.eval_words()
    assert {"dispatch", "batch", "reservation", "tier"} <= ev
    assert not [w for w in words["verbs"] + words["nouns"] if is_near(w, ev)]
    # the stem rule catches inflections and derived forms, not unrelated words
    assert is_near("dispatcher", ev) and is_near("batches", ev) and is_near("reserved", {"reservation"})
    assert not is_near("merge", ev) and not is_near("config", ev)


def test_harvest_rule(tmp_path):
    """Verbs lead function names, nouns continue them; rare words, stop words and excluded
    (eval) words are dropped."""
    from clover_engine.data.open_words import harvest

    src = "".join(f"def merge_{n}(x):\n    pass\n" for n in ("lora", "graph", "model")) + \
        "def render_graph():\n    pass\ndef _render_model():\n    pass\ndef render_lora():\n    pass\n" + \
        "def dispatch_graph():\n    pass\n" * 1 + "def dispatch_model():\n    pass\ndef dispatch_lora():\n    pass\n" + \
        "class A:\n    def with_graph(self):\n        pass\n    def with_lora(self):\n        pass\n" \
        "    def with_model(self):\n        pass\n"
    (tmp_path / "a.py").write_text(src)
    out = harvest([tmp_path / "a.py"], exclude={"dispatch"})
    assert out == {"verbs": ["merge", "render"], "nouns": ["graph", "lora", "model"]}


def test_easy_open_conversations_list_one_or_two_tools():
    """`--open-easy-share`'s curriculum rows: 1 or 2 tools listed, one call, the name copied from
    the schema; n_tools outside 1..5 is refused."""
    from clover_engine.training.rows import open_tool_conversations

    convs = open_tool_conversations(seed=0, easy_share=1.0)
    for _ in range(20):
        conv = next(convs)
        system = conv.text.split("<|im_start|>user")[0]
        assert 1 <= system.count('{"name": "') <= 2 and len(conv.calls) <= 1
        for call in conv.calls:
            assert f'"name": "{call.name}"' in system
    mixed = open_tool_conversations(seed=0, easy_share=0.0)
    assert max(next(mixed).text.split("<|im_start|>user")[0].count('{"name": "') for _ in range(20)) > 2
    with pytest.raises(ValueError, match="n_tools"):
        ot.generate_conversation(random.Random(0), "train", n_tools=0)


def test_name_key_probe_masks_exactly_the_name_and_the_keys():
    """open_name_probe's spans: the name's tokens decode to the name (first token apart), the key
    tokens to the argument keys; on the bundled model the probe runs in both memory modes."""
    from clover_engine.checkpoint import load_model, load_tokenizer
    from clover_engine.training.probes import _listed_first_tokens, name_key_tokens, open_name_probe

    tok = load_tokenizer("models/clover-tiny")
    for t in [t for t in ot.eval_turns(12) if t.name is not None]:
        enc, which = name_key_tokens(tok, t)
        parts = dict(which)
        name = tok.decode([enc.ids[j] for j in parts["name_first"] + parts["name_rest"]])
        assert name.strip('"') == t.name and len(parts["name_first"]) == 1
        keys = tok.decode([enc.ids[j] for j in parts["keys"]])
        _, arg_keys = _names_and_keys([t])
        assert all(k in keys for k in arg_keys)
        assert set(parts["keys"]).isdisjoint(parts["name_first"] + parts["name_rest"])
        # the listed tools' first tokens: one per tool of the system turn, the called one among them
        listed = _listed_first_tokens(enc, t.prompt)
        n_tools = t.prompt.split("<|im_start|>user")[0].count('{"name": "')
        assert enc.ids[parts["name_first"][0]] in listed and 1 <= len(listed) <= n_tools
    out = open_name_probe(load_model("models/clover-tiny"), tok, 6)
    assert set(out) == {"window", "state"}
    assert set(out["window"]) == {"name_first", "name_rest", "keys", "name_first_listed", "name_first_chance"}
    assert all(0.0 <= v <= 1.0 for accs in out.values() for v in accs.values())
    # chance: the share of the most common first name token over the probed calls
    firsts = [name_key_tokens(tok, t) for t in ot.eval_turns(6) if t.name is not None]
    ids = [enc.ids[dict(which)["name_first"][0]] for enc, which in firsts]
    assert out["state"]["name_first_chance"] == round(max(ids.count(i) for i in ids) / len(ids), 4)


def test_made_up_words_are_pronounceable_far_from_eval_and_reach_training_names():
    """`pseudo_word` is a pure function of the rng, stays away from the eval vocabulary, and a
    share of training names and keys is made of such words (`PSEUDO_NAME_SHARE`, `PSEUDO_KEY_SHARE`),
    spreading the names' first letters far wider than the word lists do."""
    from clover_engine.data.open_words import MAX_LEN, MIN_LEN, is_near, load_words, pseudo_word

    ev = ot.eval_words()
    words = [pseudo_word(random.Random(i), ev) for i in range(500)]
    assert words == [pseudo_word(random.Random(i), ev) for i in range(500)]
    assert all(w.isascii() and w.isalpha() and w.islower() and MIN_LEN < len(w) < MAX_LEN for w in words)
    assert not [w for w in words if is_near(w, ev)]
    assert len(set(words)) > 450
    # with exclude, a word near an excluded one is redrawn
    assert not any(is_near(pseudo_word(random.Random(i), {w}), {w}) for i, w in enumerate(words[:50]))

    known = set(ot.VERBS["train"]) | set(ot.NOUNS["train"])
    made_up = total = 0
    firsts_made_up, firsts_known = set(), set()
    for i in range(400):
        tool = ot.make_tool(random.Random(f"pseudo-{i}"), "train", set())
        for w in (tool.verb, tool.noun):
            total += 1
            if w in known:
                firsts_known.add(w[:2])
            else:
                made_up += 1
                firsts_made_up.add(w[:2])
    assert abs(made_up / total - ot.PSEUDO_NAME_SHARE) < 0.06
    assert len(firsts_made_up - firsts_known) >= 10  # openings no listed word has
    _, turns = ot.generate_conversation(random.Random(5), "eval")
    assert all(t.name is None or {w.lower() for w in re.split(r"_|(?=[A-Z])", t.name) if w} <= ev for t in turns)


def test_train_turns_are_chatml_prompts_of_the_training_vocabulary_only():
    """`train_turns` (a drafter's tool-call distill prompts): deterministic ChatML chats ending at the
    assistant's turn, the eval mix of categories, and no eval tool name or key in them."""
    from clover_engine.training.causal_lm_data import distill_prompts, prompt_text

    turns = ot.train_turns(60)
    assert [t.prompt for t in turns] == [t.prompt for t in ot.train_turns(60)]
    assert len({t.prompt for t in turns}) == 60
    assert all(t.prompt.startswith("<|im_start|>system\n") and t.prompt.endswith("<|im_start|>assistant\n")
               for t in turns)
    assert sum(t.name is None for t in turns) == 6  # i % 10 == 9, as eval_turns
    eval_names, eval_keys = _names_and_keys(ot.eval_turns(200))
    names, keys = _names_and_keys(turns)
    assert names and not names & eval_names and not keys & eval_keys
    # a distill run passes the chat through as it is; a plain question goes into the chat template
    prompts = distill_prompts(None, 5, 0, "tools")
    assert prompts == [t.prompt for t in turns[:5]] and prompt_text(prompts[0]) == prompts[0]
    assert prompt_text("Why is the sky blue?").endswith("<|im_start|>user\nWhy is the sky blue?<|im_end|>\n"
                                                        "<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="'tools'"):
        distill_prompts(None, 5, 0, "nope")
    with pytest.raises(ValueError, match="n must be >= 0"):
        ot.train_turns(-1)
