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
  "cancelled"}`` when a new decode started first, ``{"status": "given up"}`` when Stop ended it (`stop_measuring`),
  ``{"status": "failed", "error": ...}`` when it could not run.

References are cached process-wide (`CAREFUL_REFERENCES`, per model, prompt and careful setting): the threshold
slider's next run on the same prompt is measured at once. A new decode, Stop or the session's end cancels the
measurement after its current forward; a cancelled reference is not cached.

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_careful_views.py -q``
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from clover_engine.decoding.careful import CarefulCancelled, CarefulReferences, agreement, careful_setting, is_careful
from clover_engine.decoding.frontier import DEFAULT_BLOCK_SIZES, DEFAULT_THRESHOLDS, frontier_grid, mark_pareto
from clover_engine.decoding.frontier import measure_frontier as measure_frontier_cells
from clover_engine.prompting import model_input
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
    _frontier_job: dict | None = None  # the frontier under way (`measure_frontier`)
    frontier: list = []  # the points of the last frontier measured (`clover_engine.decoding.frontier.FrontierPoint`)
    frontier_status: str = ""  # "measuring: 3 of 14 settings", "done: ...", "cancelled ..."

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
            live.meta["careful"] = {**agreement(answer, answer, own=True).to_dict(), "reference_nfe": int(end.nfe),
                                    "reference": answer}
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
                raise CarefulCancelled("the careful decode was cancelled")
            job["nfe"] = int(result.nfe)
            return [int(t) for t in result.tokens]

        def work() -> None:
            try:
                job["reference"] = CAREFUL_REFERENCES.reference(key, prompt_ids, setting, decode, cancel=cancel)
            except CarefulCancelled:
                job["cancelled"] = True
            except Exception as exc:  # noqa: BLE001  (reported on the UI thread by _poll_careful)
                job["error"] = f"{type(exc).__name__}: {exc}"

        job["thread"] = threading.Thread(target=work, name="clover-careful", daemon=True)
        self._careful_job = job
        job["thread"].start()

    @staticmethod
    def _careful_result(answer: list[int], reference: list[int], nfe: int | None = None) -> dict[str, Any]:
        return {**agreement(answer, reference).to_dict(), "reference_nfe": nfe if nfe is not None else len(reference),
                "reference": [int(t) for t in reference]}  # the careful answer's ids: the text view overlays it

    def _poll_careful(self) -> None:
        """UI thread (`tick`): count the measurement's forwards, or record its result in its run's trace; the same
        for the frontier under way."""
        self._poll_frontier()
        job = self._careful_job
        if job is None:
            return
        meta, live = job["trace"].meta, MEASURING.get(job["trace"])
        if job["thread"].is_alive():  # counted for the next redraw; no redraw of its own (a finished run stays still)
            if live is not None and live["done"] != job["done"]:
                MEASURING[job["trace"]] = {**live, "done": job["done"]}
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
        """A new run starts (`_start_run`): give up the measurement and the frontier under way and return the
        thread to join before its first forward (the frontier's, which joined the measurement's before it decoded;
        else the measurement's) -- two of them never run the model at once."""
        frontier = self._frontier_job["thread"] if self._frontier_job is not None else None
        self._cancel_careful()
        thread, self._careful_ending = self._careful_ending, None
        return frontier or thread

    # ------------------------------------------------------------------ the frontier of the prompt
    def measure_frontier(self, thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
                         block_sizes: Sequence[int] = DEFAULT_BLOCK_SIZES) -> bool:
        """Decode the current prompt over the frontier grid of the current setting in the background
        (`clover_engine.decoding.frontier`): its careful decode first, then ``thresholds`` x ``block_sizes`` (or the
        setting's own knobs); the points appear in `frontier` as they are decoded, `frontier_status` counts them,
        a new decode (or `cancel_frontier`) cancels it. Returns False (and says why in `error`) when there is no
        model or prompt, or a decode runs."""
        if self.running:
            self.error = "The frontier decodes the prompt many times: wait until the decode ends, or Stop it."
            return False
        loaded = self.load_model(adjust_mode=False)
        if loaded is None:
            return False
        try:
            setting = self.decode_config(loaded)
            cells = frontier_grid(setting, thresholds, block_sizes)
            own = getattr(type(setting), "DECODER", None) is not None
            decoder = (None if own else loaded.decoder) or decoder_for(loaded.model, loaded.tokenizer, setting)
            prompt_ids = decoder.encode_prompt(model_input(self.prompt, loaded.model).text)
        except (ValueError, TypeError) as exc:
            self.error = f"Cannot measure the frontier: {exc}"
            return False
        self._cancel_careful()
        self.cancel_frontier()
        before, self._careful_ending = self._careful_ending, None
        cancel = threading.Event()
        job: dict[str, Any] = {"cancel": cancel, "points": [], "n": len(cells), "setting": setting}

        def decode(cell: Any) -> Any:
            dec = decoder_for(loaded.model, loaded.tokenizer, cell) if getattr(type(cell), "DECODER", None) else decoder
            return dec.generate(prompt_ids, record_trace=True, cancel=cancel, config=cell)

        def work() -> None:
            try:
                if before is not None:
                    before.join()
                measure_frontier_cells(decode, setting, cells, cancel=cancel,
                                       progress=lambda i, n, point: job["points"].append(point))
            except Exception as exc:  # noqa: BLE001  (reported on the UI thread by _poll_careful)
                job["error"] = f"{type(exc).__name__}: {exc}"

        job["thread"] = threading.Thread(target=work, name="clover-frontier", daemon=True)
        self._frontier_job, self.frontier, self.frontier_status = job, [], f"measuring: 0 of {len(cells)} settings"
        self.error = ""
        job["thread"].start()
        return True

    def cancel_frontier(self) -> threading.Thread | None:
        """Stop the frontier under way after its current forward (the points so far stay); -> its thread, or None."""
        job = self._frontier_job
        if job is None:
            return None
        job["cancel"].set()
        self._frontier_job = None
        self.frontier = list(job["points"])
        mark_pareto(self.frontier)
        self.frontier_status = f"cancelled after {len(self.frontier)} of {job['n']} settings"
        return job["thread"]

    def _poll_frontier(self) -> None:
        job = self._frontier_job
        if job is None:
            return
        alive = job["thread"].is_alive()
        if len(job["points"]) != len(self.frontier) or not alive:
            self.frontier = list(job["points"])
            mark_pareto(self.frontier)
            self.frontier_status = f"measuring: {len(self.frontier)} of {job['n']} settings"
            if not alive:
                self._frontier_job = None
                self.frontier_status = (f"failed after {len(self.frontier)} settings: {job['error']}" if "error" in job
                                        else f"done: {len(self.frontier)} settings, "
                                             f"{sum(p.pareto for p in self.frontier)} on the Pareto front")
            self.trace_version += 1

    def wait_frontier(self, timeout: float = 300.0) -> bool:
        """Block until the frontier under way is measured (tests, scripts, the notebook); -> True when done."""
        job = self._frontier_job
        if job is not None:
            job["thread"].join(timeout)
        self._poll_frontier()
        return self._frontier_job is None

    def load_frontier_point(self, index: int) -> bool:
        """Show the run of the frontier's point ``index`` (a click on the frontier figure) as the run on display,
        its agreement with the careful decode on its card.

        Raises:
            IndexError: no such point (the message gives the range)."""
        if not 0 <= index < len(self.frontier):
            raise IndexError(f"frontier point {index} does not exist (0..{len(self.frontier) - 1})")
        point = self.frontier[index]
        trace = point.result.trace
        reference = [int(t) for t in self.frontier[0].result.tokens]  # the careful decode: the frontier's first cell
        trace.meta.update({"careful": {**point.agreement.to_dict(), "reference_nfe": self.frontier[0].nfe,
                                       "reference": reference},
                           "model_label": self.model_label, "prompt": self.prompt})
        return self.load_trace(trace, name=f"frontier: {point.label}")

    def _cancel_careful(self, status: str = "cancelled") -> None:
        """Give up the measurement and the frontier under way (a new decode, the session's end): each stops after its
        current forward; the measurement caches nothing, the frontier keeps its points so far."""
        self.cancel_frontier()
        job = self._careful_job
        if job is not None:
            self._careful_ending = job["thread"]
            job["cancel"].set()
            MEASURING.pop(job["trace"], None)
            job["trace"].meta["careful"] = {"status": status}
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
    def measuring(self) -> bool:
        """A careful decode or a frontier runs in the background (the page's Stop cancels it: `stop_measuring`)."""
        return self._careful_job is not None or self._frontier_job is not None

    def stop_measuring(self) -> bool:
        """Cancel the careful decode and the frontier under way, as Stop cancels a decode (after their current
        forward; the frontier keeps its points so far). -> False when nothing was measuring."""
        if not self.measuring:
            return False
        self._cancel_careful(status="given up")
        self.trace_version += 1
        return True

    @property
    def careful(self) -> dict[str, Any] | None:
        """The run on display's careful-decode record (``meta["careful"]``; module docstring), None when none."""
        return None if self.trace is None else (self.trace.meta or {}).get("careful") or MEASURING.get(self.trace)


__all__ = ["CAREFUL_REFERENCES", "SessionCareful"]
