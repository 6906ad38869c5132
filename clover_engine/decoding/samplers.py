"""Which decoder drives a model: `decoder_for` picks it by the model's declared
``Capabilities.sampler`` (`SAMPLERS`), never by the model's type or attributes.

Wing ``decoding``. The table holds ``"module:Class"`` strings, as the backbone registry does, so a
sampler's module (DiffusionGemma's imports transformers when it decodes) is imported only when a
model that needs it is decoded. Every decoder takes ``(model, tokenizer, config)``, accepts the
project's `clover_engine.decoding.config.DecodeConfig` and has ``encode_prompt(prompt)`` and
``generate(prompt, hooks=, record_trace=, cancel=, config=)`` (pass these by keyword: the
positional orders differ).

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_diffusion_gemma.py tests/clover_engine/test_toy_backbone.py -q``
"""

from __future__ import annotations

import importlib
from typing import Any

from clover_engine.backbones.base import capabilities_of

SAMPLERS: dict[str, str] = {
    "block": "clover_engine.decoding.decoder:BlockDecoder",
    "diffusion_gemma": "clover_engine.decoding.diffusion_gemma:DiffusionGemmaDecoder",
}
"""``Capabilities.sampler`` -> ``"module:Class"`` of the decoder that drives such a model."""


def decoder_for(model: Any, tokenizer: Any = None, config: Any = None) -> Any:
    """The decoder for ``model``: `clover_engine.decoding.decoder.BlockDecoder` for a block-diffusion backbone,
    or the decoder of the sampler the model runs itself (DiffusionGemma:
    `clover_engine.decoding.diffusion_gemma.DiffusionGemmaDecoder`).

    A config that names its own decoder (a ``DECODER`` class attribute, ``"module:Class"``) picks that
    one instead: LLaDA's and Dream's official samplers (`clover_engine.decoding.masked_diffusion_samplers.
    LLaDASampler` / ``DreamSampler``) run on `clover_engine.decoding.masked_diffusion_decoder.MaskedDiffusionDecoder`.

    Args:
        model: a loaded model (`clover_engine.checkpoint.load_model`).
        tokenizer: its tokenizer, or None (a model that loads its own, DiffusionGemma, decodes with that).
        config: an `clover_engine.decoding.config.DecodeConfig` (or the sampler's own config), or None for the default.

    Raises:
        TypeError: for a model that declares no `Capabilities`.
        ValueError: for a sampler name with no row in `SAMPLERS`.
    """
    sampler = capabilities_of(model).sampler
    spec = getattr(type(config), "DECODER", None) or SAMPLERS.get(sampler)
    if spec is None:
        raise ValueError(f"{type(model).__name__} declares sampler {sampler!r}, which no decoder serves; known: "
                         f"{', '.join(sorted(SAMPLERS))} (add a row to clover_engine.decoding.samplers.SAMPLERS)")
    module, _, cls = spec.partition(":")
    return getattr(importlib.import_module(module), cls)(model, tokenizer, config)
