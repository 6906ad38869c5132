"""``panel serve apps/explorer.py`` ends soon after SIGTERM, even with a forward in flight.

A decode checks its Stop / cancel flag between forwards, so a forward that takes long -- a long
prompt's prefill on SmolLM2, a slow machine -- kept the server alive after SIGTERM: the exit hook
waited up to 10 s for the decode thread. Here the served app is the real ``apps/explorer.py``,
run by ``panel serve`` in a subprocess, with one change made by a wrapper script: the model's
forward sleeps for a minute, standing in for such a forward. A browser presses Generate; once
the forward has begun, the server gets SIGTERM and must be gone within `EXIT_BOUND_S` (a bound
on a hang, far above the ~2 s a shutdown takes, not a timing benchmark).

Once the server is gone, the page must say so (`clover_viz.panel_connection`): a banner with a reload
action, the status line no longer "decoding...", Generate / Stop and the prompt disabled.

Run: ``.venv/bin/python -m pytest tests/apps/test_serve_sigterm.py -q``
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import BROWSER_TIMEOUT_MS, CHROMIUM_ARGS, chromium_or_skip, free_port

ROOT = Path(__file__).resolve().parents[2]
EXIT_BOUND_S = 8.0  # the old exit hook alone waited 10 s for the decode thread

WRAPPER = '''
import os, runpy, time
from pathlib import Path

from clover_engine.backbones.clover.model import CloverModel

_forward = CloverModel.forward


def slow_forward(self, *args, **kwargs):  # a forward that takes a minute: the cancel flag waits for it
    Path(os.environ["CLOVER_TEST_FORWARD_STARTED"]).touch()
    time.sleep(60)
    return _forward(self, *args, **kwargs)


CloverModel.forward = slow_forward
runpy.run_path({app!r}, run_name=__name__)
'''


def _wait_port(port: int, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"panel serve ended early (exit code {proc.returncode})"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"panel serve did not listen on port {port} within {timeout_s} s")


def _the_page_says_it_is_disconnected(pg, tmp_path: Path) -> None:
    """The server is gone with a decode in flight: the page says so (banner with a reload action), the
    status line no longer reads "decoding...", and no control can be pressed (clover_viz.panel_connection)."""
    banner = pg.locator(".clover-disconnected")
    banner.wait_for(state="visible", timeout=BROWSER_TIMEOUT_MS)
    assert "Disconnected from the server" in banner.inner_text()
    assert pg.get_by_role("button", name="Reload page").is_enabled()
    status = pg.locator(".clover-status").first
    assert status.get_attribute("data-running") == "0"
    assert "decoding" not in status.inner_text() and "disconnected" in status.inner_text(), status.inner_text()
    for name in ("Generate", "Stop"):
        for button in pg.get_by_role("button", name=re.compile(name)).all():
            assert button.is_disabled(), f"{name} still enabled after the server is gone"
    assert pg.locator("textarea").first.is_disabled()
    pg.screenshot(path=str(tmp_path / "disconnected.png"))
    if os.environ.get("CLOVER_SCREENSHOTS"):  # keep the picture (closing notes, docs)
        pg.screenshot(path=os.path.join(os.environ["CLOVER_SCREENSHOTS"], "disconnected.png"))


def test_panel_serve_exits_promptly_on_sigterm_with_a_forward_in_flight(tmp_path):
    pytest.importorskip("panel")
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    app = tmp_path / "explorer.py"
    app.write_text(WRAPPER.format(app=str(ROOT / "apps" / "explorer.py")))
    started = tmp_path / "forward-started"
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", CLOVER_TEST_FORWARD_STARTED=str(started),
               CLOVER_MODEL_DIR="clover-test")  # the random model: nothing to read from disk
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "panel"), "serve", str(app), "--port", str(port),
                             "--address", "127.0.0.1", "--allow-websocket-origin", f"127.0.0.1:{port}"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_port(port, proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
            try:
                pg = browser.new_page(viewport={"width": 1400, "height": 1000})
                pg.set_default_timeout(BROWSER_TIMEOUT_MS)
                pg.goto(f"http://127.0.0.1:{port}/explorer", timeout=BROWSER_TIMEOUT_MS)
                pg.get_by_text("press Generate to decode a prompt").first.wait_for()
                pg.get_by_role("button", name=re.compile("Generate")).first.click()
                deadline = time.monotonic() + 60
                while not started.exists():
                    assert time.monotonic() < deadline, "the decode's first forward never began"
                    time.sleep(0.1)
                t0 = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=EXIT_BOUND_S)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"panel serve still running {EXIT_BOUND_S} s after SIGTERM with a forward in flight "
                                f"(log: {(tmp_path / 'server.log').read_text()[-2000:]})")
                took = time.monotonic() - t0
                _the_page_says_it_is_disconnected(pg, tmp_path)
            finally:
                browser.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert took < EXIT_BOUND_S
    assert "SIGTERM" in (tmp_path / "server.log").read_text()  # the ordinary shutdown ran, not a crash
