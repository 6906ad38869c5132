"""The explorer in a browser on LLaDA2.0: a tiny ``llada2_moe`` checkpoint decoded with its own sampler (policy
``llada2``) -- the block fills in, the summary shows its block size and threshold, the experts tab shows the
expert union per layer and forward, and the Cost tab prices each forward over the window it recomputed, by the
measured union; then LLaDA2.1's sampler (policy ``llada21``, token editing) on the same model. Screenshots land in the test's temporary folder (and in ``$CLOVER_SCREENSHOTS`` when set).

Run: ``.venv/bin/python -m pytest tests/apps/test_browser_llada2.py -q``
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from helpers import BROWSER_TIMEOUT_MS as TIMEOUT_MS
from helpers import CHROMIUM_ARGS, scroll_into_view


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from clover_engine.backbones.llada2_moe import write_tiny_llada2_moe

    return write_tiny_llada2_moe(tmp_path_factory.mktemp("llada2-app") / "tiny-llada2", seed=0)


@pytest.fixture(scope="module")
def app_settings(tiny_dir) -> dict:
    return dict(model_dir=str(tiny_dir), policy="llada2", max_new_tokens=24, block_size=8, threshold=0.9,
                model_roots=[tiny_dir.parent])


def _shot(pg, tmp_path: Path, name: str) -> None:
    for folder in (tmp_path, os.environ.get("CLOVER_SCREENSHOTS")):
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            pg.screenshot(path=str(Path(folder) / name), full_page=True)


def test_llada2_decodes_with_its_sampler_and_shows_its_experts_and_their_bytes(served_app, tmp_path):
    from playwright.sync_api import sync_playwright

    url, chromium, sessions = served_app
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 1000})
            pg.goto(url, timeout=TIMEOUT_MS)
            pg.get_by_text("press Generate to decode a prompt").first.wait_for(timeout=TIMEOUT_MS)
            pg.locator("textarea").first.fill("Why is the sky blue?")
            pg.get_by_role("button", name=re.compile("Generate")).first.click()
            pg.locator('.clover-status[data-running="0"]', has_text=re.compile(r"^done")).first.wait_for(
                timeout=TIMEOUT_MS * 2)
            state = sessions[-1]
            trace = state.trace
            assert trace.decode_config["sampler"] == "llada2" and len(trace) > 0
            assert trace.decode_config["block_length"] == 8 and trace.decode_config["threshold"] == 0.9
            assert all(s.expert_union is not None and s.expert_counts is not None for s in trace.steps)
            # every forward recomputed the window, as the original: its tokens grow a block at a time
            assert all(s.n_tokens_forward == s.position_start + 8 for s in trace.steps)
            pg.get_by_text("8 · 0.90 · llada2").first.wait_for(timeout=TIMEOUT_MS)
            _shot(pg, tmp_path, "explorer-llada2.png")
            pg.get_by_text("Experts · state · memory", exact=True).first.click()
            pg.get_by_text("Expert union per layer and forward (of 8 experts, top-2 per token)").first.wait_for(
                timeout=TIMEOUT_MS)
            load = pg.get_by_text(re.compile(r"Tokens per expert over the run -- router entropy")).first
            load.wait_for(timeout=TIMEOUT_MS)
            pg.set_viewport_size({"width": 1400, "height": 1700})  # the whole tab in one picture
            scroll_into_view(load)
            _shot(pg, tmp_path, "explorer-llada2-experts.png")
            pg.get_by_text("Cost", exact=True).first.click()
            pg.get_by_text(re.compile(r"projected tiny-llada2 on h800 \(bf16\)")).first.wait_for(timeout=TIMEOUT_MS)
            assert state.cost_projection().source is not None
            pg.wait_for_timeout(1000)
            _shot(pg, tmp_path, "explorer-llada2-cost.png")
            # LLaDA2.1's sampler on the same model: token editing, its edits the block view's revisions
            pg.set_viewport_size({"width": 1400, "height": 1000})
            pg.get_by_label("Policy").first.select_option("llada21")
            pg.get_by_role("button", name=re.compile("Generate")).first.click()
            pg.get_by_text("8 · 0.90 · llada21").first.wait_for(timeout=TIMEOUT_MS * 2)
            pg.locator('.clover-status[data-running="0"]', has_text=re.compile(r"^done")).first.wait_for(
                timeout=TIMEOUT_MS * 2)
            trace = state.trace
            assert trace.decode_config["sampler"] == "llada21" and trace.decode_config["editing_threshold"] == 0.9
            scroll_into_view(pg.locator(".clover-status").first)
            _shot(pg, tmp_path, "explorer-llada21.png")
        finally:
            browser.close()
