"""One DiffusionGemma decode's settings (backbones wing): `DiffusionGemmaDecodeConfig`, validated on
construction; a field left None takes the model's generation config value when the decoder
resolves it (`clover_engine.decoding.diffusion_gemma.DiffusionGemmaDecoder.resolve`). Part of
`clover_engine.backbones.diffusion_gemma` (re-exported there)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DiffusionGemmaDecodeConfig:
    """Settings of one DiffusionGemma decode (validated on construction).

    A field left None takes the model's generation config value, else transformers'
    default for DiffusionGemma (`DiffusionGemmaDecoder.resolve` says which ran; the
    trace stores the resolved values).

    Attributes:
        max_new_tokens: generated-token budget (>= 1), rounded up to whole canvases.
        max_denoising_steps: denoising steps allowed per canvas (>= 1).
        entropy_bound: the entropy-bound sampler's bound in nats (> 0): a step accepts the
            k lowest-entropy slots with ``sum(entropy) - max(entropy) <= entropy_bound``.
        t_min, t_max: temperatures at the last and first denoising step (0 <= t_min < t_max).
        stability_threshold: steps the argmax canvas must stay unchanged to end a canvas (>= 0).
        confidence_threshold: mean entropy (nats, > 0) below which a stable canvas ends.
        eos_token_id: EOS id(s) ending generation; None = the generation config's, else the
            text config's (transformers' ``generate`` alone would not stop without one).
        pad_token_id: id written after EOS in the returned sequences; None = the generation
            config's, else the text config's.
        seed: seeds torch's global generator before decoding (the sampler draws the
            initial canvas, the samples and the re-noising from it); None = not seeded.
        top_candidates: K top tokens per slot kept in events (>= 1).

    Raises:
        TypeError / ValueError: naming the field, the value and what was expected.
    """

    max_new_tokens: int | None = None
    max_denoising_steps: int | None = None
    entropy_bound: float | None = None
    t_min: float | None = None
    t_max: float | None = None
    stability_threshold: int | None = None
    confidence_threshold: float | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    seed: int | None = None
    top_candidates: int = 5

    def __post_init__(self) -> None:
        for name, lo in (("max_new_tokens", 1), ("max_denoising_steps", 1), ("stability_threshold", 0),
                         ("pad_token_id", 0), ("seed", 0), ("top_candidates", 1)):
            val = getattr(self, name)
            if val is None:
                continue
            if isinstance(val, (bool, np.bool_)) or not isinstance(val, numbers.Integral) or int(val) < lo:
                raise ValueError(f"{name} must be an int >= {lo} (or None), got {val!r}")
            object.__setattr__(self, name, int(val))
        for name, lo, open_lo in (("entropy_bound", 0.0, True), ("t_min", 0.0, False), ("t_max", 0.0, False),
                                  ("confidence_threshold", 0.0, True)):
            val = getattr(self, name)
            if val is None:
                continue
            ok = isinstance(val, numbers.Real) and not isinstance(val, (bool, np.bool_)) and math.isfinite(val)
            if not ok or (val <= lo if open_lo else val < lo):
                raise ValueError(f"{name} must be a finite number {'>' if open_lo else '>='} {lo:g} (or None), "
                                 f"got {val!r}")
            object.__setattr__(self, name, float(val))
        if self.t_min is not None and self.t_max is not None and not self.t_min < self.t_max:
            raise ValueError(f"t_min must be below t_max, got t_min={self.t_min}, t_max={self.t_max}")
        eos = self.eos_token_id
        if eos is not None:
            ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
            if not ids or not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) and i >= 0 for i in ids):
                raise ValueError(f"eos_token_id must be an id >= 0 or a non-empty list of them, got {eos!r}")
            object.__setattr__(self, "eos_token_id", [int(i) for i in ids] if isinstance(eos, (list, tuple))
                               else int(eos))
