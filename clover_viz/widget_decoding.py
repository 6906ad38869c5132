"""Decoding from the notebook `Explorer`: start a decode in the background, pump its events
into the figures, wait for it, stop it, and show the finished run beside the previous one.

A branch (`ExplorerDecoding.branch`, `start_branch`: `clover_viz.session_branches`) runs the same way:
on the state's worker, drawn by the same pump.

Wing: front ends (`clover_viz`), below `clover_viz.widgets`. `ExplorerDecoding` is a mixin of
`clover_viz.widgets.Explorer` (the widgets, the figures and `show_step` are built there); the
decode itself runs in the session state's worker thread (`clover_viz.state.ExplorerState`).

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_widgets.py -q``
"""

from __future__ import annotations

import dataclasses
import html
import threading
import time
from typing import Any

from clover_viz import figures as F
from clover_viz.runs import diff_caption, forced_past_answer
from clover_viz.session_settings import with_controls

_LIVE_MIN_INTERVAL_S = 0.05  # redraw at most ~20 times a second while decoding
_POLL_S = 0.005  # wait between drains when the decode has queued nothing new


def _settings_line(dc: dict | None) -> str:
    """``block_size 7 · threshold 0.95 · memory state+window · max_new_tokens 16`` (plus the policy when it is
    not low_confidence): the settings a run's decode config (``Trace.decode_config``) ran with, for the
    status line -- the memory mode and budget have no widget."""
    dc = dc or {}
    if dc.get("sampler"):  # a masked diffusion family's own sampler (its settings, not the block decoder's)
        shown = (k for k in ("gen_length", "max_new_tokens", "block_length", "steps", "remasking", "alg") if k in dc)
        return " · ".join([f"{dc['sampler']} sampler", *(f"{k} {dc[k]}" for k in shown)])
    parts = [f"block_size {dc.get('block_size')}", f"threshold {float(dc.get('threshold', 0.0)):g}",
             f"memory {dc.get('memory_mode')}", f"max_new_tokens {dc.get('max_new_tokens')}"]
    if dc.get("policy", "low_confidence") != "low_confidence":
        parts.append(f"policy {dc['policy']}")
    return " · ".join(parts)


def _notes_of(status: str) -> str:
    """The notes the session state appended to its done line (`clover_viz.state.ExplorerState`: the chat
    template applied, a prompt past the model's training length, a mostly guessed answer), escaped and
    each led by `` · `` -- so the notebook says what the app and the CLI say."""
    if not status.startswith("done") or " · " not in status:
        return ""
    return "<br>" + " · ".join(html.escape(n) for n in status.split(" · ")[1:])


class ExplorerDecoding:
    """The decoding half of `clover_viz.widgets.Explorer` (a mixin)."""

    # ------------------------------------------------------------------ decoding
    def decode_config(self) -> Any:
        """The `DecodeConfig` (or official sampler's settings) the next decode uses: `config`, with the
        threshold and block_size widgets' values in the sampler's own parameters
        (`clover_viz.session_settings.with_controls`; they show `config` unless the user has just moved them)."""
        return with_controls(self.config, int(self.block_size.value), float(self.threshold.value))

    def start_decode(self, prompt: str | None = None, **overrides: Any) -> bool:
        """Start decoding in the background and return at once (the Decode button and the sliders).

        The decode runs in the state's worker thread; a pump thread drains its events into
        the figures (at most ~20 redraws a second) while the kernel stays free for other
        cells. `stop` (the Stop button) ends it after its current forward, keeping what it
        wrote. A decode already running is replaced. Errors go to the status line, the run
        on display stays. Returns whether a decode started; `wait` blocks until it ends.

        ``overrides`` replace `DecodeConfig` fields (``block_size=7``, ``memory_mode="state"``
        ...). Once the decode has started, its settings are the Explorer's (`config`): the
        widgets show them and the next decode starts from them; a decode that cannot start
        changes nothing.
        """
        try:
            if self.config is None:
                raise ValueError("this Explorer replays a recorded trace; give it a model (or a BlockDecoder / "
                                 "checkpoint directory) to decode")
            s = self.state
            with self._lock:
                if prompt is not None:
                    self.prompt_box.value = prompt
                s.prompt = self.prompt_box.value
                dc = dataclasses.replace(self.decode_config(), **overrides)
                self._last_error = ""
                self.status.value = "<b>decoding…</b>"
                if not s.generate(config=dc):
                    raise ValueError(s.error or "the decode did not start")
                self.config = dc  # what runs is the setting from now on (overrides included)
                self._show_config(dc)
                self._decodes_started += 1
                self._start_pump()
            return True
        except Exception as exc:  # noqa: BLE001  (a callback's error is shown, not lost)
            self._show_error(exc)
            return False

    def _start_pump(self) -> None:
        """The state's worker runs: draw its events as they come (a pump thread), Stop enabled."""
        self._busy = True
        self.stop_button.disabled = False
        if self._pump is None:
            self._pump = threading.Thread(target=self._pump_events, name="clover-explorer-pump", daemon=True)
            self._pump.start()

    def start_branch(self, at: Any = None, action: Any = None) -> bool:
        """Start a branch of the run on display in the background (the branch buttons) and return at once;
        drawn live like a decode (`start_decode`). ``at``: an `clover_engine.decoding.branch.Branch` for
        `ExplorerState.branch`; ``action``: instead, a call of the state's branching API returning whether
        it started. Errors go to the status line. Returns whether the branch started."""
        try:
            with self._lock:
                self._last_error = ""
                self.status.value = "<b>branching…</b>"
                if not (action() if action is not None else self.state.branch(at)):
                    raise ValueError(self.state.error or "the branch did not start")
                self._start_pump()
            return True
        except Exception as exc:  # noqa: BLE001  (a callback's error is shown, not lost)
            self._show_error(exc)
            return False

    def branch(self, at: Any, wait: bool = True) -> Any:
        """Decode a branch of the run on display, drawn live, e.g. ``ex.branch(Branch.choose(0, 2, 5, 262))``
        (token 262 at slot 5 of block 0 after its step 2, 0-based), ``Branch.remask(b, s, slot)`` or
        ``Branch(b, s, config=DecodeConfig(...))`` (`clover_engine.decoding.branch`). It joins the session's tree
        (`ExplorerState.branches`, the list in the "compare runs" tab) under the run it came from.

        Returns:
            the branch's ``Trace`` (with ``wait``; else None once it has started).

        Raises:
            ValueError: the branch was refused (`ExplorerState.branch`; the engine's reason), the runs
                on display unchanged.
        """
        if not self.start_branch(at):
            raise ValueError(self._last_error)
        if not wait:
            return None
        while not self.wait(0.1):
            pass
        if self.state.error:
            raise ValueError(self.state.error)
        return self.state.trace

    def _pump_events(self) -> None:
        """Drain the running decode one forward at a time (drawing as they arrive), then finish the run."""
        s = self.state
        while True:
            try:
                with self._lock:
                    if s.running:
                        if s.drain(max_steps=1):
                            continue
                    else:
                        s.wait(5.0)  # the worker's last messages (a branch's result) too
                        self._busy = False
                        self.stop_button.disabled = True
                        try:
                            self._finish_run()
                        finally:
                            self._pump = None  # last: `wait` returns once the run is drawn
                        return
            except Exception as exc:  # noqa: BLE001
                with self._lock:
                    self._busy = False
                    self.stop_button.disabled = True
                    self._show_error(exc)
                    self._pump = None
                return
            time.sleep(_POLL_S)

    def _finish_run(self) -> None:
        """The run ended: draw it whole (what it produced, even when it failed), its numbers and the comparison."""
        s = self.state
        live = s.trace
        if live is not None and len(live):
            self._set_trace(live)
        self.branching.refresh()
        if s.error:
            self._show_error(s.error)
            return
        if live is None:
            return
        st = live.summary()
        past = forced_past_answer(live)
        forced = f"{st['n_forced']} forced" + (
            f" ({past} of them end-of-text slots at or after the answer's end: forwards, not tokens)" if past else "")
        node = s.shown_node if live.meta.get("branch") else None
        self.status.value = ((f"branch #{node} ({html.escape(live.meta['branch'].get('label', ''))}) · "
                              if node is not None else "") + f"NFE {st['nfe']} · {st['n_tokens']} tokens · {st['tokens_per_forward']:.2f} "
                             f"tokens/forward · {forced} · {st['wall_s']:.2f} s · "
                             f"stop: {st['stop_reason']} · {html.escape(_settings_line(live.decode_config))}"
                             + _notes_of(s.status))
        self._show_comparison()
        self._follow_careful(live)

    def _follow_careful(self, trace: Any) -> None:
        """The run is measured against its careful decode in the background (`clover_viz.session_careful`): redraw
        its number cards when that ends (the card reads "measuring…" until then)."""
        s = self.state
        if not s.measuring:
            return

        def follow() -> None:
            s.wait_careful(3600.0)
            with self._lock:
                if s.trace is trace:
                    self._show_summary(trace)

        threading.Thread(target=follow, name="clover-explorer-careful", daemon=True).start()

    def stop(self) -> None:
        """Stop the running decode after its current forward (the Stop button); the run keeps what it wrote."""
        self.state.stop()

    def wait(self, timeout: float = 60.0) -> bool:
        """Block until a background decode has ended and been drawn. Returns False on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            pump = self._pump
            if pump is None:
                return True
            pump.join(max(deadline - time.monotonic(), 0.0) if timeout is not None else None)
            if pump.is_alive():
                return False

    def decode(self, prompt: str | None = None, **overrides: Any) -> Any:
        """Decode ``prompt`` (default: the prompt box) with the current settings, streaming into the view.

        Synchronous (for scripts and cells): `start_decode`, then wait until the run ends; the
        block fills in while the cell runs (each forward drawn as it arrives, at most ~20
        times a second; the last step always). The previous run is kept for the comparison.
        ``overrides`` replace `DecodeConfig` fields and stay the settings of later decodes (the
        widgets show them; see `start_decode`). Interrupting the kernel
        stops the decode after its current forward; the run keeps what it wrote (stop reason
        ``cancelled``) and is returned.

        Returns:
            the decode's ``clover_engine.recording.trace.Trace``.

        Raises:
            ValueError: when the Explorer was made from a trace (no model), or the prompt or
                the settings cannot be decoded (the state's message).
            RuntimeError: when the decode failed in the worker (the state's message).
        """
        if self.config is None:
            raise ValueError("this Explorer replays a recorded trace; give it a model (or a BlockDecoder / checkpoint "
                             "directory) to decode")
        if not self.start_decode(prompt, **overrides):
            raise ValueError(self._last_error)
        try:
            while not self.wait(0.1):
                pass
        except KeyboardInterrupt:
            self.stop()
            self.wait()
        if self.state.error:
            raise RuntimeError(self.state.error)
        return self.state.trace

    def _on_trace_grown(self, _event: Any) -> None:
        """While `decode` drains: draw each new forward (rate-limited), the first one always."""
        live = self.state.trace
        n = len(live) if live is not None else 0
        if not self._busy or n == 0 or (self._drawn[0] is live and self._drawn[1] == n):
            return  # not decoding, or no new forward (a block start or end)
        if self._drawn[0] is not live:  # the run's first forward: its block view, built once
            F.refresh_figure(self.block_fig, F.block_figure(live, -1))
            self.branching.attach_click()
            self._block = None
        self._drawn = (live, n)
        now = time.perf_counter()
        if now - self._last_draw >= _LIVE_MIN_INTERVAL_S:
            self._last_draw = now
            self._set_slider_range(n, n - 1)
            self.show_step(n - 1)
            self.status.value = f"<b>decoding…</b> {n} forwards"
            self._show_summary(live)

    def _show_comparison(self) -> None:
        """The previous run against this one: the Panel app's table and the text diff."""
        cmp = self.state.comparison()
        if cmp is None:
            return
        labels = self.state.comparison_labels()
        F.refresh_figure(self.compare_fig, F.compare_table(cmp["previous"], cmp["current"], labels=labels))
        caption = diff_caption(cmp)
        self.compare.value = ((f"<p style='color:#b45309'><b>{caption}</b></p>" if caption else "")
                              + f"<p>text difference (<del>{html.escape(labels[0])} only</del>, <ins>"
                              f"{html.escape(labels[1])} only</ins>):</p>" + cmp["text"]["diff_html"])
