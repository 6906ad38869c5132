"""A large training vocabulary for open-vocabulary tool calls, harvested from real API names.

`clover_engine.data.open_tools` builds tool names, argument keys and values from word lists. With a
few dozen training words, every training name is one or two whole tokens the model can learn
by heart, and an unseen name (split into sub-word pieces it never had to copy) is out of
reach: clover-tiny trained on such lists still wrote its fixed tools' names for 60 / 60
unseen tools. A name the model has never seen can only be written by **copying** it from the
system turn, and copying is learned only when the training names are too many to memorise.

This module harvests those words from the function names (``def verb_noun_...``) of the
*training* packages of `clover_engine.data.packages` (numpy, torch, transformers, panel, ...):
the first word of a ``snake_case`` function name is the verb, the other words are nouns.
This is a real-looking API vocabulary (``get_config``, ``merge_lora``, ``render_schema``), so that
unseen-tool prompts read like real ones.

The list is shipped (``open_words.json``) so training text is the same on every machine,
whatever package versions are installed; ``python -m clover_engine.data.open_words`` regenerates it.

Disjointness from the evaluation split: a harvested word is dropped when it shares a stem
with any word of the eval vocabulary (`is_near`; "dispatch", "dispatcher" and "batches" are
dropped because "dispatch" and "batch" are eval words; the eval vocabulary is
`clover_engine.data.tool_words.eval_words`). `clover_engine.data.open_tools` asserts it at import.

Wing: ``ground``.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path

from clover_engine.data.packages import manifest, package_files
from clover_engine.data.tool_words import eval_words

WORDS_PATH = Path(__file__).with_name("open_words.json")
MIN_COUNT = 3  # a word must start (verb) or continue (noun) this many distinct function names
MIN_LEN, MAX_LEN = 3, 12
# function words and code abbreviations that are not verbs or nouns of an API request
STOP = frozenset("""
and the for with from into onto over under all any not are was were has have had can could should would
will may might must also then than else elif but its this that these those there here what when where which
who why how get set pre post non sub sup str int dict repr args kwargs func obj cls self impl util utils
tmp src dst idx num len val vals var vars ptr buf cfg ctx env eps fmt msg req res ret iter init attr attrs
isintent pytest dfs bfs xla npu cpu gpu cuda tpu mps hpu xpu dtype dtypes ndim nbytes
""".split())


def stem(word: str) -> str:
    """The word without a plural / verb ending (``es``, ``s``, ``ed``, ``ing``, ``er``, ``e``), for
    `is_near`; a crude stemmer, enough to catch "batches" ~ "batch" and "reserved" ~ "reserve"."""
    for suf in ("ing", "es", "ed", "er", "s", "e"):
        if word.endswith(suf) and len(word) - len(suf) >= 3:
            return word[: -len(suf)]
    return word


def is_near(word: str, others: set[str]) -> bool:
    """Whether `word` equals or shares a stem with any of `others` (lower-case words): equal
    stems, or one stem a prefix of the other's (``reserv`` / ``reservation``)."""
    s = stem(word)
    for o in others:
        t = stem(o)
        if s == t or (len(t) >= 3 and s.startswith(t)) or (len(s) >= 4 and t.startswith(s)):
            return True
    return False


# Pseudo-words ("quorbex", "flindat"): syllables from English onsets, vowels and codas. A tool
# named with one cannot be known from anywhere but its schema, and its first sub-word piece varies
# over the tokenizer's word-start pieces (see `pseudo_word`).
ONSETS = tuple("b bl br c ch cl cr d dr f fl fr g gl gr h j k l m n p ph pl pr qu r s sc sh sk sl sm sn sp "
               "st str sw t th tr v w wh z".split()) + ("",) * 4
NUCLEI = tuple("a e i o u a e i o u ai au ea ee ie oa oo ou".split())
CODAS = ("",) * 6 + tuple("n r s t l m nd nt st ck x rk ll ng mp".split())


def pseudo_word(rng, exclude: set[str] = frozenset(), syllables: tuple[int, int] = (2, 3)) -> str:
    """A pronounceable made-up word of 4-11 letters (``quorbex``), built from `ONSETS`,
    `NUCLEI` and `CODAS`.

    Why: a name's first sub-word piece in a call (``qu`` after the opening quote) is a different
    token id from the same piece in the request (`` qu`` after a space). With clover-tiny's
    tokenizer that piece is copyable from the request for 9 % of the eval split's calls against
    47 % for the name's later pieces, and 9 of its 20 verbs start with a piece no training verb
    starts with. Made-up words spread training names over the tokenizer's word-start pieces,
    so the space-to-quote correspondence is practised for pieces, not memorised for words.

    Args:
        rng: a ``random.Random`` (the only source of randomness).
        exclude: lower-case words a result must not be near (`is_near`): the eval vocabulary.
        syllables: inclusive range of syllables.

    Returns:
        A lower-case ASCII word.
    """
    while True:
        word = "".join(rng.choice(ONSETS) + rng.choice(NUCLEI) + rng.choice(CODAS)
                       for _ in range(rng.randint(*syllables)))
        if MIN_LEN + 1 <= len(word) <= MAX_LEN - 1 and word not in STOP and not is_near(word, exclude):
            return word


def harvest(files, exclude: set[str]) -> dict:
    """Verbs and nouns from the ``def`` names in `files`.

    Args:
        files: iterable of ``*.py`` paths (read as UTF-8, errors ignored).
        exclude: lower-case words whose near forms (`is_near`) are dropped -- the eval vocabulary.

    Returns:
        ``{"verbs": [...], "nouns": [...]}``, each sorted, ASCII letters only, `MIN_LEN`..`MAX_LEN`
        long, counted in at least `MIN_COUNT` function names, `STOP` words removed. A verb leads
        at least twice as many names as it continues (``get``, ``merge``; not ``index``); a verb
        is not also a noun.
    """
    first: collections.Counter = collections.Counter()
    rest: collections.Counter = collections.Counter()
    pattern = re.compile(r"^\s*def (_*[a-z][a-z0-9_]*)\s*\(", re.M)
    for path in files:
        text = Path(path).read_text(encoding="utf-8", errors="ignore")
        for name in set(pattern.findall(text)):
            parts = [w for w in name.strip("_").split("_") if w]
            if len(parts) < 2:
                continue
            first[parts[0]] += 1
            rest.update(parts[1:])

    def keep(w: str, c: int) -> bool:
        return (c >= MIN_COUNT and w.isascii() and w.isalpha() and MIN_LEN <= len(w) <= MAX_LEN
                and w not in STOP and any(v in w for v in "aeiouy") and not is_near(w, exclude))

    verbs = sorted(w for w, c in first.items() if keep(w, c) and c >= 2 * rest[w])  # mostly leads a name
    nouns = sorted(w for w, c in rest.items() if keep(w, c) and w not in set(verbs))
    return {"verbs": verbs, "nouns": nouns}


def load_words() -> dict:
    """The shipped word lists: ``{"source": str, "verbs": [...], "nouns": [...]}``.

    Raises:
        FileNotFoundError: ``open_words.json`` is missing; regenerate it with
            ``python -m clover_engine.data.open_words``.
    """
    if not WORDS_PATH.is_file():
        raise FileNotFoundError(f"{WORDS_PATH} is missing; regenerate it with: python -m clover_engine.data.open_words")
    return json.loads(WORDS_PATH.read_text(encoding="utf-8"))


def main(argv=None) -> None:
    """CLI: harvest the training packages' function names into ``open_words.json``."""
    ap = argparse.ArgumentParser(prog="python -m clover_engine.data.open_words", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(WORDS_PATH), help="JSON file to write (default %(default)s)")
    args = ap.parse_args(argv)
    words = harvest(package_files("train"), eval_words())
    m = manifest()
    versions = {name: info["version"] for name, info in m["packages"].items() if info["split"] == "train"}
    out = {"source": "def names of clover_engine.data.packages TRAIN_PACKAGES (python -m clover_engine.data.open_words)",
           "packages": versions, "corpus_sha256": m["sha256"], **words}
    Path(args.out).write_text(json.dumps(out, indent=0) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(words['verbs'])} verbs, {len(words['nouns'])} nouns")


if __name__ == "__main__":
    main()
