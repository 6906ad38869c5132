"""A closed tab ends its session cleanly on a real server, both ways the README serves the explorer.

``clover-explorer serve`` hands ``clover_viz/explorer.py`` itself to ``panel serve`` as the served script, and Panel
clears a served script's module globals when it destroys the session -- before the session-destroyed callbacks run.
The session's end once looked a global up there and failed, one "...end_session... failed with following error:
name 'release_js_callbacks' is not defined" warning per closed tab, with the release never done. The in-process
tests never take that path; this one runs the real servers in a subprocess (with Bokeh's unused-session check
shortened), opens and closes pages in headless Chromium, and reads the server's log: every session ends with its
release done (the app's INFO line) and the log holds no warning or error.

Run: ``.venv/bin/python -m pytest tests/apps/test_serve_session_end.py -q``
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import BROWSER_TIMEOUT_MS, CHROMIUM_ARGS, chromium_or_skip, free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
PAGES = 2
ENDED = re.compile(r"Clover Explorer: a session ended: its work stopped, (\d+) JS callbacks released")
SERVERS = {
    "clover-explorer serve": [sys.executable, "-m", "clover_explorer", "serve"],
    "panel serve apps/explorer.py": [str(Path(sys.executable).parent / "panel"), "serve", "apps/explorer.py"],
}


@pytest.mark.parametrize("how", list(SERVERS))
def test_closed_tabs_end_their_sessions_without_a_warning(how, tmp_path):
    pytest.importorskip("panel")
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", CLOVER_MODEL_DIR="clover-test")  # the random model: no file to read
    log_path = tmp_path / "server.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([*SERVERS[how], "--port", str(port), "--address", "127.0.0.1", "--allow-websocket-origin",
                             f"127.0.0.1:{port}", "--check-unused-sessions", "500", "--unused-session-lifetime", "500"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + BROWSER_TIMEOUT_MS / 1000
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, f"{how} did not listen: {log_path.read_text()[-3000:]}"
            time.sleep(0.2)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
            try:
                for _ in range(PAGES):
                    pg = browser.new_page()
                    pg.goto(f"http://127.0.0.1:{port}/explorer", timeout=BROWSER_TIMEOUT_MS)
                    pg.get_by_text("press Generate to decode a prompt").first.wait_for(timeout=BROWSER_TIMEOUT_MS)
                    pg.close()  # the tab closes: the server ends its session
            finally:
                browser.close()
        deadline = time.monotonic() + BROWSER_TIMEOUT_MS / 1000
        while len(ENDED.findall(log_path.read_text())) < PAGES:
            assert time.monotonic() < deadline, f"sessions did not end: {log_path.read_text()[-3000:]}"
            time.sleep(0.2)
        time.sleep(2)  # the server destroys the sessions it found unused after the tabs' own end
    finally:
        stop_process(proc)
        log.close()
    text = log_path.read_text()
    assert all(int(n) > 0 for n in ENDED.findall(text)), text  # the release ran and found the session's callbacks
    bad = [ln for ln in text.splitlines() if re.search(r"WARNING|ERROR|Traceback|failed with", ln)]
    assert not bad, bad
