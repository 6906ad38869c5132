"""Pacing a served session's decode and redraws, so that a class of pages decoding at once leaves the
server free to hear a Stop.

Wing: front ends (`clover_viz`), under `clover_viz.state`. Every session of a served explorer shares one
event loop: it runs each session's periodic tick (drain the decode's events, redraw the figures) and
handles every click. Measured with 4 pages decoding 2,048 tokens each on 2 cores
(``benchmarks/stop_under_load.py``): when each session redrew on every tick, the loop was saturated, a
Stop click waited in it for 16-70 s, and the decode worker -- never waiting for its page -- raced hundreds
of forwards ahead of what the page showed, all of which the stopped run kept. Two rules fix both:

* `DrawPacer` (per session): while a decode runs, redraw again only after ``DRAW_LOAD_FACTOR x live
  decodes x`` what redraws cost (running mean), at most `MAX_DRAW_INTERVAL_S` apart, so all sessions'
  redraws take about 1 / DRAW_LOAD_FACTOR of the loop; a finished (or stopped) run is drawn at once.
* `RunPace` (per decode, the served app only): after each forward the worker waits while an earlier
  forward has gone undrawn for longer than one refresh (`DrawPacer.window_s`), so it runs at most about
  one refresh ahead of its page -- never slower while redraws keep their schedule. A Stop keeps what
  the page showed plus the forward in flight: the forwards made past the page are held back and cut
  (`clover_viz.runs.kept_at_stop`, ``_Run.held``). The time spent waiting is not decode time:
  `RunPace.waited_s` is taken out of the run's wall time (its tokens/s stays the model's).

The process's decode workers (`_Run`, `_LIVE_RUNS`, `live_decodes`, the exit hook that cancels them) live
here too: pacing counts them.

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_pacing.py -q``
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
import time
import weakref
from dataclasses import dataclass

DRAW_LOAD_FACTOR = 3.0
"""Redraw spacing while decoding, in units of ``live decodes x mean redraw cost`` (module docstring)."""

MAX_DRAW_INTERVAL_S = 1.0
"""The longest a decoding session goes without a redraw (seconds)."""

PACE_S = 0.1
"""One tick of the served app (``clover_viz.explorer.TICK_MS``), seconds: the least a forward may stay
undrawn before a paced decode waits for its page (`RunPace`)."""


class RunPace:
    """One decode's forwards: ended (worker thread) and drawn (UI thread), and the worker's wait.

    Args:
        paced: wait for the page (the served app); False (notebooks, scripts, tests that drain when
            they like): never wait, only count.
        cancel: the run's cancel event; a set event ends any wait at once.
    """

    def __init__(self, paced: bool, cancel: threading.Event) -> None:
        self.paced, self.cancel = paced, cancel
        self.ended_at: list[float] = []  # monotonic time each forward's event was handed over
        self.drawn = 0  # forwards drained and drawn by the UI thread
        self.waited_s = 0.0  # seconds the worker waited for the page
        self.window_s = PACE_S  # how long a forward may stay undrawn: one refresh (`DrawPacer.window_s`)
        self._cond = threading.Condition()

    def forward_ended(self) -> None:
        """Worker thread, after handing a forward's event over: wait (paced only) while an earlier
        forward has been undrawn for more than `window_s` (one refresh), or until the run is cancelled."""
        with self._cond:
            self.ended_at.append(time.monotonic())
            if not self.paced:
                return
            t0, earlier = time.monotonic(), len(self.ended_at) - 1  # this forward's own draw is not awaited
            while (not self.cancel.is_set() and self.drawn < earlier
                   and time.monotonic() - self.ended_at[self.drawn] > self.window_s):
                self._cond.wait(0.05)
            self.waited_s += time.monotonic() - t0

    def forwards_drawn(self, n: int) -> None:
        """UI thread: ``n`` more forwards were drained and drawn."""
        if n:
            with self._cond:
                self.drawn += n
                self._cond.notify_all()


class DrawPacer:
    """When a decoding session next redraws (module docstring), from what its redraws cost."""

    def __init__(self) -> None:
        self.next_at = 0.0  # monotonic seconds
        self.cost_s = 0.0  # running mean of a redraw's cost
        self.interval_s = 0.0  # seconds between redraws while decoding

    def due(self) -> bool:
        """Whether a tick now may drain and redraw a running decode."""
        return time.monotonic() >= self.next_at

    def drew(self, cost_s: float, live_decodes: int) -> None:
        """A redraw took ``cost_s`` seconds with ``live_decodes`` decodes running in the process."""
        self.cost_s = 0.5 * (self.cost_s or cost_s) + 0.5 * cost_s
        self.interval_s = min(MAX_DRAW_INTERVAL_S, self.cost_s * DRAW_LOAD_FACTOR * max(1, live_decodes))
        self.next_at = time.monotonic() + self.interval_s

    @property
    def window_s(self) -> float:
        """One refresh (seconds): the redraw interval plus a tick (`PACE_S`). A paced decode may run this
        far ahead of its page (`RunPace.window_s`): as long as redraws keep their schedule it never
        waits, and when the server falls behind it stops running ahead."""
        return self.interval_s + PACE_S


@dataclass(eq=False)  # identity equality: hashable, so `_LIVE_RUNS` can hold it
class _Run:
    """One decode in a worker thread."""

    run_id: int
    cancel: threading.Event
    thread: threading.Thread | None = None
    superseded: bool = False
    user_stopped: bool = False
    kind: str = "decode"  # or "branch" (`clover_viz.session_branches`)
    restore: tuple = (None, None, 0)  # (trace, previous, position) shown again if it fails before its first event
    step_times: list = dataclasses.field(default_factory=list)
    pace: RunPace | None = None  # forwards ended / drawn, the wait for the page (`clover_viz.session_pacing`)
    held: list = dataclasses.field(default_factory=list)  # events after a Stop, until its end (`runs.kept_at_stop`)
    dropped: int = 0  # forwards made after the Stop beyond the kept one: not kept
    page_shown: int | None = None  # forwards the page had drawn at its Stop (`ExplorerState.stop`)


_LIVE_RUNS: "weakref.WeakSet[_Run]" = weakref.WeakSet()  # decode workers of every session in this process


def live_decodes() -> int:
    """Decode workers running in this process now (every session's)."""
    return sum(1 for r in list(_LIVE_RUNS) if r.thread is not None and r.thread.is_alive())


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
