"""Measurements behind notebook 06 (constant memory in context length): a long prompt
committed chunk by chunk into a Clover state, with the state's bytes and the wall time
after every chunk, and the peak bytes of the tensors a prefill allocates.

* `long_context_model` -- a seeded random model of a preset with its context raised (the
  small presets stop at a few thousand positions; memory and time do not depend on the
  weights being trained).
* `prefill` -- commit a prompt in chunks of ``chunk`` tokens (each chunk is one forward
  with an empty block: ``model(ids[:, :0], state, commit_ids=chunk, block_size=...)``),
  recording after each chunk the committed position, the cumulative wall and CPU time and
  ``CloverState.nbytes()`` of the live state object (`PrefillRun`).
* `PeakMemory` -- a ``TorchDispatchMode`` that counts the bytes of every tensor storage
  a torch op allocates inside it, until the last tensor using that storage is freed, and
  keeps the peak: the activation memory of the code it wraps (weights and state tensors
  allocated before it are not counted; in-place updates of them allocate nothing).
  `prefill_peak_bytes` wraps `prefill` in it.
* `decode_step_s` -- the median time of a denoising forward on states of different context
  lengths, interleaved.

What `PeakMemory` sees: storages returned by aten ops (outputs that alias an input --
views, in-place and ``out=`` results -- are not new allocations). Scratch memory inside a
single kernel is invisible to it, so its peak is a lower bound of the allocator's; on the
GPU ``torch.cuda.max_memory_allocated`` is the allocator's own number.

Wing: ``experiments``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_experiments_memory.py -q``
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.backbones.clover.model import random_model


class _Storage:
    """One tracked allocation: its bytes and how many live tensors use it."""

    __slots__ = ("live", "nbytes", "refs")

    def __init__(self, nbytes: int):
        self.nbytes, self.refs, self.live = nbytes, 0, True


class PeakMemory(TorchDispatchMode):
    """Count the bytes of tensor storage allocated inside the context; keep the peak.

    Usage::

        with PeakMemory() as pm:
            out = model(...)
        pm.peak_bytes      # most bytes alive at once, allocated inside the block
        pm.current_bytes   # bytes still alive (e.g. held by ``out``)

    A storage counts from the op that creates it until the last tensor using it (views
    included) is garbage-collected (a ``weakref.finalize`` per tensor). Outputs that alias
    an input (views, in-place and ``out=`` results, per the op's schema) allocate nothing.

    Attributes:
        peak_bytes: int, the most bytes alive at once since ``__enter__``.
        current_bytes: int, bytes alive now.
    """

    def __init__(self) -> None:
        super().__init__()
        self.peak_bytes = 0
        self.current_bytes = 0
        self._live: dict[int, _Storage] = {}

    def __enter__(self) -> PeakMemory:  # noqa: PYI034
        self.peak_bytes = self.current_bytes = 0
        self._live = {}
        super().__enter__()
        return self

    def _release(self, key: int, entry: _Storage) -> None:
        entry.refs -= 1
        if entry.refs == 0 and entry.live:
            entry.live = False
            self.current_bytes -= entry.nbytes
            if self._live.get(key) is entry:
                del self._live[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        aliasing = any(r.alias_info is not None for r in func._schema.returns)
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0:
                continue
            entry = self._live.get(key)
            if not aliasing:
                if entry is not None and entry.live:  # the address was reused: the old storage is gone
                    entry.live = False
                    self.current_bytes -= entry.nbytes
                entry = self._live[key] = _Storage(nbytes)
                self.current_bytes += nbytes
                self.peak_bytes = max(self.peak_bytes, self.current_bytes)
            elif entry is None:  # a view of memory allocated before the context (weights, state)
                continue
            entry.refs += 1
            weakref.finalize(t, self._release, key, entry)
        return out


def long_context_model(preset: str = "clover-test", context: int = 131072 + 1024, seed: int = 0):
    """A seeded random `clover_engine.backbones.clover.model.CloverModel` of ``preset`` whose context holds ``context`` positions.

    Only ``max_position_embeddings`` changes (RoPE has no table to grow); every other size
    is the preset's, in fp32 and eval mode.
    """

    cfg = dataclasses.replace(CloverConfig.from_name(preset), max_position_embeddings=int(context))
    return random_model(cfg, seed=seed)


@dataclass
class PrefillRun:
    """A prompt committed chunk by chunk.

    Attributes (K = chunks):
        positions: (K,) int64 -- tokens committed after each chunk.
        wall_s: (K,) float64 -- cumulative wall seconds of the forwards up to that chunk.
        cpu_s: (K,) float64 -- the same in CPU seconds of this process (`time.process_time`):
            less sensitive than wall time to other processes sharing the cores.
        state_bytes: (K,) int64 -- ``state.nbytes()`` after that chunk (the live object).
        state: the final `clover_engine.backbones.clover.model.CloverState`.
    """

    positions: np.ndarray
    wall_s: np.ndarray
    cpu_s: np.ndarray
    state_bytes: np.ndarray
    state: Any


def prefill(model, ids: torch.Tensor, chunk: int, block_size: int = 32, memory_mode: str = "state",
            state: Any = None) -> PrefillRun:
    """Commit ``ids`` into a fresh state, ``chunk`` tokens per forward.

    Each forward commits one chunk (a whole number of blocks of ``block_size``) with an
    empty current block, so only the commit runs: the chunk reads the state, folds itself in
    block by block (the first chunk of a fresh state in one batched pass, docs/architecture.md
    §3) and is dropped. The result does not depend on ``chunk`` beyond fp32 rounding.

    Args:
        model: a `CloverModel` (eval mode).
        ids: [1, P] int64 prompt ids, P a multiple of ``block_size``.
        chunk: tokens per forward, a multiple of ``block_size``.
        block_size: the decode's block size (committed blocks attend within themselves).
        memory_mode: passed to ``model.setup_state``.
        state: a fresh state from ``model.setup_state`` to fill (default: a new one).

    Raises:
        ValueError: P or ``chunk`` not a multiple of ``block_size``, or an empty prompt.
    """
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
        raise ValueError(f"ids must be [1, P] with P >= 1, got shape {tuple(ids.shape)}")
    P = ids.shape[1]
    if chunk < 1 or chunk % block_size or P % block_size:
        raise ValueError(f"prompt length {P} and chunk {chunk} must be positive multiples of block_size {block_size}")
    if state is None:
        state = model.setup_state(1, memory_mode)
    elif state.position:
        raise ValueError(f"state already holds {state.position} tokens; prefill starts from a fresh state")
    empty = ids[:, :0]
    positions, walls, cpus, sizes = [], [], [], []
    wall = cpu = 0.0
    with torch.no_grad():
        for c0 in range(0, P, chunk):
            t0, c0_cpu = time.perf_counter(), time.process_time()
            model(empty, state, commit_ids=ids[:, c0:c0 + chunk], block_size=block_size)
            wall += time.perf_counter() - t0
            cpu += time.process_time() - c0_cpu
            positions.append(state.position)
            walls.append(wall)
            cpus.append(cpu)
            sizes.append(state.nbytes())
    return PrefillRun(np.asarray(positions, np.int64), np.asarray(walls, np.float64), np.asarray(cpus, np.float64),
                      np.asarray(sizes, np.int64), state)


def prefill_peak_bytes(model, ids: torch.Tensor, chunk: int, block_size: int = 32) -> int:
    """Peak bytes of the tensors `prefill` allocates (`PeakMemory`), the state excluded.

    The state is allocated before the measurement starts and updated in place, so the
    number is the prefill's activation memory: for a one-chunk prefill it grows with the
    prompt, for a fixed chunk it does not.
    """
    state = model.setup_state(1)
    with PeakMemory() as pm:
        prefill(model, ids, chunk, block_size, state=state)
    return int(pm.peak_bytes)


def decode_step_s(model, states: dict, block_ids: torch.Tensor, n: int = 30) -> dict:
    """Median wall seconds of one denoising forward of ``block_ids`` on each of ``states``.

    The forwards read the state only (no commit), so the states are left as they were. The
    states take turns, one forward each, ``n`` rounds, so that load from other processes
    falls on all of them alike; one warm-up round is not timed.

    Args:
        model: a `CloverModel`.
        states: ``{label: CloverState}``, e.g. states after short and long prompts.
        block_ids: [1, L] the block (its slots sit at each state's position).
        n: timed rounds.

    Returns:
        ``{label: median seconds}``.
    """
    times: dict = {k: [] for k in states}
    with torch.no_grad():
        for r in range(n + 1):
            for k, st in states.items():
                t0 = time.perf_counter()
                model(block_ids, st)
                if r:
                    times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}


__all__ = ["PeakMemory", "PrefillRun", "decode_step_s", "long_context_model", "prefill", "prefill_peak_bytes"]
