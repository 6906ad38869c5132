"""The bytes a forward really pages in from a mapped MoE checkpoint (`PageMeter`), recorded beside the cost model's.

A tiny LLaDA2.0 checkpoint (8 experts) is loaded mapped and decoded with events: every step records
``bytes_paged_in`` (the growth of this process's resident pages of the checkpoint's file, ``/proc/self/smaps``);
over the decode they add up to no more than the file, the first forward reads the most, and a step whose experts
were all read before pages in next to nothing. The column survives a save and load, an older trace without it
reads as not measured, and the Cost figure draws it. Linux only.

Run: ``.venv/bin/python -m pytest -q tests/clover_engine/test_paged_in.py``
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from clover_engine.backbones.llada2_moe import write_tiny_llada2_moe
from clover_engine.backbones.safetensors_shards import PageMeter
from clover_engine.checkpoint import load_model
from clover_engine.decoding.block_diffusion_decoder import BlockDiffusionDecoder
from clover_engine.decoding.llada2_samplers import LLaDA2Sampler
from clover_engine.recording.trace import Trace

pytestmark = pytest.mark.skipif(not PageMeter.SMAPS.exists(), reason="needs Linux /proc/self/smaps")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    # experts of 2 MB each: mapping a tensor makes its first few hundred KB resident at load already
    d = write_tiny_llada2_moe(tmp_path_factory.mktemp("paged") / "llada2", hidden_size=512, moe_intermediate_size=1024,
                              intermediate_size=1024)
    model = load_model(d)
    result = BlockDiffusionDecoder(model, None, LLaDA2Sampler(gen_length=32, block_length=32, steps=32)).generate(
        list(range(10, 40)))
    return d, model, result.trace


def test_each_step_records_what_it_paged_in_and_the_total_is_the_file_at_most(run):
    d, model, trace = run
    paged = trace.column("bytes_paged_in")
    size = (d / "model.safetensors").stat().st_size
    assert len(paged) >= 2 and np.isfinite(paged).all()
    assert 0 < paged.sum() <= size
    assert paged[0] == paged.max() and paged[0] > 0.3 * size  # the first forward reads most of the weights
    assert paged[-1] < 0.05 * size  # the last reads next to nothing new
    # bytes the cost model says a forward reads are of the same order as what the first one paged in
    assert 0.2 < paged[0] / trace.column("bytes_read")[0] < 2.0


def test_a_meter_counts_first_reads_only(run):
    d, model, _ = run
    meter = PageMeter.of(model)
    assert meter is not None and meter.files == {str((d / "model.safetensors").resolve())}
    with torch.no_grad():
        sum(float(p.sum()) for p in model.parameters())  # everything resident now
    meter.paged_in()
    with torch.no_grad():
        sum(float(p.sum()) for p in model.parameters())
    assert meter.paged_in() == 0


def test_the_column_survives_a_save_old_traces_read_none_and_the_cost_figure_draws_it(run, tmp_path):
    import pyarrow.parquet as pq

    from clover_viz.figures.cost import cost_figure

    _, _, trace = run
    path = tmp_path / "t.parquet"
    trace.save(path)
    back = Trace.load(path)
    np.testing.assert_array_equal(back.column("bytes_paged_in"), trace.column("bytes_paged_in"))
    table = pq.read_table(path)
    old = tmp_path / "old.parquet"
    pq.write_table(table.drop(["bytes_paged_in"]).replace_schema_metadata(table.schema.metadata), old)
    assert np.isnan(Trace.load(old).column("bytes_paged_in")).all()
    names = [t.name for t in cost_figure(trace).data]
    assert "MB paged in from the checkpoint (measured)" in names
    assert "MB paged in from the checkpoint (measured)" not in [t.name for t in cost_figure(Trace.load(old)).data]


def test_a_dense_model_is_not_metered(tmp_path):
    from clover_engine.backbones.block_causal import write_tiny_block_causal
    from clover_engine.decoding.block_diffusion_samplers import SDARSampler

    model = load_model(write_tiny_block_causal(Path(tmp_path) / "sdar", "SDAR"))
    trace = BlockDiffusionDecoder(model, None, SDARSampler(gen_length=8, block_length=4, denoising_steps=4,
                                                           top_k=1)).generate([5, 6, 7]).trace
    assert np.isnan(trace.column("bytes_paged_in")).all()
