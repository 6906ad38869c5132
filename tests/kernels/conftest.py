"""Kernel tests run Triton kernels on CPU tensors in Triton's interpreter.

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, and the dispatchers import
their Triton modules lazily, so setting it here -- before any test in this folder runs --
covers every Triton kernel. Tests that need Triton skip when it is not installed.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
