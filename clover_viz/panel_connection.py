"""The served page's disconnected state: when the websocket to the server is lost (the server stopped,
restarted or crashed, the network dropped), the page says so and stops pretending to work.

Wing: front ends (`clover_viz`), the Panel app. Bokeh announces a lost connection in the browser with
the document event ``connection_lost``; `watch_connection` attaches a small script to it that

* shows a banner across the top -- "Disconnected from the server ..." -- with a **Reload page** button
  (a new page opens a new session; the old session's state is gone with the server);
* disables every control of the page (buttons, sliders, inputs, pickers; Panel renders them inside
  shadow roots, which the script walks) so that nothing looks clickable that cannot work;
* rewrites the status line (``.clover-status``) from "decoding..." / "loading..." to the disconnected
  state, with ``data-running="0"`` and ``data-loading="0"``, and marks ``<body data-clover-disconnected="1">``.

Nothing runs on the server for this: the server is what is gone.

Tests: ``.venv/bin/python -m pytest tests/apps/test_serve_sigterm.py tests/apps/test_browser_first_minutes.py -q``
"""

from __future__ import annotations

from typing import Any

from bokeh.models import CustomJS

DISCONNECTED_STATUS = "disconnected from the server: this page no longer decodes or updates -- reload it"
"""What the status line reads once the connection is lost."""

BANNER_TEXT = ("Disconnected from the server. This page can no longer decode or update, and its controls are "
               "off. Reload the page to start a new session (if the server was restarted, a reload reconnects).")

_ON_CONNECTION_LOST_JS = """
if (document.body.dataset.cloverDisconnected === "1") { return; }
document.body.dataset.cloverDisconnected = "1";
const walk = (root, fn) => {
  for (const el of root.querySelectorAll("*")) {
    fn(el);
    if (el.shadowRoot) { walk(el.shadowRoot, fn); }
  }
};
walk(document, (el) => {
  const tag = el.tagName;
  if (["BUTTON", "INPUT", "SELECT", "TEXTAREA"].includes(tag) && !el.closest(".clover-disconnected")) {
    el.disabled = true;
    el.setAttribute("aria-disabled", "true");
  }
  if (el.classList && el.classList.contains("noUi-target")) {  // noUiSlider: no disabled property
    el.setAttribute("disabled", "true");
    el.style.pointerEvents = "none";
  }
  if (el.classList && el.classList.contains("clover-status")) {
    el.textContent = STATUS;
    el.dataset.running = "0";
    el.dataset.loading = "0";
    el.dataset.disconnected = "1";
  }
});
const banner = document.createElement("div");
banner.className = "clover-disconnected";
banner.setAttribute("role", "alert");
banner.style.cssText = "position:fixed;top:0;left:0;right:0;z-index:100000;background:#b91c1c;color:#fff;" +
  "font:15px/1.4 sans-serif;padding:10px 16px;display:flex;gap:16px;align-items:center;" +
  "box-shadow:0 2px 6px rgba(0,0,0,.3)";
const text = document.createElement("span");
text.textContent = BANNER;
const reload = document.createElement("button");
reload.type = "button";
reload.textContent = "Reload page";
reload.style.cssText = "font:inherit;font-weight:600;padding:4px 12px;border-radius:4px;border:0;" +
  "background:#fff;color:#b91c1c;cursor:pointer;flex:none";
reload.addEventListener("click", () => window.location.reload());
banner.append(text, reload);
document.body.appendChild(banner);
"""


def watch_connection(doc: Any) -> None:
    """Attach the disconnected state (module docstring) to a served page's Bokeh document.

    Args:
        doc: the session's ``bokeh.document.Document`` (``pn.state.curdoc``); None (not served) is a no-op.
    """
    if doc is None:
        return
    doc.js_on_event("connection_lost", CustomJS(
        args=dict(STATUS=DISCONNECTED_STATUS, BANNER=BANNER_TEXT), code=_ON_CONNECTION_LOST_JS))
