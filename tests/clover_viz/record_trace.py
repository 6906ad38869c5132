"""Record the clover_viz test traces (no trained model needed).

``loud_clover_test()`` is ``clover_engine.backbones.clover.model.random_model('clover-test', 0, 15.0)`` (as
``tests/helpers.py::loud_model``), so confidences are peaked and a
decode shows accepted, forced and EOS-filled slots. ``tests/data/small_trace.parquet``
is re-recorded with::

    .venv/bin/python tests/clover_viz/record_trace.py
"""

from __future__ import annotations

from pathlib import Path

SMALL_TRACE = Path(__file__).resolve().parents[1] / "data" / "small_trace.parquet"

SMALL_PROMPT = "def add(a, b):\n    return"
SMALL_CONFIG = dict(block_size=8, threshold=0.4, max_new_tokens=30, eos_bias_soft_limit=6, eos_bias_rate=0.3)


def loud_clover_test(seed: int = 0, scale: float = 15.0):
    """``clover-test`` with every >=2-D weight multiplied by ``scale`` (peaked logits), eval mode."""
    from clover_engine.backbones.clover.model import random_model

    return random_model("clover-test", seed, scale)


def record_small_trace(path: Path = SMALL_TRACE):
    """Decode `SMALL_PROMPT` with `SMALL_CONFIG` and save the trace (prompt pre-fill, forced and EOS-filled slots)."""
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
    from clover_engine.tokenizer import byte_tokenizer

    result = BlockDecoder(loud_clover_test(), byte_tokenizer(), DecodeConfig(**SMALL_CONFIG)).generate(SMALL_PROMPT)
    result.trace.save(path)
    return result.trace


if __name__ == "__main__":
    trace = record_small_trace()
    print(SMALL_TRACE, trace.summary())
