"""Self-instruct prompts: user questions and requests the base model writes itself, for distillation data
broader than `clover_engine.data.chat_prompts`'s templates.

Wing: ``ground``.

Why: a drafter trained on the base's answers to templated prompts drafts those well and unseen plain
questions badly (measured on `models/smollm2-drafter`: 1.57 tokens per base forward on held-out
templated prompts, 1.20 on the hand-written plain questions of `chat_prompts.eval_prompts`, 12 each,
same run). The base asked for "questions people often ask about <category>" writes varied, natural
questions (the recipe of Self-Instruct, Wang et al. 2023, arXiv:2212.10560, without its seed tasks or
filtering model): sampled at temperature 0.8, split into lines, cleaned, de-duplicated and kept only
if they are not one of the evaluation prompts.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable

CATEGORIES = (
    "cooking", "baking", "personal finance", "saving money", "investing", "world history", "ancient history",
    "the human body", "nutrition", "sleep", "mental health", "fitness", "running", "learning a language",
    "grammar", "writing essays", "travel", "camping", "gardening", "house plants", "pets", "dogs", "cats",
    "birds", "the ocean", "space", "planets", "physics", "chemistry", "biology", "geology", "weather",
    "climate", "electricity", "cars", "bicycles", "trains", "airplanes", "computers", "the internet",
    "smartphones", "Python programming", "JavaScript", "databases", "spreadsheets", "math homework",
    "fractions", "geometry", "statistics", "job interviews", "careers", "starting a business", "marketing",
    "public speaking", "friendship", "parenting", "school", "university", "music", "playing the guitar",
    "painting", "photography", "movies", "books", "poetry", "chess", "football", "basketball", "tennis",
    "the Olympics", "geography", "capital cities", "famous inventors", "famous scientists", "philosophy",
    "ethics", "economics", "law", "elections", "recycling", "energy", "renewable energy", "first aid",
    "medicine", "vaccines", "dinosaurs", "insects", "trees", "rivers", "mountains", "deserts", "holidays",
    "festivals", "fashion", "home repair", "cleaning", "time management", "productivity", "video games",
    "board games", "social media", "online safety", "robots", "artificial intelligence",
)
"""Broad subjects a chat assistant is asked about (hand-picked; none taken from the evaluation prompts)."""

REQUESTS = (
    "Write {k} different questions people often ask about {c}. Number them.",
    "Write {k} short requests someone might send to an assistant about {c}. Number them.",
    "List {k} things a beginner might ask an expert in {c}. Number them.",
    "Write {k} simple questions a student could ask about {c}. Number them.",
    "Write {k} instructions starting with 'Explain', 'Describe', 'Give' or 'Write' about {c}. Number them.",
)
"""The requests that make the base write prompts (``{k}`` prompts about category ``{c}``)."""

_NUMBERED = re.compile(r"^\s*(?:\d{1,2}[.)]|[-*•])\s*(.+?)\s*$")


def parse_prompts(text: str) -> list[str]:
    """The numbered (or bulleted) lines of a generation, cleaned: markdown emphasis and surrounding
    quotes removed; kept only if 15-160 characters long, with at least three words, and ending like a
    question or a request (``?``, ``.`` or ``!``; a final line cut mid-sentence is dropped)."""
    out = []
    for line in text.splitlines():
        m = _NUMBERED.match(line)
        if not m:
            continue
        p = m.group(1).replace("**", "").strip().strip('"').strip()
        if not 15 <= len(p) <= 160 or len(p.split()) < 3 or p[-1] not in "?.!":
            continue
        out.append(p[0].upper() + p[1:])
    return out


def self_instruct_prompts(n: int, seed: int, generate: Callable[[list[str]], list[str]], batch: int = 16,
                          exclude: Iterable[str] = (), progress: Callable[[int], None] | None = None) -> list[str]:
    """``n`` distinct prompts written by the base, deterministic in ``seed`` and the generator.

    Args:
        n: prompts wanted.
        seed: seed of the (category, request) draw (the generator's own sampling seed is the caller's).
        generate: ``fn(user_turns) -> texts``: the base's sampled answers to each request (one user turn
            each), e.g. `clover_engine.training.causal_lm_data.sampled_answers`.
        batch: requests per ``generate`` call.
        exclude: prompts never to return (the evaluation prompts), compared case- and space-insensitively.
        progress: called with the number of prompts kept so far after each call.

    Raises:
        RuntimeError: after 50 calls in a row that add no new prompt (the generator writes no lists).
    """
    rng = random.Random(seed)
    norm = lambda s: " ".join(s.lower().split())  # noqa: E731
    banned = {norm(p) for p in exclude}
    out: list[str] = []
    seen: set[str] = set()
    idle = 0
    while len(out) < n:
        requests = [rng.choice(REQUESTS).format(k=rng.choice((8, 10, 12)), c=rng.choice(CATEGORIES))
                    for _ in range(batch)]
        before = len(out)
        for text in generate(requests):
            for p in parse_prompts(text):
                key = norm(p)
                if key in seen or key in banned:
                    continue
                seen.add(key)
                out.append(p)
        idle = idle + 1 if len(out) == before else 0
        if idle >= 50:
            raise RuntimeError("the generator wrote no new numbered prompts in 50 calls; check its output")
        if progress is not None:
            progress(min(len(out), n))
    return out[:n]
