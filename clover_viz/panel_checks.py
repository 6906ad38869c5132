"""Every value the server receives for a control is checked again on the server.

Wing: front ends (`clover_viz`), used by the Panel views (`clover_viz.panel_settings`,
`clover_viz.panel_views`, `clover_viz.panel_branches`); the rules of the session's settings are the
state's (`clover_viz.session_settings`: `setting_problem`, `setting_refusal`, `report_setting`).

A page's inputs keep a value within its control (a slider's range, a picker's options), but the
server takes whatever a websocket message carries: a threshold of 5, a block-size position of 99
or -3, an unknown policy. Before this module such a value raised in the server's log (param's
bounds, an ``IndexError`` in Panel's `DiscreteSlider`) or, worse, was taken (position -3 picked
block size 16), while the page kept showing the value it sent. Now one check per control decides,
by the same rule whichever way the value came:

* `checked(widget, check, report)` -- a value from the page: Panel hands every websocket change
  of a widget to its ``_process_events``; this wraps it, so the value (converted as Panel would:
  a picker's label, a button group's position) is checked *before* the widget takes it. A refused
  value is reported (``report(message)``: the state's `error`, the page's alert and notification)
  and the page's control is set back to the value in use; nothing raises.
* `bind(widget, state, name)` -- the widget <-> state link for a setting (what `from_param`
  links, with the check): a value set on the widget on the server (a script, a test) goes through
  the state's `setting_problem` too, and a refused one sets the widget back.
* `control(cls, state, name, **kw)` -- a widget for a state parameter, built as `from_param`
  builds it (label, choices, range, help text), then bound and checked; `check_setting` checks a
  widget that shows a setting's value without being bound to it (the slot panel's threshold).

Tests: ``.venv/bin/python -m pytest tests/apps/test_websocket_values.py -q``
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import panel as pn
import param

from clover_viz.session_settings import SETTING_LABELS, refusal_text, shown_value

VALUE_PARAMS = ("value", "value_throttled")
_CHECKED_MARK = "_clover_checked"


# ----------------------------------------------------------------------------- values from the page
def checked(widget: Any, check: Callable[[Any], str | None] | None, report: Callable[[str | None], None], *,
            refusal: Callable[[str], str] | None = None, label: str | None = None,
            names: Sequence[str] = VALUE_PARAMS) -> Any:
    """Check every value the page sends for ``widget`` before it takes it; returns ``widget``.

    Args:
        widget: a Panel widget (or any `panel.reactive.Reactive`, e.g. `pn.Tabs`).
        check: ``value -> None`` when the value may be taken, else the message saying why not (the
            state's `setting_problem`); None: only what the widget offers is checked (its options,
            its ``start`` / ``end``).
        report: ``report(message)`` shows a refusal; ``report(None)`` says a value was taken (the
            state's `report_setting`).
        refusal: ``got -> message`` for a value that is no value of the control at all (a label not
            among a picker's options, a position past a button group's end); default: the control's
            label, its options or range, and the value it keeps.
        label: the control's name in messages (default: the widget's ``label`` / ``name``).
        names: the widget parameters checked (``value`` and ``value_throttled``; ``active`` for tabs).

    Changes of other properties in the same message are taken as usual. Checking a widget twice
    replaces the first check.
    """
    inner = getattr(widget, _CHECKED_MARK, None) or widget._process_events  # Panel's entry for page changes
    setattr(widget, _CHECKED_MARK, inner)

    def refused_as(got: str) -> str:
        if refusal is not None:
            return refusal(got)
        return refusal_text(label or _label(widget), _rule(widget), got, _kept(widget, names))

    def process(events: dict[str, Any]) -> None:
        bad: dict[str, str] = {}
        for key, raw in events.items():
            problem = _problem(widget, key, raw, check, refused_as, names)
            if problem is not None:
                bad[key] = problem
        rest = {k: v for k, v in events.items() if k not in bad}
        if rest:
            inner(rest)
        if bad:
            show_again(widget, names)
            report(next(iter(bad.values())))
        elif any(k in names or k == "active" for k in events):
            report(None)

    widget._process_events = process
    return widget


def _problem(widget: Any, key: str, raw: Any, check: Any, refused_as: Callable[[str], str],
             names: Sequence[str]) -> str | None:
    """Why the page's ``key: raw`` may not be taken by ``widget`` (None: it may)."""
    if key not in names and key != "active":
        return None
    options = _values(widget)
    if key == "active" and options is not None:  # a button / radio group sends the position of its choice
        if not (isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < len(options)):
            return refused_as(f"option {shown_value(raw)}" + (f" (options 0-{len(options) - 1})" if options else ""))
    try:
        converted = widget._process_property_change({key: raw})  # as Panel would take it
    except Exception:  # noqa: BLE001  (a label not among the options, a position past the end ...)
        return (check(raw) if check is not None and isinstance(raw, str) else None) or refused_as(shown_value(raw))
    for name, value in converted.items():
        if name not in names:
            continue
        problem = check(value) if check is not None else None
        if problem is None and not _offers(widget, value):
            problem = refused_as(shown_value(value))
        if problem is not None:
            return problem
    return None


def show_again(widget: Any, names: Sequence[str] = VALUE_PARAMS) -> None:
    """Send the value ``widget`` holds to the page again (after a refused change the page still shows
    what it sent). Watchers of the value are called with it unchanged."""
    shown = [n for n in names if n in widget.param and n != "value_throttled"]
    if shown:
        widget.param.trigger(*shown)


def _values(widget: Any) -> list | None:
    if "options" not in widget.param:
        return None
    opts = widget.options
    return list(opts.values()) if isinstance(opts, dict) else list(opts or [])


def _offers(widget: Any, value: Any) -> bool:
    """Whether ``value`` is one of ``widget``'s options / within its ``start`` .. ``end``."""
    options = _values(widget)
    if options is not None:
        return value in options or (value is None and widget.param["value"].allow_None)
    lo = getattr(widget, "start", None) if "start" in widget.param else None
    hi = getattr(widget, "end", None) if "end" in widget.param else None
    try:
        return (lo is None or value >= lo) and (hi is None or value <= hi)
    except TypeError:
        return False


def _label(widget: Any) -> str:
    text = getattr(widget, "label", None) or getattr(widget, "name", "") or type(widget).__name__
    return text if not text.startswith(type(widget).__name__) else "This control"


def _rule(widget: Any) -> str:
    options = widget.options if "options" in widget.param else None
    if options is not None:
        shown = list(options) if isinstance(options, dict) else list(map(str, options))
        return "one of " + textwrap.shorten(", ".join(shown), 200)
    lo = getattr(widget, "start", None) if "start" in widget.param else None
    hi = getattr(widget, "end", None) if "end" in widget.param else None
    if lo is not None and hi is not None:
        return f"from {lo} to {hi}"
    return "a value this control offers"


def _kept(widget: Any, names: Sequence[str]) -> str:
    name = next((n for n in names if n in widget.param), "value")
    value = getattr(widget, name)
    options = widget.options if "options" in widget.param else None
    if isinstance(options, dict):  # shown by its label
        value = next((k for k, v in options.items() if v == value), value)
        return str(value)
    return shown_value(value).strip("'") if isinstance(value, str) else shown_value(value)


# ----------------------------------------------------------------------------- settings of the state
def check_setting(widget: Any, state: Any, name: str, names: Sequence[str] = VALUE_PARAMS) -> Any:
    """`checked` with the rule of setting ``name`` of ``state`` (an `clover_viz.state.ExplorerState`):
    its `setting_problem`, `setting_refusal` and `report_setting`; returns ``widget``."""
    return checked(widget, lambda v: state.setting_problem(name, v), state.report_setting,
                   refusal=lambda got: state.setting_refusal(name, got), names=names)


def bind(widget: Any, state: Any, name: str, event: str = "value") -> Any:
    """Link ``widget`` and setting ``name`` of ``state`` both ways, checking what the widget takes;
    returns ``widget``.

    The widget's ``event`` (``value``, or ``value_throttled`` for a slider that sets on release) sets
    the state when `setting_problem` takes it (a ``value`` before release is checked, not taken); a
    refused value is reported (`report_setting`) and the widget shows the value in use again. A change
    of the state shows in the widget. Values from the page are checked before the widget takes them
    (`check_setting`); this link checks the values a script sets on the widget on the server.
    """
    integer = isinstance(state.param[name], param.Integer)
    syncing_options = False

    def from_widget(ev: Any) -> None:
        if syncing_options:  # the widget's own reaction to new options; the state decides the value
            return
        current = getattr(state, name)
        if ev.new is current or (ev.new == current and type(ev.new) is type(current)):
            return
        problem = state.setting_problem(name, ev.new)
        if problem is None:
            try:
                setattr(state, name, int(ev.new) if integer else ev.new)
                state.report_setting(None)
                return
            except (ValueError, TypeError) as exc:  # a rule setting_problem missed: refused all the same
                problem = state.setting_refusal(name, f"{shown_value(ev.new)} ({exc})")
        _show(widget, getattr(state, name), event)
        state.report_setting(problem)

    def from_state(ev: Any) -> None:
        _show(widget, ev.new, event)

    def while_dragged(ev: Any) -> None:  # a slider's ``value`` before release: checked, not taken
        problem = state.setting_problem(name, ev.new)
        if problem is not None:
            _show(widget, getattr(state, name), event)
            state.report_setting(problem)

    # after Panel's own watchers: the value shown again is the last one sent to the page
    widget.param.watch(from_widget, event, precedence=1)
    if event != "value":
        widget.param.watch(while_dragged, "value", precedence=1)
    state.param.watch(from_state, name)

    def options_from_state(ev: Any) -> None:
        # a choice list the state changes (the example prompts of a newly loaded model) is offered by
        # the widget; its value is left to the state (Panel's Select would take its first option)
        nonlocal syncing_options
        syncing_options = True
        try:
            current = getattr(state, name)
            shown = {"options": list(ev.new)}
            if current in shown["options"]:
                shown["value"] = current
            with param.edit_constant(widget):
                widget.param.update(**shown)
        finally:
            syncing_options = False

    if isinstance(state.param[name], param.Selector) and "options" in widget.param:
        state.param.watch(options_from_state, name, what="objects")
    return widget


def _show(widget: Any, value: Any, event: str) -> None:
    with param.edit_constant(widget):
        widget.param.update(**{n: value for n in dict.fromkeys(("value", event)) if n in widget.param})


def control(cls: type, state: Any, name: str, *, event: str = "value", **kw: Any) -> Any:
    """A ``cls`` widget for setting ``name`` of ``state``, as ``cls.from_param`` makes it (label,
    value, choices, range and step, the parameter's doc as help text; ``kw`` overrides), linked with
    `bind` and checked with `check_setting` (a `DiscreteSlider` through its inner slider: the page
    sends a position, which must be one of its options)."""
    p = state.param[name]
    args: dict[str, Any] = dict(label=SETTING_LABELS.get(name, name), value=getattr(state, name))
    if p.doc:
        args["description"] = textwrap.dedent(p.doc).strip()
    if isinstance(p, param.Selector):
        args["options"] = list(p.objects)
    elif isinstance(p, param.Number) and p.bounds:
        args["start"], args["end"] = p.bounds
        if getattr(p, "step", None):
            args["step"] = p.step
    args.update(kw)
    if cls is pn.widgets.DiscreteSlider:
        cls = CheckedDiscreteSlider
    widget = cls(**{k: v for k, v in args.items() if k in cls.param})
    bind(widget, state, name, event)
    if isinstance(widget, pn.widgets.DiscreteSlider):
        check_positions(widget, state, name)
    else:
        check_setting(widget, state, name, names=tuple(dict.fromkeys(("value", event))))
    return widget


class CheckedDiscreteSlider(pn.widgets.DiscreteSlider):
    """A `DiscreteSlider` that leaves a value outside its options to the check (`bind` refuses it and
    shows the value in use) instead of taking its first option silently, as Panel's does."""

    def _update_value(self, event: Any) -> None:
        if getattr(self, event.name) in self.values:
            super()._update_value(event)


def check_positions(slider: pn.widgets.DiscreteSlider, state: Any, name: str) -> None:
    """Check the positions the page sends for a `DiscreteSlider` of setting ``name`` (it draws an
    inner slider over 0 .. n-1): a position must be one of its options (-3 is not the third from the
    end) and its value one the setting takes. Kept when the slider's options change (a new inner
    slider)."""
    def position_problem(i: Any) -> str | None:
        n = len(slider.values)
        if not (isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n):
            return state.setting_refusal(name, f"slider position {shown_value(i)} (positions 0-{n - 1})")
        return state.setting_problem(name, slider.values[i])

    def guard(*_: Any) -> None:
        checked(slider._slider, position_problem, state.report_setting,  # the inner slider Panel draws
                refusal=lambda got: state.setting_refusal(name, f"slider position {got}"))

    guard()
    slider.param.watch(guard, "options")


__all__ = ["VALUE_PARAMS", "CheckedDiscreteSlider", "bind", "check_positions", "check_setting", "checked", "control", "show_again"]
