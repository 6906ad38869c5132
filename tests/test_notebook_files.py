"""The tutorials as stored in the repository: no machine's paths in their outputs, and small.

nbval (run on ``notebooks/``) checks that they execute; this checks what a reader downloads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_BYTES = 1_500_000  # stored figures are static images or stripped: a notebook stays well under this
ABSOLUTE = re.compile(r"(?<![\w.])/(?:root|home|Users|work|tmp)/[\w.-]+")


def test_there_are_tutorials():
    assert len(NOTEBOOKS) >= 5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_hold_no_absolute_paths_and_stay_small(path):
    text = path.read_text(encoding="utf-8")
    assert len(text.encode()) < MAX_BYTES, f"{path.name} is {len(text.encode()):,} bytes"
    nb = json.loads(text)
    outputs = json.dumps([c.get("outputs", []) for c in nb["cells"] if c["cell_type"] == "code"])
    found = ABSOLUTE.findall(outputs)
    assert not found, f"{path.name} stores absolute paths in its outputs: {sorted(set(found))[:5]}"
    assert str(ROOT) not in outputs
