"""Decoding settings and what a decode returns: `DecodeConfig` (validated on construction) and
`DecodeResult` (built at a decode's end by `DecodeResult.finished`, reported by `DecodeResult.end_event`),
and `prompt_token_ids`, the prompt check every decoder's ``encode_prompt`` ends with.
Wing ``decoding``; `clover_engine.decoding.decoder` re-exports both as the decoding API."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from clover_engine.backbones.clover.model import MEMORY_MODES
from clover_engine.decoding.policies import POLICIES
from clover_engine.recording.events import DecodeEnd


def _check_int(name: str, val, lo: int, hint: str) -> int:
    """`val` as a Python int >= `lo` (ints and NumPy integers; not bool, not float)."""
    if isinstance(val, (bool, np.bool_)) or not isinstance(val, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {lo}, got {type(val).__name__} ({val!r}); {hint}")
    val = int(val)
    if val < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {val}; {hint}")
    return val


def _check_real(name: str, val, lo: float, hi: float | None, *, lo_open: bool, hi_open: bool = False,
                hint: str) -> float:
    """`val` as a finite Python float in the range (ints, floats, NumPy numbers; not bool, NaN or inf)."""
    rng = f"{'(' if lo_open else '['}{lo:g}, {'inf)' if hi is None else f'{hi:g}' + (')' if hi_open else ']')}"
    if isinstance(val, (bool, np.bool_)) or not isinstance(val, numbers.Real):
        raise TypeError(f"{name} must be a number in {rng}, got {type(val).__name__} ({val!r}); {hint}")
    f = float(val)
    ok = math.isfinite(f) and (f > lo if lo_open else f >= lo)
    if ok and hi is not None:
        ok = f < hi if hi_open else f <= hi
    if not ok:
        raise ValueError(f"{name} must be a finite number in {rng}, got {val!r}; {hint}")
    return f


@dataclass(frozen=True)
class DecodeConfig:
    """Decoding settings (validated on construction).

    Numbers may be Python or NumPy numbers (``np.float32`` from an event, ``np.int64``
    ...); they are stored as Python int / float, exactly (``np.float32(0.95)`` stays
    0.949999988...). Every float must be finite.

    Attributes:
        block_size: slots per block (>= 1; 1 = autoregressive; at most the model's
            context, checked by `BlockDecoder.generate`).
        threshold: LowConfidence / margin acceptance threshold, in (0, 1], compared
            exactly (``>=`` on the value as given, not rounded to fp32).
        max_steps: iterations allowed per block (None = until the block is full).
        max_new_tokens: generated-token budget (>= 1), prompt not counted.
        policy: one of ``low_confidence``, ``top_k``, ``margin``, ``entropy``, ``factor``.
        tokens_per_step: slots written per step by ``top_k``.
        max_entropy: entropy bound (nats) for ``entropy``.
        factor: Fast-dLLM factor for ``factor``.
        memory_mode: ``state`` (Clover) or ``state+window``.
        repetition_penalty: logit penalty of repetition control (>= 0; 0 = off).
        repetition_ngram, repetition_window: n (>= 2) and search window (>= n) of repetition control.
        eos_bias_soft_limit: generated length after which EOS is favoured (None = off, else >= 0).
        eos_bias_rate: logit added to EOS per token past the soft limit (> 0).
        top_candidates: K top tokens per slot kept in events (for hovers).

    Raises:
        ValueError / TypeError: naming the field, the value and the valid range.
    """

    block_size: int = 32
    threshold: float = 0.95
    max_steps: int | None = None
    max_new_tokens: int = 128
    policy: str = "low_confidence"
    tokens_per_step: int = 2
    max_entropy: float = 0.5
    factor: float = 1.0
    memory_mode: str = "state"
    repetition_penalty: float = 0.0
    repetition_ngram: int = 3
    repetition_window: int = 64
    eos_bias_soft_limit: int | None = None
    eos_bias_rate: float = 0.1
    top_candidates: int = 5

    def __post_init__(self) -> None:
        # NumPy scalars (what events, traces and widgets give back) are accepted and stored as Python
        # int / float; a NumPy float keeps its exact value (float(np.float32(0.95)) == 0.949999988...).
        def setv(name, val):
            object.__setattr__(self, name, val)

        for name, lo, hint in (
            ("block_size", 1, "e.g. 32 (1 = autoregressive)"),
            ("max_new_tokens", 1, "e.g. 128"),
            ("tokens_per_step", 1, "e.g. 2"),
            ("repetition_ngram", 2, "e.g. 3 (an n-gram of 1 token would ban every repeated token)"),
            ("repetition_window", 1, "e.g. 64"),
            ("top_candidates", 1, "e.g. 5"),
        ):
            setv(name, _check_int(name, getattr(self, name), lo, hint))
        if self.repetition_window < self.repetition_ngram:
            raise ValueError(
                f"repetition_window must be >= repetition_ngram ({self.repetition_ngram}), got "
                f"{self.repetition_window}; the window must hold at least one whole n-gram"
            )
        if self.max_steps is not None:
            setv("max_steps", _check_int("max_steps", self.max_steps, 1, "or None = until the block is full"))
        if self.eos_bias_soft_limit is not None:
            setv("eos_bias_soft_limit", _check_int("eos_bias_soft_limit", self.eos_bias_soft_limit, 0,
                                                   "or None = EOS bias off"))
        setv("threshold", _check_real(
            "threshold", self.threshold, 0.0, 1.0, lo_open=True, hi_open=False,
            hint="e.g. 0.95 (Clover's default) -- 1.0 writes one slot per forward"))
        setv("max_entropy", _check_real("max_entropy", self.max_entropy, 0.0, None, lo_open=True,
                                        hint="an entropy bound in nats, e.g. 0.5"))
        setv("factor", _check_real("factor", self.factor, 0.0, None, lo_open=True,
                                   hint="Fast-dLLM's factor, e.g. 1.0"))
        setv("repetition_penalty", _check_real("repetition_penalty", self.repetition_penalty, 0.0, None,
                                               lo_open=False, hint="a logit penalty, 0 = off, e.g. 2.0"))
        setv("eos_bias_rate", _check_real(
            "eos_bias_rate", self.eos_bias_rate, 0.0, None, lo_open=True,
            hint="logits per token past eos_bias_soft_limit, e.g. 0.1; turn the bias off with "
                 "eos_bias_soft_limit=None"))
        if not isinstance(self.policy, str) or self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if not isinstance(self.memory_mode, str) or self.memory_mode not in MEMORY_MODES:
            raise ValueError(f"memory_mode must be one of {MEMORY_MODES}, got {self.memory_mode!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class DecodeResult:
    """What `BlockDecoder.generate` returns.

    Attributes:
        text: decoded text of `tokens` ("" without a tokenizer).
        tokens: generated ids, up to and excluding the first EOS.
        prompt_ids: the prompt's ids.
        nfe: forwards run (function evaluations).
        tokens_per_forward: len(tokens) / nfe.
        n_forced: slots written by forced fill (incl. max_steps exhaustion).
        wall_s: wall time of the decode, seconds.
        tokens_per_s: len(tokens) / wall_s (prompt tokens not counted).
        observer_s: of `wall_s`, the seconds spent on hooks and the trace: building the events,
            their cost estimates, and the hooks' own work (0.0 without hooks or trace). The
            forward's observed quantities (memory share, state norm) are not in it. So
            ``len(tokens) / (wall_s - observer_s)`` is the decode's speed without its observers,
            which `clover_engine.eval` reports.
        stop_reason: ``eos``, ``max_new_tokens``, ``context`` or ``cancelled``.
        trace: the `clover_engine.recording.trace.Trace` (None when ``record_trace=False``).
        bytes_read, flops: summed `clover_engine.cost.forward_cost` estimates over the
            forwards, at the model's own weight dtype (bytes, FLOPs).
    """

    text: str
    tokens: list[int]
    prompt_ids: list[int]
    nfe: int
    tokens_per_forward: float
    n_forced: int
    wall_s: float
    tokens_per_s: float
    stop_reason: str
    trace: object | None = None
    bytes_read: float | None = None
    flops: float | None = None
    observer_s: float = 0.0

    @classmethod
    def finished(cls, tokens: list[int], prompt_ids: list[int], nfe: int, n_forced: int, wall_s: float,
                 stop_reason: str, tokenizer=None, **fields) -> DecodeResult:
        """The result of a decode that wrote ``tokens`` (cut before the first EOS) in ``nfe`` forwards and
        ``wall_s`` seconds: ``text`` decoded with ``tokenizer`` ("" without one), tokens per forward and per
        second derived (0.0 for no forward / no time); ``fields`` are the remaining attributes (``trace``,
        ``bytes_read``, ...; a subclass's own). Every decoder builds its result here."""
        return cls(
            text=tokenizer.decode(tokens) if tokenizer is not None else "", tokens=tokens, prompt_ids=prompt_ids,
            nfe=nfe, tokens_per_forward=len(tokens) / nfe if nfe else 0.0, n_forced=n_forced, wall_s=wall_s,
            tokens_per_s=len(tokens) / wall_s if wall_s > 0 else 0.0, stop_reason=stop_reason, **fields)

    def end_event(self) -> DecodeEnd:
        """The `clover_engine.recording.events.DecodeEnd` that reports this result to a decode's hooks."""
        return DecodeEnd(np.asarray(self.tokens, dtype=np.int64), self.nfe, self.tokens_per_forward, self.n_forced,
                         self.wall_s, self.stop_reason, self.bytes_read, self.flops, observer_s=self.observer_s)


def prompt_token_ids(prompt, vocab_size: int) -> list[int]:
    """The ids of a prompt given as ids (a decoder encodes text first): a 1-D int tensor or a sequence of
    ints, non-empty and inside the vocabulary [0, vocab_size).

    Raises:
        TypeError: not a 1-D int tensor or a sequence of ints (text: "prompt must be str ...").
        ValueError: no ids, or ids outside the vocabulary.
    """
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() != 1 or prompt.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"a tensor prompt must be 1-D int64, got shape {tuple(prompt.shape)} dtype {prompt.dtype}")
        ids = prompt.tolist()
    elif isinstance(prompt, (list, tuple)):
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, (bool, np.bool_)) for t in prompt):
            raise TypeError("a prompt sequence must hold ints (token ids)")
        ids = [int(t) for t in prompt]
    else:
        raise TypeError(f"prompt must be str, a list of ids or a 1-D tensor, got {type(prompt).__name__}")
    if not ids:
        raise ValueError("the prompt is empty; give at least one token")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
    return ids
