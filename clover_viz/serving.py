"""Process-wide behaviour of the served explorer (``panel serve apps/explorer.py``).

`exit_promptly_on_signals` makes the server end within `SHUTDOWN_GRACE_S` of SIGTERM or Ctrl-C.
Bokeh's own handler stops the event loop, and the process then waits for the decode threads
(`clover_viz.session_pacing._cancel_live_decodes`, an exit hook that lets a thread finish the forward it
is in rather than kill it inside a torch op). A decode checks its cancel flag only between
forwards, so one long forward -- a long prompt's prefill on SmolLM2, a slow machine -- kept a
stopped server alive for up to 10 s more. Here the signal cancels every decode at once and arms
a deadline: whatever still runs `SHUTDOWN_GRACE_S` later is abandoned with ``os._exit``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from clover_viz.session_pacing import _cancel_live_decodes

SHUTDOWN_GRACE_S = 2.0
"""Seconds from SIGTERM / SIGINT to the end of the served process, at most (plus a thread switch)."""

_installed: dict[int, Any] = {}  # signal number -> the handler ours replaced (chained to)
_deadline: threading.Thread | None = None


def _exit_after(grace_s: float) -> None:
    time.sleep(grace_s)
    print(f"clover explorer: still shutting down {grace_s:g} s after the signal (a decode inside a forward); "
          "exiting without waiting for it", file=sys.stderr, flush=True)
    os._exit(0)


def begin_shutdown(grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """Cancel every session's running decode and end the process ``grace_s`` seconds from now unless
    it has ended by then (idempotent: the first call sets the deadline).

    Args:
        grace_s: seconds the ordinary shutdown gets (>= 0).

    Raises:
        ValueError: ``grace_s`` negative.
    """
    global _deadline
    if grace_s < 0:
        raise ValueError(f"grace_s must be >= 0 seconds, got {grace_s}")
    _cancel_live_decodes(timeout_s=0.0)  # set every decode's cancel flag; join nothing
    if _deadline is None:
        _deadline = threading.Thread(target=_exit_after, args=(grace_s,), name="clover-shutdown-deadline",
                                     daemon=True)
        _deadline.start()


def _on_signal(signum: int, frame: Any) -> None:
    begin_shutdown()
    previous = _installed.get(signum)
    if callable(previous):  # Ctrl-C: Python's KeyboardInterrupt; SIGTERM under asyncio: its no-op
        previous(signum, frame)


def exit_promptly_on_signals(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> bool:
    """Install `begin_shutdown` as the first step of each signal's handler, chaining to the handler it
    replaces (Bokeh's SIGTERM shutdown still runs: asyncio is woken through its wakeup fd, not
    through this Python-level handler). Once per process; call it from the served app.

    Returns:
        True when installed (now or before); False off the main thread (``pn.serve(threaded=True)``,
        where the embedding program owns its signals) -- nothing is changed then.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    for signum in signals:
        if signum not in _installed:
            _installed[signum] = signal.getsignal(signum)
            signal.signal(signum, _on_signal)
    return True


__all__ = ["SHUTDOWN_GRACE_S", "begin_shutdown", "exit_promptly_on_signals"]
