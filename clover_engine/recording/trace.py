"""Trace: a recorder of decoder events that saves, loads and feeds the front ends.
Wing ``recording`` (the ground floor: imports no backbone).

A `Trace` is itself a hook (``decoder.add_hook(trace)``): every `BlockStart`,
`StepEvent`, `BlockEnd` and `DecodeEnd` it is called with is kept, the step
events in columnar form (one Python list per `StepEvent` field, arrays kept
per row because the last block can be shorter). It stores the run's decode
config, model id, prompt and a vocabulary ``{token id: text}`` for every token
it saw, so a trace recorded on a GPU replays on a laptop without the model or
the tokenizer (docs/architecture.md §6).

On disk (``Trace.save``) a trace is one Arrow table, one row per `StepEvent`, written as
Parquet or Arrow IPC: the format, its schema metadata and its checks are
`clover_engine.recording.trace_files` (which also holds `FORMAT_VERSION` and `trace_format`).

The views' converse questions (which step wrote each slot, with what confidence) are
answered by `Trace.slot_index` (`clover_engine.recording.slot_index.SlotIndex`, kept and extended as the
trace grows). The recording model's config is ``meta["model_config"]`` as recorded (a dict); its
Clover config is `clover_engine.backbones.clover.config.recorded_clover_config` (this wing builds no
backbone config).

Shapes: L slots in a block, N layers, K top candidates per slot, S steps in the
trace, T generated tokens.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_trace.py -q``
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from clover_engine.recording.events import BlockEnd, BlockStart, DecodeEnd, StepEvent
from clover_engine.recording.slot_index import SlotIndex
from clover_engine.recording.trace_files import (
    _ARRAY_FIELDS,
    _FLOAT_FIELDS,
    _INT_FIELDS,
    _OPTIONAL_FLOAT_FIELDS,
    _STEP_FIELDS,
    _dumps,
    encode_metadata,
    read_blocks,
    read_columns,
    read_metadata,
    read_table,
    steps_table,
    write_table,
)

# StepEvent fields whose arrays hold token ids (-1 = none), for the vocabulary.
_TOKEN_FIELDS = ("tokens", "candidate", "top_tokens", "previous_tokens")



def cut_after_forwards(events: Sequence[BlockStart | StepEvent | BlockEnd | DecodeEnd], n_steps: int) -> int:
    """How many of ``events`` (in decode order) a run keeps up to its ``n_steps``-th `StepEvent`: that
    forward and a `BlockEnd` right after it, never a `BlockStart` or `DecodeEnd` after it."""
    n = 0
    for i, event in enumerate(events):
        if isinstance(event, StepEvent):
            if n == n_steps:
                return i
            n += 1
        elif isinstance(event, (BlockStart, DecodeEnd)) and n == n_steps:
            return i
    return len(events)


class Trace:
    """Records one decode's events; the object every front end draws from.

    Args:
        decode_config: the decode settings of the run (JSON-serialisable mapping,
            or a dataclass, converted with `dataclasses.asdict`).
        model_id: name or path of the model that produced the trace.
        token_text: ``fn(token_id) -> str``; called once per distinct token id
            seen (prompt, block contents, candidates, top-K, firings) to fill
            `vocab`. Not stored.
        prompt_ids: the prompt's token ids.
        meta: free-form JSON-serialisable notes (device, date, dtype, ...).

    Use it as a hook::

        trace = Trace(decode_config=cfg, model_id="clover-test", token_text=tok.decode_one)
        with decoder.hooks(trace):
            decoder.generate(prompt_ids)
        trace.save("runs/example.parquet")

    Raises:
        TypeError: if ``decode_config`` or ``meta`` cannot be written as JSON
            (checked here, not at the end of a long run in `save`).
    """

    def __init__(
        self,
        decode_config: Mapping[str, Any] | Any | None = None,
        model_id: str | None = None,
        token_text: Callable[[int], str] | None = None,
        prompt_ids: Iterable[int] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if dataclasses.is_dataclass(decode_config) and not isinstance(decode_config, type):
            decode_config = dataclasses.asdict(decode_config)
        self.decode_config: dict[str, Any] | None = None if decode_config is None else dict(decode_config)
        self.model_id = model_id
        self.prompt_ids: list[int] | None = None if prompt_ids is None else [int(t) for t in prompt_ids]
        self.meta: dict[str, Any] = {} if meta is None else dict(meta)
        for name in ("decode_config", "meta"):
            try:
                _dumps(getattr(self, name))
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"Trace({name}=...) must be JSON-serialisable so it can be saved with the trace; "
                    f"got {exc}. Pass plain numbers, strings, lists and dicts."
                ) from None
        self._token_text = token_text
        self._vocab: dict[int, str] = {}
        # token-id arrays seen but not yet looked up: `vocab` reads them when it is first read after
        # them (the texts are needed to draw or save, not per event: ~40 us a forward saved)
        self._seen_ids: list[np.ndarray] = []
        self._seen_learned = 0
        self._columns: dict[str, list[Any]] = {name: [] for name in _STEP_FIELDS}
        self._block_starts: list[BlockStart] = []
        self._block_ends: list[BlockEnd] = []
        self._decode_end: DecodeEnd | None = None
        self._steps_cache: list[StepEvent] = []
        self._slot_index: SlotIndex | None = None
        if self.prompt_ids:
            self._learn_tokens(np.asarray(self.prompt_ids, dtype=np.int64))

    # ------------------------------------------------------------------ recording

    def __call__(self, event: BlockStart | StepEvent | BlockEnd | DecodeEnd) -> None:
        """Record one event (the hook entry point).

        Raises:
            TypeError: for an object that is not one of the four event kinds.
            ValueError: for an event arriving after `DecodeEnd` (use one
                `Trace` per decode).
        """
        if self._decode_end is not None:
            raise ValueError(
                f"this Trace already holds a finished decode (DecodeEnd recorded); got {type(event).__name__} "
                "after it. Use a new Trace for each decode."
            )
        if isinstance(event, StepEvent):
            for name in _STEP_FIELDS:
                value = getattr(event, name)
                if name == "firings":
                    value = tuple(value)
                self._columns[name].append(value)
            self._learn_tokens(*(getattr(event, n) for n in _TOKEN_FIELDS))
            if event.firings:
                self._learn_tokens(np.array([f.token for f in event.firings], dtype=np.int64))
        elif isinstance(event, BlockStart):
            self._block_starts.append(event)
            self._learn_tokens(event.tokens)
        elif isinstance(event, BlockEnd):
            self._block_ends.append(event)
            self._learn_tokens(event.tokens)
        elif isinstance(event, DecodeEnd):
            self._decode_end = event
            self._learn_tokens(event.tokens)
        else:
            raise TypeError(
                "Trace records BlockStart, StepEvent, BlockEnd or DecodeEnd events; "
                f"got {type(event).__name__}. Register the Trace itself as the decoder hook."
            )

    @classmethod
    def from_events(cls, events: Iterable[BlockStart | StepEvent | BlockEnd | DecodeEnd], **kwargs: Any) -> "Trace":
        """Build a trace from an iterable of events; ``kwargs`` go to `Trace`."""
        trace = cls(**kwargs)
        for event in events:
            trace(event)
        return trace

    def split(self, n_steps: int) -> tuple["Trace", list[BlockStart | StepEvent | BlockEnd | DecodeEnd]]:
        """This run as it stood after its first ``n_steps`` forwards, and the events that came after.

        Returns:
            (a new `Trace` with the same settings, model id, prompt, metadata and token texts holding the
            events up to and including the ``n_steps``-th `StepEvent` -- a `BlockEnd` right after it
            included --, the later events in decode order). This trace is not changed.

        Raises:
            ValueError: if ``n_steps`` is negative.
        """
        if n_steps < 0:
            raise ValueError(f"n_steps must be >= 0 (forwards to keep), got {n_steps}")
        events = list(self.iter_events())
        cut = cut_after_forwards(events, n_steps)
        head = Trace.from_events(events[:cut], decode_config=self.decode_config, model_id=self.model_id,
                                 token_text=self._token_text, prompt_ids=self.prompt_ids, meta=self.meta)
        head._vocab.update(self._vocab)
        return head, events[cut:]

    @property
    def vocab(self) -> dict[int, str]:
        """``{token id: text}`` of every token id the trace holds (prompt, block contents,
        candidates, top-K, firings) when `token_text` was given, or as loaded from a file.

        Texts are looked up here, when the vocabulary is read, for the ids recorded since the
        last read -- not at every event. Safe while another thread records: ids appended during
        a read are looked up at the next one.
        """
        n = len(self._seen_ids)
        if self._seen_learned < n and self._token_text is not None:
            arrays = self._seen_ids[self._seen_learned:n]
            ids = np.concatenate([np.asarray(a, dtype=np.int64).ravel() for a in arrays]).tolist()
            for token_id in sorted(set(ids).difference(self._vocab)):  # new ids, in increasing order
                if token_id >= 0:
                    self._vocab[token_id] = str(self._token_text(token_id))
            self._seen_learned = n
        return self._vocab

    @vocab.setter
    def vocab(self, value: Mapping[int, str]) -> None:
        self._vocab = dict(value)

    def _learn_tokens(self, *arrays: np.ndarray) -> None:
        """Note token-id arrays whose texts `vocab` looks up when next read (arrays not mutated later)."""
        if self._token_text is not None:
            self._seen_ids.extend(arrays)

    def token_str(self, token_id: int) -> str:
        """Text of one token id: the stored vocabulary, else ``token_text``, else ``"<id>"``.

        ``-1`` (no candidate / padding in the top-K) gives ``""``.
        """
        token_id = int(token_id)
        if token_id < 0:
            return ""
        text = self._vocab.get(token_id)
        if text is None and self._token_text is not None:
            text = self._vocab[token_id] = str(self._token_text(token_id))
        return f"<{token_id}>" if text is None else text

    # ------------------------------------------------------------------ accessors

    def __len__(self) -> int:
        """Number of recorded steps (forwards)."""
        return len(self._columns["step_index"])

    def __repr__(self) -> str:
        return (
            f"Trace(model_id={self.model_id!r}, steps={len(self)}, blocks={len(self._block_starts)}, "
            f"finished={self._decode_end is not None})"
        )

    def step(self, i: int) -> StepEvent:
        """The ``i``-th recorded `StepEvent` (negative indices count from the end)."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"step index {i} out of range for a trace of {n} steps")
        i %= n
        kwargs = {name: self._columns[name][i] for name in _STEP_FIELDS}
        return StepEvent(**kwargs)

    @property
    def steps(self) -> list[StepEvent]:
        """All `StepEvent`s in order, rebuilt from the columns on first use (and after appends)."""
        for i in range(len(self._steps_cache), len(self)):
            self._steps_cache.append(self.step(i))
        return self._steps_cache

    @property
    def block_starts(self) -> list[BlockStart]:
        """The recorded `BlockStart` events, in order."""
        return list(self._block_starts)

    @property
    def block_ends(self) -> list[BlockEnd]:
        """The recorded `BlockEnd` events, in order."""
        return list(self._block_ends)

    @property
    def decode_end(self) -> DecodeEnd | None:
        """The `DecodeEnd` event, or None while the decode runs (or if it was never sent)."""
        return self._decode_end

    @property
    def blocks(self) -> list[dict[str, Any]]:
        """One dict per block, merging its start and end records, by block index.

        Keys: ``block_index``, ``position_start``, ``block_size``, ``length`` (L),
        ``prefilled`` ((L,) bool), ``start_tokens`` ((L,) int64), ``end_tokens``
        ((L,) int64, None if the block has not ended), ``n_steps`` (forwards on
        the block; counted from the steps while it runs), ``hit_eos``
        (None until it ended). Missing start fields are None.
        """
        starts = {b.block_index: b for b in self._block_starts}
        ends = {b.block_index: b for b in self._block_ends}
        steps_per_block: dict[int, int] = {}
        for b in self._columns["block_index"]:
            steps_per_block[b] = steps_per_block.get(b, 0) + 1
        out = []
        for index in sorted(set(starts) | set(ends) | set(steps_per_block)):
            start, end = starts.get(index), ends.get(index)
            known = start if start is not None else end
            out.append(
                {
                    "block_index": index,
                    "position_start": known.position_start if known is not None else None,
                    "block_size": start.block_size if start else None,
                    "length": start.length if start else (len(end.tokens) if end else None),
                    "prefilled": start.prefilled if start else None,
                    "start_tokens": start.tokens if start else None,
                    "end_tokens": end.tokens if end else None,
                    "n_steps": end.n_steps if end else steps_per_block.get(index, 0),
                    "hit_eos": end.hit_eos if end else None,
                }
            )
        return out

    def slot_index(self) -> SlotIndex:
        """This trace's `clover_engine.recording.slot_index.SlotIndex`: the steps of each block and, per slot,
        the step that wrote it, its confidence and kind.

        Built on first use and kept; extended in place when steps were recorded since the
        last call (block starts recorded since are taken in with the next step).
        """
        idx = self._slot_index
        if idx is None or idx.n > len(self):
            idx = self._slot_index = SlotIndex(self)
        elif idx.n < len(self):
            idx.extend(self)
        return idx

    def column(self, name: str) -> np.ndarray | list[Any]:
        """One `StepEvent` field over all steps.

        Returns:
            * integer fields: (S,) int64 array; ``wall_s``: (S,) float64 seconds;
            * ``bytes_read`` / ``flops`` / ``arithmetic_intensity``: (S,) float64
              with NaN where the cost model left None;
            * array fields: an (S, ...) array stacked over steps when every row
              has the same shape (e.g. ``state_norm`` -> (S, N)), else the list
              of per-step arrays (blocks of different length L);
            * ``firings``: list of tuples of `ProcessorFiring`.

        Raises:
            ValueError: for a name that is not a `StepEvent` field.
        """
        if name not in self._columns:
            raise ValueError(f"unknown StepEvent field {name!r}; expected one of {', '.join(_STEP_FIELDS)}")
        values = self._columns[name]
        if name in _INT_FIELDS:
            return np.asarray(values, dtype=np.int64)
        if name in _FLOAT_FIELDS:
            return np.asarray(values, dtype=np.float64)
        if name in _OPTIONAL_FLOAT_FIELDS:
            return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
        if name == "firings":
            return list(values)
        if any(v is None for v in values):  # a backbone without this observable (e.g. no experts): None rows
            return list(values)
        if values and len({np.shape(v) for v in values}) == 1:
            return np.stack(values)
        if not values:
            ndim, dtype = _ARRAY_FIELDS[name]
            return np.empty((0,) + (0,) * ndim, dtype=dtype)
        return list(values)

    @property
    def nfe(self) -> int:
        """Number of forwards: from `DecodeEnd` when recorded, else the step count."""
        return self._decode_end.nfe if self._decode_end is not None else len(self)

    @property
    def generated_tokens(self) -> np.ndarray:
        """(T,) int64 generated tokens.

        From `DecodeEnd` when recorded (cut before the first EOS); otherwise the
        non-prefilled slots of the ended blocks, in order (EOS padding included,
        since the trace does not know the EOS id).
        """
        if self._decode_end is not None:
            return np.asarray(self._decode_end.tokens, dtype=np.int64)
        starts = {b.block_index: b for b in self._block_starts}
        parts = []
        for end in sorted(self._block_ends, key=lambda b: b.block_index):
            tokens = np.asarray(end.tokens, dtype=np.int64)
            start = starts.get(end.block_index)
            if start is not None:
                tokens = tokens[~np.asarray(start.prefilled, dtype=bool)]
            parts.append(tokens)
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def summary(self) -> dict[str, Any]:
        """Run totals: the `DecodeEnd` numbers, or the same computed from the steps.

        Keys: ``nfe``, ``n_tokens`` (T), ``tokens_per_forward``, ``n_forced``,
        ``wall_s`` (seconds), ``stop_reason`` (None while unfinished),
        ``bytes_read`` and ``flops`` (None unless every step has a cost), and
        ``n_blocks``.
        """
        end = self._decode_end
        n_tokens = int(len(self.generated_tokens))
        if end is not None:
            out = {
                "nfe": int(end.nfe),
                "n_tokens": n_tokens,
                "tokens_per_forward": float(end.tokens_per_forward),
                "n_forced": int(end.n_forced),
                "wall_s": float(end.wall_s),
                "stop_reason": end.stop_reason,
                "bytes_read": None if end.bytes_read is None else float(end.bytes_read),
                "flops": None if end.flops is None else float(end.flops),
            }
        else:
            nfe = len(self)

            def total(name: str) -> float | None:
                values = self._columns[name]
                return None if not values or any(v is None for v in values) else float(sum(values))

            out = {
                "nfe": nfe,
                "n_tokens": n_tokens,
                "tokens_per_forward": n_tokens / nfe if nfe else math.nan,
                "n_forced": int(sum(int(np.sum(f)) for f in self._columns["forced"])),
                "wall_s": float(sum(self._columns["wall_s"])),
                "stop_reason": None,
                "bytes_read": total("bytes_read"),
                "flops": total("flops"),
            }
        out["n_blocks"] = len({b.block_index for b in self._block_starts} | {b.block_index for b in self._block_ends})
        return out

    def iter_events(self) -> Iterator[BlockStart | StepEvent | BlockEnd | DecodeEnd]:
        """Replay the events in decode order: per block start, steps, end; then `DecodeEnd`.

        Feeding them to another hook reproduces what it would have seen live.
        """
        starts = {b.block_index: b for b in self._block_starts}
        ends = {b.block_index: b for b in self._block_ends}
        steps_by_block: dict[int, list[StepEvent]] = {}
        for event in self.steps:
            steps_by_block.setdefault(event.block_index, []).append(event)
        for index in sorted(set(starts) | set(ends) | set(steps_by_block)):
            if index in starts:
                yield starts[index]
            yield from steps_by_block.get(index, [])
            if index in ends:
                yield ends[index]
        if self._decode_end is not None:
            yield self._decode_end

    def to_pandas(self) -> Any:
        """The step rows as a `pandas.DataFrame` (S rows, one column per `StepEvent` field).

        Scalar fields are numeric columns (cost fields float64 with NaN for
        None); array fields and ``firings`` are object columns holding the
        per-step NumPy arrays / tuples.

        Raises:
            ImportError: if pandas is not installed.
        """
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError(
                "Trace.to_pandas needs pandas; install it with `pip install pandas` "
                "(or use trace.column(name) / trace.steps, which do not)."
            ) from exc
        data: dict[str, Any] = {}
        for name in _STEP_FIELDS:
            if name in _ARRAY_FIELDS or name == "firings":
                column = np.empty(len(self), dtype=object)
                for i, value in enumerate(self._columns[name]):  # element-wise: equal shapes must not broadcast
                    column[i] = value
                data[name] = column
            else:
                data[name] = self.column(name)
        return pd.DataFrame(data, index=pd.RangeIndex(len(self), name="step"))

    # ------------------------------------------------------------------ files

    def to_arrow(self) -> Any:
        """The trace as a `pyarrow.Table` with the clover schema metadata (`clover_engine.recording.trace_files`)."""
        return steps_table(self._columns).replace_schema_metadata(self._metadata())

    def _metadata(self) -> dict[bytes, bytes]:
        return encode_metadata(self._block_starts, self._block_ends, self._decode_end, self.decode_config,
                               self.model_id, self.prompt_ids, self.vocab, self.meta)

    def save(self, path: str | Path, format: str | None = None) -> Path:
        """Write the trace to ``path`` (parent folders created) and return it; ``format`` (``"parquet"`` or
        ``"arrow"``, default from the suffix) and the errors as `clover_engine.recording.trace_files.write_table`."""
        return write_table(self.to_arrow(), path, format)

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a trace written by `save` (Parquet or Arrow IPC, told apart by content).

        The returned trace has no ``token_text``; `token_str` uses the stored
        vocabulary.

        Raises:
            FileNotFoundError: if ``path`` does not exist.
            ValueError: if the file is neither Parquet nor Arrow IPC, lacks the
                clover metadata, or has another ``format_version``.
        """
        return cls._from_arrow(read_table(path), source=str(Path(path)))

    @classmethod
    def _from_arrow(cls, table: Any, source: str = "<table>") -> "Trace":
        fields = read_metadata(table, source)
        trace = cls(
            decode_config=fields.get("decode_config"),
            model_id=fields.get("model_id"),
            prompt_ids=fields.get("prompt_ids"),
            meta=fields.get("meta"),
        )
        trace.vocab = {int(k): v for k, v in (fields.get("vocab") or {}).items()}
        trace._columns = read_columns(table, source)
        trace._block_starts, trace._block_ends, trace._decode_end = read_blocks(fields)
        return trace
