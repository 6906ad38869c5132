"""The served explorer's upload limit, in a browser (issue 40): a file over the limit is refused in
the browser -- never sent over the websocket -- and a malformed one by the server; either way the
page names the file and the limit, and the run on display stays.

Run: ``.venv/bin/python -m pytest tests/apps/test_browser_limits.py -q``
"""

from __future__ import annotations

import re
import time

import pytest
from helpers import BROWSER_TIMEOUT_MS as TIMEOUT_MS
from helpers import wait_for_empty_value

pytest.importorskip("panel")

LIMIT = 4096  # bytes: small, so the test's files stay small


@pytest.fixture(scope="module")
def app_settings() -> dict:
    return dict(model_dir="clover-test", dev_sharpen_random=True, max_new_tokens=32, max_upload_bytes=LIMIT)


def test_an_oversized_and_a_malformed_upload_change_nothing(page, tmp_path):
    pg, sessions = page
    pg.get_by_text("press Generate to decode a prompt").first.wait_for(timeout=TIMEOUT_MS)
    state = sessions[-1]
    pg.get_by_text(re.compile(r"\.arrow, at most 4 KB\)")).first.wait_for(timeout=TIMEOUT_MS)
    pg.get_by_role("button", name=re.compile("Generate")).first.click()
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while state.trace is None or state.running:
        assert time.monotonic() < deadline, state.status
        time.sleep(0.05)
    status = pg.locator('.clover-status[data-running="0"]', has_text=re.compile(r"^done")).first
    status.wait_for(timeout=TIMEOUT_MS)
    shown, shown_status, nfe = state.trace, status.inner_text(), pg.locator(".clover-nfe").first.inner_text()

    received = []  # what reached the server's load_trace
    load_trace = state.load_trace
    state.load_trace = lambda source, name="": received.append((name, len(source))) or load_trace(source, name)
    box = pg.locator("input[type=file]").first

    big = tmp_path / "big.parquet"
    big.write_bytes(b"PAR1" + bytes(20_000))
    box.set_input_files(str(big))
    refused = pg.locator(".alert", has_text=re.compile(r"Trace not loaded: 'big\.parquet' is 19\.5 KB; this server "
                                                       r"takes trace files up to 4 KB")).first
    refused.wait_for(timeout=TIMEOUT_MS)
    assert received == []  # refused in the browser: nothing was sent
    wait_for_empty_value(pg, box)

    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not a trace")
    box.set_input_files(str(bad))
    pg.locator(".alert", has_text=re.compile(r"Trace not loaded: 'bad\.parquet' is not a trace")).first.wait_for(
        timeout=TIMEOUT_MS)
    assert received == [("bad.parquet", bad.stat().st_size)]

    # the page is as it was: the same run, status line and numbers; the connection still answers
    assert state.trace is shown and not state.running
    assert status.inner_text() == shown_status and pg.locator(".clover-nfe").first.inner_text() == nfe
    pg.get_by_role("button", name=re.compile("Generate")).first.click()
    while state.trace is shown or state.running:
        assert time.monotonic() < deadline + TIMEOUT_MS / 1000, state.status
        time.sleep(0.05)
    assert state.error == ""


def test_the_app_resolves_models_only_inside_its_roots(tmp_path):
    """create_app applies the roots by default (the notebook state does not): an existing and a missing
    path outside them get the same message."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("clover_explorer_app_limits", root / "apps" / "explorer.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    state = app.create_app(model_dir="clover-test", start_callbacks=False, max_new_tokens=8).explorer.state
    try:
        errors = []
        for text in ("/etc", "/no/such/dir", str(tmp_path)):
            state.model_dir = text
            errors.append(state.error)
        assert len(set(errors)) == 1 and "model folders" in errors[0], errors
        state.model_dir = "clover-tiny"
        assert state.model_ok and state.error == ""
        assert state.max_upload_bytes == app.MAX_TRACE_UPLOAD_BYTES
    finally:
        state.close()
