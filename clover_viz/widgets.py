"""ipywidgets front end for JupyterLab: `Explorer(model_or_trace).show()`.

The same session state as the Panel app (`clover_viz.state.ExplorerState`: the decode
in a worker thread, the current and previous run, the comparison, loading traces) and
the same figures (`clover_viz.figures`), as plotly ``go.FigureWidget``s (plotly >= 6
needs ``anywidget`` in the kernel's env) that are created once and mutated in place
(``batch_update``) -- never rebuilt per frame:

* a ``Play`` widget linked (``jslink``) to a step ``IntSlider`` replays the
  trace; every step change redraws the block view, the confidence heatmap's
  cursor (the heatmap itself only when the block changes), the text and the
  cursor of the cumulative-tokens chart;
* with a model, ``threshold`` (``FloatSlider``) and ``block_size``
  (``Dropdown``) have ``continuous_update=False`` and re-decode the prompt on
  release, in the background: the callback starts the state's decode (a worker
  thread) and returns, a pump thread drains its events into the figures, and the
  kernel stays free; the Stop button ends it after its current forward. The previous
  run stays beside the new one (``figures.compare_table`` of
  `ExplorerState.comparison`, the table the Panel app shows, and the text diff);
* `Explorer.decode` is the synchronous form for cells and scripts: it returns the
  trace when the run has ended (the block visibly fills in while the cell runs);
  interrupting the kernel stops the decode after its current forward;
* an error in a widget callback (a decode that cannot start or fails) is shown in
  the status line; the run on display stays;
* branching (`clover_viz.widget_branches`, ``ex.branching``): a click on a slot of the block view
  (or its index and "Open slot") shows its candidates at the step shown; Choose / Re-mask / "Branch
  here with these settings" decode a branch live, listed in the "compare runs" tab under the run it
  came from, where any branch can be shown and any two compared. In code: ``ex.branch(Branch.choose(b,
  s, slot, token))`` (`ExplorerDecoding.branch`) or, without the widgets, ``ex.state.branch(...)``.

Callbacks are registered once per `Explorer`, in its constructor; calling
`show()` again (re-running a cell) returns the same widget tree and adds
nothing. A new ``Explorer`` in a re-run cell owns new widgets; `close()`
releases the old ones.

One set of settings: the ``DecodeConfig`` the next decode uses is `Explorer.config`, and the
threshold / block_size widgets always show it. A widget change, ``decode(**overrides)`` and
the constructor's ``decode_config`` all set it (an override stays the setting for later
decodes; a block_size outside the dropdown's choices is added to them, a threshold below the
slider's range widens it); settings without a widget (memory mode, max_new_tokens, policy ...)
are kept in it and named in the status line after each run. Made from a checkpoint directory
(or with no argument: the bundled default model, as the app opens), its defaults are the app's
(`ExplorerState.decode_config` after `ExplorerState.load_model`): block 32, threshold 0.95, and
the model's best measured memory mode (`clover_engine.checkpoint.best_memory_mode`, the CLI's default).

Usage::

    from clover_viz import Explorer
    ex = Explorer()                                       # the bundled model, the app's defaults
    ex = Explorer(Trace.load("runs/example.parquet"))     # replay, no model needed
    ex.show()
    ex = Explorer(model, tokenizer, DecodeConfig(block_size=32, threshold=0.95))
    ex.show(); ex.decode("<|im_start|>user ...")          # live

Wing: front ends (`clover_viz`). Below this module: `clover_viz.widget_bundle` (the plotly figure
widgets sharing one plotly.js bundle, the Explorers of each notebook cell) and
`clover_viz.widget_decoding` (`Explorer`'s decoding: start, pump, wait, stop, the finished run, a branch)
and `clover_viz.widget_branches` (the slot's candidates, the branch actions and list).
This module is the public home of `Explorer` (`from clover_viz import Explorer`).

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_widgets.py -q``
"""

from __future__ import annotations

import dataclasses
import html
import threading
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from clover_viz import figures as F
from clover_viz.examples import DEFAULT_EXAMPLE, EXAMPLE_PROMPTS
from clover_viz.models import DEFAULT_MODEL_DIR, LoadedModel, resolve_model
from clover_viz.runs import run_stats, summary_cards_html
from clover_viz.session_settings import BLOCK_SIZE_UNUSED, BLOCK_SIZES, controls_of
from clover_viz.state import ExplorerState
from clover_viz.widget_branches import BranchWidgets
from clover_viz.widget_bundle import _CarrierFigure, _StubFigure, _live_widgets, _register
from clover_viz.widget_decoding import ExplorerDecoding
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.decoding.frontier import DEFAULT_BLOCK_SIZES, DEFAULT_THRESHOLDS
from clover_engine.recording.trace import Trace

THRESHOLD_MIN, THRESHOLD_MAX = 0.5, 1.0  # the threshold slider's range (it widens to show a lower setting)
# The app's default prompt (for a Clover model); an Explorer without a prompt starts, as the app does,
# with the default example of the model it decodes (`clover_viz.examples.examples_for`).
DEFAULT_PROMPT = EXAMPLE_PROMPTS[DEFAULT_EXAMPLE]


def _block_size_options(block_size: int) -> list[int]:
    """The block_size dropdown's choices: `BLOCK_SIZES` plus ``block_size`` when it is not one of them."""
    return sorted(set(BLOCK_SIZES) | {int(block_size)})


def _threshold_format(threshold: float) -> str:
    """The threshold slider's readout format: two decimals, or as many as ``threshold`` needs (up to 4
    significant digits) when it is off the slider's 0.01 grid, so the readout shows the value that runs."""
    return ".2f" if abs(round(threshold, 2) - threshold) < 1e-9 else ".4g"



def _is_trace(obj: Any) -> bool:
    return hasattr(obj, "steps") and hasattr(obj, "blocks") and hasattr(obj, "token_str")


class Explorer(ExplorerDecoding):
    """Interactive view of one decode (replay) or of a model (decode, re-decode, compare).

    ``state`` is the `clover_viz.state.ExplorerState` it drives (the Panel app's session
    object); ``trace`` and ``previous`` are the state's. ``config`` is the ``DecodeConfig`` the
    next decode starts from (None for a replay): the threshold and block_size widgets show it,
    and a decode's overrides or a widget change become it once that decode has started.

    Args:
        model_or_trace: an ``clover_engine.recording.trace.Trace``; a path to a saved trace
            (``.parquet`` / ``.arrow``); a ``CloverModel``; a ``BlockDecoder`` (its model,
            tokenizer and config; its registered hooks fire too); or a checkpoint
            directory, or a hub id ``org/name[@revision]`` (fetched into the huggingface_hub cache;
            loaded once per process by `clover_viz.models`, as the Panel app does).
            None (the default): the bundled default model, `clover_viz.models.DEFAULT_MODEL_DIR`,
            which the app opens too (a labelled random clover-test while it holds no checkpoint).
        tokenizer: the model's tokenizer (ignored for a trace; read from a
            checkpoint directory when not given).
        decode_config: an ``clover_engine.decoding.decoder.DecodeConfig``, or a dict of its fields (the others
            take the defaults). Default, and for the fields a dict leaves out: for a checkpoint
            directory the app's settings (block 32, threshold 0.95, 128 new tokens, the model's
            best measured memory mode); for a model object ``DecodeConfig()``.
        prompt: the prompt `decode` uses when called without one (default: the loaded model's
            default example, as in the app).
        model, trace: keyword names for ``model_or_trace`` (``Explorer(model="org/name")``,
            ``Explorer(trace="run.parquet")``), as the app and the CLI name them; give one of the three.

    Raises:
        TypeError: for anything else, naming what was expected; for two of ``model_or_trace`` /
            ``model`` / ``trace`` at once.
        ValueError: for a path that is neither a trace file nor a directory, or a trace
            file / checkpoint that does not load.
    """

    def __init__(self, model_or_trace: Any = None, tokenizer: Any = None, decode_config: Any = None,
                 prompt: str | None = None, *, model: Any = None, trace: Any = None) -> None:
        named = {k: v for k, v in (("model_or_trace", model_or_trace), ("model", model), ("trace", trace))
                 if v is not None}
        if len(named) > 1:
            raise TypeError(f"Explorer takes one model or trace; got {' and '.join(named)} -- pass one of them "
                            "(positionally, or as model= / trace=)")
        model_or_trace = next(iter(named.values()), None)
        settings: dict[str, Any] = {"auto_redecode": False}
        if prompt:
            settings["prompt"] = prompt
        self.config = None  # the DecodeConfig decodes start from (None: replay only)
        self._source = model_or_trace
        obj = DEFAULT_MODEL_DIR if model_or_trace is None else model_or_trace
        fields = decode_config if isinstance(decode_config, dict) else None
        if fields is not None:
            decode_config = DecodeConfig(**fields)  # a bad field fails here, naming it
        loaded: LoadedModel | None = None
        self.state: ExplorerState | None = None
        if isinstance(obj, (str, Path)):
            p = Path(obj).expanduser()
            if p.is_file():
                obj = Trace.load(p)
            else:  # a model directory, loaded by the state as the app loads it (cwd, repository root, models/<name>)
                try:
                    resolve_model(str(obj))
                except ValueError as exc:
                    raise ValueError(f"{str(obj)!r} is neither a trace file nor a model: {exc}") from None
                self.state = ExplorerState(model_dir=str(obj), **settings)
                loaded = self.state.load_model()  # also picks the model's best memory mode, as in the app
                if loaded is None:
                    raise ValueError(f"{str(obj)!r} is neither a trace file nor a model: {self.state.error}")
                if tokenizer is not None:
                    self.state.use_model(dataclasses.replace(loaded, tokenizer=tokenizer))
                app = self.state.decode_config(loaded)  # the app's settings, then the fields given
                self.config = dataclasses.replace(app, **fields) if fields is not None else (decode_config or app)
        if self.state is not None:
            pass  # a model directory, loaded above
        elif _is_trace(obj):
            pass
        elif isinstance(obj, BlockDecoder):
            if decode_config is not None:
                obj.config = decode_config
            if tokenizer is not None:
                obj.tokenizer = tokenizer
            loaded = LoadedModel.in_memory(obj.model, obj.tokenizer, decoder=obj)
            self.config = obj.config
        else:
            import torch

            if not isinstance(obj, torch.nn.Module):
                raise TypeError(
                    "Explorer takes a Trace, a trace file path, a CloverModel, a BlockDecoder or a checkpoint "
                    f"directory; got {type(obj).__name__}"
                )
            loaded = LoadedModel.in_memory(obj, tokenizer)
            self.config = decode_config or DecodeConfig()
        if self.state is None:
            self.state = ExplorerState(**settings)
            if loaded is not None:
                self.state.use_model(loaded)
            else:
                self.state.load_trace(obj)
        self.state.generate_button = "Decode"  # the state's messages name this front end's button
        self.prompt = self.state.prompt  # the prompt given, else the model's default example (as in the app)
        self._step = 0
        self._block = None
        self._last_draw = 0.0
        self._drawn: tuple[Any, int] = (None, 0)  # (trace, forwards) of the last live draw
        self._busy = False
        self._quiet = False
        self._lock = threading.RLock()  # the pump thread and the kernel's callbacks draw in turn
        self._pump: threading.Thread | None = None  # drains a background decode into the figures
        self._last_error = ""
        self._decodes_started = 0
        self._conf_trace = None
        # every finished decode is measured against its careful decode in the background, as in the app (the card
        # reads "measuring…" until it ends); ``ex.state.measure_careful = False`` turns that off
        self._watcher = self.state.param.watch(self._on_trace_grown, "trace_version")
        self._closed = False
        before = set(_live_widgets())
        self._build()
        # every widget the build made (layouts, styles, the jslink, containers), for `close`
        self._created = [w for k, w in list(_live_widgets().items()) if k not in before]
        _register(self)

    @property
    def trace(self) -> Any:
        """The run on display (`ExplorerState.trace`; None before the first decode)."""
        return self.state.trace

    @property
    def previous(self) -> Any:
        """The run before it, kept for the comparison (`ExplorerState.previous`)."""
        return self.state.previous

    # ------------------------------------------------------------------ widgets
    def _build(self) -> None:
        import ipywidgets as W

        has_model = self.config is not None
        dc = self.config if has_model else (self.trace.decode_config or {})
        get = (lambda k, d: getattr(dc, k, d)) if has_model else (lambda k, d: dc.get(k, d) if dc else d)
        n = len(self.trace) if self.trace is not None else 0

        # The slider counts forwards from 1, as the figure titles do ("step 3/17" = after forward 3);
        # `show_step` and the state take 0-based step indices.
        self.play = W.Play(value=1, min=1, max=max(n, 1), step=1, interval=100, description="play")
        self.step_slider = W.IntSlider(value=1, min=1, max=max(n, 1), step=1, description="step",
                                       continuous_update=True, layout=W.Layout(width="420px"))
        self._link = W.jslink((self.play, "value"), (self.step_slider, "value"))
        self.speed = W.IntSlider(value=10, min=1, max=60, description="fps", continuous_update=False,
                                 layout=W.Layout(width="220px"))
        bs, read = controls_of(dc) if has_model else (int(get("block_size", 32)), get("threshold", 0.95))
        thr = 0.95 if read is None else float(read)  # None: the sampler reads no threshold (verify, LLaDA, Dream)
        self.threshold = W.FloatSlider(value=thr, min=min(THRESHOLD_MIN, thr), max=THRESHOLD_MAX, step=0.01,
                                       description="threshold", continuous_update=False,
                                       readout_format=_threshold_format(thr), disabled=not has_model or read is None)
        self.block_size = W.Dropdown(options=_block_size_options(bs), value=bs, description="block_size",
                                     disabled=not has_model or get("sampler", None) in BLOCK_SIZE_UNUSED,
                                     layout=W.Layout(width="200px"))
        self.prompt_box = W.Textarea(value=self.prompt, description="prompt", rows=3,
                                     layout=W.Layout(width="98%"), disabled=not has_model)
        self.decode_button = W.Button(description="Decode", button_style="primary", disabled=not has_model,
                                      icon="play")
        self.stop_button = W.Button(description="Stop", button_style="warning", disabled=True, icon="stop",
                                    tooltip="stop the running decode after its current forward (keeps what it wrote)")
        self.status = W.HTML(value="" if has_model else "<i>replaying a recorded trace (no model: threshold and "
                                                          "block_size show the recorded run)</i>")
        # the app's number cards, from the same function (`clover_viz.runs.summary_cards_html`)
        self.summary = W.HTML(value=summary_cards_html(None))
        self.text = W.HTML(layout=W.Layout(max_height="220px", overflow="auto", border="1px solid #e2e8f0",
                                           padding="4px"))
        self.compare = W.HTML(value="<i>decode again (or move threshold / block_size): the previous run is compared "
                                    "here</i>")

        # Placeholders carry only a title: a FigureWidget's front end merges later updates into its
        # state and does not reliably drop properties (an annotation, hidden axes) the new figure lacks.
        placeholder = go.Figure(layout=dict(title=dict(text="decode a prompt to see the block fill in", x=0.01),
                                            height=260, template="plotly_white"))
        self.block_fig = _CarrierFigure(placeholder)  # carries plotly's widget bundle; the rest share it
        self.conf_fig = _StubFigure(placeholder)
        self.cum_fig = _StubFigure(placeholder)
        self.tpf_fig = _StubFigure(placeholder)
        self.expert_fig = _StubFigure(placeholder)
        self.expert_load_fig = _StubFigure(placeholder)
        self.ranks_fig = _StubFigure(placeholder)  # a run split over devices by expert (shown only for one)
        self._ranks_box = W.Box([self.ranks_fig], layout=W.Layout(display="none"))
        self.norm_fig = _StubFigure(placeholder)
        self.memory_fig = _StubFigure(placeholder)
        self.cost_fig = _StubFigure(placeholder)
        self.roofline_fig = _StubFigure(F.roofline_figure(None))
        self.break_even_button = W.Button(
            description="Measure break-even here", disabled=not has_model, layout=W.Layout(width="220px"),
            tooltip="time this model's AR step and block forward on this machine: how many tokens per forward "
                    "beat autoregressive decoding")
        self.break_even = W.HTML(value=self.state.break_even_html() if has_model else "")
        self.compare_fig = _StubFigure(go.Figure(layout={
            "title": {"text": "no previous run yet", "x": 0.01}, "height": 120, "template": "plotly_white",
            "xaxis": {"visible": False}, "yaxis": {"visible": False}}))  # a message, not an empty chart

        # callbacks: registered exactly once, here
        self.step_slider.observe(self._on_step, names="value")
        self.speed.observe(self._on_speed, names="value")
        self.threshold.observe(self._on_setting, names="value")
        self.block_size.observe(self._on_setting, names="value")
        self.decode_button.on_click(lambda _b: self.start_decode())
        self.stop_button.on_click(lambda _b: self.stop())
        self.break_even_button.on_click(lambda _b: self.measure_break_even())

        self.branching = BranchWidgets(self)
        controls = W.HBox([self.play, self.step_slider, self.speed])
        settings = W.HBox([self.threshold, self.block_size, self.decode_button, self.stop_button])
        tabs = W.Tab(children=[
            W.VBox([self.cum_fig, self.tpf_fig]),
            W.VBox([self.expert_fig, self._ranks_box, self.expert_load_fig, self.norm_fig, self.memory_fig]),
            W.VBox([W.HBox([self.break_even_button, self.break_even]), self.cost_fig, self.roofline_fig]),
            W.VBox([self.branching.list_panel, self.compare_fig, self.compare]),
        ])
        for i, title in enumerate(("tokens vs forwards", "model internals", "cost", "compare runs · branches")):
            tabs.set_title(i, title)
        self._layout = W.VBox([
            W.VBox([self.prompt_box, settings]) if has_model else W.HTML(""),
            controls,
            self.status,
            self.summary,
            self.block_fig,
            self.branching.slot_panel,
            self.conf_fig,
            self.text,
            tabs,
        ])
        self._widgets = [self.play, self.step_slider, self.speed, self.threshold, self.block_size, self.prompt_box,
                         self.decode_button, self.stop_button, self.status, self.summary, self.text, self.compare,
                         *self.figures.values(),
                         self.break_even_button, self.break_even, self.break_even_button.layout,
                         controls, settings, tabs, *tabs.children, self._layout, *self.branching.widgets]
        if self.trace is not None and len(self.trace):
            self._set_trace(self.trace, n - 1)

    def show(self) -> Any:
        """The widget tree (the same object on every call; display it or leave it as a cell's last line)."""
        return self._layout

    def _ipython_display_(self) -> None:  # `ex` alone in a cell shows the explorer
        from IPython.display import display

        display(self._layout)

    def close(self) -> None:
        """Stop a running decode and close every widget this Explorer made (their layouts and styles
        too), ending their comms; the Explorer is unusable afterwards. Idempotent.

        Re-running a notebook cell closes the Explorers its previous run made (JupyterLab and
        Notebook 7 send the cell's id); elsewhere, call ``ex.close()`` before replacing ``ex``.
        """
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self.state.stop()
        self.state.close()
        self.state.param.unwatch(self._watcher)
        if self._pump is not None:
            self._pump.join(5.0)
        seen: set[int] = set()
        todo = [*self._created, *self._widgets, self._link]
        while todo:
            w = todo.pop()
            if id(w) in seen:
                continue
            seen.add(id(w))
            for name in ("layout", "style"):  # a widget's Layout/Style are widgets of their own
                sub = getattr(w, name, None)
                if sub is not None and hasattr(sub, "close") and hasattr(sub, "comm"):
                    todo.append(sub)
            todo.extend(c for c in (getattr(w, "children", None) or ()) if hasattr(c, "close"))
            w.close()

    @property
    def figures(self) -> dict[str, go.FigureWidget]:
        """The figure widgets by name (the same objects for the Explorer's life)."""
        return {
            "block": self.block_fig, "confidence": self.conf_fig, "cumulative": self.cum_fig,
            "tokens_per_forward": self.tpf_fig, "expert_union": self.expert_fig, "expert_load": self.expert_load_fig,
            "state_norm": self.norm_fig, "memory_share": self.memory_fig, "cost": self.cost_fig, "roofline": self.roofline_fig,
            "compare": self.compare_fig, "expert_parallel": self.ranks_fig,
        }

    # ------------------------------------------------------------------ drawing
    def _set_trace(self, trace: Any, step: int | None = None) -> None:
        """Show a (new or grown) trace: redraw the whole-trace figures, then the step."""
        n = len(trace)
        if n == 0:
            return
        step = n - 1 if step is None else step
        F.refresh_figure(self.block_fig, F.block_figure(trace, step))
        self.branching.attach_click()
        self._block = None
        self._redraw_whole_trace()
        self._set_slider_range(n, step)
        self.show_step(step)
        self.branching.refresh()
        self._show_summary(trace)

    def frontier(self, thresholds: Any = DEFAULT_THRESHOLDS, block_sizes: Any = DEFAULT_BLOCK_SIZES,
                 timeout: float = 600.0) -> Any:
        """Measure the frontier of the session's prompt (the last decoded) at the current setting and return its
        figure: tokens per forward against agreement with the careful decode, the Pareto front and this setting
        marked (`ExplorerState.measure_frontier`, `clover_viz.figures.frontier_figure`; the points stay in
        ``ex.state.frontier``, and ``ex.state.load_frontier_point(i)`` shows one's run). Blocks until measured.

        Raises:
            ValueError: a replayed trace (no model to decode with), or the frontier could not start (the reason).
            TimeoutError: not measured within ``timeout`` seconds (it is cancelled; the points so far stay).
        """
        s = self.state
        if s is None or self.config is None:
            raise ValueError("no model to decode with: a replayed trace has no frontier to measure; open a model")
        if not s.measure_frontier(thresholds, block_sizes):
            raise ValueError(s.error)
        if not s.wait_frontier(timeout):
            s.cancel_frontier()
            raise TimeoutError(f"the frontier was not measured in {timeout:g} s ({s.frontier_status})")
        return F.frontier_figure(s.frontier)

    def _show_summary(self, trace: Any) -> None:
        """The number cards of ``trace`` against the previous run, as the app shows them."""
        prev = self.state.previous
        self.summary.value = summary_cards_html(run_stats(trace), run_stats(prev) if prev is not trace else None)

    def show_branch(self, node: int) -> Any:
        """Show branch ``node`` of the session's tree (`ExplorerState.show_branch`: its parent becomes the
        previous run, so the comparison is the branch against the run it came from). Returns its trace,
        or None with the reason in the status line."""
        with self._lock:
            if not self.state.show_branch(node):
                self._show_error(self.state.error)
                return None
            self._set_trace(self.state.trace)
            self._show_comparison()
            self.status.value = html.escape(self.state.status)
            return self.state.trace

    def measure_break_even(self) -> Any:
        """Measure, on this machine, the tokens per forward block decoding of this model needs to
        match its autoregressive decoding at the shown run's block_size
        (`ExplorerState.measure_break_even`); shows and returns the `clover_engine.cost.BreakEven`
        (None, with the reason in the status line, while a decode runs or without a model)."""
        p = self.state.measure_break_even()
        if p is None and self.state.error:
            self.status.value = f"<span style='color:#b91c1c'>{html.escape(self.state.error)}</span>"
        self.break_even.value = self.state.break_even_html()
        return p

    def _redraw_whole_trace(self) -> None:
        t = self.trace
        if not self.break_even_button.disabled:  # a model to time (not a replay)
            self.break_even.value = self.state.break_even_html()
        F.refresh_figure(self.tpf_fig, F.tokens_per_forward_figure(t))
        F.refresh_figure(self.expert_fig, F.expert_union_figure(t))
        F.refresh_figure(self.expert_load_fig, F.expert_load_figure(t))
        F.refresh_figure(self.ranks_fig, F.expert_parallel_figure(t))
        self._ranks_box.layout.display = "" if F.expert_parallel(t) else "none"
        F.refresh_figure(self.norm_fig, F.state_norm_figure(t))
        F.refresh_figure(self.memory_fig, F.memory_share_figure(t))
        cum = F.cumulative_tokens_figure(t)
        cum.add_vline(x=len(t), line=dict(color="#dc2626", width=1.5), name="cursor")
        F.refresh_figure(self.cum_fig, cum)
        try:
            F.refresh_figure(self.cost_fig, F.cost_figure(t))
            F.refresh_figure(self.roofline_fig, F.roofline_figure(t))
        except (ValueError, TypeError) as exc:  # a trace without a known config still replays
            self.status.value = f"<i>cost panel unavailable: {exc}</i>"

    def _set_slider_range(self, n: int, value: int) -> None:
        """Move the slider to 0-based step ``value`` of ``n`` without drawing (the caller draws once)."""
        self._quiet = True
        try:
            self.step_slider.max = max(n, 1)
            self.play.max = max(n, 1)
            self.step_slider.value = value + 1
        finally:
            self._quiet = False

    def show_step(self, step: int) -> None:
        """Draw the state after global step ``step`` (mutates the figure widgets in place)."""
        t = self.trace
        if t is None or len(t) == 0:
            return
        step = F._resolve_step(t, step)
        self._step = step
        F.update_block_figure(self.block_fig, t, step)
        block = int(t.step(step).block_index)
        rows = F._index(t).steps_of[block]
        key = (block, len(rows))  # a new block, or a block still growing while decoding
        if self._conf_trace is not t:  # a new run (its threshold sets the colour scale): rebuild once
            F.refresh_figure(self.conf_fig, F.confidence_heatmap(t, block, step=step))
            self._conf_trace, self._block = t, key
        elif key != self._block:
            F.update_confidence_heatmap(self.conf_fig, t, block, step=step)
            self._block = key
        else:
            r = rows.index(step)
            with self.conf_fig.batch_update():
                self.conf_fig.layout.shapes[0].update(y0=r - 0.5, y1=r + 0.5, visible=True)
        self.text.value = F.text_html(t, step)
        if self.cum_fig.layout.shapes:
            with self.cum_fig.batch_update():
                self.cum_fig.layout.shapes[-1].update(x0=step + 1, x1=step + 1)

    # ------------------------------------------------------------------ callbacks
    def _show_error(self, exc: BaseException | str) -> None:
        """Put an error in the status line (a widget callback's exception only reaches the log console).

        A ValueError (a setting or an input refused, with its reason) shows its message alone; any
        other exception is named by its type. `decode` raises the same text again: it must not
        prefix it a second time ("ValueError: ValueError: ...")."""
        msg = (exc if isinstance(exc, str) else str(exc) if isinstance(exc, ValueError)
               else f"{type(exc).__name__}: {exc}")
        self._last_error = msg
        self.status.value = f'<span style="color:#b91c1c"><b>error:</b> {html.escape(msg)}</span>'

    def _on_step(self, change: dict) -> None:
        if self._quiet:
            return
        try:
            with self._lock:
                step = int(change["new"]) - 1  # the slider counts from 1
                self.state.seek(step)
                self.show_step(step)
        except Exception as exc:  # noqa: BLE001  (shown in the widget, not lost in the log console)
            self._show_error(exc)

    def _on_speed(self, change: dict) -> None:
        self.play.interval = int(1000 / max(int(change["new"]), 1))

    def _on_setting(self, change: dict) -> None:
        if self.config is None or self._quiet:
            return
        self.start_decode()  # a running decode is replaced by the new one

    def _show_config(self, dc: Any) -> None:
        """Make the threshold and block_size widgets show ``dc`` (a `DecodeConfig`) without re-decoding:
        a block_size outside the dropdown's choices is added to them, a threshold below the slider's
        range widens it (the readout shows as many decimals as the value needs)."""
        quiet, self._quiet = self._quiet, True
        try:
            bs, read = controls_of(dc)  # an official sampler's own parameters; None: no threshold is read
            thr = float(self.threshold.value) if read is None else read
            options = _block_size_options(bs)
            if list(self.block_size.options) != options:
                self.block_size.options = options  # resets the value: set it again below
            self.block_size.value = bs
            self.threshold.min = min(THRESHOLD_MIN, thr)
            self.threshold.readout_format = _threshold_format(thr)
            self.threshold.value = thr
            # verify writes what the base would write, LLaDA / Dream follow their schedule: no threshold is read
            self.threshold.disabled = self.config is None or read is None
            # Dream decodes one canvas of max new tokens: no block size is read
            self.block_size.disabled = self.config is None or getattr(dc, "sampler", None) in BLOCK_SIZE_UNUSED
        finally:
            self._quiet = quiet




__all__ = ["BLOCK_SIZES", "DEFAULT_PROMPT", "Explorer"]
