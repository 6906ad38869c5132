"""Memory across sessions: does a served explorer give back what a closed browser session held?

The explorer is served in this process (Panel's server in a thread, as the browser tests do) and driven by
headless Chromium. Each round opens ``--pages`` pages (default 8), presses Generate on each (the random
``clover-test`` model, ``--tokens`` new tokens), waits for every decode to end, and closes the pages; then
it waits until the server has destroyed those sessions and reads this process's resident memory (RSS,
after a garbage collection). Printed: RSS per round, and the least-squares slope in MB per round over the
rounds after ``--warm`` (the first rounds fill caches: the model, Bokeh's and plotly's templates, ...).
The target: a slope under 1 MB per round once warm -- a closed session keeps nothing.

``--served`` soaks the explorer as a user serves it instead: ``clover-explorer serve`` in a subprocess, its
terminal (stdout and stderr) kept in a log. Printed per round: the server process's RSS and the sessions it
ended; at the end, every line of its terminal that is a warning, an error or a traceback -- the target is none
(a closed tab once logged one warning each).

Run: ``.venv/bin/python benchmarks/soak_sessions.py [--pages 8 --rounds 20] [--served]`` (needs
``/usr/bin/chromium``; about 10-20 s a round on 2 cores).
"""

from __future__ import annotations

import argparse
import gc
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from helpers import CHROMIUM_ARGS, chromium_executable  # noqa: E402
from stop_under_load import serve  # noqa: E402

from clover_engine.threads import add_threads_argument, configure_threads  # noqa: E402


def rss_mb() -> float:
    """This process's resident set size now (MB), from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def slope(ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against 0, 1, 2, ... (units of ys per step)."""
    n = len(ys)
    if n < 2:
        return float("nan")
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2 for i in range(n))


def live_objects() -> dict[str, int]:
    """How many session states, Bokeh documents and plotly figures are still alive (after a collection):
    a closed session's should all be gone."""
    from bokeh.document import Document
    from plotly.basedatatypes import BaseFigure

    from clover_viz.state import ExplorerState

    counts = {"states": 0, "documents": 0, "figures": 0}
    for obj in gc.get_objects():
        if isinstance(obj, ExplorerState):
            counts["states"] += 1
        elif isinstance(obj, Document):
            counts["documents"] += 1
        elif isinstance(obj, BaseFigure):
            counts["figures"] += 1
    return counts


def one_round(browser, url: str, sessions: list, pages: int) -> None:
    opened = []
    for _ in range(pages):
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.set_default_timeout(300_000)
        pg.goto(url)
        pg.get_by_text("press Generate to decode a prompt").first.wait_for()
        opened.append(pg)
    for pg in opened:
        pg.get_by_role("button", name=re.compile("Generate")).first.click()
    for pg in opened:
        pg.locator(".clover-status", has_text=re.compile(r"^done")).first.wait_for()
    for pg in opened:
        pg.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=8, help="browser pages per round")
    ap.add_argument("--rounds", type=int, default=20, help="rounds (open, Generate, wait, close)")
    ap.add_argument("--tokens", type=int, default=64, help="max new tokens per decode")
    ap.add_argument("--warm", type=int, default=3, help="rounds left out of the slope (caches filling)")
    ap.add_argument("--settle", type=float, default=90.0,
                    help="seconds to wait, at most, for the server to end a round's sessions")
    ap.add_argument("--served", action="store_true",
                    help="soak `clover-explorer serve` in a subprocess and report its terminal's warnings")
    add_threads_argument(ap)
    args = ap.parse_args(argv)
    configure_threads(args.threads)
    chromium = chromium_executable()
    if chromium is None:
        print("no chromium (apt-get install -y chromium)")
        return 1
    if args.served:
        return soak_served(args, chromium)
    from tqdm import tqdm
    from playwright.sync_api import sync_playwright

    url, sessions, server = serve(dict(model_dir="clover-test", dev_sharpen_random=True, max_new_tokens=args.tokens))
    rows = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
            for r in tqdm(range(args.rounds), desc="rounds", unit="round"):
                one_round(browser, url, sessions, args.pages)
                deadline = time.monotonic() + args.settle
                while any(not s._closed for s in sessions) and time.monotonic() < deadline:
                    time.sleep(0.5)  # the server ends a closed tab's session (clover_viz.explorer: TAB_GONE_S)
                open_states = sum(not s._closed for s in sessions)
                sessions.clear()  # this script's own references to the states: the server's are what is measured
                gc.collect()
                rows.append(rss_mb())
                alive = live_objects()
                tqdm.write(f"round {r + 1}: RSS {rows[-1]:.1f} MB ({open_states} sessions not yet ended; alive: "
                           + ", ".join(f"{v} {k}" for k, v in alive.items()) + ")")
            browser.close()
    finally:
        server.stop()
    warm = rows[args.warm:]
    print(f"RSS per round (MB): {', '.join(f'{x:.0f}' for x in rows)}")
    print(f"slope after {args.warm} warm-up rounds: {slope(warm):+.2f} MB per round "
          f"({args.pages} pages x {args.tokens} tokens a round; target < 1 MB per round)")
    return 0


ENDED = re.compile(r"Clover Explorer: a session ended")
BAD_LINE = re.compile(r"WARNING|ERROR|Traceback|failed with")


def soak_served(args, chromium: str) -> int:
    """``--served``: the rounds against ``clover-explorer serve`` (a subprocess, ``--threads`` torch threads); its
    terminal's warnings, errors and tracebacks printed at the end (target: none). Returns 0 when there were none."""
    import os
    import subprocess
    import tempfile

    from helpers import free_port, stop_process
    from playwright.sync_api import sync_playwright
    from tqdm import tqdm

    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), CLOVER_MODEL_DIR="clover-test")
    log_path = Path(tempfile.mkdtemp(prefix="clover-soak-")) / "server.log"
    rows = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "clover_explorer", "serve", "--port", str(port), "--address",
                                 "127.0.0.1", "--allow-websocket-origin", f"127.0.0.1:{port}",
                                 "--check-unused-sessions", "1000", "--unused-session-lifetime", "1000"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}/explorer"
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
                for r in tqdm(range(args.rounds), desc="rounds", unit="round"):
                    if r == 0:
                        _wait_listening(proc, port, log_path)
                    one_round(browser, url, [], args.pages)
                    deadline = time.monotonic() + args.settle
                    while len(ENDED.findall(log_path.read_text())) < (r + 1) * args.pages \
                            and time.monotonic() < deadline:
                        time.sleep(0.5)
                    ended = len(ENDED.findall(log_path.read_text()))
                    rss = _rss_of(proc.pid)
                    rows.append(rss)
                    tqdm.write(f"round {r + 1}: server RSS {rss:.1f} MB, sessions ended {ended} of "
                               f"{(r + 1) * args.pages}")
                browser.close()
        finally:
            stop_process(proc)
    text = log_path.read_text()
    bad = [ln for ln in text.splitlines() if BAD_LINE.search(ln)]
    print(f"server RSS per round (MB): {', '.join(f'{x:.0f}' for x in rows)}; slope after {args.warm} warm-up "
          f"rounds {slope(rows[args.warm:]):+.2f} MB per round")
    print(f"served terminal ({log_path}): {len(ENDED.findall(text))} sessions ended, {len(bad)} warning / error "
          f"lines over {args.rounds} rounds x {args.pages} pages (target: 0)")
    for ln in bad[:20]:
        print("  " + ln)
    return 0 if not bad else 1


def _wait_listening(proc, port: int, log_path: Path, timeout_s: float = 120.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {log_path.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"the server did not listen in {timeout_s:.0f} s")
        time.sleep(0.2)


def _rss_of(pid: int) -> float:
    """Resident set size of process ``pid`` now (MB), from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


if __name__ == "__main__":
    raise SystemExit(main())
