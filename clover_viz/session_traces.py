"""Traces on disk for a session: opening a recorded trace for replay and saving the run on display.

Wing: front ends (`clover_viz`), under `clover_viz.state`. `SessionTraces` is a mixin of
`clover_viz.state.ExplorerState`:

* `load_trace` -- a path, the bytes of an upload, or a `Trace` in memory, shown as recorded;
  the settings take what the loaded model can run (`SessionSettings._take_trace_settings`)
  and the status line says what was and was not taken (`_settings_note`);
* `trace_bytes` -- the displayed run as the bytes of a .parquet / .arrow file (a download); when it is
  in the session's tree of branches (`clover_viz.session_branches`), the whole tree
  (`clover_engine.recording.branches.BranchTree.save`: a plain `Trace.load` still reads its original),
  and opening such a file restores the branches;
* `_trace_error` -- a file that is not a trace, said for the page (the user's file and the
  Open button, not a temporary path or the Python API).

Tests: ``.venv/bin/python -m pytest tests/apps/test_explorer_app.py tests/apps/test_explorer_newcomer.py -q``
"""

from __future__ import annotations

import io
import re
import tempfile
from pathlib import Path

import param

from clover_viz.limits import size_text
from clover_viz.runs import model_of
from clover_engine.recording.branches import BranchTree
from clover_engine.recording.trace import Trace


def _trace_error(label: str, path: Path | None, exc: BaseException) -> str:
    """A trace-loading error for the page: names the user's file and the Open button, not the
    temporary path it was read from nor the Python API."""
    detail = str(exc)
    if path is not None:
        detail = detail.replace(repr(str(path)), "the file").replace(str(path), "the file")
    if "is not a trace file" in detail:
        detail = "it is neither a Parquet nor an Arrow file: " + detail.split("found ", 1)[-1].split(". ")[0]
    elif "cannot be read" in detail:
        detail = "it looks like Parquet or Arrow but is damaged"
    else:  # a table without the explorer's metadata or columns: keep what is wrong, drop API advice
        detail = re.sub(r"\s*(Save traces with|Use|use) [\w.]+\(\)[^.;]*[.;]?", "", detail)
        detail = re.sub(r"[;,]?\s*re-save the trace", "", detail)
        detail = re.sub(r"(clover_engine\.recording\.trace\.|clover_engine\.trace\.)?Trace\.\w+\(\)", "the Save trace button", detail).strip().rstrip(".;,")
    if isinstance(exc, FileNotFoundError):
        return f"Trace not loaded: {label!r} was not found. Choose a trace file with the Open button."
    return (f"Trace not loaded: {label!r} is not a trace this explorer can replay ({detail}). Choose a .parquet "
            "or .arrow file saved with the 'Save trace' button, using the Open button.")


class SessionTraces:
    """The trace-file half of `ExplorerState` (a mixin; the parameters are declared there)."""

    # ------------------------------------------------------------------ traces on disk
    def load_trace(self, source: str | Path | bytes | Trace, name: str = "") -> bool:
        """Show a recorded trace for replay: a path or the bytes of a .parquet / .arrow file,
        or a `Trace` already in memory.

        The current run becomes `previous`; a running decode is cancelled. Returns False and sets
        `error` for a file that is not a trace. A file saved with branches (`trace_bytes` of a run in
        the session's tree) shows its original and makes its tree the session's `branches`.

        The rule for the settings (`_take_trace_settings`): a loaded trace is shown as recorded
        (its own model, settings and prompt, whatever model is loaded), and the settings -- what
        Generate decodes with next -- take over every setting of the trace that the loaded model
        can run and a control can show: block size, threshold, policy, memory mode, max new
        tokens, the repetition and EOS-bias processors, and the prompt (``meta["prompt"]``, else
        its prompt ids as text). Nothing is re-decoded. Generate always decodes with the loaded
        model, never the trace's. The status line lists the settings taken and those not taken
        (with why: a memory mode the loaded model cannot run, a value no control offers, a
        decoder field without a control), and names the model Generate decodes with -- and the
        trace's, when they differ.
        """
        tree: BranchTree | None = None
        if isinstance(source, Trace):
            loaded = source
        elif isinstance(source, (bytes, bytearray)) and self.max_upload_bytes is not None \
                and len(source) > self.max_upload_bytes:
            self.refuse_upload(name or "the uploaded file", len(source))
            return False
        else:
            label = name or ("the uploaded file" if isinstance(source, (bytes, bytearray)) else Path(source).name)
            path: Path | None = None
            try:
                if isinstance(source, (bytes, bytearray)):
                    with tempfile.TemporaryDirectory() as tmp:
                        path = Path(tmp) / "trace.bin"
                        path.write_bytes(bytes(source))
                        tree = BranchTree.load(path)
                else:
                    path = Path(source)
                    tree = BranchTree.load(source)
                    name = name or Path(source).name
                loaded = tree.root
            except (ValueError, FileNotFoundError, OSError, KeyError, TypeError) as exc:
                self.error = _trace_error(label, path, exc)
                return False
        if self._run is not None and self.running:
            self._run.superseded = True
            self._run.cancel.set()
        elif self.trace is not None:
            self.previous = self.trace
        self.error = ""
        self._quiet = True
        try:
            with param.parameterized.batch_call_watchers(self):
                taken, left = self._take_trace_settings(loaded)
                self.trace = loaded
                self.running = False
                self.playing = False
                self.n_steps = len(loaded)
                self.position = 0
                self.progress = 100
                self.trace_version += 1
                n_branches = len(tree) - 1 if tree is not None else 0
                if n_branches:
                    self._set_tree(tree)
                self.status = (f"loaded trace{' ' + name if name else ''}: {len(loaded)} steps from "
                               f"{model_of(loaded)}" + (f", with {n_branches} branch{'es' if n_branches > 1 else ''} "
                                                        "(the branch list shows them)" if n_branches else "")
                               + "; press play to replay. " + self._settings_note(loaded, taken, left))
        finally:
            self._quiet = False
        return True

    def refuse_upload(self, name: str, size_bytes: int) -> None:
        """Say that an upload over `max_upload_bytes` was not loaded (the page stays as it was); the
        browser calls this for a file it did not send (`clover_viz.panel_settings`)."""
        limit = self.max_upload_bytes or 0
        self.error = (f"Trace not loaded: {name!r} is {size_text(int(size_bytes))}; this server takes trace files "
                      f"up to {size_text(limit)}." + (" The run on display is unchanged." if self.trace is not None else ""))

    def _settings_note(self, trace: Trace, taken: list[str], left: list[str]) -> str:
        """The status line's account of `_take_trace_settings`: what was taken, what not, and the model
        Generate decodes with (naming the trace's too when they differ)."""
        button = self.generate_button
        note = f"Settings for {button} taken from the trace: {', '.join(taken) if taken else 'none'}"
        if left:
            note += f"; not taken: {'; '.join(left)}"
        loaded = self._loaded
        if loaded is not None:
            note += f". {button} decodes with the loaded model, {loaded.label}"
            if trace.model_id is not None and trace.model_id != loaded.model_id:
                note += f", not with the trace's model {model_of(trace)}"
        return note + "."

    def trace_bytes(self, format: str = "parquet") -> io.BytesIO:
        """The displayed trace as the bytes of a file (for a download); with its whole tree of branches
        when it is in `branches` (`BranchTree.save`: the file's own run is the tree's original).

        Raises:
            ValueError: when there is no trace to save.
        """
        if self.trace is None or len(self.trace) == 0:
            raise ValueError(f"there is no run to save yet: {self.generate_button} first")
        with tempfile.TemporaryDirectory() as tmp:
            tree = self.branches if self._node_of(self.trace) is not None and len(self.branches) > 1 else None
            path = (tree or self.trace).save(Path(tmp) / f"trace.{format}", format=format)
            return io.BytesIO(path.read_bytes())
