"""The explorer in a browser on the block-causal families (issue 49): a tiny SDAR checkpoint decoded with
policy ``sdar``, then a tiny Fast-dLLM v2 checkpoint typed into the model field and decoded with policy
``fast_dllm_v2`` -- the block fills in, the status names the family's sampler and the summary shows its
block size and threshold. Screenshots of both land in the test's temporary folder (and in
``$CLOVER_SCREENSHOTS`` when set).

Run: ``.venv/bin/python -m pytest tests/apps/test_browser_block_causal.py -q``
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from helpers import BROWSER_TIMEOUT_MS as TIMEOUT_MS
from helpers import CHROMIUM_ARGS

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    from clover_engine.backbones.block_causal import write_tiny_block_causal

    root = tmp_path_factory.mktemp("block-causal-app")
    return {"sdar": write_tiny_block_causal(root / "tiny-sdar", "sdar"),
            "fast_dllm_v2": write_tiny_block_causal(root / "tiny-fast-dllm-v2", "Fast_dLLM_Qwen")}


@pytest.fixture(scope="module")
def app_settings(tiny_dirs) -> dict:
    root = tiny_dirs["sdar"].parent
    return dict(model_dir=str(tiny_dirs["sdar"]), policy="sdar", max_new_tokens=24, block_size=8, threshold=0.9,
                model_roots=[root])


def _done(pg) -> str:
    loc = pg.locator('.clover-status[data-running="0"]', has_text=re.compile(r"^done")).first
    loc.wait_for(timeout=TIMEOUT_MS * 2)
    return loc.inner_text()


def _shot(pg, tmp_path: Path, name: str) -> None:
    for folder in (tmp_path, os.environ.get("CLOVER_SCREENSHOTS")):
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            pg.screenshot(path=str(Path(folder) / name), full_page=True)


def test_sdar_and_fast_dllm_v2_decode_in_the_app_with_their_own_samplers(served_app, tiny_dirs, tmp_path):
    from playwright.sync_api import sync_playwright

    url, chromium, sessions = served_app
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 1000})
            pg.goto(url, timeout=TIMEOUT_MS)
            pg.get_by_text("press Generate to decode a prompt").first.wait_for(timeout=TIMEOUT_MS)
            pg.locator("textarea").first.fill("What is the capital of France?")
            pg.get_by_role("button", name=re.compile("Generate")).first.click()
            _done(pg)
            state = sessions[-1]
            assert state.trace.decode_config["sampler"] == "sdar" and len(state.trace) > 0
            pg.get_by_text("8 · 0.90 · sdar").first.wait_for(timeout=TIMEOUT_MS)
            _shot(pg, tmp_path, "explorer-sdar.png")

            field = pg.get_by_label("Model directory").first
            field.fill(str(tiny_dirs["fast_dllm_v2"]))
            field.press("Enter")
            pg.get_by_text("tiny-fast-dllm-v2").first.wait_for(timeout=TIMEOUT_MS)
            pg.get_by_label("Policy").first.select_option("fast_dllm_v2")
            pg.get_by_role("button", name=re.compile("Generate")).first.click()
            pg.get_by_text("8 · 0.90 · fast_dllm_v2").first.wait_for(timeout=TIMEOUT_MS * 2)
            _done(pg)
            assert state.trace.decode_config["sampler"] == "fast_dllm_v2"
            assert state.trace.decode_config["block_size"] == 8 and state.trace.decode_config["threshold"] == 0.9
            _shot(pg, tmp_path, "explorer-fast-dllm-v2.png")
        finally:
            browser.close()
