"""Decoding: `DecodeConfig`, the block decoder and its public step, policies, processors, hooks, and
speculative decoding. Wing ``decoding``, above ``backbones`` and ``cost``.

`decoder_for(model, tokenizer, config)` gives the decoder that drives a loaded model, chosen by its
declared ``Capabilities.sampler`` (`clover_engine.decoding.samplers`)."""

from clover_engine.decoding.samplers import SAMPLERS, decoder_for

__all__ = ["SAMPLERS", "decoder_for"]
