"""Kernels for Clover's hot ops: ``<op>/naive.py`` (plain-torch reference) and a fast path per op."""
