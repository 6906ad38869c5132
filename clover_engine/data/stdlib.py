"""Real text: the running CPython's standard-library ``.py`` sources, split by file.

Files: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]``, except
- directories ``site-packages``, ``dist-packages``, ``__pycache__`` (not the stdlib), and
  ``test``, ``tests``, ``idle_test`` (test suites: ~19 MB of deliberately odd code and data),
- files over `MAX_FILE_BYTES` (generated tables) and files that are not valid UTF-8.

Split rule (fixed, by file): a file is held out iff the first byte of
``sha1(relative posix path)`` is < `HELDOUT_BYTE_BELOW` (13/256 ~ 5 %); the rest is train.
The corpus depends on the CPython version; `manifest()` records it and a content hash for
the model card.

Wing: ``ground``.
"""

from __future__ import annotations

import functools
import hashlib
import random
import sys
import sysconfig
from pathlib import Path
from typing import Iterator

MAX_FILE_BYTES = 200_000
HELDOUT_BYTE_BELOW = 13
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})
EOT = "<|endoftext|>"
SPLITS = ("train", "heldout")


def stdlib_root() -> Path:
    """The stdlib directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relpath: str) -> str:
    """``"heldout"`` or ``"train"`` for a posix path relative to the stdlib root."""
    return "heldout" if hashlib.sha1(relpath.encode("utf-8")).digest()[0] < HELDOUT_BYTE_BELOW else "train"


@functools.lru_cache(maxsize=1)
def _scan() -> tuple[tuple[str, str, str], ...]:
    """Sorted (relpath, split, sha256 of bytes) of every kept file."""
    root = stdlib_root()
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]) or not path.is_file():
            continue
        data = path.read_bytes()
        if len(data) > MAX_FILE_BYTES:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        relpath = rel.as_posix()
        out.append((relpath, split_of(relpath), hashlib.sha256(data).hexdigest()))
    return tuple(out)


def stdlib_files(split: str) -> list[Path]:
    """Absolute paths of the files of `split` ("train" | "heldout"), sorted by relative path."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    root = stdlib_root()
    return [root / rel for rel, s, _ in _scan() if s == split]


def manifest() -> dict:
    """File lists and a corpus hash for the model card.

    ``sha256`` hashes the lines ``"<relpath>\\t<sha256 of file bytes>\\n"`` of all kept files in
    sorted order, followed by the split of each (so a change of rule or content changes it).
    """
    rows = _scan()
    h = hashlib.sha256()
    for rel, s, digest in rows:
        h.update(f"{rel}\t{digest}\t{s}\n".encode("utf-8"))
    return {
        "python": sys.version.split()[0],
        "rule": (f"*.py under sysconfig stdlib, excluding dirs {sorted(EXCLUDED_DIRS)}, files > "
                 f"{MAX_FILE_BYTES} bytes and non-UTF-8; heldout iff sha1(relpath)[0] < {HELDOUT_BYTE_BELOW}"),
        "train": [rel for rel, s, _ in rows if s == "train"],
        "heldout": [rel for rel, s, _ in rows if s == "heldout"],
        "n_files": len(rows),
        "sha256": h.hexdigest(),
    }


def iter_stdlib_text(split: str, seed: int = 0) -> Iterator[str]:
    """One pass over `split` in an order shuffled by ``random.Random(seed)``.

    Yields each file's text followed by ``<|endoftext|>``. Loop with seed + epoch for more passes.
    """
    files = stdlib_files(split)
    random.Random(seed).shuffle(files)
    for path in files:
        yield path.read_bytes().decode("utf-8") + EOT  # bytes as-is (no newline translation)
