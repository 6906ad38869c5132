"""The bundled model (``models/clover-tiny`` of this checkout, or of the installed wheel), found and loaded
whatever the working directory (a notebook runs in ``notebooks/``). Wing ``experiments``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_experiments.py -q``
"""

from __future__ import annotations

from pathlib import Path

import torch

from clover_engine.checkpoint import DEFAULT_MODEL_DIR, bundled_models_dir, find_model_dir, load_model, load_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]


def bundled_model_dir() -> Path:
    """The bundled model's directory (``models/clover-tiny`` of this checkout, or the installed wheel's
    copy), whatever the working directory (a notebook runs in ``notebooks/``)."""
    return bundled_models_dir() / Path(DEFAULT_MODEL_DIR).name


def load_bundled(model_dir: str | Path | None = None, threads: int | None = 1):
    """Load a model and its tokenizer for a measurement.

    Args:
        model_dir: a checkpoint directory; a relative path is taken from the repository
            root, not the working directory, or names a bundled model (`clover_engine.checkpoint.find_model_dir`;
            default: `bundled_model_dir`).
        threads: torch CPU threads to set (None: leave torch's setting alone). One thread
            is the right count on a small shared machine (see `clover_engine.threads`).

    Returns:
        ``(model, tokenizer)``, the model in eval mode.

    Raises:
        ValueError: no checkpoint there (from `clover_engine.checkpoint.load_model`, naming the path).
    """
    if threads is not None:
        torch.set_num_threads(int(threads))
    path = bundled_model_dir() if model_dir is None else Path(model_dir)
    if not path.is_absolute():
        path = REPO_ROOT / path if (REPO_ROOT / path).exists() else Path(find_model_dir(str(path)))
    return load_model(path), load_tokenizer(path)
