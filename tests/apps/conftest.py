"""Fixtures of the browser tests: the explorer served in-process, a headless Chromium page on it.

Each test module gets its own server (`served_app` is module-scoped). A module chooses the
app's settings by defining a module-scoped ``app_settings`` fixture (default: the random
``clover-test`` with the dev option, 32 new tokens -- seconds per decode).

Needs ``/usr/bin/chromium`` (``apt-get install -y chromium``; `.ci/run` installs it); without it
the tests skip, saying so.
"""

from __future__ import annotations

import importlib.util
import logging
import socket
import time
from pathlib import Path

import pytest
from helpers import BROWSER_TIMEOUT_MS, CHROMIUM_ARGS, chromium_or_skip, free_port

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_MS = BROWSER_TIMEOUT_MS


@pytest.fixture(scope="module")
def app_settings() -> dict:
    """`create_app` keyword arguments for this module's server (override per module)."""
    return dict(model_dir="clover-test", dev_sharpen_random=True, max_new_tokens=32)


def _load_app_module():
    spec = importlib.util.spec_from_file_location("clover_explorer_app_browser", ROOT / "apps" / "explorer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def served_app(app_settings):
    pytest.importorskip("panel")
    chromium = chromium_or_skip()
    import panel as pn

    app_module = _load_app_module()
    port = free_port()
    sessions = []

    def make():
        tpl = app_module.create_app(**app_settings)
        sessions.append(tpl.explorer.state)
        return tpl

    records: list = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep(level=logging.WARNING)
    logging.getLogger().addHandler(keep)
    server = pn.serve(make, port=port, address="127.0.0.1", websocket_origin=[f"127.0.0.1:{port}"],
                      threaded=True, show=False, title="Clover Explorer test")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the server thread binds the port
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield Served(f"http://127.0.0.1:{port}/", chromium, sessions, records, server)
    logging.getLogger().removeHandler(keep)
    for st in sessions:
        st.close()
    try:
        server.stop()
    except RuntimeError:  # a test stopped it already (the disconnected page)
        pass


class Served(tuple):
    """(url, chromium, sessions) plus ``records``: WARNING+ log records of the server, and ``server``
    (a module's last test may stop it: the disconnected page)."""

    def __new__(cls, url, chromium, sessions, records, server=None):
        obj = super().__new__(cls, (url, chromium, sessions))
        obj.records = records
        obj.server = server
        return obj


@pytest.fixture
def page(served_app):
    from playwright.sync_api import sync_playwright

    url, chromium, sessions = served_app
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 1000})
            pg.set_default_timeout(TIMEOUT_MS)
            pg.requests = []  # every URL the page asked for (the offline check)
            pg.on("request", lambda r: pg.requests.append(r.url))
            pg.on("requestfailed", lambda r: pg.requests.append("FAILED " + r.url))
            pg.goto(url, timeout=TIMEOUT_MS)
            yield pg, sessions
        finally:
            browser.close()


