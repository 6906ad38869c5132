"""Clover weights I/O: save and load a Clover checkpoint directory (Hugging Face layout).

Wing ``backbones`` (the ``clover`` family). `load_clover` is the registry's ``clover`` row
(`clover_engine.backbones.registry`); `clover_engine.checkpoint` re-exports `save_model` and `load_weights` as
its public API.

A checkpoint is a directory::

    config.json                      CloverConfig.to_json()
    model.safetensors                all weights, or, when sharded:
    model-00001-of-00003.safetensors ...
    model.safetensors.index.json     {"metadata": {"total_size": N}, "weight_map": {name: file}}
    tokenizer.json                   optional, a `tokenizers.Tokenizer`

Weights are read with `safetensors` only -- never `torch.load` / pickle, so
loading a checkpoint cannot run code. Loading is strict: a missing, extra or
mis-shaped tensor, a truncated or corrupt file, or a shard the index lists but
the directory lacks raises `ValueError` naming the file or tensor and the fix.
There is no checksum in the format, so flipped bits inside tensor *data* are
not detected (a flipped header is).

Tensor names are transformers' Qwen3.5-MoE names where the tensors mean the same thing
(``model.layers.{i}.mlp.experts.gate_up_proj`` ...; `clover_engine.backbones.clover.model.CloverModel`); checkpoints
written under older project names load through `LEGACY_KEYS`.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from clover_engine.backbones import load_progress
from clover_engine.backbones.checkpoint_dir import CONFIG_NAME, TOKENIZER_NAME, _checkpoint_dir
from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.backbones.clover.model import CloverModel

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
SHARD_PATTERN = "model-{index:05d}-of-{count:05d}.safetensors"
_SHARD_GLOB = "model-*-of-*.safetensors"
# A safetensors header is a few KB per thousand tensors; anything near this is not one.
_MAX_HEADER_BYTES = 100 * 2**20


# ----------------------------------------------------------------------------- saving
def save_model(
    model: torch.nn.Module,
    directory: str | Path,
    tokenizer: Any = None,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write `model` (and optionally its tokenizer) as a checkpoint directory.

    Tensors are written contiguous, on the CPU, in the dtype they have in the
    model. Tensors that share storage (tied weights) are cloned, so each name
    gets its own copy on disk; loading re-ties them through the model's own
    parameters. Weight files left by an earlier save in the same directory
    (``model.safetensors``, shards, index) are removed first, so the directory
    never holds two disagreeing copies; a ``tokenizer.json`` already there is
    kept unless `tokenizer` replaces it.

    Args:
        model: an ``nn.Module`` with a ``config`` attribute that has ``to_json(path)``
            (a `CloverConfig`).
        directory: output directory; created if absent.
        tokenizer: a ``tokenizers.Tokenizer`` to save as ``tokenizer.json``, or None.
        max_shard_bytes: if given and the weights exceed it, write shards of at most
            this many bytes each (a single larger tensor gets a shard of its own)
            plus ``model.safetensors.index.json``.

    Returns:
        The checkpoint directory as a `Path`.

    Raises:
        TypeError: if `model` has no ``config.to_json`` or `tokenizer` has no ``save``.
        ValueError: if `max_shard_bytes` is not positive, or a tensor lives on the
            ``meta`` device (nothing to save).
    """
    config = getattr(model, "config", None)
    if not hasattr(config, "to_json"):
        raise TypeError(
            f"save_model needs a model with a .config that has to_json() (a CloverConfig); "
            f"got {type(model).__name__} with config={type(config).__name__}"
        )
    if tokenizer is not None and not hasattr(tokenizer, "save"):
        raise TypeError(
            f"tokenizer must be a tokenizers.Tokenizer (with .save), got {type(tokenizer).__name__}"
        )
    if max_shard_bytes is not None and max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be a positive byte count, got {max_shard_bytes}")

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = _host_state_dict(model)
    total_bytes = sum(t.nbytes for t in tensors.values())

    for stale in [directory / WEIGHTS_NAME, directory / INDEX_NAME, *directory.glob(_SHARD_GLOB)]:
        stale.unlink(missing_ok=True)

    config.to_json(directory / CONFIG_NAME)
    if max_shard_bytes is None or total_bytes <= max_shard_bytes:
        _save_file_atomic(tensors, directory / WEIGHTS_NAME)
    else:
        groups = _shard_groups(tensors, max_shard_bytes)
        weight_map: dict[str, str] = {}
        for i, names in enumerate(groups, start=1):
            fname = SHARD_PATTERN.format(index=i, count=len(groups))
            _save_file_atomic({n: tensors[n] for n in names}, directory / fname)
            weight_map.update({n: fname for n in names})
        index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
        (directory / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.save(str(directory / TOKENIZER_NAME))
    return directory


def _host_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """state_dict on the CPU, contiguous, every tensor owning its own storage."""
    out: dict[str, torch.Tensor] = {}
    seen_storages: set[int] = set()
    for name, t in model.state_dict().items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state_dict entry {name!r} is a {type(t).__name__}, not a tensor")
        if t.is_meta:
            raise ValueError(f"tensor {name!r} is on the meta device; materialise the model first")
        t = t.detach().to("cpu").contiguous()
        storage = t.untyped_storage()
        # Tied weights share a storage; a slice views a bigger one. Both break
        # safetensors' one-tensor-one-buffer rule, so give each its own copy.
        if storage.data_ptr() in seen_storages or storage.nbytes() != t.nbytes:
            t = t.clone()
        if t.nbytes:
            seen_storages.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


def _shard_groups(tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> list[list[str]]:
    """Greedy split in state_dict order: a new shard when the next tensor would overflow."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, t in tensors.items():
        if groups[-1] and size + t.nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += t.nbytes
    return groups


def _save_file_atomic(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write to a temporary name then rename, so a crash never leaves a half file under `path`."""
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- loading
def load_clover(directory: str | Path, device: str | torch.device = "cpu",
                dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Open a Clover checkpoint directory (the registry's ``clover`` row;
    `clover_engine.checkpoint.load_model` documents it).

    Raises:
        ValueError: an invalid Clover config, or any weights problem listed in `load_weights`.
    """
    directory = Path(directory)
    config_path = directory / CONFIG_NAME
    try:
        config = CloverConfig.from_json(config_path)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{config_path} is not a valid Clover config: {e}") from e

    model = CloverModel(config)
    load_weights(model, directory)
    if dtype is not None:
        model.to(dtype=dtype)
    model.to(device)
    model.eval()
    try:
        setattr(model, "model_id", directory.name)
    except (AttributeError, TypeError):  # a model that forbids new attributes keeps working
        pass
    return model


@dataclass(frozen=True)
class KeyRule:
    """One rewrite of a stored tensor name into the model's current name(s).

    Attributes:
        pattern: a regular expression matched against the whole name (``re.fullmatch``).
        targets: ``re`` replacement templates (``\\1`` ...); one = a rename, several = the stored
            tensor is split into that many equal parts along dim 0, part i under ``targets[i]``.
        why: what changed, for the reader.
    """

    pattern: str
    targets: tuple[str, ...]
    why: str


LEGACY_KEYS: tuple[KeyRule, ...] = (
    KeyRule(r"(embed_tokens|layers|norm)\.(.*)", (r"model.\1.\2",),
            "embedding, layers and final norm moved under `model.`, as in transformers' Qwen3_5MoeForCausalLM"),
    KeyRule(r"(.*)\.mem_b", (r"\1.mem_logit_bias",),
            "GDN memory-unit logit bias (attention's `mem_b.weight`, a beta projection, keeps its name)"),
    KeyRule(r"(.*\.mlp)\.(gate_up_proj|down_proj)", (r"\1.experts.\2",),
            "routed experts moved under `mlp.experts.` (Qwen3_5MoeExperts)"),
    KeyRule(r"(.*\.mlp)\.shared_gate_up\.weight",
            (r"\1.shared_expert.gate_proj.weight", r"\1.shared_expert.up_proj.weight"),
            "the fused shared-expert [gate; up] projection split into Qwen3_5MoeMLP's gate_proj and up_proj"),
    KeyRule(r"(.*\.mlp)\.shared_down\.weight", (r"\1.shared_expert.down_proj.weight",),
            "shared-expert down projection renamed as in Qwen3_5MoeMLP"),
)
"""Old project name -> current name, for checkpoints written before a rename (applied at load,
every matching rule in order; `save_model` always writes current names). The shipped
``models/clover-tiny/model.safetensors`` is stored under the old names and loads through this map."""


def current_names(stored: str) -> list[tuple[str, int, int]]:
    """The model's name(s) for a tensor stored as ``stored`` (see `LEGACY_KEYS`).

    Returns:
        ``[(name, part, parts)]``: the stored tensor, split into ``parts`` equal pieces along
        dim 0, fills ``name`` with piece ``part`` (``parts == 1``: the whole tensor). A current
        name comes back unchanged as ``[(stored, 0, 1)]``.
    """
    out = [(stored, 0, 1)]
    for rule in LEGACY_KEYS:
        nxt = []
        for name, part, parts in out:
            m = re.fullmatch(rule.pattern, name)
            if m is None:
                nxt.append((name, part, parts))
            elif len(rule.targets) == 1:
                nxt.append((m.expand(rule.targets[0]), part, parts))
            else:
                if parts != 1:
                    raise ValueError(f"{stored!r} would be split twice by LEGACY_KEYS; fix the key map")
                nxt += [(m.expand(t), i, len(rule.targets)) for i, t in enumerate(rule.targets)]
        out = nxt
    return out


def load_weights(model: torch.nn.Module, path_or_dir: str | Path) -> torch.nn.Module:
    """Load a checkpoint's weights into an existing `model`, strictly.

    Every tensor of ``model.state_dict()`` must be present in the checkpoint
    with the same shape and the same kind of dtype (floating / integer / bool),
    and the checkpoint must hold nothing else. All files are checked before
    any weight is copied, so a refused checkpoint leaves `model` untouched.

    Args:
        model: the module to fill (weights are copied into its own tensors, so
            tied parameters stay tied and dtypes stay those of `model`).
        path_or_dir: checkpoint directory, or any file inside it.

    Returns:
        `model`, for chaining.

    Raises:
        ValueError: naming the file or tensor, when the directory is missing;
            there is no weights file (or both a single file and an index);
            the index is invalid or lists a shard that is missing; a file is
            truncated, padded or has a corrupt header; a floating tensor holds NaN
            or inf (bytes overwritten in place); a tensor is missing,
            unexpected, has the wrong shape or a dtype of another kind.
    """
    directory = _checkpoint_dir(path_or_dir)
    files = _weight_files(directory)  # {file: names the index assigns it, or None}

    # name -> (file, dtype, shape, stored name, part, parts): a legacy fused tensor fills several names
    found: dict[str, tuple[Path, str, tuple[int, ...], str, int, int]] = {}
    for path, listed in files.items():
        header = _read_header(path)
        try:  # safetensors' own checks (offsets vs shapes), before any weight is copied
            with safe_open(str(path), framework="pt", device="cpu") as f:
                bad = _first_non_finite(f, header)
        except SafetensorError as e:
            raise ValueError(f"cannot read {path}: {e}; re-save or re-download it") from e
        if bad is not None:
            raise ValueError(
                f"tensor {bad!r} in {path.name} holds NaN or infinite values: the file is corrupt (overwritten "
                f"bytes keep its size and header) or was saved from a diverged run -- re-save or re-download it"
            )
        if listed is not None:
            absent = sorted(set(listed) - set(header))
            if absent:
                raise ValueError(
                    f"{directory / INDEX_NAME} maps {_names(absent)} to {path.name}, but that "
                    f"shard does not contain it; the shard or the index is stale -- re-save the model"
                )
            extra = sorted(set(header) - set(listed))
            if extra:
                raise ValueError(
                    f"shard {path} holds {_names(extra)} that {INDEX_NAME} does not list; "
                    f"the index is stale -- re-save the model"
                )
        for stored, (dt, shape) in header.items():
            for name, part, parts in current_names(stored):
                if name in found:
                    raise ValueError(
                        f"tensor {name!r} appears twice (as {found[name][3]!r} in {found[name][0].name} and as "
                        f"{stored!r} in {path.name}); remove the stale file or tensor and re-save the model"
                    )
                if parts > 1 and (not shape or shape[0] % parts):
                    raise ValueError(
                        f"tensor {stored!r} in {path.name} has shape {list(shape)}; it should split into "
                        f"{parts} equal parts along dim 0 -- re-save the model"
                    )
                part_shape = (shape[0] // parts, *shape[1:]) if parts > 1 else shape
                found[name] = (path, dt, part_shape, stored, part, parts)

    expected = model.state_dict()
    missing = [n for n in expected if n not in found]
    if missing:
        shapes = ", ".join(f"{n!r} {list(expected[n].shape)}" for n in missing[:5])
        raise ValueError(
            f"checkpoint {directory} is missing {len(missing)} tensor(s) the model needs: {shapes}"
            f"{' ...' if len(missing) > 5 else ''}; it was saved from a different model version "
            f"or config -- re-save or re-convert it with this engine"
        )
    unexpected = [n for n in found if n not in expected]
    if unexpected:
        raise ValueError(
            f"checkpoint {directory} holds {len(unexpected)} tensor(s) this model does not have: "
            f"{_names(unexpected)} (in {found[unexpected[0]][0].name}); it was saved from a "
            f"different model version or config -- re-save or re-convert it with this engine"
        )
    for name, want in expected.items():
        path, dt, shape = found[name][:3]
        if shape != tuple(want.shape):
            raise ValueError(
                f"tensor {name!r} in {path.name} has shape {list(shape)}, the model expects "
                f"{list(want.shape)}; config.json and the weights disagree -- re-save the model"
            )
        if _dtype_kind(dt) != _dtype_kind(want.dtype):
            raise ValueError(
                f"tensor {name!r} in {path.name} is {dt}, the model holds {want.dtype}; "
                f"a {_dtype_kind(dt)} tensor cannot fill a {_dtype_kind(want.dtype)} one"
            )

    by_file: dict[Path, list[tuple[str, str, int, int]]] = {}
    for name, (path, _, _, stored, part, parts) in found.items():
        by_file.setdefault(path, []).append((name, stored, part, parts))
    load_progress.begin("reading weights", sum(p.stat().st_size for p in by_file))
    with torch.no_grad():
        for path, names in by_file.items():
            try:
                with safe_open(str(path), framework="pt", device="cpu") as f:
                    tensors = {}
                    for n, stored, i, parts in names:
                        whole = f.get_tensor(stored)
                        tensors[n] = whole if parts == 1 else whole.chunk(parts, 0)[i]
                        load_progress.advance(whole.nbytes // parts)  # a front end's progress bar and Stop
            except SafetensorError as e:
                raise ValueError(f"cannot read {path}: {e}; re-save or re-download it") from e
            result = model.load_state_dict(tensors, strict=False)
            assert not result.unexpected_keys, result.unexpected_keys
    return model


def _first_non_finite(f, header: dict[str, tuple[str, tuple[int, ...]]]) -> str | None:
    """The first floating tensor of an open safetensors file holding NaN or inf (None if none):
    bytes overwritten in place keep the header valid, so only the values tell. One tensor in
    memory at a time; clover-tiny's 25 MB take ~20 ms."""
    for name, (dt, _) in header.items():
        if _dtype_kind(dt) != "floating":
            continue
        t = f.get_tensor(name)
        if not bool(torch.isfinite(t.float() if t.element_size() == 1 else t).all()):  # fp8: isfinite via fp32
            return name
    return None


def _weight_files(directory: Path) -> dict[Path, list[str] | None]:
    """The weight files to read: {path: tensor names the index assigns it (None if unsharded)}."""
    single, index_path = directory / WEIGHTS_NAME, directory / INDEX_NAME
    if single.is_file() and index_path.is_file():
        raise ValueError(
            f"{directory} holds both {WEIGHTS_NAME} and {INDEX_NAME}; one is stale -- delete it "
            f"(save_model never leaves both)"
        )
    if single.is_file():
        return {single: None}
    if not index_path.is_file():
        raise ValueError(
            f"{directory} has no weights: expected {WEIGHTS_NAME} or {INDEX_NAME} with its shards "
            f"(save them with clover_engine.checkpoint.save_model)"
        )
    try:
        index = json.loads(index_path.read_text())
        weight_map = index["weight_map"]
        assert isinstance(weight_map, dict) and all(isinstance(v, str) for v in weight_map.values())
    except (json.JSONDecodeError, KeyError, TypeError, AssertionError) as e:
        raise ValueError(
            f"{index_path} is not a valid index (need {{\"weight_map\": {{tensor: shard file}}}}): "
            f"{type(e).__name__} {e}; re-save the model"
        ) from e
    files: dict[Path, list[str]] = {}
    for name, fname in weight_map.items():
        if "/" in fname or "\\" in fname or fname in ("", ".", ".."):
            raise ValueError(
                f"{index_path} maps {name!r} to {fname!r}; shards must be plain file names "
                f"inside {directory}"
            )
        files.setdefault(directory / fname, []).append(name)
    for path, names in files.items():
        if not path.is_file():
            raise ValueError(
                f"shard {path.name} listed in {index_path} is missing ({len(names)} tensors, e.g. "
                f"{names[0]!r}); copy or download every shard, or re-save the model"
            )
    return files


def _read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Parse and check a safetensors header: {name: (dtype, shape)}.

    Checks what the format allows: the header length fits the file, the
    header is JSON, and the tensor data exactly fills the rest of the file
    (a shorter file is truncated, a longer one padded or appended to).
    """
    size = path.stat().st_size
    fix = "re-save or re-download it"
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path} is {size} bytes, too short to be a safetensors file; {fix}")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(size - 8, _MAX_HEADER_BYTES):
            raise ValueError(
                f"{path}: header length field says {header_len} bytes but the file has {size - 8} "
                f"after it -- the file is truncated or not a safetensors file; {fix}"
            )
        raw = f.read(header_len)
    try:
        header = json.loads(raw.decode("utf-8"))
        assert isinstance(header, dict)
    except (UnicodeDecodeError, json.JSONDecodeError, AssertionError) as e:
        raise ValueError(f"{path}: corrupt safetensors header ({type(e).__name__}: {e}); {fix}") from e

    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    data_end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dt, shape, (begin, end) = info["dtype"], tuple(int(s) for s in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: corrupt header entry for tensor {name!r} ({e}); {fix}") from e
        out[name] = (str(dt), shape)
        data_end = max(data_end, int(end))
    data_bytes = size - 8 - header_len
    if data_end != data_bytes:
        what = "truncated" if data_end > data_bytes else "longer than its header describes"
        raise ValueError(
            f"{path} is {what}: the header expects {data_end} bytes of tensor data, the file holds "
            f"{data_bytes}; {fix}"
        )
    return out


def _dtype_kind(dt: str | torch.dtype) -> str:
    """'bool', 'floating', 'complex' or 'integer', for a torch dtype or a safetensors dtype name."""
    if isinstance(dt, torch.dtype):
        if dt == torch.bool:
            return "bool"
        return "floating" if dt.is_floating_point else ("complex" if dt.is_complex else "integer")
    if dt == "BOOL":
        return "bool"
    # safetensors names: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 ... / C64 / I8..I64 U8..U64
    return "floating" if dt.startswith(("F", "BF")) else ("complex" if dt.startswith("C") else "integer")


def _names(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")
