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
    BlockStart, StepEvent, BlockEnd, DecodeEnd      (events, clover_engine.recording.events)
    Trace (clover_engine.recording.trace): record / save / load Parquet or Arrow
    load_model, save_model, load_tokenizer          (clover_engine.checkpoint; load_model opens every format
                                                     model_format names)
    python -m clover_engine.convert --from qwen3_5_moe SRC --out DST   (a Qwen3.5-MoE checkpoint -> Clover)
    forward_cost, DEVICES                            (clover_engine.cost)

Wing: ``entry points``.
"""

from clover_engine.backbones.clover.config import CloverConfig

# The rest is imported on first use (PEP 562), so `python -m clover_engine.cost` / `clover_engine.checkpoint`
# do not import their own module twice.
_LAZY = {
    "load_model": "clover_engine.checkpoint", "save_model": "clover_engine.checkpoint", "load_tokenizer": "clover_engine.checkpoint",
    "model_format": "clover_engine.checkpoint",
    "DEVICES": "clover_engine.cost", "forward_cost": "clover_engine.cost",
    "BlockDecoder": "clover_engine.decoding.decoder", "DecodeConfig": "clover_engine.decoding.decoder", "DecodeResult": "clover_engine.decoding.decoder",
    "BlockEnd": "clover_engine.recording.events", "BlockStart": "clover_engine.recording.events", "DecodeEnd": "clover_engine.recording.events",
    "ProcessorFiring": "clover_engine.recording.events", "StepEvent": "clover_engine.recording.events",
    "CloverModel": "clover_engine.backbones.clover.model", "CloverState": "clover_engine.backbones.clover.model",
    "Trace": "clover_engine.recording.trace",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'clover_engine' has no attribute {name!r}")


__all__ = ["CloverConfig", *_LAZY]
