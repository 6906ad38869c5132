"""Trace files: a `clover_engine.recording.trace.Trace`'s steps and metadata as one Arrow table, written
and read as Parquet or Arrow IPC, with the schema checks that name a damaged file's first bad column.
Wing ``recording`` (the ground floor: imports no backbone).

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
  what an accept-once decoder records anyway (`clover_engine.recording.events.StepEvent`).

The schema metadata holds JSON under the keys ``format_version``
(`FORMAT_VERSION`), ``created_by`` (``"clover-explorer"``), ``decode_config``,
``model_id``, ``prompt_ids``, ``vocab``, ``blocks`` (the block start / end
records), ``decode_end`` and ``meta``.

The functions here take and return plain parts (the step columns, the metadata fields, the
block records); `Trace.to_arrow`, `Trace.save` and `Trace.load` put them together. The
column layout (``_ARRAY_FIELDS``, ``_INT_FIELDS``, ... by `StepEvent` field) is the trace's
too: `Trace.column` and `Trace.to_pandas` read it from here.

Shapes: L slots in a block, N layers, K top candidates per slot.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_trace.py -q``
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from clover_engine.recording.events import BlockEnd, BlockStart, DecodeEnd, ProcessorFiring, StepEvent

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
    "expert_union_block": (1, "int64"),
    "expert_counts": (2, "int64"),
    "router_entropy": (1, "float32"),
}
# Array fields added after format_version 1 was fixed: a file may lack them; each missing row
# then gets the StepEvent default ("nothing rewritten"), shaped like the row's tokens.
_OPTIONAL_ARRAY_FIELDS = ("rewritten", "remasked", "previous_tokens")
# Routing fields added later still (MoE backbones): a file without them reads None (not recorded).
_NULLABLE_ADDED_FIELDS = ("expert_union_block", "expert_counts", "router_entropy")
_INT_FIELDS = ("block_index", "step_index", "position_start", "n_tokens_forward")
_FLOAT_FIELDS = ("wall_s",)
_OPTIONAL_FLOAT_FIELDS = ("bytes_read", "flops", "arithmetic_intensity", "bytes_paged_in")
# Measured later still: a file without it reads None (not measured).
_ADDED_FLOAT_FIELDS = ("bytes_paged_in",)
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

assert set(_STEP_FIELDS) == (
    set(_ARRAY_FIELDS) | set(_INT_FIELDS) | set(_FLOAT_FIELDS) | set(_OPTIONAL_FLOAT_FIELDS) | {"firings"}
), _STEP_FIELDS


def steps_table(columns: Mapping[str, list[Any]]) -> Any:
    """The step columns (one list per `StepEvent` field, one entry per step) as a `pyarrow.Table`,
    without schema metadata (`Trace.to_arrow` adds `encode_metadata`'s).

    Raises:
        ValueError: an array field whose row has another number of dimensions than the field's.
    """
    n = len(columns["step_index"])
    arrays: dict[str, Any] = {}
    for name in _STEP_FIELDS:
        values = columns[name]
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
    return pa.table(arrays)


def encode_metadata(block_starts: list[BlockStart], block_ends: list[BlockEnd], decode_end: DecodeEnd | None,
                    decode_config: Mapping[str, Any] | None, model_id: str | None, prompt_ids: list[int] | None,
                    vocab: Mapping[int, str], meta: Mapping[str, Any]) -> dict[bytes, bytes]:
    """A trace's schema metadata: each of ``_METADATA_KEYS`` -> its JSON (arrays as dtype, shape, data)."""
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
            for b in block_starts
        ],
        "ends": [
            {
                "block_index": b.block_index,
                "position_start": b.position_start,
                "tokens": _encode_array(b.tokens),
                "n_steps": b.n_steps,
                "hit_eos": b.hit_eos,
            }
            for b in block_ends
        ],
    }
    end = decode_end
    decode_end_record = None
    if end is not None:
        decode_end_record = {f.name: getattr(end, f.name) for f in dataclasses.fields(end)}
        decode_end_record["tokens"] = _encode_array(end.tokens)
    fields = {
        "format_version": FORMAT_VERSION,
        "created_by": CREATED_BY,
        "decode_config": decode_config,
        "model_id": model_id,
        "prompt_ids": prompt_ids,
        "vocab": {str(k): v for k, v in sorted(vocab.items())},
        "blocks": blocks,
        "decode_end": decode_end_record,
        "meta": meta,
    }
    assert tuple(fields) == _METADATA_KEYS, tuple(fields)
    return {k.encode(): _dumps(v).encode() for k, v in fields.items()}


def write_table(table: Any, path: str | Path, format: str | None = None) -> Path:
    """Write a trace table (`steps_table`) to ``path`` and return it.

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
    path.parent.mkdir(parents=True, exist_ok=True)
    if format == "parquet":
        pq.write_table(table, path)
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    return path


def read_table(path: str | Path) -> Any:
    """The `pyarrow.Table` of a trace file written by `write_table` (Parquet or Arrow IPC, told apart
    by content, not suffix).

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the file is neither Parquet nor Arrow IPC, or cannot be read.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trace file at {str(path)!r}")
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] == _PARQUET_MAGIC:
        try:
            table = pq.read_table(path)
        except Exception as exc:
            raise ValueError(
                f"{str(path)!r} starts like Parquet but cannot be read ({exc}); re-save the trace"
            ) from exc
    elif head[:6] == _ARROW_MAGIC:
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
    return table


def read_metadata(table: Any, source: str = "<table>") -> dict[str, Any]:
    """The clover metadata fields of a trace table (``_METADATA_KEYS`` present -> decoded JSON).

    Raises:
        ValueError: no clover metadata, metadata that is not JSON, another ``created_by``, or
            another ``format_version`` (each message names ``source``).
    """
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
    return fields


def read_columns(table: Any, source: str = "<table>") -> dict[str, list[Any]]:
    """The step columns of a trace table (`steps_table`'s inverse): one list per `StepEvent` field,
    missing revision columns filled with the "nothing rewritten" default.

    Raises:
        ValueError: a missing column or one of an incompatible type (`_check_columns`).
    """
    _check_columns(table, source)
    columns: dict[str, list[Any]] = {}
    n = table.num_rows
    for name in _STEP_FIELDS:
        added = _OPTIONAL_ARRAY_FIELDS + _NULLABLE_ADDED_FIELDS + _ADDED_FLOAT_FIELDS
        if name in added and name not in table.column_names:
            columns[name] = [None] * n  # revision fields: filled with the StepEvent default below
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
    return columns


def read_blocks(fields: Mapping[str, Any]) -> tuple[list[BlockStart], list[BlockEnd], DecodeEnd | None]:
    """The block start / end records and the `DecodeEnd` of decoded metadata fields (`read_metadata`)."""
    blocks = fields.get("blocks") or {"starts": [], "ends": []}
    starts = [
        BlockStart(**{**b, "prefilled": _decode_array(b["prefilled"]), "tokens": _decode_array(b["tokens"])})
        for b in blocks["starts"]
    ]
    ends = [BlockEnd(**{**b, "tokens": _decode_array(b["tokens"])}) for b in blocks["ends"]]
    end = fields.get("decode_end")
    decode_end = None if end is None else DecodeEnd(**{
        **end, "tokens": _decode_array(end["tokens"]),
        "unstepped_forwards": tuple(tuple(f) for f in end.get("unstepped_forwards", ()))})
    return starts, ends, decode_end


# ---------------------------------------------------------------------- helpers


def _check_columns(table: Any, source: str) -> None:
    """Every column `Trace.to_arrow` writes is present with a compatible Arrow type (lists may hold null
    rows). Raises ValueError naming the file and the first bad column, what it found and what it expected."""
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
        added = _OPTIONAL_ARRAY_FIELDS + _NULLABLE_ADDED_FIELDS + _ADDED_FLOAT_FIELDS
        if (name in added or name.removesuffix("_shape") in added) and name not in schema.names:
            continue  # a trace saved before the revision / routing columns existed
        if name not in schema.names:
            raise ValueError(f"{source}: column {name!r} is missing; the file is damaged or was not written by "
                             "Trace.save() -- re-record or re-save the trace")
        typ = schema.field(name).type
        if not ok(typ):
            raise ValueError(f"{source}: column {name!r} has type {typ}, expected {what}; the file is damaged "
                             "or was not written by Trace.save() -- re-record or re-save the trace")


def _FIRING_TYPE() -> Any:
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
