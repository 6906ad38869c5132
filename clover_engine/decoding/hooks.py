"""Hooks on a decoder: the `Hook` type (``fn(event) -> None``), `HookHandle` and `HookRegistry`
(``add_hook`` and ``with decoder.hooks(...)``). Wing ``decoding``; `clover_engine.decoding.decoder`
re-exports `HookRegistry` as the decoding API."""

from __future__ import annotations

import contextlib
from typing import Callable

Hook = Callable[[object], None]


class HookHandle:
    """Returned by `BlockDecoder.add_hook`; ``remove()`` unregisters (idempotent)."""

    def __init__(self, hooks: list, fn: Hook):
        self._hooks, self._fn = hooks, fn

    def remove(self) -> None:
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)


class HookRegistry:
    """Hooks registered on a decoder for every later decode (``self._hooks``, set by the subclass):
    `add_hook` and the ``with decoder.hooks(...)`` context. Shared by `BlockDecoder` and the
    decoders that run a model's own sampler (`clover_engine.decoding.diffusion_gemma.DiffusionGemmaDecoder`)."""

    _hooks: list[Hook]

    def add_hook(self, fn: Hook) -> HookHandle:
        """Register ``fn(event)`` for every event of every later decode; returns a handle.

        Raises:
            TypeError: ``fn`` is not callable.
        """
        if not callable(fn):
            raise TypeError(f"a hook must be callable, got {type(fn).__name__}")
        self._hooks.append(fn)
        return HookHandle(self._hooks, fn)

    @contextlib.contextmanager
    def hooks(self, *fns: Hook):
        """``with decoder.hooks(fn, ...):`` -- registered inside the block, removed in ``finally``."""
        handles = [self.add_hook(fn) for fn in fns]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
