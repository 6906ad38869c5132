"""Panel views of an `ExplorerState`: thin `pn.viewable.Viewer`s over the figures.

Each view holds its widgets / panes, watches the state parameters it shows,
and redraws with the pure functions of `clover_viz.figures`. No view computes
anything the trace does not hold; no view touches the model (the state does,
through the decoder).

* `SettingsPanel`  -- the sidebar: model, prompt + examples, decoding settings,
  Generate / Stop, open / save a trace.
* `RunSummary`     -- status line, progress bar, errors, NFE / tokens / forced /
  tokens per forward / tokens/s of the run on display.
* `PlaybackBar`    -- play / pause, step back / forward, speed, scrub over all steps.
* `BlockView`      -- the current block filling in (mutated in place, not rebuilt).
* `TextView`       -- the text so far, tokens coloured by confidence.
* `CompareView`    -- previous run vs this run: `figures.compare_table` and the text diff.
* `CostView`       -- bytes per forward, measured vs projected tokens/s, roofline.
* `FigureTabs`     -- confidence heatmap, per-forward charts, experts / state / memory,
  cost; only the visible tab is redrawn, and at most every
  `LIVE_REDRAW_S` seconds while a decode streams in.
* `ExplorerApp`    -- all of the above; ``.sidebar`` / ``.main`` for a template,
  or displayed as one component in a notebook.

Tests: ``.venv/bin/python -m pytest tests/apps -q``
"""

from __future__ import annotations

import html
import pickle
import time
from pathlib import Path
from typing import Any

import panel as pn
import param
from panel.widgets.slider import _SliderBase

from clover_viz import figures as F
from clover_viz.models import bundled_models
from clover_viz.runs import RUN_LABELS, diff_caption, run_stats
from clover_viz.state import ExplorerState
from engine.units import format_si

LIVE_REDRAW_S = 5.0  # heavy charts (a Plotly render of 150-500 ms in the browser) redraw at most this often while a decode streams in
# The block view and the text redraw at most this often while a decode streams in: each redraw
# costs the browser a Plotly render (~100-200 ms in a software-rendered Chromium on a busy
# machine); at every tick it fell behind and a click on Stop waited seconds in its queue.
LIVE_VIEW_S = 0.5
MONO = "JetBrains Mono, Menlo, Consolas, monospace"
MAX_PROMPT_CHARS = 2_000_000  # the prompt box's limit: > 30x the largest bundled context (see SettingsPanel)


def _placeholder(title: str, message: str) -> Any:
    """An empty figure with a message (before the first run)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.update_layout(title=dict(text=title, x=0.01, font=dict(size=14)), height=260, template="plotly_white",
                      margin=dict(l=30, r=20, t=50, b=30))
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color="#64748b"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


class FigureSnapshot:
    """A copy of a plotly figure's ``data`` and ``layout`` (plain lists / dicts) for `FigurePane`.

    Not a dict on purpose: param compares a new dict value with the old one key by key
    before it notifies anyone, which for a heatmap with hover text costs more than drawing.
    """

    __slots__ = ("data", "layout")

    def __init__(self, data: list, layout: dict) -> None:
        self.data, self.layout = data, layout

    @classmethod
    def of(cls, fig: Any, data: list | None = None) -> "FigureSnapshot":
        """Copy ``fig`` (``data`` given: reuse that copy of the traces, copy only the layout)."""
        raw_data, raw_layout = getattr(fig, "_data", None), getattr(fig, "_layout", None)
        if raw_data is None or raw_layout is None:  # not a plotly BaseFigure: its public dict
            d = fig.to_dict()
            return cls(d["data"], d["layout"])
        if data is None:
            return cls(*pickle.loads(pickle.dumps((raw_data, raw_layout), protocol=pickle.HIGHEST_PROTOCOL)))
        return cls(data, pickle.loads(pickle.dumps(raw_layout, protocol=pickle.HIGHEST_PROTOCOL)))

    def to_dict(self) -> dict[str, Any]:
        return {"data": self.data, "layout": self.layout}

    def updated(self, traces: dict[int, dict[str, Any]], layout: dict[str, Any]) -> "FigureSnapshot":
        """A new snapshot: these trace and layout properties merged in as ``fig.update`` /
        ``fig.update_layout`` would (dicts merge, ``None`` unsets, ``title_text`` is
        ``title.text``), without plotly validating them again -- the payload functions of
        `clover_viz.figures` make values plotly accepts unchanged (tests compare with the
        figure built fresh). Untouched traces are shared with this snapshot.
        """
        data = list(self.data)
        for i, props in traces.items():
            data[i] = _merge(dict(data[i]), props)
        return FigureSnapshot(data, _merge(dict(self.layout), layout))

    def trace_index(self, name: str) -> int:
        return next(i for i, t in enumerate(self.data) if t.get("name") == name)


def _merge(dst: dict[str, Any], src: dict[str, Any]) -> dict[str, Any]:
    for key, value in src.items():
        if key.endswith("_text") and "_" not in key[:-5]:  # plotly's magic underscore: title_text
            key, value = key[:-5], {"text": value}
        if value is None:
            dst.pop(key, None)
        elif isinstance(value, dict) and isinstance(dst.get(key), dict):
            dst[key] = _merge(dict(dst[key]), value)
        else:
            dst[key] = value
    return dst


class FigurePane(pn.pane.Plotly):
    """A Plotly pane that only sends: Python -> browser, never back into a Python figure.

    Panel's Plotly pane links a ``go.Figure`` it is given: in-place changes go to the
    browser as restyle / relayout messages, and the browser's own ``restyle_data`` /
    ``relayout_data`` are written back into whatever figure the pane holds *then* --
    a figure Python may have replaced or updated since ("Trace index 0 out of range",
    and a block view frozen on an earlier step). Here every figure given to `show` is
    copied into a `FigureSnapshot`; the pane holds only that copy, Panel diffs it against
    what the browser has and sends the difference, and browser events update the pane's
    event parameters only. Call `show` again after changing a figure.
    """

    def __init__(self, object: Any = None, **params: Any) -> None:
        params["link_figure"] = False
        super().__init__(self._snapshot(object), **params)

    @staticmethod
    def _snapshot(obj: Any) -> Any:
        return FigureSnapshot.of(obj) if hasattr(obj, "to_plotly_json") else obj

    def show(self, fig: Any, layout_only: bool = False) -> None:
        """Display ``fig`` (a plotly figure, copied now; later changes need another `show`).

        ``layout_only``: only the layout changed since the last `show` of this figure (a
        cursor moved): the traces already copied are reused.
        """
        old = self.object
        if layout_only and isinstance(old, FigureSnapshot):
            self.object = FigureSnapshot.of(fig, data=old.data)
        else:
            self.object = self._snapshot(fig)

    @classmethod
    def applies(cls, object: Any) -> float | bool | None:
        return isinstance(object, FigureSnapshot) or super().applies(object)

    def _to_figure(self, obj: Any) -> Any:
        if isinstance(obj, FigureSnapshot):
            return obj  # made by plotly: no second validation
        snap = self._snapshot(obj)
        return snap if isinstance(snap, FigureSnapshot) else super()._to_figure(obj)

    @classmethod
    def _plotly_json_wrapper(cls, fig: Any) -> dict[str, Any]:
        if isinstance(fig, FigureSnapshot):
            return {"data": [dict(t) for t in fig.data], "layout": dict(fig.layout)}
        return super()._plotly_json_wrapper(fig)

    def _update_figure_style(self) -> None:  # the browser's restyle_data: never written into a figure
        return None

    def _update_figure_layout(self) -> None:  # the browser's relayout_data: likewise
        return None


# ----------------------------------------------------------------------------- controls
# Every slider of the app, keyboard: bokeh draws a slider with noUiSlider and hands it a new
# ``start`` / ``end`` through noUiSlider's ``updateOptions``, which moves the handles and the
# arrow / PageUp / PageDown keys onto the new range -- but noUiSlider's Home / End keys read the
# range the slider was created with (its ``options.spectrum``, which ``updateOptions`` leaves
# alone): after a 27-step run, End on the playback slider (created 1..2) went to "step: 2 of 27".
# This callback runs in the browser whenever the range changes, and gives each view of the slider
# a Home / End handler (capture phase, before noUiSlider's own) that reads the model's current
# range and sets the value as a release of the handle would (``value`` and ``value_throttled``).
_KEYS_WITHIN_RANGE_JS = """
const views = [...window.Bokeh.index.find(cb_obj)];
for (const view of views) {
  const el = view.slider_el;
  if (el == null || el.__clover_keys_within_range) { continue; }
  el.__clover_keys_within_range = true;
  el.addEventListener("keydown", (ev) => {
    if ((ev.key !== "Home" && ev.key !== "End") || view.model.disabled) { return; }
    const handle = ev.target.closest ? ev.target.closest("[data-handle]") : null;
    if (handle == null || view._noUiSlider == null) { return; }
    ev.preventDefault();
    ev.stopPropagation();
    const range = view._calc_to().range;
    const now = view._noUiSlider.get(true);
    const values = (Array.isArray(now) ? now : [now]).map(Number);
    values[Number(handle.getAttribute("data-handle")) || 0] = ev.key === "Home" ? range.min : range.max;
    view._change(values);
  }, true);
}
"""
_KEYS_MARK = "_clover_keys_within_range"
_PICK_MARK = "_clover_clears_after_pick"


def keys_within_range(slider: Any) -> Any:
    """Make ``slider`` (a Panel slider drawn by bokeh: `IntSlider`, `FloatSlider`, ...) answer
    Home / End within its *current* ``start`` / ``end`` after they change; returns ``slider``.

    Without it the keys jump to the range the slider had when the page drew it (noUiSlider keeps
    that for Home / End). Arrows and PageUp / PageDown already follow the new range. Applying it
    twice is harmless. A `DiscreteSlider` needs none: it builds a new slider when its options change.

    Raises:
        TypeError: for a widget that is not a bokeh-drawn slider with ``start`` / ``end``.
    """
    if isinstance(slider, pn.widgets.CompositeWidget) or not all(
            name in slider.param for name in ("start", "end", "value")):
        raise TypeError(f"keys_within_range takes a slider with start / end (IntSlider, FloatSlider, ...); "
                        f"got {type(slider).__name__}")
    if not getattr(slider, _KEYS_MARK, False):
        slider.jscallback(start=_KEYS_WITHIN_RANGE_JS, end=_KEYS_WITHIN_RANGE_JS)
        setattr(slider, _KEYS_MARK, True)
    return slider


def has_keys_within_range(slider: Any) -> bool:
    """Whether `keys_within_range` was applied to ``slider``."""
    return bool(getattr(slider, _KEYS_MARK, False))


def clear_after_pick(file_input: pn.widgets.FileInput, on_pick: Any) -> pn.widgets.FileInput:
    """Call ``on_pick(content: bytes, filename: str)`` each time the user picks a file in
    ``file_input``, then clear the input (loaded or refused, even if ``on_pick`` raised); returns
    ``file_input``.

    A browser's ``<input type=file>`` fires no change when the file it holds is picked again, and
    the widget's ``value`` would not change for the same bytes either: without the clearing, a
    second pick of the same file (say after a Generate replaced what it loaded) did nothing while
    the box still named the file. Whatever was loaded is for the page to name, not the file box.
    """
    def picked(event: Any) -> None:
        if not event.new:  # the clearing below, or the browser's echo of it
            return
        name = file_input.filename or ""
        try:
            on_pick(event.new, name if isinstance(name, str) else ", ".join(name))
        finally:
            file_input.clear()  # the browser's box: empty, so the same file is a change again
            file_input.param.update(value=None, filename=None, mime_type=None)  # and this side's value

    file_input.param.watch(picked, "value")
    setattr(file_input, _PICK_MARK, True)
    return file_input


def clears_after_pick(file_input: Any) -> bool:
    """Whether ``file_input`` was set up with `clear_after_pick`."""
    return bool(getattr(file_input, _PICK_MARK, False))


# ----------------------------------------------------------------------------- sidebar
class _SaveButton(pn.widgets.FileDownload):
    """FileDownload whose callback may return None: nothing is sent (the callback said why)."""

    def _sync_data(self, fileobj: Any) -> None:
        if fileobj is None:
            return
        super()._sync_data(fileobj)


class SettingsPanel(pn.viewable.Viewer):
    """Sidebar controls. Sliders set the state on release (``value_throttled``)."""

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        s = self.state
        self.model_dir = pn.widgets.TextInput.from_param(s.param.model_dir, label="Model directory")
        # the bundled models one click away (the text field takes any other directory)
        self.bundled = pn.widgets.RadioButtonGroup(
            label="Bundled models", options=bundled_models(), value=None, color="primary", variant="outline",
            sizing_mode="stretch_width")  # the loaded one filled: "light" drew it grey, like a disabled button
        self._sync_bundled()
        self.bundled.param.watch(self._on_bundled, "value")
        s.param.watch(lambda _e: self._sync_bundled(), "model_dir")
        self.model_label = pn.pane.Markdown(sizing_mode="stretch_width", margin=(0, 10), styles={"font-size": "12px"})
        self.dev = pn.widgets.Checkbox.from_param(
            s.param.dev_sharpen_random, label="dev: sharpen random model (weights x15)")
        self.example = pn.widgets.Select.from_param(s.param.example, label="Example prompt")
        # max_length: Panel's default (5,000 characters) cut longer prompts silently in the browser. The
        # limit here is far above any bundled model's context (65,536 tokens for clover-tiny, whose
        # tokens are bytes; 8,192 for SmolLM2), so the model's own check refuses an over-long prompt
        # with the numbers, and nothing a user types within a context is dropped.
        self.prompt = pn.widgets.TextAreaInput.from_param(
            s.param.prompt, label="Prompt", height=170, sizing_mode="stretch_width",
            styles={"font-family": MONO}, max_length=MAX_PROMPT_CHARS)
        self.threshold = pn.widgets.FloatSlider.from_param(
            s.param.threshold, label="Threshold", step=0.01, throttled=True, sizing_mode="stretch_width",
            format="0.00")  # "1.00", not "1" 
        self.block_size = pn.widgets.DiscreteSlider.from_param(
            s.param.block_size, label="Block size", throttled=True, sizing_mode="stretch_width")
        self.policy = pn.widgets.Select.from_param(s.param.policy, label="Policy")
        self.memory_mode = pn.widgets.RadioButtonGroup.from_param(
            s.param.memory_mode, label="Memory", color="primary", variant="outline", sizing_mode="stretch_width")
        self.memory_note = pn.pane.Markdown("", margin=(0, 10), styles={"font-size": "11px", "color": "#64748b"})
        # Not bound to the parameter's bounds: the browser would clamp or revert an out-of-range
        # number silently; the state refuses it and says the valid range instead.
        lo, hi = s.param.max_new_tokens.bounds
        self.max_new_tokens = pn.widgets.IntInput(label=f"Max new tokens ({lo}-{hi})", value=s.max_new_tokens,
                                                  step=16)
        self.max_new_tokens.param.watch(self._on_max_new_tokens, "value")
        s.param.watch(lambda e: setattr(self.max_new_tokens, "value", e.new), "max_new_tokens")
        self.repetition = pn.widgets.Checkbox.from_param(s.param.repetition_control, label="Repetition control")
        self.repetition_penalty = pn.widgets.FloatInput.from_param(
            s.param.repetition_penalty, label="penalty (logit)", step=0.5, width=120)
        self.eos = pn.widgets.Checkbox.from_param(s.param.eos_bias, label="Progressive EOS bias")
        self.eos_limit = pn.widgets.IntInput.from_param(s.param.eos_soft_limit, label="soft limit (tokens)", width=120)
        # Text labels, no icons: icon fonts come from a CDN, which an offline machine cannot reach.
        self.generate = pn.widgets.Button(label="Generate", color="primary", sizing_mode="stretch_width")
        self.stop = pn.widgets.Button(label="Stop", color="danger", disabled=True, sizing_mode="stretch_width")
        self.open = pn.widgets.FileInput(accept=".parquet,.pq,.arrow,.feather", multiple=False,
                                         sizing_mode="stretch_width")
        self.save = _SaveButton(callback=self._save, filename="clover-trace.parquet",
                                label="Save trace (.parquet)", color="default", disabled=True,
                                sizing_mode="stretch_width", embed=False)
        self.generate.on_click(lambda _e: s.generate())
        self.stop.on_click(lambda _e: s.stop())
        clear_after_pick(self.open, self._open)  # every pick loads, the same file again too
        s.param.watch(self._sync, ["running", "model_label", "model_ok", "window_available", "memory_advice", "trace",
                                   "n_steps"])
        self._sync()

    def _save(self) -> Any:
        try:
            return self.state.trace_bytes()
        except ValueError as exc:
            self.state.error = f"Nothing saved: {exc}"
            return None

    def _on_max_new_tokens(self, event: Any) -> None:
        if event.new != self.state.max_new_tokens and not self.state.set_max_new_tokens(event.new):
            self.max_new_tokens.value = self.state.max_new_tokens  # shown again, with the error saying why

    def _open(self, content: bytes, filename: str) -> None:
        self.state.load_trace(content, name=filename)

    def _sync(self, *_: Any) -> None:
        s = self.state
        self.stop.disabled = not s.running
        self.save.disabled = s.trace is None or len(s.trace) == 0
        self.generate.label = "Generate (restart)" if s.running else "Generate"
        label = s.model_label or "(not loaded yet)"
        warn = " ⚠" if "random" in label else ""
        self.model_label.object = f"**Model:** {html.escape(label)}{warn}"
        self.memory_mode.disabled = not (s.window_available and s.model_ok)
        self.memory_note.object = (
            "no model loaded" if not s.model_ok else
            "`state+window`: the last W tokens' K/V beside the state; `state` is Clover's own. "
            + (s.memory_advice or "") if s.window_available else
            f"only `state` runs: {s.memory_advice or 'this model has no attention window'}")

    def _bundled_name(self) -> str:
        return Path((self.state.model_dir or "").rstrip("/")).name

    def _on_bundled(self, event: Any) -> None:
        if event.new and self._bundled_name() != event.new:
            self.state.model_dir = f"models/{event.new}"

    def _sync_bundled(self) -> None:
        name = self._bundled_name()
        self.bundled.value = name if name in self.bundled.options else None

    def __panel__(self) -> Any:
        return pn.Column(
            self.model_dir, self.bundled, self.model_label, self.dev,
            self.example, self.prompt,
            pn.Row(self.generate, self.stop, sizing_mode="stretch_width"),
            pn.pane.Markdown("#### Decoding", margin=(10, 10, 0, 10)),
            self.threshold, self.block_size, self.policy,
            pn.pane.Markdown("Memory mode", margin=(4, 10, 0, 10)), self.memory_mode, self.memory_note,
            self.max_new_tokens,
            pn.Row(self.repetition, self.repetition_penalty),
            pn.Row(self.eos, self.eos_limit),
            pn.pane.Markdown("#### Traces", margin=(10, 10, 0, 10)),
            pn.pane.Markdown("Open a saved trace to replay it without the model:", margin=(0, 10),
                             styles={"font-size": "12px"}),
            self.open, self.save,
            sizing_mode="stretch_width",
        )


# ----------------------------------------------------------------------------- summary / playback
class RunSummary(pn.viewable.Viewer):
    """Status line, progress, errors and the headline numbers of the run on display.

    The numbers sit in elements with stable class names (``clover-nfe`` ...) so
    browser tests can read them.
    """

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.error = pn.pane.Alert("", alert_type="danger", visible=False, sizing_mode="stretch_width",
                                   margin=(0, 10))
        self.progress = pn.indicators.Progress(value=0, max=100, visible=False, bar_color="primary",
                                               sizing_mode="stretch_width", height=14, margin=(0, 10))
        self.numbers = pn.pane.HTML("", sizing_mode="stretch_width", margin=(0, 10))
        self._last_error = ""
        s = self.state
        s.param.watch(self._on_error, "error")
        s.param.watch(self._refresh, ["trace", "trace_version", "running", "progress", "status", "previous",
                                      "loading"])
        self._refresh()

    def _on_error(self, event: Any) -> None:
        msg = event.new
        self.error.object = html.escape(msg)
        self.error.visible = bool(msg)
        if msg and msg != self._last_error and pn.state.notifications is not None:
            pn.state.notifications.error(msg[:300], duration=6000)
        self._last_error = msg

    def _refresh(self, *_: Any) -> None:
        s = self.state
        self.progress.visible = s.running or s.loading
        # a model loading: indeterminate (-1, animated) -- its length is not known; a decode: tokens / budget
        self.progress.value = s.progress if s.running else -1
        self.progress.active = s.loading and not s.running
        st = run_stats(s.trace)
        prev = run_stats(s.previous)

        def cell(label: str, value: str, cls: str, was: str | None = None) -> str:
            sub = f'<div class="was">prev {was}</div>' if was is not None else ""
            return (f'<div class="stat"><div class="lbl">{label}</div>'
                    f'<div class="val {cls}">{value}</div>{sub}</div>')

        if st is None:
            cells = '<div class="stat"><div class="lbl">no run yet</div><div class="val">press Generate</div></div>'
        else:
            p = prev or {}
            has = prev is not None
            cells = "".join([
                cell("NFE (forwards)", str(st["nfe"]), "clover-nfe", str(p.get("nfe")) if has else None),
                cell("tokens", str(st["n_tokens"]), "clover-tokens", str(p.get("n_tokens")) if has else None),
                cell("tokens / forward", f"{st['tokens_per_forward']:.2f}", "clover-tpf",
                     f"{p.get('tokens_per_forward', 0):.2f}" if has else None),
                cell("forced fills", str(st["n_forced"]), "clover-forced", str(p.get("n_forced")) if has else None),
                cell(f"tokens/s (measured on {html.escape(st.get('device') or 'this machine')}: tokens ÷ "
                     "whole decode time)",
                     format_si(st["tokens_per_s"], digits=3), "clover-tps",
                     format_si(p.get("tokens_per_s"), digits=3) if has else None),
                cell("block · threshold", f"{st['block_size']} · {st['threshold']:.2f}"
                     if st["threshold"] is not None else str(st["block_size"]), "clover-settings",
                     (f"{p.get('block_size')} · {p.get('threshold'):.2f}" if has and p.get("threshold") is not None
                      else None)),
            ])
        status = html.escape(s.status or "ready")
        running = (' data-running="1"' if s.running else ' data-running="0"') + f' data-loading="{int(s.loading)}"'
        self.numbers.object = (
            "<style>.clover-stats{display:flex;flex-wrap:wrap;gap:8px;font-family:Inter,Helvetica,Arial,sans-serif}"
            ".clover-stats .stat{background:#f8fafc;border:1px solid #e2e8f0;border-radius:6px;padding:4px 10px;"
            "min-width:92px}.clover-stats .lbl{font-size:11px;color:#64748b}.clover-stats .val{font-size:20px;"
            "font-weight:600;color:#0f172a}.clover-stats .was{font-size:11px;color:#94a3b8}"
            ".clover-status{font-size:13px;color:#334155;margin:2px 0 6px 0}</style>"
            f'<div class="clover-status"{running}>{status}</div><div class="clover-stats">{cells}</div>'
        )

    def __panel__(self) -> Any:
        return pn.Column(self.error, self.numbers, self.progress, sizing_mode="stretch_width")


def scrub_label(position: int, n_steps: int) -> str:
    """The playback slider's label: ``"step: k of n"`` (1-based), ``"step: no run yet"`` for none."""
    if n_steps < 1:
        return "step: no run yet"
    return f"step: {min(position, n_steps - 1) + 1} of {n_steps}"


class PlaybackBar(pn.viewable.Viewer):
    """Play / pause, step back / forward, speed and a scrub slider over every step of the run."""

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        s = self.state
        b = dict(color="default", margin=(5, 2))
        self.first = pn.widgets.Button(label="|◀", description="first step", width=48, **b)
        self.back = pn.widgets.Button(label="◀ step", description="step back", width=70, **b)
        self.play = pn.widgets.Button(label="▶ play", description="play / pause", width=84, **b)
        self.forward = pn.widgets.Button(label="step ▶", description="step forward", width=70, **b)
        self.last = pn.widgets.Button(label="▶|", description="last step", width=48, **b)
        # 1-based like every other step count on the page ("step 3/40" in the block view), shown
        # as "step: k of n" above the slider. Not the slider's own title: bokeh redraws that on a
        # new value, not on a new tick formatter, so "of n" lagged a run ("14 of 13").
        self.scrub = pn.widgets.IntSlider(name="", start=1, end=2, value=1, disabled=True, show_value=False,
                                          sizing_mode="stretch_width", margin=(0, 15, 5, 15))
        keys_within_range(self.scrub)  # its end is the run's step count: Home / End must follow
        self.scrub_text = pn.pane.HTML(scrub_label(0, 0), margin=(0, 15), css_classes=["clover-scrub-label"])
        self.speed = pn.widgets.FloatSlider.from_param(s.param.speed, label="speed (steps/s)", width=170)
        self.first.on_click(lambda _e: s.seek(0) or s.pause())
        self.back.on_click(lambda _e: s.step(-1))
        self.play.on_click(lambda _e: s.toggle_play())
        self.forward.on_click(lambda _e: s.step(1))
        self.last.on_click(lambda _e: s.seek(s.n_steps - 1) or s.pause())
        self.scrub.param.watch(lambda e: s.seek(e.new - 1), "value")
        s.param.watch(self._sync, ["position", "n_steps", "playing"])
        self._sync()

    def _sync(self, *_: Any) -> None:
        s = self.state
        n = s.n_steps
        self.scrub.disabled = n < 2
        self.scrub.end = max(n, 2)
        self.scrub.value = min(s.position + 1, self.scrub.end)
        self.scrub_text.object = scrub_label(s.position, n)
        self.play.label = "▮▮ pause" if s.playing else "▶ play"  # geometric shapes: in every font

    def __panel__(self) -> Any:
        return pn.Row(self.first, self.back, self.play, self.forward, self.last,
                      pn.Column(self.scrub_text, self.scrub, sizing_mode="stretch_width"), self.speed,
                      sizing_mode="stretch_width", align="center")


# ----------------------------------------------------------------------------- live views
class BlockView(pn.viewable.Viewer):
    """The current block at the playback position.

    The plotly figure is built once per run and updated in place on the Python side
    (`figures.update_block_figure`); the pane (a `FigurePane`) is handed a snapshot of
    it, so what the browser shows always equals ``figures.block_figure(trace, position)``.
    """

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.pane = FigurePane(_placeholder("Block view", "press Generate to decode a prompt"),
                               sizing_mode="stretch_width", config={"displayModeBar": False})
        self._fig = None
        self._trace: Any = None
        self._last = 0.0
        self.state.param.watch(self._refresh, ["trace", "trace_version", "position", "running"])
        self._refresh()

    @property
    def shown_step(self) -> int | None:
        """The step the figure shows (None: a placeholder)."""
        s = self.state
        if self._fig is None or s.trace is None or len(s.trace) == 0:
            return None
        return min(s.position, len(s.trace) - 1)

    def _refresh(self, *_: Any) -> None:
        s = self.state
        if s.trace is None or len(s.trace) == 0:
            if self._fig is not None or s.trace is not None:
                msg = "waiting for the first forward..." if s.running else "press Generate to decode a prompt"
                self.pane.show(_placeholder("Block view", msg))
                self._fig = None
                self._trace = None
            return
        pos = min(s.position, len(s.trace) - 1)
        now = time.monotonic()
        if s.running and self._trace is s.trace and now - self._last < LIVE_VIEW_S:
            return  # streaming: a later tick (or the end of the run) draws
        self._last = now
        if self._fig is None or self._trace is not s.trace:
            self._fig = F.block_figure(s.trace, pos)  # validated by plotly once per run
            self._trace = s.trace
            self._base = FigureSnapshot.of(self._fig)
            self.pane.object = self._base
        else:  # the step's payload merged into that copy: no plotly validation per step
            heat, layout = F._block_payload(s.trace, pos)
            updates = {self._base.trace_index(F.BLOCK_TRACE): heat}
            # the "dropped at Stop" legend entry; rewritten / withdrawn slots (a revisable decoder's trace)
            for name, props in F.block_trace_updates(s.trace, pos).items():
                updates[self._base.trace_index(name)] = props
            self.pane.object = self._base.updated(updates, layout)

    def __panel__(self) -> Any:
        return self.pane


class TextView(pn.viewable.Viewer):
    """The text so far (prompt in grey), each generated token shaded by its confidence."""

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.pane = pn.pane.HTML("", sizing_mode="stretch_width", height=290,
                                 styles={"overflow-y": "auto", "border": "1px solid #e2e8f0",
                                         "border-radius": "6px", "padding": "6px", "background": "white"})
        self.show_prompt = pn.widgets.Checkbox(label="show prompt", value=False, margin=(0, 10))
        self.show_prompt.param.watch(self._refresh, "value")
        self._last = 0.0
        self.state.param.watch(self._refresh, ["trace", "trace_version", "position", "running"])
        self._refresh()

    def _refresh(self, *_: Any) -> None:
        s = self.state
        if s.trace is None or len(s.trace) == 0:
            self.pane.object = '<div style="color:#94a3b8">the decoded text appears here</div>'
            return
        now = time.monotonic()
        if s.running and now - self._last < LIVE_VIEW_S:
            return  # streaming: a later tick (or the end of the run) draws
        self._last = now
        pos = min(s.position, len(s.trace) - 1)
        self.pane.object = F.text_html(s.trace, pos, show_prompt=self.show_prompt.value)

    def __panel__(self) -> Any:
        return pn.Column(pn.Row(pn.pane.Markdown("**Text so far** (background = confidence; orange = forced)",
                                                 margin=(0, 10)), self.show_prompt),
                         self.pane, sizing_mode="stretch_width")


class CompareView(pn.viewable.Viewer):
    """This run beside the previous one: `figures.compare_table` of `ExplorerState.comparison`
    (the table the notebook `Explorer` shows too) and the text difference below it."""

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        # a fixed height and always shown: a pane that appears or grows later made the layout
        # draw this card over the text and the tabs below it (seen in the browser)
        empty = _placeholder("", "no previous run yet")  # the card's header names it
        empty.update_layout(height=F.COMPARE_TABLE_HEIGHT)
        self._empty = empty
        self.table = FigurePane(empty, height=F.COMPARE_TABLE_HEIGHT, sizing_mode="stretch_width",
                                config={"displayModeBar": False})
        self.pane = pn.pane.HTML("", sizing_mode="stretch_width")

    def refresh(self) -> None:
        s = self.state
        cmp = s.comparison() if s.trace is not None and len(s.trace) else None
        if cmp is None:
            self.table.show(self._empty)
            self.pane.object = ('<div style="color:#64748b">No previous run yet. Generate again, or drag threshold '
                                'or block size: the run before stays here for comparison.</div>')
            return
        table = F.compare_table(cmp["previous"], cmp["current"], labels=RUN_LABELS)
        table.update_layout(title_text="", margin_t=10)  # the card's header names it
        self.table.show(table)
        caption = diff_caption(cmp)
        self.pane.object = (
            (f"<p class='clover-diff-warning' style='font-size:13px;margin:8px 0 0;color:#b45309'><b>{caption}</b>"
             "</p>" if caption else "")
            + "<p style='font-size:13px;margin:8px 0 4px'>text difference "
            f"(<del style='background:#fee2e2'>{RUN_LABELS[0]} only</del> <ins style='background:#dcfce7;"
            f"text-decoration:none'>{RUN_LABELS[1]} only</ins>)</p>"
            "<div style='max-height:240px;overflow:auto;border:1px solid #e2e8f0;padding:6px;word-break:break-all'>"
            f"{cmp['text']['diff_html']}</div>"
        )

    def __panel__(self) -> Any:
        return pn.Column(self.table, self.pane, sizing_mode="stretch_width")


class CostView(pn.viewable.Viewer):
    """Bytes per forward as run vs projected, tokens/s measured here vs projected on a device for
    the whole run and its decode phase (`figures.cost_summary_html`), and the roofline."""

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.device = pn.widgets.Select.from_param(self.state.param.device, label="Project onto device", width=180)
        self.union = pn.widgets.Select.from_param(self.state.param.union_assumption, label="35B-A3B expert union",
                                                  width=220)
        self.headline = pn.pane.HTML("", sizing_mode="stretch_width")
        self.measure = pn.widgets.Button(label="Measure break-even here", width=220,
                                         description="Time this model's autoregressive step and block forward on "
                                                     "this machine: how many tokens per forward beat AR decoding")
        self.measure.on_click(self._measure)
        self.break_even = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["clover-break-even"])
        self.cost = FigurePane(_placeholder("Cost", "no run yet"), sizing_mode="stretch_width")
        self.roofline = FigurePane(F.roofline_figure(None, device=self.state.device),
                                       sizing_mode="stretch_width")

    def _measure(self, _event: Any = None) -> None:
        self.measure.loading = True
        try:
            self.state.measure_break_even()
        finally:
            self.measure.loading = False
        self.refresh()

    def refresh(self) -> None:
        s = self.state
        self.break_even.object = s.break_even_html()
        self.measure.disabled = bool(s.running)
        if s.trace is None or len(s.trace) == 0:
            self.headline.object = "<i>no run yet: the roofline shows the devices and the 35B-A3B AR step</i>"
            self.cost.show(_placeholder("Cost", "no run yet"))
            self.roofline.show(F.roofline_figure(None, device=s.device))
            return
        try:
            proj = s.cost_projection()
        except (ValueError, TypeError) as exc:
            proj = None
            s.error = f"No cost projection: {exc}"
        self.headline.object = F.cost_summary_html(s.trace, proj, step=min(s.position, len(s.trace) - 1))
        self.cost.show(F.cost_figure(s.trace, device=s.device, union_assumption=s.union_assumption))
        self.roofline.show(F.roofline_figure(s.trace, device=s.device, union_assumption=s.union_assumption))

    def __panel__(self) -> Any:
        return pn.Column(pn.Row(pn.Column(self.device, self.union, width=240), self.headline,
                                sizing_mode="stretch_width"),
                         pn.Row(self.measure, self.break_even, sizing_mode="stretch_width"),
                         self.cost, self.roofline, sizing_mode="stretch_width")


class FigureTabs(pn.viewable.Viewer):
    """The analysis figures in tabs; only the visible tab is redrawn (rate-limited while decoding)."""

    state = param.ClassSelector(class_=ExplorerState)

    TABS = ("Confidence", "Per forward", "Experts · state · memory", "Cost")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        s = self.state
        kw = dict(sizing_mode="stretch_width")
        self.heatmap = FigurePane(_placeholder("Confidence heatmap", "no run yet"), **kw)
        self.tpf = FigurePane(_placeholder("Tokens per forward", "no run yet"), **kw)
        self.cumulative = FigurePane(_placeholder("Cumulative tokens", "no run yet"), **kw)
        self.experts = FigurePane(_placeholder("Expert union", "no run yet"), **kw)
        self.state_norm = FigurePane(_placeholder("State norms", "no run yet"), **kw)
        self.memory = FigurePane(_placeholder("Memory share", "no run yet"), **kw)
        self.cost = CostView(state=s)
        self.tabs = pn.Tabs(
            (self.TABS[0], self.heatmap),
            (self.TABS[1], pn.Row(self.tpf, self.cumulative, **kw)),
            (self.TABS[2], pn.Column(pn.Row(self.experts, self.state_norm, **kw), self.memory, **kw)),
            (self.TABS[3], self.cost),
            dynamic=True, **kw,
        )
        self._drawn: dict[int, tuple] = {}
        self._last_draw = 0.0
        self._heat_fig: Any = None
        self._heat_base: FigureSnapshot | None = None
        self._heat_trace: Any = None
        self._heat_key: tuple | None = None
        self.tabs.param.watch(lambda *_e: self.refresh(), "active")
        s.param.watch(lambda *_e: self.refresh(),
                      ["trace", "trace_version", "position", "running", "device", "union_assumption"])
        self.refresh()

    def refresh(self, force: bool = False) -> None:
        s = self.state
        tab = self.tabs.active
        key = (id(s.trace), s.trace_version, s.device, s.union_assumption,
               s.position if tab in (0, 2, 3) else None)
        if not force and self._drawn.get(tab) == key:
            return
        now = time.monotonic()
        if s.running and not force and now - self._last_draw < LIVE_REDRAW_S:
            return  # streaming: the next tick (or the end of the run) redraws
        self._last_draw = now
        self._drawn[tab] = key
        trace = s.trace
        empty = trace is None or len(trace) == 0
        pos = 0 if empty else min(s.position, len(trace) - 1)
        if tab == 0:
            if empty:
                waiting = "waiting for the first forward..." if s.running else "no run yet"
                self._heat_fig = self._heat_key = None
                self.heatmap.show(_placeholder("Confidence heatmap", waiting))
            else:
                self._draw_heatmap(trace, pos)
        elif tab == 1 and not empty:
            self.tpf.show(F.tokens_per_forward_figure(trace))
            self.cumulative.show(F.cumulative_tokens_figure(trace))
        elif tab == 2 and not empty:
            self.experts.show(F.expert_union_figure(trace))
            self.state_norm.show(F.state_norm_figure(trace))
            self.memory.show(F.memory_share_figure(trace, step=pos))
        elif tab == 3:
            self.cost.refresh()

    def _draw_heatmap(self, trace: Any, pos: int) -> None:
        """The confidence heatmap at ``pos``, updated in place: rebuilt for a new run, its data
        replaced when the block (or its number of iterations) changes, else only the cursor moves."""
        idx = F._index(trace)
        block = int(idx.block_of[pos])
        rows = idx.steps_of[block]
        key = (block, len(rows))
        shown = self.heatmap.object
        if self._heat_fig is None or self._heat_trace is not trace or not isinstance(shown, FigureSnapshot):
            self._heat_fig = F.confidence_heatmap(trace, block, step=pos)  # validated once per run
            self._heat_trace = trace
            self._heat_base = FigureSnapshot.of(self._heat_fig)
            self.heatmap.object = self._heat_base
        elif key != self._heat_key:  # another block, or it grew: its payload merged in
            data, layout = F._confidence_payload(trace, block, pos)
            base = self._heat_base
            self.heatmap.object = base.updated({base.trace_index(n): props for n, props in data.items()}, layout)
        else:  # the same rows: only the cursor (the layout's first shape) moves
            r = rows.index(pos) if pos in rows else None
            shapes = [dict(sh) for sh in shown.layout.get("shapes", [])]
            if shapes:
                shapes[0].update(visible=False) if r is None else shapes[0].update(y0=r - 0.5, y1=r + 0.5,
                                                                                  visible=True)
            self.heatmap.object = FigureSnapshot(shown.data, dict(shown.layout, shapes=shapes))
        self._heat_key = key

    def __panel__(self) -> Any:
        return self.tabs


# ----------------------------------------------------------------------------- the whole app
class ExplorerApp(pn.viewable.Viewer):
    """The explorer: ``sidebar`` (settings) and ``main`` (live views + figures) over one state.

    Displayed on its own (a notebook cell) it is a Row of the two; `apps/explorer.py` puts
    them into a template. Call `tick` periodically on the UI thread (the app does it with
    a per-session periodic callback).
    """

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        if "state" not in params:
            params["state"] = ExplorerState()
        super().__init__(**params)
        s = self.state
        self.settings = SettingsPanel(state=s)
        self.summary = RunSummary(state=s)
        self.playback = PlaybackBar(state=s)
        self.block = BlockView(state=s)
        self.text = TextView(state=s)
        self.tabs = FigureTabs(state=s)
        self.compare = CompareView(state=s)
        s.param.watch(lambda *_e: self.compare.refresh(), ["trace", "previous", "running"])
        self.compare.refresh()
        # every slider, whichever view made it: a range that changes later keeps the keys in range
        for slider in self.__panel__().select(_SliderBase):
            if not isinstance(slider, pn.widgets.CompositeWidget):
                keys_within_range(slider)

    def tick(self, dt: float = 0.1) -> None:
        """Drain the decode's events and advance playback (call on the UI thread)."""
        self.state.tick(dt)

    @property
    def sidebar(self) -> Any:
        return self.settings

    @property
    def main(self) -> Any:
        live = pn.Row(
            pn.Column(self.block, sizing_mode="stretch_width", min_width=520),
            pn.Column(self.text, sizing_mode="stretch_width", min_width=320, max_width=560),
            sizing_mode="stretch_width",
        )
        return pn.Column(
            self.summary, self.playback, live,
            pn.Card(self.compare, title="Previous run vs this run", collapsed=False, sizing_mode="stretch_width",
                    header_background="#f1f5f9"),
            self.tabs,
            sizing_mode="stretch_width",
        )

    def __panel__(self) -> Any:
        return pn.Row(pn.Column(self.sidebar, width=340), self.main, sizing_mode="stretch_width")
