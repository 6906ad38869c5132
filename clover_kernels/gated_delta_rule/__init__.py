"""Gated delta rule: one dispatcher over the implementations.

``naive`` (token loop, the definition), ``chunk`` (chunked torch, the CPU fast path) and
``fla`` (flash-linear-attention's chunked Triton kernel, `fla.gated_delta_rule`). With
``impl=None``: CUDA tensors take ``fla`` when flash-linear-attention >= 0.4 is installed;
otherwise one token takes ``naive`` and more take ``chunk``.
"""

from __future__ import annotations

from clover_kernels.gated_delta_rule import chunk as _chunk
from clover_kernels.gated_delta_rule import fla as _fla
from clover_kernels.gated_delta_rule import naive as _naive

_IMPLS = {"naive": _naive.gated_delta_rule, "chunk": _chunk.gated_delta_rule, "fla": _fla.gated_delta_rule}
IMPLS = tuple(_IMPLS)
_HAS_FLA = _fla.available()


def gated_delta_rule(q, k, v, g, beta, initial_state=None, output_final_state=True,
                     use_qk_l2norm_in_kernel=False, scale=None, impl: str | None = None):
    """Dispatch to an implementation; arguments as in `naive.gated_delta_rule`.

    Args:
        impl: ``"naive"``, ``"chunk"``, ``"fla"`` or None (see the module docstring).

    Raises:
        ValueError: unknown impl.
    """
    if impl is None:
        impl = "fla" if q.is_cuda and _HAS_FLA else ("naive" if q.shape[1] == 1 else "chunk")
    if impl not in _IMPLS:
        raise ValueError(f"unknown gated_delta_rule impl {impl!r}; choose one of {IMPLS}")
    return _IMPLS[impl](q, k, v, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel, scale)


__all__ = ["IMPLS", "gated_delta_rule"]
