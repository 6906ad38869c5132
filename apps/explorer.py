"""Clover Explorer from a clone: ``.venv/bin/panel serve apps/explorer.py --show``.

Wing: apps. A shim over the app module inside the package, `clover_viz.explorer` (the wheel carries that one;
``clover-explorer serve`` serves it): its docstring lists the environment variables and the serving
limits. Importable without serving (tests do): `create_app()` builds one session's template.
"""

from __future__ import annotations

import panel as pn

from clover_viz.explorer import (MAX_TRACE_UPLOAD_BYTES, MODEL_DIR, MODEL_ROOTS, TITLE, create_app, load_model,
                                  serve_session)

__all__ = ["MAX_TRACE_UPLOAD_BYTES", "MODEL_DIR", "MODEL_ROOTS", "TITLE", "create_app", "load_model", "serve_session"]

if pn.state.served:  # panel serve runs this file once per session
    serve_session()
