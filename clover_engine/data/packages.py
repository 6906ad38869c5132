"""Real code beyond the stdlib: the ``.py`` sources of installed third-party packages, split by package.

The project's own install (``bash .ci/install test``) puts numpy, torch, transformers, panel,
plotly, pandas ... in the virtual environment; their sources are broader code than the
standard library (array code, model code, web front ends, type-annotated libraries).

Split rule (fixed, by package): `HELDOUT_PACKAGES` are never trained on, so an evaluation on
them measures code the model has not seen from libraries it has not seen; `TRAIN_PACKAGES`
are the training corpus. A package that is not installed is skipped (the manifest says so).

Per package, files are every ``*.py`` the distribution installed (``importlib.metadata``
RECORD), except test suites (``tests`` / ``test`` / ``testing`` directories), files over
`MAX_FILE_BYTES` and files that are not UTF-8; taken in the order of ``sha1(relative path)``
until `MAX_PACKAGE_BYTES`, so torch and transformers do not drown the small libraries.

Licences: only distributions whose metadata declares a permissive licence (BSD, MIT, Apache,
PSF, ISC, MPL -- `PERMISSIVE`) are used; the manifest records each one's licence string. The
corpus depends on the installed versions; `manifest()` records them and a content hash.

Wing: ``ground``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata as md
import random
import re
from pathlib import Path
from typing import Iterator

MAX_FILE_BYTES = 200_000
MAX_PACKAGE_BYTES = 3_000_000
TRAIN_PACKAGES = (
    "numpy", "torch", "transformers", "tokenizers", "safetensors", "peft", "accelerate", "huggingface_hub",
    "panel", "param", "bokeh", "plotly", "ipywidgets", "traitlets", "nbformat", "tornado", "IPython",
    "pyarrow", "networkx", "pydantic", "requests", "fsspec", "packaging", "markdown", "tqdm", "pytest", "filelock",
)
HELDOUT_PACKAGES = ("pandas", "jinja2", "pygments", "psutil")
SPLITS = ("train", "heldout")
EXCLUDED_DIRS = frozenset({"tests", "test", "testing", "__pycache__"})
PERMISSIVE = re.compile(r"\b(BSD|MIT|Apache|PSF|Python Software Foundation|ISC|MPL)", re.IGNORECASE)
EOT = "<|endoftext|>"


def licence_of(dist: md.Distribution) -> str:
    """The distribution's declared licence: ``License-Expression``, else ``License`` (first line),
    else its ``License ::`` classifiers joined; ``""`` when it declares none."""
    meta = dist.metadata
    text = (meta.get("License-Expression") or meta.get("License") or "").strip().splitlines()
    if text and text[0].strip():
        return text[0].strip()
    return "; ".join(c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License"))


@functools.lru_cache(maxsize=None)
def _package(name: str) -> tuple[str | None, str, tuple[tuple[str, Path, str], ...]]:
    """(version or None when not installed / not permissive, licence, ((relpath, path, sha256), ...))."""
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        return None, "", ()
    lic = licence_of(dist)
    if not PERMISSIVE.search(lic):
        return None, lic, ()
    picked = []
    for f in dist.files or []:
        rel = f.as_posix()
        parts = rel.split("/")
        if not rel.endswith(".py") or any(p in EXCLUDED_DIRS for p in parts[:-1]) or parts[0].endswith(
                (".dist-info", ".data")) or rel.startswith(".."):
            continue
        picked.append((hashlib.sha1(rel.encode("utf-8")).hexdigest(), rel, Path(dist.locate_file(f))))
    out, total = [], 0
    for _, rel, path in sorted(picked):
        if not path.is_file():
            continue
        data = path.read_bytes()
        if len(data) > MAX_FILE_BYTES or total + len(data) > MAX_PACKAGE_BYTES:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        total += len(data)
        out.append((rel, path, hashlib.sha256(data).hexdigest()))
    return dist.version, lic, tuple(out)


def package_files(split: str) -> list[Path]:
    """Absolute paths of the kept files of `split` ("train" | "heldout"), package by package in
    `TRAIN_PACKAGES` / `HELDOUT_PACKAGES` order, each package's in sha1(relpath) order.

    Raises:
        ValueError: an unknown split.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    names = TRAIN_PACKAGES if split == "train" else HELDOUT_PACKAGES
    return [path for name in names for _, path, _ in _package(name)[2]]


def manifest() -> dict:
    """Per package: version (None = not installed or not permissively licensed), licence, file
    count and bytes; plus a corpus hash over ``"<package>\\t<relpath>\\t<sha256>\\t<split>"`` lines."""
    h = hashlib.sha256()
    packages = {}
    for split, names in (("train", TRAIN_PACKAGES), ("heldout", HELDOUT_PACKAGES)):
        for name in names:
            version, lic, files = _package(name)
            packages[name] = {"split": split, "version": version, "licence": lic, "files": len(files),
                              "bytes": sum(p.stat().st_size for _, p, _ in files)}
            for rel, _, digest in files:
                h.update(f"{name}\t{rel}\t{digest}\t{split}\n".encode("utf-8"))
    return {"rule": (f"*.py of each distribution's RECORD, minus dirs {sorted(EXCLUDED_DIRS)}, files > "
                     f"{MAX_FILE_BYTES} bytes and non-UTF-8, in sha1(relpath) order up to {MAX_PACKAGE_BYTES} "
                     f"bytes per package; permissive licences only"),
            "packages": packages, "sha256": h.hexdigest()}


def iter_package_text(split: str, seed: int = 0) -> Iterator[str]:
    """One pass over `split`'s files in an order shuffled by ``random.Random(seed)``; each file's
    text followed by ``<|endoftext|>``."""
    files = package_files(split)
    random.Random(seed).shuffle(files)
    for path in files:
        yield path.read_bytes().decode("utf-8") + EOT


__all__ = ["HELDOUT_PACKAGES", "TRAIN_PACKAGES", "iter_package_text", "licence_of", "manifest", "package_files"]
