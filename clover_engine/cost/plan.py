"""Memory truth before a load: a checkpoint's bytes per device when its routed experts split over N devices.

`read_layout` reads a checkpoint's ``config.json`` and the **headers** of its safetensors files -- the 8-byte
length and the JSON that names every tensor's dtype and shape -- and never a weight: a 190 GB checkpoint is
planned from a few megabytes, with no GPU. For a hub id the headers come from the hub without the weights
(`huggingface_hub.get_safetensors_metadata`, HTTP range requests), or from the local cache when it is there.

The split is the expert parallelism of `clover_engine.decoding.parallel`: with N devices, device r holds routed
experts ``[r * E / N, (r + 1) * E / N)`` of every MoE layer (a remainder goes one each to the first devices) and
a full copy of everything else -- embeddings, attention, norms, routers, shared experts, dense layers, the LM
head. A tensor is a routed expert's when its name holds ``.experts.<id>.`` (the hub layout of LLaDA-MoE,
LLaDA2.0 / 2.1, SDAR-MoE and Qwen3-MoE), or when it is 3-D with the config's expert count first (the experts
stacked: Clover's ``mlp.gate_up_proj`` [E, 2F, D], Qwen3.5-MoE's ``mlp.experts.gate_up_proj``); every other
tensor is replicated. `plan` gives each N's largest
per-device share, the memory it needs (x `LOAD_OVERHEAD`, the measured peak of a load and a 32-slot decode per
weight byte), which of `DEVICE_MEMORY_BYTES` it fits, and the smallest N that fits a given device.

Wing: ``cost``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_plan.py -q``
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LOAD_OVERHEAD = 1.05
"""Peak resident bytes per weight byte of a load and a decode, as measured: the lean loader maps the
checkpoint (no second copy) and reading every weight once makes 1.003x the weights resident
(``benchmarks/load_memory.py``, 1.5 B parameters); LLaDA-MoE-7B at its real shape peaks at 1.044x its
weights with a 32-slot decode's working set (``benchmarks/load_memory_moe.py``: 14.30 GiB for 13.70 GiB)."""

DEVICE_MEMORY_BYTES: dict[str, float] = {
    "rtx-4090": 24e9,   # NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090: 24 GB GDDR6X
    "a100-40gb": 40e9,  # NVIDIA A100 Tensor Core GPU datasheet: A100 40GB
    "a100-80gb": 80e9,  # NVIDIA A100 Tensor Core GPU datasheet: A100 80GB
    "h100-sxm": 80e9,   # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 80 GB HBM3
    "h800": 80e9,       # NVIDIA H800 SXM5 datasheet: 80 GB HBM3
    "h200": 141e9,      # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: 141 GB HBM3e
    "b200": 180e9,      # NVIDIA HGX B200 datasheet: 180 GB HBM3e per GPU
}
"""Memory per device in bytes, as the datasheets state it (decimal GB: a little under what the device holds, so
a plan that fits here fits there)."""

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
               "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
"""Bytes per element of the safetensors dtype codes."""
_FLOATS = {"F64", "F32", "F16", "BF16"}
_CAST = {"float32": 4, "float16": 2, "bfloat16": 2}
EXPERT_NAME = re.compile(r"\.experts\.(\d+)\.")
MAX_HEADER = 100 * 2**20


@dataclass(frozen=True)
class Layout:
    """What a checkpoint's headers say, in bytes at the planned dtype.

    Attributes:
        name: the checkpoint (directory or hub id).
        replicated_bytes: every tensor that is not a routed expert's (held by every device).
        expert_bytes: [E] bytes of each routed expert, summed over the MoE layers (id -> bytes).
        n_params: elements of all tensors.
        n_tensors: tensors in the headers.
        dtype: the dtype the bytes are counted at (``as stored`` or a cast's name).
    """

    name: str
    replicated_bytes: int
    expert_bytes: tuple[int, ...]
    n_params: int
    n_tensors: int
    dtype: str

    @property
    def num_experts(self) -> int:
        return len(self.expert_bytes)

    @property
    def total_bytes(self) -> int:
        return self.replicated_bytes + sum(self.expert_bytes)


def header_tensors(path: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype code, shape)}`` from one safetensors file's header; its data is not read nor required.

    Raises:
        ValueError: not a safetensors header (too short, an incredible length, not JSON, an entry without a
            dtype and shape), naming the file.
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: too short to be a safetensors file (no 8-byte header length)")
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER:
            raise ValueError(f"{path}: a safetensors header of {n} bytes is not credible; the file is corrupt")
        try:
            header = json.loads(f.read(n))
            return {k: (str(v["dtype"]), tuple(int(s) for s in v["shape"])) for k, v in header.items()
                    if k != "__metadata__"}
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{path}: corrupt safetensors header ({e!r}); download or save it again") from None


EXPERT_COUNT_KEYS = ("num_experts", "n_routed_experts", "moe_num_experts", "num_local_experts")
"""``config.json`` fields that give the number of routed experts (LLaDA-MoE / LLaDA2 / Qwen / Clover, DeepSeek,
ERNIE, Mixtral)."""


def experts_in_config(config: dict) -> int | None:
    """The routed expert count a ``config.json`` declares (`EXPERT_COUNT_KEYS`, also under ``text_config``)."""
    for cfg in (config, config.get("text_config") or {}):
        for key in EXPERT_COUNT_KEYS:
            if isinstance(cfg.get(key), int) and cfg[key] > 0:
                return int(cfg[key])
    return None


def layout_of(tensors: dict[str, tuple[str, tuple[int, ...]]], name: str, dtype: str | None = None,
              num_experts: int | None = None) -> Layout:
    """The `Layout` of ``{tensor name: (dtype code, shape)}``.

    Args:
        dtype: count floating tensors at this dtype (``bfloat16``, ``float16``, ``float32``: what a load with
            ``--dtype`` makes of them); None: as stored.
        num_experts: the config's routed expert count: 3-D tensors with it first are stacked experts.

    Raises:
        ValueError: an unknown dtype name or dtype code, or routed experts whose ids are not 0..E-1.
    """
    if dtype is not None and dtype not in _CAST:
        raise ValueError(f"dtype must be one of {', '.join(_CAST)} (or none: as stored), got {dtype!r}")
    replicated, experts, n_params = 0, {}, 0
    for key, (code, shape) in tensors.items():
        if code not in DTYPE_BYTES:
            raise ValueError(f"{name}: tensor {key!r} has dtype {code!r}, not one of {', '.join(DTYPE_BYTES)}")
        numel = math.prod(shape)
        n_params += numel
        nbytes = numel * (_CAST[dtype] if dtype is not None and code in _FLOATS else DTYPE_BYTES[code])
        m = EXPERT_NAME.search(key)
        if m:
            experts[int(m.group(1))] = experts.get(int(m.group(1)), 0) + nbytes
        elif num_experts and len(shape) == 3 and shape[0] == num_experts:  # experts stacked: [E, out, in]
            for i in range(num_experts):
                experts[i] = experts.get(i, 0) + nbytes // num_experts
        else:
            replicated += nbytes
    if experts and sorted(experts) != list(range(len(experts))):
        raise ValueError(f"{name}: routed experts numbered {min(experts)}..{max(experts)} with gaps; expected "
                         f"0..{len(experts) - 1}")
    return Layout(name, replicated, tuple(experts[i] for i in range(len(experts))), n_params, len(tensors),
                  dtype or "as stored")


def read_layout(source: str | Path, dtype: str | None = None) -> Layout:
    """The `Layout` of a checkpoint from its headers: a directory (its ``*.safetensors``, or the files its
    ``*.safetensors.index.json`` names), or a hub id ``org/name[@revision]`` (the headers fetched without the
    weights; offline, the cached snapshot's files).

    Raises:
        ValueError: no such directory and not a hub id, no safetensors files, a corrupt header, or a hub id the
            hub (or, offline, the cache) cannot give; the message says what to do.
    """
    from clover_engine.backbones.hub import parse_hub_id  # local: the backbones wing, only to tell a hub id
    from clover_engine.backbones.safetensors_shards import shard_files  # local: its index rules

    path = Path(source)
    if path.is_dir():
        tensors: dict = {}
        for f in shard_files(path):
            tensors.update(header_tensors(f))
        return layout_of(tensors, str(source), dtype, experts_in_config(_config(path / "config.json")))
    hub = parse_hub_id(str(source))
    if hub is None:
        raise ValueError(f"{source!r} is neither a checkpoint directory nor a hub id org/name[@revision]")
    tensors, config = _hub_tensors(hub.repo_id, hub.revision)
    return layout_of(tensors, str(source), dtype, experts_in_config(config))


def _config(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _hub_tensors(repo_id: str, revision: str | None) -> tuple[dict[str, tuple[str, tuple[int, ...]]], dict]:
    """The hub checkpoint's tensors from its headers and its ``config.json``: `huggingface_hub.
    get_safetensors_metadata` (range requests, no weights) and `huggingface_hub.hf_hub_download`; offline, the
    snapshot already in the local cache."""
    import huggingface_hub as hf

    try:
        meta = hf.get_safetensors_metadata(repo_id, revision=revision)
        config = _config(Path(hf.hf_hub_download(repo_id, "config.json", revision=revision)))
        return {k: (str(t.dtype), tuple(int(s) for s in t.shape)) for f in meta.files_metadata.values()
                for k, t in f.tensors.items()}, config
    except Exception as online:  # noqa: BLE001  (offline, gated, missing: try the cache, then say which)
        try:
            snapshot = Path(hf.snapshot_download(repo_id, revision=revision, local_files_only=True))
        except Exception:  # noqa: BLE001
            raise ValueError(f"{repo_id}: could not read its safetensors headers from the hub ({online}) and no "
                             "snapshot is in the local cache; connect, or plan a downloaded directory") from None
        from clover_engine.backbones.safetensors_shards import shard_files  # local: its index rules

        return ({k: v for f in shard_files(snapshot) for k, v in header_tensors(f).items()},
                _config(snapshot / "config.json"))


def device_bytes(layout: Layout, n_devices: int) -> list[int]:
    """[N] weight bytes each device holds when the routed experts split over ``n_devices`` (module docstring).

    Raises:
        ValueError: ``n_devices`` < 1, or more devices than routed experts (a device with no expert: use fewer).
    """
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1:
        raise ValueError(f"devices must be an int >= 1, got {n_devices!r}")
    E = layout.num_experts
    if n_devices > max(E, 1):
        raise ValueError(f"{layout.name} has {E} routed experts: split them over at most {max(E, 1)} devices")
    base, extra = divmod(E, n_devices)
    out, lo = [], 0
    for r in range(n_devices):
        hi = lo + base + (r < extra)
        out.append(layout.replicated_bytes + sum(layout.expert_bytes[lo:hi]))
        lo = hi
    return out


@dataclass(frozen=True)
class PlanRow:
    """One device count of a plan.

    Attributes:
        devices: N; per_device: [N] weight bytes; need_bytes: the largest share x `LOAD_OVERHEAD` (what the
        fullest device needs to load and decode); fits: `DEVICE_MEMORY_BYTES` names whose memory holds it.
    """

    devices: int
    per_device: tuple[int, ...]
    need_bytes: int
    fits: tuple[str, ...]


def plan(layout: Layout, device_counts: Sequence[int] = (1, 2, 4, 8)) -> list[PlanRow]:
    """One `PlanRow` per device count (counts above the number of experts are left out).

    Raises:
        ValueError: as `device_bytes`.
    """
    rows = []
    for n in device_counts:
        if n > max(layout.num_experts, 1):
            continue
        per = device_bytes(layout, n)
        need = int(max(per) * LOAD_OVERHEAD)
        rows.append(PlanRow(n, tuple(per), need, tuple(d for d, m in DEVICE_MEMORY_BYTES.items() if need <= m)))
    return rows


def smallest_fit(layout: Layout, memory_bytes: float) -> int | None:
    """The fewest devices of ``memory_bytes`` each that hold the checkpoint (`LOAD_OVERHEAD` included), or None
    when even one expert per device does not fit (the replicated part alone is too large)."""
    for n in range(1, max(layout.num_experts, 1) + 1):
        if max(device_bytes(layout, n)) * LOAD_OVERHEAD <= memory_bytes:
            return n
    return None


def format_plan(layout: Layout, rows: Sequence[PlanRow], device: str | None = None) -> str:
    """The plan as plain text: the checkpoint's totals, one line per device count, and the smallest count of
    each listed device (of ``device`` alone when given) that fits."""
    gb = lambda n: f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"  # noqa: E731
    lines = [f"{layout.name}: {layout.n_params / 1e9:,.3g} B parameters in {layout.n_tensors} tensors, "
             f"{gb(layout.total_bytes)} at {layout.dtype} ({gb(layout.replicated_bytes)} replicated on every "
             f"device, {gb(sum(layout.expert_bytes))} in {layout.num_experts} routed experts)",
             f"{'devices':>7s} {'per device (largest)':>21s} {'needs (x' + format(LOAD_OVERHEAD, 'g') + ')':>14s}  fits"]
    for r in rows:
        lines.append(f"{r.devices:7d} {gb(max(r.per_device)):>21s} {gb(r.need_bytes):>14s}  "
                     f"{', '.join(r.fits) or 'none of the listed devices'}")
    names = [device] if device else list(DEVICE_MEMORY_BYTES)
    fit = []
    for name in names:
        n = smallest_fit(layout, DEVICE_MEMORY_BYTES[name])
        fit.append(f"{name}: {n if n is not None else 'does not fit'}")
    lines.append("smallest device count that fits: " + "; ".join(fit))
    return "\n".join(lines)


__all__ = ["DEVICE_MEMORY_BYTES", "DTYPE_BYTES", "LOAD_OVERHEAD", "Layout", "PlanRow", "device_bytes", "format_plan",
           "experts_in_config", "header_tensors", "layout_of", "plan", "read_layout", "smallest_fit"]
