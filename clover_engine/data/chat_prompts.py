"""Plain questions and instructions for adapting a chat model to block diffusion (training prompts).

`training_prompts(n, seed)` draws deterministic prompts from templates x topics
(explanations, facts, lists, short poems, how-tos, comparisons, synonyms and
opposites, short messages, arithmetic, translation, small Python functions). The base model's own greedy answers to them are the
self-distillation data of `clover_engine.training.causal_lm`. The evaluation prompts are a
separate, hand-written file (`EVAL_PROMPTS_FILE`) that this generator never
produces (tests check that the two sets are disjoint).

Wing: ``ground``.
"""

from __future__ import annotations

import random
from pathlib import Path

EVAL_PROMPTS_FILE = Path(__file__).with_name("chat_eval_prompts.txt")

TOPICS = (
    "photosynthesis", "gravity", "the water cycle", "volcanoes", "earthquakes", "rainbows", "the moon", "the sun",
    "black holes", "electricity", "magnets", "the human heart", "the brain", "sleep", "exercise", "vitamins",
    "bees", "dolphins", "elephants", "penguins", "owls", "cats", "dogs", "horses", "sharks", "butterflies",
    "ants", "tigers", "whales", "frogs", "the Amazon rainforest", "deserts", "glaciers", "oceans", "rivers",
    "mountains", "clouds", "thunderstorms", "snow", "wind energy", "solar panels", "batteries", "recycling",
    "plastic pollution", "climate change", "forests", "coffee", "tea", "bread", "cheese", "chocolate", "rice",
    "apples", "bananas", "tomatoes", "pizza", "the internet", "email", "smartphones", "computers", "robots",
    "artificial intelligence", "video games", "the printing press", "the wheel", "airplanes", "trains",
    "bicycles", "cars", "ships", "rockets", "satellites", "the Roman Empire", "ancient Egypt", "the Olympic Games",
    "music", "painting", "poetry", "libraries", "museums", "chess", "football", "basketball", "swimming",
    "running", "yoga", "meditation", "friendship", "kindness", "honesty", "teamwork", "time management",
    "saving money", "budgeting", "learning a language", "reading books", "writing essays", "public speaking",
    "job interviews", "gardening", "cooking pasta", "baking cookies", "camping", "hiking", "travel",
    "maps", "compasses", "clocks", "calendars", "the alphabet", "numbers", "fractions", "prime numbers",
    "triangles", "circles", "the Pythagorean theorem", "DNA", "cells", "bacteria", "viruses", "vaccines",
    "the immune system", "oxygen", "carbon dioxide", "water", "salt", "gold", "iron", "diamonds",
    "the periodic table", "atoms", "light", "sound", "heat", "friction", "energy", "the speed of light",
    "Python lists", "variables in programming", "loops in programming", "recursion", "databases",
    "passwords", "encryption", "spreadsheets", "the stock market", "inflation", "taxes", "democracy",
    "elections", "the United Nations", "Paris", "Tokyo", "London", "New York", "Egypt", "Brazil",
    "Canada", "Australia", "India", "Japan", "Italy", "Mexico", "Kenya", "Norway",
)

TEMPLATES = (
    "What is {t}?",
    "Explain {t} in simple terms.",
    "Give me three facts about {t}.",
    "Write a short poem about {t}.",
    "Why is {t} important?",
    "Describe {t} in one sentence.",
    "What are the main benefits of {t}?",
    "Write a haiku about {t}.",
    "How does {t} work?",
    "Tell me a fun fact about {t}.",
    "Explain {t} to a ten-year-old.",
    "Write two sentences about {t}.",
    "What should a beginner know about {t}?",
    "Summarize what {t} is in a few words.",
    "List three questions people often ask about {t}.",
    "Write a short story that mentions {t}.",
    "What is the history of {t}?",
    "Give an example related to {t}.",
    "What are common misconceptions about {t}?",
    "Write a tweet about {t}.",
)

PHRASES = (
    "good morning", "thank you very much", "where is the station", "I like to read", "the cat is sleeping",
    "see you tomorrow", "how are you", "it is raining today", "I am hungry", "happy birthday",
    "the book is on the table", "we are going to the beach", "what time is it", "my name is Anna",
)
LANGUAGES = ("French", "Spanish", "German", "Italian")

# Everyday instructions and short questions (kept apart from the hand-written eval prompts; a test checks).
WORDS = ("big", "fast", "bright", "brave", "quiet", "old", "smart", "strong", "early", "easy", "angry", "rich",
         "funny", "tiny", "calm", "wet", "loud", "sad", "kind", "clean")
NOUNS = ("child", "tooth", "knife", "leaf", "goose", "city", "box", "wolf", "potato", "person")
THINGS = ("a hammer", "a microscope", "a compass", "a calculator", "a telescope", "a ladder", "a kettle",
          "a bicycle pump", "an umbrella", "a stapler", "a lighthouse", "a windmill", "a dictionary", "a passport")
PEOPLE = ("a nurse", "a pilot", "a farmer", "a chef", "an architect", "a firefighter", "a dentist",
          "a journalist", "a plumber", "a scientist", "a mail carrier", "a judge")
OCCASIONS = ("a friend's birthday", "a new job", "a graduation", "a wedding", "a retirement", "a new baby")
SHORT = (
    "What is a synonym for {w}?", "What is the opposite of {w}?", "Use the word {w} in a sentence.",
    "What is the plural of {n}?", "What is {x} used for?", "What does {p} do at work?",
    "Write a one-line congratulation message for {o}.", "Give two tips for {t}.",
    "What is the difference between {t} and {u}?", "Compare {t} and {u} in two sentences.",
    "Suggest a title for an article about {t}.", "Write a short product description for {x}.",
    "How do I get started with {t}?", "Answer briefly: is {t} related to {u}?",
    "Name three things related to {t}.", "Write a friendly reminder about {t}.",
    "What is one advantage and one disadvantage of {t}?", "Give me a quick quiz question about {t}.",
    "Rewrite this sentence more politely: give me {x} now.", "Describe {x} without using its name.",
)

CODE_TASKS = (
    "returns the sum of a list of numbers", "checks whether a number is even", "reverses a string",
    "counts the vowels in a string", "returns the largest of three numbers", "computes the factorial of n",
    "checks whether a word is a palindrome", "returns the square of a number", "removes duplicates from a list",
    "converts Celsius to Fahrenheit", "returns the first n even numbers", "finds the minimum of a list",
    "counts words in a sentence", "joins a list of strings with commas", "returns the average of a list",
)


def training_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct training prompts, deterministic in ``seed``."""
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        r = rng.random()
        if r < 0.45:
            p = rng.choice(TEMPLATES).format(t=rng.choice(TOPICS))
            p = p[0].upper() + p[1:]
        elif r < 0.72:
            t, u = rng.sample(TOPICS, 2)
            p = rng.choice(SHORT).format(w=rng.choice(WORDS), n=rng.choice(NOUNS), x=rng.choice(THINGS),
                                         p=rng.choice(PEOPLE), o=rng.choice(OCCASIONS), t=t, u=u)
            p = p[0].upper() + p[1:]
        elif r < 0.82:
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            p = rng.choice((f"What is {a} plus {b}?", f"What is {a} times {b}?", f"Compute {a} minus {b}.",
                            f"If I have {a} apples and buy {b} more, how many do I have?"))
        elif r < 0.91:
            p = f"Translate '{rng.choice(PHRASES)}' into {rng.choice(LANGUAGES)}."
        else:
            p = f"Write a Python function that {rng.choice(CODE_TASKS)}."
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def eval_prompts() -> list[str]:
    """The fixed evaluation prompts (one per line of `EVAL_PROMPTS_FILE`, ``#`` lines skipped)."""
    lines = EVAL_PROMPTS_FILE.read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
