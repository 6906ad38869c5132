"""ipywidgets front end for JupyterLab: `Explorer(model_or_trace).show()`.

The same figures as the Panel app (`clover_viz.figures`), as plotly
``go.FigureWidget``s (plotly >= 6 needs ``anywidget`` in the kernel's env)
that are created once and mutated in place (``batch_update``) -- never rebuilt
per frame:

* a ``Play`` widget linked (``jslink``) to a step ``IntSlider`` replays the
  trace; every step change redraws the block view, the confidence heatmap's
  cursor (the heatmap itself only when the block changes), the text and the
  cursor of the cumulative-tokens chart;
* with a model, ``threshold`` (``FloatSlider``) and ``block_size``
  (``Dropdown``) have ``continuous_update=False`` and re-decode the prompt on
  release; the previous run stays beside the new one (``figures.compare_table`` of
  `clover_viz.runs.compare`, the table the Panel app shows, and the text diff);
* `Explorer.decode` streams events through a decoder hook, so the block
  visibly fills in while the cell runs.

Callbacks are registered once per `Explorer`, in its constructor; calling
`show()` again (re-running a cell) returns the same widget tree and adds
nothing. A new ``Explorer`` in a re-run cell owns new widgets; `close()`
releases the old ones.

Usage::

    from clover_viz import Explorer
    ex = Explorer(Trace.load("runs/example.parquet"))     # replay, no model needed
    ex.show()
    ex = Explorer(model, tokenizer, DecodeConfig(block_size=32, threshold=0.95))
    ex.show(); ex.decode("<|im_start|>user ...")          # live

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_widgets.py -q``
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from clover_viz import figures as F
from clover_viz.examples import WEATHER_PROMPT as DEFAULT_PROMPT
from clover_viz.runs import RUN_LABELS, compare

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)
_LIVE_MIN_INTERVAL_S = 0.05  # redraw at most ~20 times a second while decoding


def _is_trace(obj: Any) -> bool:
    return hasattr(obj, "steps") and hasattr(obj, "blocks") and hasattr(obj, "token_str")


class Explorer:
    """Interactive view of one decode (replay) or of a model (decode, re-decode, compare).

    Args:
        model_or_trace: an ``engine.trace.Trace``; a path to a saved trace
            (``.parquet`` / ``.arrow``); a ``CloverModel``; a ``BlockDecoder``;
            or a checkpoint directory (loaded with ``engine.checkpoint``).
        tokenizer: the model's tokenizer (ignored for a trace; read from a
            checkpoint directory when not given).
        decode_config: an ``engine.decoder.DecodeConfig`` (default block 32,
            threshold 0.95), or a dict of its fields.
        prompt: the prompt `decode` uses when called without one.

    Raises:
        TypeError: for anything else, naming what was expected.
    """

    def __init__(self, model_or_trace: Any, tokenizer: Any = None, decode_config: Any = None,
                 prompt: str | None = None) -> None:
        self.decoder = None
        self.trace = None
        self.previous = None  # the run before the current one (for the comparison)
        self.prompt = prompt or DEFAULT_PROMPT
        self._source = model_or_trace
        obj = model_or_trace
        if isinstance(obj, (str, Path)):
            p = Path(obj)
            if p.is_dir():
                from engine.checkpoint import load_model, load_tokenizer

                obj = load_model(p)
                if tokenizer is None:
                    tokenizer = load_tokenizer(p)
            elif p.is_file():
                from engine.trace import Trace

                obj = Trace.load(p)
            else:
                raise ValueError(f"{str(p)!r} is neither a trace file nor a checkpoint directory")
        if _is_trace(obj):
            self.trace = obj
        else:
            from engine.decoder import BlockDecoder, DecodeConfig

            if isinstance(decode_config, dict):
                decode_config = DecodeConfig(**decode_config)
            if isinstance(obj, BlockDecoder):
                self.decoder = obj
                if decode_config is not None:
                    self.decoder.config = decode_config
                if tokenizer is not None:
                    self.decoder.tokenizer = tokenizer
            else:
                import torch

                if not isinstance(obj, torch.nn.Module):
                    raise TypeError(
                        "Explorer takes a Trace, a trace file path, a CloverModel, a BlockDecoder or a checkpoint "
                        f"directory; got {type(obj).__name__}"
                    )
                self.decoder = BlockDecoder(obj, tokenizer, decode_config or DecodeConfig())
        self._step = 0
        self._block = None
        self._last_draw = 0.0
        self._busy = False
        self._quiet = False
        self._conf_trace = None
        self._build()

    # ------------------------------------------------------------------ widgets
    def _build(self) -> None:
        import ipywidgets as W

        has_model = self.decoder is not None
        dc = self.decoder.config if has_model else (self.trace.decode_config or {})
        get = (lambda k, d: getattr(dc, k, d)) if has_model else (lambda k, d: dc.get(k, d) if dc else d)
        n = len(self.trace) if self.trace is not None else 0

        self.play = W.Play(value=0, min=0, max=max(n - 1, 0), step=1, interval=100, description="play")
        self.step_slider = W.IntSlider(value=0, min=0, max=max(n - 1, 0), step=1, description="step",
                                       continuous_update=True, layout=W.Layout(width="420px"))
        self._link = W.jslink((self.play, "value"), (self.step_slider, "value"))
        self.speed = W.IntSlider(value=10, min=1, max=60, description="fps", continuous_update=False,
                                 layout=W.Layout(width="220px"))
        self.threshold = W.FloatSlider(value=float(get("threshold", 0.95)), min=0.5, max=1.0, step=0.01,
                                       description="threshold", continuous_update=False, readout_format=".2f",
                                       disabled=not has_model)
        bs = int(get("block_size", 32))
        self.block_size = W.Dropdown(options=sorted(set(BLOCK_SIZES) | {bs}), value=bs, description="block_size",
                                     disabled=not has_model, layout=W.Layout(width="200px"))
        self.prompt_box = W.Textarea(value=self.prompt, description="prompt", rows=3,
                                     layout=W.Layout(width="98%"), disabled=not has_model)
        self.decode_button = W.Button(description="Decode", button_style="primary", disabled=not has_model,
                                      icon="play")
        self.status = W.HTML(value="" if has_model else "<i>replaying a recorded trace (no model: threshold and "
                                                          "block_size show the recorded run)</i>")
        self.text = W.HTML(layout=W.Layout(max_height="220px", overflow="auto", border="1px solid #e2e8f0",
                                           padding="4px"))
        self.compare = W.HTML(value="<i>decode again (or move threshold / block_size): the previous run is compared "
                                    "here</i>")

        # Placeholders carry only a title: a FigureWidget's front end merges later updates into its
        # state and does not reliably drop properties (an annotation, hidden axes) the new figure lacks.
        placeholder = go.Figure(layout=dict(title=dict(text="decode a prompt to see the block fill in", x=0.01),
                                            height=260, template="plotly_white"))
        self.block_fig = go.FigureWidget(placeholder)
        self.conf_fig = go.FigureWidget(placeholder)
        self.cum_fig = go.FigureWidget(placeholder)
        self.tpf_fig = go.FigureWidget(placeholder)
        self.expert_fig = go.FigureWidget(placeholder)
        self.norm_fig = go.FigureWidget(placeholder)
        self.memory_fig = go.FigureWidget(placeholder)
        self.cost_fig = go.FigureWidget(placeholder)
        self.roofline_fig = go.FigureWidget(F.roofline_figure(None))
        self.compare_fig = go.FigureWidget(go.Figure(layout={
            "title": {"text": "no previous run yet", "x": 0.01}, "height": 120, "template": "plotly_white"}))

        # callbacks: registered exactly once, here
        self.step_slider.observe(self._on_step, names="value")
        self.speed.observe(self._on_speed, names="value")
        self.threshold.observe(self._on_setting, names="value")
        self.block_size.observe(self._on_setting, names="value")
        self.decode_button.on_click(lambda _b: self.decode())

        controls = W.HBox([self.play, self.step_slider, self.speed])
        settings = W.HBox([self.threshold, self.block_size, self.decode_button])
        tabs = W.Tab(children=[
            W.VBox([self.cum_fig, self.tpf_fig]),
            W.VBox([self.expert_fig, self.norm_fig, self.memory_fig]),
            W.VBox([self.cost_fig, self.roofline_fig]),
            W.VBox([self.compare_fig, self.compare]),
        ])
        for i, title in enumerate(("tokens vs forwards", "model internals", "cost", "compare runs")):
            tabs.set_title(i, title)
        self._layout = W.VBox([
            W.VBox([self.prompt_box, settings]) if has_model else W.HTML(""),
            controls,
            self.status,
            self.block_fig,
            self.conf_fig,
            self.text,
            tabs,
        ])
        self._widgets = [self.play, self.step_slider, self.speed, self.threshold, self.block_size, self.prompt_box,
                         self.decode_button, self.status, self.text, self.compare, *self.figures.values(),
                         controls, settings, tabs, *tabs.children, self._layout]
        if self.trace is not None and len(self.trace):
            self._set_trace(self.trace, n - 1)

    def show(self) -> Any:
        """The widget tree (the same object on every call; display it or leave it as a cell's last line)."""
        return self._layout

    def _ipython_display_(self) -> None:  # `ex` alone in a cell shows the explorer
        from IPython.display import display

        display(self._layout)

    def close(self) -> None:
        """Close every widget (ends their comms); the Explorer is unusable afterwards."""
        for w in self._widgets:
            w.close()

    @property
    def figures(self) -> dict[str, go.FigureWidget]:
        """The figure widgets by name (the same objects for the Explorer's life)."""
        return {
            "block": self.block_fig, "confidence": self.conf_fig, "cumulative": self.cum_fig,
            "tokens_per_forward": self.tpf_fig, "expert_union": self.expert_fig, "state_norm": self.norm_fig,
            "memory_share": self.memory_fig, "cost": self.cost_fig, "roofline": self.roofline_fig,
            "compare": self.compare_fig,
        }

    # ------------------------------------------------------------------ drawing
    def _set_trace(self, trace: Any, step: int | None = None) -> None:
        """Show a (new or grown) trace: redraw the whole-trace figures, then the step."""
        self.trace = trace
        n = len(trace)
        if n == 0:
            return
        step = n - 1 if step is None else step
        F.refresh_figure(self.block_fig, F.block_figure(trace, step))
        self._block = None
        self._redraw_whole_trace()
        self._set_slider_range(n, step)
        self.show_step(step)

    def _redraw_whole_trace(self) -> None:
        t = self.trace
        F.refresh_figure(self.tpf_fig, F.tokens_per_forward_figure(t))
        F.refresh_figure(self.expert_fig, F.expert_union_figure(t))
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
        """Move the slider without drawing (the caller draws once)."""
        self._quiet = True
        try:
            self.step_slider.max = max(n - 1, 0)
            self.play.max = max(n - 1, 0)
            self.step_slider.value = value
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
    def _on_step(self, change: dict) -> None:
        if not self._quiet:
            self.show_step(int(change["new"]))

    def _on_speed(self, change: dict) -> None:
        self.play.interval = int(1000 / max(int(change["new"]), 1))

    def _on_setting(self, change: dict) -> None:
        if self.decoder is None or self._busy:
            return
        self.decode()

    # ------------------------------------------------------------------ decoding
    def decode_config(self) -> Any:
        """The `DecodeConfig` the next decode uses: the decoder's, with the threshold and block_size widgets."""
        return dataclasses.replace(self.decoder.config, threshold=float(self.threshold.value),
                                   block_size=int(self.block_size.value))

    def decode(self, prompt: str | None = None, **overrides: Any) -> Any:
        """Decode ``prompt`` (default: the prompt box) with the current settings, streaming into the view.

        Every `StepEvent` goes through a hook that records it and redraws the
        block (at most ~20 times a second; the last step always), so the block
        fills in while the cell runs. The previous run is kept for comparison.
        ``overrides`` replace `DecodeConfig` fields for this call.

        Returns:
            the decode's ``engine.trace.Trace``.

        Raises:
            ValueError: when the Explorer was made from a trace (no model).
        """
        if self.decoder is None:
            raise ValueError("this Explorer replays a recorded trace; give it a model (or a BlockDecoder / checkpoint "
                             "directory) to decode")
        from engine.events import StepEvent
        from engine.trace import Trace

        if prompt is not None:
            self.prompt_box.value = prompt
        text = self.prompt_box.value
        dc = dataclasses.replace(self.decode_config(), **overrides)
        dec = self.decoder
        ids = dec.encode_prompt(text)
        model = dec.model
        cfg = model.config
        tok = dec.tokenizer
        meta = {"model_config": cfg.to_dict()}
        live = Trace(decode_config=dc.to_dict(), model_id=getattr(model, "model_id", cfg.name),
                     token_text=(lambda i: tok.decode([i], skip_special_tokens=False)) if tok is not None else None,
                     prompt_ids=ids, meta=meta)
        if self.trace is not None and len(self.trace):
            self.previous = self.trace
        self._busy = True
        self._first = True
        self.status.value = "<b>decoding…</b>"

        def on_event(ev: Any) -> None:
            if isinstance(ev, StepEvent):
                now = time.perf_counter()
                if self._first:
                    self._first = False
                    self.trace = live
                    F.refresh_figure(self.block_fig, F.block_figure(live, -1))
                    self._block = None
                if now - self._last_draw >= _LIVE_MIN_INTERVAL_S:
                    self._last_draw = now
                    self._set_slider_range(len(live), len(live) - 1)
                    self.show_step(len(live) - 1)
                    self.status.value = f"<b>decoding…</b> {len(live)} forwards"

        try:
            dec.generate(ids, hooks=[live, on_event], record_trace=False, config=dc)
        finally:
            self._busy = False
        self._set_trace(live)
        s = live.summary()
        self.status.value = (f"NFE {s['nfe']} · {s['n_tokens']} tokens · {s['tokens_per_forward']:.2f} tokens/forward"
                             f" · {s['n_forced']} forced · {s['wall_s']:.2f} s · stop: {s['stop_reason']}")
        cmp = compare(self.previous, live)
        if cmp is not None:  # the Panel app's table, and the text diff
            F.refresh_figure(self.compare_fig, F.compare_table(cmp["previous"], cmp["current"], labels=RUN_LABELS))
            self.compare.value = (f"<p>text difference (<del>{RUN_LABELS[0]} only</del>, <ins>{RUN_LABELS[1]} only"
                                  "</ins>):</p>" + cmp["text"]["diff_html"])
        return live


__all__ = ["Explorer", "DEFAULT_PROMPT", "BLOCK_SIZES"]
