"""Which model a session decodes with: loading it, the memory mode it starts in, the examples it offers.

Wing: front ends (`clover_viz`), under `clover_viz.state`. `SessionModels` is a mixin of
`clover_viz.state.ExplorerState` (its parameters -- `model_dir`, `example`, `prompt`,
`memory_mode` ... -- are declared there, and so is the wiring of the handlers below to them:
param reads ``@param.depends`` only from a Parameterized class's own body):

* `load_model` (blocking: notebooks, scripts) and `start_load` / `_poll_load` (a background
  thread: the served app) resolve `model_dir` through `clover_viz.models` and `_apply_loaded`
  makes the result the session's model; a background load reports its bytes (`load_percent`,
  the status line) and `cancel_load` (Stop) gives it up and returns to the model before it;
* a model from a checkpoint directory starts in its best measured memory mode
  (`clover_engine.checkpoint.best_memory_mode`, the CLI's default) unless a mode was chosen;
* the example prompts on offer follow the model (`clover_viz.examples.examples_for`), and the
  example picker follows the prompt.

Tests: ``.venv/bin/python -m pytest tests/apps/test_explorer_app.py tests/clover_viz/test_examples.py -q``
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from clover_viz import models
from clover_viz.examples import EXAMPLE_PROMPTS, YOUR_PROMPT, examples_for
from clover_viz.models import LoadedModel, resolve_model
from clover_viz.session_settings import policies_for
from clover_engine.backbones import load_progress
from clover_engine.backbones.causal_lm.adapter import base_is_cached
from clover_engine.backbones.load_progress import LoadProgress
from clover_engine.checkpoint import best_memory_mode


def first_load_note(spec: models.ModelSpec) -> str:
    """What a long load's status adds when the model's first load builds a cache (else ``""``): a SmolLM2 adapter
    whose base is not yet dequantised (`clover_engine.backbones.causal_lm.adapter.base_is_cached`) takes about a
    minute, with no bytes to count meanwhile. Any other model -- and a SmolLM2 adapter whose base is cached --
    gets nothing: its bytes are counted instead."""
    if spec.kind != "checkpoint" or not spec.path:
        return ""
    try:
        base = json.loads((Path(spec.path) / "config.json").read_text(encoding="utf-8")).get("base")
    except (OSError, ValueError, AttributeError):
        return ""
    if not base:
        return ""
    if base_is_cached(base):
        return ""
    return f" (the first load of {Path(spec.path).name} dequantises its base {base}: about a minute)"


class SessionModels:
    """The model half of `ExplorerState` (a mixin; the parameters are declared there)."""

    _examples: dict[str, str] = EXAMPLE_PROMPTS  # the example set on offer (`_use_examples`)
    _typed: str = ""  # the last prompt the user wrote (not an example): YOUR_PROMPT restores it
    _syncing_example: bool = False  # the picker follows the prompt: do not write the prompt back
    _loaded_dir: str | None = None  # `model_dir` of the model `_loaded` holds (a cancelled load returns to it)
    _restoring_model: bool = False  # `cancel_load` sets `model_dir` back: not a new pick

    # ------------------------------------------------------------------ model
    @property
    def loaded_model(self) -> LoadedModel | None:
        """The model of the last successful load (None before the first)."""
        return self._loaded

    def load_model(self, adjust_mode: bool = True) -> LoadedModel | None:
        """Resolve and load `model_dir` (cached), or take the model given to `use_model`.
        On failure set `error` and return None.

        With ``adjust_mode``, a memory mode the model cannot run falls back to ``state``. A load that takes
        a while draws a tqdm bar of its bytes (`clover_engine.backbones.load_progress.shown_as_bar`);
        interrupting the kernel gives it up (``KeyboardInterrupt``) and keeps nothing of it.
        """
        if self._given is not None:
            loaded = self._given
        else:
            try:
                spec = resolve_model(self.model_dir, self.dev_sharpen_random, roots=self._model_roots)
                with load_progress.shown_as_bar():  # a notebook cell: a tqdm bar of the bytes read
                    loaded = self._loader(spec)
            except (ValueError, TypeError, OSError) as exc:
                self._load_failed(exc)
                return None
        return self._apply_loaded(loaded, adjust_mode)

    def _load_failed(self, exc: BaseException) -> None:
        """A load failed (`load_model`, `start_load`): say why and go back to the model loaded before it, which
        decodes as before (`model_dir` names it again); with none before it, say that no model is loaded."""
        name = self._model_name()
        if self._back_to_previous():
            prev = self._loaded.label
            self.error = f"Model not loaded: {exc}. Still decoding with {prev}."
            if not self.running:
                self.status = f"could not load {name}: back to {prev} (the error says why)"
            return
        self.error = f"Model not loaded: {exc}"
        # Generate refuses until the directory loads: do not keep naming the previous model
        self.model_label = f"none loaded from {self.model_dir!r}"
        self.memory_advice = ""
        self.model_ok = False
        if not self.running:
            self.status = "no model loaded: fix the model directory, or pick a bundled model"

    def _back_to_previous(self) -> bool:
        """Make the model loaded before (`_loaded`, from `_loaded_dir`) the session's again -- `model_dir` names
        it, without a new load -- after a load that failed or was cancelled. False when there was none (a model
        given to `use_model` has no directory to name: it is kept only while `model_dir` still names it)."""
        prev, prev_dir = self._loaded, self._loaded_dir
        if prev is None or prev_dir is None:
            return False
        self._restoring_model = True  # model_dir names the previous model again: no new load
        try:
            self.model_dir = prev_dir
        finally:
            self._restoring_model = False
        self.model_label = prev.label
        self.model_ok = True
        return True

    def start_load(self, note: str = "") -> bool:
        """Load `model_dir` in a background thread (the served app: a first load of SmolLM2 takes
        about a minute, and the server's event loop -- every other browser session's decode and
        redraws -- must not wait for it). `loading` is True and `status` counts the seconds until
        `tick` finds the load done and applies it on the UI thread, as `load_model` would.

        A Generate pressed meanwhile decodes once the model is ready. A second call (another model
        picked) supersedes the first: only the newest load is applied. Returns False (and sets
        `error`) when `model_dir` names no model; no thread is started then. ``note`` leads the
        status line while it loads (why it loads again).
        """
        if self._closed:
            return False
        self._given = None
        try:
            spec = resolve_model(self.model_dir, self.dev_sharpen_random, roots=self._model_roots)
        except (ValueError, TypeError, OSError) as exc:
            self._pending_load = None
            self.loading = False
            self._load_failed(exc)
            return False
        self._give_up_pending_load()  # superseded by this one
        cancel = threading.Event()  # `cancel_load` (Stop): the build stops at its next tensor or chunk
        box: dict[str, Any] = {"spec": spec, "model_dir": self.model_dir, "t0": time.monotonic(), "note": note,
                               "cancel": cancel, "progress": LoadProgress(should_stop=cancel.is_set),
                               "first_load": first_load_note(spec)}
        loader = self._loader

        def work() -> None:
            try:
                with load_progress.watching(box["progress"]):  # the download's and the weights' bytes
                    box["loaded"] = loader(spec)
            except Exception as exc:  # noqa: BLE001  (reported on the UI thread by tick)
                box["error"] = exc

        box["thread"] = threading.Thread(target=work, name=f"clover-load-{Path(str(spec.path or spec.kind)).name}",
                                         daemon=True)
        self._pending_load = box
        self.error = "" if self.error.startswith("Model not loaded") else self.error
        self.loading = True
        self.model_ok = False
        self.model_label = f"loading {self._model_name()} ..."
        self.status = f"{note}loading {self._model_name()} ..."
        box["thread"].start()
        return True

    def cancel_load(self) -> bool:
        """Give up the background load (`start_load`; Stop while a model loads) and return to the model
        loaded before it: `model_dir` and the label name it again, and it decodes as before. Its build stops
        at its next tensor (a download at its next chunk; a SmolLM2 base between transformers' phases) and
        is not cached unless another session waits for the same model, so nothing half-loaded stays
        referenced. Without a model before it the session says so and waits for a pick.

        Returns False when no load was under way (nothing changed)."""
        if self._pending_load is None:
            return False
        self._give_up_pending_load()
        self.loading = False
        self.load_percent = -1
        self._generate_when_loaded = False
        name = self._model_name()
        if not self._back_to_previous():
            self.model_label = f"none loaded (the load of {name} was cancelled)"
            if not self.running:
                self.status = f"load of {name} cancelled: no model loaded; pick a model"
            return True
        if not self.running:
            self.status = f"load of {name} cancelled; back to {self._loaded.label}"
        return True

    def _give_up_pending_load(self) -> None:
        """Forget the background load under way; its build stops at its next tensor unless another session
        waits for the same model (`clover_viz.models.load_model_cached`)."""
        if self._pending_load is not None:
            self._pending_load["cancel"].set()
        self._pending_load = None

    def _model_name(self) -> str:
        return Path((self.model_dir or "").rstrip("/")).name or str(self.model_dir)

    def _poll_load(self) -> None:
        """UI thread: apply a finished background load (`start_load`), or count its seconds."""
        box = self._pending_load
        if box is None:
            return
        if box["thread"].is_alive():
            secs = int(time.monotonic() - box["t0"])
            queued = models.waiting_for_another_load(box["thread"])
            if queued:  # models are built one at a time per process (clover_viz.models.load_model_cached)
                status = (f"{box['note']}waiting for another load to finish before loading {self._model_name()} "
                          f"({queued} queued) ... {secs} s")
            else:
                done = box["progress"].describe()
                status = f"{box['note']}loading {self._model_name()} ... {done + ', ' if done else ''}{secs} s"
                if box["progress"].estimate:  # the served app's memory rule, before and while the weights are read
                    status += f" · it {box['progress'].estimate}"
            frac = box["progress"].fraction
            self.load_percent = -1 if queued or frac is None else int(100 * frac)
            if secs >= 5 and not queued and box["progress"].phase in ("", "building") and box.get("first_load"):
                status += box["first_load"]
            if self.status != status and not self.running:
                self.status = status
            return
        self._pending_load = None
        self.loading = False
        self.load_percent = -1
        if "error" in box:
            exc = box["error"]
            if not isinstance(exc, (ValueError, TypeError, OSError)):
                exc = RuntimeError(f"{type(exc).__name__}: {exc}")
            self._load_failed(exc)
            self._generate_when_loaded = False
            return
        loaded = self._apply_loaded(box["loaded"], adjust_mode=True)
        if not self.running:
            estimate = box["progress"].estimate
            self.status = (f"ready: {loaded.label} loaded in {time.monotonic() - box['t0']:.1f} s"
                           + (f" (it {estimate})" if estimate else ""))
        if self._generate_when_loaded:
            self._generate_when_loaded = False
            self.generate()

    def _drop_evicted(self) -> None:
        """UI thread: let go of a model the process cache unloaded (`clover_viz.models.load_model_cached`)
        so its memory is freed; the page keeps naming it, and the next decode reloads it
        (`_reload_evicted`). A running decode keeps its model until it ends."""
        loaded = self._loaded
        if loaded is not None and loaded.evicted and loaded.holds_weights and not self.running:
            self._loaded = loaded.unloaded()

    def _reload_evicted(self) -> bool:
        """Before a decode in the served app: when the session's model was unloaded to make room for
        other sessions' models, say so and reload it in the background; the decode starts once it is
        loaded. Returns True when a reload was started (the caller decodes no further now)."""
        loaded = self._loaded
        if not (self.background_loads and self._given is None and loaded is not None and loaded.evicted):
            return False
        note = (f"{loaded.label} was unloaded to make room for other visitors' models (this server keeps "
                f"{models.MODEL_CACHE_SIZE} at a time); ")
        if self.start_load(note=note):
            self._generate_when_loaded = True
        return True

    def _apply_loaded(self, loaded: LoadedModel, adjust_mode: bool) -> LoadedModel:
        """Make ``loaded`` the session's model: label, examples, memory-mode advice (UI thread)."""
        self._loaded = loaded
        self._loaded_dir = self.model_dir  # what `cancel_load` returns to
        self.model_label = loaded.label
        # the largest block the model declares it was trained on (an adapter's; None for Clover checkpoints)
        self._trained_block = loaded.capabilities.largest_trained_block
        if not self.model_ok and self.status.startswith("no model loaded"):
            self.status = ""
        self.model_ok = True
        self._use_examples(loaded)
        self.window_available = loaded.window_available
        self.memory_advice = ""
        if self._given is None and Path(self.model_dir or "").is_dir():
            mode, why = best_memory_mode(self.model_dir)
            # with a window: which mode to start in and why; without: why `state` is the only one
            self.memory_advice = f"`{mode}` is the {why}" if loaded.window_available else why
        offered = policies_for(loaded)
        self.param.policy.objects = offered  # first: `_fit_policy_to_model` may pick verify for a drafter
        if adjust_mode:
            self._start_in_best_memory_mode(loaded)
            self._fit_policy_to_model(loaded)
        self._leave_unoffered_policy(loaded, offered)
        if adjust_mode and not loaded.window_available and self.memory_mode == "state+window":
            self.memory_mode = "state"
        return loaded

    def _leave_unoffered_policy(self, loaded: LoadedModel, offered: list[str]) -> None:
        """The policy list offers only what ``loaded`` can run (``offered``: `clover_viz.session_settings.
        policies_for`); a policy it cannot run gives way to ``low_confidence`` (threshold decoding runs on every
        model), or to ``verify`` for a model that drafts, and the status says so -- without a re-decode."""
        quiet, self._quiet = self._quiet, True
        try:
            if self.policy not in offered:
                was = self.policy
                self._auto_policy = self.policy = "verify" if "verify" in offered else "low_confidence"
                if not self.running:
                    self.status = (f"policy {was!r} does not run on {loaded.label} (it offers "
                                   f"{', '.join(offered)}): {self.policy!r} instead")
        finally:
            self._quiet = quiet

    def _fit_policy_to_model(self, loaded: LoadedModel) -> None:
        """A model that drafts for a target (`Capabilities.drafts`, smollm2-drafter) starts in ``verify`` at
        the block size it was trained on, unless the policy was chosen (given to the constructor or
        changed by the user since the state set it); a model that cannot verify leaves ``verify`` for
        ``low_confidence`` (and the block size the state set for the drafter for the default 32)."""
        caps = loaded.capabilities
        quiet, self._quiet = self._quiet, True  # settings the state changes itself: no re-decode
        try:
            if caps.drafts and self.policy == self._auto_policy:
                self._auto_policy = self.policy = "verify"
                trained = caps.largest_trained_block
                if trained in self.param.block_size.objects:
                    self._auto_block = self.block_size = trained
            elif not caps.drafts and self.policy == "verify":
                self._auto_policy = self.policy = "low_confidence"
                if self._auto_block is not None and self.block_size == self._auto_block:
                    self.block_size = self.param.block_size.default
                self._auto_block = None
        finally:
            self._quiet = quiet

    def _start_in_best_memory_mode(self, loaded: LoadedModel) -> None:
        """Set `memory_mode` to the best measured mode of a model loaded from a checkpoint directory
        (`clover_engine.checkpoint.best_memory_mode` of its resolved directory: the rule the CLI's default
        follows, and the notebook `Explorer`'s through this state), unless the mode was chosen: given
        to the constructor, or changed since the state last set it (by the user, or by a loaded
        trace's settings). A model given in memory or the random stand-in keeps the current mode."""
        if loaded.spec.kind != "checkpoint" or self.memory_mode != self._auto_memory_mode:
            return
        mode = best_memory_mode(loaded.spec.path)[0]
        if mode == "state+window" and not loaded.window_available:
            mode = "state"
        self._auto_memory_mode = mode
        self.memory_mode = mode

    def use_model(self, loaded: LoadedModel) -> LoadedModel:
        """Decode with ``loaded`` (e.g. ``LoadedModel.in_memory(model, tokenizer)``) instead of
        loading `model_dir`, until `model_dir` is set again. Returns it."""
        self._given = loaded
        self.load_model()
        return loaded

    # watches `model_dir` and `dev_sharpen_random`: wired in `ExplorerState`
    def _on_model_change(self) -> None:
        if self._restoring_model:  # `cancel_load` names the model it went back to
            return
        self._given = None
        if self.background_loads:
            self.start_load()
        elif self.load_model() is not None:
            self.error = ""

    def _use_examples(self, loaded: LoadedModel) -> None:
        """Offer the example prompts that fit ``loaded`` (chat questions for a chat model, agent
        and code prompts for a Clover model); switching sets switches to its default prompt."""
        examples, default = examples_for(loaded.capabilities)
        if examples is self._examples:
            return
        typed = bool(self.prompt.strip()) and self.prompt not in self._examples.values()
        self._examples = examples
        self.param.example.objects = [*examples, YOUR_PROMPT]
        if typed:  # a prompt the user wrote is kept; only the picker changes
            self._show_example(YOUR_PROMPT)
        elif self.example == default:
            self.prompt = examples[default]
        else:
            self.example = default  # -> _on_example

    def _show_example(self, name: str) -> None:
        """Point the picker at `name` without replacing the prompt (widgets still follow)."""
        self._syncing_example = True
        try:
            self.example = name
        finally:
            self._syncing_example = False

    # watches `example`: wired in `ExplorerState`
    def _on_example(self) -> None:
        if self._syncing_example:
            return
        if self.example == YOUR_PROMPT:
            if self._typed:
                self.prompt = self._typed
            else:  # nothing written yet: the picker goes back to the example on screen
                self._on_prompt()
            return
        self.prompt = self._examples[self.example]

    # watches `prompt`: wired in `ExplorerState`
    def _on_prompt(self) -> None:
        """Keep the picker true to the prompt: the example it is, else YOUR_PROMPT."""
        name = next((k for k, v in self._examples.items() if v == self.prompt), None)
        if name is None:
            self._typed = self.prompt
            name = YOUR_PROMPT
        if name != self.example:
            self._show_example(name)
