"""Projection of recorded runs onto a device: the forwards a trace holds, each priced by
`engine.cost.formulas.forward_cost` and timed by the roofline, for the model that ran and
for a target model (default ``clover-35b-a3b``).

`project_parallel` / `project_parallel_table`: one forward split over several GPUs (expert and
tensor parallel, as `engine.backbones.clover.parallel` splits the model): bytes and FLOPs per GPU, their roofline
time, and a ring all-reduce communication term at the datasheet interconnect bandwidth
(`INTERCONNECT_BYTES_PER_S`; collective latency not modelled unless given).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.backbones.clover.config import CloverConfig
from engine.cost.devices import DEFAULT_DEVICE, Device, get_device
from engine.cost.formulas import (
    UNION_ASSUMPTIONS,
    ForwardCost,
    _as_config,
    cost_family,
    expected_union,
    forward_cost,
)
from engine.backbones.clover.parallel_syntax import parse_parallel  # the one parser of the --parallel syntax


@dataclass(frozen=True)
class Projection:
    """Projected cost of a sequence of forwards on one device (labelled "projected").

    Attributes:
        config_name: the model configuration projected.
        device: the device name.
        n_forwards: forwards summed.
        tokens_written: tokens finalised by them.
        bytes_read, flops: totals over the forwards.
        time_s: sum of each forward's roofline time (forwards run one after another).
        tokens_per_s: ``tokens_written / time_s``.
        mean_expert_union: union per layer averaged over layers and forwards.
        bytes_per_forward, flops_per_forward, time_s_per_forward, expert_union_per_forward:
            the same per forward, in order (n_forwards entries each; the union is the mean
            over layers); empty for a Projection built by hand.
    """

    config_name: str
    device: str
    n_forwards: int
    tokens_written: int
    bytes_read: float
    flops: float
    time_s: float
    tokens_per_s: float
    mean_expert_union: float
    bytes_per_forward: tuple[float, ...] = ()
    flops_per_forward: tuple[float, ...] = ()
    time_s_per_forward: tuple[float, ...] = ()
    expert_union_per_forward: tuple[float, ...] = ()

    def subset(self, forwards: Sequence[int], tokens_written: int) -> Projection:
        """The same projection over some of its forwards (0-based indices) only, which wrote
        ``tokens_written`` tokens: totals, time and tokens/s summed over those forwards.

        Raises:
            ValueError: no forwards, an index out of range, or a Projection without per-forward
                figures (built by hand).
        """
        idx = [int(i) for i in forwards]
        if not idx:
            raise ValueError("Projection.subset needs at least one forward")
        if len(self.time_s_per_forward) != self.n_forwards:
            raise ValueError("this Projection has no per-forward figures to take a subset of "
                             "(build it with project_forwards)")
        bad = [i for i in idx if not 0 <= i < self.n_forwards]
        if bad:
            raise ValueError(f"forward indices {bad} are outside 0..{self.n_forwards - 1}")
        pick = lambda col: tuple(col[i] for i in idx)  # noqa: E731
        b, f, t, u = (pick(c) for c in (self.bytes_per_forward, self.flops_per_forward, self.time_s_per_forward,
                                        self.expert_union_per_forward))
        time_s = float(sum(t))
        return Projection(self.config_name, self.device, len(idx), int(tokens_written), float(sum(b)),
                          float(sum(f)), time_s, tokens_written / time_s, float(sum(u)) / len(idx), b, f, t, u)


def _forward_tuple(fw: Any) -> tuple[int, Any, int, int | None]:
    if isinstance(fw, Mapping):
        n = int(fw["n_tokens"])
        return n, fw["expert_union"], int(fw.get("n_commit", fw.get("n_commit_tokens", 0))), fw.get("block_len")
    n, union, *rest = fw
    n_commit = int(rest[0]) if rest else 0
    block_len = rest[1] if len(rest) > 1 else None
    return int(n), union, n_commit, block_len


def project_forwards(
    tokens_written: int,
    forwards: Sequence[Any],
    config: CloverConfig | str,
    device: Device | str,
    weight_bytes: float = 2,
    **forward_kwargs: Any,
) -> Projection:
    """Total bytes, FLOPs and roofline time of ``forwards``, and the tokens/s they give.

    Args:
        tokens_written: tokens finalised over all the forwards.
        forwards: one ``(n_tokens, expert_union, n_commit, block_len)`` tuple
            (or mapping with those keys) per forward; ``expert_union`` a number
            or per-layer sequence; ``n_commit`` and ``block_len`` may be left off.
        config, device, weight_bytes: as in `forward_cost` / `get_device`.
        **forward_kwargs: passed on to `forward_cost` (``memory_mode``,
            ``window``, ``commit_block_len`` ...).

    Raises:
        ValueError: for an empty list of forwards or a forward `forward_cost` refuses.
    """
    cfg = _as_config(config)
    dev = get_device(device)
    if not forwards:
        raise ValueError("no forwards to project")
    b, f, t, u = [], [], [], []
    for fw in forwards:
        n, union, n_commit, block_len = _forward_tuple(fw)
        fc = forward_cost(cfg, n, union, weight_bytes, n_commit, block_len, **forward_kwargs)
        b.append(float(fc.bytes_read))
        f.append(float(fc.flops))
        t.append(float(fc.roofline_time_s(dev)))
        u.append(float(fc.mean_expert_union))
    total_t = sum(t)
    return Projection(
        config_name=cfg.name,
        device=dev.name,
        n_forwards=len(forwards),
        tokens_written=int(tokens_written),
        bytes_read=sum(b),
        flops=sum(f),
        time_s=total_t,
        tokens_per_s=tokens_written / total_t,
        mean_expert_union=sum(u) / len(forwards),
        bytes_per_forward=tuple(b),
        flops_per_forward=tuple(f),
        time_s_per_forward=tuple(t),
        expert_union_per_forward=tuple(u),
    )


def project_tokens_per_s(
    tokens_written: int,
    forwards: Sequence[Any],
    config: CloverConfig | str,
    device: Device | str,
    weight_bytes: float = 2,
    **forward_kwargs: Any,
) -> float:
    """Projected tokens/s: ``tokens_written / sum(roofline_time_s(forward))`` (see `project_forwards`)."""
    return project_forwards(tokens_written, forwards, config, device, weight_bytes, **forward_kwargs).tokens_per_s


@dataclass(frozen=True)
class TraceProjection:
    """Measured tokens/s of a recorded run beside its projections on a device.

    Attributes:
        device: the device projected onto.
        union_assumption: how the target's expert union was chosen.
        n_forwards, tokens_written: from the trace (decode forwards only).
        tokens_per_forward: ``tokens_written / n_forwards``.
        measured_wall_s: the run's wall time on the machine that recorded it
            (None if the trace has none); measured_tokens_per_s likewise.
        source: projection of the model that produced the trace, with its own
            measured unions (None when its config is unknown).
        target: projection of ``target_config`` (default ``clover-35b-a3b``)
            at the same tokens per forward.
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


@dataclass(frozen=True)
class DecodePhase:
    """A recorded run's decode phase: its forwards with the prompt forward(s) left out.

    The prompt forward (block 0's first forward, `prompt_forward_mask`) carries the prompt's
    whole blocks as well as the first block: on a MoE target its expert union is far wider
    than a decode forward's, and it is prefill work that the autoregressive line
    (`engine.cost.ar_tokens_per_s`, one token per forward) leaves out too. Comparing this
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
        raise TypeError("project_trace takes a trace object or rows, not a path; load it with engine.recording.trace.Trace.load")
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
                "tokens", "accepted", "forced", "eos_filled", "block_index", "step_index")
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


def _measured_wall_s(trace_like: Any, rows: list[Any]) -> float | None:
    summary = _get(trace_like, "summary") if not isinstance(trace_like, Sequence) else None
    if callable(summary):
        summary = summary()
    wall = _get(summary, "wall_s") if summary is not None else None
    if wall is None:
        walls = [_get(r, "wall_s") for r in rows]
        wall = sum(walls) if walls and all(w is not None for w in walls) else None
    return float(wall) if wall is not None and wall > 0 else None


def target_union(
    union_assumption: str | int | float,
    n_tokens: int,
    measured: np.ndarray | None,
    source: CloverConfig | None,
    target: CloverConfig,
) -> float:
    """The target model's expert union per layer for one forward, under an assumption.

    * ``"measured_fraction"``: the measured fraction of the source's experts
      (mean over layers) carried over, ``union / E_src * E_tgt``. With few
      source experts this saturates (8 of 8 -> 256 of 256): a pessimistic bound.
    * ``"measured_vs_independent"``: the measured union relative to the
      independent expectation of the source, carried over to the target's
      independent expectation (how much routing correlation saves).
    * ``"independent"``: `expected_union` ``(E_tgt, k_tgt, n_tokens)``.
    * a number: that union.

    Always clipped to ``[k_tgt, min(E_tgt, n_tokens * k_tgt)]``.

    Raises:
        ValueError: for an unknown assumption, or a measured one without
            measured unions / source config.
    """
    E, k = target.num_experts, target.num_experts_per_tok
    if isinstance(union_assumption, (int, float, np.integer, np.floating)) and not isinstance(union_assumption, bool):
        u = float(union_assumption)
    elif union_assumption == "independent":
        u = expected_union(E, k, n_tokens)
    elif union_assumption in ("measured_fraction", "measured_vs_independent"):
        if measured is None or source is None:
            raise ValueError(f"union_assumption={union_assumption!r} needs the measured unions and the source config")
        m = measured[measured >= 0]
        if m.size == 0:
            raise ValueError("the trace has no MoE layer unions (all -1)")
        if union_assumption == "measured_fraction":
            u = float(m.mean()) / source.num_experts * E
        else:
            ratio = float(m.mean()) / expected_union(source.num_experts, source.num_experts_per_tok, n_tokens)
            u = ratio * expected_union(E, k, n_tokens)
    else:
        raise ValueError(
            f"union_assumption must be one of {UNION_ASSUMPTIONS} or a number, got {union_assumption!r}"
        )
    return float(min(max(u, k), min(E, n_tokens * k)))


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
        trace_like: an ``engine.recording.trace.Trace`` (duck-typed: ``.steps``,
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
    src_proj = None
    if source is not None:
        src_fw = []
        for n, union, n_commit, block_len, _ in fields:
            u = np.where(union < 0, 0, union)
            src_fw.append((n, u, n_commit, block_len))
        src_proj = project_forwards(
            written, src_fw, source, device, weight_bytes, commit_block_len=block_size, **kw
        )
    tgt_fw = []
    for n, union, n_commit, block_len, _ in fields:
        u = target_union(union_assumption, n, union, source, target)
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
        measured_wall_s=wall,
        measured_tokens_per_s=None if wall is None else written / wall,
        source=src_proj,
        target=tgt_proj,
        decode_phase=_decode_phase(trace_like, rows, fields, written, wall, src_proj, tgt_proj),
    )


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


# ----------------------------------------------------------------------- multi-GPU projection
INTERCONNECT_BYTES_PER_S: dict[str, tuple[float, str]] = {
    "h800": (200e9, "NVIDIA H800 SXM5 datasheet: NVLink 400 GB/s (both directions) -> 200 GB/s each way"),
    "h100-sxm": (450e9, ("NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: NVLink 900 GB/s (both directions, "
                        "18 NVLink 4 links) -> 450 GB/s each way")),
    "h200": (450e9, ("NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: NVLink 900 GB/s (both directions) "
                    "-> 450 GB/s each way")),
    "a100-80gb": (300e9, ("NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: NVLink 600 GB/s (both "
                         "directions) -> 300 GB/s each way")),
    "b200": (900e9, ("NVIDIA HGX B200 datasheet: fifth-generation NVLink 1.8 TB/s per GPU (both directions) "
                    "-> 900 GB/s each way")),
    "rtx-4090": (31.5e9, ("no NVLink on the GeForce RTX 4090: PCIe 4.0 x16, 16 GT/s x 16 lanes with 128b/130b "
                         "coding = 31.5 GB/s each way (PCI-SIG PCIe 4.0 base specification)")),
}
"""Per-GPU interconnect bandwidth in one direction, bytes/s, and its source, per device of
`engine.cost.devices.DEVICES`: what a ring all-reduce's send (or receive) stream can use."""

_SPLIT_BY_TP = ("gdn_mixers", "attention_mixers", "state_read", "state_write", "window_kv", "block_attention")
_REPLICATED = ("embedding", "norms", "routers", "lm_head")


@dataclass(frozen=True)
class ParallelForward:
    """One forward of a model split over ``gpus`` GPUs, per GPU (labelled "projected").

    ``ep`` and ``tp`` split over the same GPUs, as `engine.backbones.clover.parallel` does: each is 1 or ``gpus``.

    Attributes:
        config_name, device: the model and the device (`engine.cost.devices.DEVICES`).
        gpus, ep, tp: the split (``ep=G``: routed experts sharded; ``tp=G``: mixer heads, states and
            shared experts sharded).
        single: the whole forward on one GPU (`forward_cost`).
        bytes_by_component, flops_by_component: per GPU, the keys of `single`'s.
        bytes_per_gpu, flops_per_gpu: their sums.
        memory_time_s: ``bytes_per_gpu / bandwidth``; compute_time_s: ``flops_per_gpu / peak``;
            roofline_time_s: the max of the two.
        n_collectives: all_reduces per forward (per layer: 2 with tp (mixer and shared-expert outputs),
            2 with ep (the routed [T, hidden] output and the expert-union count), 4 with both).
        comm_bytes_per_gpu: bytes each GPU sends in them (ring all-reduce: ``2 (G-1)/G`` x message).
        comm_time_s: ``comm_bytes_per_gpu / link`` + ``n_collectives * collective_latency_s``.
        link_bytes_per_s, link_source: the interconnect bandwidth used (`INTERCONNECT_BYTES_PER_S`).
        time_s: ``roofline_time_s + comm_time_s`` (no overlap of communication with compute).
    """

    config_name: str
    device: str
    gpus: int
    ep: int
    tp: int
    single: ForwardCost
    bytes_by_component: dict[str, float]
    flops_by_component: dict[str, float]
    bytes_per_gpu: float
    flops_per_gpu: float
    memory_time_s: float
    compute_time_s: float
    roofline_time_s: float
    n_collectives: int
    comm_bytes_per_gpu: float
    comm_time_s: float
    link_bytes_per_s: float
    link_source: str
    time_s: float

    def tokens_per_s(self, tokens_per_forward: float) -> float:
        """Projected tokens/s at ``tokens_per_forward`` tokens finalised per forward: ``tpf / time_s``."""
        return tokens_per_forward / self.time_s


def parse_split(text: str) -> dict[str, int]:
    """``"ep=8"`` -> ``{"ep": 8}``; ``"ep=8,tp=8"`` -> ``{"ep": 8, "tp": 8}`` (the `engine.backbones.clover.parallel` syntax).

    Raises:
        ValueError: not ``ep=N`` and/or ``tp=N`` with ints >= 1 and, when both are given, equal.
    """
    usage = f"--parallel expects ep=N and/or tp=N with N >= 1 (e.g. ep=8, tp=8, ep=8,tp=8), got {text!r}"
    try:
        out = parse_parallel(text)
    except ValueError:
        raise ValueError(usage) from None
    if len(set(out.values())) > 1:
        raise ValueError(usage + "; ep and tp split over the same GPUs, so they must be equal")
    return out


def project_parallel(
    config: CloverConfig | str = "clover-35b-a3b",
    device: Device | str = DEFAULT_DEVICE,
    ep: int = 1,
    tp: int = 1,
    n_tokens: int = 32,
    expert_union: float | Sequence[float] | None = None,
    n_commit_tokens: int = 0,
    weight_bytes: float = 2,
    *,
    act_bytes: float = 2,
    link_bytes_per_s: float | None = None,
    collective_latency_s: float = 0.0,
    **forward_kwargs: Any,
) -> ParallelForward:
    """Bytes and FLOPs per GPU of one forward split over GPUs, its roofline time and a communication term.

    Per GPU, from the single-GPU `forward_cost` breakdown (what `engine.backbones.clover.parallel` keeps on a rank):

    * ``routed_experts`` bytes and FLOPs / ep: the union's experts fall on the ep shards evenly (exact
      in expectation under independent routing; with correlated routing the busiest shard sets the
      time and this is a lower bound). The shards' bytes sum to the single-GPU expert bytes.
    * ``gdn_mixers``, ``attention_mixers``, ``state_read``, ``state_write``, ``window_kv``,
      ``block_attention`` / tp (heads split; every mixer weight, the states and the conv tails are
      per head or per channel).
    * ``shared_experts`` / tp, except the ``[1, hidden]`` sigmoid gate row of every layer (replicated).
    * ``embedding``, ``norms``, ``routers``, ``lm_head``: replicated, read in full by every GPU
      (norm FLOPs counted in full too: an upper bound, they are < 0.1 % of a forward's).

    Communication (what `engine.backbones.clover.parallel` runs, not an all-to-all dispatch): per layer one
    all_reduce of the mixer output and one of the shared-expert output ([T, hidden], ``act_bytes``
    per element) with tp, one of the routed-expert output plus one 8-byte union count with ep. A ring
    all-reduce over G GPUs sends ``2 (G - 1) / G`` times the message from each GPU, at
    ``link_bytes_per_s`` (default `INTERCONNECT_BYTES_PER_S` of the device, datasheet NVLink
    bandwidth each way). Latency per collective is ``collective_latency_s`` (default 0: **not
    modelled**; with ~4 N collectives per forward it matters at small T). Communication is not
    overlapped with compute.

    Args:
        config, device: the model (default ``clover-35b-a3b``) and a `Device` or name.
        ep, tp: each 1 or the GPU count G (both split over the same G GPUs).
        n_tokens, n_commit_tokens, weight_bytes, act_bytes, **forward_kwargs: as `forward_cost`.
        expert_union: distinct experts per layer over the whole forward; None = `expected_union`
            (independent routing).
        link_bytes_per_s: one-direction interconnect bandwidth, bytes/s; None = the device's entry.
        collective_latency_s: seconds added per collective (>= 0).

    Returns:
        A `ParallelForward`.

    Raises:
        ValueError: ep / tp < 1, both > 1 and different, no interconnect entry for the device and no
            ``link_bytes_per_s`` (when G > 1), a negative latency, or what `forward_cost` refuses.
    """
    cfg = _as_config(config)
    dev = get_device(device)
    ep, tp = int(ep), int(tp)
    if ep < 1 or tp < 1 or (ep > 1 and tp > 1 and ep != tp):
        raise ValueError(f"ep and tp must be >= 1 and, when both > 1, equal (they split over the same GPUs); "
                         f"got ep={ep}, tp={tp}")
    if collective_latency_s < 0:
        raise ValueError(f"collective_latency_s must be >= 0, got {collective_latency_s}")
    gpus = max(ep, tp)
    if link_bytes_per_s is None:
        link, source = INTERCONNECT_BYTES_PER_S.get(dev.name, (0.0, ""))
        if gpus > 1 and not link:
            raise ValueError(f"no interconnect bandwidth known for device {dev.name!r}; pass link_bytes_per_s")
    else:
        link, source = float(link_bytes_per_s), "given"
    if expert_union is None:
        expert_union = expected_union(cfg.num_experts, cfg.num_experts_per_tok, n_tokens)
    fc = forward_cost(cfg, n_tokens, expert_union, weight_bytes, n_commit_tokens, act_bytes=act_bytes,
                      **forward_kwargs)
    N, H = cfg.num_hidden_layers, cfg.hidden_size
    gate_b, gate_f = N * H * weight_bytes, N * fc.n_tokens * 2 * H  # shared_expert_gate rows, replicated
    b, f = {}, {}
    for key in fc.bytes_by_component:
        bb, ff = fc.bytes_by_component[key], fc.flops_by_component[key]
        if key == "routed_experts":
            b[key], f[key] = bb / ep, ff / ep
        elif key in _SPLIT_BY_TP:
            b[key], f[key] = bb / tp, ff / tp
        elif key == "shared_experts":
            b[key], f[key] = (bb - gate_b) / tp + gate_b, (ff - gate_f) / tp + gate_f
        elif key in _REPLICATED:
            b[key], f[key] = bb, ff
        else:
            raise ValueError(f"project_parallel does not know how to split component {key!r}")
    bytes_gpu, flops_gpu = float(sum(b.values())), float(sum(f.values()))
    t_mem, t_flop = bytes_gpu / dev.bandwidth_bytes_per_s, flops_gpu / dev.peak_flops
    msg = fc.n_tokens * H * act_bytes
    per_layer_msgs = (2 if tp > 1 else 0) + (1 if ep > 1 else 0)
    n_coll = N * (per_layer_msgs + (1 if ep > 1 else 0))
    ring = 2 * (gpus - 1) / gpus
    comm_bytes = ring * (N * per_layer_msgs * msg + (N * 8 if ep > 1 else 0))
    comm_t = (comm_bytes / link if comm_bytes else 0.0) + n_coll * collective_latency_s
    t_roof = max(t_mem, t_flop)
    return ParallelForward(cfg.name, dev.name, gpus, ep, tp, fc, b, f, bytes_gpu, flops_gpu, t_mem, t_flop,
                           t_roof, n_coll, comm_bytes, comm_t, link, source, t_roof + comm_t)


def project_parallel_table(split: str | Mapping[str, int], config: CloverConfig | str = "clover-35b-a3b",
                           device: Device | str = DEFAULT_DEVICE, **kwargs: Any) -> list[ParallelForward]:
    """`project_parallel` for 1, 2, 4, ... up to G GPUs (powers of two, then G), every key of `split`
    (``"ep=8"``, ``"tp=8"``, ``"ep=8,tp=8"``) set to the GPU count.

    Raises:
        ValueError: an unparsable split (`parse_split`), or what `project_parallel` refuses.
    """
    keys = parse_split(split) if isinstance(split, str) else dict(split)
    G = max(keys.values())
    counts = sorted({1, G} | {2**i for i in range(1, G.bit_length()) if 2**i <= G})
    return [project_parallel(config, device, **{k: g for k in keys}, **kwargs) for g in counts]
