"""Gated delta rule: one dispatcher over the implementations.

``naive`` (token loop, the definition), ``chunk`` (chunked torch, the CPU fast
path). `set_impl` forces one for tests.
"""

from __future__ import annotations

import torch

from kernels.gated_delta_rule import chunk as _chunk
from kernels.gated_delta_rule import naive as _naive

_IMPLS = {"naive": _naive.gated_delta_rule, "chunk": _chunk.gated_delta_rule}
_forced: str | None = None


def set_impl(name: str | None) -> None:
    """Force an implementation (``"naive"``, ``"chunk"``) or restore automatic choice (None)."""
    global _forced
    if name is not None and name not in _IMPLS:
        raise ValueError(f"unknown gated_delta_rule impl {name!r}; choose one of {sorted(_IMPLS)}")
    _forced = name


def gated_delta_rule(q, k, v, g, beta, initial_state=None, output_final_state=True,
                     use_qk_l2norm_in_kernel=False, scale=None, impl: str | None = None):
    """Dispatch to an implementation; arguments as in `naive.gated_delta_rule`."""
    name = impl or _forced or ("naive" if q.shape[1] == 1 else "chunk")
    return _IMPLS[name](q, k, v, g, beta, initial_state, output_final_state,
                        use_qk_l2norm_in_kernel, scale)


__all__ = ["gated_delta_rule", "set_impl"]
