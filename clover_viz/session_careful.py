"""What a run's speed cost in its answer: every finished decode measured against the same model's careful decode.

Wing: front ends (`clover_viz`), under `clover_viz.state`. `SessionCareful` is a mixin of
`clover_viz.state.ExplorerState`. When a decode ends on its own, the session decodes its careful decode -- the same
model, prompt and settings, one slot per forward (`clover_engine.decoding.careful.careful_setting`) -- in a
background thread, and records the answer's agreement with it in the run's trace (``meta["careful"]``, what the
number cards show in the app and the notebook `Explorer`, and what a saved trace replays):

* ``{"status": "measuring", "done": k, "of": n}`` while the careful decode runs (the card reads "measuring…"),
  kept beside the trace (`clover_viz.runs.MEASURING`), never in it;
* `clover_engine.decoding.careful.Agreement.to_dict` plus ``reference_nfe`` once it is done; a run that is its
  own careful decode (one slot per forward already, a drafter's ``verify``) is marked ``own`` without decoding;
* ``{"status": "stopped"}`` for a run stopped by the user (a partial answer is not measured), ``{"status":
  "cancelled"}`` when a new decode started first, ``{"status": "failed", "error": ...}`` when it could not run.

References are cached process-wide (`CAREFUL_REFERENCES`, per model, prompt and careful setting): the threshold
slider's next run on the same prompt is measured at once. A new decode, Stop or the session's end cancels the
measurement after its current forward; a cancelled reference is not cached.

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_careful_views.py -q``
"""

from __future__ import annotations

import threading
from typing import Any

from clover_engine.decoding.careful import CarefulReferences, agreement, careful_setting, is_careful
from clover_engine.decoding.samplers import decoder_for
from clover_engine.recording.events import StepEvent
from clover_viz.runs import MEASURING

CAREFUL_REFERENCES = CarefulReferences()
"""The careful decodes of this process, shared by its sessions (`clover_engine.decoding.careful.CarefulReferences`)."""


class SessionCareful:
    """The careful-decode half of `ExplorerState` (a mixin)."""

    measure_careful: bool = True  # measure every finished decode against its careful decode (False: never)
    _careful_for: tuple | None = None  # (loaded model, its setting, prompt ids, live trace) of the run under way
    _careful_job: dict | None = None  # the measurement under way: thread, cancel, trace, result box
    _careful_ending: threading.Thread | None = None  # a measurement given up, until the next run has joined it

    def _careful_arm(self, loaded: Any, setting: Any, prompt_ids: Any, live: Any) -> None:
        """A decode starts (`generate`): give up the previous run's measurement, remember what this one runs."""
        self._cancel_careful()
        self._careful_for = (loaded, setting, list(prompt_ids), live)

    def _measure_careful(self, end: Any) -> None:
        """UI thread, when the run's `DecodeEnd` has been recorded: start measuring it (module docstring)."""
        source, self._careful_for = self._careful_for, None
        if source is None or not self.measure_careful or self._closed:
            return
        loaded, setting, prompt_ids, live = source
        if live is not self.trace:
            return
        if end.stop_reason == "cancelled":
            live.meta["careful"] = {"status": "stopped"}
            return
        answer = [int(t) for t in end.tokens]
        if is_careful(setting):
            live.meta["careful"] = {**agreement(answer, answer, own=True).to_dict(), "reference_nfe": int(end.nfe)}
            return
        care = careful_setting(setting)
        key = (loaded.spec, loaded.label)
        cached = CAREFUL_REFERENCES.get(key, prompt_ids, setting)
        if cached is not None:
            live.meta["careful"] = self._careful_result(answer, cached)
            return
        cancel = threading.Event()
        job: dict[str, Any] = {"trace": live, "cancel": cancel, "answer": answer, "done": 0}
        budget = int(getattr(care, "canvas_length", None) or getattr(care, "max_new_tokens", 0) or 0)
        MEASURING[live] = {"status": "measuring", "done": 0, "of": budget}  # live only: a saved trace never holds it

        def count(ev: Any) -> None:
            if isinstance(ev, StepEvent):
                job["done"] += 1

        def decode(careful: Any) -> list[int]:
            own = getattr(type(careful), "DECODER", None) is not None  # an official sampler names its decoder
            decoder = (None if own else loaded.decoder) or decoder_for(loaded.model, loaded.tokenizer, careful)
            result = decoder.generate(prompt_ids, hooks=[count], record_trace=False, cancel=cancel, config=careful)
            if result.stop_reason == "cancelled":
                raise _Cancelled()
            job["nfe"] = int(result.nfe)
            return [int(t) for t in result.tokens]

        def work() -> None:
            try:
                job["reference"] = CAREFUL_REFERENCES.reference(key, prompt_ids, setting, decode)
            except _Cancelled:
                job["cancelled"] = True
            except Exception as exc:  # noqa: BLE001  (reported on the UI thread by _poll_careful)
                job["error"] = f"{type(exc).__name__}: {exc}"

        job["thread"] = threading.Thread(target=work, name="clover-careful", daemon=True)
        self._careful_job = job
        job["thread"].start()

    @staticmethod
    def _careful_result(answer: list[int], reference: list[int], nfe: int | None = None) -> dict[str, Any]:
        return {**agreement(answer, reference).to_dict(), "reference_nfe": nfe if nfe is not None else len(reference)}

    def _poll_careful(self) -> None:
        """UI thread (`tick`): count the measurement's forwards, or record its result in its run's trace."""
        job = self._careful_job
        if job is None:
            return
        meta, live = job["trace"].meta, MEASURING.get(job["trace"])
        if job["thread"].is_alive():
            if live is not None and live["done"] != job["done"]:
                MEASURING[job["trace"]] = {**live, "done": job["done"]}
                self.trace_version += 1
            return
        self._careful_job = None
        MEASURING.pop(job["trace"], None)
        if "reference" in job:
            meta["careful"] = self._careful_result(job["answer"], job["reference"], job.get("nfe"))
        elif "error" in job:
            meta["careful"] = {"status": "failed", "error": job["error"]}
        else:
            meta["careful"] = {"status": "cancelled"}
        self.trace_version += 1

    def _careful_gives_way(self) -> threading.Thread | None:
        """A new run starts (`_start_run`): give up the measurement under way and return its thread (or the one
        given up last), which the new run joins before its first forward -- the two never run the model at once."""
        self._cancel_careful()
        thread, self._careful_ending = self._careful_ending, None
        return thread

    def _cancel_careful(self) -> None:
        """Give up the measurement under way (a new decode, Stop, the session's end): it stops after its current
        forward and caches nothing."""
        job = self._careful_job
        if job is not None:
            self._careful_ending = job["thread"]
            job["cancel"].set()
            MEASURING.pop(job["trace"], None)
            job["trace"].meta["careful"] = {"status": "cancelled"}
            self._careful_job = None

    def wait_careful(self, timeout: float = 60.0) -> bool:
        """Block until the measurement under way has ended and is recorded (tests, scripts, the notebook);
        -> True when none is under way any more."""
        job = self._careful_job
        if job is not None:
            job["thread"].join(timeout)
        self._poll_careful()
        return self._careful_job is None

    @property
    def careful(self) -> dict[str, Any] | None:
        """The run on display's careful-decode record (``meta["careful"]``; module docstring), None when none."""
        return None if self.trace is None else (self.trace.meta or {}).get("careful") or MEASURING.get(self.trace)


class _Cancelled(Exception):
    """The careful decode was cancelled (nothing is cached)."""


__all__ = ["CAREFUL_REFERENCES", "SessionCareful"]
