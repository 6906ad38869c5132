"""The careful decode: a model's own reference for what a faster decode's answer cost.

Block diffusion buys speed by writing several slots per forward; whether the answer changed is measured against
the same model, prompt and settings decoded **one slot per forward** -- the careful decode. No dataset is needed,
and anyone can reproduce it. `careful_setting` gives it for every decoder the project runs, changing only the
knob that sets how many slots a forward writes:

==========================  ============================================================================
run                         its careful decode
==========================  ============================================================================
threshold decoding          policy ``top_k`` with ``tokens_per_step = 1`` at the same ``block_size``: each
(`DecodeConfig`)            forward writes the block's single most confident slot (LLaDA's low-confidence
                            remasking at one slot a step). Not block size 1: a model trained on blocks of
                            32 reads a block of 1 out of distribution (clover-tiny's answers then part at
                            their first slot); a run at block size 1 is its own careful decode
``verify`` (a drafter)      itself: the base keeps what it would write, so the answer *is* the base's own
                            greedy answer
LLaDA (`LLaDASampler`)      ``steps = gen_length`` (LLaDA's linear schedule then writes one slot a step)
Dream (`DreamSampler`)      ``steps = max_new_tokens``
Fast-dLLM v2                ``threshold = 1.0`` (its ``> threshold`` never holds: each step writes the
                            sub-block's single most confident slot)
SDAR                        ``low_confidence_static`` with ``denoising_steps = block_length`` (one slot a step)
LLaDA2.0                    ``threshold = 1.0`` and ``steps = block_length`` (each step writes its quota of 1)
LLaDA2.1                    ``threshold = 1.0`` and ``num_to_transfer = 1`` (its edits of written slots kept)
==========================  ============================================================================

Everything else (temperature, seed, repetition control, budget, block placement) is kept, so the two decodes
differ only in their parallelism. `agreement` compares a run's answer with the reference's: token agreement in
% over the answer, the first slot where they differ, the longest common prefix, identical or not; `Agreement`
is what a trace records (``meta["careful"]``) so that a replay shows it without the model. `CarefulReferences`
caches the reference per (model, prompt, careful setting): it is decoded once however many settings are
compared with it.

Wing: ``decoding``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_careful.py -q``
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

from clover_engine.decoding.config import DecodeConfig


def careful_setting(setting: Any) -> Any:
    """The careful decode of ``setting`` (module docstring): the same settings, one slot per forward.

    Args:
        setting: a `DecodeConfig`, or a public family's official sampler (`LLaDASampler`, `DreamSampler`,
            `FastDLLMv2Sampler`, `SDARSampler`, `LLaDA2Sampler`, `LLaDA21Sampler`).

    Returns:
        a setting of the same type; ``setting`` itself when it already is its own careful decode.

    Raises:
        TypeError: a setting of another type (the message names the known ones).
    """
    name = getattr(setting, "sampler", None)
    if isinstance(setting, DecodeConfig):
        if setting.policy == "verify" or setting.block_size == 1 or (setting.policy, setting.tokens_per_step) == (
                "top_k", 1):
            return setting
        return dataclasses.replace(setting, policy="top_k", tokens_per_step=1, max_steps=None)
    if name == "llada":
        return setting if setting.steps == setting.gen_length else dataclasses.replace(setting, steps=setting.gen_length)
    if name == "dream":
        return setting if setting.steps == setting.max_new_tokens else dataclasses.replace(
            setting, steps=setting.max_new_tokens)
    if name == "fast_dllm_v2":
        return setting if setting.threshold >= 1.0 else dataclasses.replace(setting, threshold=1.0)
    if name == "sdar":
        want = dict(remasking_strategy="low_confidence_static", denoising_steps=setting.block_length)
        return setting if all(getattr(setting, k) == v for k, v in want.items()) else dataclasses.replace(setting, **want)
    if name in ("llada2", "llada21"):
        want = dict(threshold=1.0, steps=setting.block_length) if name == "llada2" else dict(threshold=1.0,
                                                                                             num_to_transfer=1)
        return setting if all(getattr(setting, k) == v for k, v in want.items()) else dataclasses.replace(setting, **want)
    raise TypeError(f"careful_setting takes a DecodeConfig or an official sampler (llada, dream, fast_dllm_v2, sdar, "
                    f"llada2, llada21); got {type(setting).__name__}")


def is_careful(setting: Any) -> bool:
    """True when ``setting`` is its own careful decode (`careful_setting` returns it unchanged)."""
    return careful_setting(setting) == setting


@dataclasses.dataclass(frozen=True)
class Agreement:
    """How a run's answer compares with its careful decode's (`agreement`).

    Attributes:
        n_answer, n_reference: tokens in the run's answer and in the reference (generated tokens, prompt excluded).
        matching: positions where both hold the same token.
        token_agreement: ``100 * matching / max(n_answer, n_reference)`` (%; 100.0 for two empty answers).
        first_difference: the first slot (0-based, counted from the answer's start) where they differ, or where
            one has ended and the other goes on; None when identical.
        common_prefix: tokens before ``first_difference`` (the whole answer when identical).
        identical: the two answers are the same tokens.
        own: the run is its own careful decode (`is_careful`): the numbers are trivially 100 %, and the views
            say so instead.
    """

    n_answer: int
    n_reference: int
    matching: int
    token_agreement: float
    first_difference: int | None
    common_prefix: int
    identical: bool
    own: bool = False

    def describe(self) -> str:
        """The summary card's sentence: ``agrees with the careful decode: 87 % (first difference at slot 12)``."""
        if self.own:
            return "this run is its own careful decode (one slot per forward): the reference itself"
        if self.identical:
            return f"agrees with the careful decode: 100 % (identical, {self.n_answer} tokens)"
        return (f"agrees with the careful decode: {self.token_agreement:.0f} % (first difference at slot "
                f"{self.first_difference})")

    def to_dict(self) -> dict[str, Any]:
        """Plain values, for a trace's metadata (``meta["careful"]``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Agreement":
        """The inverse of `to_dict` (unknown keys are ignored, so that later fields do not break old readers)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


def agreement(answer: Sequence[int], reference: Sequence[int], own: bool = False) -> Agreement:
    """Compare a run's answer with its careful decode's, position by position from the answer's first slot.

    Args:
        answer, reference: generated token ids (prompt excluded), as the decoders return them.
        own: the run is its own careful decode (`Agreement.own`).
    """
    a, r = [int(t) for t in answer], [int(t) for t in reference]
    matching = sum(x == y for x, y in zip(a, r))
    first = next((i for i, (x, y) in enumerate(zip(a, r)) if x != y), None)
    if first is None and len(a) != len(r):
        first = min(len(a), len(r))
    longest = max(len(a), len(r))
    return Agreement(n_answer=len(a), n_reference=len(r), matching=matching,
                     token_agreement=100.0 if longest == 0 else 100.0 * matching / longest, first_difference=first,
                     common_prefix=len(a) if first is None else first, identical=first is None, own=own)


class CarefulReferences:
    """The careful decodes of one process, each decoded once: keyed by (model key, prompt ids, careful setting).

    Thread-safe: two callers asking for the same key share one decode (the second waits for the first).

    Args:
        max_entries: references kept (least recently used dropped first).
    """

    def __init__(self, max_entries: int = 256) -> None:
        self.max_entries = max_entries
        self._done: dict[tuple, list[int]] = {}
        self._lock = threading.Lock()
        self._building: dict[tuple, threading.Event] = {}

    def key(self, model_key: Any, prompt_ids: Sequence[int], setting: Any) -> tuple:
        """The cache key of ``setting``'s careful decode of ``prompt_ids`` on the model named ``model_key``."""
        care = careful_setting(setting)
        if isinstance(care, DecodeConfig) and care.policy == "top_k":  # top_k reads no threshold: one reference
            care = dataclasses.replace(care, threshold=1.0)
        return (model_key, tuple(int(t) for t in prompt_ids), repr(care))

    def get(self, model_key: Any, prompt_ids: Sequence[int], setting: Any) -> list[int] | None:
        """The cached reference answer, or None when it has not been decoded."""
        with self._lock:
            return self._done.get(self.key(model_key, prompt_ids, setting))

    def reference(self, model_key: Any, prompt_ids: Sequence[int], setting: Any,
                  decode: Callable[[Any], Sequence[int]], cancel: threading.Event | None = None) -> list[int]:
        """The careful decode's answer (generated token ids), decoded by ``decode(careful_setting(setting))`` the
        first time and cached; a decode that raises (a cancelled one too) caches nothing and raises.

        Raises:
            CarefulCancelled: ``cancel`` was set while this caller waited for another caller's decode of the same
                reference (that decode goes on for its own caller).
        """
        key = self.key(model_key, prompt_ids, setting)
        while True:
            with self._lock:
                if key in self._done:
                    self._done[key] = self._done.pop(key)  # most recently used: last
                    return self._done[key]
                waiting = self._building.get(key)
                if waiting is None:
                    self._building[key] = threading.Event()
                    break
            while not waiting.wait(0.05):
                if cancel is not None and cancel.is_set():
                    raise CarefulCancelled("the careful decode was cancelled while it waited for another's")
        try:
            tokens = [int(t) for t in decode(careful_setting(setting))]
        except BaseException:
            with self._lock:
                self._building.pop(key).set()  # a waiter decodes it instead
            raise
        with self._lock:
            self._done[key] = tokens
            while len(self._done) > self.max_entries:
                self._done.pop(next(iter(self._done)))
            self._building.pop(key).set()
        return tokens


class CarefulCancelled(Exception):
    """A careful decode, or the wait for one, was cancelled: nothing is cached."""


__all__ = ["Agreement", "CarefulCancelled", "CarefulReferences", "agreement", "careful_setting", "is_careful"]
