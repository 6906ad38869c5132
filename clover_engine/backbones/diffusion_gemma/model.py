"""DiffusionGemma as a backbone (backbones wing): `DiffusionGemmaModel` holds transformers'
``DiffusionGemmaForBlockDiffusion`` with its tokenizer and declares its `Capabilities`;
`load_diffusion_gemma_model` opens a checkpoint (the backbone registry's row for ``model_type``
``diffusion_gemma``). Part of `clover_engine.backbones.diffusion_gemma` (re-exported there).

The model runs its own sampler (``Capabilities.sampler == "diffusion_gemma"``), so it implements
only the descriptive half of `clover_engine.backbones.base.Backbone` (``config``, ``device``, ``dtype``,
``capabilities``); `clover_engine.decoding.decoder_for` gives the decoder that drives it,
`clover_engine.decoding.diffusion_gemma.DiffusionGemmaDecoder`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from clover_engine.backbones.base import Capabilities
from clover_engine.backbones.diffusion_gemma.info import MODEL_TYPE, DiffusionGemmaInfo

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


class DiffusionGemmaModel(nn.Module):
    """A DiffusionGemma checkpoint as the engine holds it.

    Args:
        lm: a ``transformers.DiffusionGemmaForBlockDiffusion`` (put in eval mode here).
        tokenizer: its transformers tokenizer, or None (its decoder then needs one, or token ids).
        name: model id for traces (default: the config's ``name_or_path``).

    Attributes:
        lm, tokenizer: as given.
        info, config: the model's `DiffusionGemmaInfo` (``config`` is the name the decoder protocol reads).
        model_id: the name traces record.

    Raises:
        TypeError: for a model that is not a DiffusionGemma.
    """

    def __init__(self, lm: nn.Module, tokenizer: Any = None, name: str | None = None):
        super().__init__()
        name = name or str(getattr(getattr(lm, "config", None), "name_or_path", "") or "diffusion-gemma")
        self.info = DiffusionGemmaInfo.from_model(lm, name)
        self.config = self.info
        self.lm = lm
        self.tokenizer = tokenizer
        self.model_id = name
        self.eval()

    @property
    def capabilities(self) -> Capabilities:
        """DiffusionGemma: its own sampler, which revises what it accepted (not the accept-once rule), no
        recurrent state or memory unit, its expert union when its text model is an MoE; forwards priced
        as full recomputes over the canvas."""
        observed = frozenset({"expert_union"}) if self.info.num_experts else frozenset()
        return Capabilities(family="diffusion_gemma", memory_modes=("state",), observables=observed,
                            cost_family="recompute", revises_commits=True, sampler="diffusion_gemma",
                            largest_trained_block=int(self.info.canvas_length))

    @property
    def device(self) -> torch.device:
        return next(self.lm.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.lm.parameters()).dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("DiffusionGemma runs its own sampler, not block forwards: decode it with "
                        "clover_engine.decoding.decoder_for(model)")


def load_diffusion_gemma_model(path: str | Path, device: str | torch.device = "cpu",
                               dtype: torch.dtype | str | None = None) -> DiffusionGemmaModel:
    """Load a DiffusionGemma checkpoint (a ``save_pretrained`` folder or a Hub id).

    Args:
        path: the checkpoint folder (``config.json`` with ``model_type: "diffusion_gemma"``,
            weights, optionally a tokenizer) or a Hub id transformers can resolve.
        device: where the model runs (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...).
        dtype: weight dtype (a ``torch.dtype`` or ``"float32"`` / ``"bfloat16"`` / ``"float16"``);
            None = the checkpoint's own.

    Returns:
        A `DiffusionGemmaModel`; its tokenizer is None when the folder has none.

    Raises:
        FileNotFoundError: a local path that does not exist.
        ValueError: a checkpoint whose config is not a DiffusionGemma one, or an unknown dtype name.
    """
    # local: transformers is optional and heavy (seconds); only a DiffusionGemma checkpoint needs it
    from transformers import AutoConfig, AutoTokenizer, DiffusionGemmaForBlockDiffusion

    p = Path(path)
    if (p.is_absolute() or str(path).startswith(".")) and not p.exists():
        raise FileNotFoundError(f"no DiffusionGemma checkpoint at {str(path)!r}")
    if isinstance(dtype, str):
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPE_NAMES)} or a torch.dtype, got {dtype!r}")
        dtype = _DTYPE_NAMES[dtype]
    cfg = AutoConfig.from_pretrained(path)
    if getattr(cfg, "model_type", None) != MODEL_TYPE:
        raise ValueError(f"{str(path)!r} holds a {getattr(cfg, 'model_type', None)!r} model, not a DiffusionGemma "
                         f"checkpoint (model_type {MODEL_TYPE!r})")
    kwargs = {} if dtype is None else {"dtype": dtype}
    lm = DiffusionGemmaForBlockDiffusion.from_pretrained(path, **kwargs).to(device)
    tokenizer = None
    # a local folder without tokenizer files gets None: transformers would build an empty Gemma tokenizer
    if not p.exists() or any((p / f).is_file() for f in _TOKENIZER_FILES):
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except Exception:  # noqa: BLE001  none, or one AutoTokenizer cannot build (the Rust side raises a bare
            tokenizer = None  # Exception); `clover_engine.load_tokenizer` may still read a tokenizers-library tokenizer.json
    return DiffusionGemmaModel(lm, tokenizer, name=p.name if p.exists() else str(path))
