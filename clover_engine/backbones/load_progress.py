"""Progress and cancellation of a model load: bytes downloaded and read, and a way to give it up.

Wing: ``backbones``.

A front end that loads a model in a thread (the served explorer) or in a notebook cell wants to
say how far the load has got and to give it up when the user presses Stop. The engine's loaders
report to the `LoadProgress` watching the current thread, if any (`watching`):

* `clover_engine.backbones.hub.hub_snapshot` reports a download's bytes (huggingface_hub's
  ``snapshot_download`` drives a tqdm class of ours: `download_bar`);
* `clover_engine.backbones.safetensors_shards.load_shards` (the lean loader of the hub families)
  and the Clover checkpoint reader report each tensor's bytes as they are read;
* loaders that hand the reading to transformers (``from_pretrained``: the SmolLM2 adapters, the
  causal LMs) call `checkpoint` between their phases.

Every report is also a cancellation point: when the watcher's ``should_stop`` answers True, it
raises `LoadCancelled` in the loading thread. The half-built model is then only referenced by
the frames the exception unwinds, so it is freed with them; nothing is cached.

No watcher (a script, the CLI without one, a test): every report is a no-op.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_load_progress.py -q``
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Callable, Iterator


class LoadCancelled(RuntimeError):
    """A model load given up at the caller's request (Stop, a closed tab): nothing was kept."""


@dataclass
class LoadProgress:
    """How far one model load has got; written by the loading thread, read by any other.

    Attributes:
        should_stop: asked at every report; True gives the load up (`LoadCancelled`).
        on_update: called after every report, in the thread that reports (e.g. a tqdm bar's refresh).
        phase: what the load does now: ``"downloading"``, ``"reading weights"``, ``"building"``, ``""``.
        done_bytes / total_bytes: of the phase (int, bytes; total 0 while unknown).
        estimate: what the load was admitted on, for a status line beside its bytes (the served explorer's
            memory rule: "needs about 14.9 GB ... the server has 18.5 GB free"); "" when nothing was estimated.
    """

    should_stop: Callable[[], bool] = lambda: False
    on_update: Callable[["LoadProgress"], None] | None = None
    phase: str = ""
    done_bytes: int = 0
    total_bytes: int = 0
    estimate: str = ""

    @property
    def fraction(self) -> float | None:
        """done / total of the current phase in [0, 1], None while the total is unknown."""
        if self.total_bytes <= 0:
            return None
        return min(self.done_bytes / self.total_bytes, 1.0)

    def describe(self) -> str:
        """One phrase for a status line: ``"reading weights: 41% of 2.7 GB"``, ``"downloading: 12 MB"``, ``""``."""
        if not self.phase:
            return ""
        frac = self.fraction
        if frac is None:
            return f"{self.phase}: {_gb(self.done_bytes)}" if self.done_bytes else self.phase
        return f"{self.phase}: {frac:.0%} of {_gb(self.total_bytes)}"

    def check(self) -> None:
        """Raise `LoadCancelled` when the watcher asks to stop.

        Raises:
            LoadCancelled: ``should_stop()`` is True.
        """
        if self.should_stop():
            raise LoadCancelled(f"the load was cancelled ({self.describe() or 'before it read anything'})")

    def _updated(self) -> None:
        if self.on_update is not None:
            self.on_update(self)
        self.check()


def _gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.0f} MB"


_LOCAL = threading.local()


def current() -> LoadProgress | None:
    """The `LoadProgress` watching this thread's load (None outside `watching`)."""
    return getattr(_LOCAL, "progress", None)


@contextlib.contextmanager
def watching(progress: LoadProgress) -> Iterator[LoadProgress]:
    """Make ``progress`` receive the reports of the loads this thread runs inside the block
    (nested: the inner watcher wins, the outer is restored after)."""
    outer = current()
    _LOCAL.progress = progress
    try:
        yield progress
    finally:
        _LOCAL.progress = outer


def begin(phase: str, total_bytes: int = 0) -> None:
    """A loader starts a phase of ``total_bytes`` (0: unknown) -- resets the count; a cancellation point.

    Raises:
        LoadCancelled: the watcher asks to stop.
    """
    p = current()
    if p is not None:
        p.phase, p.done_bytes, p.total_bytes = phase, 0, int(total_bytes)
        p._updated()


def advance(nbytes: int) -> None:
    """A loader has read (or downloaded) ``nbytes`` more of its phase; a cancellation point.

    Raises:
        LoadCancelled: the watcher asks to stop.
    """
    p = current()
    if p is not None:
        p.done_bytes += int(nbytes)
        p._updated()


def checkpoint() -> None:
    """A cancellation point between phases of a loader that reports no bytes (transformers' reading).

    Raises:
        LoadCancelled: the watcher asks to stop.
    """
    p = current()
    if p is not None:
        p.check()


@contextlib.contextmanager
def shown_as_bar(delay_s: float = 0.5) -> Iterator[LoadProgress]:
    """Watch this thread's loads inside the block with a tqdm bar per phase (``tqdm.auto``: a widget in
    a notebook, text on stderr in a script), shown only for a load that lasts ``delay_s`` (a model
    already cached draws nothing). Interrupting the kernel (Jupyter's stop button) or Ctrl-C ends the
    load at its next report with ``KeyboardInterrupt``; the half-built model goes with the frames it
    unwinds."""
    # local: tqdm.auto picks its notebook or text form at import; only a caller that shows a bar needs it
    from tqdm.auto import tqdm

    bars: dict[str, object] = {}

    def update(p: LoadProgress) -> None:
        bar = bars.get(p.phase)
        if bar is None:
            for old in bars.values():
                old.close()
            bars.clear()
            bar = bars[p.phase] = tqdm(total=p.total_bytes or None, unit="B", unit_scale=True,
                                       desc=f"loading: {p.phase}", delay=delay_s, leave=False)
        if p.total_bytes and bar.total != p.total_bytes:
            bar.total = p.total_bytes
        bar.update(p.done_bytes - bar.n)

    progress = LoadProgress(on_update=update)
    try:
        with watching(progress):
            yield progress
    finally:
        for bar in bars.values():
            bar.close()


def download_bar(progress: LoadProgress) -> type:
    """A tqdm class for huggingface_hub's ``snapshot_download(tqdm_class=...)`` that also reports to
    ``progress``: its byte bars (huggingface_hub 2.x sums every file's bytes into one bar whose total
    grows as files start; the separate network-transfer bar is not counted twice) make one
    ``"downloading"`` phase, and every update of any of its bars is a cancellation point
    (`LoadCancelled` ends the download; files already complete stay in the cache and a partial one
    is resumed by the next download). It subclasses huggingface_hub's own tqdm, so
    ``HF_HUB_DISABLE_PROGRESS_BARS`` still hides the bars on stderr."""
    # local: huggingface_hub reads HF_HOME / HF_HUB_OFFLINE when imported -- at the first download, not at startup
    from huggingface_hub.utils import tqdm as hub_tqdm

    bars: list = []

    class _DownloadBar(hub_tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.bytes_seen = int(kwargs.get("initial") or 0)  # a disabled tqdm (no bars wanted) counts nothing
            desc = str(kwargs.get("desc") or "")
            if kwargs.get("unit") == "B" and not desc.startswith("Downloading bytes"):
                bars.append(self)

        def update(self, n=1):
            out = super().update(n)
            if self in bars:
                self.bytes_seen += int(n or 0)
                progress.phase = "downloading"
                progress.done_bytes = sum(b.bytes_seen for b in bars)
                progress.total_bytes = int(sum(b.total or 0 for b in bars))
            progress._updated()
            return out

    return _DownloadBar


__all__ = ["LoadCancelled", "LoadProgress", "advance", "begin", "checkpoint", "current", "download_bar", "shown_as_bar",
           "watching"]
