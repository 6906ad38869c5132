"""Gated delta rule through flash-linear-attention's chunked Triton kernel (CUDA only).

``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` (flash-linear-attention, MIT; Yang et
al., "Gated Delta Networks", ICLR 2025) computes the same recurrence as
`naive.gated_delta_rule`. Its conventions, read from its source (release 0.5.2,
``fla/ops/gated_delta_rule/chunk.py`` and ``naive.py``), next to ours:

* layout: time-major ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``, ``g, beta [B, T, HV]`` --
  ours. Grouped values (HV > H) are native only from 0.5.0, so the adapter repeats each
  key head's q/k over its ``HV / H`` value heads (value head j uses key head
  ``j // (HV / H)``, as ours) and always calls it with H == HV.
* ``g``: natural-log decay, applied before the delta (``S <- exp(g_t) S``, then
  ``u_t = beta_t (v_t - S^T k_t)``, ``S <- S + k_t u_t^T``, ``o_t = scale * S^T q_t``) --
  ours. ``beta`` is the post-sigmoid write strength (``use_beta_sigmoid_in_kernel=False``,
  the default).
* ``scale`` multiplies q after the optional in-kernel L2 norm; default ``K ** -0.5`` --
  ours (the adapter passes it explicitly).
* state ``[N, HV, K, V]`` (key rows; ``state_v_first=False``, the default) -- ours; the
  final state is fp32; ``o`` comes back in q's dtype.
* argument order: fla's ``naive_recurrent_gated_delta_rule`` takes ``beta`` before ``g``
  while ``chunk_gated_delta_rule`` takes ``g`` first, so everything is passed by keyword.
* dtypes: q, k and v must share one dtype (cast to v's here; g stays fp32, beta is cast
  to v's dtype); fp32 inputs are accepted from release 0.4.0 on (earlier ones assert).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import Callable

import torch

MIN_VERSION = (0, 4, 0)


def available() -> bool:
    """True when flash-linear-attention >= 0.4.0 is installed (it is not a dependency)."""
    if importlib.util.find_spec("fla") is None:
        return False
    try:
        version = importlib.metadata.version("flash-linear-attention")
    except importlib.metadata.PackageNotFoundError:
        return False
    parts = tuple(int(p) for p in version.split("+")[0].split(".")[:3] if p.isdigit())
    return parts >= MIN_VERSION


def _chunk_kernel() -> Callable:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return chunk_gated_delta_rule


def gated_delta_rule(q, k, v, g, beta, initial_state=None, output_final_state=True,
                     use_qk_l2norm_in_kernel=False, scale=None, kernel: Callable | None = None):
    """`naive.gated_delta_rule` (same arguments and results) through fla's chunked kernel.

    Args:
        kernel: a callable with ``chunk_gated_delta_rule``'s keyword signature (tests pass a
            CPU stand-in); None imports fla's.

    Returns:
        o: [B, T, H_v, V] in v's dtype; final state [B, H_v, K, V] fp32 (or None).

    Raises:
        ValueError: H_v not a multiple of H_k.
    """
    Hk, Hv = k.shape[2], v.shape[2]
    if Hv % Hk:
        raise ValueError(f"H_v={Hv} must be a multiple of H_k={Hk}")
    if Hv != Hk:
        q, k = q.repeat_interleave(Hv // Hk, dim=2), k.repeat_interleave(Hv // Hk, dim=2)
    dtype = v.dtype
    kernel = kernel or _chunk_kernel()
    o, S = kernel(q=q.to(dtype), k=k.to(dtype), v=v, g=g.float(), beta=beta.to(dtype),
                  scale=q.shape[-1] ** -0.5 if scale is None else scale,
                  initial_state=None if initial_state is None else initial_state.float().contiguous(),
                  output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    return o.to(dtype), (S.float() if output_final_state else None)
