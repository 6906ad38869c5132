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

OFFICIAL_SAMPLERS = ("llada", "dream", "fast_dllm_v2", "sdar", "llada2", "llada21")
"""The public diffusion families' own official samplers, by name (`official_setting`)."""
SAMPLER_FAMILIES = {"llada": "masked_diffusion", "dream": "masked_diffusion", "fast_dllm_v2": "block_causal",
                    "sdar": "block_causal", "llada2": "block_causal", "llada21": "block_causal"}
"""Official sampler -> the `Capabilities.family` of the models it runs on."""


def check_official_sampler(name: str, family: str | None, checkpoint_family: str | None) -> None:
    """Raise unless the official sampler ``name`` runs on a model of ``family`` (`Capabilities.family`) whose
    config names ``checkpoint_family`` (``config.family`` of a block-causal checkpoint: ``fast_dllm_v2``,
    ``sdar``, ``llada2``; LLaDA2.1's sampler runs on LLaDA2.0 checkpoints too).

    Raises:
        ValueError: an unknown sampler name, or a model of another family, saying which policy to pick.
    """
    if name not in SAMPLER_FAMILIES:
        raise ValueError(f"unknown official sampler {name!r}; expected one of {', '.join(OFFICIAL_SAMPLERS)}")
    want = SAMPLER_FAMILIES[name]
    if family != want:
        kind = "a LLaDA or Dream" if want == "masked_diffusion" else "a Fast-dLLM v2, SDAR or LLaDA2.0"
        raise ValueError(f"policy {name!r} is an official sampler that runs on {kind} checkpoint; this model is a "
                         f"{family} model -- pick another policy")
    if want == "block_causal" and checkpoint_family != name and not (name == "llada21"
                                                                     and checkpoint_family == "llada2"):
        raise ValueError(f"policy {name!r} runs on {name} checkpoints; this one is {checkpoint_family} -- pick "
                         f"policy {checkpoint_family!r}")


def official_setting(name: str, max_new_tokens: int, block_size: int, threshold: float = 0.9) -> Any:
    """The explorer's three knobs (budget, block size, threshold) as a public family's official sampler:

    * ``llada`` / ``dream``: a canvas of ``max_new_tokens`` slots right after the prompt, one slot per forward
      (``steps = gen_length``, the originals' chat default); LLaDA in blocks of ``block_size`` with
      ``low_confidence`` remasking, Dream ranked by ``maskgit_plus`` (greedy). The threshold is not read.
    * ``fast_dllm_v2``: blocks of ``block_size`` (the KV-cache granularity), sub-blocks of 8 slots (the
      original's default; the whole block when 8 does not divide it), ``threshold`` compared with ``>``,
      greedy tokens.
    * ``sdar``: blocks of ``block_size``, ``block_size`` denoising steps, ``low_confidence_dynamic`` with
      ``confidence_threshold = threshold``, the original's draw (temperature 1.0) seeded with 0 so a run
      can be repeated.
    * ``llada2``: blocks of ``block_size``, ``block_size`` steps each at most, every masked slot ``> threshold``
      (else the step's quota of the most probable), greedy tokens, the window recomputed every step as the
      original does.
    * ``llada21``: LLaDA2.1's sampler on the same checkpoints: blocks of ``block_size``, masked slots ``> threshold``,
      written slots rewritten above the original's ``editing_threshold`` 0.9 (the edits show as revisions).

    Returns:
        `LLaDASampler`, `DreamSampler`, `FastDLLMv2Sampler`, `SDARSampler`, `LLaDA2Sampler` or `LLaDA21Sampler`.

    Raises:
        ValueError: an unknown name, or settings the sampler refuses (LLaDA: a budget that does not split into
            blocks), with what to change.
    """
    from clover_engine.decoding.block_diffusion_samplers import FastDLLMv2Sampler, SDARSampler  # local: keeps this table light
    from clover_engine.decoding.llada2_samplers import LLaDA21Sampler, LLaDA2Sampler  # local: keeps this table light
    from clover_engine.decoding.masked_diffusion_samplers import DreamSampler, LLaDASampler  # local: keeps this table light

    if name == "llada21":
        return LLaDA21Sampler(gen_length=max_new_tokens, block_length=block_size, threshold=threshold)
    if name == "llada2":
        return LLaDA2Sampler(gen_length=max_new_tokens, block_length=block_size, steps=block_size, threshold=threshold)
    if name == "fast_dllm_v2":
        sub = 8 if block_size % 8 == 0 else block_size
        return FastDLLMv2Sampler(max_new_tokens=max_new_tokens, block_size=block_size, small_block_size=sub,
                                 threshold=threshold)
    if name == "sdar":
        return SDARSampler(gen_length=max_new_tokens, block_length=block_size, denoising_steps=block_size,
                           confidence_threshold=threshold, seed=0)
    if name == "llada":  # a budget that does not split into blocks: the sampler refuses it, saying what works
        return LLaDASampler(gen_length=max_new_tokens, block_length=block_size, steps=max_new_tokens)
    if name == "dream":
        return DreamSampler(max_new_tokens=max_new_tokens, steps=max_new_tokens, alg="maskgit_plus")
    raise ValueError(f"unknown official sampler {name!r}; expected one of {', '.join(OFFICIAL_SAMPLERS)}")


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
