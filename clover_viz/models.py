"""Model resolution and loading for every front end: the Panel app, the notebook `Explorer`,
the notebooks and the benchmarks all load through here (one loader, one cache, one label).

* `resolve_model(text)` turns what a user typed (a checkpoint directory, a bundled
  model's name, ``"clover-test"``, a hub id ``org/name[@revision]``) into a hashable `ModelSpec`
  without loading (nor downloading) anything. The bundled
  models are the checkout's ``models/``, or the installed wheel's copy of it (`bundled_dir`).
* `build_model(spec)` loads it (slow); `load_model_cached(spec)` does so once per process, holding at
  most `MODEL_CACHE_SIZE` models (the least recently used is unloaded and marked ``evicted``).
* `load_demo_model()` is the notebooks' and benchmarks' entry point: the bundled model, or
  the labelled random stand-in.
* `LoadedModel.in_memory(model, tokenizer)` wraps a model a notebook already holds.

The random stand-in: when `model_dir` is the default (`DEFAULT_MODEL_DIR`) and that
directory holds no checkpoint yet (the bundled model is trained separately), or when it is
``"clover-test"``, a ``clover-test`` model with seeded random weights and the byte
tokenizer is used and labelled so (`RANDOM_MODEL_LABEL`). ``dev_scale`` (the explorer's
"sharpen" option; `load_demo_model` always) multiplies its matrices by
`DEV_WEIGHT_SCALE` so its confidences spread over (0, 1) like a trained model's -- its
text is still noise.

The cache is a module-level dict behind a lock, not ``pn.cache``: this module has no Panel
import (the ipywidgets `Explorer`, the notebooks and the benchmarks run without Panel),
and ``pn.cache`` runs the function outside its lock, so two sessions opening at once would
each build the same model; here the second waits for the first.

Tests: ``.venv/bin/python -m pytest tests/apps/test_explorer_app.py -q``
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clover_viz import limits
from clover_viz.limits import as_roots, inside_roots, listed_hub_id, outside_roots
from clover_engine.backbones import load_progress
from clover_engine.backbones.load_progress import LoadCancelled, LoadProgress
from clover_engine.backbones.hub import hub_snapshot, parse_hub_id
from clover_engine.backbones.base import Capabilities, capabilities_of
from clover_engine.backbones.registry import BUILD_LOCK
from clover_engine.checkpoint import DEFAULT_MODEL_DIR, file_as_model_dir  # one place for the default and the message
from clover_engine.checkpoint import bundled_models_dir
from clover_engine.backbones.clover.model import random_model
from clover_engine.checkpoint import load_model, load_tokenizer
from clover_engine.tokenizer import byte_tokenizer
from clover_engine.decoding import decoder_for  # picks a model's decoder by its capabilities; imports it only when called

REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout (site-packages when installed from the wheel)
RANDOM_MODEL_NAME = "clover-test"
RANDOM_MODEL_LABEL = "random clover-test (no trained model found)"
RANDOM_MODEL_SEED = 0
DEV_WEIGHT_SCALE = 15.0
MODEL_CACHE_SIZE = 4  # models held or being built per process, at most (least recently used unloaded first)


@dataclass(frozen=True)
class ModelSpec:
    """What `model_dir` resolves to (hashable: the model cache key).

    Attributes:
        kind: ``"checkpoint"`` (a directory on disk), ``"hub"`` (a model on the Hugging Face hub, fetched
            into the huggingface_hub cache when loaded: `clover_engine.backbones.hub`), ``"random"``
            (seeded clover-test) or ``"in_memory"`` (a model object handed over by a notebook; never cached).
        path: the resolved directory; the hub id (``org/name[@revision]``) of a ``"hub"`` spec; else ``""``.
        mtime_ns: modification time of the directory's weights (reloads a re-trained model).
        dev_scale: weight multiplier of a random model (1.0 = none; the dev option).
        fallback: True when the default directory was missing and the random model stands in.
    """

    kind: str
    path: str = ""
    mtime_ns: int = 0
    dev_scale: float = 1.0
    fallback: bool = False


@dataclass
class LoadedModel:
    """A model ready to decode: the model, its tokenizer, and how to label it in the UI.

    ``decoder``: an ``clover_engine.decoding.decoder.BlockDecoder`` over this model to decode with instead
    of a new one (a notebook handed one over; its registered hooks then fire too), or None.
    ``evicted``: set by the model cache when it dropped this model to make room
    (`load_model_cached`); a session holding it reloads before its next decode.
    """

    spec: ModelSpec
    model: Any
    tokenizer: Any
    label: str
    decoder: Any = None
    evicted: bool = dataclasses.field(default=False, compare=False)

    @property
    def holds_weights(self) -> bool:
        """False for what `unloaded` returns."""
        return not isinstance(self.model, _Unloaded)

    def unloaded(self) -> LoadedModel:
        """This model's description without its weights (config, id, capabilities, label, tokenizer): what a
        session keeps of an evicted model, so the memory is freed while the page still names it."""
        return dataclasses.replace(self, model=_Unloaded(self.config, self.model_id, self.capabilities),
                                   decoder=None, evicted=True)

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def model_id(self) -> str:
        """The id traces record: ``model.model_id`` (set by the loaders), else the config's name."""
        return str(getattr(self.model, "model_id", None) or self.model.config.name)

    @property
    def fallback(self) -> bool:
        """True when the random clover-test model stands in for a missing default checkpoint."""
        return self.spec.fallback

    @property
    def capabilities(self) -> Capabilities:
        """What the model declares it can do (`clover_engine.backbones.base.Capabilities`)."""
        return capabilities_of(self.model)

    @property
    def window_available(self) -> bool:
        """Whether ``state+window`` can run (one of the model's declared memory modes)."""
        return self.capabilities.runs("state+window")

    @classmethod
    def in_memory(cls, model: Any, tokenizer: Any = None, label: str | None = None,
                  decoder: Any = None) -> LoadedModel:
        """Wrap a model object a caller already holds (not loaded from disk, not cached).

        Args:
            model: a ``torch.nn.Module`` with the decoder protocol (``CloverModel``, an HF
                block model).
            tokenizer: its tokenizer (None: prompts must be token ids).
            label: how the UI names it (default ``"<model_id> (in memory)"``).
            decoder: a ``BlockDecoder`` over ``model`` to decode with (see the class doc).
        """
        loaded = cls(ModelSpec("in_memory"), model, tokenizer, "", decoder)
        loaded.label = label or f"{loaded.model_id} (in memory)"
        return loaded


@dataclass(frozen=True)
class _Unloaded:
    """What `LoadedModel` reads from a model that was unloaded (`LoadedModel.unloaded`)."""

    config: Any
    model_id: str
    capabilities: Capabilities


def bundled_dir() -> Path:
    """The bundled models' folder: the checkout's ``models/``, or the installed wheel's copy of it
    (`clover_engine.checkpoint.bundled_models_dir` beside these packages, `REPO_ROOT`)."""
    return bundled_models_dir(REPO_ROOT)


def runs_dir() -> Path:
    """Where the tutorials write what they record: the checkout's ``runs/`` (whatever the notebook's folder),
    or ``runs/`` of the working directory when installed from the wheel (the tutorials' copy)."""
    return REPO_ROOT / "runs" if bundled_dir() == REPO_ROOT / "models" else Path.cwd() / "runs"


def bundled_models() -> list[str]:
    """Names of the bundled models (`bundled_dir`'s directories holding a ``config.json``), the default
    one first."""
    root = bundled_dir()
    names = sorted(p.name for p in root.iterdir() if (p / "config.json").is_file()) if root.is_dir() else []
    default = Path(DEFAULT_MODEL_DIR).name
    return sorted(names, key=lambda n: n != default)


def bundled_purpose(name: str) -> str:
    """A bundled model's one-line purpose: the ``**Purpose:** ...`` line of its card
    (``models/<name>/README.md``), without the label; ``""`` when the card has none."""
    card = bundled_dir() / name / "README.md"
    try:
        for line in card.read_text(encoding="utf-8").splitlines()[:12]:
            if line.startswith("**Purpose:**"):
                return line.removeprefix("**Purpose:**").strip()
    except OSError:
        pass
    return ""


def resolve_model(model_dir: str, dev_sharpen_random: bool = False,
                  roots: Sequence[Path] | None = None) -> ModelSpec:
    """Turn the model-directory text into a `ModelSpec` (no loading).

    Relative paths are tried against the working directory, then the repository root (in a checkout); a
    bare name and ``models/<name>`` also as a bundled model (``clover-tiny``, ``smollm2-bd``: `bundled_dir`,
    so the default works from an installed wheel too). A text shaped ``org/name[@revision]`` that names no
    directory is a hub id (`clover_engine.backbones.hub.parse_hub_id`): a ``"hub"`` spec, fetched when
    loaded (`load_model_cached`), not here.

    Args:
        roots: the served app's model roots (`clover_viz.limits.model_roots`; folders as `Path` or text): only places inside
            them are looked at (after resolving symlinks, ``..`` and ``~``), and a text naming none
            gets one message whether or not it exists (`clover_viz.limits.OUTSIDE_ROOTS`). A bundled
            model's name always works; a hub id only when the roots list it (``--model-id``,
            `clover_viz.limits.ListedHubId`), any other gets that same message. None (notebooks, the
            command line): any path, any hub id.

    Raises:
        ValueError: for a directory that does not exist (other than the default one), a file
            (`clover_engine.checkpoint.file_as_model_dir`, the command line's message) or a directory
            without ``config.json``, saying what to pass instead; with ``roots``, for a path outside them
            or a hub id they do not list.
    """
    text = (model_dir or "").strip()
    scale = DEV_WEIGHT_SCALE if dev_sharpen_random else 1.0
    if text == RANDOM_MODEL_NAME:
        return ModelSpec("random", dev_scale=scale)
    if not text:
        raise ValueError(
            f"the model directory is empty; enter a checkpoint directory (default {DEFAULT_MODEL_DIR}) "
            f"or '{RANDOM_MODEL_NAME}' for a random test model"
        )
    path = Path(text).expanduser()
    bundled = bundled_dir()
    candidates = [path] if path.is_absolute() else [Path.cwd() / path]
    if not path.is_absolute() and bundled == REPO_ROOT / "models":  # a checkout: its paths from anywhere
        candidates.append(REPO_ROOT / path)
    if not path.is_absolute() and (len(path.parts) == 1 or path.parts[0] == "models" and len(path.parts) == 2):
        candidates.append(bundled / path.name)  # a bundled model by name ("smollm2-bd") or as models/<name>
    roots = as_roots(roots)  # folders given as text too (a notebook's ``model_roots=["models"]``)
    if roots is not None:  # the served app: nothing outside its roots is looked at, nor said to exist
        if text in bundled_models():
            candidates = [bundled / text]
        candidates = [p for p in candidates if inside_roots(p, roots)]
        if not candidates:
            hub = listed_hub_id(text, roots)  # a hub model the host listed; any other id: the same refusal
            if hub is not None:
                return ModelSpec("hub", hub)
            raise ValueError(outside_roots(roots, bundled_models()))
    found = next((p for p in candidates if p.is_dir()), None)
    if found is None:
        a_file = next((p for p in candidates if p.is_file()), None)
        if a_file is not None:  # the command line's message for the same mistake (clover_engine.checkpoint)
            raise ValueError(file_as_model_dir(text, a_file))
        if text.rstrip("/") == DEFAULT_MODEL_DIR:
            return ModelSpec("random", dev_scale=scale, fallback=True)
        hub = parse_hub_id(text) if roots is None else listed_hub_id(text, roots)
        if hub is not None:  # no such folder: a model on the hub (fetched when loaded)
            return ModelSpec("hub", str(hub))
        raise ValueError(
            f"no model directory at {text!r}; enter a checkpoint directory holding config.json and "
            f"model.safetensors (default {DEFAULT_MODEL_DIR}), or '{RANDOM_MODEL_NAME}' for a random test model"
        )
    found = found.resolve()
    if not (found / "config.json").is_file():
        if text.rstrip("/") == DEFAULT_MODEL_DIR:  # the bundled model is still being trained
            return ModelSpec("random", dev_scale=scale, fallback=True)
        raise ValueError(
            f"{text!r} is a directory but has no config.json; a checkpoint directory holds config.json, "
            "model.safetensors and tokenizer.json"
        )
    weights = [p for p in (found / "model.safetensors", found / "model.safetensors.index.json") if p.is_file()]
    mtime = max((p.stat().st_mtime_ns for p in weights), default=0)
    return ModelSpec("checkpoint", str(found), mtime)


def build_model(spec: ModelSpec) -> LoadedModel:
    """Load (or build) the model a `ModelSpec` names. Slow: call through `load_model_cached`.

    Raises:
        ValueError: from `clover_engine.checkpoint` for a damaged or mismatched checkpoint; for an
            ``in_memory`` spec (there is nothing to load: use `LoadedModel.in_memory`).
    """

    if spec.kind == "random":
        model = random_model(RANDOM_MODEL_NAME, RANDOM_MODEL_SEED, spec.dev_scale,
                             device=None if DEVICE == "cpu" else DEVICE)
        label = RANDOM_MODEL_LABEL if spec.fallback else f"random {RANDOM_MODEL_NAME}"
        if spec.dev_scale != 1.0:
            label += f" [dev: weights x{spec.dev_scale:g}]"
        return LoadedModel(spec, model, byte_tokenizer(), label)
    if spec.kind not in ("checkpoint", "hub"):
        raise ValueError(f"a {spec.kind!r} model spec names nothing to load; wrap the model with "
                         "LoadedModel.in_memory(model, tokenizer)")
    path = _spec_dir(spec)
    model = load_model(path, device=DEVICE)
    if spec.kind == "hub":  # traces name the hub model, not its snapshot's commit folder
        model.model_id = spec.path
    if capabilities_of(model).sampler != "block":  # DiffusionGemma: its own sampler (clover_engine.decoding.decoder_for)
        return _own_sampler(spec, model)
    try:
        tokenizer = load_tokenizer(path)
    except ValueError:
        tok = byte_tokenizer()
        if model.config.vocab_size < tok.get_vocab_size() or model.config.mask_token_id != tok.token_to_id(
                "<|mask|>"):
            raise
        tokenizer = tok  # a byte-level checkpoint saved without tokenizer.json
    return LoadedModel(spec, model, tokenizer, _spec_name(spec))


def _spec_dir(spec: ModelSpec) -> str:
    """The checkpoint directory of a ``checkpoint`` or ``hub`` spec: a hub model's snapshot in the
    huggingface_hub cache (`load_model_cached` has fetched it already, outside the build lock)."""
    return str(hub_snapshot(spec.path)) if spec.kind == "hub" else spec.path


def _spec_name(spec: ModelSpec) -> str:
    """How labels and messages name a loaded model: ``clover-tiny (models/clover-tiny)``, ``org/name (hub)``."""
    return f"{spec.path} (hub)" if spec.kind == "hub" else f"{Path(spec.path).name} ({_shown_path(spec.path)})"


def _own_sampler(spec: ModelSpec, model: Any) -> LoadedModel:
    """A model that runs its own sampler (DiffusionGemma) as a `LoadedModel`. Its folder's ``tokenizer.json``
    is read with the tokenizers library, as for every other model here (the same pipeline a transformers
    fast tokenizer wraps, post-processor and BOS included); without one, the tokenizer its decoder brings
    (`clover_engine.decoding.decoder_for`: the model's own), or token ids."""
    try:
        tokenizer = load_tokenizer(_spec_dir(spec))
    except ValueError:
        tokenizer = decoder_for(model).tokenizer
    return LoadedModel(spec, model, tokenizer, _spec_name(spec)[:-1] + "; DiffusionGemma, revisable)")


def _shown_path(path: str) -> str:
    """``path`` relative to the repository when inside it, a bundled model as ``models/<name>`` (labels,
    saved notebooks and screenshots carry no machine's absolute paths, the same from an installed wheel),
    else as given."""
    real = Path(path).resolve()
    try:
        return "models/" + real.relative_to(bundled_dir().resolve()).as_posix()
    except ValueError:
        pass
    try:
        return real.relative_to(REPO_ROOT.resolve()).as_posix()
    except ValueError:
        return path


DEVICE = os.environ.get("CLOVER_DEVICE", "").strip() or "cpu"
"""Torch device the explorer's models decode on (``CLOVER_DEVICE``: ``cpu``, ``cuda``, ``cuda:1`` ...)."""

_MODEL_CACHE: dict[ModelSpec, LoadedModel] = {}  # least recently used first
_SLOTS = threading.Condition()  # guards the dicts below; never held while a model builds
_BUILDING: dict[ModelSpec, int] = {}  # spec -> weight bytes reserved by its build under way
_WAITERS: dict[ModelSpec, int] = {}  # spec -> callers waiting for its build (a cancelled build still serves them)


def load_model_cached(spec: ModelSpec, cancel: threading.Event | None = None,
                      check_memory: bool = False) -> LoadedModel:
    """`build_model` once per process and spec (sessions share models; decoding never mutates them).

    At most `MODEL_CACHE_SIZE` models are held or being built at once, process-wide: a new one
    first unloads the least recently used (marked ``evicted``; a session holding it reloads before
    its next decode), and when every place is taken by a build under way, it waits for one. Two
    callers asking for the same spec share one build; a model already cached is returned at once
    to every other caller (another browser session) while some other model builds.

    Progress and Stop: a caller that watches its thread's loads (`clover_engine.backbones.load_progress.watching`,
    the explorer's load thread) sees the download's and the weight reading's bytes in its `LoadProgress`,
    and its ``should_stop`` cancels the load like ``cancel`` does.

    Args:
        cancel: set when the caller has gone (a closed tab) or gives the load up (Stop): a wait ends
            with `LoadCancelled`; a download or a lean weight read stops at its next tensor or chunk
            (`clover_engine.backbones.load_progress`; transformers' own reading between its phases),
            unless another caller waits for the same model; and a build that finishes for nobody else
            is thrown away rather than cached. Nothing half-built stays referenced.
        check_memory: refuse a model whose weights would not fit in the free memory
            (`clover_viz.limits.check_memory`; the served app), before anything is allocated.

    A ``hub`` spec's snapshot is fetched into the huggingface_hub cache first (tqdm bars on the server's
    stderr), outside the build lock: other models build meanwhile.

    Raises:
        LoadCancelled: ``cancel`` was set, or the watcher's ``should_stop`` answered True (nothing is cached).
        clover_viz.limits.NotEnoughMemory: with ``check_memory``.
        ValueError: a hub model that cannot be had (`clover_engine.backbones.hub.hub_snapshot`), or a
            checkpoint that does not load (`build_model`).

    Thread-safe: builds of different specs run one at a time (the engine's
    `clover_engine.backbones.registry.BUILD_LOCK`: building is not thread-safe), the others queue
    (`waiting_for_another_load`); a failed build releases its place and the lock, and poisons nothing.
    """
    outer = load_progress.current()  # the caller's watcher: its progress bar and its Stop

    def gone() -> bool:
        return (cancel is not None and cancel.is_set()) or (outer is not None and outer.should_stop())

    with _SLOTS:
        while True:
            hit = _MODEL_CACHE.pop(spec, None)
            if hit is not None:
                _MODEL_CACHE[spec] = hit  # most recently used: last
                return hit
            if spec not in _BUILDING:
                if len(_MODEL_CACHE) + len(_BUILDING) < MODEL_CACHE_SIZE:
                    break
                if _MODEL_CACHE:
                    _MODEL_CACHE.pop(next(iter(_MODEL_CACHE))).evicted = True
                    continue
            _WAITERS[spec] = _WAITERS.get(spec, 0) + 1  # for its own build under way, or for a place
            try:
                _SLOTS.wait(0.25)
            finally:
                _WAITERS[spec] -= 1
                if not _WAITERS[spec]:
                    del _WAITERS[spec]
            if gone():
                raise LoadCancelled(f"the load of {spec.path or spec.kind} was cancelled")
        _BUILDING[spec] = 0
    # the build stops at its next report once its caller is gone, unless another caller waits for it
    watch = load_progress.LoadProgress(should_stop=lambda: gone() and not _WAITERS.get(spec),
                                       on_update=None if outer is None else _mirror(outer))
    try:
        with load_progress.watching(watch):
            directory = _spec_dir(spec) if spec.kind in ("checkpoint", "hub") else ""  # a download: before the build lock
            if check_memory and directory:
                need = limits.weight_bytes(directory)
                with _SLOTS:
                    estimate = limits.check_memory(_spec_name(spec), need, sum(_BUILDING.values()))
                    _BUILDING[spec] = need
                if outer is not None:  # the page shows it while the weights are read
                    outer.estimate = estimate
            _acquire_build_lock(gone)
            try:
                watch.phase = "building"
                loaded = build_model(spec)
            finally:
                BUILD_LOCK.release()
    except BaseException:
        with _SLOTS:
            del _BUILDING[spec]
            _SLOTS.notify_all()
        raise
    with _SLOTS:
        del _BUILDING[spec]
        _SLOTS.notify_all()
        if gone() and not _WAITERS.get(spec):
            raise LoadCancelled(f"the load of {spec.path or spec.kind} was cancelled")
        while len(_MODEL_CACHE) + len(_BUILDING) >= MODEL_CACHE_SIZE and _MODEL_CACHE:
            _MODEL_CACHE.pop(next(iter(_MODEL_CACHE))).evicted = True
        _MODEL_CACHE[spec] = loaded
        _SLOTS.notify_all()
    return loaded


def _mirror(outer: LoadProgress):
    """``on_update`` for the cache's own watcher: copy its phase and bytes onto the caller's ``outer``."""

    def update(p: LoadProgress) -> None:
        outer.phase, outer.done_bytes, outer.total_bytes = p.phase, p.done_bytes, p.total_bytes
        if outer.on_update is not None:
            outer.on_update(outer)

    return update


_QUEUED: set[int] = set()  # idents of the threads waiting for another model's build (`BUILD_LOCK`)


def _acquire_build_lock(gone) -> None:
    """Take the engine's process-wide build lock (models are built one at a time: building is not
    thread-safe), counted in `_QUEUED` while another build holds it, so a session can say it waits.

    Raises:
        LoadCancelled: ``gone()`` answered True while waiting (nothing was built).
    """
    if BUILD_LOCK.acquire(blocking=False):
        return
    me = threading.get_ident()
    with _SLOTS:
        _QUEUED.add(me)
    try:
        while not BUILD_LOCK.acquire(timeout=0.25):
            if gone():
                raise LoadCancelled("the load was cancelled while it waited for another model's load")
    finally:
        with _SLOTS:
            _QUEUED.discard(me)


def waiting_for_another_load(thread: threading.Thread) -> int:
    """0 when ``thread`` is not queued behind another model's build; else how many loads are queued
    (itself included) -- a session shows "waiting for another load" meanwhile."""
    with _SLOTS:
        return len(_QUEUED) if thread.ident in _QUEUED else 0


def cached_models() -> list[ModelSpec]:
    """The specs the process holds loaded now, least recently used first."""
    with _SLOTS:
        return list(_MODEL_CACHE)


def load_demo_model(model_dir: str | Path = DEFAULT_MODEL_DIR, allow_fallback: bool = True) -> LoadedModel:
    """The model the notebooks and benchmarks decode with (cached, shared with the explorer).

    ``model_dir`` is resolved as in the explorer (`resolve_model`: a directory, a bundled
    model's name, ``"clover-test"``). When it names no directory and ``allow_fallback``,
    the random clover-test model stands in with its weights x`DEV_WEIGHT_SCALE` (peaked
    confidences: a decode shows accepted as well as forced slots), labelled so.

    Returns:
        a `LoadedModel` (``.model``, ``.tokenizer``, ``.label``, ``.fallback``).

    Raises:
        ValueError: no checkpoint at ``model_dir`` and ``allow_fallback`` is False; or the
            checkpoint found does not load (`build_model`).
    """
    try:
        spec = resolve_model(str(model_dir))
    except ValueError:
        if not allow_fallback:
            raise
        spec = ModelSpec("random", fallback=True)
    if spec.kind == "random":
        if spec.fallback and not allow_fallback:
            raise ValueError(f"no checkpoint (config.json + model.safetensors) at {str(model_dir)!r}")
        spec = dataclasses.replace(spec, dev_scale=DEV_WEIGHT_SCALE)
    return load_model_cached(spec)


__all__ = [
    "bundled_dir",
    "bundled_models",
    "bundled_purpose",
    "DEFAULT_MODEL_DIR",
    "DEV_WEIGHT_SCALE",
    "MODEL_CACHE_SIZE",
    "RANDOM_MODEL_LABEL",
    "RANDOM_MODEL_NAME",
    "RANDOM_MODEL_SEED",
    "REPO_ROOT",
    "LoadCancelled",
    "LoadedModel",
    "ModelSpec",
    "build_model",
    "cached_models",
    "load_demo_model",
    "load_model_cached",
    "resolve_model",
    "waiting_for_another_load",
    "runs_dir",
]
