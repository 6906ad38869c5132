"""Clover Explorer: watch block-diffusion decoding fill in, block by block.

Serve it::

    clover-explorer serve --show                   # installed from the wheel (`clover_viz.cli`)
    .venv/bin/panel serve apps/explorer.py --show  # in a clone (``bash .ci/install`` first): the same app

Wing: front ends (`clover_viz`); the app module inside the package, so the wheel carries it; served at /explorer
(``apps/explorer.py`` is a shim over it). Each browser session gets its own
`clover_viz.state.ExplorerState`: decoding runs in a worker thread that only
queues events; a periodic callback started for the session drains them into the
view (the block visibly fills in) and advances playback; it is stopped, and a
running decode cancelled, when the session ends.

Environment:

* ``CLOVER_MODEL_DIR`` -- model directory (default ``models/clover-tiny``; while it
  holds no trained model, a random ``clover-test`` model stands in, labelled so).
* ``CLOVER_TORCH_THREADS`` -- torch CPU threads for decoding (else ``OMP_NUM_THREADS``, else 1: the models
  here are small, and on a shared 2-core machine more threads fight each other
  -- measured 0.4 s vs 30 s for the same decode under load).
* ``CLOVER_DEVICE`` -- torch device to decode on (default ``cpu``; ``cuda`` on a GPU machine).
* ``CLOVER_DEV_SHARPEN=1`` -- development option: start with the random model's
  weights multiplied by 15 so that its confidences look like a trained model's.
* ``CLOVER_MODEL_ROOTS`` (``os.pathsep``-separated) or ``--args --model-root DIR`` (repeatable) -- where
  a visitor may load models from (default: ``./runs`` and ``./models`` of the start directory; the
  bundled models always). Paths outside are refused with one message (`clover_viz.limits`).
* ``CLOVER_MAX_UPLOAD_MB`` -- largest trace upload (default 12; above ~15 also pass
  ``--websocket-max-message-size`` to ``panel serve``: `clover_viz.limits.websocket_bytes_for`).

Serving to others (a class): README, "Serving the explorer to others" -- model roots, memory checked
before a load, the upload limit, one decode per session, at most `MODEL_CACHE_SIZE` models loaded.

Importable without serving (tests do): `create_app()` builds one session's template.
Layout follows the Panel gallery order: constants -> extension -> cached model
loading -> views -> template -> ``servable()`` only when served.
"""

from __future__ import annotations

import functools
import os
import sys
import logging
import threading
import time
from typing import Any

# ------------------------------------------------------------------------------ constants
TITLE = "Clover Explorer · block-diffusion decoding"
ACCENT = "#0f766e"
TICK_MS = 100  # periodic drain / playback period per session
TAB_GONE_S = 1.0  # a session without a connection this long has lost its tab: its decode stops
TORCH_THREADS = int(os.environ.get("CLOVER_TORCH_THREADS") or os.environ.get("OMP_NUM_THREADS") or "1")
DEV_SHARPEN = os.environ.get("CLOVER_DEV_SHARPEN", "") not in ("", "0")

import panel as pn  # noqa: E402

from clover_viz.limits import (  # noqa: E402
    MAX_TRACE_UPLOAD_BYTES,
    model_roots,
    upload_limit_for_socket,
    websocket_limit_bytes,
)
from clover_viz.models import DEFAULT_MODEL_DIR, LoadedModel, ModelSpec, bundled_dir, load_model_cached  # noqa: E402
from clover_viz.panel_controls import release_js_callbacks  # noqa: E402
from clover_viz.panel_connection import watch_connection  # noqa: E402
from clover_viz.panel_views import ExplorerApp  # noqa: E402
from clover_viz.serving import exit_promptly_on_signals  # noqa: E402
from clover_viz.state import ExplorerState  # noqa: E402
from panel.io.resources import CDN_DIST  # noqa: E402
from panel.theme.fast import Fast  # noqa: E402

MODEL_DIR = os.environ.get("CLOVER_MODEL_DIR", DEFAULT_MODEL_DIR)
# where visitors may load models from: --model-root (after --args) / CLOVER_MODEL_ROOTS, else ./runs, ./models
MODEL_ROOTS = model_roots(sys.argv[1:] if pn.state.served else (), bundled=bundled_dir())

# ------------------------------------------------------------------------------ extension
pn.extension("plotly", notifications=True, sizing_mode="stretch_width")


class OfflineFast(Fast):
    """Panel's Fast design without its web font (Open Sans from fonts.googleapis.com), so the page
    requests nothing beyond this server and works offline (the system sans-serif is used).

    Its own script is named by its bundled URL: a relative one resolves against the class name.
    """

    _resources = {
        **Fast._resources,
        "font": {},
        "js_modules": {**Fast._resources["js_modules"], "fast-design": f"{CDN_DIST}bundled/fast/js/fast_design.js"},
    }


# ------------------------------------------------------------------------------ cached model loading
def load_model(spec: ModelSpec, cancel: threading.Event | None = None) -> LoadedModel:
    """One model per spec for the whole server process (the cache of `clover_viz.models`: at most
    `MODEL_CACHE_SIZE` loaded, the least recently used unloaded first), refused before loading when
    its weights would not fit in the free memory; ``cancel`` (the session closed) gives the load up.

    Sessions share the model; decoding never mutates it. Serving also pins torch to
    `TORCH_THREADS` CPU threads.
    """
    import torch

    if TORCH_THREADS > 0 and torch.get_num_threads() != TORCH_THREADS:
        torch.set_num_threads(TORCH_THREADS)
    return load_model_cached(spec, cancel=cancel, check_memory=True)


# ------------------------------------------------------------------------------ views + template
def create_app(model_dir: str | None = None, dev_sharpen_random: bool | None = None,
               start_callbacks: bool = True, loader: Any = None, model_roots: Any = None,
               **settings: Any) -> pn.template.FastListTemplate:
    """Build one session: state, views, template; start its periodic callback when served.

    Served, the session's models load in a background thread (`ExplorerState.start_load`): a
    first load (SmolLM2: about a minute) shows its progress and never stalls the server's other
    sessions. Unserved (tests, scripts), the model loads before this returns.

    Args:
        model_dir: model directory (default `MODEL_DIR`).
        dev_sharpen_random: the dev option of `ExplorerState` (default from ``CLOVER_DEV_SHARPEN``).
        start_callbacks: start the per-session periodic callback (needs a server session).
        loader: ``ModelSpec -> LoadedModel`` (default `load_model`: the process-wide cache, given up
            when the session closes).
        model_roots: where models may be loaded from (default `MODEL_ROOTS`).
        **settings: other `ExplorerState` parameters (``max_new_tokens=32`` ...; ``max_upload_bytes``
            defaults to `MAX_TRACE_UPLOAD_BYTES`).
    """
    closed = threading.Event()  # set when the session ends: its load under way is given up
    settings.setdefault("max_upload_bytes", MAX_TRACE_UPLOAD_BYTES)
    state = ExplorerState(
        loader=loader or functools.partial(load_model, cancel=closed), model_dir=model_dir or MODEL_DIR,
        dev_sharpen_random=DEV_SHARPEN if dev_sharpen_random is None else dev_sharpen_random,
        model_roots=MODEL_ROOTS if model_roots is None else model_roots, **settings,
    )
    served = start_callbacks and pn.state.curdoc is not None and pn.state.curdoc.session_context is not None
    if served:
        state.background_loads = True
        state.paced_decodes = True  # a decode runs at most about one refresh ahead of its page
        state.start_load()
    else:
        state.load_model()
    app = ExplorerApp(state=state)
    template = pn.template.FastListTemplate(
        title=TITLE, sidebar=[app.sidebar], main=[app.main], sidebar_width=360, accent=ACCENT,
        header_background=ACCENT, main_layout=None, theme_toggle=False, design=OfflineFast,
        busy_indicator=None,  # the periodic drain would keep it spinning; the app shows its own progress
    )
    template.explorer = app  # for tests and scripting
    if served:
        watch_connection(pn.state.curdoc)  # a lost server: banner, controls off, status says so
        context = pn.state.curdoc.session_context
        seen = {"connected": False, "lost_at": None}

        def tick() -> None:
            # A closed tab: the server destroys its session only after a quiet period (15 s and
            # more); until then every tick would push to a closed websocket and log a warning.
            # Once the page has gone for a second, end the session's work here.
            session = getattr(context, "_session", None)
            connections = getattr(session, "connection_count", 1)
            if connections:
                seen.update(connected=True, lost_at=None)
            elif seen["connected"]:
                now = time.monotonic()
                seen["lost_at"] = seen["lost_at"] or now
                if now - seen["lost_at"] > TAB_GONE_S:
                    end_session(None)
                return
            app.tick(TICK_MS / 1000)

        callback = pn.state.add_periodic_callback(tick, period=TICK_MS)

        def arm_uploads() -> None:
            # the page is drawn: refuse files over the limit in the browser, and within what this
            # server's websocket carries (panel serve --websocket-max-message-size; Bokeh's default 20 MB)
            socket = websocket_limit_bytes(context)
            limit = state.max_upload_bytes
            if socket is not None and limit is not None and upload_limit_for_socket(socket) < limit:
                limit = upload_limit_for_socket(socket)
            app.sidebar.arm_upload_limit(limit)

        pn.state.onload(arm_uploads)

        # Names the session's end uses, bound now: served as the script itself (``clover-explorer serve``), this
        # module's globals are the session's, and Panel clears them when it destroys the session -- before the
        # destroyed-callbacks run (a global looked up then is "not defined").
        release, log, ended = release_js_callbacks, logging.getLogger("clover_viz.explorer"), []

        def end_session(_context: Any) -> None:
            closed.set()
            callback.stop()
            state.close()
            n = release(app.sidebar, app.main)  # Panel's registry would keep the whole session alive
            if not ended:  # once per session (a closed tab ends it here first, then the server destroys it)
                ended.append(True)
                log.info("Clover Explorer: a session ended: its work stopped, %d JS callbacks released", n)

        pn.state.on_session_destroyed(end_session)
    return template


def serve_session() -> None:
    """What ``panel serve`` runs per session: prompt exit on signals (once per process), then this
    session's app, servable, with the model roots of the served script's arguments.

    The roots are read here, while ``panel serve`` runs the script with its ``--args`` in ``sys.argv``:
    `MODEL_ROOTS`, read when this module was first imported, saw them only when this module was the
    served script itself (``clover-explorer serve``), not when ``apps/explorer.py`` imported it."""
    exit_promptly_on_signals()  # SIGTERM / Ctrl-C end the server within 2 s, even mid-forward (once per process)
    # the server's log (INFO, beside Bokeh's own connection lines) says when a session ended and was released
    logging.getLogger("clover_viz.explorer").setLevel(logging.INFO)
    create_app(model_roots=model_roots(sys.argv[1:], bundled=bundled_dir())).servable(title=TITLE)


if pn.state.served and __name__ != "clover_viz.explorer":  # run as the served script, not imported (the shim)
    serve_session()
