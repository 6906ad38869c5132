"""Stop under load: how long a Stop takes, and how many tokens a stopped run keeps beyond what was shown,
with several browser pages decoding long answers on one served explorer.

The explorer is served in this process (Panel's server in a thread, as the browser tests do) and driven by
headless Chromium: ``--pages`` pages (default 4) each Generate ``--tokens`` new tokens (default 2048) with
the random ``clover-test`` model (sharpened: it never ends early, every page decodes to the budget). After
``--warmup`` seconds one page presses Stop. Printed, per round:

* **click -> stopped** (s): from the click until the page's status line reads "stopped";
* **click -> server** (s): until the server ran ``stop()`` (the click waited in the server's event loop);
* **forward** (ms): the median forward of that run, from its trace, and click -> stopped in forwards;
* **shown / kept**: tokens on the page at the click, tokens the stopped run kept, and the excess in
  forwards' worth of tokens (the promise: at most one forward's more than shown), and how many forwards
  the decode had run past its page that the run did not keep (`clover_viz.runs.kept_at_stop`). The tokens
  card is read and Stop clicked in one browser task (nothing is drawn between them); the page's Stop also
  sends the NFE it had drawn, printed against the NFE kept.

``--compare`` serves the same again without pacing (every session redrawing every tick, decodes never
waiting for their page: the explorer before `clover_viz.session_pacing`) and prints both side by side.

Run: ``.venv/bin/python benchmarks/stop_under_load.py [--pages 4 --tokens 2048 --rounds 3 --compare]`` (needs
``/usr/bin/chromium``). Numbers on a shared machine are noise in absolute terms; the forward counts are not.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers import CHROMIUM_ARGS, chromium_executable, free_port  # noqa: E402

from clover_engine.threads import add_threads_argument, configure_threads  # noqa: E402
from clover_viz.runs import generated_ids  # noqa: E402


def serve(settings: dict, paced: bool = True):
    """Serve ``apps/explorer.py``'s ``create_app(**settings)`` in a thread; returns (url, sessions, server).
    ``paced=False`` serves as the explorer did before pacing (`clover_viz.session_pacing`): every session
    redraws on every tick and its decode never waits for the page -- the baseline of ``--compare``."""
    import panel as pn

    spec = importlib.util.spec_from_file_location("clover_explorer_app_bench", ROOT / "apps" / "explorer.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    sessions: list = []

    def make():
        tpl = app.create_app(**settings)
        if not paced:
            tpl.explorer.state.paced_decodes = False
            tpl.explorer.state._pacer.drew = lambda cost_s, live_decodes: None  # redraw on every tick
        sessions.append(tpl.explorer.state)
        return tpl

    port = free_port()
    server = pn.serve(make, port=port, address="127.0.0.1", websocket_origin=[f"127.0.0.1:{port}"],
                      threaded=True, show=False)
    for _ in range(300):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    return f"http://127.0.0.1:{port}/", sessions, server


_READ_TOKENS_AND_STOP_JS = """(stop) => {
  const find = (root) => {
    const card = root.querySelector('.clover-tokens');
    if (card) return card;
    for (const el of root.querySelectorAll('*')) {
      if (el.shadowRoot) { const found = find(el.shadowRoot); if (found) return found; }
    }
    return null;
  };
  const card = find(document);
  const text = card ? card.innerText : '';
  stop.click();
  return text;
}"""


def one_round(browser, url: str, sessions: list, pages: int, warmup_s: float) -> dict:
    opened = []
    for _ in range(pages):
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.set_default_timeout(120_000)
        pg.goto(url)
        pg.get_by_text("press Generate to decode a prompt").first.wait_for()
        opened.append((pg, sessions[-1]))
    for pg, _ in opened:
        pg.get_by_role("button", name=re.compile("Generate")).first.click()
    time.sleep(warmup_s)
    pg, state = opened[0]
    stop = pg.get_by_role("button", name="Stop").first.element_handle()
    t_click = time.monotonic()
    # the tokens card found and read and Stop clicked in one browser task: nothing is drawn between the two
    # (a card found earlier may be a detached copy: every redraw of the summary replaces its HTML)
    shown = int(pg.evaluate(_READ_TOKENS_AND_STOP_JS, stop) or 0)
    pg.locator(".clover-status", has_text=re.compile(r"^stopped")).first.wait_for(timeout=600_000)
    t_stopped = time.monotonic()
    status = pg.locator(".clover-status").first.inner_text()
    kept = int(re.search(r"kept (\d+) tokens", status).group(1))
    timing = state.stop_timing or {}
    walls = [st.wall_s for st in state.trace.steps if getattr(st, "wall_s", None)]
    fwd_s = statistics.median(walls) if walls else float("nan")
    per_forward = kept / max(len(state.trace.steps), 1)
    # the tokens the page showed, by the decoder's rule at the NFE its Stop sent (the run is cut one forward later)
    at_page = len(generated_ids(state.trace.split(timing["nfe_shown"])[0])) if timing.get("nfe_shown") else None
    for p, _ in opened:  # the other pages' Stop, pressed in their pages: a session is only touched on the
        # server's event loop (a disabled button does nothing)
        p.get_by_role("button", name="Stop").first.evaluate("b => b.click()")
    for p, _ in opened:
        p.close()
    return dict(click_to_stopped_s=t_stopped - t_click,
                click_to_server_s=timing.get("requested_at", t_click) - t_click,
                forward_ms=fwd_s * 1e3, stopped_in_forwards=(t_stopped - t_click) / fwd_s if walls else float("nan"),
                shown=shown, kept=kept, excess_forwards=(kept - shown) / max(per_forward, 1e-9),
                forwards_after_request=timing.get("forwards_after_request"),
                forwards_dropped=timing.get("forwards_dropped"), nfe_page=timing.get("nfe_shown"),
                nfe_kept=timing.get("final_nfe"), tokens_at_page_nfe=at_page, shown_from=timing.get("shown_from"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=4, help="browser pages decoding at once")
    ap.add_argument("--tokens", type=int, default=2048, help="max new tokens per page")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (pages opened, Generate, Stop, closed)")
    ap.add_argument("--warmup", type=float, default=8.0, help="seconds of decoding before the Stop")
    ap.add_argument("--compare", action="store_true",
                    help="also serve without pacing (the explorer before it) and print both side by side")
    add_threads_argument(ap)
    args = ap.parse_args(argv)
    configure_threads(args.threads)
    results = {}
    for paced in ((True, False) if args.compare else (True,)):
        label = "paced" if paced else "unpaced (before)"
        print(f"-- {label}", flush=True)
        results[label] = run_rounds(args, paced)
    for label, rows in results.items():
        print(f"{label}: median over {len(rows)} rounds, {args.pages} pages x {args.tokens} tokens: click->stopped "
              f"{statistics.median(r['click_to_stopped_s'] for r in rows):.2f} s, click->server "
              f"{statistics.median(r['click_to_server_s'] for r in rows):.2f} s, kept past shown "
              f"{statistics.median(r['excess_forwards'] for r in rows):.1f} forwards' worth, NFE kept past the page's "
              f"at most {max(r['nfe_kept'] - r['nfe_page'] for r in rows)}, tokens decoded "
              f"before the Stop {statistics.median(r['kept'] for r in rows):.0f}")
    if len(results) == 2:
        (a, pa), (b, pb) = results.items()
        ratio = statistics.median(r["click_to_stopped_s"] for r in pb) / statistics.median(
            r["click_to_stopped_s"] for r in pa)
        print(f"click->stopped, {b} / {a}: {ratio:.1f}x")
    return 0


def run_rounds(args, paced: bool) -> list[dict]:
    chromium = chromium_executable()
    if chromium is None:
        raise SystemExit("no chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    url, sessions, server = serve(dict(model_dir="clover-test", dev_sharpen_random=True, max_new_tokens=args.tokens),
                                  paced=paced)
    rows = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
            for r in range(args.rounds):
                row = one_round(browser, url, sessions, args.pages, args.warmup)
                rows.append(row)
                print(f"round {r + 1}: click->stopped {row['click_to_stopped_s']:.2f} s "
                      f"({row['stopped_in_forwards']:.1f} forwards of {row['forward_ms']:.0f} ms), click->server "
                      f"{row['click_to_server_s']:.2f} s, forwards after the server's stop: "
                      f"{row['forwards_after_request']}, shown {row['shown']} kept {row['kept']} "
                      f"(excess {row['excess_forwards']:.1f} forwards' worth); NFE the page sent with its Stop "
                      f"{row['nfe_page']} (read from its {row['shown_from']}), kept {row['nfe_kept']} (+{row['nfe_kept'] - row['nfe_page']}); "
                      f"{row['forwards_dropped']} forwards run past the page not kept; tokens at the page's NFE "
                      f"{row['tokens_at_page_nfe']} (the card read {row['shown']}), the forward in flight added "
                      f"{row['kept'] - row['tokens_at_page_nfe']}", flush=True)
            browser.close()
    finally:
        server.stop()  # first: then no tick runs on the server's loop while the sessions are closed here
        for s in sessions:
            s.close()
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
