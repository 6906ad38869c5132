"""The explorer in a browser on a MoE diffusion LM: a tiny LLaDA-MoE checkpoint decoded with LLaDA's sampler
(policy ``llada``) -- the block fills in, the experts tab shows the expert union per layer and forward and the
tokens per expert with the router's entropy, and the Cost tab prices the forwards by the measured union.
Screenshots land in the test's temporary folder (and in ``$CLOVER_SCREENSHOTS`` when set).

Run: ``.venv/bin/python -m pytest tests/apps/test_browser_llada_moe.py -q``
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
    from clover_engine.backbones.llada_moe import write_tiny_llada_moe

    return write_tiny_llada_moe(tmp_path_factory.mktemp("llada-moe-app") / "tiny-llada-moe", seed=0)


@pytest.fixture(scope="module")
def app_settings(tiny_dir) -> dict:
    return dict(model_dir=str(tiny_dir), policy="llada", max_new_tokens=32, block_size=8, threshold=0.9,
                model_roots=[tiny_dir.parent])


def _shot(pg, tmp_path: Path, name: str) -> None:
    for folder in (tmp_path, os.environ.get("CLOVER_SCREENSHOTS")):
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            pg.screenshot(path=str(Path(folder) / name), full_page=True)


def test_llada_moe_decodes_and_shows_its_experts_and_their_bytes(served_app, tmp_path):
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
            assert trace.decode_config["sampler"] == "llada" and len(trace) > 0
            assert all(s.expert_union is not None and s.expert_counts is not None for s in trace.steps)
            _shot(pg, tmp_path, "explorer-llada-moe.png")
            pg.get_by_text("Experts · state · memory", exact=True).first.click()
            pg.get_by_text("Expert union per layer and forward (of 8 experts, top-2 per token)").first.wait_for(
                timeout=TIMEOUT_MS)
            load = pg.get_by_text(re.compile(r"Tokens per expert over the run -- router entropy")).first
            load.wait_for(timeout=TIMEOUT_MS)
            scroll_into_view(load)
            pg.get_by_text(re.compile("history is recomputed every forward")).first.wait_for(timeout=TIMEOUT_MS)
            pg.set_viewport_size({"width": 1400, "height": 1700})  # the whole tab in one picture
            scroll_into_view(load)
            _shot(pg, tmp_path, "explorer-llada-moe-experts.png")
            pg.get_by_text("Cost", exact=True).first.click()
            # the model itself projected onto the device by its own family with its measured union (not "n/a"),
            # and the 35B-A3B projection carries that union over
            pg.get_by_text(re.compile(r"projected tiny-llada-moe on h800 \(bf16\)")).first.wait_for(timeout=TIMEOUT_MS)
            pg.get_by_text(re.compile(r"clover-35b-a3b block decoding on h800 \(bf16, measured_vs_independent")).first \
                .wait_for(timeout=TIMEOUT_MS)
            assert state.cost_projection().source is not None
            pg.wait_for_timeout(1000)
            _shot(pg, tmp_path, "explorer-llada-moe-cost.png")
        finally:
            browser.close()
