"""Kernel tests run Triton kernels on CPU tensors in Triton's interpreter: ``TRITON_INTERPRET=1``
is set by the root ``tests/conftest.py`` before anything imports Triton (it must be set before
Triton's own helpers are decorated). Tests that need Triton skip when it is not installed.
"""
