"""Which module opens which checkpoint format: ``config.json``'s ``model_type`` -> ``"module:loader"``.

Wing: ``backbones``. The table holds strings, so reading it imports nothing heavy (no transformers,
no model code): a family's module is imported only when a checkpoint of that family is opened --
the pattern of transformers' ``CONFIG_MAPPING_NAMES``. A new backbone is one module and one row
here (or one `register` call from a plugin or a test); `load_model` and `load_tokenizer` need no
other edit.

A loader is ``loader(directory: Path, device, dtype) -> model`` where the model implements
`clover_engine.backbones.base.Backbone` (and declares its `Capabilities`). ``dtype`` is None (keep the
dtypes the model is built with) or a floating ``torch.dtype``.
"""

from __future__ import annotations

import importlib
import json
import threading
from pathlib import Path
from typing import Any, Callable

BUILD_LOCK = threading.RLock()
"""Held while a model or its tokenizer is built (`clover_engine.checkpoint.load_model` / ``load_tokenizer``):
one build at a time per process. Building touches process-global state that is not thread-safe --
transformers' lazy module imports (two threads importing ``AutoModelForCausalLM`` at once: one gets
``ImportError: cannot import name``), and init contexts that patch ``torch.nn`` or the default device
for the whole process (meta-device construction: interleaved enter / exit from two threads leaves a
patch in place, and every later load then fails with ``Cannot copy out of meta tensor``). Re-entrant: a
loader may load its base through ``load_model``. Decoding does not take it."""

MODEL_TYPES: dict[str, str] = {
    "clover": "clover_engine.backbones.clover.weights:load_clover",
    "hf-block-diffusion": "clover_engine.backbones.causal_lm.adapter:load_adapter_model",
    "llama": "clover_engine.backbones.causal_lm.model:load_pretrained_backbone",
    "qwen2": "clover_engine.backbones.causal_lm.model:load_pretrained_backbone",
    "qwen3": "clover_engine.backbones.causal_lm.model:load_pretrained_backbone",
    "dream": "clover_engine.backbones.masked_diffusion:load_masked_diffusion",
    "llada": "clover_engine.backbones.llada_moe:load_llada",  # dense LLaDA, or LLaDA-MoE when it has experts
    "lladamoe": "clover_engine.backbones.llada_moe:load_llada_moe",
    "llada_moe": "clover_engine.backbones.llada_moe:load_llada_moe",
    "fast_dllm_qwen": "clover_engine.backbones.block_causal:load_block_causal",
    "sdar": "clover_engine.backbones.block_causal:load_block_causal",
    "sdar_moe": "clover_engine.backbones.sdar_moe:load_sdar_moe",
    "llada2_moe": "clover_engine.backbones.llada2_moe:load_llada2_moe",
    "diffusion_gemma": "clover_engine.backbones.diffusion_gemma.model:load_diffusion_gemma_model",
    "block-drafter": "clover_engine.backbones.drafter.model:load_drafter_model",
}
"""``model_type`` (lower case) -> ``"module:function"`` of its loader. A ``config.json`` without a
``model_type`` is a Clover checkpoint (as older saves were)."""

DESCRIPTIONS: dict[str, str] = {
    "clover": "a Clover checkpoint (config.json + model.safetensors, clover_engine.checkpoint.save_model)",
    "hf-block-diffusion": "an adapter directory over a pinned transformers base (clover_engine.backbones.causal_lm.adapter)",
    "llama": "a transformers causal LM decoded block-wise with token shift (clover_engine.backbones.causal_lm.model)",
    "qwen2": "a transformers causal LM decoded block-wise with token shift (clover_engine.backbones.causal_lm.model)",
    "qwen3": "a transformers causal LM decoded block-wise with token shift (clover_engine.backbones.causal_lm.model)",
    "dream": "a Dream masked-diffusion checkpoint (clover_engine.backbones.masked_diffusion)",
    "llada": "a LLaDA masked-diffusion checkpoint (clover_engine.backbones.masked_diffusion)",
    "lladamoe": "a LLaDA-MoE masked-diffusion checkpoint, expert union observed (clover_engine.backbones.llada_moe)",
    "llada_moe": "a LLaDA-MoE masked-diffusion checkpoint, expert union observed (clover_engine.backbones.llada_moe)",
    "fast_dllm_qwen": "a Fast-dLLM v2 block-diffusion checkpoint (clover_engine.backbones.block_causal)",
    "sdar": "an SDAR block-diffusion checkpoint (clover_engine.backbones.block_causal)",
    "sdar_moe": "an SDAR MoE block-diffusion checkpoint, expert union observed (clover_engine.backbones.sdar_moe)",
    "llada2_moe": "a LLaDA2.0 block-diffusion checkpoint, Ling-2.0 MoE layers, expert union observed "
                  "(clover_engine.backbones.llada2_moe)",
    "diffusion_gemma": "transformers' DiffusionGemma, its own revisable sampler (clover_engine.backbones.diffusion_gemma)",
    "block-drafter": "a block drafter over a frozen pinned causal LM (clover_engine.backbones.drafter)",
}
"""``model_type`` -> one line for error messages and ``--help``."""


def register(model_type: str, loader: str, description: str = "") -> None:
    """Add (or replace) a row: ``model_type`` opens with ``loader`` (``"module:function"``).

    Raises:
        ValueError: for a loader string that is not ``"module:function"``.
    """
    module, sep, func = loader.partition(":")
    if not sep or not module or not func:
        raise ValueError(f"loader must be 'module:function', got {loader!r}")
    MODEL_TYPES[model_type.lower()] = loader
    DESCRIPTIONS[model_type.lower()] = description or f"registered backbone ({loader})"


def unregister(model_type: str) -> None:
    """Remove a row added with `register` (tests clean up with it)."""
    MODEL_TYPES.pop(model_type.lower(), None)
    DESCRIPTIONS.pop(model_type.lower(), None)


def model_type_of(directory: str | Path) -> str:
    """The lower-case ``model_type`` of ``directory/config.json`` (``"clover"`` when it names none).

    Raises:
        ValueError: no readable ``config.json`` there.
    """
    path = Path(directory) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read as JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds {type(data).__name__}, not a JSON object")
    mt = data.get("model_type", "clover")
    return str(mt).lower() if isinstance(mt, str) else repr(mt)


def loader_for(model_type: str) -> Callable[..., Any]:
    """The loader function of ``model_type`` (its module imported now).

    Raises:
        ValueError: for a model type with no row, listing the ones there are.
    """
    spec = MODEL_TYPES.get(model_type.lower())
    if spec is None:
        raise ValueError(f"no backbone is registered for model_type {model_type!r}; registered: "
                         f"{', '.join(sorted(MODEL_TYPES))} (clover_engine.backbones.registry.register adds one)")
    module, _, func = spec.partition(":")
    return getattr(importlib.import_module(module), func)
