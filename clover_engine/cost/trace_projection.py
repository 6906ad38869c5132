"""Projection of recorded runs onto a device: the forwards a trace holds (or its step rows, or a
table of them), each priced by `clover_engine.cost.formulas.forward_cost` and timed by the roofline, for
the model that ran and for a target model (default ``clover-35b-a3b``) -- the whole run
(`TraceProjection`) and its decode phase without the prompt forward(s) (`DecodePhase`,
`prompt_forward_mask`). Wing ``cost``.

The per-forward sums and the target's expert union are `clover_engine.cost.projection`.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_cost.py tests/clover_engine/test_cost_decode_phase.py -q``
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.cost.devices import DEFAULT_DEVICE, Device, get_device
from clover_engine.cost.drafter import drafter_section
from clover_engine.cost.formulas import _as_config, cost_family, forward_cost
from clover_engine.cost.projection import Projection, project_forwards, target_union


@dataclass(frozen=True)
class TraceProjection:
    """Measured tokens/s of a recorded run beside its projections on a device.

    Attributes:
        device: the device projected onto.
        union_assumption: how the target's expert union was chosen.
        n_forwards, tokens_written: from the trace: every forward (the decoder's NFE: steps, and the
            prefill and commit forwards no step reports), the answer tokens.
        tokens_per_forward: ``tokens_written / n_forwards``.
        measured_wall_s: the run's wall time on the machine that recorded it
            (None if the trace has none); measured_tokens_per_s likewise.
        source: projection of the model that produced the trace, with its own
            measured unions (None when its config is unknown).
        target: projection of ``target_config`` (default ``clover-35b-a3b``)
            at the same tokens per forward.
        stepped: one entry per forward projected: True for a forward a `StepEvent` reports, False for a
            prefill or commit forward of its own (``DecodeEnd.unstepped_forwards``); () from rows without them.
        decode_phase: the same figures without the prompt forward(s) (`DecodePhase`): what
            compares with an autoregressive step, which has no prompt in it. None when the
            prompt forward(s) were the whole run.

    Every figure above is the whole run: the prompt forward -- block 0's first forward, which
    folds the prompt's whole blocks into history (`prompt_forward_mask`) -- included.
    """

    device: str
    union_assumption: str
    n_forwards: int
    tokens_written: int
    tokens_per_forward: float
    measured_wall_s: float | None
    measured_tokens_per_s: float | None
    source: Projection | None
    target: Projection
    decode_phase: DecodePhase | None = None
    stepped: tuple[bool, ...] = ()


@dataclass(frozen=True)
class DecodePhase:
    """A recorded run's decode phase: its forwards with the prompt forward(s) left out.

    The prompt forward (block 0's first forward, `prompt_forward_mask`) carries the prompt's
    whole blocks as well as the first block: on a MoE target its expert union is far wider
    than a decode forward's, and it is prefill work that the autoregressive line
    (`clover_engine.cost.ar_tokens_per_s`, one token per forward) leaves out too. Comparing this
    phase with that line compares like with like.

    Attributes:
        prompt_forwards: 0-based indices of the forwards left out (() when the prompt fit in
            the first block: then nothing is left out and the phase is the whole run).
        prompt_tokens: prompt tokens those forwards folded into history.
        prompt_tokens_written: answer tokens those forwards wrote (left out of tokens_written).
        n_forwards, tokens_written, tokens_per_forward: of the remaining forwards.
        measured_wall_s: the run's wall time less the prompt forwards' own ``wall_s`` (None
            when the run has no wall time); measured_tokens_per_s: tokens_written over it.
        source, target: `Projection.subset` of the whole run's projections over the remaining
            forwards (source None when the whole run's is).
    """

    prompt_forwards: tuple[int, ...]
    prompt_tokens: int
    prompt_tokens_written: int
    n_forwards: int
    tokens_written: int
    tokens_per_forward: float
    measured_wall_s: float | None
    measured_tokens_per_s: float | None
    source: Projection | None
    target: Projection


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _to_list(col: Any) -> list[Any]:
    if hasattr(col, "to_pylist"):
        return col.to_pylist()
    if hasattr(col, "tolist") and not isinstance(col, np.ndarray):
        return col.tolist()
    return list(col)


def _step_rows(trace_like: Any) -> list[Any]:
    """Rows (mappings or objects) from a list, a trace with ``steps``, or a table of columns."""
    if isinstance(trace_like, (str, bytes, Path)):
        raise TypeError("project_trace takes a trace object or rows, not a path; load it with clover_engine.recording.trace.Trace.load")
    if isinstance(trace_like, Sequence):
        return list(trace_like)
    steps = getattr(trace_like, "steps", None)
    if steps is not None:
        steps = steps() if callable(steps) else steps
        return _step_rows(steps)
    try:
        n_col = trace_like["n_tokens_forward"]
    except (KeyError, TypeError, IndexError):
        n_col = getattr(trace_like, "n_tokens_forward", None)
        getter = lambda k: getattr(trace_like, k)  # noqa: E731
    else:
        getter = lambda k: trace_like[k]  # noqa: E731
    if n_col is None:
        raise TypeError(
            "project_trace needs per-step rows: a list of dicts (n_tokens_forward, expert_union, "
            "n_written, block_len), an object with .steps, or a table with those columns; "
            f"got {type(trace_like).__name__}"
        )
    cols = {"n_tokens_forward": _to_list(n_col)}
    optional = ("expert_union", "n_written", "block_len", "n_commit", "wall_s",
                "tokens", "accepted", "forced", "eos_filled", "block_index", "step_index", "position_start")
    for name in optional:
        try:
            cols[name] = _to_list(getter(name))
        except (KeyError, AttributeError, TypeError):
            pass
    return [{k: v[i] for k, v in cols.items()} for i in range(len(cols["n_tokens_forward"]))]


def _row_fields(row: Any) -> tuple[int, np.ndarray, int, int, int]:
    """(n_tokens, union per layer, n_commit, block_len, n_written) of one step row."""
    n, n_commit, block_len = _row_shape(row)
    union = np.asarray(_get(row, "expert_union"), dtype=np.float64).reshape(-1)
    written = _get(row, "n_written")
    if written is None:
        parts = [_get(row, k) for k in ("accepted", "forced", "eos_filled")]
        if any(p is None for p in parts):
            raise ValueError("a step row needs n_written (or accepted/forced/eos_filled masks)")
        written = sum(int(np.sum(p)) for p in parts)
    return n, union, n_commit, block_len, int(written)


def prompt_forward_mask(trace_like: Any) -> np.ndarray:
    """(S,) bool, one entry per forward of a recorded run: True for the prompt forward(s).

    The decoders fold the prompt's whole blocks into history in the first forward of block 0,
    fused with the first block's slots (``n_tokens_forward = prompt blocks + L``); every later
    forward carries at most the previous block's commit. So the prompt forward is the step with
    ``block_index == 0``, ``step_index == 0`` and more tokens than its block's slots (none when
    the prompt is shorter than one block: it then only pre-fills the first block's head). Rows
    without ``block_index`` / ``step_index`` read as in order: the first row, on the same
    condition.

    Args:
        trace_like: what `project_trace` takes (a Trace, step rows, or a table of columns).

    Raises:
        TypeError: for something that holds no step rows.
    """
    rows = _step_rows(trace_like)
    mask = np.zeros(len(rows), dtype=bool)
    for i, row in enumerate(rows):
        _, n_commit, _ = _row_shape(row)
        block, step = _get(row, "block_index"), _get(row, "step_index")
        first = (i == 0) if block is None or step is None else (int(block) == 0 and int(step) == 0)
        mask[i] = first and n_commit > 0
    return mask


def _row_shape(row: Any) -> tuple[int, int, int]:
    """(n_tokens, n_commit, block_len) of one step row: block_len from ``block_len`` or the
    row's ``tokens`` (else all of n_tokens), n_commit from ``n_commit`` or ``n_tokens - block_len``."""
    n = int(_get(row, "n_tokens_forward"))
    block_len = _get(row, "block_len")
    if block_len is None:
        tokens = _get(row, "tokens")
        block_len = len(tokens) if tokens is not None else n
    n_commit = _get(row, "n_commit")
    n_commit = n - int(block_len) if n_commit is None else int(n_commit)
    return n, n_commit, int(block_len)


def _answer_written(row: Any) -> int:
    """Answer slots one step wrote: accepted + forced (EOS fills are not answer tokens); the
    row's ``n_written`` when it has no masks."""
    parts = [_get(row, k) for k in ("accepted", "forced")]
    if all(p is not None for p in parts):
        return sum(int(np.sum(p)) for p in parts)
    return int(_get(row, "n_written") or 0)


def _source_config(trace_like: Any) -> CloverConfig | None:
    """The Clover config of the model that recorded ``trace_like``, or None -- also for a model of
    another cost family (`cost_family`: from ``meta["capabilities"]``, else the config's fields),
    which has no Clover config to price its forwards or carry its expert union over."""
    meta = _get(trace_like, "meta", {}) or {}
    record = _get(meta, "capabilities")
    for cand in (_get(trace_like, "config"), _get(meta, "model_config")):
        if cand is None:
            continue
        if cost_family(cand, record) != "clover":
            return None
        try:
            return CloverConfig.from_dict(dict(cand)) if isinstance(cand, Mapping) else _as_config(cand)
        except (TypeError, ValueError, OSError):
            pass
    model_id = _get(trace_like, "model_id")
    if isinstance(model_id, str):
        try:
            return _as_config(Path(model_id) / "config.json" if Path(model_id).is_dir() else model_id)
        except (ValueError, TypeError, OSError):
            return None
    return None


CANVAS_SAMPLERS = ("llada", "dream")
"""``decode_config["sampler"]`` of the official masked diffusion samplers, whose decoder
(`clover_engine.decoding.masked_diffusion_decoder.MaskedDiffusionDecoder`) runs every forward over the whole
canvas and prices it so: the prompt as the commit, every canvas position after it as a slot (its step rows
hold only the current block's slots)."""


def _own_family_projection(trace_like: Any, rows: list[Any], fields: list[tuple], written: int,
                           device: Device | str, weight_bytes: float, block_size: int | None, memory_mode: str,
                           window: int) -> Projection | None:
    """The recorded model, when it is not a Clover model (a masked diffusion or MoE diffusion LM, a
    block-causal or transformers backbone), priced by its own cost family's formulas
    (`clover_engine.cost.formulas.forward_cost`) from its recorded config (``meta["model_config"]``) at
    ``weight_bytes``: each forward with its recorded tokens, commit, history (``position_start`` less the
    commit) and measured expert union per layer -- the union its router chose, not an assumption. None
    without a recorded config, for a Clover model (`project_trace` prices it itself) and for a drafter
    backbone (its rounds are priced by `clover_engine.cost.drafter`)."""
    meta = _get(trace_like, "meta", {}) or {}
    config, record = _get(meta, "model_config"), _get(meta, "capabilities")
    if not isinstance(config, Mapping) or cost_family(config, record) == "clover" or drafter_section(config):
        return None
    dev = get_device(device)
    prompt = _get(trace_like, "prompt_ids")
    canvas = (_get(trace_like, "decode_config") or {}).get("sampler") in CANVAS_SAMPLERS and prompt is not None
    b, f, t, u = [], [], [], []
    for row, (n, union, n_commit, block_len, _) in zip(rows, fields):
        start = _get(row, "position_start")
        context = max(0, int(start) - n_commit) if start is not None else 0
        if canvas:  # the whole canvas each forward: the prompt as commit, the rest as slots, no cache
            n_commit, block_len, context = len(prompt), n - len(prompt), 0
        measured = union if union.size and np.all(np.isfinite(union)) and np.all(union >= 0) else None
        fc = forward_cost(config, n, measured, weight_bytes, n_commit, block_len, memory_mode, window,
                          commit_block_len=block_size, context_len=context, capabilities=record)
        b.append(float(fc.bytes_read))
        f.append(float(fc.flops))
        t.append(float(fc.roofline_time_s(dev)))
        u.append(float(fc.mean_expert_union))
    name = _get(trace_like, "model_id") or config.get("name") or "recorded model"
    return Projection(config_name=str(name), device=dev.name, n_forwards=len(rows), tokens_written=int(written),
                      bytes_read=sum(b), flops=sum(f), time_s=sum(t), tokens_per_s=written / sum(t),
                      mean_expert_union=sum(u) / len(rows), bytes_per_forward=tuple(b), flops_per_forward=tuple(f),
                      time_s_per_forward=tuple(t), expert_union_per_forward=tuple(u))


def _recorded_routing(trace_like: Any) -> SimpleNamespace | None:
    """``num_experts`` / ``num_experts_per_tok`` of a recorded MoE model of another family than Clover (a
    MoE diffusion LM: ``meta["model_config"]``), so that its measured unions carry over to the target
    (`clover_engine.cost.projection.target_union`); None for a model without experts."""
    config = _get(_get(trace_like, "meta", {}) or {}, "model_config")
    if not isinstance(config, Mapping):
        return None
    E, k = config.get("num_experts"), config.get("num_experts_per_tok")
    return SimpleNamespace(num_experts=int(E), num_experts_per_tok=int(k)) if E and k else None


def _measured_wall_s(trace_like: Any, rows: list[Any]) -> float | None:
    summary = _get(trace_like, "summary") if not isinstance(trace_like, Sequence) else None
    if callable(summary):
        summary = summary()
    wall = _get(summary, "wall_s") if summary is not None else None
    if wall is None:
        walls = [_get(r, "wall_s") for r in rows]
        wall = sum(walls) if walls and all(w is not None for w in walls) else None
    return float(wall) if wall is not None and wall > 0 else None


def project_trace(
    trace_like: Any,
    device: Device | str = DEFAULT_DEVICE,
    target_config: CloverConfig | str | None = None,
    union_assumption: str | int | float = "measured_vs_independent",
    *,
    source_config: CloverConfig | str | None = None,
    weight_bytes: float = 2,
    memory_mode: str | None = None,
    window: int = 0,
    fallback_union: str | float | None = None,
) -> TraceProjection:
    """Measured vs projected tokens/s for a recorded run.

    Projected tokens/s = ``tokens_written / sum over forwards of
    roofline_time_s`` on ``device``, for (a) the model that produced the trace
    with its measured per-layer unions and (b) ``target_config`` (default
    ``clover-35b-a3b``) running the same forwards -- same tokens per forward,
    same commits -- with its union from ``union_assumption`` (`target_union`).
    Both in ``weight_bytes`` (BF16) whatever dtype the run used.

    Args:
        trace_like: an ``clover_engine.recording.trace.Trace`` (duck-typed: ``.steps``,
            ``.summary()``, ``.model_id``, ``.decode_config``), a list of
            dicts or objects with ``n_tokens_forward``, ``expert_union`` (per
            layer; -1 = no MoE), ``n_written`` (or the accepted / forced /
            eos_filled masks) and ``block_len`` (or ``tokens``); an explicit
            ``n_commit`` overrides ``n_tokens_forward - block_len``; or a table
            (DataFrame, Arrow, dict) of those columns.
        device: a `Device` or name.
        source_config: the trace's model config when the trace does not say
            (looked up from ``.config``, ``.meta["model_config"]`` or a preset
            / directory ``model_id``); without it the source projection is None.
        fallback_union: when given (and not ``union_assumption`` itself), the
            assumption used instead when the projection under ``union_assumption``
            raises ValueError (a trace without measured unions or source config).

    Measured tokens/s counts the same ``tokens_written`` over the run's wall
    time (``summary()["wall_s"]``, else the sum of the steps' ``wall_s``).

    The figures are the whole run's, the prompt forward included (its prompt tokens are
    priced like any other: on a MoE target they widen its expert union); ``decode_phase``
    holds the same without it (`DecodePhase`), the figure to set beside an autoregressive line.

    Raises:
        TypeError: for something that holds no step rows.
        ValueError: for an empty trace or an unusable union assumption.
    """
    if fallback_union is not None and fallback_union != union_assumption:
        kwargs = {"source_config": source_config, "weight_bytes": weight_bytes, "memory_mode": memory_mode,
                  "window": window}
        try:
            return project_trace(trace_like, device, target_config, union_assumption, **kwargs)
        except ValueError:
            return project_trace(trace_like, device, target_config, fallback_union, **kwargs)
    rows = _step_rows(trace_like)
    if not rows:
        raise ValueError("the trace has no steps to project")
    rows, stepped = _with_unstepped_forwards(trace_like, rows)
    target = _as_config(target_config or "clover-35b-a3b")
    source = _as_config(source_config) if source_config is not None else _source_config(trace_like)
    decode_config = _get(trace_like, "decode_config") if not isinstance(trace_like, Sequence) else None
    block_size = _get(decode_config, "block_size") if decode_config else None

    fields = [_row_fields(r) for r in rows]
    written = sum(f[4] for f in fields)
    # Prefer the decode's own count of generated tokens (up to the first EOS): slots
    # EOS-filled or written after an EOS are finalised but are not answer tokens.
    summary = _get(trace_like, "summary") if not isinstance(trace_like, Sequence) else None
    summary = summary() if callable(summary) else summary
    n_generated = _get(summary, "n_tokens") if summary is not None else None
    if n_generated:
        written = int(n_generated)
    if memory_mode is None:
        memory_mode = (_get(decode_config, "memory_mode") if decode_config else None) or "state"
    kw: dict[str, Any] = {"memory_mode": memory_mode, "window": window}
    src_proj = None if source is not None else _own_family_projection(
        trace_like, rows, fields, written, device, weight_bytes, block_size, memory_mode, window)
    if source is not None:
        src_fw = []
        for n, union, n_commit, block_len, _ in fields:
            u = np.where(union < 0, 0, union)
            src_fw.append((n, u, n_commit, block_len))
        src_proj = project_forwards(
            written, src_fw, source, device, weight_bytes, commit_block_len=block_size, **kw
        )
    tgt_fw = []
    routing = source if source is not None else _recorded_routing(trace_like)  # whose measured unions carry over
    for n, union, n_commit, block_len, _ in fields:
        u = target_union(union_assumption, n, union, routing, target)
        tgt_fw.append((n, u, n_commit, block_len))
    tgt_kw = dict(kw)
    if memory_mode == "state+window" and not window and not target.attention_window:
        tgt_kw["window"] = source.attention_window if source is not None else 0
    tgt_proj = project_forwards(written, tgt_fw, target, device, weight_bytes, commit_block_len=block_size, **tgt_kw)
    wall = _measured_wall_s(trace_like, rows)
    return TraceProjection(
        device=get_device(device).name,
        union_assumption=str(union_assumption),
        n_forwards=len(rows),
        tokens_written=written,
        tokens_per_forward=written / len(rows),
        stepped=tuple(stepped),
        measured_wall_s=wall,
        measured_tokens_per_s=None if wall is None else written / wall,
        source=src_proj,
        target=tgt_proj,
        decode_phase=_decode_phase(trace_like, rows, fields, written, wall, src_proj, tgt_proj),
    )


def _with_unstepped_forwards(trace_like: Any, rows: list[Any]) -> tuple[list[Any], list[bool]]:
    """``rows`` with a row for each forward no step event reports (``DecodeEnd.unstepped_forwards``: a
    block-causal family's prefill and commit forwards) at its place among them, and which rows are steps.

    Such a row runs its ``n_tokens`` as commit (nothing written, no slots) after ``context_len`` cached tokens,
    with its recorded expert union (a dense model's: None, like its steps'). A prefill counts as block 0's
    prompt forward (`prompt_forward_mask`)."""
    end = getattr(trace_like, "decode_end", None)
    end = end() if callable(end) else end
    extra = list(getattr(end, "unstepped_forwards", ()) or ())
    if not extra or isinstance(trace_like, Sequence):
        return rows, [True] * len(rows)
    out, stepped, k = [], [], 0
    for i in range(len(rows) + 1):
        while k < len(extra) and int(extra[k][3]) <= i:
            kind, n, context, before, union = (list(extra[k]) + [None])[:5]
            out.append({"n_tokens_forward": int(n), "n_commit": int(n), "block_len": 0, "n_written": 0,
                        "accepted": None, "forced": None, "expert_union": union,
                        "position_start": int(context) + int(n), "wall_s": 0.0,
                        "block_index": 0 if kind == "prefill" else None,
                        "step_index": 0 if kind == "prefill" else None, "unstepped": kind})
            stepped.append(False)
            k += 1
        if i < len(rows):
            out.append(rows[i])
            stepped.append(True)
    return out, stepped


def _decode_phase(trace_like: Any, rows: list[Any], fields: list[tuple], written: int, wall: float | None,
                  src_proj: Projection | None, tgt_proj: Projection) -> DecodePhase | None:
    """`project_trace`'s whole-run figures with the prompt forward(s) left out (None if nothing is left)."""
    prompt = np.flatnonzero(prompt_forward_mask(rows)).tolist()
    keep = [i for i in range(len(rows)) if i not in set(prompt)]
    if not keep:
        return None
    # the answer tokens the prompt forward wrote: its accepted + forced slots, at most the answer
    early = min(written, sum(_answer_written(rows[i]) for i in prompt))
    tokens = written - early
    prompt_wall = sum(float(_get(rows[i], "wall_s") or 0.0) for i in prompt)
    phase_wall = None if wall is None or wall - prompt_wall <= 0 else wall - prompt_wall
    return DecodePhase(
        prompt_forwards=tuple(prompt),
        prompt_tokens=int(sum(fields[i][2] for i in prompt)),
        prompt_tokens_written=int(early),
        n_forwards=len(keep),
        tokens_written=int(tokens),
        tokens_per_forward=tokens / len(keep),
        measured_wall_s=phase_wall,
        measured_tokens_per_s=None if phase_wall is None else tokens / phase_wall,
        source=None if src_proj is None else src_proj.subset(keep, tokens),
        target=tgt_proj.subset(keep, tokens),
    )
