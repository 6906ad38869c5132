"""The explorer in a browser, on what a newcomer does first (issue 35, items 1, 2 and 7).

* A plain question to the chat model ``smollm2-bd`` is answered: the app decodes it in the
  model's chat template (it decoded the bare text: "0 tokens in 15 forwards, stop: eos").
* Loading a model in one tab shows progress there and does not stall another tab's decode
  (the load ran on the server's event loop: every other session waited for it).
* A long prompt is decoded whole, and one past the model's context is refused with the numbers
  (the prompt box cut everything past 5,000 characters without a word).

The app's loader is the real one (the process-wide cache), slowed by `LOAD_DELAY_S` for SmolLM2
so that the other tab's decode surely happens while it loads, whatever the cache holds.
The SmolLM2 test needs its pinned base (`.ci/install` installs it) and skips without it.

Run: ``.venv/bin/python -m pytest tests/apps/test_browser_trust.py -q``
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from helpers import BROWSER_TIMEOUT_MS as TIMEOUT_MS
from helpers import CHROMIUM_ARGS, smollm2_base_installed, wait_for_state

ROOT = Path(__file__).resolve().parents[2]
LOAD_DELAY_S = 4.0
QUESTION = "What is the boiling point of water in Celsius?"


def _slow_smollm2_loader(spec):
    from clover_viz.models import load_model_cached

    if spec.path and "smollm2" in str(spec.path):
        time.sleep(LOAD_DELAY_S)
    return load_model_cached(spec)


@pytest.fixture(scope="module")
def app_settings() -> dict:
    return dict(model_dir="clover-test", dev_sharpen_random=True, max_new_tokens=32, loader=_slow_smollm2_loader)




def _status(pg):
    return pg.locator(".clover-status").first


def _wait_done(pg) -> str:
    loc = pg.locator('.clover-status[data-running="0"]', has_text=re.compile(r"^done")).first
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        loc.wait_for(timeout=TIMEOUT_MS * 4)  # SmolLM2 decodes ~1 token per forward on 2 busy cores
    except PlaywrightTimeout:  # say what the page shows instead (an error line, a run still going)
        raise AssertionError(f"no 'done' status; the page shows: {_status(pg).inner_text()!r}") from None
    return loc.inner_text()


@pytest.mark.skipif(not smollm2_base_installed(), reason="SmolLM2 base not installed (bash .ci/install installs it)")
def test_a_load_shows_progress_stalls_no_other_tab_and_a_plain_question_is_answered(served_app):
    from playwright.sync_api import sync_playwright

    url, chromium, sessions = served_app
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            a = browser.new_page(viewport={"width": 1400, "height": 1000})
            a.goto(url, timeout=TIMEOUT_MS)
            a.get_by_text("press Generate to decode a prompt").first.wait_for(timeout=TIMEOUT_MS)
            state_a = sessions[-1]
            b = browser.new_page(viewport={"width": 1400, "height": 1000})
            b.goto(url, timeout=TIMEOUT_MS)
            b.get_by_text("press Generate to decode a prompt").first.wait_for(timeout=TIMEOUT_MS)
            state_b = sessions[-1]
            assert state_a is not state_b

            # tab A picks the chat model: it loads in the background, with progress shown in A
            a.get_by_role("button", name="smollm2-bd", exact=True).first.click()
            a.locator('.clover-status[data-loading="1"]', has_text=re.compile(r"loading smollm2-bd")).first.wait_for(
                timeout=TIMEOUT_MS)
            a.locator("progress").first.wait_for(state="visible", timeout=TIMEOUT_MS)  # indeterminate: no length yet
            # meanwhile tab B decodes start to end
            b.locator("textarea").first.fill("Hello")
            b.locator("textarea").first.blur()
            b.get_by_role("button", name="Generate").first.click()
            _wait_done(b)
            assert state_a.loading, "tab B's decode had to wait for tab A's load"
            assert int(b.locator(".clover-tokens").first.inner_text()) > 0

            # tab A: loaded; a plain question is decoded in the chat template and answered
            a.locator('.clover-status[data-loading="0"]').first.wait_for(timeout=TIMEOUT_MS * 4)
            wait_for_state(lambda: state_a.model_ok and "smollm2-bd" in state_a.model_label,
                           lambda: (state_a.model_label, state_a.error, state_a.status))
            box = a.locator("textarea").first
            box.fill(QUESTION)
            box.blur()
            a.get_by_role("button", name="Generate").first.click()
            done = _wait_done(a)
            assert "ChatML chat template" in done, done
            n_tokens = int(a.locator(".clover-tokens").first.inner_text())
            assert n_tokens >= 8, done
            tok = state_a.loaded_model.tokenizer
            from clover_viz.runs import generated_ids

            answer = tok.decode(generated_ids(state_a.trace))
            assert "100" in answer, answer  # the boiling point, in the model's own words
            assert state_a.trace.meta["model_input"].startswith("<|im_start|>system")
        finally:
            browser.close()


def test_a_long_prompt_is_decoded_whole_and_one_past_the_context_is_refused_with_numbers(page):
    pg, sessions = page
    pg.get_by_text("press Generate to decode a prompt").first.wait_for(timeout=TIMEOUT_MS)
    state = sessions[-1]
    state.max_new_tokens = 4
    box = pg.locator("textarea").first
    # within clover-test's context (8,192 byte tokens) but past Panel's old 5,000-character cut
    long_prompt = ("def f(x):\n    return x + 1\n" * 300)[:6000]
    box.fill(long_prompt)
    box.blur()
    pg.get_by_role("button", name="Generate").first.click()
    _wait_done(pg)
    assert len(state.prompt) == 6000 and len(state.trace.prompt_ids) == 6000
    # past the context: refused, saying by how much, and the run on display is kept
    shown = state.trace
    box.fill("x" * 9000)
    box.blur()
    pg.get_by_role("button", name="Generate").first.click()
    msg = pg.get_by_text(re.compile(r"the prompt has 9000 tokens but the model's context is 8192")).first
    msg.wait_for(timeout=TIMEOUT_MS)
    assert "9,000 characters" in msg.inner_text()
    assert len(state.prompt) == 9000 and state.trace is shown
