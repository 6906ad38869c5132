"""The tutorials in a real JupyterLab, in headless Chromium (Debian's package) driven by Playwright.

Starts ``jupyter lab`` on a copy of the quickstart and one tutorial, runs every cell in the
browser and checks what a reader sees: every plotly figure drawn with its traces (no blank
figure, no placeholder), no "Error displaying widget", no error output, no page error. On the
quickstart it then moves the notebook Explorer's threshold slider once (exactly one decode
starts), re-runs the Explorer's cell five times (still exactly one decode per slider move:
the previous instances were closed), and reloads the page with the kernel alive (the
Explorer's figures come back drawn, not as placeholders).

Needs JupyterLab (the ``lab`` extra, which the ``test`` extra includes), Playwright and
``/usr/bin/chromium`` (`.ci/run` installs it); skipped, saying so, without them.

Run: ``.venv/bin/python -m pytest tests/apps/test_jupyterlab.py -q``
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import CHROMIUM_ARGS, chromium_or_skip, free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = "01_block_decoding_loop.ipynb"
RUN_TIMEOUT_S = 420  # every cell of one notebook on 2 busy cores
STARTUP_TIMEOUT_MS = 300_000
"""JupyterLab's front end (its extensions' bundles) and a kernel starting up, on 2 busy cores: waited for apart
from, and before, the measured waits of running cells."""
WARM_UP = "import torch, plotly, ipywidgets, clover_viz, clover_engine.checkpoint"
"""Imported in a fresh kernel before the notebook runs, so that the run's wait measures the cells, not imports."""




@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    pytest.importorskip("jupyterlab")
    chromium = chromium_or_skip()
    work = tmp_path_factory.mktemp("lab")
    for name in ("00_quickstart.ipynb", TUTORIAL):
        shutil.copy(ROOT / "notebooks" / name, work / name)
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", JUPYTER_CONFIG_DIR=str(work / ".jupyter"),
               JUPYTER_RUNTIME_DIR=str(work / ".runtime"), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
           f"--ServerApp.root_dir={work}", "--IdentityProvider.token=", "--ServerApp.password=",
           "--ServerApp.disable_check_xsrf=True", "--LabApp.expose_app_in_browser=True",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--ServerApp.open_browser=False", "--allow-root"]
    log = open(work / "lab.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"jupyter lab did not start: {(work / 'lab.log').read_text()[-2000:]}")
            time.sleep(0.5)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield base, browser, work
        finally:
            browser.close()
            stop_process(proc, 20)
            log.close()


JS_NOTEBOOK_DONE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  if (!w || !w.content || !w.sessionContext || !w.sessionContext.session) return false;
  const k = w.sessionContext.session.kernel;
  const cells = w.content.widgets.filter(c => c.model.type === 'code');
  const busy = [...w.node.querySelectorAll('.jp-InputPrompt')].some(e => e.textContent.includes('*'));
  return !!k && k.status === 'idle' && !busy && cells.every(c => c.model.executionCount !== null
      || c.model.sharedModel.getSource().trim() === '');
}"""

JS_FIGURES = """() => [...window.jupyterapp.shell.currentWidget.node.querySelectorAll('.js-plotly-plot')].map(d => ({
  traces: (d.data || []).length, width: d.getBoundingClientRect().width, visible: d.offsetParent !== null,
  notes: ((d.layout || {}).annotations || []).length, title: ((d.layout || {}).title || {}).text || ''}))"""

JS_TEXT = "() => window.jupyterapp.shell.currentWidget.node.innerText"

JS_EXECUTE = """async (code) => {
  const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  let out = '';
  const f = k.requestExecute({code, silent: false, store_history: false});
  f.onIOPub = m => { if (m.header.msg_type === 'stream') out += m.content.text;
                     if (m.header.msg_type === 'error') out += 'ERROR ' + m.content.ename + ': ' + m.content.evalue; };
  await f.done;
  return out;
}"""


def _open(browser, base: str, name: str, errors: list[str]):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.on("pageerror", lambda e: errors.append(str(e)))
    # a fresh workspace per notebook: JupyterLab would otherwise restore the previous test's tabs
    page.goto(f"{base}/lab/tree/{name}?reset", wait_until="domcontentloaded", timeout=STARTUP_TIMEOUT_MS)
    _wait_kernel_idle(page)
    out = page.evaluate(JS_EXECUTE, WARM_UP)  # imports out of the measured run (awaits the reply; no timeout)
    assert "ERROR" not in out, out
    return page


def _wait_kernel_idle(page) -> None:
    """Wait (`STARTUP_TIMEOUT_MS`) until the open notebook's kernel exists and is idle: the front end loaded its
    extensions and the kernel started (or reconnected, after a reload)."""
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget "
                           "&& window.jupyterapp.shell.currentWidget.sessionContext "
                           "&& window.jupyterapp.shell.currentWidget.sessionContext.session "
                           "&& window.jupyterapp.shell.currentWidget.sessionContext.session.kernel "
                           "&& window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status "
                           "=== 'idle'", timeout=STARTUP_TIMEOUT_MS, polling=500)


def _run_all(page) -> None:
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_timeout(1000)
    page.wait_for_function(JS_NOTEBOOK_DONE, timeout=RUN_TIMEOUT_S * 1000, polling=500)
    page.wait_for_timeout(1500)  # let the last widget views render


def _check_rendered(page, errors: list[str], where: str, at_least: int) -> list[dict]:
    # Widget views and plotly renderers draw after the kernel is idle; on a loaded machine that takes
    # a while, so wait (bounded) until the expected number of figures exists before judging them.
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function("(n) => window.jupyterapp.shell.currentWidget.node"
                               ".querySelectorAll('.js-plotly-plot').length >= n", arg=at_least,
                               timeout=STARTUP_TIMEOUT_MS, polling=500)
    except PlaywrightTimeout:
        pass  # judged below, with what the page shows in the message
    page.wait_for_timeout(1000)
    deadline = time.monotonic() + STARTUP_TIMEOUT_MS / 1000  # a figure can be laid out before its traces arrive
    while time.monotonic() < deadline and any(
            f["visible"] and ((f["traces"] == 0 and f["notes"] == 0) or f["width"] < 50)
            for f in page.evaluate(JS_FIGURES)):
        page.wait_for_timeout(500)
    text = page.evaluate(JS_TEXT)  # the open notebook only (the workspace may restore other tabs)
    assert "Error displaying widget" not in text, where
    assert "Traceback" not in text and "Error:" not in text.replace("error: ", ""), where
    figs = page.evaluate(JS_FIGURES)
    assert figs, f"{where}: no plotly figure was drawn"
    # A figure on screen shows traces, or a message ("not applicable", "no previous run yet");
    # figures in the Explorer's other tabs are laid out when their tab opens.
    shown = [f for f in figs if f["visible"]]
    blank = [f for f in shown if (f["traces"] == 0 and f["notes"] == 0) or f["width"] < 50]
    assert shown and not blank, f"{where}: blank figures {blank}"
    assert not errors, f"{where}: page errors {errors[:3]}"
    return figs


def _decodes_started(page) -> int:
    out = page.evaluate(JS_EXECUTE, "print(explorer._decodes_started, explorer.wait(300))")
    n, done = out.split()
    assert done == "True", out
    return int(n)


def _move_threshold_once(page) -> None:
    handles = page.locator(".widget-slider:has-text('threshold') .noUi-handle")
    handles.last.focus()
    handles.last.press("ArrowLeft")  # one step (0.01); the slider sends on release / key-up


def _wait_decodes_started(page, want: int) -> int:
    """Poll the kernel until ``want`` decodes have started (a loaded browser can take seconds to send the slider's
    value), then let a second one show up if the move started two; returns the count."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    n = _decodes_started(page)
    while n < want and time.monotonic() < deadline:
        page.wait_for_timeout(500)
        n = _decodes_started(page)
    page.wait_for_timeout(1500)
    return _decodes_started(page)


def test_tutorial_runs_and_draws_in_jupyterlab(lab):
    base, browser, _ = lab
    errors: list[str] = []
    page = _open(browser, base, TUTORIAL, errors)
    _run_all(page)
    figs = _check_rendered(page, errors, TUTORIAL, at_least=2)
    assert len(figs) >= 2
    page.close()


def test_quickstart_explorer_in_jupyterlab(lab):
    base, browser, work = lab
    errors: list[str] = []
    page = _open(browser, base, "00_quickstart.ipynb", errors)
    _run_all(page)
    figs = _check_rendered(page, errors, "quickstart", at_least=15)
    assert len(figs) >= 15  # the Explorer's ten figures and the static ones

    # One slider move = one decode.
    before = _decodes_started(page)
    _move_threshold_once(page)
    assert _wait_decodes_started(page, before + 1) == before + 1

    # Re-running the Explorer's cell five times leaves one live Explorer: still one decode per move.
    for _ in range(5):
        page.evaluate("""async () => {
          const w = window.jupyterapp.shell.currentWidget;
          const i = w.content.widgets.findIndex(c => c.model.sharedModel.getSource().includes('explorer = Explorer('));
          w.content.activeCellIndex = i;
          await window.jupyterapp.commands.execute('notebook:run-cell');
        }""")
        page.wait_for_function(JS_NOTEBOOK_DONE, timeout=RUN_TIMEOUT_S * 1000, polling=500)
    page.wait_for_timeout(1500)
    assert "Error displaying widget" not in page.evaluate(JS_TEXT)
    assert page.evaluate(JS_EXECUTE, "print(explorer._decodes_started)").strip() == "0"  # a new instance
    _move_threshold_once(page)
    assert _wait_decodes_started(page, 1) == 1

    # Reload with the kernel alive (the notebook saved, as JupyterLab's autosave does): the
    # Explorer's figures come back as drawn, not as the placeholders they were built from.
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_timeout(1500)
    page.reload(wait_until="domcontentloaded", timeout=STARTUP_TIMEOUT_MS)
    _wait_kernel_idle(page)
    page.wait_for_function(JS_NOTEBOOK_DONE, timeout=STARTUP_TIMEOUT_MS, polling=500)
    page.evaluate("""async () => {
      const w = window.jupyterapp.shell.currentWidget;
      const i = w.content.widgets.findIndex(c => c.model.sharedModel.getSource().includes('explorer = Explorer('));
      w.content.activeCellIndex = i;
      await w.content.scrollToItem(i, 'start');
    }""")
    # JupyterLab renders only the cells in view, and a scroll issued while the reloaded notebook is
    # still laying out can land elsewhere: scroll again on every poll until the figures are there.
    page.wait_for_function("""() => {
      const w = window.jupyterapp.shell.currentWidget;
      const i = w.content.widgets.findIndex(c => c.model.sharedModel.getSource().includes('explorer = Explorer('));
      const found = w.content.widgets[i].node.querySelectorAll('.js-plotly-plot').length > 0;
      if (!found) { w.content.scrollToItem(i, 'start'); }
      return found;
    }""", timeout=STARTUP_TIMEOUT_MS, polling=1000)
    page.wait_for_timeout(2000)
    figs = page.evaluate("""() => {
      const w = window.jupyterapp.shell.currentWidget;
      const c = w.content.widgets.find(c => c.model.sharedModel.getSource().includes('explorer = Explorer('));
      return [...c.node.querySelectorAll('.js-plotly-plot')].filter(d => d.offsetParent !== null)
        .map(d => ({traces: (d.data || []).length, title: ((d.layout || {}).title || {}).text || ''}));
    }""")
    assert figs and all(f["traces"] > 0 for f in figs), figs
    assert "Error displaying widget" not in page.evaluate(JS_TEXT)
    assert not errors, errors[:3]
    page.close()
