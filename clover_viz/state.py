"""Session state of the explorer: settings, the running decode, the traces, playback.

`ExplorerState` is a `param.Parameterized` with bounds and docs and no UI
import, so the Panel app (`clover_viz.panel_views`, `apps/explorer.py`), the
ipywidgets `clover_viz.widgets.Explorer` and the tests all drive the same object.

Threading model (a worker thread decodes; only the UI thread touches params)::

    generate() --(UI thread)--> validate prompt, model, settings; new Trace; start worker
    worker thread: BlockDecoder.generate(hooks=[queue.put], cancel=Event) -- touches no param
    tick(dt) / drain() --(UI thread, periodic callback)--> pop events into the Trace,
                                                           bump `trace_version`, move `position`
    stop() sets the run's cancel Event: the decoder stops after its current forward and
    keeps what it wrote (the trace then ends with stop_reason "cancelled").

A notebook has no periodic callback: `clover_viz.widgets.Explorer.decode` calls `drain`
itself until the run ends (the cell blocks, the view fills in).

A new `generate()` while a decode runs (a threshold drag released twice)
cancels the running one and throws its partial trace away; `previous` always
holds the last run that was not superseded, so the comparison is between two
whole runs. Errors (empty prompt, a bad model directory, a setting the model
cannot run) set `error` and leave `trace` / `previous` as they were.

Models: `model_dir` names a checkpoint directory, resolved and loaded (once per
process) by `clover_viz.models` -- the default directory falls back to a labelled
random ``clover-test`` while it holds no checkpoint; `dev_sharpen_random` (a
development option, off by default) multiplies that random model's matrices by
`DEV_WEIGHT_SCALE`. `use_model` decodes with a model object a notebook already holds.
The numbers and the comparison the views show come from `clover_viz.runs`.

Tests: ``.venv/bin/python -m pytest tests/apps/test_explorer_app.py -q``
"""

from __future__ import annotations

import atexit
import dataclasses
import io
import queue
import re
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import param

from clover_viz.examples import DEFAULT_EXAMPLE, EXAMPLE_PROMPTS, YOUR_PROMPT, examples_for
from clover_viz.models import (
    DEFAULT_MODEL_DIR,
    DEV_WEIGHT_SCALE,
    LoadedModel,
    load_model_cached,
    resolve_model,
)
from clover_viz.runs import compare, dropped_at_stop, forced_past_answer, generated_ids, model_of, prompt_of
from engine.cost import DEFAULT_DEVICE, DEVICES, UNION_ASSUMPTIONS
from engine.recording.events import BlockStart, DecodeEnd, StepEvent
from engine.decoding.policies import POLICIES
from engine.prompting import model_input
from engine.recording.trace import Trace

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)
MAX_NEW_TOKENS_MIN, MAX_NEW_TOKENS_MAX = 1, 2048
MEMORY_MODES = ("state", "state+window")
DEVICE_CHOICES = tuple(DEVICES) + ("this-machine",)


def _snapshot(event: Any) -> Any:
    """Copy an event's arrays at emit time (in the worker thread).

    On the CPU, ``BlockStart.tokens`` shares memory with the decoder's block tensor, which
    the decoder then fills in place; without a copy the start record would show the final
    tokens instead of the masks.
    """
    if isinstance(event, BlockStart):
        return dataclasses.replace(event, tokens=event.tokens.copy(), prefilled=event.prefilled.copy())
    return event


def _trace_error(label: str, path: Path | None, exc: BaseException) -> str:
    """A trace-loading error for the page: names the user's file and the Open button, not the
    temporary path it was read from nor the Python API."""
    detail = str(exc)
    if path is not None:
        detail = detail.replace(repr(str(path)), "the file").replace(str(path), "the file")
    if "is not a trace file" in detail:
        detail = "it is neither a Parquet nor an Arrow file: " + detail.split("found ", 1)[-1].split(". ")[0]
    elif "cannot be read" in detail:
        detail = "it looks like Parquet or Arrow but is damaged"
    else:  # a table without the explorer's metadata or columns: keep what is wrong, drop API advice
        detail = re.sub(r"\s*(Save traces with|Use|use) [\w.]+\(\)[^.;]*[.;]?", "", detail)
        detail = re.sub(r"[;,]?\s*re-save the trace", "", detail)
        detail = re.sub(r"(engine\.trace\.)?Trace\.\w+\(\)", "the Save trace button", detail).strip().rstrip(".;,")
    if isinstance(exc, FileNotFoundError):
        return f"Trace not loaded: {label!r} was not found. Choose a trace file with the Open button."
    return (f"Trace not loaded: {label!r} is not a trace this explorer can replay ({detail}). Choose a .parquet "
            "or .arrow file saved with the 'Save trace' button, using the Open button.")


def _check_memory_mode(mode: str, loaded: LoadedModel | None) -> None:
    """Raise ValueError when ``loaded`` cannot run memory ``mode`` (``state+window`` without a window)."""
    if mode == "state+window" and loaded is not None and not loaded.window_available:
        raise ValueError("memory mode 'state+window' needs a model with attention_window > 0; "
                         "this model has none -- use 'state'")


@dataclass(eq=False)  # identity equality: hashable, so `_LIVE_RUNS` can hold it
class _Run:
    """One decode in a worker thread."""

    run_id: int
    cancel: threading.Event
    thread: threading.Thread | None = None
    superseded: bool = False
    user_stopped: bool = False
    step_times: list = dataclasses.field(default_factory=list)


_LIVE_RUNS: "weakref.WeakSet[_Run]" = weakref.WeakSet()  # decode workers of every session in this process


@atexit.register
def _cancel_live_decodes(timeout_s: float = 10.0) -> None:
    """At interpreter exit: cancel running decodes and let their threads end after the current forward.
    A daemon thread killed inside a torch op aborts the process ("terminate called without an active
    exception") -- a script that closes a session without `ExplorerState.wait` would end that way."""
    runs = [r for r in list(_LIVE_RUNS) if r.thread is not None and r.thread.is_alive()]
    for r in runs:
        r.cancel.set()
    deadline = time.monotonic() + timeout_s
    for r in runs:
        r.thread.join(max(0.0, deadline - time.monotonic()))


# ----------------------------------------------------------------------------- the state
def past_training_note(block_size: int | None, trained: int | None) -> str:
    """`` · block 64 is past the model's training (blocks <= 32): expect worse text`` when a run's
    block_size exceeds the largest block the model was trained on (its `Capabilities.largest_trained_block`;
    None: unknown), else ``""``. Appended to the done line, as the CLI prints its note."""
    if block_size is None or trained is None or block_size <= trained:
        return ""
    return f" · block {block_size} is past the model's training (blocks <= {trained}): expect worse text"


def chat_template_note(trace: Trace | None) -> str:
    """`` · your prompt was decoded in the model's ChatML template ('show prompt' shows it)`` when the run's
    prompt was wrapped by `engine.prompting.model_input` (recorded as ``meta["chat_template"]``), else ``""``."""
    template = ((trace.meta or {}).get("chat_template") if trace is not None else None)
    if not template:
        return ""
    name = "ChatML" if template == "chatml" else template
    return f" · prompt decoded in the model's {name} chat template ('show prompt' shows the exact input)"


class ExplorerState(param.Parameterized):
    """Everything one explorer session holds. No UI imports; drive it from any front end.

    Settings are plain parameters; `generate`, `stop`, `load_trace`, `play` ... are the
    actions; `tick(dt)` must be called periodically on the UI thread (it drains the worker's
    events and advances playback).
    """

    # --- model and prompt
    model_dir = param.String(default=DEFAULT_MODEL_DIR, doc=(
        "Checkpoint directory (config.json, model.safetensors, tokenizer.json), or 'clover-test' for a "
        "random test model. The default falls back to random clover-test while it does not exist."))
    dev_sharpen_random = param.Boolean(default=False, doc=(
        f"Development option: multiply the random clover-test model's matrices by {DEV_WEIGHT_SCALE:g} so "
        "its confidences spread out like a trained model's. Its output is still noise."))
    example = param.Selector(default=DEFAULT_EXAMPLE, objects=[*EXAMPLE_PROMPTS, YOUR_PROMPT], doc=(
        f"Example prompt; choosing one replaces the prompt text. Shows '{YOUR_PROMPT}' while the prompt is "
        f"text you wrote; choosing '{YOUR_PROMPT}' brings that text back."))
    prompt = param.String(default=EXAMPLE_PROMPTS[DEFAULT_EXAMPLE], doc=(
        "Prompt text. clover-tiny knows two kinds of text: tool-call chats in the layout of the agent "
        "examples (<|im_start|>system with the tools' JSON schemas, then <|im_start|>user) and Python code; "
        "a plain request outside that layout gets noise. A chat model (smollm2-bd) takes plain questions."))

    # --- decoding settings (DecodeConfig)
    threshold = param.Number(default=0.95, bounds=(0.5, 1.0), step=0.01, doc=(
        "LowConfidence threshold: a masked slot is written when its confidence >= threshold."))
    block_size = param.Selector(default=32, objects=list(BLOCK_SIZES), doc=(
        "Slots per block, block_size (1 = autoregressive greedy decoding)."))
    policy = param.Selector(default="low_confidence", objects=list(POLICIES), doc="Acceptance policy.")
    memory_mode = param.Selector(default="state+window", objects=list(MEMORY_MODES), doc=(
        "'state' keeps history only in recurrent state (Clover); 'state+window' also keeps the last W "
        "committed K/V in attention layers (a labelled non-Clover variant; needs attention_window > 0). "
        "Default state+window: the bundled model's best mode (exact tool calls 29 % vs 4 % in state, "
        "models/clover-tiny's card); a model loaded from a checkpoint directory starts in its best measured "
        "mode (from its eval.json, as the command line does) unless a mode was chosen; a model without a "
        "window falls back to state on load."))  # engine.checkpoint.best_memory_mode
    max_new_tokens = param.Integer(default=128, bounds=(MAX_NEW_TOKENS_MIN, MAX_NEW_TOKENS_MAX),
                                   doc="Generated-token budget.")
    repetition_control = param.Boolean(default=False, doc="n-gram repetition penalty (model card).")
    repetition_penalty = param.Number(default=2.0, bounds=(0.1, 20.0), doc="Logit penalty when on.")
    eos_bias = param.Boolean(default=False, doc="Progressive EOS bias past a soft length limit (model card).")
    eos_soft_limit = param.Integer(default=96, bounds=(0, 4096), doc="Generated tokens before EOS is favoured.")
    auto_redecode = param.Boolean(default=True, doc=(
        "Re-decode when threshold or block_size changes (sliders set them on release)."))

    # --- cost panel
    device = param.Selector(default=DEFAULT_DEVICE, objects=list(DEVICE_CHOICES), doc=(
        "Device for projected tokens/s and the roofline ('this-machine' is measured once)."))
    union_assumption = param.Selector(default="measured_vs_independent", objects=list(UNION_ASSUMPTIONS), doc=(
        "How the 35B-A3B expert union per forward is derived from the recorded run: from the union measured "
        "against independent routing ('measured_vs_independent'), or as the measured fraction of experts "
        "('measured_fraction', which saturates for models with few experts)."))  # engine.cost.target_union

    # --- outputs (set by the state itself)
    trace = param.ClassSelector(class_=Trace, default=None, allow_None=True, doc="The run on display.")
    previous = param.ClassSelector(class_=Trace, default=None, allow_None=True, doc=(
        "The run before it, kept for comparison."))
    trace_version = param.Integer(default=0, doc="Bumped whenever `trace` gains events.")
    running = param.Boolean(default=False, doc="A decode is running.")
    loading = param.Boolean(default=False, doc="A model is loading in the background (`start_load`).")
    background_loads = param.Boolean(default=False, doc=(
        "Load a newly chosen model in a background thread (`start_load`; the served app) instead of "
        "blocking the caller (`load_model`; notebooks and scripts)."))
    progress = param.Integer(default=0, bounds=(0, 100), doc="Generated tokens / budget of the running decode, %.")
    status = param.String(default="", doc="One line on what the session is doing.")
    error = param.String(default="", doc="The last error (empty when none).")
    model_label = param.String(default="", doc="What model is loaded, said plainly.")
    model_ok = param.Boolean(default=False, doc="The last load of `model_dir` succeeded (Generate can decode).")
    window_available = param.Boolean(default=True, doc="The model supports 'state+window'.")
    memory_advice = param.String(default="", doc=(
        "Which memory mode the loaded model does best in, and the measurement that says so "
        "(`engine.checkpoint.best_memory_mode`: its eval.json); empty for a model given in memory."))
    break_even = param.Dict(default={}, doc=(
        "Measured on this machine by `measure_break_even`: {(model id, block_size, memory mode): "
        "engine.cost.BreakEven}."))

    # --- playback
    position = param.Integer(default=0, bounds=(0, None), doc="Step (forward) index on display.")
    n_steps = param.Integer(default=0, doc="Steps in `trace`.")
    playing = param.Boolean(default=False, doc="Playback is advancing `position`.")
    speed = param.Number(default=8.0, bounds=(0.5, 60.0), doc="Playback speed, steps per second.")

    _examples: dict[str, str] = EXAMPLE_PROMPTS  # the example set on offer (`_use_examples`)
    generate_button: str = "Generate"  # what the front end calls its decode button (the notebook's: "Decode")
    _typed: str = ""  # the last prompt the user wrote (not an example): YOUR_PROMPT restores it
    _syncing_example: bool = False  # the picker follows the prompt: do not write the prompt back

    def __init__(self, loader: Any = None, **params: Any) -> None:
        super().__init__(**params)
        self._loader = loader or load_model_cached
        self._loaded: LoadedModel | None = None
        self._trained_block: int | None = None  # set by load_model
        self._given: LoadedModel | None = None  # set by use_model: decode with it, not model_dir
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._run: _Run | None = None
        self._run_counter = 0
        self._quiet = False  # settings changed by the state itself: no re-decode
        self._play_accum = 0.0
        self._closed = False
        self._pending_load: dict[str, Any] | None = None  # a background load (start_load)
        self._generate_when_loaded = False  # Generate was pressed while it loads
        self.stop_timing: dict[str, Any] = {}
        # the memory mode the state chose itself (None: given to the constructor): see _start_in_best_memory_mode
        self._auto_memory_mode: str | None = None if "memory_mode" in params else self.memory_mode
        self._on_prompt()  # a prompt given here names its example, or YOUR_PROMPT

    # ------------------------------------------------------------------ model
    @property
    def loaded_model(self) -> LoadedModel | None:
        """The model of the last successful load (None before the first)."""
        return self._loaded

    def load_model(self, adjust_mode: bool = True) -> LoadedModel | None:
        """Resolve and load `model_dir` (cached), or take the model given to `use_model`.
        On failure set `error` and return None.

        With ``adjust_mode``, a memory mode the model cannot run falls back to ``state``.
        """
        if self._given is not None:
            loaded = self._given
        else:
            try:
                spec = resolve_model(self.model_dir, self.dev_sharpen_random)
                loaded = self._loader(spec)
            except (ValueError, TypeError, OSError) as exc:
                self._load_failed(exc)
                return None
        return self._apply_loaded(loaded, adjust_mode)

    def _load_failed(self, exc: BaseException) -> None:
        self.error = f"Model not loaded: {exc}"
        # Generate refuses until the directory loads: do not keep naming the previous model
        self.model_label = f"none loaded from {self.model_dir!r}"
        self.memory_advice = ""
        self.model_ok = False
        if not self.running:
            self.status = "no model loaded: fix the model directory, or pick a bundled model"

    def start_load(self) -> bool:
        """Load `model_dir` in a background thread (the served app: a first load of SmolLM2 takes
        about a minute, and the server's event loop -- every other browser session's decode and
        redraws -- must not wait for it). `loading` is True and `status` counts the seconds until
        `tick` finds the load done and applies it on the UI thread, as `load_model` would.

        A Generate pressed meanwhile decodes once the model is ready. A second call (another model
        picked) supersedes the first: only the newest load is applied. Returns False (and sets
        `error`) when `model_dir` names no model; no thread is started then.
        """
        if self._closed:
            return False
        self._given = None
        try:
            spec = resolve_model(self.model_dir, self.dev_sharpen_random)
        except (ValueError, TypeError, OSError) as exc:
            self._pending_load = None
            self.loading = False
            self._load_failed(exc)
            return False
        box: dict[str, Any] = {"spec": spec, "model_dir": self.model_dir, "t0": time.monotonic()}
        loader = self._loader

        def work() -> None:
            try:
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
        self.status = f"loading {self._model_name()} ..."
        box["thread"].start()
        return True

    def _model_name(self) -> str:
        return Path((self.model_dir or "").rstrip("/")).name or str(self.model_dir)

    def _poll_load(self) -> None:
        """UI thread: apply a finished background load (`start_load`), or count its seconds."""
        box = self._pending_load
        if box is None:
            return
        if box["thread"].is_alive():
            secs = int(time.monotonic() - box["t0"])
            status = f"loading {self._model_name()} ... {secs} s"
            if secs >= 5:
                status += " (a first load of a SmolLM2 model dequantises its base: about a minute)"
            if self.status != status and not self.running:
                self.status = status
            return
        self._pending_load = None
        self.loading = False
        if "error" in box:
            exc = box["error"]
            if not isinstance(exc, (ValueError, TypeError, OSError)):
                exc = RuntimeError(f"{type(exc).__name__}: {exc}")
            self._load_failed(exc)
            self._generate_when_loaded = False
            return
        loaded = self._apply_loaded(box["loaded"], adjust_mode=True)
        if not self.running:
            self.status = f"ready: {loaded.label} loaded in {time.monotonic() - box['t0']:.1f} s"
        if self._generate_when_loaded:
            self._generate_when_loaded = False
            self.generate()

    def _apply_loaded(self, loaded: LoadedModel, adjust_mode: bool) -> LoadedModel:
        """Make ``loaded`` the session's model: label, examples, memory-mode advice (UI thread)."""
        self._loaded = loaded
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
            from engine.checkpoint import best_memory_mode

            mode, why = best_memory_mode(self.model_dir)
            # with a window: which mode to start in and why; without: why `state` is the only one
            self.memory_advice = f"`{mode}` is the {why}" if loaded.window_available else why
        if adjust_mode:
            self._start_in_best_memory_mode(loaded)
        if adjust_mode and not loaded.window_available and self.memory_mode == "state+window":
            self.memory_mode = "state"
        return loaded

    def _start_in_best_memory_mode(self, loaded: LoadedModel) -> None:
        """Set `memory_mode` to the best measured mode of a model loaded from a checkpoint directory
        (`engine.checkpoint.best_memory_mode` of its resolved directory: the rule the CLI's default
        follows, and the notebook `Explorer`'s through this state), unless the mode was chosen: given
        to the constructor, or changed since the state last set it (by the user, or by a loaded
        trace's settings). A model given in memory or the random stand-in keeps the current mode."""
        if loaded.spec.kind != "checkpoint" or self.memory_mode != self._auto_memory_mode:
            return
        from engine.checkpoint import best_memory_mode

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

    @param.depends("model_dir", "dev_sharpen_random", watch=True)
    def _on_model_change(self) -> None:
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

    @param.depends("example", watch=True)
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

    @param.depends("prompt", watch=True)
    def _on_prompt(self) -> None:
        """Keep the picker true to the prompt: the example it is, else YOUR_PROMPT."""
        name = next((k for k, v in self._examples.items() if v == self.prompt), None)
        if name is None:
            self._typed = self.prompt
            name = YOUR_PROMPT
        if name != self.example:
            self._show_example(name)

    @param.depends("threshold", "block_size", watch=True)
    def _on_decode_setting(self) -> None:
        if self.auto_redecode and not self._quiet and self.trace is not None and not self._closed:
            self.generate()

    def decode_config(self, loaded: LoadedModel | None = None) -> Any:
        """The `engine.decoding.decoder.DecodeConfig` of the current settings.

        Raises:
            ValueError: for settings the model cannot run (``state+window`` without a window).
        """
        from engine.decoding.decoder import DecodeConfig

        _check_memory_mode(self.memory_mode, loaded or self._loaded)
        return DecodeConfig(
            block_size=int(self.block_size), threshold=float(self.threshold),
            max_new_tokens=int(self.max_new_tokens), policy=self.policy, memory_mode=self.memory_mode,
            repetition_penalty=float(self.repetition_penalty) if self.repetition_control else 0.0,
            eos_bias_soft_limit=int(self.eos_soft_limit) if self.eos_bias else None,
        )

    def set_max_new_tokens(self, value: Any) -> bool:
        """Set `max_new_tokens` from user input; outside 1..2048 (or not a whole number) set `error`
        saying the valid range, keep the current value and return False."""
        lo, hi = MAX_NEW_TOKENS_MIN, MAX_NEW_TOKENS_MAX
        try:
            n = int(value)
            ok = n == value and lo <= n <= hi
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            self.error = (f"Max new tokens must be a whole number from {lo} to {hi}; got {value}. "
                          f"Kept {self.max_new_tokens}.")
            return False
        if self.error.startswith("Max new tokens"):
            self.error = ""
        self.max_new_tokens = n
        return True

    # ------------------------------------------------------------------ decoding
    def generate(self, config: Any = None) -> bool:
        """Start decoding `prompt` with the current settings in a worker thread.

        Args:
            config: an ``engine.decoding.decoder.DecodeConfig`` to decode with instead of the one the
                settings make (a notebook's, with fields the settings do not cover); the
                settings take its values where they can show them.

        A decode already running is cancelled and its partial trace dropped. Returns False
        (and sets `error`, keeping the runs on display) when the prompt, the model or the
        settings are unusable.
        """
        from engine.decoding.decoder import BlockDecoder

        if self._closed:
            return False
        if not self.prompt or not self.prompt.strip():
            self._refuse(f"The prompt is empty: type a prompt or pick an example, then {self.generate_button}.")
            return False
        if self.loading:  # a background load (start_load): decode once it is done
            self._generate_when_loaded = True
            self.status = f"loading {self._model_name()} ... the decode starts when it is loaded"
            return True
        loaded = self.load_model(adjust_mode=False)
        if loaded is None:
            return False
        try:
            if config is None:
                dc = self.decode_config(loaded)
            else:
                _check_memory_mode(config.memory_mode, loaded)
                dc = config
            decoder = loaded.decoder or BlockDecoder(loaded.model, loaded.tokenizer, dc)
            given = model_input(self.prompt, loaded.model)  # the chat template where the model has one
            prompt_ids = decoder.encode_prompt(given.text)
        except (ValueError, TypeError) as exc:
            detail = str(exc)
            if "tokens but the model's context" in detail:  # say what the user sees: characters, too
                detail += f" (the prompt box holds {len(self.prompt):,} characters; nothing was cut)"
            self._refuse(f"Cannot decode: {detail}")
            return False
        self.error = ""
        if config is not None:
            self._show_settings(dc.to_dict())

        if self._run is not None and self.running:
            self._run.superseded = True
            self._run.cancel.set()
        elif self.trace is not None:
            self.previous = self.trace
        self._run_counter += 1
        run = _Run(self._run_counter, threading.Event())
        tok = loaded.tokenizer
        live = Trace(
            decode_config=dc.to_dict(), model_id=loaded.model_id,
            token_text=lambda i: tok.decode([i], skip_special_tokens=False), prompt_ids=prompt_ids,
            meta={"model_label": loaded.label, "model_config": loaded.config.to_dict(),
                  "dev_weight_scale": loaded.spec.dev_scale, "recorded_on": "cpu",
                  "prompt": given.prompt, "model_input": given.text, "chat_template": given.template,
                  "capabilities": loaded.capabilities.to_dict()},
        )
        events = self._events

        def hook(ev: Any, _rid: int = run.run_id) -> None:
            if isinstance(ev, StepEvent):
                run.step_times.append(time.monotonic())  # when each forward ended (stop timing)
            events.put((_rid, "event", _snapshot(ev)))

        def work() -> None:
            try:
                decoder.generate(prompt_ids, hooks=[hook], record_trace=False, cancel=run.cancel, config=dc)
            except Exception as exc:  # noqa: BLE001  (any failure is reported on the UI thread by drain())
                events.put((run.run_id, "error", exc))
            finally:
                events.put((run.run_id, "exit", None))

        run.thread = threading.Thread(target=work, name=f"clover-decode-{run.run_id}", daemon=True)
        _LIVE_RUNS.add(run)
        self._run = run
        self._budget = dc.max_new_tokens
        self._written = 0
        self.playing = False
        with param.parameterized.batch_call_watchers(self):
            self.trace = live
            self.n_steps = 0
            self.position = 0
            self.progress = 0
            self.running = True
            self.status = (f"decoding with {loaded.label}: block_size {dc.block_size}, threshold {dc.threshold:.2f}"
                           + (" · prompt " + given.note if given.wrapped else ""))
        run.thread.start()
        return True

    def _refuse(self, error: str) -> None:
        """A `generate` that did not start: set `error`, and say in `status` that no new decode
        started -- the line must not keep reading as the outcome of this attempt (a previous
        run's "done: ..."); the run on display stays."""
        self.error = error
        if not self.running:
            shown = " (the run on display is the previous one)" if self.trace is not None else ""
            self.status = f"not decoded: the new decode did not start, see the error{shown}"

    def stop(self) -> None:
        """Cancel the running decode; it stops after its current forward and keeps what it wrote.

        `stop_timing` records when (monotonic seconds) and at which NFE (steps shown) the stop
        was asked for, and, once the decode has ended, when and at which NFE it ended.
        """
        if self._run is not None and self.running:
            self._run.user_stopped = True
            self._run.cancel.set()
            self.stop_timing = {"requested_at": time.monotonic(), "nfe_shown": self.n_steps,
                                "nfe_recorded": len(self.trace) if self.trace is not None else 0}
            self.status = "stopping..."

    def wait(self, timeout: float = 30.0) -> bool:
        """Block until the running decode's thread ends, then drain (for tests and scripts).

        Returns True when nothing is running any more (and the worker thread has ended).
        """
        run = self._run
        if run is not None and run.thread is not None:
            run.thread.join(timeout)
        self.drain()
        return not self.running and (run is None or run.thread is None or not run.thread.is_alive())

    def drain(self, max_steps: int | None = None) -> int:
        """Move the worker's queued events into `trace` (UI thread). Returns events applied.

        ``max_steps``: stop after that many `StepEvent`s (a caller that draws every forward
        drains one at a time); None takes everything queued.
        """
        applied = steps = 0
        run = self._run
        while max_steps is None or steps < max_steps:
            try:
                run_id, kind, payload = self._events.get_nowait()
            except queue.Empty:
                break
            if run is None or run_id != run.run_id or run.superseded:
                continue  # a superseded run's leftovers
            if kind == "event":
                self.trace(payload)
                applied += 1
                if isinstance(payload, StepEvent):
                    self._written += payload.n_written
                    steps += 1
                elif isinstance(payload, DecodeEnd):
                    self._finish(payload)
            elif kind == "error":
                self._fail(payload)
            elif kind == "exit" and self.running:  # ended without DecodeEnd (error path)
                self.running = False
        if applied and self.trace is not None:
            n_old, n_new = self.n_steps, len(self.trace)
            with param.parameterized.batch_call_watchers(self):
                self.n_steps = n_new
                if n_new and (n_old == 0 or self.position >= n_old - 1):
                    self.position = n_new - 1  # follow the newest step unless the user scrubbed back
                if self.running:
                    n_tok = len(generated_ids(self.trace))
                    self.progress = min(100, int(100 * n_tok / max(self._budget, 1)))
                    blk = self.trace.step(-1).block_index if n_new else 0  # 0-based, as in the figures
                    status = f"decoding: block {blk}, {n_tok}/{self._budget} tokens, NFE {n_new}"
                    self.status = "stopping... " + status if self._run.user_stopped else status
                self.trace_version += 1
        return applied

    def _finish(self, end: DecodeEnd) -> None:
        run = self._run
        if run is not None and run.user_stopped and self.stop_timing:
            asked = self.stop_timing["requested_at"]
            self.stop_timing = dict(self.stop_timing, ended_at=time.monotonic(), final_nfe=int(end.nfe),
                                    forwards_after_request=sum(t > asked for t in run.step_times))
        self.running = False
        self.progress = 100
        tpf = f"{end.tokens_per_forward:.2f}"
        if end.stop_reason == "cancelled":
            status = f"stopped: kept {len(end.tokens)} tokens after {end.nfe} forwards ({end.n_forced} forced fills)"
            gone = dropped_at_stop(self.trace) if self.trace is not None else None
            if gone and gone["n_dropped"]:
                status += (f"; {gone['n_dropped']} slots of block {gone['block']} written after a still-masked "
                           f"slot were dropped ({gone['n_forced_dropped']} of them forced), struck through in the text")
            self.status = status
        else:
            dc = (self.trace.decode_config if self.trace is not None else None) or {}
            mode = dc.get("memory_mode", self.memory_mode)
            past = forced_past_answer(self.trace) if self.trace is not None else 0
            # as the CLI's note: forced fills of end-of-text slots are forwards spent, not tokens
            forced = f"{end.n_forced} forced" + (
                f" ({past} of them wrote end-of-text slots at or after the answer's end: forwards, not tokens)"
                if past else "")
            self.status = (f"done: {len(end.tokens)} tokens in {end.nfe} forwards ({tpf} tokens/forward), "
                           f"{forced}, memory {mode}, stop: {end.stop_reason}"
                           + past_training_note(dc.get("block_size"), self._trained_block)
                           + chat_template_note(self.trace))
        assert run is not None and not run.superseded, run

    def _fail(self, exc: BaseException) -> None:
        self.running = False
        self.error = f"Decoding failed: {type(exc).__name__}: {exc}"
        if self.trace is not None and len(self.trace) == 0:
            with param.parameterized.batch_call_watchers(self):  # nothing produced: show the last run again
                self.trace, self.previous = self.previous, None
                self.n_steps = len(self.trace) if self.trace is not None else 0
                self.position = max(self.n_steps - 1, 0)
                self.trace_version += 1

    # ------------------------------------------------------------------ playback
    def tick(self, dt: float = 0.1) -> None:
        """Periodic work on the UI thread: apply a finished background load, drain events, then
        advance playback by ``dt`` seconds."""
        self._poll_load()
        self.drain()
        if not self.playing:
            return
        if self.n_steps == 0:
            self.playing = False
            return
        self._play_accum += dt * self.speed
        adv = int(self._play_accum)
        if adv:
            self._play_accum -= adv
            last = self.n_steps - 1
            new = min(self.position + adv, last)
            self.position = new
            if new >= last and not self.running:
                self.playing = False

    def play(self) -> None:
        """Start playback (from the first step when at the end)."""
        if self.n_steps == 0:
            return
        if self.position >= self.n_steps - 1 and not self.running:
            self.position = 0
        self._play_accum = 0.0
        self.playing = True

    def pause(self) -> None:
        self.playing = False

    def toggle_play(self) -> None:
        self.pause() if self.playing else self.play()

    def step(self, delta: int = 1) -> None:
        """Move `position` by ``delta`` steps (clipped), pausing playback."""
        self.playing = False
        if self.n_steps:
            self.position = min(max(self.position + int(delta), 0), self.n_steps - 1)

    def seek(self, position: int) -> None:
        """Jump to a step (clipped)."""
        if self.n_steps:
            self.position = min(max(int(position), 0), self.n_steps - 1)

    # ------------------------------------------------------------------ traces on disk
    def load_trace(self, source: str | Path | bytes | Trace, name: str = "") -> bool:
        """Show a recorded trace for replay: a path or the bytes of a .parquet / .arrow file,
        or a `Trace` already in memory.

        The current run becomes `previous`; a running decode is cancelled. Returns False and sets
        `error` for a file that is not a trace.

        The rule for the settings (`_take_trace_settings`): a loaded trace is shown as recorded
        (its own model, settings and prompt, whatever model is loaded), and the settings -- what
        Generate decodes with next -- take over every setting of the trace that the loaded model
        can run and a control can show: block size, threshold, policy, memory mode, max new
        tokens, the repetition and EOS-bias processors, and the prompt (``meta["prompt"]``, else
        its prompt ids as text). Nothing is re-decoded. Generate always decodes with the loaded
        model, never the trace's. The status line lists the settings taken and those not taken
        (with why: a memory mode the loaded model cannot run, a value no control offers, a
        decoder field without a control), and names the model Generate decodes with -- and the
        trace's, when they differ.
        """
        if isinstance(source, Trace):
            loaded = source
        else:
            label = name or ("the uploaded file" if isinstance(source, (bytes, bytearray)) else Path(source).name)
            path: Path | None = None
            try:
                if isinstance(source, (bytes, bytearray)):
                    with tempfile.TemporaryDirectory() as tmp:
                        path = Path(tmp) / "trace.bin"
                        path.write_bytes(bytes(source))
                        loaded = Trace.load(path)
                else:
                    path = Path(source)
                    loaded = Trace.load(source)
                    name = name or Path(source).name
            except (ValueError, FileNotFoundError, OSError, KeyError, TypeError) as exc:
                self.error = _trace_error(label, path, exc)
                return False
        if self._run is not None and self.running:
            self._run.superseded = True
            self._run.cancel.set()
        elif self.trace is not None:
            self.previous = self.trace
        self.error = ""
        self._quiet = True
        try:
            with param.parameterized.batch_call_watchers(self):
                taken, left = self._take_trace_settings(loaded)
                self.trace = loaded
                self.running = False
                self.playing = False
                self.n_steps = len(loaded)
                self.position = 0
                self.progress = 100
                self.trace_version += 1
                self.status = (f"loaded trace{' ' + name if name else ''}: {len(loaded)} steps from "
                               f"{model_of(loaded)}; press play to replay. " + self._settings_note(loaded, taken, left))
        finally:
            self._quiet = False
        return True

    def _take_trace_settings(self, trace: Trace) -> tuple[list[str], list[str]]:
        """Set every setting of ``trace`` the loaded model can run and a control can show (the rule of
        `load_trace`), without re-decoding. Returns (settings taken, settings not taken with why)."""
        from engine.decoding.decoder import DecodeConfig

        dc = trace.decode_config or {}
        loaded = self._loaded
        taken: list[str] = []
        left: list[str] = []
        quiet, self._quiet = self._quiet, True
        try:
            bs = dc.get("block_size")
            if bs in BLOCK_SIZES:
                self.block_size = bs
                taken.append(f"block size {bs}")
            elif bs is not None:
                left.append(f"block size {bs} (the control offers {', '.join(map(str, BLOCK_SIZES))})")
            thr = dc.get("threshold")
            lo, hi = self.param.threshold.bounds
            if isinstance(thr, (int, float)) and lo <= thr <= hi:
                self.threshold = float(thr)
                taken.append(f"threshold {thr:g}")
            elif thr is not None:
                left.append(f"threshold {thr:g} (the slider spans {lo:g}-{hi:g})")
            pol = dc.get("policy")
            if pol in self.param.policy.objects:
                self.policy = pol
                taken.append(f"policy {pol}")
            elif pol is not None:
                left.append(f"policy {pol} (not offered here)")
            mode = dc.get("memory_mode")
            if mode in MEMORY_MODES:
                if mode == "state+window" and loaded is not None and not loaded.window_available:
                    left.append(f"memory mode {mode} ({loaded.label} has no attention window)")
                else:
                    self.memory_mode = mode
                    taken.append(f"memory mode {mode}")
            elif mode is not None:
                left.append(f"memory mode {mode} (not offered here)")
            n = dc.get("max_new_tokens")
            if isinstance(n, int) and MAX_NEW_TOKENS_MIN <= n <= MAX_NEW_TOKENS_MAX:
                self.max_new_tokens = n
                taken.append(f"max new tokens {n}")
            elif n is not None:
                left.append(f"max new tokens {n} (the control takes {MAX_NEW_TOKENS_MIN}-{MAX_NEW_TOKENS_MAX})")
            rp = dc.get("repetition_penalty")
            if isinstance(rp, (int, float)) and rp <= 0:
                self.repetition_control = False
                taken.append("repetition penalty off")
            elif isinstance(rp, (int, float)):
                lo, hi = self.param.repetition_penalty.bounds
                if lo <= rp <= hi:
                    self.repetition_control, self.repetition_penalty = True, float(rp)
                    taken.append(f"repetition penalty {rp:g}")
                else:
                    left.append(f"repetition penalty {rp:g} (the control takes {lo:g}-{hi:g})")
            if "eos_bias_soft_limit" in dc:
                lim = dc["eos_bias_soft_limit"]
                lo, hi = self.param.eos_soft_limit.bounds
                if lim is None:
                    self.eos_bias = False
                    taken.append("EOS bias off")
                elif isinstance(lim, int) and lo <= lim <= hi:
                    self.eos_bias, self.eos_soft_limit = True, lim
                    taken.append(f"EOS bias after {lim} tokens")
                else:
                    left.append(f"EOS bias soft limit {lim} (the control takes {lo}-{hi})")
            text = prompt_of(trace)
            if text and text.strip():
                self.prompt = text
                taken.append("prompt")
            else:
                left.append("prompt (the trace records none)")
        finally:
            self._quiet = quiet
        # decoder fields no control sets: Generate uses the decoder's defaults for them
        defaults = DecodeConfig().to_dict()
        covered = {"block_size", "threshold", "policy", "memory_mode", "max_new_tokens", "repetition_penalty",
                   "eos_bias_soft_limit"}
        for key, value in dc.items():
            if key not in covered and key in defaults and value != defaults[key]:
                left.append(f"{key.replace('_', ' ')} {value} (no control: {self.generate_button} uses "
                            f"{defaults[key]})")
        return taken, left

    def _settings_note(self, trace: Trace, taken: list[str], left: list[str]) -> str:
        """The status line's account of `_take_trace_settings`: what was taken, what not, and the model
        Generate decodes with (naming the trace's too when they differ)."""
        button = self.generate_button
        note = f"Settings for {button} taken from the trace: {', '.join(taken) if taken else 'none'}"
        if left:
            note += f"; not taken: {'; '.join(left)}"
        loaded = self._loaded
        if loaded is not None:
            note += f". {button} decodes with the loaded model, {loaded.label}"
            if trace.model_id is not None and trace.model_id != loaded.model_id:
                note += f", not with the trace's model {model_of(trace)}"
        return note + "."

    def _show_settings(self, dc: dict[str, Any]) -> None:
        """Set the settings a run's decode config can be shown with (block size, threshold,
        policy, memory mode; values outside their choices are left), without re-decoding."""
        quiet, self._quiet = self._quiet, True
        try:
            if dc.get("block_size") in BLOCK_SIZES:
                self.block_size = dc["block_size"]
            thr = dc.get("threshold")
            if isinstance(thr, (int, float)) and 0.5 <= thr <= 1.0:
                self.threshold = float(thr)
            for key in ("policy", "memory_mode"):
                if dc.get(key) in self.param[key].objects:
                    setattr(self, key, dc[key])
        finally:
            self._quiet = quiet

    def trace_bytes(self, format: str = "parquet") -> io.BytesIO:
        """The displayed trace as the bytes of a file (for a download).

        Raises:
            ValueError: when there is no trace to save.
        """
        if self.trace is None or len(self.trace) == 0:
            raise ValueError(f"there is no run to save yet: {self.generate_button} first")
        with tempfile.TemporaryDirectory() as tmp:
            path = self.trace.save(Path(tmp) / f"trace.{format}", format=format)
            return io.BytesIO(path.read_bytes())

    # ------------------------------------------------------------------ comparison / cost
    def comparison(self) -> dict[str, Any] | None:
        """`previous` against `trace`: `clover_viz.runs.compare` (None without both)."""
        return compare(self.previous, self.trace)

    def cost_projection(self, device: str | None = None) -> Any:
        """`engine.cost.project_trace` of the displayed trace on `device` (None when it has no steps).

        The source model's config comes from the trace's metadata (recorded by `generate`); it is
        priced as a Clover model only when its cost family is ``clover`` (the trace's recorded
        capabilities). For another family (a causal LM, masked diffusion) there are no measured expert
        unions to carry over: the 35B-A3B projection falls back to independent routing, and the
        projection says so in its ``union_assumption``.
        """
        from engine.backbones.base import cost_family_of
        from engine.backbones.clover.config import CloverConfig
        from engine.cost import project_trace

        if self.trace is None or len(self.trace) == 0:
            return None
        meta = self.trace.meta or {}
        cfg = meta.get("model_config")
        family = cost_family_of(meta.get("capabilities"), cfg if isinstance(cfg, dict) else None)
        source = CloverConfig.from_dict(cfg) if isinstance(cfg, dict) and family == "clover" else None
        mode = (self.trace.decode_config or {}).get("memory_mode", "state")
        window = source.attention_window if (source is not None and mode == "state+window") else 0
        return project_trace(self.trace, device or self.device, source_config=source,
                             union_assumption=self.union_assumption, memory_mode=mode, window=window,
                             fallback_union="independent")

    # ------------------------------------------------------------------ break-even
    def _break_even_key(self) -> tuple[str, int, str] | None:
        """(model id, block_size, memory mode) of the displayed run (else the settings) on the loaded model."""
        loaded = self._loaded
        if loaded is None:
            return None
        dc = (self.trace.decode_config or {}) if self.trace is not None else {}
        return (loaded.model_id, int(dc.get("block_size", self.block_size)),
                str(dc.get("memory_mode", self.memory_mode)))

    def break_even_point(self) -> Any:
        """The `engine.cost.BreakEven` measured by `measure_break_even` for the loaded model at the
        displayed run's block_size and memory mode, or None if not measured yet."""
        key = self._break_even_key()
        return None if key is None else self.break_even.get(key)

    def break_even_html(self) -> str:
        """One HTML line for the views: the measured break-even (`break_even_point`) and what the
        displayed run's tokens per forward are worth against autoregressive decoding here, or a
        hint to measure it."""
        p = self.break_even_point()
        if p is None:
            return ("<span style='color:#64748b'>break-even on this machine: not measured -- "
                    "<i>Measure break-even here</i> times this model's AR step and block forward</span>")
        text = (f"break-even on this machine (measured, {p.device}, {p.threads} thread(s)): block {p.block_size} "
                f"needs <b>{p.tokens_per_forward:.2f}</b> tokens per forward to match autoregressive decoding "
                f"(AR step {p.t_ar_s * 1e3:.1f} ms, block forward {p.t_block_s * 1e3:.1f} ms)")
        loaded = self._loaded
        same_model = loaded is not None and self.trace is not None and self.trace.model_id in (None, loaded.model_id)
        if same_model and len(self.trace):
            tpf = float(self.trace.summary()["tokens_per_forward"] or 0.0)
            if tpf > 0:
                x = p.speedup(tpf)
                text += (f"; this run wrote {tpf:.2f} tokens per forward: <b>{x:.2f}x</b> the AR tokens/s "
                         f"here ({'faster' if x > 1 else 'slower'})")
        return f"<div style='font-size:13px;line-height:1.6'>{text}</div>"

    def measure_break_even(self, repeats: int = 5, prefix_len: int = 256) -> Any:
        """Measure on this machine how many tokens per forward block decoding of the loaded model
        needs to match its autoregressive decoding (`engine.cost.measure_break_even`), at the
        displayed run's block_size and memory mode (else the settings'), after a ``prefix_len``-token
        history; stores it in `break_even` and returns it. Takes a few forwards' time (SmolLM2-135M
        on one CPU thread: ~10 s; clover-tiny: well under a second).

        Returns None and sets `error` while a decode runs (the timings would measure both), for a
        model outside the decoder protocol (DiffusionGemma) or for settings it cannot run.
        """
        if self.running:
            self.error = "Break-even not measured: a decode is running; measure when it has ended (or Stop it)."
            return None
        loaded = self._loaded or self.load_model()
        key = self._break_even_key()
        if loaded is None or key is None:
            return None
        from engine.cost.break_even import measure_break_even

        _, block_size, mode = key
        status = self.status
        self.status = f"measuring the break-even of block {block_size} on this machine ..."
        try:
            point = measure_break_even(loaded.model, (block_size,), prefix_len=prefix_len, repeats=repeats,
                                       memory_mode=mode)[block_size]
        except (TypeError, ValueError, RuntimeError) as exc:
            self.error = f"Break-even not measured: {exc}"
            return None
        finally:
            self.status = status  # the run's own status line comes back
        if self.error.startswith("Break-even not measured"):
            self.error = ""  # an earlier refusal is stale now
        self.break_even = {**self.break_even, key: point}
        return point

    # ------------------------------------------------------------------ session end
    def close(self) -> None:
        """End the session's work: cancel a running decode, start no new one (idempotent)."""
        self._closed = True
        self.playing = False
        self._pending_load = None  # a background load finishes into the process cache; nothing applies it
        self._generate_when_loaded = False
        if self._run is not None:
            self._run.superseded = True
            self._run.cancel.set()
        self.running = False
