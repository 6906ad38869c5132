"""A teacher's first minutes with the served explorer, in headless Chromium, one server for all of it:

1. a plain question to the default model (clover-tiny, made for tool calls and code) is mostly forced
   fills, and the page says so in one sentence with the numbers, pointing to the drafter;
2. the run saved from the page and opened in the notebook `Explorer` shows the same summary values
   (NFE, tokens, tokens per forward, forced fills, stop, bytes read, settings, model);
3. a prompt longer than smollm2-bd was trained on is decoded whole, with one warning giving both numbers;
4. smollm2-drafter (policy verify) answers with text that has no masked gaps in it;
5. a model load shows its bytes in a progress bar, Stop gives it up, and the page is back on the model
   before it (the label, the directory box, a Generate);
6. the server goes away: the page shows the disconnected banner, its controls are off, and the status
   line no longer reads as working (last: it stops this module's server).

Screenshots of each land in the test's temporary folder (and in ``$CLOVER_SCREENSHOTS`` when set). Items 3
and 4 need the pinned SmolLM2 base (`.ci/install` installs it) and skip without it.

Run: ``.venv/bin/python -m pytest tests/apps/test_browser_first_minutes.py -q``
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from helpers import BROWSER_TIMEOUT_MS as TIMEOUT_MS
from helpers import CHROMIUM_ARGS, slowed_loader, smollm2_base_installed, uncache_models

pytest.importorskip("panel")

QUESTION = "What is the capital of France?"
CARDS = ("nfe", "tokens", "tpf", "forced", "bytes", "stop", "settings", "model")
NEEDS_SMOLLM2 = pytest.mark.skipif(not smollm2_base_installed(),
                                   reason="SmolLM2 base not installed (bash .ci/install installs it)")


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> Path:
    from clover_engine.backbones.llada_moe import write_tiny_llada_moe

    return write_tiny_llada_moe(tmp_path_factory.mktemp("first-minutes") / "tiny-llada-moe", seed=2)


@pytest.fixture(scope="module")
def app_settings(moe_dir) -> dict:
    from clover_viz.models import bundled_dir

    return dict(model_dir="clover-tiny", max_new_tokens=32, loader=slowed_loader("tiny-llada-moe", 0.05),
                model_roots=[moe_dir.parent, bundled_dir()])


@pytest.fixture(scope="module")
def browser(served_app):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=served_app[1], headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def tab(served_app, browser):
    """A fresh page on the served app, and its session's state."""
    url, _, sessions = served_app
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(url, timeout=TIMEOUT_MS)
    pg.get_by_text("press Generate to decode a prompt").first.wait_for(timeout=TIMEOUT_MS)
    try:
        yield pg, sessions[-1]
    finally:
        pg.close()


def _shot(pg, tmp_path: Path, name: str) -> None:
    for folder in (tmp_path, os.environ.get("CLOVER_SCREENSHOTS")):
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            pg.screenshot(path=str(Path(folder) / name), full_page=True)


def _status(pg) -> str:
    return pg.locator(".clover-status").first.inner_text()


def _decode(pg, prompt: str, timeout_ms: int = TIMEOUT_MS * 4) -> str:
    """Type ``prompt``, press Generate, wait for the done line; returns it."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    box = pg.locator("textarea").first
    box.fill(prompt)
    box.blur()
    pg.get_by_role("button", name=re.compile("Generate")).first.click()
    done = pg.locator('.clover-status[data-running="0"]', has_text=re.compile(r"^done")).first
    try:
        done.wait_for(timeout=timeout_ms)
    except PlaywrightTimeout:
        raise AssertionError(f"no 'done' line; the page shows: {_status(pg)!r}") from None
    return done.inner_text()


def _pick_bundled(pg, state, name: str) -> None:
    pg.get_by_role("button", name=name, exact=True).first.click()
    pg.locator('.clover-status[data-loading="0"]').first.wait_for(timeout=TIMEOUT_MS * 4)
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not (state.model_ok and name in state.model_label):
        assert time.monotonic() < deadline, (state.model_label, state.status)
        time.sleep(0.1)


def _cards(html_text: str) -> dict[str, str]:
    """The summary cards' values in an HTML text: class ``clover-<name>`` -> the value shown."""
    import html

    found = re.findall(r'class="val clover-([a-z]+)">([^<]*)<', html_text)
    return {k: html.unescape(v) for k, v in found}


def test_a_plain_question_to_the_tool_model_says_it_was_guessed_and_both_front_ends_agree(tab, tmp_path):
    pg, state = tab
    done = _decode(pg, QUESTION)
    from clover_viz.runs import run_stats

    st = state.trace
    m = re.search(r"mostly guessed: (\d+) of (\d+) tokens were forced fills", done)
    assert m, done
    assert "smollm2-drafter" in done and "verify" in done, done
    assert int(m.group(1)) <= run_stats(st)["n_forced"]  # end-of-text fills past the answer are not counted
    assert int(m.group(1)) > int(m.group(2)) / 2
    _shot(pg, tmp_path, "first-minutes-trust.png")

    # the same run in the notebook Explorer, from the trace file the page saves
    path = tmp_path / "run.parquet"
    path.write_bytes(state.trace_bytes().getvalue())
    from clover_viz import Explorer

    ex = Explorer(str(path))
    try:
        page_cards = {k: pg.locator(f".clover-{k}").first.inner_text().strip() for k in CARDS}
        notebook_cards = _cards(ex.summary.value)
        assert set(CARDS) <= set(notebook_cards), notebook_cards
        assert {k: notebook_cards[k] for k in CARDS} == page_cards
        assert page_cards["nfe"] == str(len(st)) and page_cards["model"].startswith("clover-tiny")
    finally:
        ex.close()


@NEEDS_SMOLLM2
def test_a_prompt_past_the_trained_length_gets_one_warning_with_both_numbers(tab, tmp_path):
    pg, state = tab
    _pick_bundled(pg, state, "smollm2-bd")
    state.max_new_tokens = 4
    prompt = ("The history of the river and the town that grew beside it is long. " * 90)[:6000]
    done = _decode(pg, prompt)
    m = re.search(r"the prompt has ([\d,]+) tokens; this model was trained on sequences of at most (\d+) tokens", done)
    assert m, done
    assert int(m.group(1).replace(",", "")) > int(m.group(2)) == 256
    assert done.count("was trained on sequences") == 1
    assert len(state.trace.prompt_ids) == int(m.group(1).replace(",", ""))  # decoded whole, nothing cut
    _shot(pg, tmp_path, "first-minutes-long-prompt.png")


@NEEDS_SMOLLM2
def test_the_drafter_answers_a_plain_question_with_text_that_has_no_gaps(tab, tmp_path):
    pg, state = tab
    _pick_bundled(pg, state, "smollm2-drafter")
    state.max_new_tokens = 16
    done = _decode(pg, QUESTION)
    assert state.trace.decode_config["policy"] == "verify", state.trace.decode_config
    assert "mostly guessed" not in done
    text = pg.locator(".clover-text").first.inner_text()
    assert "Paris" in text, text
    assert "░" not in text, text  # rejected draft slots are not drawn as masks between the words
    _shot(pg, tmp_path, "first-minutes-verify.png")


def test_a_model_load_shows_its_bytes_and_stop_returns_to_the_model_before(tab, moe_dir, tmp_path):
    from clover_viz import models

    pg, state = tab
    before = state.model_label
    uncache_models(str(moe_dir))  # another test may have cached it: this load must read
    box = pg.get_by_label("Model directory").first
    box.fill(str(moe_dir))
    box.press("Enter")
    pg.locator('.clover-status[data-loading="1"]', has_text=re.compile(r"reading weights: \d+% of")).first.wait_for(
        timeout=TIMEOUT_MS)
    bar = pg.locator("progress").first
    bar.wait_for(state="visible")
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not (bar.get_attribute("value") and 0 < float(bar.get_attribute("value")) < 100):
        assert time.monotonic() < deadline, (bar.get_attribute("value"), _status(pg))
        time.sleep(0.05)
    _shot(pg, tmp_path, "first-minutes-loading.png")
    stop = pg.get_by_role("button", name="Stop").first
    assert stop.is_enabled()  # Stop works while a model loads
    stop.click()
    pg.locator('.clover-status[data-loading="0"]',
               has_text=f"load of tiny-llada-moe cancelled; back to {before}").first.wait_for(timeout=TIMEOUT_MS)
    assert state.model_dir == "clover-tiny" and state.model_label == before and state.model_ok
    from playwright.sync_api import expect

    expect(box).to_have_value("clover-tiny")
    assert all(spec.path != str(moe_dir) for spec in models.cached_models())
    _shot(pg, tmp_path, "first-minutes-load-cancelled.png")
    state.max_new_tokens = 8
    _decode(pg, QUESTION)  # the model it went back to decodes
    assert state.trace.meta["model_label"] == before


def test_a_lost_server_puts_the_page_in_a_disconnected_state(served_app, tab, tmp_path):
    from clover_viz.panel_connection import BANNER_TEXT, DISCONNECTED_STATUS

    pg, state = tab
    served_app.server.stop()  # the server goes away under an open page
    pg.locator('body[data-clover-disconnected="1"]').wait_for(state="attached", timeout=TIMEOUT_MS)
    pg.get_by_text(BANNER_TEXT[:40]).first.wait_for(timeout=TIMEOUT_MS)
    assert _status(pg) == DISCONNECTED_STATUS
    assert pg.get_by_role("button", name="Reload page").first.is_visible()
    assert not pg.get_by_role("button", name=re.compile("Generate")).first.is_enabled()
    time.sleep(2)  # Panel's own "Server connection lost." toast slides in: the screenshot shows it whole
    _shot(pg, tmp_path, "first-minutes-disconnected.png")
