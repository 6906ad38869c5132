"""Stop as a person presses it (issue 62): 10 clicks, 4 pages decoding, each stopped run keeps what its page
showed at the click plus the forward in flight.

A person reads the cards on the screen and clicks a moment later; nothing reads the cards in the click's own
task. So each page samples what it paints: a ``requestAnimationFrame`` loop (it runs before every paint)
records each new forward count of the summary (``data-nfe`` of the status line, drawn with the cards), with the
frame's time. The click is Playwright's mouse click -- real input events, in their own task -- and a
capture-phase listener records only its time. What the page showed at the click is the count painted in the
last frame before it; a frame may be in progress at the click (the count already changed, not yet painted),
so the count of the first frame after it, when that frame comes within `FRAME_SLACK_MS`, is allowed too.

The four pages decode long answers (the random ``clover-test``, sharpened: it never ends early), so the server
and the browsers are loaded as a teacher's classroom is; the Stop rotates over the pages, and a stopped page
decodes again for the next round.

Needs ``/usr/bin/chromium``; skips without it. Run: ``.venv/bin/python -m pytest tests/apps/test_browser_stop_person.py -q``
"""

from __future__ import annotations

import random
import re
import time

import pytest
from conftest import TIMEOUT_MS
from helpers import CHROMIUM_ARGS

PAGES, CLICKS = 4, 10
FRAME_SLACK_MS = 100.0  # a frame in progress at the click: its count was in the page, not yet painted

_SAMPLE_PAINTED_JS = """() => {
  const find = (root) => {
    const el = root.querySelector('.clover-status[data-nfe]');
    if (el) return el;
    for (const e of root.querySelectorAll('*')) {
      if (e.shadowRoot) { const f = find(e.shadowRoot); if (f) return f; }
    }
    return null;
  };
  window.__painted = [];
  window.__clicks = [];
  let root = null;
  const frame = (t) => {  // before each paint: the count this frame paints
    let el = root ? root.querySelector('.clover-status[data-nfe]') : null;
    if (!el) { el = find(document); root = el ? el.getRootNode() : null; }
    if (el) {
      const n = parseInt(el.dataset.nfe), last = window.__painted[window.__painted.length - 1];
      if (!last || last[1] !== n) window.__painted.push([t, n]);
    }
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
  window.addEventListener('click', (e) => window.__clicks.push(e.timeStamp), true);  // the time only
}"""


@pytest.fixture(scope="module")
def app_settings() -> dict:
    return dict(model_dir="clover-test", dev_sharpen_random=True, max_new_tokens=2048)


def _running(pg) -> bool:
    return pg.locator(".clover-status[data-running='1']").count() > 0


def _generate(pg) -> None:
    pg.get_by_role("button", name=re.compile("^Generate")).first.click()
    pg.locator(".clover-status[data-running='1']").first.wait_for(timeout=TIMEOUT_MS)


def _shown_at_click(painted: list, click_ms: float) -> tuple[int, int | None]:
    """(count painted in the last frame before the click, count of the first frame after it within the slack)."""
    before = [n for t, n in painted if t <= click_ms]
    after = [n for t, n in painted if click_ms < t <= click_ms + FRAME_SLACK_MS]
    assert before, f"no frame was painted before the click at {click_ms:.0f} ms: {painted[:5]}"
    return before[-1], (after[0] if after else None)


def test_ten_person_like_stops_keep_what_the_page_showed_plus_one_forward(served_app):
    from playwright.sync_api import sync_playwright

    url, chromium, sessions = served_app
    rng = random.Random(62)
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            pages = []
            for _ in range(PAGES):
                pg = browser.new_page(viewport={"width": 1400, "height": 1000})
                pg.set_default_timeout(TIMEOUT_MS)
                pg.goto(url, timeout=TIMEOUT_MS)
                pg.get_by_text("press Generate to decode a prompt").first.wait_for()
                pages.append((pg, sessions[-1]))
                pg.evaluate(_SAMPLE_PAINTED_JS)
            for pg, _ in pages:
                _generate(pg)
            for k in range(CLICKS):
                pg, state = pages[k % PAGES]
                for other, _ in pages:  # every page decodes while the person reads and clicks
                    if not _running(other):
                        _generate(other)
                time.sleep(rng.uniform(1.0, 3.0))  # the person watches the cards
                assert _running(pg), f"click {k + 1}: the run ended before the Stop (a longer budget is needed)"
                pg.get_by_role("button", name="Stop").first.click()  # the click: no read of the cards in its task
                pg.locator(".clover-status", has_text=re.compile(r"^stopped")).first.wait_for(timeout=TIMEOUT_MS)
                painted, clicks = pg.evaluate("() => [window.__painted, window.__clicks]")
                shown, in_progress = _shown_at_click(painted, clicks[-1])
                kept = len(state.trace)  # forwards (steps) the stopped run kept
                rows.append((k + 1, shown, in_progress, kept, (state.stop_timing or {}).get("shown_from")))
                assert shown <= kept <= shown + 1 or (in_progress is not None and in_progress <= kept <= in_progress + 1), \
                    f"click {k + 1}: the page showed {shown} forwards (next frame {in_progress}), the run kept {kept}; {rows}"
            for pg, _ in pages:
                if _running(pg):
                    pg.get_by_role("button", name="Stop").first.click()
        finally:
            browser.close()
    assert len(rows) == CLICKS
    print("click, shown, next frame, kept, read from:", rows)
