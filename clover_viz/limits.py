"""What a visitor of the served explorer can reach on the server: model roots, memory before a
load, the size of an uploaded trace.

Wing: front ends (`clover_viz`), below `clover_viz.models` (no model or Panel import). The
notebook `Explorer` and the command line run as their user and use none of this; the served
app (`clover_viz.explorer`, which `apps/explorer.py` and ``clover-explorer serve`` serve) applies all of it:

* **model roots** -- the app resolves model names and paths only inside `model_roots` (the
  bundled ``models/``, plus ``--model-root`` / ``CLOVER_MODEL_ROOTS``, else ``./runs`` and
  ``./models`` of the directory the server started in); anything else gets `OUTSIDE_ROOTS`,
  one sentence whether or not the path exists (`clover_viz.models.resolve_model`); a hub id
  (``org/name[@revision]``) loads only when the host lists it (``--model-id`` / ``CLOVER_MODEL_IDS``,
  `ListedHubId`), any other gets that same sentence;
* **memory** -- `weight_bytes` reads a checkpoint's safetensors headers (and the pinned base an
  adapter names) and `check_memory` refuses a model that would not fit in the memory the server
  has free, with the numbers, before anything is allocated;
* **uploads** -- a trace file is at most `MAX_TRACE_UPLOAD_BYTES` (``CLOVER_MAX_UPLOAD_MB``),
  within what the server's websocket carries (`upload_limit_for_socket`).

The server-wide cap on loaded models is `clover_viz.models.MODEL_CACHE_SIZE`.

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_limits.py tests/apps/test_browser_limits.py -q``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from clover_engine.backbones.causal_lm.adapter import _base_cache, base_spec, locate_base
from clover_engine.backbones.hub import HUB_ID_SHAPE, parse_hub_id
from clover_engine.cost.plan import LOAD_OVERHEAD  # the measured peak per weight byte, one number for both

MB = 1024 * 1024
DEFAULT_MAX_UPLOAD_MB = 12.0
"""A trace upload's default limit: 12 MB, sent base64-encoded (16 MB), fits Bokeh's default websocket
message limit of 20 MB, so a plain ``panel serve`` needs no flag. Saved traces are ~0.1-1 MB."""
MAX_TRACE_UPLOAD_BYTES = int(float(os.environ.get("CLOVER_MAX_UPLOAD_MB") or DEFAULT_MAX_UPLOAD_MB) * MB)
SOCKET_OVERHEAD_BYTES = 64 * 1024  # a websocket message's JSON around the base64 file
MEMORY_RESERVE_BYTES = 512 * MB  # kept free for the server itself and the sessions' decodes
ROOTS_ENV = "CLOVER_MODEL_ROOTS"
HUB_IDS_ENV = "CLOVER_MODEL_IDS"

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "C64": 8}
_MAX_HEADER_BYTES = 100 * MB


class NotEnoughMemory(ValueError):
    """A model refused before loading: its weights would not fit in the memory the server has free."""


# ----------------------------------------------------------------------------- model roots
class ListedHubId(str):
    """A hub model (``org/name`` or ``org/name@revision``, as the host wrote it) the served app loads by id:
    an entry of `model_roots` beside the folders, so that the roots, wherever they are handed on (a
    session keeps ``tuple(roots)``), carry it. `folder_roots` and `listed_hub_ids` split them."""


def model_roots(argv: Sequence[str] = (), environ: Mapping[str, str] | None = None,
                start_dir: Path | None = None, bundled: Path | None = None) -> tuple[Path | ListedHubId, ...]:
    """The directories the served app takes models from, resolved (symlinks, ``..``, ``~``), then the hub
    models it loads by id (`ListedHubId`).

    Args:
        argv: the app's arguments (``panel serve apps/explorer.py --args --model-root DIR --model-id
            org/name ...``); ``--model-root`` and ``--model-id`` may repeat; other arguments are left alone.
        environ: where ``CLOVER_MODEL_ROOTS`` (`os.pathsep`-separated), ``CLOVER_MODEL_IDS`` (hub ids,
            separated by commas or spaces) and ``CLOVER_MODEL_DIR`` are read (default `os.environ`).
        start_dir: the server's start directory (default the working directory).
        bundled: the bundled models' directory (always a root).

    Returns:
        the bundled directory, then the configured roots -- or, with none configured, ``./runs`` and
        ``./models`` of ``start_dir`` -- then ``CLOVER_MODEL_DIR`` when set (the model the page opens on;
        a hub id there, when no such folder exists, is listed as a hub id instead) -- then the hub ids of
        ``--model-id`` and ``CLOVER_MODEL_IDS``, in order, each once; none unless configured.

    Raises:
        ValueError: a ``--model-id`` / ``CLOVER_MODEL_IDS`` entry not shaped ``org/name[@revision]``.
    """
    env = os.environ if environ is None else environ
    start = Path.cwd() if start_dir is None else Path(start_dir)
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--model-root", action="append", default=[])
    parser.add_argument("--model-id", action="append", default=[])
    known = parser.parse_known_args(list(argv))[0]
    given = list(known.model_root)
    given += [p for p in (env.get(ROOTS_ENV) or "").split(os.pathsep) if p.strip()]
    ids = [*known.model_id, *(env.get(HUB_IDS_ENV) or "").replace(",", " ").split()]
    roots = [start / "runs", start / "models"] if not given else [start / Path(p).expanduser() for p in given]
    if env.get("CLOVER_MODEL_DIR"):
        opened = env["CLOVER_MODEL_DIR"].strip()
        if parse_hub_id(opened) is not None and not (start / opened).exists():
            ids.append(opened)
        else:
            roots.append(start / Path(opened).expanduser())
    if bundled is not None:
        roots.insert(0, bundled)
    out: list[Path] = []
    for r in roots:
        r = r.resolve()
        if r not in out:
            out.append(r)
    bad = [i for i in ids if not HUB_ID_SHAPE.fullmatch(i.strip())]
    if bad:
        raise ValueError(f"--model-id / {HUB_IDS_ENV}: {', '.join(map(repr, bad))} is not a hub id "
                         "(org/name or org/name@revision); list folders with --model-root")
    return (*out, *(ListedHubId(i) for i in dict.fromkeys(i.strip() for i in ids)))


def as_roots(entries: Iterable[Path | str] | None) -> tuple[Path | ListedHubId, ...] | None:
    """Model roots as a session keeps them: each folder (a `Path` or a string) resolved (``~``, symlinks,
    ``..``), each `ListedHubId` as it is; None stays None (any path: notebooks, scripts)."""
    if entries is None:
        return None
    if isinstance(entries, (str, Path)):  # one folder, not its characters
        entries = [entries]
    return tuple(r if isinstance(r, ListedHubId) else Path(r).expanduser().resolve() for r in entries)


def folder_roots(roots: Iterable[Path | str]) -> tuple[Path, ...]:
    """The folders of `model_roots`' entries (without the listed hub ids)."""
    return tuple(r for r in roots if not isinstance(r, ListedHubId))


def listed_hub_ids(roots: Iterable[Path | str]) -> tuple[str, ...]:
    """The hub ids of `model_roots`' entries (`ListedHubId`), as the host wrote them."""
    return tuple(str(r) for r in roots if isinstance(r, ListedHubId))


def listed_hub_id(text: str, roots: Iterable[Path | str]) -> str | None:
    """``text`` (stripped) when it is a hub id (`clover_engine.backbones.hub.parse_hub_id`: not a local path)
    the host listed in ``roots`` (compared as written: ``org/name`` and ``org/name@main`` are two entries),
    else None."""
    ref = parse_hub_id(text)
    return str(ref) if ref is not None and str(ref) in listed_hub_ids(roots) else None


def inside_roots(path: Path, roots: Iterable[Path]) -> bool:
    """Whether ``path``, resolved (symlinks followed, ``..`` and ``~`` applied), lies in one of ``roots``."""
    real = Path(path).expanduser().resolve()
    return any(real == r or r in real.parents for r in folder_roots(roots))


def shown_roots(roots: Iterable[Path], start_dir: Path | None = None) -> str:
    """The roots as a visitor reads them: relative to the server's start directory where inside it."""
    start = (Path.cwd() if start_dir is None else start_dir).resolve()
    shown = []
    for r in folder_roots(roots):
        try:
            shown.append(r.relative_to(start).as_posix() + "/")
        except ValueError:
            shown.append(str(r) + "/")
    return ", ".join(shown)


def outside_roots(roots: Sequence[Path], bundled_names: Sequence[str]) -> str:
    """`OUTSIDE_ROOTS`: the one refusal for a model path outside the roots, existing or not, and for a hub
    id the host did not list (it names neither the path nor anything about it); with hub ids listed
    (`ListedHubId`) it offers them too."""
    text = OUTSIDE_ROOTS.format(names=", ".join(bundled_names) or "none", roots=shown_roots(roots))
    ids = listed_hub_ids(roots)
    return text + (f", or one of its hub models ({', '.join(ids)})" if ids else "")


OUTSIDE_ROOTS = ("this server loads models only from its model folders; pick a bundled model ({names}) or "
                 "enter a checkpoint directory under {roots}")


# ----------------------------------------------------------------------------- memory
def safetensors_bytes(path: Path) -> int:
    """Bytes of the tensors a safetensors file declares, from its header only (8-byte little-endian
    length, then JSON); the tensor data is not read, nor checked to be there.

    Raises:
        ValueError: not a safetensors header.
    """
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path.name} is too short to be a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER_BYTES:
            raise ValueError(f"{path.name}: a safetensors header of {n} bytes is not credible")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path.name}: corrupt safetensors header ({exc})") from exc
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            total += _DTYPE_BYTES.get(str(info["dtype"]), 4) * math.prod(int(s) for s in info["shape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path.name}: corrupt header entry for {name!r} ({exc})") from exc
    return total


def weight_bytes(directory: str | Path) -> int:
    """The weight bytes a checkpoint directory will hold in memory: every ``*.safetensors`` file in it
    (shards, adapter, extra embeddings) from their headers, plus the base model an adapter names
    (``config.json``'s ``base_path`` beside it, or a pinned ``base``: its fp32 cache when present, else
    its GGUF's tensor count x 4 bytes, else 8x the GGUF file)."""
    directory = Path(directory)
    total = sum(safetensors_bytes(p) for p in sorted(directory.glob("*.safetensors")))
    try:
        cfg = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return total
    if not isinstance(cfg, dict):
        return total
    if cfg.get("base_path"):
        base_dir = (directory / str(cfg["base_path"])).resolve()
        if directory.resolve() in base_dir.parents:
            total += sum(safetensors_bytes(p) for p in sorted(base_dir.glob("*.safetensors")))
    elif cfg.get("base"):
        total += _pinned_base_bytes(str(cfg["base"]))
    return total


def _pinned_base_bytes(name: str) -> int:
    """The fp32 bytes of a pinned PyPI base (`clover_engine.backbones.causal_lm.adapter`), 0 when not installed."""
    try:
        cached = _base_cache(base_spec(name)) / "model.safetensors"
        if cached.is_file():
            return safetensors_bytes(cached)
        gguf = locate_base(name)
    except (ValueError, OSError, ImportError):
        return 0  # unknown or missing base: the load itself says so
    try:
        from gguf import GGUFReader

        return 4 * sum(int(t.n_elements) for t in GGUFReader(str(gguf)).tensors)
    except Exception:  # noqa: BLE001  (no gguf package, or an unreadable file: the conservative guess)
        return 8 * gguf.stat().st_size


def free_memory_bytes() -> int:
    """Memory the server can still allocate: ``psutil.virtual_memory().available``, else
    ``MemAvailable`` of ``/proc/meminfo``."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    raise OSError("cannot tell the free memory: install psutil")


def memory_need_bytes(need_bytes: int) -> int:
    """Bytes a model of ``need_bytes`` of weights needs free to load and decode in the served app:
    ``need_bytes x LOAD_OVERHEAD + MEMORY_RESERVE_BYTES`` (the lean loader's measured peak, plus the reserve)."""
    return int(need_bytes * LOAD_OVERHEAD) + MEMORY_RESERVE_BYTES


def memory_estimate(need_bytes: int, free_bytes: int, reserved_bytes: int = 0) -> str:
    """The memory rule's numbers as the page shows them before a load's weights are read: ``needs about
    14.9 GB to load and decode (13.7 GB of weights x1.05, the measured peak, plus 0.5 GB kept free); the
    server has 18.5 GB free`` (and how much of it loads under way have taken)."""
    under_way = f", {_gb(reserved_bytes)} of it taken by loads under way" if reserved_bytes else ""
    return (f"needs about {_gb(memory_need_bytes(need_bytes))} to load and decode ({_gb(need_bytes)} of weights "
            f"x{LOAD_OVERHEAD:g}, the measured peak, plus {_gb(MEMORY_RESERVE_BYTES)} kept free); the server has "
            f"{_gb(free_bytes)} free{under_way}")


def check_memory(name: str, need_bytes: int, reserved_bytes: int = 0, free_bytes: int | None = None) -> str:
    """Refuse a model whose weights would not fit: `memory_need_bytes` against the free memory less
    ``reserved_bytes`` (other loads under way).

    Returns:
        the estimate that admitted it (`memory_estimate`), for the page to show while it loads.

    Raises:
        NotEnoughMemory: with the numbers.
    """
    free = free_memory_bytes() if free_bytes is None else free_bytes
    estimate = memory_estimate(need_bytes, free, reserved_bytes)
    if memory_need_bytes(need_bytes) > free - reserved_bytes:
        raise NotEnoughMemory(f"{name} {estimate}; pick a smaller model, or ask whoever runs the server")
    return estimate


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


# ----------------------------------------------------------------------------- uploads
def upload_limit_for_socket(websocket_bytes: int) -> int:
    """The largest file one websocket message of ``websocket_bytes`` carries (base64: 4 bytes per 3)."""
    return max(0, (websocket_bytes - SOCKET_OVERHEAD_BYTES) * 3 // 4)


def websocket_bytes_for(upload_bytes: int) -> int:
    """The websocket message limit an upload limit needs (``--websocket-max-message-size``)."""
    return -(-upload_bytes * 4 // 3) + SOCKET_OVERHEAD_BYTES


def websocket_limit_bytes(session_context: object) -> int | None:
    """The message limit of the websocket a served session is connected through (the server's
    ``--websocket-max-message-size``), or None when it cannot be told (no connection yet)."""
    session = getattr(session_context, "_session", None)
    for conn in list(getattr(session, "_subscribed_connections", ()) or ()):
        settings = getattr(getattr(conn, "_socket", None), "settings", None) or {}
        if settings.get("websocket_max_message_size"):
            return int(settings["websocket_max_message_size"])
    return None


def size_text(n: int) -> str:
    """``12 MB``, ``1.5 MB``, ``800 KB``: an upload size as the page states it."""
    if n >= MB:
        return f"{n / MB:.1f}".removesuffix(".0") + " MB"
    return f"{n / 1024:.1f}".removesuffix(".0") + " KB"


__all__ = [
    "DEFAULT_MAX_UPLOAD_MB", "HUB_IDS_ENV", "LOAD_OVERHEAD", "MAX_TRACE_UPLOAD_BYTES", "MEMORY_RESERVE_BYTES",
    "OUTSIDE_ROOTS", "ROOTS_ENV", "ListedHubId", "NotEnoughMemory", "check_memory", "folder_roots",
    "free_memory_bytes", "inside_roots", "listed_hub_id", "listed_hub_ids", "memory_estimate", "memory_need_bytes",
    "model_roots",
    "outside_roots", "safetensors_bytes", "shown_roots", "size_text", "upload_limit_for_socket",
    "weight_bytes", "websocket_bytes_for", "websocket_limit_bytes",
]
