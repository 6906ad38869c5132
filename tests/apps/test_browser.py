"""The explorer in a real browser: headless Chromium (Debian's package) driven by Playwright.

Serves `apps/explorer.py`'s `create_app` in-process on a free port, loads it, types a
prompt, clicks Generate, waits for the block cells to fill and the NFE to show, moves
the threshold slider with the keyboard (the slider re-decodes on release), and checks
that the displayed NFE changes and the previous run is kept for comparison.

The model is the random ``clover-test`` with the dev option (weights x15), so that
confidences spread and the threshold matters; 32 new tokens keep it to seconds.

Needs ``/usr/bin/chromium`` (``apt-get install -y chromium``; `.ci/run` installs it).
Without it the test is skipped, saying so.

Run: ``.venv/bin/python -m pytest tests/apps/test_browser.py -q``
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
TIMEOUT_MS = 45_000  # per wait; the whole test is bounded by these waits


def _chromium() -> str | None:
    for cand in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_app_module():
    spec = importlib.util.spec_from_file_location("clover_explorer_app_browser", ROOT / "apps" / "explorer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def served_app():
    pytest.importorskip("panel")
    pytest.importorskip("playwright.sync_api")
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no chromium executable found (install Debian's package: apt-get install -y chromium)")
    import panel as pn

    app_module = _load_app_module()
    port = _free_port()
    sessions = []

    def make():
        tpl = app_module.create_app(model_dir="clover-test", dev_sharpen_random=True, max_new_tokens=32)
        sessions.append(tpl.explorer.state)
        return tpl

    server = pn.serve(make, port=port, address="127.0.0.1", websocket_origin=[f"127.0.0.1:{port}"],
                      threaded=True, show=False, title="Clover Explorer test")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the server thread binds the port
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/", chromium, sessions
    for st in sessions:
        st.close()
    server.stop()


@pytest.fixture
def page(served_app):
    from playwright.sync_api import sync_playwright

    url, chromium, sessions = served_app
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 1000})
            pg.set_default_timeout(TIMEOUT_MS)
            pg.goto(url, timeout=TIMEOUT_MS)
            yield pg, sessions
        finally:
            browser.close()


def _nfe(pg) -> str:
    return pg.locator(".clover-nfe").first.inner_text().strip()


def _wait_done(pg) -> None:
    """Wait until the status line says the decode finished (not running)."""
    pg.locator('.clover-status[data-running="0"]', has_text=re.compile(r"^done")).first.wait_for(timeout=TIMEOUT_MS)


def test_generate_then_threshold_drag_redecodes(page):
    pg, sessions = page
    # The app rendered and its websocket is live: the block view's placeholder is drawn by plotly.
    pg.get_by_text("press Generate to decode a prompt").first.wait_for(timeout=TIMEOUT_MS)

    prompt = pg.locator("textarea").first
    prompt.fill("Hello")
    prompt.blur()
    pg.get_by_role("button", name="Generate").first.click()

    # The block cells fill in: the block heatmap shows a "Block N · iteration" title and the NFE appears.
    pg.get_by_text(re.compile(r"Block \d+ · iteration")).first.wait_for(timeout=TIMEOUT_MS)
    _wait_done(pg)
    first_nfe = _nfe(pg)
    assert first_nfe.isdigit() and int(first_nfe) > 0, first_nfe
    assert sessions and sessions[-1].prompt == "Hello"
    assert pg.locator(".clover-tokens").first.inner_text().strip() == "32"

    # Move the threshold slider with the keyboard: focus its handle, press Home (-> 0.50).
    group = pg.locator(".bk-input-group", has=pg.get_by_text("Threshold", exact=False)).first
    handle = group.locator(".noUi-handle").first
    handle.focus()
    handle.press("Home")
    pg.get_by_text(re.compile(r"Threshold:\s*0\.5")).first.wait_for(timeout=TIMEOUT_MS)

    # Released -> re-decoded; the new NFE differs, and the previous run is kept beside it.
    pg.wait_for_function(
        """([old]) => {
            const find = (root) => {
              for (const el of root.querySelectorAll('*')) {
                if (el.classList && el.classList.contains('clover-nfe')) return el;
                if (el.shadowRoot) { const f = find(el.shadowRoot); if (f) return f; }
              }
              return null;
            };
            const st = (root) => {
              for (const el of root.querySelectorAll('*')) {
                if (el.classList && el.classList.contains('clover-status')) return el;
                if (el.shadowRoot) { const f = st(el.shadowRoot); if (f) return f; }
              }
              return null;
            };
            const n = find(document), s = st(document);
            return n && s && s.dataset.running === '0' && s.textContent.startsWith('done')
                   && n.textContent.trim() !== old;
        }""",
        arg=[first_nfe], timeout=TIMEOUT_MS,
    )
    second_nfe = _nfe(pg)
    assert second_nfe != first_nfe and int(second_nfe) > 0, (first_nfe, second_nfe)
    assert pg.locator(".clover-settings").first.inner_text().strip().endswith("0.50")
    # The comparison keeps the previous run: "prev <first NFE>" under the NFE, and the compare table.
    assert f"prev {first_nfe}" in pg.locator(".clover-stats").first.inner_text()
    pg.get_by_text("this run", exact=True).first.wait_for(timeout=TIMEOUT_MS)
