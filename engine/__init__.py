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
    BlockStart, StepEvent, BlockEnd, DecodeEnd      (events, engine.events)
    Trace (engine.trace): record / save / load Parquet or Arrow
    load_model, save_model, load_tokenizer          (engine.checkpoint)
    forward_cost, DEVICES                            (engine.cost)
"""

from engine.checkpoint import load_model, load_tokenizer, save_model
from engine.config import CloverConfig
from engine.cost import DEVICES, forward_cost
from engine.decoder import BlockDecoder, DecodeConfig, DecodeResult
from engine.events import BlockEnd, BlockStart, DecodeEnd, ProcessorFiring, StepEvent
from engine.model import CloverModel, CloverState
from engine.trace import Trace

__all__ = [
    "CloverConfig", "CloverModel", "CloverState", "BlockDecoder", "DecodeConfig", "DecodeResult",
    "BlockStart", "StepEvent", "BlockEnd", "DecodeEnd", "ProcessorFiring", "Trace",
    "load_model", "save_model", "load_tokenizer", "forward_cost", "DEVICES",
]
