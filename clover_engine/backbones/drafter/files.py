"""A drafter's directory on disk (backbones wing, drafter family): ``config.json`` (``model_type``
``block-drafter``, the pinned base it drafts for, the chat format, the `DrafterConfig`) and
``drafter.safetensors`` (the trained weights only, stored in fp16 -- the base's embeddings and LM head are read
from the pinned base, never copied).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from clover_engine.backbones.drafter.net import DrafterConfig, build_drafter

MODEL_TYPE = "block-drafter"
WEIGHTS = "drafter.safetensors"


def save_drafter(directory: Path, drafter: nn.Module, base: str, minutes: float = 0.0,
                 metrics: dict | None = None, recipe: dict | None = None, chat_format: str = "chatml") -> Path:
    """Write ``config.json`` and ``drafter.safetensors`` of a `BlockDrafter` or `MedusaDrafter` (its
    ``cfg.arch`` is recorded) into ``directory`` (created); returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": MODEL_TYPE, "name": directory.name if directory.name != "model" else directory.parent.name,
           "base": base, "chat_format": chat_format, "mask_token_id": drafter.cfg.mask_token_id,
           "minutes": round(float(minutes), 2), "drafter": drafter.cfg.to_dict()}
    if metrics:
        cfg["heldout"] = metrics
    if recipe:
        cfg["recipe"] = recipe
    # fp16 on disk halves the shipped file; the loader casts back into the fp32 parameters
    sd = {k: (v.detach().half() if v.is_floating_point() else v.detach()).contiguous()
          for k, v in drafter.state_dict().items()}
    tmp = directory / (WEIGHTS + ".tmp")
    save_file(sd, str(tmp), metadata={"format": "pt"})
    tmp.replace(directory / WEIGHTS)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return directory


def read_drafter_config(directory: str | Path) -> dict[str, Any]:
    """The drafter directory's ``config.json``.

    Raises:
        ValueError: when it is missing, not JSON, or not a ``block-drafter`` config.
    """
    path = Path(directory) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{directory} has no readable config.json ({e})") from None
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); re-save the drafter") from None
    if cfg.get("model_type") != MODEL_TYPE or "drafter" not in cfg:
        raise ValueError(f"{path} is not a drafter config (model_type {cfg.get('model_type')!r}, "
                         f"expected {MODEL_TYPE!r} with a 'drafter' section)")
    return cfg


def load_drafter_net(directory: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """The trained network of a drafter directory (eval mode, fp32) -- a `BlockDrafter`, or a
    `MedusaDrafter` for ``arch: medusa`` -- and its config.json.

    Raises:
        ValueError: a bad config (see `read_drafter_config`), missing or mismatched weights.
    """
    cfg = read_drafter_config(directory)
    try:
        net = build_drafter(DrafterConfig.from_dict(cfg["drafter"]))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{Path(directory) / 'config.json'} has a bad drafter section: {e}") from None
    path = Path(directory) / WEIGHTS
    try:
        sd = load_file(str(path))
    except (OSError, SafetensorError) as e:
        raise ValueError(f"cannot read the drafter's weights at {path} ({e}); re-save or re-train the drafter") from None
    try:
        net.load_state_dict(sd)
    except RuntimeError as e:
        raise ValueError(f"{path} does not match its config.json: {e}") from None
    return net.eval(), cfg
