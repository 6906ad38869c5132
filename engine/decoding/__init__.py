"""Decoding: `DecodeConfig`, the block decoder and its public step, policies, processors, hooks, and
speculative decoding. Wing ``decoding``, above ``backbones`` and ``cost``."""
