"""Test helpers shared by several test modules (import as ``from helpers import ...``;
``tests/`` is on ``sys.path`` through its conftest).

* `CFG`, `CFG_CONV`: the random ``clover-test`` preset, and the same with the short
  causal conv on the attention layers' q/k/v.
* `loud_model`: a random clover-test whose logits are peaked, so decodes accept slots.
* `ReferenceDriven`: a model wrapper whose every forward is answered by
  `CloverModel.forward_reference` (states recomputed from scratch with the token
  loop), recording how far the fast path's logits were from it.
"""

from __future__ import annotations

import dataclasses
import json

import torch

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.backbones.clover.model import CloverModel, random_model

CFG = CloverConfig.from_name("clover-test")
CFG_CONV = dataclasses.replace(CFG, name="clover-test-conv", attention_conv_kernel_dim=3)


def loud_model(seed: int = 0, cfg: CloverConfig = CFG) -> CloverModel:
    """clover-test with weights scaled up so that logits are peaked and history matters
    (the attention convs, if any, get random taps so that they mix neighbours)."""
    m = random_model(cfg, seed, weight_scale=15.0)
    with torch.no_grad():
        for layer in m.layers:
            if layer.layer_type == "full_attention" and layer.self_attn.conv1d is not None:
                layer.self_attn.conv1d.weight.normal_(0.0, 0.7)
    return m.eval()


class ReferenceDriven(torch.nn.Module):
    """Wraps a CloverModel: answers each forward from `forward_reference` on the full
    history (tracked from the commits), and records in ``max_diff`` the largest
    |fast - reference| logit difference seen (the fast path runs too, on its own state)."""

    def __init__(self, model: CloverModel):
        super().__init__()
        self.inner = model
        self.config, self.model_id = model.config, "ref"
        self.history: list[int] = []
        self.max_diff = 0.0

    device = property(lambda self: self.inner.device)
    capabilities = property(lambda self: self.inner.capabilities)
    dtype = property(lambda self: self.inner.dtype)

    def setup_state(self, batch_size=1, memory_mode="state"):
        self.history, self.mode = [], memory_mode
        return self.inner.setup_state(batch_size, memory_mode)

    def forward(self, block_ids, state, commit_ids=None, block_size=None, observe=False):
        fast = self.inner(block_ids, state, commit_ids=commit_ids, block_size=block_size, observe=observe)
        if commit_ids is not None:
            self.history += commit_ids[0].tolist()
        ref = self.inner.forward_reference(torch.tensor([self.history], dtype=torch.long).reshape(1, -1),
                                           block_ids, block_size, self.mode)
        self.max_diff = max(self.max_diff, float((fast.logits - ref.logits).abs().max()))
        ref.expert_union = fast.expert_union  # the reference pass re-reads all history: not this forward's cost
        return ref


# ------------------------------------------------------------------ browser tests
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
"""Flags for headless Chromium in a container (no sandbox, no GPU, nothing fetched in the background)."""


def chromium_executable() -> str | None:
    """Debian's chromium (``$CHROMIUM``, ``/usr/bin/chromium`` or on ``PATH``), or None when absent."""
    import os
    import shutil
    from pathlib import Path

    for cand in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def chromium_or_skip() -> str:
    """Debian's chromium for a browser test (`chromium_executable`), with Playwright importable; else the test is
    skipped, saying what to install (`.ci/run` installs both, so CI never skips here)."""
    import pytest

    pytest.importorskip("playwright.sync_api")
    chromium = chromium_executable()
    if chromium is None:
        pytest.skip("no chromium executable found (install Debian's package: apt-get install -y chromium)")
    return chromium


def stop_process(proc, timeout_s: float = 30.0) -> None:
    """End a server the test started: SIGTERM, then SIGKILL when it is still up after ``timeout_s``."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BROWSER_TIMEOUT_MS = int(__import__("os").environ.get("CLOVER_BROWSER_TIMEOUT_MS", "120000"))
"""Per-wait timeout of the browser tests (each test is bounded by its waits), in ms: 120 s, longer than the
slowest honest wait seen on a 2-core machine with both cores busy (a page's first render, a decode under load).
A wait that succeeds returns as soon as the page is ready, so a long bound costs nothing on a quiet machine;
``$CLOVER_BROWSER_TIMEOUT_MS`` overrides it."""


def scroll_into_view(locator, timeout_ms: int | None = None) -> None:
    """Scroll ``locator``'s element into view, re-querying it when a redraw replaced it meanwhile.

    Panel / Bokeh redraw a view by replacing its DOM nodes; Playwright resolves a locator to one node and
    fails with "Element is not attached to the DOM" when that node is detached between the resolve and the
    scroll. The locator is then resolved again (to the new node), until ``timeout_ms`` (default
    `BROWSER_TIMEOUT_MS`).

    Raises:
        playwright's ``Error``: another failure, or still detached at the deadline.
    """
    import time

    from playwright.sync_api import Error

    deadline = time.monotonic() + (timeout_ms or BROWSER_TIMEOUT_MS) / 1000
    while True:
        try:
            locator.scroll_into_view_if_needed(timeout=max(1000, int((deadline - time.monotonic()) * 1000)))
            return
        except Error as e:
            if "not attached" not in str(e) or time.monotonic() > deadline:
                raise


def wait_for_state(predicate, describe, timeout_ms: int | None = None) -> None:
    """Poll ``predicate()`` (a served session's state, read from the test's thread) until true.

    The page shows a state as soon as the server pushes the first param of it, while the server's thread may
    still be setting the rest (a finished load: ``loading`` off, then the label, then ``model_ok``); a test that
    reads the state right after the page changed races that thread. ``describe()`` goes into the failure.

    Raises:
        AssertionError: still false after ``timeout_ms`` (default `BROWSER_TIMEOUT_MS`).
    """
    import time

    deadline = time.monotonic() + (timeout_ms or BROWSER_TIMEOUT_MS) / 1000
    while not predicate():
        assert time.monotonic() < deadline, describe()
        time.sleep(0.1)


def wait_for_empty_value(page, locator, timeout_ms: int | None = None) -> None:
    """Wait until ``locator``'s input element has an empty ``value``, re-querying it on every poll (an element
    handle held across a redraw would keep watching a detached node and time out)."""
    from playwright.sync_api import expect

    expect(locator).to_have_value("", timeout=timeout_ms or BROWSER_TIMEOUT_MS)


def smollm2_base_installed() -> bool:
    """Whether the pinned SmolLM2 base the smollm2-* adapters need is installed (`.ci/install` installs it)."""
    try:
        from clover_engine.backbones.causal_lm.adapter import locate_base

        locate_base("smollm2-135m-instruct")
        return True
    except Exception:  # noqa: BLE001  (MissingBaseError, or the package absent)
        return False


def slowed_loader(path_part: str, per_tensor_s: float = 0.05, check_memory: bool = False):
    """The explorer's real cached loader (`clover_viz.models.load_model_cached`), each tensor a lean load
    reads slowed by ``per_tensor_s`` when the model's path contains ``path_part``: a Stop surely lands
    while it reads (its progress is reported through the session's `load_progress` watcher).
    ``check_memory``: the served app's memory rule too."""
    import time

    from clover_engine.backbones import load_progress
    from clover_viz import models

    def loader(spec):
        watcher = load_progress.current()
        if watcher is not None and path_part in str(spec.path):
            shown = watcher.on_update

            def slowly(p):
                time.sleep(per_tensor_s)
                if shown is not None:
                    shown(p)

            watcher.on_update = slowly
        return models.load_model_cached(spec, check_memory=check_memory)

    return loader


def uncache_models(path_part: str) -> None:
    """Drop from the explorer's process cache every model whose path contains ``path_part`` (marked
    evicted): another test may have cached it, and the next load must build it."""
    from clover_viz import models

    with models._SLOTS:
        for spec in [s for s in models._MODEL_CACHE if s.path and path_part in s.path]:
            models._MODEL_CACHE.pop(spec).evicted = True


def alive_count(cls: type) -> int:
    """How many objects of exactly ``cls`` are alive after a garbage collection."""
    import gc

    gc.collect()
    return sum(type(o) is cls for o in gc.get_objects())


def split_into_shards(d, shards: int, index: bool = True) -> list[str]:
    """Split ``d/model.safetensors`` into `shards` files (hub names), with an index json if asked."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    names = sorted(weights)
    files, weight_map = [], {}
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: weights[k] for k in names[i::shards]}
        save_file(part, str(d / fname))
        files.append(fname)
        weight_map.update({k: fname for k in part})
    if index:
        total = sum(t.numel() * t.element_size() for t in weights.values())
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                    "weight_map": weight_map}))
    return files
