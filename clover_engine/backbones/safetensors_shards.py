"""Lean loading of safetensors checkpoints: shard by shard into a model built on the meta device.

Wing: ``backbones``.

A model is built with ``torch.device("meta")`` (parameters and buffers have shapes and dtypes, no
memory), then `load_shards` reads the checkpoint's ``*.safetensors`` files one at a time and one
tensor at a time, straight into a tensor of its final dtype on its final device, renaming names on
the fly (e.g. LLaDA's onto transformers' Llama), and assigns each shard's tensors into the model
(``load_state_dict(..., assign=True)``). Buffers the checkpoint does not hold (rotary ``inv_freq``)
are recomputed on the real device by the owning module's own constructor (`materialize_buffers`).
Nothing is left on meta (`load_shards` raises if it would be).

Memory: each shard is opened with safetensors' own reader, which maps the file (``mmap``, private
and read-only: a write to a weight would copy that page, never touch the file). A tensor stored in
the dtype the model runs in, loaded onto the CPU, *is* that mapping: the load costs about the time
to map the file, the pages are the OS page cache (file-backed, shared by every process that maps
the same file, dropped and re-read under memory pressure), and only the pages a forward touches
become resident -- for a MoE, only the routed experts it ran. A tensor that must be converted
(another dtype, or another device such as a GPU) is one copy made from the mapping, so the peak
is the converted weights plus the mapped pages read so far, which the OS may drop.
``benchmarks/load_memory.py`` measures both; ``tests/clover_engine/test_mapped_loading.py``
checks that an fp32 load adds almost no anonymous memory.

Layouts: a ``*.safetensors.index.json`` (the hub's sharded layout, ``weight_map`` name -> file)
names the shards when present; otherwise every ``*.safetensors`` file of the directory is one.
A truncated or corrupt shard, a shard the index names but the directory lacks, a name held by two
shards, and names that do not match the model all raise a `ValueError` naming the file or names.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from clover_engine.backbones import load_progress

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
"""safetensors dtype code -> torch dtype (the codes this reader accepts)."""

MAX_HEADER = 100 * 2**20
"""Largest JSON header accepted (bytes); safetensors itself caps it at 100 MB."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a shard: stored name, dtype, shape, and its byte range in the data section."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Shard:
    """One ``.safetensors`` file: its path, where its data section starts, and its tensors (by offset)."""

    path: Path
    data_start: int
    tensors: tuple[TensorEntry, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data in the file."""
        return sum(t.end - t.begin for t in self.tensors)


def _corrupt(path: Path, why: str) -> ValueError:
    return ValueError(f"{path}: not a readable safetensors file ({why}); the file is truncated or corrupt -- "
                      "download or save it again")


def read_header(path: str | Path) -> Shard:
    """Parse one safetensors file's header and check its tensors fit in the file.

    Args:
        path: a ``.safetensors`` file.

    Returns:
        The `Shard` (tensors sorted by their offset, so reading them in order is sequential).

    Raises:
        ValueError: the file is shorter than its header says (truncated), its header is not
            valid JSON or names an unknown dtype, or a tensor's byte range disagrees with its
            shape and dtype. The message names the file.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _corrupt(path, f"{size} bytes, shorter than the 8-byte header length")
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER or 8 + n > size:
            raise _corrupt(path, f"header of {n} bytes in a file of {size} bytes")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _corrupt(path, f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "header is not a JSON object")
    data_size = size - 8 - n
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = DTYPES[info["dtype"]]
            shape = tuple(int(s) for s in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise _corrupt(path, f"tensor {name!r} has header {info!r}") from None
        numel = 1
        for s in shape:
            numel *= s
        if end - begin != numel * dtype.itemsize or begin < 0:
            raise _corrupt(path, f"tensor {name!r}: bytes {begin}..{end} do not hold {info['dtype']} {list(shape)}")
        if end > data_size:
            raise _corrupt(path, f"tensor {name!r} ends at byte {end} of the data, the file holds {data_size}")
        entries.append(TensorEntry(name, dtype, shape, begin, end))
    return Shard(path, 8 + n, tuple(sorted(entries, key=lambda e: e.begin)))


def shard_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory, in load order.

    With a ``*.safetensors.index.json`` (the hub's sharded layout): the files its ``weight_map``
    names, sorted; otherwise every ``*.safetensors`` in the directory, sorted.

    Raises:
        ValueError: no safetensors weights (the message mentions pickle files that are never
            loaded), an unreadable index, two index files, or a shard the index names that is absent.
    """
    directory = Path(directory)
    indexes = sorted(directory.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise ValueError(f"{directory} holds {len(indexes)} safetensors index files "
                         f"({', '.join(p.name for p in indexes)}); keep one")
    if indexes:
        try:
            weight_map = json.loads(indexes[0].read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{indexes[0]}: not a safetensors index (needs a 'weight_map' of name -> file): "
                             f"{e!r}") from None
        absent = [n for n in names if not (directory / n).is_file()]
        if absent:
            raise ValueError(f"{indexes[0]} names shard(s) the directory lacks: {', '.join(absent)}")
        return [directory / n for n in names]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in directory.glob("*.bin")) + sorted(p.name for p in directory.glob("*.pt"))
        hint = (f" (it holds {', '.join(pickles)}: pickle files are never loaded -- convert them to safetensors, "
                "e.g. save_pretrained(..., safe_serialization=True))") if pickles else ""
        raise ValueError(f"{directory} has no *.safetensors weights{hint}")
    return files


def as_float_dtype(value: object) -> torch.dtype | None:
    """``"bfloat16"`` / ``"torch.bfloat16"`` / a torch dtype -> the floating torch dtype, else None."""
    if isinstance(value, torch.dtype):
        return value if value.is_floating_point else None
    if isinstance(value, str):
        dt = getattr(torch, value.removeprefix("torch."), None)
        return dt if isinstance(dt, torch.dtype) and dt.is_floating_point else None
    return None


def checkpoint_dtype(config: dict, shards: Iterable[Shard]) -> torch.dtype:
    """The dtype a checkpoint was saved in: ``config.json``'s ``torch_dtype`` / ``dtype`` when it
    names a floating dtype, else the first floating tensor's stored dtype, else float32."""
    for key in ("torch_dtype", "dtype"):
        dt = as_float_dtype(config.get(key))
        if dt is not None:
            return dt
    for shard in shards:
        for t in shard.tensors:
            if t.dtype.is_floating_point:
                return t.dtype
    return torch.float32


def save_weights(state: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """Write ``state`` (name -> contiguous tensor) as one safetensors file at `path`, atomically.

    The file is written beside `path` and renamed over it, so a model that maps the old file (every
    model `load_shards` loaded onto the CPU does) keeps reading the old bytes: writing in place would
    truncate pages under a live mapping, and reading them then kills the process (``SIGBUS``).

    Raises:
        OSError: the folder is not writable (nothing at `path` changes).
    """
    from safetensors.torch import save_file  # local: only writers need it

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(state, str(tmp), metadata=metadata)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _mapped(shard: Shard):
    """Open `shard` with safetensors' reader: its CPU tensors are views of a private, read-only
    mapping of the file (``mmap``), resident only where read."""
    try:
        return safe_open(str(shard.path), framework="pt", device="cpu")
    except SafetensorError as e:
        raise _corrupt(shard.path, str(e)) from None


def _tensor(f, shard: Shard, entry: TensorEntry, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One tensor of the mapped shard `f` as `dtype` on `device`: the mapped view itself when both
    already match (no copy, the pages stay the file's), else one converted copy."""
    try:
        mapped = f.get_tensor(entry.name)
    except SafetensorError as e:
        raise _corrupt(shard.path, f"tensor {entry.name!r}: {e}") from None
    return mapped.to(device=device, dtype=dtype)


def load_shards(module: nn.Module, shards: list[Shard], *, rename=lambda name: name, device: str | torch.device = "cpu",
                optional: frozenset[str] = frozenset(), what: str = "the model") -> None:
    """Fill a meta-device `module` from safetensors shards, one shard (and one tensor) at a time.

    Every stored tensor ``rename(name)`` must be a state-dict entry of `module`, and every entry
    must be stored unless it is in `optional` (e.g. a tied ``lm_head.weight``). Each tensor is
    read straight into the entry's dtype (the dtype the module was built with: floating weights
    cast, others kept) on `device`, then assigned into the module (``assign=True``), shard by
    shard; names are checked against the headers before any data is read.

    Args:
        module: built under ``torch.device("meta")`` in its final dtype.
        shards: from `read_header` (e.g. over `shard_files`).
        rename: stored name -> the module's state-dict name.
        device: where the weights go.
        optional: state-dict names that may be absent (tied weights; re-tie them afterwards).
        what: how an error message names the module ("a llada model of this config").

    Raises:
        ValueError: a name stored in two shards, missing or unexpected names (the first five of
            each, with the directory), a shape that differs from the module's, or a truncated
            shard (the message names the file).
        clover_engine.backbones.load_progress.LoadCancelled: the thread's watcher asked to stop (checked
            after every tensor; the tensors read so far are dropped with the module).
    """
    device = torch.device(device)
    remote = _remote_experts(module)
    expected = {k: v for k, v in module.state_dict(keep_vars=True).items()}
    where = shards[0].path.parent if shards else "the checkpoint"
    seen: dict[str, Path] = {}
    if remote is not None:  # expert parallel: another rank's experts are neither read nor expected
        shards = [dataclasses.replace(s, tensors=tuple(t for t in s.tensors if not remote(rename(t.name))))
                  for s in shards]
    for shard in shards:
        for t in shard.tensors:
            key = rename(t.name)
            if key in seen:
                raise ValueError(f"{where}: {key!r} is stored in both {seen[key].name} and {shard.path.name}")
            seen[key] = shard.path
    missing = [k for k in expected if k not in seen and k not in optional]
    unexpected = [k for k in seen if k not in expected]
    if missing or unexpected:
        raise ValueError(f"{where}: the weights do not match {what}: "
                         f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
                         f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
    load_progress.begin("reading weights", sum(shard.nbytes for shard in shards))
    for shard in shards:
        batch: dict[str, torch.Tensor] = {}
        with _mapped(shard) as f:
            for t in shard.tensors:
                key = rename(t.name)
                want = expected[key]
                if tuple(want.shape) != t.shape:
                    raise ValueError(f"{shard.path}: {t.name!r} has shape {list(t.shape)}, {what} expects "
                                     f"{list(want.shape)} for {key!r}")
                dtype = want.dtype if t.dtype.is_floating_point and want.dtype.is_floating_point else t.dtype
                batch[key] = _tensor(f, shard, t, dtype, device)
                load_progress.advance(t.end - t.begin)  # a front end's progress bar and Stop
        module.load_state_dict(batch, strict=False, assign=True)
        del batch
    module.weight_files = tuple(str(shard.path.resolve()) for shard in shards)  # what `PageMeter` watches


_EXPERT_KEY = re.compile(r"^(.*)\.experts\.(\d+)\.")


def _remote_experts(module: nn.Module):
    """Inside `clover_engine.backbones.moe.loading_expert_shard`: split ``module``'s MoE layers for this rank
    (`clover_engine.backbones.moe.split_moe_layers`) and return ``key -> True`` for the state-dict keys of the
    experts other ranks hold; outside one, None."""
    from clover_engine.backbones.moe import loading_shard, split_moe_layers  # local: moe builds on this module's peers

    shard = loading_shard()
    if shard is None:
        return None
    splits = split_moe_layers(module, *shard)

    def remote(key: str) -> bool:
        m = _EXPERT_KEY.match(key)
        return bool(m) and m.group(1) in splits and not splits[m.group(1)].owns(int(m.group(2)))

    return remote


class PageMeter:
    """Bytes of a mapped checkpoint that become resident in this process: what forwards really read.

    A model `load_shards` left mapped reads a weight's pages only when a forward touches them (for a MoE,
    only the experts its tokens were routed to); this meter sums the ``Rss`` of this process's mappings of the
    checkpoint's files in ``/proc/self/smaps`` (Linux) and reports how much it grew since the last call. Pages
    already resident count once: the figure is the new reads -- from the page cache, or from the disk when the
    OS had dropped them (a checkpoint larger than free RAM).

    Reading ``/proc/self/smaps`` costs a few milliseconds (it lists every mapping of the process), so the
    decoders measure only mixture-of-experts models, only while someone observes the decode.

    Attributes:
        files: the resolved paths of the checkpoint's shards.
    """

    SMAPS = Path("/proc/self/smaps")

    def __init__(self, files: Iterable[str]):
        self.files = frozenset(files)
        self._last = self.resident()

    @classmethod
    def of(cls, model: object) -> "PageMeter | None":
        """The meter of `model` (a backbone or its ``lm``) when its weights came from `load_shards` and this
        system has ``/proc/self/smaps``; else None."""
        files = getattr(model, "weight_files", None) or getattr(getattr(model, "lm", None), "weight_files", None)
        return cls(files) if files and cls.SMAPS.exists() else None

    def resident(self) -> int:
        """Bytes of the checkpoint's mappings resident in this process now (0 when none is mapped)."""
        total, counting = 0, False
        with open(self.SMAPS) as f:
            for line in f:
                first = line.split(maxsplit=5)  # a header: range, perms, offset, dev, inode[, path]
                if len(first) >= 5 and "-" in first[0] and ":" not in first[0]:  # a mapping's header line
                    counting = len(first) == 6 and first[5].strip() in self.files
                elif counting and line.startswith("Rss:"):
                    total += int(line.split()[1]) * 1024
        return total

    def paged_in(self) -> int:
        """Bytes that became resident since the previous call (or since the meter was made)."""
        now = self.resident()
        grew, self._last = max(0, now - self._last), now
        return grew


def materialize_buffers(module: nn.Module, device: str | torch.device = "cpu") -> None:
    """Recompute the buffers a meta build left on meta (those no checkpoint stores, e.g. rotary
    ``inv_freq``) by building each owning submodule again on `device` from its ``config``
    (transformers' rotary modules take the model config), and copying its buffers over.

    Raises:
        ValueError: a submodule with a meta buffer that has no ``config`` to rebuild it from.
    """
    device = torch.device(device)
    for name, sub in module.named_modules():
        metas = [b for b, t in sub._buffers.items() if t is not None and t.is_meta]
        if not metas:
            continue
        config = getattr(sub, "config", None)
        if config is None:
            raise ValueError(f"buffer(s) {metas} of {name or type(module).__name__} ({type(sub).__name__}) are not "
                             "in the checkpoint and the module has no config to recompute them from")
        with torch.device(device):
            fresh = type(sub)(config)
        for b in metas:
            sub._buffers[b] = fresh._buffers[b].to(device)


def meta_tensors(module: nn.Module) -> list[str]:
    """Names of the parameters and buffers of `module` still on the meta device."""
    return ([n for n, p in module.named_parameters(remove_duplicate=False) if p.is_meta]
            + [n for n, b in module.named_buffers(remove_duplicate=False) if b.is_meta])


def compile_rules(rules: tuple[tuple[str, str], ...]):
    """Regular-expression rename rules (pattern, replacement) -> a ``name -> name`` function
    (first full match wins; unmatched names pass unchanged)."""
    compiled = [(re.compile(p), r) for p, r in rules]

    def rename(name: str) -> str:
        for pattern, target in compiled:
            if pattern.fullmatch(name):
                return pattern.sub(target, name)
        return name

    return rename
