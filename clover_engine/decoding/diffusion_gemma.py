"""The DiffusionGemma decoder (decoding wing): `DiffusionGemmaDecoder` runs transformers'
DiffusionGemma ``generate`` -- its own revisable entropy-bound sampler, not this project's block
decoder -- with the recording of `clover_engine.backbones.diffusion_gemma.recording` around it, and
returns a `DiffusionGemmaResult` (a `clover_engine.decoding.config.DecodeResult`). It is the decoder
`clover_engine.decoding.decoder_for` gives a model whose ``Capabilities.sampler`` is ``diffusion_gemma``
(`clover_engine.backbones.diffusion_gemma.model.DiffusionGemmaModel`); `load_diffusion_gemma` opens a
checkpoint and wraps it in one.

The package `clover_engine.backbones.diffusion_gemma` describes the sampler and what each event holds, and
holds the model, its description, the decode settings and the recorder this module drives.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_diffusion_gemma.py -q``
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from clover_engine.backbones.base import capabilities_of
from clover_engine.backbones.diffusion_gemma.decode_config import DiffusionGemmaDecodeConfig
from clover_engine.backbones.diffusion_gemma.model import DiffusionGemmaModel, load_diffusion_gemma_model
from clover_engine.backbones.diffusion_gemma.recording import _Cancelled, _Recorder, _recording
from clover_engine.decoding.config import DecodeConfig, DecodeResult, prompt_token_ids
from clover_engine.decoding.hooks import HookRegistry
from clover_engine.recording.trace import Trace

Hook = Callable[[object], None]


@dataclass
class DiffusionGemmaResult(DecodeResult):
    """What `DiffusionGemmaDecoder.generate` returns: a `clover_engine.decoding.config.DecodeResult`
    (``tokens`` cut before the first EOS; ``n_forced`` = slots read out without acceptance;
    ``bytes_read`` / ``flops`` None) plus:

    Attributes:
        sequences: prompt and every generated canvas exactly as DiffusionGemma's ``generate``
            returned them (pad after EOS included; empty after a cancel).
        settings: the resolved decode settings that ran (`DiffusionGemmaDecoder.resolve`).
    """

    sequences: list[int] = dataclasses.field(default_factory=list)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)


class DiffusionGemmaDecoder(HookRegistry):
    """Runs DiffusionGemma's own sampler and reports each denoising step as events.

    Args:
        model: a `DiffusionGemmaModel` (`clover_engine.checkpoint.load_model` of a DiffusionGemma folder; put in
            eval mode here).
        tokenizer: for text prompts and answers: a transformers tokenizer or a ``tokenizers.Tokenizer``;
            None = the model's own (None too when its folder has none: prompts are then token ids).
        config: default settings: a `DiffusionGemmaDecodeConfig`, or the project's
            `clover_engine.decoding.config.DecodeConfig`, of which only ``max_new_tokens`` applies (the canvas
            length and the entropy rule replace block_size, threshold and the policy).

    Attributes:
        model, tokenizer: as given (the tokenizer resolved).
        config: the default `DiffusionGemmaDecodeConfig`.
        info: the model's `clover_engine.backbones.diffusion_gemma.info.DiffusionGemmaInfo`.
        model_id: the name traces record.

    Raises:
        TypeError: for a model that does not run the DiffusionGemma sampler, or a config of another type.
    """

    def __init__(self, model: DiffusionGemmaModel, tokenizer: Any = None,
                 config: DiffusionGemmaDecodeConfig | DecodeConfig | None = None):
        self.capabilities = capabilities_of(model)  # TypeError for an object that declares none
        if self.capabilities.sampler != "diffusion_gemma":
            raise TypeError(f"DiffusionGemmaDecoder drives a model whose sampler is 'diffusion_gemma', got "
                            f"{type(model).__name__} with sampler {self.capabilities.sampler!r}; "
                            "clover_engine.decoding.decoder_for(model) picks the decoder a model needs")
        self.model = model.eval()
        self.info = model.info
        self.model_id = model.model_id
        self.tokenizer = model.tokenizer if tokenizer is None else tokenizer
        self.config = self._own_config(config) or DiffusionGemmaDecodeConfig()
        self._hooks: list[Hook] = []

    @staticmethod
    def _own_config(config: DiffusionGemmaDecodeConfig | DecodeConfig | None) -> DiffusionGemmaDecodeConfig | None:
        """``config`` as a `DiffusionGemmaDecodeConfig` (a `DecodeConfig` gives its ``max_new_tokens``).

        Raises:
            TypeError: for a config of another type.
        """
        if config is None or isinstance(config, DiffusionGemmaDecodeConfig):
            return config
        if isinstance(config, DecodeConfig):
            return DiffusionGemmaDecodeConfig(max_new_tokens=config.max_new_tokens)
        raise TypeError(f"config must be a DiffusionGemmaDecodeConfig or a DecodeConfig, got {type(config).__name__}")

    # ------------------------------------------------------------------ input
    def encode_prompt(self, prompt: str | Sequence[int] | torch.Tensor) -> list[int]:
        """Validate a prompt and return its ids (text is encoded with the tokenizer's special
        tokens, e.g. Gemma's BOS; apply a chat template first for a chat model).

        Raises:
            TypeError: not a str / int sequence / 1-D int tensor, or a str without tokenizer.
            ValueError: an empty prompt or ids outside the vocabulary [0, V).
        """
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise TypeError("a text prompt needs a tokenizer: DiffusionGemmaDecoder(model, tokenizer) "
                                "or pass token ids")
            if isinstance(self.tokenizer, Tokenizer):  # the tokenizers library's (a folder's tokenizer.json)
                prompt = self.tokenizer.encode(prompt).ids
            else:  # a transformers tokenizer
                prompt = list(self.tokenizer(prompt)["input_ids"])
        return prompt_token_ids(prompt, self.info.vocab_size)

    def resolve(self, config: DiffusionGemmaDecodeConfig | DecodeConfig | None = None) -> dict[str, Any]:
        """The settings a decode with ``config`` (default: the decoder's) runs with: each
        field as given, else the model's generation config, else transformers' DiffusionGemma
        default (EOS / pad: else the text config's). ``block_size`` is the canvas length.

        Raises:
            TypeError: for a config of another type.
        """
        # local: transformers is optional and heavy; only a DiffusionGemma decode needs it
        from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
            DiffusionGemmaGenerationConfig,
        )

        dc = self._own_config(config) or self.config
        gen = getattr(self.model.lm, "generation_config", None)
        defaults = DiffusionGemmaGenerationConfig._get_default_generation_params()

        def pick(name: str, gen_name: str | None = None, fallback: Any = None) -> Any:
            own = getattr(dc, name)
            if own is not None:
                return own
            from_gen = getattr(gen, gen_name or name, None)
            if from_gen is not None:
                return from_gen
            return defaults.get(gen_name or name, fallback)

        sampler = getattr(gen, "sampler_config", None)
        bound = dc.entropy_bound
        if bound is None:
            bound = getattr(sampler, "entropy_bound", None) or defaults["sampler_config"].entropy_bound
        return {
            "block_size": self.info.canvas_length,
            "max_new_tokens": int(pick("max_new_tokens")),
            "max_denoising_steps": int(pick("max_denoising_steps")),
            "entropy_bound": float(bound),
            "t_min": float(pick("t_min")),
            "t_max": float(pick("t_max")),
            "stability_threshold": int(pick("stability_threshold")),
            "confidence_threshold": float(pick("confidence_threshold")),
            "eos_token_id": pick("eos_token_id", fallback=self.info.eos_token_id),
            "pad_token_id": pick("pad_token_id", fallback=self.info.pad_token_id),
            "seed": dc.seed,
            "top_candidates": dc.top_candidates,
            "sampler": "entropy_bound",
        }

    # ----------------------------------------------------------------- decode
    @torch.no_grad()
    def generate(
        self,
        prompt: str | Sequence[int] | torch.Tensor,
        config: DiffusionGemmaDecodeConfig | DecodeConfig | None = None,
        hooks: Iterable[Hook] = (),
        record_trace: bool = True,
        cancel: threading.Event | Callable[[], bool] | None = None,
    ) -> DiffusionGemmaResult:
        """Decode a continuation of ``prompt`` with DiffusionGemma's own ``generate``.

        Args:
            prompt: text (needs a tokenizer) or token ids.
            config: overrides the decoder's config for this call (a `DecodeConfig` gives its ``max_new_tokens``).
            hooks: callables receiving every event of this decode only.
            record_trace: record an `clover_engine.recording.trace.Trace` (a hook like any other).
            cancel: a `threading.Event` (or callable returning True) checked after every
                denoising step; when set, decoding stops and keeps the finished canvases.

        Returns:
            `DiffusionGemmaResult`; its ``tokens`` are ``generate``'s generated ids up to
            and excluding the first EOS.

        Raises:
            TypeError / ValueError: a bad prompt (`encode_prompt`) or config, or a prompt plus
                the canvases ``max_new_tokens`` needs beyond ``max_position_embeddings``.
        """
        # local: transformers is optional and heavy; only a DiffusionGemma decode needs it
        from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
            EntropyBoundSamplerConfig,
        )

        settings = self.resolve(config)
        ids = self.encode_prompt(prompt)
        info = self.info
        L, P = info.canvas_length, len(ids)
        n_canvases = math.ceil(settings["max_new_tokens"] / L)
        if P + n_canvases * L > info.max_position_embeddings:
            raise ValueError(
                f"the prompt ({P} tokens) plus {n_canvases} canvases of {L} slots needs {P + n_canvases * L} "
                f"positions, more than the model's {info.max_position_embeddings} (max_position_embeddings); "
                "shorten the prompt or lower max_new_tokens")
        is_cancelled = (cancel.is_set if isinstance(cancel, threading.Event) else cancel) or (lambda: False)
        observers = list(self._hooks) + list(hooks)
        trace = None
        if record_trace:
            tok_text = ((lambda i: self.tokenizer.decode([i], skip_special_tokens=False))
                        if self.tokenizer is not None else None)
            trace = Trace(decode_config=settings, model_id=self.model_id, token_text=tok_text, prompt_ids=ids,
                          meta={"model_config": info.to_dict(), "revisable": True})
            observers.append(trace)

        def emit(ev: object) -> None:
            for fn in observers:
                fn(ev)

        eos = settings["eos_token_id"]
        eos_ids = set(eos) if isinstance(eos, list) else {eos}
        rec = _Recorder(emit if observers else None, L, P, eos_ids, settings["top_candidates"],
                        info.num_hidden_layers, is_cancelled)
        gen_kwargs = {
            "max_new_tokens": settings["max_new_tokens"], "max_denoising_steps": settings["max_denoising_steps"],
            "sampler_config": EntropyBoundSamplerConfig(entropy_bound=settings["entropy_bound"]),
            "t_min": settings["t_min"], "t_max": settings["t_max"],
            "stability_threshold": settings["stability_threshold"],
            "confidence_threshold": settings["confidence_threshold"], "eos_token_id": eos,
            "pad_token_id": settings["pad_token_id"], "disable_compile": True,
        }
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.model.device)
        sequences: list[int] = []
        t0 = time.perf_counter()
        rec.t_last = t0
        try:
            with _recording(self.model.lm, rec, observe_experts=bool(observers)):  # one decode per model at a time
                if settings["seed"] is not None:  # seeded under the model's lock: no other decode draws in between
                    torch.manual_seed(settings["seed"])
                out = self.model.lm.generate(input_ids, streamer=rec.streamer(), **gen_kwargs)
            sequences = out.sequences[0].tolist()
            stop_reason = None
        except _Cancelled:
            rec.cancel_block()
            stop_reason = "cancelled"
        wall_s = time.perf_counter() - t0

        generated = [t for canvas in rec.canvases for t in canvas]
        hit_eos = next((k for k, t in enumerate(generated) if t in eos_ids), None)
        if hit_eos is not None:
            generated = generated[:hit_eos]
        if stop_reason is None:
            stop_reason = "eos" if hit_eos is not None else "max_new_tokens"
        result = DiffusionGemmaResult.finished(generated, ids, rec.nfe, rec.n_forced, wall_s, stop_reason,
                                               self.tokenizer, trace=trace, sequences=sequences, settings=settings)
        if observers:
            emit(result.end_event())
        return result


def load_diffusion_gemma(path: str | Path, device: str | torch.device = "cpu",
                         dtype: torch.dtype | str | None = None) -> DiffusionGemmaDecoder:
    """Open a DiffusionGemma checkpoint and wrap it in its decoder, in one call:
    ``DiffusionGemmaDecoder(load_diffusion_gemma_model(path, device, dtype))`` (arguments and errors:
    `clover_engine.backbones.diffusion_gemma.model.load_diffusion_gemma_model`). ``.generate(prompt, config)``
    returns a result with ``.text`` and ``.trace``."""
    return DiffusionGemmaDecoder(load_diffusion_gemma_model(path, device, dtype))


__all__ = [
    "DiffusionGemmaDecoder",
    "DiffusionGemmaResult",
    "load_diffusion_gemma",
]
