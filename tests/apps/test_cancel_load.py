"""Stop while a model loads (issue: loads that can be cancelled): the session's state, without a browser.

The load is the real one (`clover_viz.models.load_model_cached`, the lean reader of a tiny LLaDA-MoE
checkpoint written in its hub layout), slowed per tensor by a watcher so that Stop surely lands mid-read:

* while it loads, `load_percent` and the status line count its bytes;
* Stop gives it up at its next tensor and the session is back on the model loaded before it (its
  directory, its label, a Generate decodes with it); the cancelled model is not in the process cache
  and no network object of it stays alive;
* the same model then loads whole (nothing poisoned), and a cancelled first load leaves the session
  saying that no model is loaded.

Run: ``.venv/bin/python -m pytest tests/apps/test_cancel_load.py -q``
"""

from __future__ import annotations

import time

import pytest
from helpers import alive_count, slowed_loader, uncache_models

from clover_engine.backbones.llada_moe import LLaDAMoELM, write_tiny_llada_moe
from clover_viz import models
from clover_viz.state import ExplorerState

slow_loader = slowed_loader("llada-moe")


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return write_tiny_llada_moe(tmp_path_factory.mktemp("cancel") / "tiny-llada-moe", seed=3)


def _tick_until(state, cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state.tick()
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out; status: {state.status!r}")


def test_stop_during_a_load_returns_to_the_model_before_and_keeps_nothing(moe_dir):
    uncache_models(str(moe_dir))
    before = alive_count(LLaDAMoELM)
    s = ExplorerState(loader=slow_loader, model_dir="clover-tiny", model_roots=[moe_dir.parent, models.bundled_dir()],
                      max_new_tokens=16)
    s.background_loads = True
    assert s.load_model() is not None
    tiny_label = s.model_label
    s.model_dir = str(moe_dir)  # the pick: loads in the background
    assert s.loading
    _tick_until(s, lambda: 0 < s.load_percent < 100)
    assert "reading weights:" in s.status and "% of" in s.status, s.status
    thread = s._pending_load["thread"]

    s.stop()  # Stop while it loads
    assert not s.loading and s.load_percent == -1
    assert s.model_dir == "clover-tiny" and s.model_label == tiny_label and s.model_ok
    assert s.status == f"load of tiny-llada-moe cancelled; back to {tiny_label}"
    thread.join(10)
    assert not thread.is_alive()  # the read stopped at its next tensor, not at the end
    assert all(spec.path != str(moe_dir) for spec in models.cached_models())
    assert alive_count(LLaDAMoELM) == before

    assert s.generate()  # the session decodes with the model it went back to
    _tick_until(s, lambda: not s.running)
    assert s.trace.meta["model_label"] == tiny_label and s.trace.meta["model_config"]["name"] == "clover-tiny"
    assert len(s.trace) > 0

    s.model_dir = str(moe_dir)  # nothing poisoned: the same model loads whole
    _tick_until(s, lambda: not s.loading)
    assert s.model_ok and "tiny-llada-moe" in s.model_label, s.status
    s.close()


def test_a_cancelled_first_load_says_no_model_is_loaded(moe_dir):
    uncache_models(str(moe_dir))
    s = ExplorerState(loader=slow_loader, model_dir=str(moe_dir), model_roots=[moe_dir.parent])
    s.background_loads = True
    assert s.start_load()
    _tick_until(s, lambda: s.load_percent > 0)
    s.stop()
    assert not s.loading and not s.model_ok
    assert s.status == "load of tiny-llada-moe cancelled: no model loaded; pick a model"
    assert not s.generate() and "model" in s.error.lower()
    s.close()


def test_an_interrupted_blocking_load_keeps_nothing_and_poisons_nothing(moe_dir):
    """The notebook's Stop is the kernel's interrupt: ``KeyboardInterrupt`` inside the weight read (here
    raised by the watcher at the fifth tensor, where the interrupt would land) leaves no build under way,
    the build lock free, nothing cached, and the next load of the same model works."""
    from clover_engine.backbones.load_progress import LoadProgress, watching
    from clover_engine.backbones.registry import BUILD_LOCK

    uncache_models(str(moe_dir))
    spec = models.resolve_model(str(moe_dir))
    seen = []

    def interrupt(p):
        seen.append(p.done_bytes)
        if len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with watching(LoadProgress(on_update=interrupt)):
            models.load_model_cached(spec)
    assert len(seen) == 5
    assert spec not in models._BUILDING and spec not in models.cached_models()
    assert BUILD_LOCK.acquire(blocking=False)
    BUILD_LOCK.release()
    assert models.load_model_cached(spec).model is not None


def test_only_a_first_smollm2_load_is_told_it_dequantises_its_base(tmp_path, monkeypatch):
    """The long-load hint ("dequantises its base: about a minute") is for a SmolLM2 adapter whose base is not in the
    cache yet; any other model (and a cached base) shows its byte count alone -- a tab joining a Clover model's
    load was once told about SmolLM2."""
    from clover_viz.models import resolve_model
    from clover_viz.session_models import first_load_note

    monkeypatch.setenv("CLOVER_CACHE", str(tmp_path / "empty-cache"))
    note = first_load_note(resolve_model("smollm2-bd"))
    assert "first load of smollm2-bd dequantises its base smollm2-135m-instruct" in note
    for other in ("clover-tiny", "clover-test"):
        assert first_load_note(resolve_model(other)) == "", other
    done = tmp_path / "cache"
    from clover_engine.backbones.causal_lm.adapter import BASES, _base_cache

    monkeypatch.setenv("CLOVER_CACHE", str(done))
    marker = _base_cache(BASES["smollm2-135m-instruct"]) / "done"
    marker.parent.mkdir(parents=True)
    marker.write_text("{}")
    assert first_load_note(resolve_model("smollm2-bd")) == ""  # a cached base loads in seconds: nothing to warn of


def test_a_failed_load_returns_to_the_model_before(moe_dir, tmp_path):
    """A load that fails (here a checkpoint whose shard is cut short, read in the background as the served app
    reads) says why and leaves the session on the model it had: its directory, its label, and a decode."""
    import shutil

    broken = tmp_path / "broken-llada-moe"
    shutil.copytree(moe_dir, broken)
    shard = next(broken.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    s = ExplorerState(model_dir="clover-tiny", model_roots=[tmp_path, models.bundled_dir()], max_new_tokens=8)
    s.background_loads = True
    try:
        assert s.load_model() is not None
        tiny_label = s.model_label
        s.model_dir = str(broken)
        assert s.loading
        _tick_until(s, lambda: not s.loading)
        assert s.error.startswith("Model not loaded:") and s.error.endswith(f"Still decoding with {tiny_label}."), s.error
        assert s.model_dir == "clover-tiny" and s.model_label == tiny_label and s.model_ok
        assert s.status == f"could not load broken-llada-moe: back to {tiny_label} (the error says why)", s.status
        assert s.generate()
        _tick_until(s, lambda: not s.running)
        assert s.trace.meta["model_label"] == tiny_label and len(s.trace) > 0
    finally:
        s.close()
