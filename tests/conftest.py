"""Shared test setup: one torch thread (CLOVER_TORCH_THREADS overrides), and Triton's CPU interpreter.

With two threads on a 2-core machine that runs anything else, OpenMP spin-waits
made a 64-token decode ~70x slower; one thread is also what CI's runs need.

Triton decides between compiled and interpreted kernels when it is imported (its own
``triton.language`` helpers are decorated then), and other libraries import it early
(transformers, torch's compiler probing for it), so ``TRITON_INTERPRET=1`` is set here, before
anything else is imported: the kernel tests run Triton kernels on CPU tensors.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("CLOVER_TORCH_THREADS", "1")))


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests (tiny models on a shared 2-core machine: one thread avoids
    OpenMP threads fighting); modules opt in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
