"""The Panel app's sidebar: model, prompt and examples, decoding settings, Generate / Stop,
open / save a trace (`SettingsPanel`).

Wing: front ends (`clover_viz`), one of the Panel views (`clover_viz.panel_views.ExplorerApp`
puts it in the sidebar). Its widgets are bound to the `clover_viz.state.ExplorerState`
parameters through `clover_viz.panel_checks` (every value the page sends is checked on the server, a
refused one is reported and the control shows the value in use again); sliders set the state on release.

Tests: ``.venv/bin/python -m pytest tests/apps/test_explorer_app.py -q``
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import panel as pn
import param

from clover_viz.limits import size_text
from clover_viz.models import bundled_models, bundled_purpose
from clover_viz.panel_checks import bind, check_setting, checked, control
from clover_viz.session_settings import unused_controls, unused_controls_note
from clover_engine.examples import example_note
from clover_viz.panel_controls import arm_discrete_keys, clear_after_pick, discrete_keys
from clover_viz.session_settings import MAX_PROMPT_CHARS  # the prompt box's limit (the state checks it too)
from clover_viz.state import ExplorerState

MONO = "JetBrains Mono, Menlo, Consolas, monospace"

# The bundled-model buttons wrap onto more rows instead of squeezing every name into one: Bokeh's button
# group is one row that never wraps (``flex-wrap: nowrap``), so four names in the 360 px sidebar overlapped
# and were cut. Each button is as wide as its name (no ellipsis) and a row's buttons share its spare width;
# with rows, the group's joined borders become separate rounded buttons a few pixels apart.
BUNDLED_BUTTONS_CSS = """
.bk-btn-group { flex-wrap: wrap; height: auto; gap: 4px; }
.bk-btn-group > .bk-btn { flex: 1 1 auto; white-space: nowrap; overflow: visible; text-overflow: clip;
                          margin: 0 !important; border-radius: 4px !important; }
"""


# A file over the upload limit must never be sent: bokeh's file input reads the whole file into one
# websocket message, and a message over the server's limit closes the page's connection. Armed once
# the page is drawn (`SettingsPanel.arm_upload_limit`), this wraps each view's ``load_files``: a pick
# over the limit (read from the notice's placeholder, in bytes) clears the box and reports the name
# and size through the hidden notice, so the server names the limit and nothing else changes.
_UPLOAD_LIMIT_JS = """
for (const view of [...window.Bokeh.index.find(cb_obj)]) {
  if (view.__clover_upload_limit) { continue; }
  view.__clover_upload_limit = true;
  const load = view.load_files.bind(view);
  view.load_files = async (files) => {
    const limit = Number(notice.placeholder) || 0;
    let size = 0;
    for (const f of files) { size += f.size; }
    if (limit > 0 && size > limit) {
      const name = files.length ? files[0].name : "";  // read before clearing: the FileList is live
      view.input_el.value = "";
      notice.value = JSON.stringify({name: name, size: size, at: Date.now()});
      return;
    }
    return load(files);
  };
}
"""


# ----------------------------------------------------------------------------- sidebar
class _SaveButton(pn.widgets.FileDownload):
    """FileDownload whose callback may return None: nothing is sent (the callback said why)."""

    def _sync_data(self, fileobj: Any) -> None:
        if fileobj is None:
            return
        super()._sync_data(fileobj)


_SHOWN_AT_STOP_JS = """
const drawn = (root) => {  // the status line as the browser has drawn it, under root (shadow roots too)
  if (root == null) return null;
  const line = root.querySelector('.clover-status[data-nfe]');
  if (line != null) return line;
  for (const el of root.querySelectorAll('*')) {
    if (el.shadowRoot != null) { const found = drawn(el.shadowRoot); if (found != null) return found; }
  }
  return null;
};
let line = null, from = 'summary';
try {
  const view = Bokeh.index.find_one(numbers);  // this app's summary pane
  line = view == null ? null : drawn(view.shadow_el || view.el);
} catch (e) {}
let n = NaN;
try {
  if (line == null) { line = drawn(document); from = 'page'; }
  n = line == null ? NaN : parseInt(line.dataset.nfe);
  if (isNaN(n)) { n = parseInt(scrub.end); from = 'scrub'; }
} catch (e) { from = 'error'; }
shown.value = n + ':' + Date.now() + ':' + from;  // always sent: this message is what stops the run
"""
"""The Stop button's browser callback (`SettingsPanel.report_shown_at_stop`): ``"N:time:where"`` into the hidden box."""


class SettingsPanel(pn.viewable.Viewer):
    """Sidebar controls. Sliders set the state on release (``value_throttled``)."""

    state = param.ClassSelector(class_=ExplorerState)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        s = self.state
        self.model_dir = control(pn.widgets.TextInput, s, "model_dir", label="Model directory")
        # the bundled models one click away (the text field takes any other directory)
        self.bundled = pn.widgets.RadioButtonGroup(
            label="Bundled models", options=bundled_models(), value=None, color="primary", variant="outline",
            sizing_mode="stretch_width",  # the loaded one filled: "light" drew it grey, like a disabled button
            stylesheets=[BUNDLED_BUTTONS_CSS])  # full names, on as many rows as they need
        self._sync_bundled()
        self.bundled.param.watch(self._on_bundled, "value")
        checked(self.bundled, None, s.report_setting)  # a position past its buttons: refused, not an IndexError
        s.param.watch(lambda _e: self._sync_bundled(), "model_dir")
        # what each bundled model is for, from its card: which one answers the prompt at hand
        self.purposes = pn.pane.HTML(
            "".join(f"<div><b>{html.escape(n)}</b>: {html.escape(bundled_purpose(n))}</div>"
                    for n in bundled_models() if bundled_purpose(n)),
            css_classes=["clover-purposes"], sizing_mode="stretch_width", margin=(0, 10),
            styles={"font-size": "11px", "color": "#475569", "line-height": "1.35"})
        self.model_label = pn.pane.Markdown(sizing_mode="stretch_width", margin=(0, 10), styles={"font-size": "12px"})
        self.dev = control(pn.widgets.Checkbox, s, "dev_sharpen_random", label="dev: sharpen random model (weights x15)")
        self.example = control(pn.widgets.Select, s, "example", label="Example prompt")
        # what the picked example shows, on which model, with the numbers a test holds it to
        self.example_note = pn.pane.HTML("", styles={"font-size": "11px", "color": "#555"}, margin=(0, 10),
                                         sizing_mode="stretch_width")
        # max_length: Panel's default (5,000 characters) cut longer prompts silently in the browser. The
        # limit here is far above any bundled model's context (65,536 tokens for clover-tiny, whose
        # tokens are bytes; 8,192 for SmolLM2), so the model's own check refuses an over-long prompt
        # with the numbers, and nothing a user types within a context is dropped.
        self.prompt = control(
            pn.widgets.TextAreaInput, s, "prompt", label="Prompt", height=170, sizing_mode="stretch_width",
            styles={"font-family": MONO}, max_length=MAX_PROMPT_CHARS)
        self.threshold = control(
            pn.widgets.FloatSlider, s, "threshold", event="value_throttled", label="Threshold", step=0.01,
            sizing_mode="stretch_width", format="0.00")  # "1.00", not "1"
        self.block_size = discrete_keys(control(pn.widgets.DiscreteSlider, s, "block_size", event="value_throttled",
                                                label="Block size", sizing_mode="stretch_width"))
        self.policy = control(pn.widgets.Select, s, "policy", label="Policy")
        self.controls_note = pn.pane.HTML("", visible=False, css_classes=["clover-controls-note"], margin=(0, 10),
                                          sizing_mode="stretch_width", styles={"font-size": "11px", "color": "#64748b"})
        # the list offers what the loaded model runs (`clover_viz.session_settings.policies_for`)
        s.param.watch(lambda e: setattr(self.policy, "options", list(e.new)), "policy", what="objects")
        self.memory_mode = control(pn.widgets.RadioButtonGroup, s, "memory_mode", label="Memory", color="primary",
                                   variant="outline", sizing_mode="stretch_width")
        self.memory_note = pn.pane.Markdown("", margin=(0, 10), styles={"font-size": "11px", "color": "#64748b"})
        # No start / end in the page: the browser would clamp or revert an out-of-range number
        # silently; the server refuses it and says the valid range instead (as for every control).
        lo, hi = s.param.max_new_tokens.bounds
        self.max_new_tokens = bind(pn.widgets.IntInput(label=f"Max new tokens ({lo}-{hi})", value=s.max_new_tokens,
                                                       step=16), s, "max_new_tokens")
        check_setting(self.max_new_tokens, s, "max_new_tokens")
        self.repetition = control(pn.widgets.Checkbox, s, "repetition_control", label="Repetition control")
        self.repetition_penalty = control(pn.widgets.FloatInput, s, "repetition_penalty", label="penalty (logit)",
                                          step=0.5, width=120)
        self.eos = control(pn.widgets.Checkbox, s, "eos_bias", label="Progressive EOS bias")
        self.eos_limit = control(pn.widgets.IntInput, s, "eos_soft_limit", label="soft limit (tokens)", width=120)
        # Text labels, no icons: icon fonts come from a CDN, which an offline machine cannot reach.
        self.generate = pn.widgets.Button(label="Generate", color="primary", sizing_mode="stretch_width")
        self.stop = pn.widgets.Button(label="Stop", color="danger", disabled=True, sizing_mode="stretch_width")
        self.open = pn.widgets.FileInput(accept=".parquet,.pq,.arrow,.feather", multiple=False,
                                         sizing_mode="stretch_width")
        self.save = _SaveButton(callback=self._save, filename="clover-trace.parquet",
                                label="Save trace (.parquet)", color="default", disabled=True,
                                sizing_mode="stretch_width", embed=False)
        self.generate.on_click(lambda _e: s.generate())
        self.stop.on_click(self._on_stop_click)
        self._page_counts_stop = False  # served with `report_shown_at_stop`: the page's count stops the run
        # the page's Stop also says how many forwards it had drawn ("N:time", `report_shown_at_stop`)
        self.stop_shown = pn.widgets.TextInput(visible=False)
        self.stop_shown.param.watch(self._on_stop_shown, "value")
        clear_after_pick(self.open, self._open)  # every pick loads, the same file again too
        # an upload over the limit: the browser reports it here instead of sending it (_UPLOAD_LIMIT_JS)
        self.upload_notice = pn.widgets.TextInput(visible=False, placeholder=str(s.max_upload_bytes or 0))
        self.upload_notice.param.watch(self._on_upload_notice, "value")
        self.open.jscallback(args={"notice": self.upload_notice}, css_classes=_UPLOAD_LIMIT_JS)
        self.open_note = pn.pane.Markdown(self._open_note(), margin=(0, 10), styles={"font-size": "12px"})
        s.param.watch(lambda _e: setattr(self.open_note, "object", self._open_note()), "max_upload_bytes")
        s.param.watch(self._sync, ["running", "loading", "model_label", "model_ok", "window_available", "memory_advice", "trace",
                                   "n_steps", "policy", "example", "trace_version"])
        self._sync()

    def _save(self) -> Any:
        try:
            return self.state.trace_bytes()
        except ValueError as exc:
            self.state.error = f"Nothing saved: {exc}"
            return None

    def _open(self, content: bytes, filename: str) -> None:
        self.state.load_trace(content, name=filename)

    def _open_note(self) -> str:
        limit = self.state.max_upload_bytes
        cap = f", at most {size_text(limit)}" if limit is not None else ""
        return f"Open a saved trace to replay it without the model (.parquet or .arrow{cap}):"

    def arm_upload_limit(self, limit_bytes: int | None = None) -> None:
        """Refuse files over the limit in the browser, before they are sent (call once the page is drawn;
        the served app's ``onload``). ``limit_bytes`` replaces the state's limit (the server's websocket
        carries less)."""
        if limit_bytes is not None:
            self.state.max_upload_bytes = limit_bytes
        self.upload_notice.placeholder = str(self.state.max_upload_bytes or 0)
        if "clover-upload-limit" not in self.open.css_classes:
            self.open.css_classes = [*self.open.css_classes, "clover-upload-limit"]  # runs _UPLOAD_LIMIT_JS
        arm_discrete_keys(self.block_size)  # the page is drawn: PageUp / PageDown and aria-valuetext by option

    def report_shown_at_stop(self, numbers: Any, scrub: Any) -> None:
        """Make the page's Stop send how many forwards the page showed at the click: the NFE of the status
        line as drawn in the browser (``data-nfe`` of ``.clover-status`` in ``numbers``, the run summary's
        pane), else ``scrub.end`` (the run's step count in the page's models; at least 2). The decode runs
        ahead of what the server drew, the server ahead of what the browser has drawn (a loaded browser
        re-renders an HTML pane late); the stopped run keeps what the page showed plus the forward in
        flight (`ExplorerState.stop`)."""
        self.stop.js_on_click(args={"numbers": numbers, "scrub": scrub, "shown": self.stop_shown},
                              code=_SHOWN_AT_STOP_JS)
        # Served, a click reaches the server twice: as the button's event and as the page's count. Only the count
        # stops the run, so that the server never stops at its own count (ahead of a loaded browser) and finishes
        # the cut-back before the page's count arrives. Unserved (a test's click), the event stops it.
        doc = pn.state.curdoc
        self._page_counts_stop = doc is not None and doc.session_context is not None

    def _on_stop_click(self, _event: Any) -> None:
        if not self.state.running and not self.state.loading:  # nothing decodes: a measurement is what Stop ends
            self.state.stop_measuring()
        elif not self._page_counts_stop:
            self.state.stop()

    def _on_stop_shown(self, event: Any) -> None:
        try:
            shown: int | None = max(int(str(event.new).split(":")[0]), 0)
        except ValueError:  # the page could not tell its count ("NaN:..."): stop at what this session drew
            shown = None
        self.state.stop(shown=shown)
        if self.state.stop_timing:  # where the page read it: its summary, the page, or the scrub's end
            self.state.stop_timing["shown_from"] = str(event.new).split(":")[-1]

    def _on_upload_notice(self, event: Any) -> None:
        try:
            picked = json.loads(event.new or "{}")
            self.state.refuse_upload(str(picked["name"]), int(picked["size"]))
        except (ValueError, KeyError, TypeError):
            return

    def _sync(self, *_: Any) -> None:
        s = self.state
        self.example_note.object = html.escape(example_note(s.example))
        # Stop also gives up a model's load, and a careful decode or frontier measured in the background
        self.stop.disabled = not (s.running or s.loading or s.measuring)
        self.save.disabled = s.trace is None or len(s.trace) == 0
        self.generate.label = "Generate (restart)" if s.running else "Generate"
        label = s.model_label or "(not loaded yet)"
        warn = " ⚠" if "random" in label else ""
        self.model_label.object = f"**Model:** {html.escape(label)}{warn}"
        self.memory_mode.disabled = not (s.window_available and s.model_ok)
        # verify: the base decides what is written; llada / dream: their schedule does -- no threshold is read;
        # dream: one canvas -- no block size. Off, labelled short (the sidebar is narrow), the note says why
        unused = unused_controls(s.policy)
        for widget, label in ((self.threshold, "Threshold"), (self.block_size, "Block size")):
            widget.disabled = label in unused
            widget.name = f"{label} (not read by {s.policy})" if label in unused else label
        self.controls_note.object = html.escape(unused_controls_note(s.policy))
        self.controls_note.visible = bool(unused)
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
            self.model_dir, self.bundled, self.purposes, self.model_label, self.dev,
            self.example, self.example_note, self.prompt,
            pn.Row(self.generate, self.stop, sizing_mode="stretch_width"),
            pn.pane.Markdown("#### Decoding", margin=(10, 10, 0, 10)),
            self.threshold, self.block_size, self.policy, self.controls_note,
            pn.pane.Markdown("Memory mode", margin=(4, 10, 0, 10)), self.memory_mode, self.memory_note,
            self.max_new_tokens,
            pn.Row(self.repetition, self.repetition_penalty),
            pn.Row(self.eos, self.eos_limit),
            pn.pane.Markdown("#### Traces", margin=(10, 10, 0, 10)),
            self.open_note, self.open, self.upload_notice, self.stop_shown, self.save,
            sizing_mode="stretch_width",
        )
