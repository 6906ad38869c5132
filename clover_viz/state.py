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

A new `generate()` while a decode runs (a threshold drag released twice) cancels the running one and throws its
partial trace away; `previous` always holds the last run that was not superseded, so the comparison is between two
whole runs. Errors (empty prompt, a bad model directory, a setting the model cannot run) set `error` and leave
`trace` / `previous` as they were. A finished run is measured against its careful decode (`clover_viz.session_careful`).

Models: `model_dir` names a checkpoint directory, resolved and loaded (once per
process) by `clover_viz.models` -- the default directory falls back to a labelled
random ``clover-test`` while it holds no checkpoint; `dev_sharpen_random` (a
development option, off by default) multiplies that random model's matrices by
`DEV_WEIGHT_SCALE`. `use_model` decodes with a model object a notebook already holds.
The numbers and the comparison the views show come from `clover_viz.runs`.

Wing: front ends (`clover_viz`). `ExplorerState` declares every parameter and keeps the decode
worker, its draining and playback; its other jobs are mixins in their own modules, each below
this one: `clover_viz.session_models` (loading the model, its memory mode and examples),
`clover_viz.session_settings` (the settings' choices and the `DecodeConfig` they make),
`clover_viz.session_traces` (opening and saving traces), `clover_viz.session_cost` (cost
projection, break-even) and `clover_viz.session_branches` (a slot's candidates, `ExplorerState.branch`
-- a branch decoded on this module's worker like a Generate -- the tree of branches and which two runs
the comparison shows). This module is the public home of `ExplorerState`.

Tests: ``.venv/bin/python -m pytest tests/apps/test_explorer_app.py -q``
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Any

import param

from clover_viz.examples import DEFAULT_EXAMPLE, EXAMPLE_PROMPTS, YOUR_PROMPT
from clover_viz.models import DEFAULT_MODEL_DIR, DEV_WEIGHT_SCALE, LoadedModel, load_model_cached
from clover_viz.runs import (chat_template_note, compare, dropped_at_stop, failed_status, forced_past_answer, generated_ids,
                             kept_at_stop, long_prompt_note, masked_at_end_note, past_training_note)
from clover_viz.session_branches import SessionBranches
from clover_viz.session_careful import SessionCareful
from clover_viz.session_cost import SessionCost
from clover_viz.session_models import SessionModels
from clover_viz.session_pacing import _LIVE_RUNS, DrawPacer, RunPace, _Run, live_decodes
from clover_viz.session_settings import (
    BLOCK_SIZES,
    DEVICE_CHOICES,
    MAX_NEW_TOKENS_MAX,
    MAX_NEW_TOKENS_MIN,
    MEMORY_MODES,
    OFFICIAL_SAMPLERS,
    POLICY_HELP,
    sampler_summary,
    SessionSettings,
    _check_memory_mode,
)
from clover_viz.session_traces import SessionTraces
from clover_engine.cost import DEFAULT_DEVICE, UNION_ASSUMPTIONS
from clover_engine.recording.events import BlockStart, DecodeEnd, StepEvent
from clover_engine.decoding import decoder_for  # imports the decoder it picks only when called (kernels: seconds)
from clover_engine.decoding.policies import POLICIES
from clover_engine.prompting import model_input, trained_context_note
from clover_engine.trust import budget_note, forced_share_note
from clover_engine.recording.trace import Trace


def _snapshot(event: Any) -> Any:
    """Copy an event's arrays at emit time (in the worker thread).

    On the CPU, ``BlockStart.tokens`` shares memory with the decoder's block tensor, which
    the decoder then fills in place; without a copy the start record would show the final
    tokens instead of the masks.
    """
    if isinstance(event, BlockStart):
        return dataclasses.replace(event, tokens=event.tokens.copy(), prefilled=event.prefilled.copy())
    return event


class ExplorerState(SessionModels, SessionSettings, SessionTraces, SessionCost, SessionBranches, SessionCareful,
                    param.Parameterized):
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
    policy = param.Selector(default="low_confidence", objects=[*POLICIES, *OFFICIAL_SAMPLERS], doc=POLICY_HELP)
    memory_mode = param.Selector(default="state+window", objects=list(MEMORY_MODES), doc=(
        "'state' keeps history only in recurrent state (Clover); 'state+window' also keeps the last W "
        "committed K/V in attention layers (a labelled non-Clover variant; needs attention_window > 0). "
        "Default state+window: the bundled model's best mode (exact tool calls 29 % vs 4 % in state, "
        "models/clover-tiny's card); a model loaded from a checkpoint directory starts in its best measured "
        "mode (from its eval.json, as the command line does) unless a mode was chosen; a model without a "
        "window falls back to state on load."))  # clover_engine.checkpoint.best_memory_mode
    max_new_tokens = param.Integer(default=128, bounds=(MAX_NEW_TOKENS_MIN, MAX_NEW_TOKENS_MAX),
                                   doc="Generated-token budget.")
    repetition_control = param.Boolean(default=False, doc="n-gram repetition penalty (model card).")
    repetition_penalty = param.Number(default=2.0, bounds=(0.1, 20.0), doc="Logit penalty when on.")
    eos_bias = param.Boolean(default=False, doc="Progressive EOS bias past a soft length limit (model card).")
    eos_soft_limit = param.Integer(default=96, bounds=(0, 4096), doc="Generated tokens before EOS is favoured.")
    max_upload_bytes = param.Integer(default=None, allow_None=True, bounds=(0, None), doc=(
        "Largest trace file `load_trace` takes as bytes (an upload; the served app: "
        "`clover_viz.limits.MAX_TRACE_UPLOAD_BYTES`); None: no limit."))
    auto_redecode = param.Boolean(default=True, doc=(
        "Re-decode when threshold or block_size changes (sliders set them on release)."))

    # --- cost panel
    device = param.Selector(default=DEFAULT_DEVICE, objects=list(DEVICE_CHOICES), doc=(
        "Device for projected tokens/s and the roofline ('this-machine' is measured once)."))
    union_assumption = param.Selector(default="measured_vs_independent", objects=list(UNION_ASSUMPTIONS), doc=(
        "How the 35B-A3B expert union per forward is derived from the recorded run: from the union measured "
        "against independent routing ('measured_vs_independent'), as the measured fraction of experts "
        "('measured_fraction': saturates with few experts), or independent routing ('independent')."))

    # --- outputs (set by the state itself)
    trace = param.ClassSelector(class_=Trace, default=None, allow_None=True, doc="The run on display.")
    previous = param.ClassSelector(class_=Trace, default=None, allow_None=True, doc=(
        "The run before it, kept for comparison."))
    trace_version = param.Integer(default=0, doc="Bumped whenever `trace` gains events.")
    branch_version = param.Integer(default=0, doc=(
        "Bumped whenever `branches` (the tree of branches), the node shown or the comparison's two runs change."))
    running = param.Boolean(default=False, doc="A decode is running.")
    loading = param.Boolean(default=False, doc="A model is loading in the background (`start_load`).")
    load_percent = param.Integer(default=-1, doc="Done of the background load's phase (download, weights), %; -1 unknown.")
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
        "(`clover_engine.checkpoint.best_memory_mode`: its eval.json); empty for a model given in memory."))
    break_even = param.Dict(default={}, doc=(
        "Measured on this machine by `measure_break_even`: {(model id, block_size, memory mode): "
        "clover_engine.cost.BreakEven}."))

    # --- playback
    position = param.Integer(default=0, bounds=(0, None), doc="Step (forward) index on display.")
    n_steps = param.Integer(default=0, doc="Steps in `trace`.")
    playing = param.Boolean(default=False, doc="Playback is advancing `position`.")
    speed = param.Number(default=8.0, bounds=(0.5, 60.0), doc="Playback speed, steps per second.")

    # --- what a setting change runs: the handlers live in the mixins (`clover_viz.session_models`);
    #     param reads ``@param.depends`` only from a Parameterized class's own body, so they are wired here
    _on_model_change = param.depends("model_dir", "dev_sharpen_random", watch=True)(SessionModels._on_model_change)
    _on_example = param.depends("example", watch=True)(SessionModels._on_example)
    _on_prompt = param.depends("prompt", watch=True)(SessionModels._on_prompt)

    generate_button: str = "Generate"  # what the front end calls its decode button (the notebook's: "Decode")

    def __init__(self, loader: Any = None, model_roots: Any = None, **params: Any) -> None:
        super().__init__(**params)
        self._loader = loader or load_model_cached
        # the served app's model roots (`clover_viz.limits.model_roots`); None: any path (notebooks, scripts)
        self._model_roots = None if model_roots is None else tuple(model_roots)
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
        self._pacer = DrawPacer()  # when a decoding session next redraws (tick)
        # the served app: a decode waits for its page (clover_viz.session_pacing); notebooks, scripts drain themselves
        self.paced_decodes = False
        # the memory mode the state chose itself (None: given to the constructor): see _start_in_best_memory_mode
        self._auto_memory_mode: str | None = None if "memory_mode" in params else self.memory_mode
        # the policy / block size the state chose for a drafter (None: given, or not chosen): _fit_policy_to_model
        self._auto_policy: str | None = None if "policy" in params else self.policy
        self._auto_block: int | None = None
        self._on_prompt()  # a prompt given here names its example, or YOUR_PROMPT

    @param.depends("threshold", "block_size", watch=True)
    def _on_decode_setting(self) -> None:
        if not self.auto_redecode or self._quiet or self.trace is None or self._closed:
            return
        dc = self.trace.decode_config or {}
        # verify mode reads no threshold (the base decides what is written): moving it decodes nothing new
        if self.policy == dc.get("policy") == "verify" and self.block_size == dc.get("block_size"):
            return
        self.generate()

    # ------------------------------------------------------------------ decoding
    def generate(self, config: Any = None) -> bool:
        """Start decoding `prompt` with the current settings in a worker thread.

        Args:
            config: an ``clover_engine.decoding.decoder.DecodeConfig`` to decode with instead of the one the
                settings make (a notebook's, with fields the settings do not cover); the
                settings take its values where they can show them.

        A decode already running is cancelled and its partial trace dropped. Returns False
        (and sets `error`, keeping the runs on display) when the prompt, the model or the
        settings are unusable.
        """
        if self._closed:
            return False
        if not self.prompt or not self.prompt.strip():
            self._refuse(f"The prompt is empty: type a prompt or pick an example, then {self.generate_button}.")
            return False
        if self.loading:  # a background load (start_load): decode once it is done
            self._generate_when_loaded = True
            self.status = f"loading {self._model_name()} ... the decode starts when it is loaded"
            return True
        if self._reload_evicted():  # the served app unloaded this session's model for another's
            return True
        loaded = self.load_model(adjust_mode=False)
        if loaded is None:
            return False
        try:
            if config is None:
                dc = self.decode_config(loaded)
            else:
                if hasattr(config, "memory_mode"):  # a DecodeConfig (an official sampler's settings have none)
                    _check_memory_mode(config.memory_mode, loaded)
                dc = config
            # the block decoder, or the sampler the model runs itself (DiffusionGemma), by its capabilities
            own = getattr(type(dc), "DECODER", None) is not None  # an official sampler's settings name their decoder
            decoder = (None if own else loaded.decoder) or decoder_for(loaded.model, loaded.tokenizer, dc)
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

        tok = loaded.tokenizer
        live = Trace(
            decode_config=dc.to_dict(), model_id=loaded.model_id,
            token_text=lambda i: tok.decode([i], skip_special_tokens=False), prompt_ids=prompt_ids,
            meta={"model_label": loaded.label, "model_config": loaded.config.to_dict(),
                  "dev_weight_scale": loaded.spec.dev_scale, "recorded_on": "cpu",
                  "prompt": given.prompt, "model_input": given.text, "chat_template": given.template,
                  "trained_context_note": trained_context_note(len(prompt_ids), loaded.capabilities),
                  "capabilities": loaded.capabilities.to_dict()},
        )

        self._careful_arm(loaded, dc, prompt_ids, live)  # measured against its careful decode when it ends
        def decode(hook: Any, cancel: threading.Event) -> None:
            decoder.generate(prompt_ids, hooks=[hook], record_trace=False, cancel=cancel, config=dc)

        how = sampler_summary(dc)
        long_prompt = live.meta["trained_context_note"]
        self._start_run(live, decode, dc.canvas_length if hasattr(dc, "canvas_length") else dc.max_new_tokens,
                        f"decoding with {loaded.label}: {how}" + (" · prompt " + given.note if given.wrapped else "")
                        + (f" · {long_prompt}" if long_prompt else ""))
        return True

    def _start_run(self, live: Trace, decode: Any, budget: int, status: str, previous: Any = None,
                   kind: str = "decode") -> None:
        """Show ``live`` (empty) and run ``decode(hook, cancel)`` -- the engine call -- in a worker thread:
        its events fill ``live`` through `drain`; a result it returns (not None) goes to `_on_result` on
        the UI thread. A running decode is cancelled first (one per session); `previous` becomes the run
        on display (``previous``: that run instead)."""
        restore = (self.trace, self.previous, self.position)
        if self._run is not None and self.running:
            self._run.superseded = True
            self._run.cancel.set()
            restore = self._run.restore
        elif self.trace is not None:
            self.previous = self.trace
        if previous is not None:
            self.previous = previous
        self._run_counter += 1
        run = _Run(self._run_counter, threading.Event(), kind=kind, restore=restore)
        events = self._events
        # one decode per session at a time: a superseded one ends after its current forward, then this one starts
        before = [t for t in (self._run.thread if self._run is not None else None, self._careful_gives_way()) if t]

        run.pace = RunPace(self.paced_decodes, run.cancel)

        def hook(ev: Any, _rid: int = run.run_id) -> None:
            if isinstance(ev, StepEvent):
                run.step_times.append(time.monotonic())  # when each forward ended (stop timing)
            events.put((_rid, "event", _snapshot(ev)))
            if isinstance(ev, StepEvent):
                run.pace.forward_ended()  # the served app: waits while the page is behind

        def work() -> None:
            try:
                for thread in before:  # the decode before it, and a careful decode under way: the model is not shared
                    thread.join()
                result = decode(hook, run.cancel)
                if result is not None:
                    events.put((run.run_id, "result", result))
            except Exception as exc:  # noqa: BLE001  (any failure is reported on the UI thread by drain())
                events.put((run.run_id, "error", exc))
            finally:
                events.put((run.run_id, "exit", None))

        run.thread = threading.Thread(target=work, name=f"clover-decode-{run.run_id}", daemon=True)
        _LIVE_RUNS.add(run)
        self._run = run
        self._budget = budget
        self._written = 0
        self.playing = False
        with param.parameterized.batch_call_watchers(self):
            self.trace = live
            self.n_steps = 0
            self.position = 0
            self.progress = 0
            self.running = True
            self.status = status
        run.thread.start()

    def _refuse(self, error: str) -> None:
        """A `generate` that did not start: set `error`, and say in `status` that no new decode
        started -- the line must not keep reading as the outcome of this attempt (a previous
        run's "done: ..."); the run on display stays."""
        self.error = error
        if not self.running:
            shown = " (the run on display is the previous one)" if self.trace is not None else ""
            self.status = f"not decoded: the new decode did not start, see the error{shown}"

    def stop(self, shown: int | None = None) -> None:
        """Cancel the running decode; it stops after its current forward and keeps what the page showed
        (``shown``: the forwards the page had drawn, which the served app's Stop sends; None: those this
        session had drawn) plus that forward (`clover_viz.runs.kept_at_stop`). While a model loads (and
        nothing decodes), give the load up instead (`cancel_load`).

        `stop_timing` records when (monotonic seconds) and at which NFE (steps shown) the stop
        was asked for, how far (s, ``window_s``) a paced decode could run ahead of its page (`RunPace`),
        and, once the decode has ended, when and at which NFE it ended."""
        if self.loading and not self.running:  # Stop while a model loads: give it up, back to the one before
            self.cancel_load()
            return
        run = self._run
        if run is not None and self.running:
            shown = self.n_steps if shown is None else min(int(shown), self.n_steps)
            run.page_shown = shown if run.page_shown is None else min(run.page_shown, shown)
            if run.user_stopped:  # the page's count arrived after its click (or a second click)
                return self.stop_timing.update(nfe_shown=run.page_shown)
            run.user_stopped = True
            run.cancel.set()
            self.stop_timing = {"requested_at": time.monotonic(), "nfe_shown": run.page_shown,
                                "nfe_recorded": len(self.trace) if self.trace is not None else 0,
                                "window_s": run.pace.window_s if run.pace is not None and run.pace.paced else 0.0}
            self.status = "stopping..."

    def wait(self, timeout: float = 30.0) -> bool:
        """Block until the running decode's thread ends, then drain (for tests and scripts); -> True when
        nothing is running any more (and the worker thread has ended)."""
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
            if kind == "event" and run.user_stopped:  # keep what the page showed plus one forward
                run.held.append(payload)
                if isinstance(payload, DecodeEnd):
                    if run.page_shown is not None and run.page_shown < len(self.trace):  # the page had drawn less
                        self.trace, later = self.trace.split(run.page_shown)
                        run.held[:0] = later
                    batch, run.dropped = kept_at_stop(self.trace, run.held)
                    run.held = []
                    applied += self._record(run, batch)
            elif kind == "event":
                applied += self._record(run, [payload])
                steps += isinstance(payload, StepEvent)
            elif kind == "error":
                self._fail(payload)
            elif kind == "result":
                self._on_result(payload)
            elif kind == "exit" and self.running:  # ended without DecodeEnd (error path)
                self.running = False
        if applied and self.trace is not None:
            n_old, n_new = self.n_steps, len(self.trace)
            with param.parameterized.batch_call_watchers(self):
                self.n_steps = n_new
                if n_new and (n_old == 0 or self.position >= min(n_old, n_new) - 1):
                    self.position = n_new - 1  # follow the newest step unless the user scrubbed back
                if self.running:
                    n_tok = len(generated_ids(self.trace))
                    self.progress = min(100, int(100 * n_tok / max(self._budget, 1)))
                    blk = self.trace.step(-1).block_index if n_new else 0  # 0-based, as in the figures
                    status = f"{'branching' if run.kind == 'branch' else 'decoding'}: block {blk}, " \
                             f"{n_tok}/{self._budget} tokens, NFE {n_new}"
                    self.status = "stopping... " + status if self._run.user_stopped else status
                self.trace_version += 1
        return applied

    def _record(self, run: _Run, events: list) -> int:
        """Record ``events`` of ``run`` in `trace` (UI thread, from `drain`); -> how many."""
        for ev in events:
            if isinstance(ev, DecodeEnd) and run.pace.waited_s:  # waiting for the page: not decode time
                waited = min(run.pace.waited_s, ev.observer_s)
                ev = dataclasses.replace(ev, wall_s=ev.wall_s - waited, observer_s=ev.observer_s - waited)
            self.trace(ev)
            if isinstance(ev, StepEvent):
                self._written += ev.n_written
                run.pace.forwards_drawn(1)
            elif isinstance(ev, DecodeEnd):
                self._finish(ev)
        return len(events)

    def _finish(self, end: DecodeEnd) -> None:
        run = self._run
        if run is not None and run.user_stopped and self.stop_timing:
            asked = self.stop_timing["requested_at"]
            self.stop_timing = dict(self.stop_timing, ended_at=time.monotonic(), final_nfe=int(end.nfe),
                                    forwards_after_request=sum(t > asked for t in run.step_times),
                                    forwards_dropped=run.dropped)
        self.running = False
        self.progress = 100
        tpf = f"{end.tokens_per_forward:.2f}"
        if end.stop_reason == "cancelled":
            status = f"stopped: kept {len(end.tokens)} tokens after {end.nfe} forwards ({end.n_forced} forced fills)"
            if run is not None and run.dropped:  # the decode had run ahead of the page (session_pacing)
                status += f", what the page showed plus the forward in flight ({run.dropped} later forwards not kept)"
            gone = dropped_at_stop(self.trace) if self.trace is not None else None
            if gone and gone["n_dropped"]:
                n, were = gone["n_dropped"], ("slot", "was") if gone["n_dropped"] == 1 else ("slots", "were")
                status += (f"; {n} {were[0]} of block {gone['block']} written after a still-masked slot {were[1]} "
                           f"dropped ({gone['n_forced_dropped']} of them forced), struck through in the text")
            self.status = status
        else:
            dc = (self.trace.decode_config if self.trace is not None else None) or {}
            mode = dc.get("memory_mode", self.memory_mode)
            past = forced_past_answer(self.trace) if self.trace is not None else 0
            # as the CLI's note: forced fills of end-of-text slots are forwards spent, not tokens
            forced = f"{end.n_forced} forced" + (
                f" ({past} of them wrote end-of-text slots at or after the answer's end: forwards, not tokens)"
                if past else "")
            if dc.get("policy") == "verify" and self.trace is not None:  # a drafter proposed, the base verified
                rounds = self.trace.steps[1:]  # step 0: the base's first token after the prompt
                drafted = sum(int((st.candidate >= 0).sum()) for st in rounds)
                acc = sum(int(st.accepted.sum()) for st in rounds)
                forced = (f"the drafter proposed {drafted} tokens in {len(rounds)} rounds and the base accepted "
                          f"{acc} ({acc / max(len(rounds), 1):.2f} per round); the rest it wrote itself -- its own "
                          "greedy answer")
            guessed = "" if dc.get("policy") == "verify" else forced_share_note(
                len(end.tokens), end.n_forced - past, self.trace.model_id if self.trace is not None else None)
            self.status = (f"done: {len(end.tokens)} tokens in {end.nfe} "
                           f"{'base forwards' if dc.get('policy') == 'verify' else 'forwards'} ({tpf} tokens/forward), "
                           f"{forced}, memory {mode}, stop: {end.stop_reason}"
                           + past_training_note(dc.get("block_size") or dc.get("block_length"), self._trained_block)
                           + chat_template_note(self.trace)
                           + long_prompt_note(self.trace) + masked_at_end_note(self.trace)
                           + (f" · {guessed}" if guessed else "")
                           + (f" · {budget}" if (budget := budget_note(dc, len(end.tokens), end.stop_reason)) else ""))
        self._measure_careful(end)  # then measured against its careful decode (clover_viz.session_careful)

    def _fail(self, exc: BaseException) -> None:
        run = self._run
        branch = run is not None and run.kind == "branch"
        self.error = (f"Not branched: {exc}" if branch and isinstance(exc, ValueError)
                      else f"Decoding failed: {type(exc).__name__}: {exc}")
        with param.parameterized.batch_call_watchers(self):
            self.running = False
            self.status = failed_status(exc, branch, len(self.trace) if self.trace is not None else 0)
            if self.trace is not None and len(self.trace) == 0:  # nothing produced: show the runs of before again
                self.trace, self.previous, pos = run.restore if run is not None else (self.previous, None, 0)
                self.n_steps = len(self.trace) if self.trace is not None else 0
                self.position = min(pos, max(self.n_steps - 1, 0))
                self.trace_version += 1

    # ------------------------------------------------------------------ playback
    def tick(self, dt: float = 0.1) -> None:
        """Periodic work on the UI thread: apply a finished background load, drain events, then
        advance playback by ``dt`` seconds.

        While a decode runs, redraws are paced by what they cost (`clover_viz.session_pacing.DrawPacer`):
        the server's event loop is shared by every session and must stay free to hear a Stop."""
        self._poll_load()
        self._poll_careful()
        run = self._run
        ended = run is None or run.thread is None or not run.thread.is_alive()
        if not self.running or ended or self._pacer.due():  # a run's end is drawn at once
            t0 = time.perf_counter()
            if self.drain() and self.running:
                self._pacer.drew(time.perf_counter() - t0, live_decodes())  # the watchers' cost: figures...
                run.pace.window_s = self._pacer.window_s  # the decode may run one refresh ahead of the page
        self._drop_evicted()
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

    # ------------------------------------------------------------------ comparison
    def comparison(self) -> dict[str, Any] | None:
        """`previous` against `trace`, or the two runs `compare_pick` chose (`compared_runs`, named by
        `comparison_labels`): `clover_viz.runs.compare` (None without both)."""
        return compare(*self.compared_runs())

    # ------------------------------------------------------------------ session end
    def close(self) -> None:
        """End the session's work: cancel a running decode, start no new one (idempotent)."""
        self._closed = True
        self.playing = False
        self._give_up_pending_load()
        self._cancel_careful()
        self._generate_when_loaded = False
        if self._run is not None:
            self._run.superseded = True
            self._run.cancel.set()
        self.running = False
