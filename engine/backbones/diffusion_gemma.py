"""DiffusionGemma in the explorer: its own sampler, recorded as this project's events.

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

`DiffusionGemmaDecoder.generate` runs the model's own ``generate`` (so its tokens are
``generate``'s, token for token) with a recording wrapper around its sampler and a
streamer, and turns every denoising step into a `engine.recording.events.StepEvent`. Per step of
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

Use::

    dec = load_diffusion_gemma("path/to/checkpoint")
    result = dec.generate("Why is the sky blue?", DiffusionGemmaDecodeConfig(max_new_tokens=64, seed=0))
    result.text, result.trace  # the answer, a `engine.recording.trace.Trace` the figures draw

Tests: ``.venv/bin/python -m pytest tests/engine/test_diffusion_gemma.py -q``
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.backbones.base import Capabilities
from engine.decoding.decoder import DecodeResult, HookRegistry
from engine.recording.events import BlockEnd, BlockStart, DecodeEnd, StepEvent

Hook = Callable[[object], None]
MODEL_TYPE = "diffusion_gemma"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


# ---------------------------------------------------------------------- model description
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
            model config names a backbone has no Clover config, `Trace.model_config`).
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


# ---------------------------------------------------------------------- decode settings
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


@dataclass
class DiffusionGemmaResult(DecodeResult):
    """What `DiffusionGemmaDecoder.generate` returns: a `engine.decoding.decoder.DecodeResult`
    (``tokens`` cut before the first EOS; ``n_forced`` = slots read out without acceptance;
    ``bytes_read`` / ``flops`` None) plus:

    Attributes:
        sequences: prompt and every generated canvas exactly as DiffusionGemma's ``generate``
            returned them (pad after EOS included; empty after a cancel).
        settings: the resolved decode settings that ran (`DiffusionGemmaDecoder.resolve`).
    """

    sequences: list[int] = dataclasses.field(default_factory=list)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)


class _Cancelled(Exception):
    """Raised inside ``generate`` (from the sampler wrapper) to stop a cancelled decode."""


# ---------------------------------------------------------------------- the decoder
class DiffusionGemmaDecoder(HookRegistry):
    """Runs DiffusionGemma's own sampler and reports each denoising step as events.

    Args:
        model: a ``transformers.DiffusionGemmaForBlockDiffusion`` (put in eval mode here).
        tokenizer: its tokenizer (a transformers tokenizer) for text prompts and answers, or None.
        config: default `DiffusionGemmaDecodeConfig`.
        name: model id for traces (default: the config's ``name_or_path``).

    Attributes:
        model, tokenizer, config: as given.
        info: the model's `DiffusionGemmaInfo`.

    Raises:
        TypeError: for a model that is not a DiffusionGemma, or a config of another type.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any = None,
                 config: DiffusionGemmaDecodeConfig | None = None, name: str | None = None):
        name = name or str(getattr(getattr(model, "config", None), "name_or_path", "") or "diffusion-gemma")
        self.info = DiffusionGemmaInfo.from_model(model, name)
        self.model = model.eval()
        self.model_id = name
        self.tokenizer = tokenizer
        self.config = config or DiffusionGemmaDecodeConfig()
        if not isinstance(self.config, DiffusionGemmaDecodeConfig):
            raise TypeError(f"config must be a DiffusionGemmaDecodeConfig, got {type(self.config).__name__}")
        self._hooks: list[Hook] = []

    @property
    def capabilities(self) -> Capabilities:
        """DiffusionGemma: revises what it accepted (its own sampler, not the accept-once rule), no
        recurrent state or memory unit, its expert union when its text model is an MoE; forwards
        priced as full recomputes over the canvas."""
        observed = frozenset({"expert_union"}) if self.info.num_experts else frozenset()
        return Capabilities(family="diffusion_gemma", memory_modes=("state",), observables=observed,
                            cost_family="recompute", revises_commits=True,
                            largest_trained_block=int(self.info.canvas_length))

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
            ids = list(self.tokenizer(prompt)["input_ids"])
        elif isinstance(prompt, torch.Tensor):
            if prompt.dim() != 1 or prompt.dtype not in (torch.int64, torch.int32):
                raise TypeError(f"a tensor prompt must be 1-D int64, got shape {tuple(prompt.shape)} "
                                f"dtype {prompt.dtype}")
            ids = prompt.tolist()
        elif isinstance(prompt, (list, tuple)):
            if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt):
                raise TypeError("a prompt sequence must hold ints (token ids)")
            ids = [int(t) for t in prompt]
        else:
            raise TypeError(f"prompt must be str, a list of ids or a 1-D tensor, got {type(prompt).__name__}")
        if not ids:
            raise ValueError("the prompt is empty; give at least one token")
        V = self.info.vocab_size
        bad = [t for t in ids if not 0 <= t < V]
        if bad:
            raise ValueError(f"prompt ids {bad[:5]} are outside the vocabulary [0, {V})")
        return ids

    def resolve(self, config: DiffusionGemmaDecodeConfig | None = None) -> dict[str, Any]:
        """The settings a decode with ``config`` (default: the decoder's) runs with: each
        field as given, else the model's generation config, else transformers' DiffusionGemma
        default (EOS / pad: else the text config's). ``block_size`` is the canvas length.

        Raises:
            TypeError: for a config of another type.
        """
        from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
            DiffusionGemmaGenerationConfig,
        )

        dc = config or self.config
        if not isinstance(dc, DiffusionGemmaDecodeConfig):
            raise TypeError(f"config must be a DiffusionGemmaDecodeConfig, got {type(dc).__name__}")
        gen = getattr(self.model, "generation_config", None)
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
        config: DiffusionGemmaDecodeConfig | None = None,
        hooks: Iterable[Hook] = (),
        record_trace: bool = True,
        cancel: threading.Event | Callable[[], bool] | None = None,
    ) -> DiffusionGemmaResult:
        """Decode a continuation of ``prompt`` with DiffusionGemma's own ``generate``.

        Args:
            prompt: text (needs a tokenizer) or token ids.
            config: overrides the decoder's `DiffusionGemmaDecodeConfig` for this call.
            hooks: callables receiving every event of this decode only.
            record_trace: record an `engine.recording.trace.Trace` (a hook like any other).
            cancel: a `threading.Event` (or callable returning True) checked after every
                denoising step; when set, decoding stops and keeps the finished canvases.

        Returns:
            `DiffusionGemmaResult`; its ``tokens`` are ``generate``'s generated ids up to
            and excluding the first EOS.

        Raises:
            TypeError / ValueError: a bad prompt (`encode_prompt`) or config, or a prompt plus
                the canvases ``max_new_tokens`` needs beyond ``max_position_embeddings``.
        """
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
            from engine.recording.trace import Trace

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
        device = next(self.model.parameters()).device
        input_ids = torch.tensor([ids], dtype=torch.long, device=device)
        if settings["seed"] is not None:
            torch.manual_seed(settings["seed"])
        sequences: list[int] = []
        t0 = time.perf_counter()
        rec.t_last = t0
        with _recording(self.model, rec, observe_experts=bool(observers)):
            try:
                out = self.model.generate(input_ids, streamer=rec.streamer(), **gen_kwargs)
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
        nfe = rec.nfe
        tpf = len(generated) / nfe if nfe else 0.0
        if observers:
            emit(DecodeEnd(np.asarray(generated, dtype=np.int64), nfe, tpf, rec.n_forced, wall_s, stop_reason))
        text = self.tokenizer.decode(generated) if self.tokenizer is not None else ""
        return DiffusionGemmaResult(
            text=text, tokens=generated, prompt_ids=ids, nfe=nfe, tokens_per_forward=tpf, n_forced=rec.n_forced,
            wall_s=wall_s, tokens_per_s=len(generated) / wall_s if wall_s > 0 else 0.0, stop_reason=stop_reason,
            trace=trace, sequences=sequences, settings=settings,
        )


def load_diffusion_gemma(path: str | Path, device: str | torch.device = "cpu",
                         dtype: torch.dtype | str | None = None) -> DiffusionGemmaDecoder:
    """Load a DiffusionGemma checkpoint (a ``save_pretrained`` folder or a Hub id) for the explorer.

    Args:
        path: the checkpoint folder (``config.json`` with ``model_type: "diffusion_gemma"``,
            weights, optionally a tokenizer) or a Hub id transformers can resolve.
        device: where the model runs (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...).
        dtype: weight dtype (a ``torch.dtype`` or ``"float32"`` / ``"bfloat16"`` / ``"float16"``);
            None = the checkpoint's own.

    Returns:
        A `DiffusionGemmaDecoder` (``.generate(prompt, config)`` returns a result with
        ``.text`` and ``.trace``); its tokenizer is None when the folder has none.

    Raises:
        FileNotFoundError: a local path that does not exist.
        ValueError: a checkpoint whose config is not a DiffusionGemma one, or an unknown dtype name.
    """
    from transformers import AutoConfig, AutoTokenizer, DiffusionGemmaForBlockDiffusion

    p = Path(path)
    if (p.is_absolute() or str(path).startswith(".")) and not p.exists():
        raise FileNotFoundError(f"no DiffusionGemma checkpoint at {str(path)!r}")
    if isinstance(dtype, str):
        names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                 "float16": torch.float16, "fp16": torch.float16}
        if dtype not in names:
            raise ValueError(f"dtype must be one of {sorted(names)} or a torch.dtype, got {dtype!r}")
        dtype = names[dtype]
    cfg = AutoConfig.from_pretrained(path)
    if getattr(cfg, "model_type", None) != MODEL_TYPE:
        raise ValueError(f"{str(path)!r} holds a {getattr(cfg, 'model_type', None)!r} model, not a DiffusionGemma "
                         f"checkpoint (model_type {MODEL_TYPE!r})")
    kwargs = {} if dtype is None else {"dtype": dtype}
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(path, **kwargs).to(device)
    tokenizer = None
    # a local folder without tokenizer files gets None: transformers would build an empty Gemma tokenizer
    if not p.exists() or any((p / f).is_file() for f in _TOKENIZER_FILES):
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except Exception:  # noqa: BLE001  none, or one AutoTokenizer cannot build (the Rust side raises a bare
            tokenizer = None  # Exception); `engine.load_tokenizer` may still read a tokenizers-library tokenizer.json
    name = p.name if p.exists() else str(path)
    return DiffusionGemmaDecoder(model, tokenizer, name=name)


# ---------------------------------------------------------------------- recording
@contextlib.contextmanager
def _recording(model: torch.nn.Module, rec: _Recorder, observe_experts: bool):
    """Within the block, ``model.generate`` builds its sampler wrapped by ``rec`` and (when
    ``observe_experts``) the routers report their expert choices to ``rec``."""
    original = model._prepare_sampler  # the bound method generate calls to build its sampler

    def prepare(generation_config: Any) -> _RecordingSampler:
        return _RecordingSampler(original(generation_config), rec)

    handles = []
    if observe_experts:
        layer_lists = [model.model.decoder.layers, model.model.encoder.language_model.layers]
        for layers in layer_lists:
            for i, layer in enumerate(layers):
                router = getattr(layer, "router", None)
                if router is not None:
                    handles.append(router.register_forward_hook(rec.router_hook(i)))
    model._prepare_sampler = prepare
    try:
        yield
    finally:
        del model._prepare_sampler  # back to the class's method
        for h in handles:
            h.remove()


class _RecordingSampler:
    """Delegates to DiffusionGemma's sampler; reports the canvas start and each step to a `_Recorder`."""

    def __init__(self, base: Any, rec: _Recorder):
        self._base, self._rec = base, rec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)

    def initialize_canvas(self, batch_size: int, device: torch.device) -> torch.Tensor:
        canvas = self._base.initialize_canvas(batch_size, device)  # a new canvas's random start
        self._rec.block_start(canvas)
        return canvas

    def accept_canvas(self, current_canvas, denoiser_canvas, logits, cur_step):
        accepted = self._base.accept_canvas(current_canvas, denoiser_canvas, logits, cur_step)
        self._rec.step(current_canvas, denoiser_canvas, logits, self._base.accepted_token_mask)
        return accepted

    def renoise_canvas(self, accepted_canvas, cur_step):
        canvas = self._base.renoise_canvas(accepted_canvas, cur_step)
        self._rec.renoised(canvas)
        return canvas


class _CanvasStreamer:
    """The streamer ``generate`` feeds: the prompt first, then each finished canvas."""

    def __init__(self, rec: _Recorder):
        self._rec, self._seen_prompt = rec, False

    def put(self, value: torch.Tensor) -> None:
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        self._rec.block_end()

    def end(self) -> None:
        pass


class _Recorder:
    """Turns the sampler's calls into events (see the module docstring for what each field holds).

    A step is only known to be a canvas's last when the canvas ends (the streamer's ``put``),
    so each step is held until the next step or the canvas end, then emitted.
    """

    def __init__(self, emit: Callable[[object], None] | None, L: int, P: int, eos_ids: set[int], top_k: int,
                 n_layers: int, is_cancelled: Callable[[], bool]):
        self.emit, self.L, self.P, self.eos_ids, self.top_k = emit, L, P, eos_ids, top_k
        self.n_layers, self.is_cancelled = n_layers, is_cancelled
        self.block_index = -1
        self.step_index = 0
        self.nfe = self.n_forced = 0
        self.canvases: list[list[int]] = []  # the argmax read-out of every finished canvas
        self.pending: dict[str, Any] | None = None
        self.held = np.zeros(L, dtype=bool)
        self.t_last = time.perf_counter()
        self._experts: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]
        self._n_enc_tokens = P

    def streamer(self) -> _CanvasStreamer:
        return _CanvasStreamer(self)

    def router_hook(self, layer: int) -> Callable:
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            self._experts[layer].append(output[2].detach().reshape(-1))  # top_k_index [tokens * k]
        return hook

    def block_start(self, canvas: torch.Tensor) -> None:
        self.block_index += 1
        self.step_index = 0
        self.held = np.zeros(self.L, dtype=bool)
        if self.emit is not None:
            self.emit(BlockStart(self.block_index, self._pos0(), self.L, self.L, np.zeros(self.L, dtype=bool),
                                 canvas[0].cpu().numpy().astype(np.int64)))

    def step(self, current: torch.Tensor, sample: torch.Tensor, logits: torch.Tensor, accept: torch.Tensor) -> None:
        if self.pending is not None:
            self._emit_step(final=False)
        self.nfe += 1
        now = time.perf_counter()
        argmax = torch.argmax(logits, dim=-1)[0]  # generate's argmax canvas, the same op on the same tensor
        p: dict[str, Any] = {"wall_s": now - self.t_last, "argmax": argmax, "accept": accept[0].cpu().numpy(),
                             "current": current[0].cpu().numpy().astype(np.int64)}
        self.t_last = now
        if self.emit is not None:
            probs = torch.softmax(logits[0], dim=-1, dtype=torch.float32)  # [L, V], as generate samples from
            k = min(self.top_k, probs.shape[-1])
            tp, tt = probs.topk(k, dim=-1)
            p.update(
                sample=sample[0].cpu().numpy().astype(np.int64),
                p_sample=probs.gather(-1, sample[0][:, None].to(probs.device))[:, 0].cpu().numpy(),
                p_argmax=probs.gather(-1, argmax[:, None])[:, 0].cpu().numpy(),
                top_tokens=tt.cpu().numpy().astype(np.int64), top_probs=tp.cpu().numpy().astype(np.float32),
                expert_union=self._take_union(),
                n_fwd=self.L + (self._n_enc_tokens if self.step_index == 0 else 0),
            )
        self.pending = p

    def renoised(self, canvas: torch.Tensor) -> None:
        assert self.pending is not None
        self.pending["next"] = canvas[0].cpu().numpy().astype(np.int64)
        if self.is_cancelled():
            raise _Cancelled

    def block_end(self) -> None:
        """The canvas ended: its last step is the argmax read-out."""
        readout = self._emit_step(final=True)
        self.canvases.append(readout.tolist())
        if self.emit is not None:
            self.emit(BlockEnd(self.block_index, self._pos0(), readout.copy(), self.step_index,
                               any(int(t) in self.eos_ids for t in readout)))
        self._n_enc_tokens = self.L  # the next canvas's first forward encodes this one

    def cancel_block(self) -> None:
        """The decode was cancelled after a step: emit it (not a read-out) and end its canvas unread."""
        if self.pending is None:
            return
        tokens = self._emit_step(final=False)
        if self.emit is not None:
            self.emit(BlockEnd(self.block_index, self._pos0(), tokens.copy(), self.step_index, False))

    def _pos0(self) -> int:
        return self.P + self.block_index * self.L

    def _take_union(self) -> np.ndarray:
        """(N,) int64 distinct experts the routers reported since the last step (-1: no router)."""
        out = np.full(self.n_layers, -1, dtype=np.int64)
        for i, parts in enumerate(self._experts):
            if parts:
                out[i] = int(torch.unique(torch.cat(parts)).numel())
        self._experts = [[] for _ in range(self.n_layers)]
        return out

    def _emit_step(self, final: bool) -> np.ndarray:
        """Emit the held step as a denoising step or as the canvas's read-out; returns its tokens (L,)."""
        p, self.pending = self.pending, None
        assert p is not None
        held_before = self.held
        current, accept = p["current"], p["accept"].astype(bool)
        if final:
            proposal = p["argmax"].cpu().numpy().astype(np.int64)
            changed = ~held_before | (proposal != current)
            accepted, forced = changed & accept, changed & ~accept
            remasked = np.zeros(self.L, dtype=bool)
            tokens = proposal
            self.held = np.ones(self.L, dtype=bool)
        else:
            proposal = p.get("sample")
            tokens = p["next"]
            if proposal is None:  # not observed: the accepted slots hold their sample
                proposal = tokens
            accepted = accept & (~held_before | (proposal != current))
            forced = np.zeros(self.L, dtype=bool)
            remasked = held_before & ~accept
            self.held = accept.copy()
        rewritten = held_before & (accepted | forced)
        self.n_forced += int(forced.sum())
        if self.emit is not None:
            conf = p["p_argmax"] if final else p["p_sample"]
            prev = np.where(rewritten | remasked, current, -1).astype(np.int64)
            self.emit(StepEvent(
                block_index=self.block_index, step_index=self.step_index, position_start=self._pos0(),
                tokens=tokens.copy(), masked_before=~held_before, confidence=np.asarray(conf, dtype=np.float32),
                candidate=proposal.copy(), top_tokens=p["top_tokens"], top_probs=p["top_probs"],
                accepted=accepted, forced=forced, eos_filled=np.zeros(self.L, dtype=bool),
                expert_union=p["expert_union"], state_norm=None, memory_share=None,
                n_tokens_forward=int(p["n_fwd"]), wall_s=float(p["wall_s"]),
                rewritten=rewritten, remasked=remasked, previous_tokens=prev,
            ))
        self.step_index += 1
        return tokens


__all__ = [
    "MODEL_TYPE",
    "DiffusionGemmaDecodeConfig",
    "DiffusionGemmaDecoder",
    "DiffusionGemmaInfo",
    "DiffusionGemmaResult",
    "load_diffusion_gemma",
]
