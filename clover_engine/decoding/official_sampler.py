"""What the decoders of the public families' own samplers share: the model check, the prompt rules, the
config check, a decode's observers and trace, and the run that reports to them.

`clover_engine.decoding.masked_diffusion_decoder.MaskedDiffusionDecoder` (LLaDA, Dream) and
`clover_engine.decoding.block_diffusion_decoder.BlockDiffusionDecoder` (Fast-dLLM v2, SDAR) subclass
`OfficialSamplerDecoder`; their runs subclass `SamplerRun`. Wing ``decoding``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from clover_engine.backbones.base import capabilities_of
from clover_engine.decoding.decoder import BlockDecoder
from clover_engine.decoding.hooks import Hook, HookRegistry
from clover_engine.recording.trace import Trace


class OfficialSamplerDecoder(HookRegistry):
    """The common part of a decoder that runs a family's official sampler.

    Subclasses set ``family`` (the `Capabilities.family` of the models they drive), ``configs`` (the
    settings classes they run) and ``runs`` (the samplers' names, for messages).

    Args:
        model: a model of ``family``; set to eval mode here.
        tokenizer: for text prompts and answers, or None (prompts are token ids).

    Raises:
        TypeError: a model of another family.
    """

    family: str = ""
    configs: tuple[type, ...] = ()
    runs: str = ""

    def __init__(self, model, tokenizer=None):
        self.capabilities = capabilities_of(model)
        if self.capabilities.family != self.family:
            raise TypeError(f"{type(self).__name__} runs {self.runs} on a {self.family} model, got "
                            f"{type(model).__name__} (family {self.capabilities.family!r})")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self._prompt_check = BlockDecoder(model, tokenizer)  # the block decoder's prompt rules (encode_prompt)
        self._hooks: list[Hook] = []

    def _own(self, config) -> Any:
        """``config`` if it is one of ``configs`` (or None).

        Raises:
            TypeError: a config of another type.
        """
        if config is None or isinstance(config, self.configs):
            return config
        names = " or ".join(c.__name__ for c in self.configs)
        raise TypeError(f"config must be a {names}, got {type(config).__name__} (the block decoder's DecodeConfig "
                        "runs with clover_engine.decoding.decoder.BlockDecoder)")

    def encode_prompt(self, prompt: str | Sequence[int] | torch.Tensor) -> list[int]:
        """Validate a prompt and return its ids (`clover_engine.decoding.decoder.BlockDecoder.encode_prompt`'s
        rules and errors)."""
        self._prompt_check.tokenizer = self.tokenizer  # a tokenizer set after construction counts too
        return self._prompt_check.encode_prompt(prompt)

    def _observers(self, cfg, ids: list[int], hooks: Iterable[Hook], record_trace: bool,
                   cancel: threading.Event | Callable[[], bool] | None) -> tuple[list, Trace | None, Callable]:
        """(observers of this decode, its `Trace` or None, the cancel test) for settings ``cfg``."""
        mcfg = self.model.config
        is_cancelled = (cancel.is_set if isinstance(cancel, threading.Event) else cancel) or (lambda: False)
        observers = list(self._hooks) + list(hooks)
        trace = None
        if record_trace:
            tok_text = (lambda i: self.tokenizer.decode([i], skip_special_tokens=False)) if self.tokenizer else None
            trace = Trace(decode_config=cfg.to_dict(), model_id=getattr(self.model, "model_id", mcfg.name),
                          token_text=tok_text, prompt_ids=ids,
                          meta={"model_config": mcfg.to_dict(), "capabilities": self.capabilities.to_dict(),
                                "sampler": cfg.sampler})
            observers.append(trace)
        return observers, trace, is_cancelled


class SamplerRun:
    """One decode's reporting: ``observers`` get every event (`emit`), and ``observer_s`` sums the seconds
    they took (the decode's own time excludes them)."""

    def __init__(self, observers: list, is_cancelled: Callable[[], bool]):
        self.observers, self.is_cancelled = observers, is_cancelled
        self.nfe, self.observer_s = 0, 0.0

    def emit(self, ev) -> None:
        t = time.perf_counter()
        for fn in self.observers:
            fn(ev)
        self.observer_s += time.perf_counter() - t


__all__ = ["OfficialSamplerDecoder", "SamplerRun"]
