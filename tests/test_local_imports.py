"""Function-local imports of first-party modules (clover_engine, clover_viz, clover_kernels) say why they are local.

The rule (issue 36): an import sits at module level, where a reader sees the module's dependencies
at once, unless it is an optional heavy dependency (transformers, peft, triton, torch.distributed,
...) or importing it at module level would cost a light module seconds; then the import line (or
the comment line just above it) carries ``# local: <reason>``. A first-party import inside a function
without that comment fails here, as does a ``# local:`` with no reason. (Import cycles are
`tests/test_import_graph.py`'s job: it counts function-local imports as edges too, so hoisting one
never hides or creates a cycle.)

`PENDING` lists the few that are still to be hoisted in modules another change has in flight;
an entry that no longer matches an import fails, so the list only shrinks.

Run: ``.venv/bin/python -m pytest tests/test_local_imports.py -q``
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("clover_engine", "clover_viz", "clover_kernels", "apps", "clover_explorer")
FIRST_PARTY = ("clover_engine", "clover_viz", "clover_kernels", "clover_explorer")

PENDING: dict[tuple[str, str], str] = {}
"""(file, imported module) -> where it is: function-local first-party imports without a reason yet."""


def _first_party(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        mods = ["." * node.level + (node.module or "")]
    else:
        mods = [a.name for a in node.names]
    return [m for m in mods if m.startswith(".") or m.split(".")[0] in FIRST_PARTY]


def local_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, reason or "") of every first-party import inside a function of ``path``."""
    src = path.read_text(encoding="utf-8")
    lines = src.splitlines()
    out = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                above = lines[child.lineno - 2] if child.lineno > 1 else ""
                span = [above if above.lstrip().startswith("#") else "", *lines[child.lineno - 1:child.end_lineno]]
                marked = [line.split("# local:", 1)[1].strip() for line in span if "# local:" in line]
                for mod in _first_party(child):
                    out.append((child.lineno, mod, marked[0] if marked else None))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(src, filename=str(path)), False)
    return out


def _scan() -> dict[tuple[str, str], list[tuple[int, str | None]]]:
    found: dict[tuple[str, str], list[tuple[int, str | None]]] = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT).as_posix()
            for line, mod, reason in local_imports(path):
                found.setdefault((rel, mod), []).append((line, reason))
    return found


def test_function_local_first_party_imports_say_why():
    found = _scan()
    bare = [f"{f}:{line} imports {m} inside a function without '# local: <reason>' (hoist it to module level)"
            for (f, m), sites in found.items() if (f, m) not in PENDING for line, reason in sites if reason is None]
    empty = [f"{f}:{line}: '# local:' names no reason" for (f, _), sites in found.items()
             for line, reason in sites if reason == ""]
    assert not bare + empty, "\n".join(bare + empty)
    stale = [k for k in PENDING if not any(r is None for _, r in found.get(k, []))]
    assert not stale, f"PENDING entries with no such import left (delete them): {stale}"


def test_the_check_sees_an_unmarked_import(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n    from clover_engine.threads import x\n\n\ndef g():\n"
                                   "    # local: why\n    import clover_engine.cost\n    import numpy\n"
                                   "    from clover_kernels import y  # local:\n")
    assert local_imports(tmp_path / "m.py") == [(2, "clover_engine.threads", None), (7, "clover_engine.cost", "why"),
                                                (9, "clover_kernels", "")]
