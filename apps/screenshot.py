"""Take the README screenshot from a real run of the explorer in headless Chromium.

    .venv/bin/python apps/screenshot.py [--out docs/screenshot.png] [--model models/clover-tiny]

Serves `apps/explorer.py`, decodes the "agent tool call" example at block 32 /
threshold 0.95, lowers the threshold to 0.60 with the keyboard (a second run,
compared with the first), steps back a few forwards so the last block is caught
mid-fill, and saves a full-page PNG (and the cost tab, with the break-even measured on this
machine, as ``<out>-cost.png``). Without a trained model it uses the random clover-test
stand-in with the dev weight sharpening (labelled so in the page).
Needs ``/usr/bin/chromium`` (Debian: ``apt install chromium``) and Playwright's Python client
(in the ``test`` extra: ``bash .ci/install test``).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshot.png")
    p.add_argument("--model", default=None, help="model directory (default: the bundled model)")
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--width", type=int, default=1440)
    p.add_argument("--height", type=int, default=1700)
    p.add_argument("--cost-extra-height", type=int, default=650, help="pixels added for the cost tab's shot")
    args = p.parse_args(argv)

    import panel as pn
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT))
    from clover_viz.models import DEFAULT_MODEL_DIR, resolve_model  # local: after sys.path holds the repository

    args.model = args.model or DEFAULT_MODEL_DIR

    spec = importlib.util.spec_from_file_location("clover_explorer_app_shot", ROOT / "apps" / "explorer.py")
    app_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app_module)
    sharpen = resolve_model(args.model).kind == "random"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = pn.serve(lambda: app_module.create_app(model_dir=args.model, dev_sharpen_random=sharpen),
                      port=port, address="127.0.0.1", websocket_origin=[f"127.0.0.1:{port}"],
                      threaded=True, show=False)
    time.sleep(1.0)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, headless=True, args=ARGS)
            # Tall viewport: the template scrolls its main area itself, so a full-page shot is one screen.
            page = browser.new_page(viewport={"width": args.width, "height": args.height})
            page.set_default_timeout(120_000)
            page.goto(f"http://127.0.0.1:{port}/")
            page.get_by_text("press Generate to decode a prompt").first.wait_for()
            done = page.locator('.clover-status[data-running="0"]', has_text=re.compile(r"^done"))
            page.get_by_role("button", name="Generate").first.click()
            page.locator('.clover-status[data-running="1"]').first.wait_for()
            done.first.wait_for()
            handle = page.locator(".bk-input-group", has=page.get_by_text("Threshold", exact=False)).first
            handle = handle.locator(".noUi-handle").first
            handle.focus()
            for _ in range(35):
                handle.press("ArrowLeft")
            page.get_by_text(re.compile(r"Threshold:\s*0\.60?\b")).first.wait_for()
            time.sleep(1.0)
            done.first.wait_for()
            for _ in range(3):
                page.get_by_role("button", name="◀ step").first.click()
                time.sleep(0.3)
            page.mouse.move(5, args.height - 5)  # no tooltip in the picture
            time.sleep(1.5)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out), full_page=True)
            # taller for the cost tab: its roofline chart sits below the cost charts
            page.set_viewport_size({"width": args.width, "height": args.height + args.cost_extra_height})
            page.get_by_text("Cost", exact=True).first.click()
            page.get_by_text(re.compile(r"projected = roofline")).first.wait_for()
            page.get_by_role("button", name="Measure break-even here").first.click()
            page.get_by_text(re.compile(r"to match autoregressive decoding")).first.wait_for()
            page.mouse.move(5, args.height - 5)  # no tooltip over the break-even line
            time.sleep(2.0)
            cost_out = args.out.with_name(args.out.stem + "-cost.png")
            page.screenshot(path=str(cost_out), full_page=True)
            browser.close()
    finally:
        server.stop()
    print(f"wrote {args.out} and {cost_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
