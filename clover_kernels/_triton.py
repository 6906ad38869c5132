"""Whether Triton can run here, and how a dispatcher decides to use it.

Triton's JIT reads ``TRITON_INTERPRET`` when a kernel is decorated, so the Triton
modules (``clover_kernels/<op>/triton_*.py``) are imported lazily, by the dispatcher, the
first time a Triton path runs. With ``TRITON_INTERPRET=1`` set before that import,
the kernels run on CPU tensors in Triton's interpreter (how the tests check them).
"""

from __future__ import annotations

import importlib.util
import os

import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_runs_on(t: torch.Tensor) -> bool:
    """True when a Triton kernel can take tensor `t`: CUDA with Triton installed, or any
    device under the interpreter."""
    return HAS_TRITON and (t.is_cuda or interpreting())


def require_triton(op: str, t: torch.Tensor) -> None:
    """Raise a clear error when `op`'s Triton path was asked for but cannot run on `t`.

    Raises:
        RuntimeError: Triton is missing, or `t` is on the CPU without ``TRITON_INTERPRET=1``.
    """
    if not HAS_TRITON:
        raise RuntimeError(f"{op}: impl='triton' needs Triton (pip install triton)")
    if not triton_runs_on(t):
        raise RuntimeError(f"{op}: impl='triton' needs CUDA tensors, or TRITON_INTERPRET=1 set before "
                           f"the first Triton kernel is imported (tensor on {t.device})")
