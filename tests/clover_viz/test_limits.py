"""What a visitor of the served explorer can reach (issue 40): model roots, memory before a load,
the upload limit, the server-wide model cap and one decode per session.

Run: ``.venv/bin/python -m pytest tests/clover_viz/test_limits.py -q``
"""

from __future__ import annotations

import gc
import json
import struct
import threading
import time
import weakref
from pathlib import Path

import pytest

from clover_viz import limits, models
from clover_viz.limits import NotEnoughMemory, model_roots, outside_roots
from clover_viz.models import REPO_ROOT, LoadedModel, ModelSpec, bundled_models, resolve_model

pytest.importorskip("param")

BUNDLED = REPO_ROOT / "models"


def _checkpoint(directory: Path) -> Path:
    """A real random clover-test checkpoint (small, loads in a second)."""
    from clover_engine.backbones.clover.model import random_model
    from clover_engine.checkpoint import save_model

    save_model(random_model("clover-test", 0), directory)
    return directory


@pytest.fixture
def layout(tmp_path, monkeypatch):
    """A server started in ``tmp/server`` (roots: bundled, ./runs, ./models) with a checkpoint in
    ./runs, and outside it an existing checkpoint, a file and a home directory."""
    server, outside = tmp_path / "server", tmp_path / "outside"
    (server / "runs").mkdir(parents=True)
    (server / "models").mkdir()
    secret = outside / "secret-model"
    secret.mkdir(parents=True)
    (secret / "config.json").write_text("{}")
    (outside / "passwd").write_text("root:x:0:0")
    (server / "runs" / "link").symlink_to(secret)  # a symlink inside a root, pointing out
    home = outside / "home"
    (home / ".cache").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(server)
    roots = model_roots((), {}, start_dir=server, bundled=BUNDLED)
    return server, outside, roots


def test_model_roots_default_and_configured(tmp_path, monkeypatch):
    start = tmp_path
    assert model_roots((), {}, start, BUNDLED) == (BUNDLED.resolve(), (start / "runs").resolve(),
                                                  (start / "models").resolve())
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    got = model_roots(["--model-root", str(a), "--other", "x", "--model-root", "b"],
                      {"CLOVER_MODEL_ROOTS": f"{c}"}, start, BUNDLED)
    assert got == (BUNDLED.resolve(), a.resolve(), b.resolve(), c.resolve())  # configured replace ./runs ./models
    # the model the page opens on (CLOVER_MODEL_DIR) is reachable too
    assert (tmp_path / "m").resolve() in model_roots((), {"CLOVER_MODEL_DIR": str(tmp_path / "m")}, start, BUNDLED)


def test_paths_outside_the_roots_get_one_message_whether_or_not_they_exist(layout):
    server, outside, roots = layout
    expected = outside_roots(roots, bundled_models())
    texts = {
        "absolute, an existing checkpoint": str(outside / "secret-model"),
        "absolute, an existing file": str(outside / "passwd"),
        "absolute, missing": str(outside / "no-such-dir"),
        "absolute, a system directory": "/etc",
        "absolute, a system file": "/etc/passwd",
        "dot-dot, existing": "../outside/secret-model",
        "dot-dot, missing": "../outside/nothing-here",
        "dot-dot out of a root": "runs/../../outside/secret-model",
        "deep dot-dot": "../../../../root",
        "a symlink in a root pointing out": "runs/link",
        "home, existing": "~/.cache",
        "home, missing": "~/nothing",
        "home itself": "~",
        "the repository, outside the roots": str(REPO_ROOT / "README.md"),
    }
    got = {}
    for what, text in texts.items():
        with pytest.raises(ValueError) as e:
            resolve_model(text, roots=roots)
        got[what] = str(e.value)
    assert set(got.values()) == {expected}, got
    assert "secret" not in expected and "config.json" not in expected and "no model directory" not in expected
    # the same paths are what a notebook may open (no roots): the existing one is found there
    assert resolve_model(str(outside / "secret-model")).kind == "checkpoint"


def test_the_app_state_refuses_alike_and_keeps_the_notebook_unbounded(layout):
    from clover_viz.state import ExplorerState

    server, outside, roots = layout
    state = ExplorerState(model_dir="clover-test", model_roots=roots, max_new_tokens=8)
    errors = []
    try:
        assert state.load_model() is not None, state.error
        for text in (str(outside / "secret-model"), str(outside / "missing"), "/etc", "/nonexistent"):
            state.model_dir = text
            errors.append(state.error.replace(repr(text), "<text>"))
            assert state.model_ok and state.model_dir == "clover-test"  # refused: the model before it is kept
    finally:
        state.close()
    assert len(set(errors)) == 1 and outside_roots(roots, bundled_models()) in errors[0], errors


def test_bundled_names_and_paths_inside_the_roots_load(layout, monkeypatch):
    server, outside, roots = layout
    for name in bundled_models():  # by name, whatever the start directory
        spec = resolve_model(name, roots=roots)
        assert spec.kind == "checkpoint" and Path(spec.path) == (BUNDLED / name).resolve()
    assert resolve_model("models/clover-tiny", roots=roots).path == str((BUNDLED / "clover-tiny").resolve())
    assert resolve_model("clover-test", roots=roots).kind == "random"
    mine = _checkpoint(server / "runs" / "mine")
    monkeypatch.setattr(models, "_MODEL_CACHE", {})
    for text in ("runs/mine", str(mine), "./runs/../runs/mine"):
        spec = resolve_model(text, roots=roots)
        assert spec.path == str(mine.resolve()), text
    loaded = models.load_model_cached(resolve_model("runs/mine", roots=roots), check_memory=True)
    assert loaded.model.config.name == "clover-test"
    tiny = models.load_model_cached(resolve_model("clover-tiny", roots=roots), check_memory=True)
    assert tiny.model_id and tiny.holds_weights
    # inside a root, a missing directory may say so (the teacher offers that tree)
    with pytest.raises(ValueError, match="no model directory"):
        resolve_model("runs/not-yet", roots=roots)


def test_roots_given_as_text_work_like_paths(layout, monkeypatch):
    """A notebook's ``ExplorerState(model_roots=["runs"])``: folders as text are resolved like the server's
    (they raised AttributeError in the refusal message); one folder as a plain string is one root."""
    server, outside, _ = layout
    mine = _checkpoint(server / "runs" / "mine")
    for roots in (["runs"], "runs", [str(server / "runs")]):
        assert resolve_model("runs/mine", roots=roots).path == str(mine.resolve()), roots
        with pytest.raises(ValueError) as refused:
            resolve_model(str(outside / "secret-model"), roots=roots)
        assert "runs/" in str(refused.value) and "secret" not in str(refused.value), roots


# ----------------------------------------------------------------------------- memory
def _header_only(path: Path, shape: list[int], dtype: str = "F32") -> Path:
    """A safetensors file that is only a header declaring one tensor of ``shape`` (no data)."""
    n = 4
    for s in shape:
        n *= s
    header = json.dumps({"w": {"dtype": dtype, "shape": shape, "data_offsets": [0, n]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return path


def test_weight_bytes_come_from_the_headers():
    path = BUNDLED / "clover-tiny" / "model.safetensors"
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    assert limits.weight_bytes(BUNDLED / "clover-tiny") == path.stat().st_size - 8 - n
    adapter = limits.weight_bytes(BUNDLED / "smollm2-bd")
    own = sum(limits.safetensors_bytes(p) for p in (BUNDLED / "smollm2-bd").glob("*.safetensors"))
    assert adapter >= own
    if limits._pinned_base_bytes("smollm2-135m-instruct"):  # the pinned base installed: its 135M fp32 weights
        assert adapter > 400e6


def test_a_model_too_large_for_free_memory_is_refused_before_allocation(layout, monkeypatch):
    server, outside, roots = layout
    huge = server / "runs" / "huge"
    huge.mkdir()
    (huge / "config.json").write_text(json.dumps({"name": "huge"}))
    _header_only(huge / "model.safetensors", [1_000_000, 1_000_000])  # 4 TB of fp32 declared
    assert limits.weight_bytes(huge) == 4 * 10**12

    def never(spec):
        raise AssertionError(f"the loader ran for {spec}")

    monkeypatch.setattr(models, "build_model", never)
    monkeypatch.setattr(models, "_MODEL_CACHE", {})
    spec = resolve_model("runs/huge", roots=roots)
    with pytest.raises(NotEnoughMemory) as e:
        models.load_model_cached(spec, check_memory=True)
    msg = str(e.value)
    assert "huge" in msg and "4,000.0 GB of weights" in msg and "GB free" in msg, msg
    assert models.cached_models() == [] and not models._BUILDING  # its place is given back
    # the served app's session says it with the numbers, and nothing is loaded
    from clover_viz.state import ExplorerState

    state = ExplorerState(loader=lambda s: models.load_model_cached(s, check_memory=True), model_roots=roots,
                          model_dir="runs/huge")
    try:
        assert state.load_model() is None
        assert "needs about" in state.error and "free" in state.error and not state.model_ok
    finally:
        state.close()


def test_the_memory_rule_is_the_loaders_measured_peak():
    # LLaDA-MoE-7B at its real shape: 14.7 GB of bf16 weights, mapped, peaking at 1.044x with a decode
    # (benchmarks/load_memory_moe.py) -- admitted with 18.5 GB free, refused with 15 GB
    weights = int(7.36e9 * 2)
    limits.check_memory("LLaDA-MoE-7B", weights, free_bytes=int(18.5e9))
    with pytest.raises(NotEnoughMemory, match=r"x1\.05, the measured peak"):
        limits.check_memory("LLaDA-MoE-7B", weights, free_bytes=int(15e9))


def test_check_memory_counts_loads_under_way():
    limits.check_memory("small", 10 * limits.MB, free_bytes=2000 * limits.MB)
    with pytest.raises(NotEnoughMemory, match="taken by loads under way"):
        limits.check_memory("small", 10 * limits.MB, reserved_bytes=1990 * limits.MB, free_bytes=2000 * limits.MB)


# ----------------------------------------------------------------------------- the model cap
class _Weights:
    """Stands in for a model's weights (tracked with a weakref: alive = memory held)."""


def test_eight_callers_loading_at_once_stay_within_the_cap(monkeypatch):
    cap = 3
    monkeypatch.setattr(models, "MODEL_CACHE_SIZE", cap)
    monkeypatch.setattr(models, "_MODEL_CACHE", {})
    alive: list[weakref.ref] = []
    held_at_build: list[int] = []
    lock = threading.Lock()

    def fake_build(spec):
        with models._SLOTS:
            held_at_build.append(len(models._MODEL_CACHE) + len(models._BUILDING))
        with lock:
            gc.collect()
            held_at_build.append(sum(r() is not None for r in alive) + 1)
        w = _Weights()
        time.sleep(0.2)
        with lock:
            alive.append(weakref.ref(w))
        return LoadedModel(spec, w, None, spec.path)

    monkeypatch.setattr(models, "build_model", fake_build)
    specs = [ModelSpec("checkpoint", f"/fake/{i}") for i in range(8)] + [ModelSpec("checkpoint", "/fake/0")] * 3
    got: dict[int, str] = {}

    def visit(i, spec):
        got[i] = models.load_model_cached(spec).spec.path  # the reference is dropped, as an evicted session does

    threads = [threading.Thread(target=visit, args=(i, s)) for i, s in enumerate(specs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == {i: s.path for i, s in enumerate(specs)}
    assert max(held_at_build) <= cap, held_at_build
    gc.collect()
    assert sum(r() is not None for r in alive) <= cap
    assert len(models.cached_models()) <= cap and len(alive) >= 8


def test_an_evicted_session_is_told_and_reloads_cleanly(tmp_path, monkeypatch):
    """Sessions holding models: the ones evicted let go (memory freed within a tick), and the next
    Generate says why it loads again, reloads and decodes."""
    from clover_viz.state import ExplorerState
    from clover_engine.backbones.clover.model import random_model
    from clover_engine.tokenizer import byte_tokenizer

    cap = 2
    monkeypatch.setattr(models, "MODEL_CACHE_SIZE", cap)
    monkeypatch.setattr(models, "_MODEL_CACHE", {})
    alive: list[weakref.ref] = []
    builds: list[str] = []

    def fake_build(spec):
        m = random_model("clover-test", 0, 15.0)
        alive.append(weakref.ref(m))
        builds.append(spec.path)
        return LoadedModel(spec, m, byte_tokenizer(), Path(spec.path).name)

    monkeypatch.setattr(models, "build_model", fake_build)
    dirs = []
    for i in range(5):
        d = tmp_path / f"m{i}"
        d.mkdir()
        (d / "config.json").write_text("{}")
        dirs.append(d)
    states = [ExplorerState(model_dir=str(d), model_roots=(tmp_path.resolve(),), background_loads=True,
                            prompt="Hello", max_new_tokens=8, block_size=8, memory_mode="state") for d in dirs]
    try:
        deadline = time.monotonic() + 60
        for s in states:  # five sessions open at once, as the served app loads them
            assert s.start_load()
        while any(s.loading for s in states):
            assert time.monotonic() < deadline
            for s in states:
                s.tick(0.1)
            time.sleep(0.05)
        assert all(s.model_ok for s in states)
        gc.collect()
        assert sum(r() is not None for r in alive) <= cap, [s._loaded.holds_weights for s in states]
        evicted = next(s for s in states if s._loaded.evicted)
        assert evicted.model_label  # the page still names its model
        assert evicted.generate()
        assert "was unloaded to make room" in evicted.status and evicted.loading
        while evicted.loading or evicted.running or evicted.trace is None:
            assert time.monotonic() < deadline, evicted.status
            evicted.tick(0.1)
            time.sleep(0.05)
        assert evicted.wait(30) and evicted.status.startswith("done"), (evicted.status, evicted.error)
        assert evicted._loaded.holds_weights and not evicted._loaded.evicted
    finally:
        for s in states:
            s.close()


# ----------------------------------------------------------------------------- uploads and decodes
def test_an_upload_over_the_limit_or_malformed_changes_nothing():
    from clover_viz.state import ExplorerState

    small = Path(__file__).resolve().parents[1] / "data" / "small_trace.parquet"
    state = ExplorerState(model_dir="clover-test", max_new_tokens=8, max_upload_bytes=small.stat().st_size)
    try:
        assert state.load_trace(small.read_bytes(), name="small.parquet")
        shown, status = state.trace, state.status
        assert not state.load_trace(b"PAR1" + b"\0" * small.stat().st_size, name="big.parquet")
        assert "'big.parquet' is" in state.error and "up to" in state.error
        assert state.trace is shown and state.status == status
        assert not state.load_trace(b"PAR1 not really", name="bad.parquet")
        assert "Trace not loaded: 'bad.parquet'" in state.error and state.trace is shown
    finally:
        state.close()


def test_the_upload_limit_fits_the_default_websocket():
    assert limits.websocket_bytes_for(limits.DEFAULT_MAX_UPLOAD_MB * limits.MB) <= 20 * limits.MB
    for n in (1000, 12 * limits.MB, 64 * limits.MB):
        assert limits.upload_limit_for_socket(limits.websocket_bytes_for(n)) >= n


def test_a_session_runs_one_decode_at_a_time(monkeypatch):
    """A Generate while a decode runs: the new decode starts only once the old one's thread has ended."""
    from clover_viz.state import ExplorerState
    from clover_engine.decoding import decoder as decoder_module

    active, most = [0], [0]
    lock = threading.Lock()
    original = decoder_module.BlockDecoder.generate

    def counted(self, *a, **k):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            time.sleep(0.3)  # a long forward: the cancel is seen only after it
            return original(self, *a, **k)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(decoder_module.BlockDecoder, "generate", counted)
    state = ExplorerState(model_dir="clover-test", prompt="Hello", max_new_tokens=8, block_size=8,
                          memory_mode="state")
    try:
        for _ in range(3):
            assert state.generate()
        assert state.wait(30)
    finally:
        state.close()
    assert most[0] == 1


def test_a_load_is_given_up_when_its_session_closes(monkeypatch):
    """Waiting for a place: the wait ends at once. Building: the build finishes (torch cannot stop
    mid-read) but its model is thrown away, not cached -- unless another session waits for it."""
    monkeypatch.setattr(models, "MODEL_CACHE_SIZE", 1)
    monkeypatch.setattr(models, "_MODEL_CACHE", {})
    release = threading.Event()

    def slow_build(spec):
        release.wait(10)
        return LoadedModel(spec, _Weights(), None, spec.path)

    monkeypatch.setattr(models, "build_model", slow_build)
    a, b = ModelSpec("checkpoint", "/fake/a"), ModelSpec("checkpoint", "/fake/b")
    closed_a, closed_b = threading.Event(), threading.Event()
    out: dict[str, object] = {}

    def load(key, spec, cancel):
        try:
            out[key] = models.load_model_cached(spec, cancel=cancel)
        except models.LoadCancelled as exc:
            out[key] = exc

    ta = threading.Thread(target=load, args=("a", a, closed_a))
    ta.start()
    time.sleep(0.2)  # a builds; b waits for the only place
    tb = threading.Thread(target=load, args=("b", b, closed_b))
    tb.start()
    time.sleep(0.2)
    closed_b.set()
    tb.join(5)
    assert isinstance(out["b"], models.LoadCancelled)
    closed_a.set()  # a's tab closes mid-build
    release.set()
    ta.join(5)
    assert isinstance(out["a"], models.LoadCancelled) and models.cached_models() == []
    # the same, with a second session waiting for the same model: it is kept for that one
    release.clear()
    closed_a.clear()
    ta = threading.Thread(target=load, args=("a", a, closed_a))
    ta.start()
    time.sleep(0.2)
    tc = threading.Thread(target=load, args=("c", a, None))
    tc.start()
    time.sleep(0.3)
    closed_a.set()
    release.set()
    ta.join(5)
    tc.join(5)
    assert isinstance(out["c"], LoadedModel) and models.cached_models() == [a]


def test_the_page_shows_the_memory_estimate_while_a_model_loads(tmp_path):
    """The served app's memory rule is shown before the weights are read: the status line of a background load
    says what the model needs and what the server has free (the numbers the refusal would give), and the
    ready line keeps them."""
    from helpers import slowed_loader, uncache_models

    from clover_engine.backbones.llada_moe import write_tiny_llada_moe
    from clover_viz.state import ExplorerState

    moe = write_tiny_llada_moe(tmp_path / "tiny-llada-moe", seed=5)
    uncache_models(str(moe))
    need = limits.weight_bytes(moe)
    slow = slowed_loader("llada-moe", check_memory=True)  # slowed per tensor, checked as the served app's loader is
    state = ExplorerState(loader=slow, model_dir="clover-tiny",
                          model_roots=[tmp_path, BUNDLED], max_new_tokens=8)
    state.background_loads = True
    try:
        assert state.load_model() is not None
        state.model_dir = str(moe)
        seen = []
        deadline = time.monotonic() + 60
        while state.loading and time.monotonic() < deadline:
            state.tick()
            seen.append(state.status)
            time.sleep(0.02)
        want = f"needs about {limits._gb(limits.memory_need_bytes(need))} to load and decode ({limits._gb(need)} of weights"
        during = [t for t in seen if t.startswith("loading tiny-llada-moe") and want in t]
        assert during and "the server has" in during[-1] and "GB free" in during[-1], seen[-5:]
        assert state.model_ok and state.status.startswith("ready:") and want in state.status, state.status
    finally:
        state.close()
