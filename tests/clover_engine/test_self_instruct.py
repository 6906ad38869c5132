"""Self-instruct prompts (clover_engine.data.self_instruct): parsing the base's numbered lists, de-duplication,
the evaluation prompts kept out, determinism, and a generator that writes no lists stopping with a message."""

from __future__ import annotations

import pytest

from clover_engine.data.chat_prompts import eval_prompts
from clover_engine.data.self_instruct import parse_prompts, self_instruct_prompts


def test_parse_keeps_numbered_questions_and_drops_the_rest():
    text = ("Here are some questions:\n\n1. What is the best way to save money?\n2) **How do I bake bread?**\n"
            "- Explain how a bicycle gear works.\n3. Why?\n4. What are the best ways to avoid infla")
    assert parse_prompts(text) == ["What is the best way to save money?", "How do I bake bread?",
                                   "Explain how a bicycle gear works."]


def test_prompts_are_distinct_deterministic_and_never_an_eval_prompt():
    held_out = eval_prompts()[0]

    def fake(requests):  # echoes each request's category into questions, plus one evaluation prompt
        return [f"1. {held_out}\n2. What should I know about {r.split('about ')[-1].split('.')[0]}?\n"
                f"3. What should I know about {r.split('about ')[-1].split('.')[0]}?" for r in requests]

    a = self_instruct_prompts(20, 7, fake, batch=4, exclude=eval_prompts())
    assert len(a) == 20 == len({p.lower() for p in a}) and held_out not in a
    assert a == self_instruct_prompts(20, 7, fake, batch=4, exclude=eval_prompts())


def test_a_generator_without_lists_stops_with_a_message():
    with pytest.raises(RuntimeError, match="no new numbered prompts"):
        self_instruct_prompts(5, 0, lambda rs: ["I cannot help with that."] * len(rs), batch=2)
