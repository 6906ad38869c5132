"""Browser behaviour the Panel app's controls need: keyboard on re-ranged sliders, file inputs
that take the same file twice.

Wing: front ends (`clover_viz`), used by the Panel views (`clover_viz.panel_views`,
`clover_viz.panel_settings`).

* `keys_within_range(slider)` -- Home / End follow a slider's *current* range;
  `has_keys_within_range` says whether it was applied;
* `discrete_keys(discrete_slider)` / `arm_discrete_keys` -- PageUp / PageDown move one option and
  ``aria-valuetext`` reads the option (the block-size slider); `has_discrete_keys`;
* `clear_after_pick(file_input, on_pick)` -- every pick reaches ``on_pick``, then the input is
  cleared; `clears_after_pick` says whether it was set up.

Tests: ``.venv/bin/python -m pytest tests/apps/test_browser_controls.py -q``
"""

from __future__ import annotations

import json
from typing import Any

import panel as pn


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
# A `DiscreteSlider` is drawn as an integer slider over option positions 0 .. n-1: noUiSlider reads
# the position to a screen reader ("6.00" for block size 64: its aria-valuetext is the number with two
# decimals) and moves PageUp / PageDown by 5 positions (64 -> 2 over 7 options). This callback gives
# each view of the inner slider the option's label as its aria-valuetext (after noUiSlider's own update
# handler, on every move) and PageUp / PageDown one option, as the arrows do; Home / End stay the
# first and last option. It is attached when the slider is made (`discrete_keys`) and runs when the
# inner slider gets the class `DISCRETE_KEYS_CLASS` (`arm_discrete_keys`, once the page is drawn).
_DISCRETE_KEYS_JS = """
const labels = %s;
const views = [...window.Bokeh.index.find(cb_obj)];
for (const view of views) {
  const el = view.slider_el;
  const ui = view._noUiSlider;
  if (el == null || ui == null || el.__clover_discrete_keys) { continue; }
  el.__clover_discrete_keys = true;
  const relabel = () => {
    const now = ui.get(true);
    const at = (Array.isArray(now) ? now : [now]).map(Number);
    for (const handle of el.querySelectorAll("[data-handle]")) {
      const i = Math.round(at[Number(handle.getAttribute("data-handle")) || 0]);
      handle.setAttribute("aria-valuetext", String(labels[i] ?? i));
    }
  };
  ui.on("update.cloverlabels", relabel);  // after noUiSlider's own aria handler, on every move
  relabel();
  el.addEventListener("keydown", (ev) => {
    if ((ev.key !== "PageUp" && ev.key !== "PageDown") || view.model.disabled) { return; }
    ev.preventDefault();
    ev.stopPropagation();
    const now = Math.round(Number(ui.get(true)));
    const next = Math.min(Math.max(now + (ev.key === "PageUp" ? 1 : -1), view.model.start), view.model.end);
    if (next !== now) { view._change([next]); }
  }, true);
}
"""
DISCRETE_KEYS_CLASS = "clover-discrete-keys"
_KEYS_MARK = "_clover_keys_within_range"
_DISCRETE_MARK = "_clover_discrete_keys"
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


def discrete_keys(slider: pn.widgets.DiscreteSlider) -> pn.widgets.DiscreteSlider:
    """Make ``slider``'s keys and screen-reader text follow its options once it is armed
    (`arm_discrete_keys`, when the page is drawn): PageUp / PageDown move one option (as the arrows
    do), and ``aria-valuetext`` is the option's label ("64", not the position "6.00"). Call when the
    slider is made (the browser code must be attached before the page draws it); new options (a new
    inner slider) get it too, and are armed when the old one was. Returns ``slider``.

    Raises:
        TypeError: ``slider`` is not a `DiscreteSlider`.
    """
    if not isinstance(slider, pn.widgets.DiscreteSlider):
        raise TypeError(f"discrete_keys takes a DiscreteSlider; got {type(slider).__name__}")

    def attach(*_: Any) -> None:
        inner = slider._slider  # the integer slider over option positions that Panel draws
        inner.jscallback(css_classes=_DISCRETE_KEYS_JS % json.dumps([str(option) for option in slider.options]))
        if getattr(slider, _DISCRETE_MARK, False):
            pn.state.execute(lambda: arm_discrete_keys(slider))  # the new inner slider is drawn first

    attach()
    slider.param.watch(attach, "options")
    setattr(slider, _DISCRETE_MARK, True)
    return slider


def arm_discrete_keys(slider: pn.widgets.DiscreteSlider) -> None:
    """Run `discrete_keys`' browser code on a drawn ``slider`` (the served app's ``onload``): the inner
    slider gets `DISCRETE_KEYS_CLASS`. Applying it twice is harmless."""
    inner = slider._slider
    if DISCRETE_KEYS_CLASS not in inner.css_classes:
        inner.css_classes = [*inner.css_classes, DISCRETE_KEYS_CLASS]


def has_discrete_keys(slider: Any) -> bool:
    """Whether `discrete_keys` was applied to ``slider``."""
    return bool(getattr(slider, _DISCRETE_MARK, False))


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


def release_js_callbacks(*roots: Any) -> int:
    """Drop the browser callbacks (``jscallback`` / ``jslink``) of every widget under ``roots`` from
    Panel's process-wide registry; call when a served session ends. Returns how many were dropped.

    Panel keeps them in ``panel.links.Callback.registry``, a ``WeakKeyDictionary`` keyed by the source
    widget, but a callback's ``args`` (the upload notice box) and a link's target hold strong
    references back into the session's widgets and, through their watchers, to its state: the key
    never dies, and every closed session stayed alive whole (its state, figures and traces: about
    3.5 MB a session in the soak benchmark).
    """
    # local: panel.links is Panel's own module; only a session's end needs its registry
    from panel.links import Callback

    dropped = 0
    for root in roots:
        layout = root.__panel__() if isinstance(root, pn.viewable.Viewer) else root
        for obj in [layout, *layout.select()]:
            if Callback.registry.pop(obj, None) is not None:
                dropped += 1
    return dropped
