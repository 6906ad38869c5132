"""The speed / answer frontier of one prompt (`clover_engine.decoding.frontier`, issue 63).

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_frontier.py -q``
"""

from __future__ import annotations

import threading

import pytest

from clover_engine.decoding.block_diffusion_samplers import FastDLLMv2Sampler, SDARSampler
from clover_engine.decoding.careful import Agreement, agreement, careful_setting
from clover_engine.decoding.config import DecodeConfig
from clover_engine.decoding.frontier import (
    FrontierPoint,
    frontier_grid,
    mark_pareto,
    measure_frontier,
    setting_label,
)
from clover_engine.decoding.llada2_samplers import LLaDA2Sampler
from clover_engine.decoding.masked_diffusion_samplers import DreamSampler, LLaDASampler


def test_the_grid_spans_each_settings_own_knobs_with_the_careful_decode_first():
    dc = DecodeConfig(block_size=16, threshold=0.9, max_new_tokens=32)
    cells = frontier_grid(dc, thresholds=(0.7, 0.9), block_sizes=(4, 8, 32))
    assert cells[0] == careful_setting(dc) and cells[1] == dc
    assert {(c.block_size, c.threshold) for c in cells[2:]} == {(16, 0.7), (4, 0.7), (4, 0.9), (8, 0.7), (8, 0.9)}
    assert len(cells) == len(set(map(repr, cells)))  # each once (16 / 0.9 is the setting itself)
    llada = frontier_grid(LLaDASampler(gen_length=32, block_length=16, steps=16), block_sizes=(8, 12))
    assert all(32 % c.block_length == 0 and c.steps % (32 // c.block_length) == 0 for c in llada)  # whole blocks
    assert {c.steps for c in llada} == {4, 8, 16, 32}
    dream = frontier_grid(DreamSampler(max_new_tokens=32, steps=8))
    assert [c.steps for c in dream] == [32, 8, 4, 16]
    fd = frontier_grid(FastDLLMv2Sampler(max_new_tokens=32, block_size=32, threshold=0.9), thresholds=(0.5,),
                       block_sizes=(4, 8))
    assert {(c.block_size, c.small_block_size, c.threshold) for c in fd} >= {(4, 4, 0.5), (8, 8, 0.5), (32, 8, 1.0)}
    sdar = frontier_grid(SDARSampler(gen_length=32, block_length=8, denoising_steps=8), thresholds=(0.5,))
    assert all(c.denoising_steps == c.block_length for c in sdar[1:])
    l2 = frontier_grid(LLaDA2Sampler(gen_length=32, block_length=8, steps=8), thresholds=(0.5,), block_sizes=(4,))
    assert {(c.block_length, c.steps, c.threshold) for c in l2} == {(8, 8, 1.0), (8, 8, 0.95), (8, 8, 0.5), (4, 4, 0.5)}
    assert len(frontier_grid(dc, max_cells=5)) == 5
    with pytest.raises(ValueError, match="max_cells"):
        frontier_grid(dc, max_cells=1)
    assert setting_label(dc) == "block 16 · threshold 0.90" and setting_label(dream[1]) == "steps 8"


def _point(tpf: float, pct: float) -> FrontierPoint:
    a = Agreement(10, 10, int(pct / 10), pct, None if pct == 100 else 0, 0, pct == 100)
    return FrontierPoint(setting=None, label=f"{tpf}/{pct}", nfe=10, n_tokens=int(10 * tpf), tokens_per_forward=tpf,
                         agreement=a)


def test_the_pareto_front_is_what_no_other_cell_beats_on_both_axes():
    pts = [_point(1.0, 100), _point(2.0, 100), _point(3.0, 80), _point(2.5, 70), _point(3.0, 60), _point(4.0, 30)]
    mark_pareto(pts)
    assert [p.label for p in pts if p.pareto] == ["2.0/100", "3.0/80", "4.0/30"]


def test_measure_frontier_on_clover_tiny_shares_one_reference_and_can_be_cancelled():
    from clover_engine.decoding.samplers import decoder_for
    from clover_viz.models import load_model_cached, resolve_model

    loaded = load_model_cached(resolve_model("clover-tiny"))
    prompt = "def add(a, b):\n    return"
    dec = decoder_for(loaded.model, loaded.tokenizer)
    setting = DecodeConfig(block_size=16, threshold=0.9, max_new_tokens=16, memory_mode="state")
    cells = frontier_grid(setting, thresholds=(0.5, 0.9), block_sizes=(8,))
    seen = []
    points = measure_frontier(lambda c: dec.generate(prompt, config=c), setting, cells,
                              progress=lambda i, n, p: seen.append((i, n, p.label)))
    assert [s[0] for s in seen] == list(range(1, len(cells) + 1)) and points[0].careful
    ref = points[0].result.tokens
    assert points[0].agreement.token_agreement == 100.0 and points[0].agreement.own
    for p in points[1:]:
        assert p.agreement == agreement(p.result.tokens, ref)
        assert p.tokens_per_forward == pytest.approx(len(p.result.tokens) / p.result.nfe)
    assert sum(p.current for p in points) == 1 and any(p.pareto for p in points)
    assert max(p.tokens_per_forward for p in points) >= points[0].tokens_per_forward
    stop = threading.Event()
    cut = measure_frontier(lambda c: dec.generate(prompt, config=c), setting, cells, cancel=stop,
                           progress=lambda i, n, p: stop.set() if i == 2 else None)
    assert len(cut) == 2
