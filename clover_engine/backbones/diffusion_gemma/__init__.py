"""DiffusionGemma in the explorer: its own sampler, recorded as this project's events (backbones wing).

transformers' ``DiffusionGemmaForBlockDiffusion`` is a block-diffusion MoE (an encoder
over the prompt and the finished canvases, a decoder over the current canvas of
``canvas_length`` slots, weights shared between the two). Its sampler differs from
Clover's decoder (docs/architecture.md §5) in three ways:

* the canvas starts as **random tokens**, not MASK: there is no MASK token;
* each step samples a token per slot (temperature falling linearly from ``t_max`` to
  ``t_min`` over ``max_denoising_steps``) and **accepts** the lowest-entropy slots whose
  entropies sum, less the largest, to at most ``entropy_bound`` (the entropy-bound
  sampler, Lavenant et al. 2025, arXiv:2505.24857); every other slot is re-noised
  with fresh random tokens. The accepted set is chosen afresh at every step, so a
  token once accepted can be **rewritten** (accepted again with another sample) or
  **withdrawn** (not accepted, re-noised): commits are revisable;
* a canvas ends when its argmax has been stable for ``stability_threshold`` steps and
  the mean entropy is below ``confidence_threshold``, or after ``max_denoising_steps``;
  the canvas is then **read out as the argmax** of the last step's logits, which is what
  ``generate`` returns. Generation stops after the canvas holding EOS, or after
  ``ceil(max_new_tokens / canvas_length)`` canvases (whole canvases: the answer can be
  longer than ``max_new_tokens``).

`clover_engine.decoding.diffusion_gemma.DiffusionGemmaDecoder.generate` runs the model's own ``generate`` (so its tokens are
``generate``'s, token for token) with a recording wrapper around its sampler and a
streamer, and turns every denoising step into a `clover_engine.recording.events.StepEvent`. Per step of
a canvas (a "block" here; its slots are the canvas's ``L = canvas_length`` slots at
positions ``P + b * L``, P the prompt length; no slot is pre-filled):

* ``masked_before``: slots holding noise (not accepted at the previous step) when the
  forward ran -- all of them at a canvas's first step. Noise plays MASK's part.
* ``candidate`` / ``confidence``: the token the step proposes per slot and its
  probability under the temperature-scaled distribution: the **sampled** token on a
  denoising step, the **argmax** on the canvas's read-out (last) step. Recorded for
  every slot, since every slot is re-predicted. ``top_tokens`` / ``top_probs``: the
  top-K of that distribution (``top_tokens[:, 0]`` is the argmax).
* ``tokens``: the canvas after the step: accepted slots hold their sample, the others
  the fresh random tokens ``generate`` put there; on the read-out step, the argmax canvas.
* ``accepted``: slots the sampler accepted whose content changed (they were noise, or
  held another token); a slot accepted again with the token it held is not a write.
  On the read-out step every slot whose argmax differs from what it held (or that was
  noise) is written: ``accepted`` where the sampler accepted it at that step, else
  ``forced`` (read out without acceptance, like Clover's ``max_steps`` fill).
* ``rewritten`` / ``previous_tokens``: accepted or forced slots that held another token;
  ``remasked``: slots that held a token and were re-noised.
* ``eos_filled``: all False (DiffusionGemma decodes slots after EOS like any other; the
  answer is cut at the first EOS).
* ``expert_union``: distinct routed experts hit per layer by this forward's tokens (the
  canvas, plus the encoder's new tokens on a canvas's first step); ``state_norm`` and
  ``memory_share``: None (no recurrent state, no memory unit); ``bytes_read`` /
  ``flops``: None (the cost model covers Clover and dense transformers).
* ``wall_s``: time since the previous step (the forward, the sampler and, on a canvas's
  first step, the encoder).

Layout, one job per module:

* `clover_engine.backbones.diffusion_gemma.model` -- `DiffusionGemmaModel`, the transformers model with its
  tokenizer and its declared `Capabilities` (``sampler="diffusion_gemma"``, revisable commits), and
  `load_diffusion_gemma_model` (the backbone registry's row);
* `clover_engine.backbones.diffusion_gemma.info` -- `MODEL_TYPE` and `DiffusionGemmaInfo`, what traces
  and views need to know about a checkpoint;
* `clover_engine.backbones.diffusion_gemma.decode_config` -- `DiffusionGemmaDecodeConfig`, one decode's
  settings, validated;
* `clover_engine.backbones.diffusion_gemma.recording` -- the wrapper around ``generate``'s sampler, its
  streamer and router hooks, and the recorder that turns them into events (the fields above).

The decoder that runs the sampler loop, `DiffusionGemmaDecoder`, and its `DiffusionGemmaResult` are
`clover_engine.decoding.diffusion_gemma`: they build on the block decoder's `DecodeResult` and hook
registry, so they sit in the decoding wing; `clover_engine.decoding.decoder_for` gives it for this model.
This package re-exports the names of its own modules (its public API), not those.

Use::

    from clover_engine.checkpoint import load_model
    from clover_engine.decoding import decoder_for

    model = load_model("path/to/checkpoint")  # a DiffusionGemmaModel
    dec = decoder_for(model)  # a DiffusionGemmaDecoder (its sampler, by model.capabilities.sampler)
    result = dec.generate("Why is the sky blue?", DiffusionGemmaDecodeConfig(max_new_tokens=64, seed=0))
    result.text, result.trace  # the answer, a `clover_engine.recording.trace.Trace` the figures draw

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_diffusion_gemma.py -q``
"""

from __future__ import annotations

from clover_engine.backbones.diffusion_gemma.decode_config import DiffusionGemmaDecodeConfig
from clover_engine.backbones.diffusion_gemma.info import MODEL_TYPE, DiffusionGemmaInfo
from clover_engine.backbones.diffusion_gemma.model import DiffusionGemmaModel, load_diffusion_gemma_model

__all__ = [
    "MODEL_TYPE",
    "DiffusionGemmaDecodeConfig",
    "DiffusionGemmaInfo",
    "DiffusionGemmaModel",
    "load_diffusion_gemma_model",
]
