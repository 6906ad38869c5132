"""``panel serve apps/explorer.py --args --model-root DIR``: the roots of the served script's arguments reach
every session. The module-level `clover_viz.explorer.MODEL_ROOTS` is read when the module is first imported,
and the ``apps/explorer.py`` shim imports it outside the served script's ``sys.argv`` patch, so a root given
after ``--args`` was dropped (a tiny LLaDA-MoE under it was refused as outside the model folders).

Run: ``.venv/bin/python -m pytest tests/apps/test_serve_model_roots.py -q``
"""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("panel")


def test_the_served_scripts_model_roots_reach_every_session(monkeypatch, tmp_path):
    import clover_viz.explorer as explorer

    made: dict = {}

    class Servable:
        def servable(self, title: str) -> None:
            made["title"] = title

    def create_app(**kwargs):
        made.update(kwargs)
        return Servable()

    monkeypatch.setattr(explorer, "create_app", create_app)
    monkeypatch.setattr(explorer, "exit_promptly_on_signals", lambda: None)
    # what bokeh's script handler puts in sys.argv while it runs the served script with --args
    monkeypatch.setattr(sys, "argv", ["apps/explorer.py", "--model-root", str(tmp_path / "teacher-models")])
    assert (tmp_path / "teacher-models").resolve() not in explorer.MODEL_ROOTS  # imported outside the patch
    explorer.serve_session()
    assert (tmp_path / "teacher-models").resolve() in made["model_roots"], made["model_roots"]
    assert made["title"] == explorer.TITLE
