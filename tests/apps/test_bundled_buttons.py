"""The sidebar's bundled-model buttons show every model's full name (with four bundled models the one-row
button group squeezed the names into buttons narrower than their labels, which overlapped and were cut).

Needs ``/usr/bin/chromium`` (see ``tests/apps/conftest.py``); skips without it.

Run: ``.venv/bin/python -m pytest tests/apps/test_bundled_buttons.py -q``
"""

from __future__ import annotations

import pytest
from helpers import BROWSER_TIMEOUT_MS as TIMEOUT_MS

from clover_viz.models import bundled_models


def test_every_bundled_model_button_shows_its_whole_name_inside_the_sidebar(page):
    pg, _sessions = page
    names = bundled_models()
    if len(names) < 2:
        pytest.skip("fewer than two bundled models: nothing to lay out")
    boxes = {}
    for name in names:
        button = pg.get_by_role("button", name=name, exact=True).first
        button.wait_for(timeout=TIMEOUT_MS)
        scroll, client = button.evaluate("(e) => [e.scrollWidth, e.clientWidth]")
        assert scroll <= client, f"{name!r}: its label needs {scroll} px, the button is {client} px wide"
        boxes[name] = button.bounding_box()
    field = pg.get_by_label("Model directory").first.bounding_box()  # the sidebar's width
    for name, box in boxes.items():
        assert box["x"] >= field["x"] - 1 and box["x"] + box["width"] <= field["x"] + field["width"] + 12, name
    for a in names:  # no two buttons overlap
        for b in names:
            if a < b:
                x, y = boxes[a], boxes[b]
                apart = (x["x"] + x["width"] <= y["x"] + 1 or y["x"] + y["width"] <= x["x"] + 1
                         or x["y"] + x["height"] <= y["y"] + 1 or y["y"] + y["height"] <= x["y"] + 1)
                assert apart, f"{a!r} and {b!r} overlap: {x} {y}"
