"""Trace: a recorder of decoder events that saves, loads and feeds the front ends.

A `Trace` is itself a hook (``decoder.add_hook(trace)``): every `BlockStart`,
`StepEvent`, `BlockEnd` and `DecodeEnd` it is called with is kept, the step
events in columnar form (one Python list per `StepEvent` field, arrays kept
per row because the last block can be shorter). It stores the run's decode
config, model id, prompt and a vocabulary ``{token id: text}`` for every token
it saw, so a trace recorded on a GPU replays on a laptop without the model or
the tokenizer (docs/architecture.md §6).

On disk (``Trace.save``) a trace is one Arrow table, one row per `StepEvent`,
written as Parquet (``.parquet`` / ``.pq``) or as an Arrow IPC file
(``.arrow`` / ``.feather``):

* scalar fields are scalar columns (``bytes_read``, ``flops`` and
  ``arithmetic_intensity`` nullable: ``None`` stays ``None``);
* array fields are ``list<dtype>`` columns holding the flattened row, with the
  NumPy dtype kept (bool / int64 / float32, NaN preserved); the 2-D fields
  (``top_tokens``, ``top_probs`` (L, K) and ``memory_share`` (N, L)) add a
  ``<field>_shape`` ``list<int64>`` column;
* ``firings`` is ``list<struct<name, slot, token, value>>``;
* the revision columns ``rewritten``, ``remasked`` (``list<bool>``) and
  ``previous_tokens`` (``list<int64>``) were added later without a format change:
  a file without them loads as "nothing rewritten" (all False, all -1), which is
  what an accept-once decoder records anyway (`engine.recording.events.StepEvent`).

The schema metadata holds JSON under the keys ``format_version``
(`FORMAT_VERSION`), ``created_by`` (``"clover-explorer"``), ``decode_config``,
``model_id``, ``prompt_ids``, ``vocab``, ``blocks`` (the block start / end
records), ``decode_end`` and ``meta``.

The views' converse questions (which step wrote each slot, with what confidence) are
answered by `Trace.slot_index` (`engine.recording.slot_index.SlotIndex`, kept and extended as the
trace grows); `Trace.model_config` finds the recording model's config.

Shapes: L slots in a block, N layers, K top candidates per slot, S steps in the
trace, T generated tokens.

Tests: ``.venv/bin/python -m pytest tests/engine/test_trace.py -q``
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from engine.recording.events import BlockEnd, BlockStart, DecodeEnd, ProcessorFiring, StepEvent
from engine.recording.slot_index import SlotIndex

FORMAT_VERSION = 1
CREATED_BY = "clover-explorer"

_PARQUET_SUFFIXES = (".parquet", ".pq")
_ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")

_PARQUET_MAGIC = b"PAR1"
_ARROW_MAGIC = b"ARROW1"


def trace_format(path: str | Path) -> str:
    """The trace file format a path's suffix names: ``"parquet"`` (``.parquet``, ``.pq``) or
    ``"arrow"`` (``.arrow``, ``.feather``, ``.ipc``; case-insensitive).

    Raises:
        ValueError: any other suffix (the message lists the known ones).
    """
    suffix = Path(path).suffix.lower()
    if suffix in _PARQUET_SUFFIXES:
        return "parquet"
    if suffix in _ARROW_SUFFIXES:
        return "arrow"
    raise ValueError(f"cannot tell the trace format from the suffix of {str(path)!r}; expected one of "
                     f"{', '.join(_PARQUET_SUFFIXES + _ARROW_SUFFIXES)}, or pass format='parquet' / 'arrow'")


# StepEvent array fields -> (ndim, dtype used when the trace has no rows).
_ARRAY_FIELDS: dict[str, tuple[int, str]] = {
    "tokens": (1, "int64"),
    "masked_before": (1, "bool"),
    "confidence": (1, "float32"),
    "candidate": (1, "int64"),
    "top_tokens": (2, "int64"),
    "top_probs": (2, "float32"),
    "accepted": (1, "bool"),
    "forced": (1, "bool"),
    "eos_filled": (1, "bool"),
    "expert_union": (1, "int64"),
    "state_norm": (1, "float32"),
    "memory_share": (2, "float32"),
    "rewritten": (1, "bool"),
    "remasked": (1, "bool"),
    "previous_tokens": (1, "int64"),
}
# Array fields added after format_version 1 was fixed: a file may lack them; each missing row
# then gets the StepEvent default ("nothing rewritten"), shaped like the row's tokens.
_OPTIONAL_ARRAY_FIELDS = ("rewritten", "remasked", "previous_tokens")
_INT_FIELDS = ("block_index", "step_index", "position_start", "n_tokens_forward")
_FLOAT_FIELDS = ("wall_s",)
_OPTIONAL_FLOAT_FIELDS = ("bytes_read", "flops", "arithmetic_intensity")
_METADATA_KEYS = (
    "format_version",
    "created_by",
    "decode_config",
    "model_id",
    "prompt_ids",
    "vocab",
    "blocks",
    "decode_end",
    "meta",
)
_STEP_FIELDS = tuple(f.name for f in dataclasses.fields(StepEvent))
# StepEvent fields whose arrays hold token ids (-1 = none), for the vocabulary.
_TOKEN_FIELDS = ("tokens", "candidate", "top_tokens", "previous_tokens")

assert set(_STEP_FIELDS) == (
    set(_ARRAY_FIELDS) | set(_INT_FIELDS) | set(_FLOAT_FIELDS) | set(_OPTIONAL_FLOAT_FIELDS) | {"firings"}
), _STEP_FIELDS


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
        """This trace's `engine.recording.slot_index.SlotIndex`: the steps of each block and, per slot,
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

    def model_config(self) -> Any:
        """The `engine.backbones.clover.config.CloverConfig` of the model that recorded the trace, or None.

        Looked up from ``meta["model_config"]`` (None for any config with a ``backbone``
        field -- a transformers backbone, DiffusionGemma: they have no Clover config), else from ``model_id`` as
        a checkpoint directory holding ``config.json`` or a preset name. Never raises: a
        config that cannot be read gives None.
        """
        from engine.backbones.clover.config import CloverConfig

        cand = self.meta.get("model_config")
        if isinstance(cand, Mapping) and cand.get("backbone") is not None:
            return None  # a transformers backbone or DiffusionGemma: Clover configs have no backbone field
        if isinstance(cand, Mapping):
            try:
                return CloverConfig.from_dict(dict(cand))
            except (TypeError, ValueError):
                pass
        if not isinstance(self.model_id, str):
            return None
        try:
            p = Path(self.model_id)
            if (p / "config.json").is_file():
                return CloverConfig.from_json(p / "config.json")
            return CloverConfig.from_name(self.model_id)
        except (ValueError, TypeError, OSError, KeyError, json.JSONDecodeError):
            return None

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
        """The trace as a `pyarrow.Table` with the clover schema metadata (see module docstring)."""
        import pyarrow as pa

        n = len(self)
        arrays: dict[str, Any] = {}
        for name in _STEP_FIELDS:
            values = self._columns[name]
            if name in _INT_FIELDS:
                arrays[name] = pa.array(values, type=pa.int64())
            elif name in _FLOAT_FIELDS or name in _OPTIONAL_FLOAT_FIELDS:
                arrays[name] = pa.array([None if v is None else float(v) for v in values], type=pa.float64())
            elif name == "firings":
                arrays[name] = pa.array(
                    [[dataclasses.asdict(f) for f in row] for row in values],
                    type=_FIRING_TYPE(),
                )
            else:
                ndim, default_dtype = _ARRAY_FIELDS[name]
                nulls = [v is None for v in values]  # None = not applicable to this model: a null row
                rows = [np.zeros((0,) * ndim, default_dtype) if v is None else np.asarray(v) for v in values]
                bad = [(i, r.shape) for i, r in enumerate(rows) if r.ndim != ndim]
                if bad:
                    i, shape = bad[0]
                    raise ValueError(f"StepEvent.{name} should be {ndim}-D; step {i} has shape {shape}")
                real = [r for r, null in zip(rows, nulls) if not null]
                dtype = np.result_type(*real) if real else np.dtype(default_dtype)
                if rows:
                    flat = np.concatenate([r.ravel() for r in rows]).astype(dtype, copy=False)
                else:
                    flat = np.empty(0, dtype)
                offsets = np.zeros(n + 1, dtype=np.int32)
                np.cumsum([r.size for r in rows], out=offsets[1:])
                arrays[name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat),
                                                        mask=pa.array(nulls, type=pa.bool_()) if any(nulls) else None)
                if ndim > 1:
                    arrays[name + "_shape"] = pa.array([None if null else list(r.shape) for r, null in zip(rows, nulls)],
                                                       type=pa.list_(pa.int64()))
        table = pa.table(arrays)
        return table.replace_schema_metadata(self._metadata())

    def _metadata(self) -> dict[bytes, bytes]:
        blocks = {
            "starts": [
                {
                    "block_index": b.block_index,
                    "position_start": b.position_start,
                    "block_size": b.block_size,
                    "length": b.length,
                    "prefilled": _encode_array(b.prefilled),
                    "tokens": _encode_array(b.tokens),
                }
                for b in self._block_starts
            ],
            "ends": [
                {
                    "block_index": b.block_index,
                    "position_start": b.position_start,
                    "tokens": _encode_array(b.tokens),
                    "n_steps": b.n_steps,
                    "hit_eos": b.hit_eos,
                }
                for b in self._block_ends
            ],
        }
        end = self._decode_end
        decode_end = None
        if end is not None:
            decode_end = {f.name: getattr(end, f.name) for f in dataclasses.fields(end)}
            decode_end["tokens"] = _encode_array(end.tokens)
        fields = {
            "format_version": FORMAT_VERSION,
            "created_by": CREATED_BY,
            "decode_config": self.decode_config,
            "model_id": self.model_id,
            "prompt_ids": self.prompt_ids,
            "vocab": {str(k): v for k, v in sorted(self.vocab.items())},
            "blocks": blocks,
            "decode_end": decode_end,
            "meta": self.meta,
        }
        assert tuple(fields) == _METADATA_KEYS, tuple(fields)
        return {k.encode(): _dumps(v).encode() for k, v in fields.items()}

    def save(self, path: str | Path, format: str | None = None) -> Path:
        """Write the trace to ``path`` and return it.

        Args:
            path: destination; parent folders are created.
            format: ``"parquet"`` or ``"arrow"`` (Arrow IPC file, what Feather v2
                is); default from the suffix: ``.parquet``/``.pq`` or
                ``.arrow``/``.feather``/``.ipc``.

        Raises:
            ValueError: for an unknown suffix or format.
        """
        path = Path(path)
        if format is None:
            format = trace_format(path)
        if format not in ("parquet", "arrow"):
            raise ValueError(f"format must be 'parquet' or 'arrow', got {format!r}")
        table = self.to_arrow()
        path.parent.mkdir(parents=True, exist_ok=True)
        if format == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, path)
        else:
            import pyarrow as pa

            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
        return path

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
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no trace file at {str(path)!r}")
        with open(path, "rb") as f:
            head = f.read(8)
        if head[:4] == _PARQUET_MAGIC:
            import pyarrow.parquet as pq

            try:
                table = pq.read_table(path)
            except Exception as exc:
                raise ValueError(
                    f"{str(path)!r} starts like Parquet but cannot be read ({exc}); re-save the trace"
                ) from exc
        elif head[:6] == _ARROW_MAGIC:
            import pyarrow as pa

            try:
                with pa.memory_map(str(path), "r") as source:
                    table = pa.ipc.open_file(source).read_all()
            except Exception as exc:
                raise ValueError(
                    f"{str(path)!r} starts like Arrow IPC but cannot be read ({exc}); re-save the trace"
                ) from exc
        else:
            raise ValueError(
                f"{str(path)!r} is not a trace file: expected Parquet (starts with b'PAR1') or an Arrow IPC "
                f"file (starts with b'ARROW1'), found first bytes {head!r}. Save traces with Trace.save()."
            )
        return cls._from_arrow(table, source=str(path))

    @classmethod
    def _from_arrow(cls, table: Any, source: str = "<table>") -> "Trace":
        raw = table.schema.metadata or {}
        meta = {k.decode(errors="replace"): v for k, v in raw.items()}
        if "format_version" not in meta or "created_by" not in meta:
            raise ValueError(
                f"{source} has no clover-explorer metadata (expected schema metadata keys 'format_version' and "
                f"'created_by', found {sorted(meta) or 'none'}); only files written by Trace.save() can be loaded."
            )
        try:  # only our keys: Parquet / pandas may add their own (b"ARROW:schema", b"pandas")
            fields = {k: json.loads(meta[k]) for k in _METADATA_KEYS if k in meta}
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}: trace metadata is not valid JSON ({exc}); re-save the trace") from exc
        if fields["created_by"] != CREATED_BY:
            raise ValueError(
                f"{source} was created by {fields['created_by']!r}, expected {CREATED_BY!r}; "
                "only files written by Trace.save() can be loaded."
            )
        if fields["format_version"] != FORMAT_VERSION:
            raise ValueError(
                f"{source} has trace format_version {fields['format_version']!r}, this version of clover-explorer "
                f"reads format_version {FORMAT_VERSION}; re-record the trace with this version (or load it with "
                "the version that wrote it)."
            )
        trace = cls(
            decode_config=fields.get("decode_config"),
            model_id=fields.get("model_id"),
            prompt_ids=fields.get("prompt_ids"),
            meta=fields.get("meta"),
        )
        trace.vocab = {int(k): v for k, v in (fields.get("vocab") or {}).items()}

        _check_columns(table, source)
        columns = trace._columns
        n = table.num_rows
        for name in _STEP_FIELDS:
            if name in _OPTIONAL_ARRAY_FIELDS and name not in table.column_names:
                columns[name] = [None] * n  # filled with the StepEvent default below
                continue
            if name not in table.column_names:
                raise ValueError(f"{source}: column {name!r} missing; the file is damaged or not a trace")
            col = table.column(name).combine_chunks()
            if name in _INT_FIELDS:
                columns[name] = [int(v) for v in col.to_pylist()]
            elif name in _FLOAT_FIELDS or name in _OPTIONAL_FLOAT_FIELDS:
                columns[name] = [None if v is None else float(v) for v in col.to_pylist()]
            elif name == "firings":
                columns[name] = [
                    tuple(ProcessorFiring(**f) for f in row)
                    for row in col.to_pylist()
                ]
            else:
                rows = _split_list_column(col)
                if _ARRAY_FIELDS[name][0] > 1:
                    shapes = table.column(name + "_shape").to_pylist()
                    rows = [r.reshape(s) if s is not None else r for r, s in zip(rows, shapes)]
                if col.null_count:  # rows recorded as None (not applicable to the model)
                    rows = [None if null else r for r, null in zip(rows, col.is_null().to_pylist())]
                columns[name] = rows
        for name in _OPTIONAL_ARRAY_FIELDS:
            if any(v is None for v in columns[name]):
                fill, dtype = (-1, np.int64) if name == "previous_tokens" else (False, bool)
                columns[name] = [np.full(len(tok), fill, dtype=dtype) if v is None else v
                                 for v, tok in zip(columns[name], columns["tokens"])]
        assert all(len(v) == n for v in columns.values()), {k: len(v) for k, v in columns.items()}

        blocks = fields.get("blocks") or {"starts": [], "ends": []}
        trace._block_starts = [
            BlockStart(**{**b, "prefilled": _decode_array(b["prefilled"]), "tokens": _decode_array(b["tokens"])})
            for b in blocks["starts"]
        ]
        trace._block_ends = [BlockEnd(**{**b, "tokens": _decode_array(b["tokens"])}) for b in blocks["ends"]]
        end = fields.get("decode_end")
        trace._decode_end = None if end is None else DecodeEnd(**{**end, "tokens": _decode_array(end["tokens"])})
        return trace


# ---------------------------------------------------------------------- helpers


def _check_columns(table: Any, source: str) -> None:
    """Every column `Trace.to_arrow` writes is present with a compatible Arrow type (lists may hold null
    rows). Raises ValueError naming the file and the first bad column, what it found and what it expected."""
    import pyarrow as pa

    t = pa.types
    kinds = {"bool": (t.is_boolean, "bool"), "int64": (t.is_integer, "an integer type"),
             "float32": (t.is_floating, "a floating type")}

    def is_list(typ, ok):
        return (t.is_list(typ) or t.is_large_list(typ)) and ok(typ.value_type)

    expected: dict[str, tuple[Callable[[Any], bool], str]] = {}
    for name in _STEP_FIELDS:
        if name in _INT_FIELDS:
            expected[name] = (t.is_integer, "int64")
        elif name in _FLOAT_FIELDS or name in _OPTIONAL_FLOAT_FIELDS:
            expected[name] = (lambda x: t.is_floating(x) or t.is_integer(x) or t.is_null(x), "float64")
        elif name == "firings":
            fields = {"name": t.is_string, "slot": t.is_integer, "token": t.is_integer,
                      "value": lambda x: t.is_floating(x) or t.is_integer(x)}
            expected[name] = (
                lambda x: is_list(x, lambda v: t.is_struct(v) and all(
                    v.get_field_index(f) >= 0 and ok(v.field(f).type) for f, ok in fields.items())),
                "list<struct<name: string, slot: int64, token: int64, value: double>>")
        else:
            ndim, dtype = _ARRAY_FIELDS[name]
            ok, what = kinds[dtype]
            expected[name] = (lambda x, ok=ok: is_list(x, ok), f"a list of {what} ({dtype} values)")
            if ndim > 1:
                expected[name + "_shape"] = (lambda x: is_list(x, t.is_integer), "list<int64> (the row's shape)")
    schema = table.schema
    for name, (ok, what) in expected.items():
        if name in _OPTIONAL_ARRAY_FIELDS and name not in schema.names:
            continue  # a trace saved before the revision columns existed
        if name not in schema.names:
            raise ValueError(f"{source}: column {name!r} is missing; the file is damaged or was not written by "
                             "Trace.save() -- re-record or re-save the trace")
        typ = schema.field(name).type
        if not ok(typ):
            raise ValueError(f"{source}: column {name!r} has type {typ}, expected {what}; the file is damaged "
                             "or was not written by Trace.save() -- re-record or re-save the trace")


def _FIRING_TYPE() -> Any:
    import pyarrow as pa

    return pa.list_(
        pa.struct(
            [
                ("name", pa.string()),
                ("slot", pa.int64()),
                ("token", pa.int64()),
                ("value", pa.float64()),
            ]
        )
    )


def _split_list_column(col: Any) -> list[np.ndarray]:
    """A pyarrow list array -> one NumPy array per row (dtype of the list values)."""
    import pyarrow.compute as pc

    flat = col.flatten().to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    return [part.copy() for part in np.split(flat, np.cumsum(lengths)[:-1])] if len(lengths) else []


def _encode_array(a: np.ndarray) -> dict[str, Any]:
    a = np.asarray(a)
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": a.ravel().tolist()}


def _decode_array(d: dict[str, Any]) -> np.ndarray:
    return np.asarray(d["data"], dtype=np.dtype(d["dtype"])).reshape(d["shape"])


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=_json_default)
