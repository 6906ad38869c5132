"""Model loading for notebooks and benchmarks: the bundled model, or a labelled clover-test fallback.

``load_demo_model()`` loads ``models/clover-tiny`` (found from the working
directory or the repository root) when it holds a checkpoint; while it does
not (the bundled model is trained separately), it builds ``clover-test`` with
seeded random weights, every matrix multiplied by ``scale`` so that
confidences are peaked and a decode shows accepted as well as forced slots.
The label says which one you got -- a random model's text is noise.

No Panel or ipywidgets import here (the notebook and ``benchmarks/`` use it).

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_widgets.py -q``
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
from engine.checkpoint import DEFAULT_MODEL_DIR as BUNDLED_MODEL_DIR  # noqa: E402
FALLBACK_SEED = 0
FALLBACK_SCALE = 15.0


@dataclass
class DemoModel:
    """What `load_demo_model` returns: the model, its tokenizer, a human label and whether it is the fallback."""

    model: Any
    tokenizer: Any
    label: str
    fallback: bool


def find_checkpoint(model_dir: str | Path = BUNDLED_MODEL_DIR) -> Path | None:
    """The checkpoint directory (``config.json`` + weights) from the working directory or the repo root, or None."""
    p = Path(model_dir).expanduser()
    for cand in ([p] if p.is_absolute() else [Path.cwd() / p, REPO_ROOT / p]):
        has_weights = (cand / "model.safetensors").is_file() or (cand / "model.safetensors.index.json").is_file()
        if (cand / "config.json").is_file() and has_weights:
            return cand.resolve()
    return None


def fallback_model(seed: int = FALLBACK_SEED, scale: float = FALLBACK_SCALE) -> Any:
    """``clover-test`` with seeded random weights, every >= 2-D parameter multiplied by ``scale`` (eval mode)."""
    import torch

    from engine.config import CloverConfig
    from engine.model import CloverModel

    torch.manual_seed(seed)
    model = CloverModel(CloverConfig.from_name("clover-test"))
    if scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.mul_(scale)
    return model.eval()


def load_demo_model(model_dir: str | Path = BUNDLED_MODEL_DIR, allow_fallback: bool = True) -> DemoModel:
    """Load the bundled model, or (``allow_fallback``) the labelled random clover-test stand-in.

    Raises:
        ValueError: when no checkpoint is found and ``allow_fallback`` is False.
    """
    found = find_checkpoint(model_dir)
    if found is not None:
        from engine.checkpoint import load_model, load_tokenizer

        return DemoModel(load_model(found), load_tokenizer(found), f"{found.name} (trained checkpoint, {found})", False)
    if not allow_fallback:
        raise ValueError(f"no checkpoint (config.json + model.safetensors) at {str(model_dir)!r}")
    from engine.tokenizer import byte_tokenizer

    return DemoModel(
        fallback_model(), byte_tokenizer(),
        f"FALLBACK: random clover-test (seed {FALLBACK_SEED}, weights x{FALLBACK_SCALE:g}) -- {model_dir} not found; "
        "its text is noise, the mechanics are real", True,
    )
