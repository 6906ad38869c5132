"""Clover engine: model, block decoder, events, traces, cost model, checkpoints.

Shape letters used in comments and docstrings across the project::

    B  batch
    T  tokens (sequence positions in one forward: committed + block)
    L  block length: slots of the current block
    C  committed tokens folded into the state by a forward
    H  heads
    K  key head dim
    V  value head dim
    E  experts
    N  layers
    W  attention window (state+window mode)

e.g. ``# [B, T, H, K]`` after splitting keys into heads.

Public API::

    CloverConfig.from_name("clover-test" | "clover-35b-a3b")
    CloverModel(config); model.setup_state(batch, memory_mode); model(block, state, commit_ids, block_size)
    BlockDecoder(model, tokenizer, DecodeConfig(...)).generate(prompt, hooks=...) -> DecodeResult
    BlockStart, StepEvent, BlockEnd, DecodeEnd      (events, engine.recording.events)
    Trace (engine.recording.trace): record / save / load Parquet or Arrow
    load_model, save_model, load_tokenizer          (engine.checkpoint; load_model opens every format
                                                     model_format names)
    python -m engine.convert --from qwen3_5_moe SRC --out DST   (a Qwen3.5-MoE checkpoint -> Clover)
    forward_cost, DEVICES                            (engine.cost)

Wing: ``entry points``.
"""

from engine.backbones.clover.config import CloverConfig

# The rest is imported on first use (PEP 562), so `python -m engine.cost` / `engine.checkpoint`
# do not import their own module twice.
_LAZY = {
    "load_model": "engine.checkpoint", "save_model": "engine.checkpoint", "load_tokenizer": "engine.checkpoint",
    "model_format": "engine.checkpoint",
    "DEVICES": "engine.cost", "forward_cost": "engine.cost",
    "BlockDecoder": "engine.decoding.decoder", "DecodeConfig": "engine.decoding.decoder", "DecodeResult": "engine.decoding.decoder",
    "BlockEnd": "engine.recording.events", "BlockStart": "engine.recording.events", "DecodeEnd": "engine.recording.events",
    "ProcessorFiring": "engine.recording.events", "StepEvent": "engine.recording.events",
    "CloverModel": "engine.backbones.clover.model", "CloverState": "engine.backbones.clover.model",
    "Trace": "engine.recording.trace",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = ["CloverConfig", *_LAZY]
