"""Causal LMs decoded block-wise with token shift (`model`) and block-diffusion adapters over pinned
bases (`adapter`). Wing ``backbones``."""
