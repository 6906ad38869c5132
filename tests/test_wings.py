"""No upward imports: each module imports only its own wing and the wings below it
(`docs/architecture.md` §1), and no module is over 600 lines.

Wings, from the ground up: ground utilities and data (units, threads, tokenizer, examples, data/)
and kernels -> recording -> backbones (with checkpoint dispatch and the prompt rule) -> cost ->
decoding -> training / eval / experiments -> the entry points and the ``clover_engine`` package API ->
clover_viz -> apps and clover_explorer (the installed command). Imports inside a function count as well (`test_import_graph.imports_of`).

Run: ``.venv/bin/python -m pytest -q tests/test_wings.py``
"""

from __future__ import annotations

from test_import_graph import ROOT, discover_modules, import_graph

MAX_LINES = 600

WINGS: tuple[tuple[str, int], ...] = (  # module prefix -> floor; the longest matching prefix wins
    ("clover_kernels", 0),
    ("clover_engine.units", 0), ("clover_engine.threads", 0), ("clover_engine.tokenizer", 0), ("clover_engine.examples", 0),
    ("clover_engine.data", 0),
    ("clover_engine.recording", 1),
    ("clover_engine.backbones", 2), ("clover_engine.checkpoint", 2), ("clover_engine.prompting", 2),
    ("clover_engine.cost", 3),
    ("clover_engine.decoding", 4),
    ("clover_engine.training", 5), ("clover_engine.eval", 5), ("clover_engine.experiments", 5),
    ("clover_engine", 6),  # the package API and the entry points: generate, train, sweep, convert
    ("clover_viz", 7),
    ("apps", 8),
    ("clover_explorer", 8),  # the installed command: runs the engine's commands, serves the app
)


def floor_of(module: str) -> int:
    """The wing floor of a dotted module name (longest prefix in `WINGS`)."""
    best = None
    for prefix, floor in WINGS:
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, floor)
    if best is None:
        raise AssertionError(f"{module} is in no wing: add its prefix to WINGS")
    return best[1]


def test_no_module_imports_a_wing_above_its_own():
    graph = import_graph()
    upward = [f"{m} (floor {floor_of(m)}) -> {t} (floor {floor_of(t)}) at line {line}"
              for m, deps in sorted(graph.items()) for t, line in sorted(deps.items())
              if floor_of(t) > floor_of(m)]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_module_is_over_600_lines():
    long = {m: n for m, p in discover_modules().items()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by job): " + ", ".join(
        f"{m} ({n})" for m, n in sorted(long.items(), key=lambda kv: -kv[1]))


def test_every_module_is_in_a_wing():
    for m in discover_modules(ROOT):
        floor_of(m)
