"""What traces and views need to know about a DiffusionGemma checkpoint (backbones wing):
`MODEL_TYPE` and `DiffusionGemmaInfo`, read off a loaded ``DiffusionGemmaForBlockDiffusion``.
Part of `clover_engine.backbones.diffusion_gemma` (re-exported there)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

MODEL_TYPE = "diffusion_gemma"


@dataclass
class DiffusionGemmaInfo:
    """What traces and views need to know about a DiffusionGemma checkpoint.

    Attributes:
        name: model id shown in traces and views.
        model_type: ``"diffusion_gemma"``.
        vocab_size: rows of the LM head (V).
        eos_token_id: the text config's EOS id (the first one when it names several).
        pad_token_id: the text config's pad id (None when it has none).
        canvas_length: slots per canvas, the block size L.
        max_position_embeddings: positions the text model supports.
        hidden_size, num_hidden_layers (N), num_experts (E, 0 = dense), top_k_experts:
            the text model's dimensions.
        num_parameters: parameters of the loaded model (tied weights counted once).
        backbone: ``"diffusion_gemma"`` (Clover configs have no such field; a trace whose
            model config names a backbone has no Clover config, `clover_engine.backbones.clover.config.recorded_clover_config`).
        mask_token_id: None -- the canvas starts as random tokens, there is no MASK.
        revisable: True -- accepted tokens can be rewritten or withdrawn.
    """

    name: str
    vocab_size: int
    eos_token_id: int
    pad_token_id: int | None
    canvas_length: int
    max_position_embeddings: int
    hidden_size: int
    num_hidden_layers: int
    num_experts: int
    top_k_experts: int
    num_parameters: int = 0
    model_type: str = MODEL_TYPE
    backbone: str = MODEL_TYPE
    mask_token_id: int | None = None
    revisable: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-serialisable dict (stored in a trace's ``meta["model_config"]``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_model(cls, model: torch.nn.Module, name: str) -> DiffusionGemmaInfo:
        """Read the dimensions of a ``DiffusionGemmaForBlockDiffusion``.

        Raises:
            TypeError: for a model whose config is not a DiffusionGemma config.
            ValueError: for a text config without ``eos_token_id``.
        """
        cfg = getattr(model, "config", None)
        if getattr(cfg, "model_type", None) != MODEL_TYPE:
            raise TypeError(f"expected a DiffusionGemmaForBlockDiffusion (config.model_type {MODEL_TYPE!r}), got "
                            f"{type(model).__name__} with model_type {getattr(cfg, 'model_type', None)!r}")
        text = cfg.text_config
        eos = _first(text.eos_token_id)
        if eos is None:
            raise ValueError("the DiffusionGemma text config names no eos_token_id")
        n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        return cls(
            name=name, vocab_size=int(text.vocab_size), eos_token_id=int(eos), pad_token_id=_first(text.pad_token_id),
            canvas_length=int(cfg.canvas_length), max_position_embeddings=int(text.max_position_embeddings),
            hidden_size=int(text.hidden_size), num_hidden_layers=int(text.num_hidden_layers),
            num_experts=int(text.num_experts or 0), top_k_experts=int(text.top_k_experts or 0),
            num_parameters=int(n_params),
        )


def _first(ids: Any) -> int | None:
    """An id, or the first of a list of ids; None stays None."""
    if isinstance(ids, (list, tuple)):
        return int(ids[0]) if ids else None
    return None if ids is None else int(ids)
