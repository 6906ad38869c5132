"""Every module in ``clover_engine/`` says in its docstring which wing it belongs to (``Wing: ``decoding``.``,
or ``(decoding wing)``), and the wing it names is the one its path puts it in -- the wings of
`docs/architecture.md` §1 and `tests/test_wings.py`, from the ground up: ``ground`` (units, threads,
tokenizer, examples, data/), ``recording``, ``backbones`` (with the checkpoint dispatch and the prompt
rule), ``cost``, ``decoding``, ``training`` / ``eval`` / ``experiments``, and ``entry points``
(the ``clover_engine`` package API and ``python -m clover_engine.generate | train | sweep | convert``).

Run: ``.venv/bin/python -m pytest tests/test_module_wings.py -q``
"""

from __future__ import annotations

import ast
import re

from test_import_graph import ROOT, discover_modules
from test_wings import floor_of

WING_NAMES: tuple[tuple[str, str], ...] = (  # module prefix -> wing; the longest matching prefix wins
    ("clover_engine.units", "ground"), ("clover_engine.threads", "ground"), ("clover_engine.tokenizer", "ground"),
    ("clover_engine.examples", "ground"), ("clover_engine.data", "ground"),
    ("clover_engine.recording", "recording"),
    ("clover_engine.backbones", "backbones"), ("clover_engine.checkpoint", "backbones"), ("clover_engine.prompting", "backbones"),
    ("clover_engine.cost", "cost"),
    ("clover_engine.decoding", "decoding"),
    ("clover_engine.training", "training"), ("clover_engine.eval", "eval"), ("clover_engine.experiments", "experiments"),
    ("clover_engine", "entry points"),
)
NAMED = re.compile(r"\bWing:?\s+``([a-z ]+)``|\b([a-z]+)\s+wing\b", re.IGNORECASE)


def wing_of(module: str) -> str:
    """The wing a dotted ``clover_engine`` module belongs to (longest prefix in `WING_NAMES`)."""
    hits = [(p, w) for p, w in WING_NAMES if module == p or module.startswith(p + ".")]
    assert hits, f"{module} is in no wing: add its prefix to WING_NAMES"
    return max(hits, key=lambda pw: len(pw[0]))[1]


def named_wings(docstring: str) -> set[str]:
    """The wings a docstring names (``Wing: ``x``.``, ``Wing ``x````, ``(x wing)``), lower case."""
    return {(a or b).lower() for a, b in NAMED.findall(docstring)}


def test_every_engine_module_names_its_wing():
    wrong = []
    for module, path in sorted(discover_modules(ROOT).items()):
        if not module.startswith("clover_engine"):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if wing_of(module) not in named_wings(doc):
            wrong.append(f"{path.relative_to(ROOT)}: its docstring should say 'Wing: ``{wing_of(module)}``.'")
    assert not wrong, "\n".join(wrong)


def test_the_names_agree_with_the_import_floors():
    """One wing, one floor of `tests/test_wings.py`: the two tables cannot drift apart."""
    floors: dict[str, set[int]] = {}
    for module in discover_modules(ROOT):
        if module.startswith("clover_engine"):
            floors.setdefault(wing_of(module), set()).add(floor_of(module))
    assert all(len(f) == 1 for f in floors.values()), floors
    assert named_wings("Wing: ``entry points``. Also (decoding wing).") == {"entry points", "decoding"}
