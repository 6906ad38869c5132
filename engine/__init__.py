"""Clover engine: model, block decoder, events, traces, cost model, checkpoints.

Shape letters used in comments and docstrings across the project::

    B  batch
    T  tokens (sequence positions in one forward)
    L  block length: slots of the current block
    H  heads
    K  key head dim
    V  value head dim
    E  experts
    N  layers

e.g. ``# [B, T, H, K]`` after splitting keys into heads.
"""

from engine.config import CloverConfig

__all__ = ["CloverConfig"]
