"""Every test that compares against stored expected outputs is marked ``stored_reference``, and CI runs those
twice: natively and on PyTorch's plain kernels (``ATEN_CPU_CAPABILITY=default``).

Stored answers that depend on the CPU's vectorised kernels (bf16 near ties flipping a router, say) pass on the
machine that wrote them and fail on any other. Rerunning the stored-reference tests on the plain kernels is the
cheapest stand-in for "another CPU": a new reference that depends on the kernel set fails in CI, not on the next
developer's machine. This module keeps the net whole: a new test module that reads the official code's answers
(``tests/data/*_fidelity.json``) or pins decoded tokens must carry the mark.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARK = "pytestmark = pytest.mark.stored_reference"
# what makes a test module a stored-reference test: it reads the official answers, or pins decoded tokens
READS_REFERENCE = re.compile(r"_fidelity\.json|^PINNED\s*=|EXAMPLE_CLAIMS", re.M)


def _test_modules() -> list[Path]:
    return sorted(p for p in (ROOT / "tests").rglob("test_*.py") if p.name != Path(__file__).name)


def test_every_module_that_reads_stored_answers_is_marked():
    readers = [p for p in _test_modules() if READS_REFERENCE.search(p.read_text())]
    assert len(readers) >= 6, [p.name for p in readers]  # the four fidelity modules, pinned decodes, claims
    unmarked = [str(p.relative_to(ROOT)) for p in readers if MARK not in p.read_text()]
    assert not unmarked, f"mark these with `{MARK}` (CI reruns them on plain kernels): {unmarked}"


def test_ci_reruns_the_marked_tests_on_plain_kernels():
    run = (ROOT / ".ci" / "run").read_text()
    rerun = [line for line in run.splitlines() if "ATEN_CPU_CAPABILITY=default" in line and not line.lstrip().startswith("#")]
    assert rerun and "-m stored_reference" in rerun[0], rerun
    assert "stored_reference" in (ROOT / "pyproject.toml").read_text()  # the mark is registered


@pytest.mark.parametrize("name", ["test_llada2_fidelity", "test_moe_fidelity", "test_masked_diffusion_fidelity",
                                  "test_block_diffusion_fidelity", "test_pinned_decodes", "test_example_claims"])
def test_the_known_reference_modules_carry_the_mark(name):
    assert MARK in (ROOT / "tests" / "clover_engine" / f"{name}.py").read_text()
