"""The notebook `Explorer`'s plotly figure widgets, one plotly.js bundle per Explorer, and the
Explorers of each notebook cell.

Wing: front ends (`clover_viz`), below `clover_viz.widgets`.

* `_CarrierFigure` / `_StubFigure` -- ``go.FigureWidget``s whose widget state is what Python
  shows now (`_CurrentStateFigure`); the carrier holds plotly's widget bundle (~5 MB, built by
  `_plotly_bundle`), the stubs wait for the factory it publishes;
* `_live_widgets` -- ipywidgets' registry of open widgets (what an Explorer made, for `close`);
* `_cell_key` / `_register` -- a re-run cell closes the Explorers its previous run made.

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_widgets.py -q``
"""

from __future__ import annotations

import hashlib
import re
from copy import deepcopy
from pathlib import Path
from typing import Any

import plotly
import plotly.graph_objects as go


def _live_widgets() -> dict:
    """ipywidgets' registry of open widgets (model id -> widget)."""
    # deferred: ipywidgets is optional (the notebook front end only; the Panel app runs without it)
    from ipywidgets.widgets import widget as _w

    reg = getattr(_w, "_instances", None)
    return reg if reg is not None else _w.Widget.widgets


# Explorers by notebook cell: cell id -> (the execute request that made them, [explorers]). Re-running a
# cell replaces its output, so the widgets the previous run made are closed when the new run makes one.
_BY_CELL: dict[str, tuple[str, list[Any]]] = {}


def _cell_key() -> tuple[str, str] | None:
    """(cell id, execute-request id) of the notebook cell running now; None outside one (scripts, tests,
    front ends that send no cell id, widget callbacks)."""
    try:  # IPython is optional: present in a kernel, absent in the Panel app and scripts
        from IPython import get_ipython

        ip = get_ipython()
        parent = getattr(ip, "parent_header", None) or {}
        cell = (parent.get("metadata") or {}).get("cellId")
        msg = (parent.get("header") or {}).get("msg_id")
        if parent.get("header", {}).get("msg_type") != "execute_request":
            return None
        return (str(cell), str(msg)) if cell and msg else None
    except Exception:  # noqa: BLE001  (no IPython, or a shell without a parent header)
        return None


def _register(ex: Any) -> None:
    key = _cell_key()
    if key is None:
        return
    cell, msg = key
    prev_msg, exs = _BY_CELL.get(cell, (None, []))
    if prev_msg != msg:  # the cell ran again: its earlier explorers are no longer on screen
        for old in exs:
            old.close()
        exs = []
    exs.append(ex)
    _BY_CELL[cell] = (msg, exs)


# One plotly widget bundle per Explorer, not one per figure. plotly's FigureWidget carries the whole
# plotly.js widget bundle (~5 MB) in its ``_esm`` state, so every figure of an Explorer would put another
# copy into the notebook and over the websocket. The first figure (the block view, always on screen)
# carries the bundle, which also publishes its widget factory on ``globalThis`` under a name made from the
# bundle's hash; the other figures carry a few hundred bytes that wait for that factory and call it
# (anywidget calls a default-exported function once per widget model). Offline: nothing is fetched.
def _plotly_bundle() -> tuple[str, str] | None:
    """(the bundle publishing its factory, the stub the other figures carry); None when the bundle's
    export is not where it is expected (a plotly release that changed it: every figure then carries it)."""
    path = Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"
    try:
        src = path.read_text(encoding="utf-8")
    except OSError:
        return None
    exports = list(re.finditer(r"export\{([^{}]*?)\b([A-Za-z_$][\w$]*) as default\b([^{}]*)\}", src))
    if not exports:
        return None
    m = exports[-1]
    key = "__clover_plotly_widget_" + hashlib.sha1(src.encode()).hexdigest()[:16]
    carrier = f"{src[:m.start()]};globalThis[{key!r}]={m.group(2)};{src[m.start():]}"
    stub = (
        "const KEY = %r;\n"
        "function factory() {\n"
        "  return new Promise((resolve, reject) => {\n"
        "    const t0 = Date.now();\n"
        "    (function poll() {\n"
        "      const f = globalThis[KEY];\n"
        "      if (f) return resolve(f);\n"
        "      if (Date.now() - t0 > 600000) return reject(new Error('plotly widget bundle did not load'));\n"
        "      setTimeout(poll, 25);\n"
        "    })();\n"
        "  });\n"
        "}\n"
        "export default async () => (await factory())();\n" % key
    )
    return carrier, stub


_BUNDLE = _plotly_bundle()


class _CurrentStateFigure(go.FigureWidget):
    """A FigureWidget whose widget state is what the Python side shows *now*.

    plotly sends in-place updates (restyle / relayout / batch_update) to the front end as
    messages and the front end applies them to its own copy of ``_widget_data`` /
    ``_widget_layout``; the kernel-side traits keep the values of the last display. A view
    built later -- the page reloaded with the kernel alive, a second view of the cell, a
    view whose front end was not ready when the updates were sent -- is built from that
    stale state and shows the placeholder. Here the state a view is built from
    (`get_state`, answered to every ``request_state``) is read from the figure's current
    data and layout; nothing more is sent per update.
    """

    def get_state(self, key=None, drop_defaults=False):
        state = super().get_state(key, drop_defaults)
        if "_data" not in self.__dict__:  # the widget opens before plotly has built the figure
            return state
        current = {"_widget_data": lambda: deepcopy(self._data),
                   "_widget_layout": lambda: deepcopy(self._layout_obj._props)}
        for name, value in current.items():
            if name in state:
                to_json = self.trait_metadata(name, "to_json", self._trait_to_json)
                state[name] = to_json(value(), self)
        return state


def _figure_classes() -> tuple[type, type]:
    """(the figure class that carries the bundle, the class of the others)."""
    if _BUNDLE is None:
        return _CurrentStateFigure, _CurrentStateFigure
    carrier_esm, stub_esm = _BUNDLE

    class CarrierFigure(_CurrentStateFigure):
        _esm = carrier_esm

    class StubFigure(_CurrentStateFigure):
        _esm = stub_esm

    return CarrierFigure, StubFigure


_CarrierFigure, _StubFigure = _figure_classes()
