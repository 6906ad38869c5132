"""Concurrent model loads never poison the server: 8 threads load 3 SmolLM2-based models at once while
2 browser sessions of the served explorer pick two of them; every load succeeds, a session queued behind
another build says so on its page, and a sequential load afterwards works.

Before the engine built models one at a time (`clover_engine.backbones.registry.BUILD_LOCK`), 6 such
threads gave 5 ``ImportError: cannot import name 'AutoModelForCausalLM'`` (transformers' lazy imports are
not thread-safe), and the class-at-once trial saw ``Cannot copy out of meta tensor`` on every later load.

Needs ``/usr/bin/chromium`` and the pinned SmolLM2 base (``bash .ci/install`` installs it); skips without.

Run: ``.venv/bin/python -m pytest tests/apps/test_concurrent_loads.py -q``
"""

from __future__ import annotations

import re
import threading
import time

import pytest
from helpers import BROWSER_TIMEOUT_MS as TIMEOUT_MS
from helpers import CHROMIUM_ARGS, smollm2_base_installed, uncache_models, wait_for_state

from clover_engine.backbones.registry import BUILD_LOCK
from clover_viz import models

MODELS = ("smollm2-bd", "smollm2-bd-tools", "smollm2-drafter")




@pytest.mark.skipif(not smollm2_base_installed(), reason="SmolLM2 base not installed (bash .ci/install installs it)")
def test_eight_threads_and_two_pages_load_three_smollm2_models_at_once_and_nothing_is_poisoned(served_app):
    from playwright.sync_api import sync_playwright

    url, chromium, sessions = served_app
    uncache_models("smollm2")  # the process cache may hold them from other tests: these loads must build
    results: dict[int, str] = {}
    start = threading.Barrier(9)

    def load(i: int, name: str) -> None:
        start.wait()
        try:
            loaded = models.build_model(models.resolve_model(name))  # a build each: no cache in between
            assert loaded.model is not None and loaded.tokenizer is not None
            results[i] = "ok"
        except BaseException as exc:  # noqa: BLE001  (reported by the assertion below)
            results[i] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=load, args=(i, MODELS[i % 3]), daemon=True) for i in range(8)]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            pages = []
            for _ in range(2):
                pg = browser.new_page(viewport={"width": 1400, "height": 1000})
                pg.goto(url, timeout=TIMEOUT_MS)
                pg.get_by_text("press Generate to decode a prompt").first.wait_for(timeout=TIMEOUT_MS)
                pages.append((pg, sessions[-1]))
            # another build holds the lock: both pages pick a model and say that they wait for it
            BUILD_LOCK.acquire()
            try:
                for (pg, _), name in zip(pages, ("smollm2-bd", "smollm2-drafter")):
                    pg.get_by_role("button", name=name, exact=True).first.click()
                for pg, _ in pages:
                    pg.locator(".clover-status", has_text=re.compile(r"waiting for another load")).first.wait_for(
                        timeout=TIMEOUT_MS)
                for t in threads:
                    t.start()
                start.wait()  # the 8 threads start their builds at the same moment as the pages' loads
            finally:
                BUILD_LOCK.release()
            for t in threads:
                t.join(timeout=600)
            for (pg, state), name in zip(pages, ("smollm2-bd", "smollm2-drafter")):
                pg.locator('.clover-status[data-loading="0"]').first.wait_for(timeout=TIMEOUT_MS * 6)
                wait_for_state(lambda: (state.model_ok and name in state.model_label) or bool(state.error),
                               lambda: (state.model_label, state.error))
                assert state.model_ok and name in state.model_label, (state.model_label, state.error)
                assert not state.error, state.error
        finally:
            browser.close()
    assert results == {i: "ok" for i in range(8)}, results
    t0 = time.perf_counter()
    models.build_model(models.resolve_model("smollm2-bd"))  # one at a time afterwards: nothing poisoned
    print(f"\nsequential load after the concurrent ones: {time.perf_counter() - t0:.1f} s")
    logged = "\n".join(r.getMessage() for r in served_app.records)
    assert "meta tensor" not in logged and "ImportError" not in logged, logged[-2000:]
