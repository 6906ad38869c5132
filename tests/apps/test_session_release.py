"""A closed session of the served explorer is freed whole (issue: memory flat across sessions).

Panel keeps every widget's browser callbacks (``jscallback`` / ``jslink``) in a process-wide
``WeakKeyDictionary`` keyed by the widget; the callbacks' ``args`` (the upload-notice box) reach back to the
widget and, through its watchers, to the session's state, so the key never died and every closed session
stayed in memory (about 3.5 MB each in ``benchmarks/soak_sessions.py``). The served app's session end calls
`clover_viz.panel_controls.release_js_callbacks`; here, on an app built outside a server, the state stays
alive without it and is collected with it.

Run: ``.venv/bin/python -m pytest tests/apps/test_session_release.py -q``
"""

from __future__ import annotations

import gc
import weakref

import pytest

pytest.importorskip("panel")


def _app():
    from clover_viz.panel_views import ExplorerApp
    from clover_viz.state import ExplorerState

    state = ExplorerState(model_dir="clover-test", max_new_tokens=8)
    return ExplorerApp(state=state), state


def test_an_app_whose_callbacks_are_released_is_collected_and_one_whose_are_not_is_kept():
    from panel.links import Callback

    from clover_viz.panel_controls import release_js_callbacks

    kept_app, kept_state = _app()
    kept = weakref.ref(kept_state)
    kept_state.close()
    del kept_app, kept_state
    gc.collect()
    assert kept() is not None  # what every closed session did: Panel's registry holds it

    app, state = _app()
    freed = weakref.ref(state)
    state.close()
    n = release_js_callbacks(app.sidebar, app.main)
    assert n >= 4  # the upload box, the discrete slider's inner slider, the sliders with keys ...
    assert not any(obj in Callback.registry for obj in app.sidebar.__panel__().select())
    del app, state
    gc.collect()
    assert freed() is None
