"""Progress and cancellation of model loads (`clover_engine.backbones.load_progress`).

* The lean loader of the hub families and the Clover checkpoint reader report every weight byte they
  read: at the end of a load, done == total == the checkpoint's tensor bytes.
* A watcher's ``should_stop`` ends a load at its next tensor with `LoadCancelled`; no model object of it
  stays alive, and the next load of the same checkpoint works.
* huggingface_hub's download bars (``snapshot_download(tqdm_class=...)``, 2.x protocol: one byte bar
  whose total grows, plus a transfer bar) add up into one "downloading" phase, and Stop ends them.
* A notebook's blocking load draws a tqdm bar of the bytes.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_load_progress.py -q``
"""

from __future__ import annotations

import pytest
from helpers import alive_count

from clover_engine.backbones import load_progress
from clover_engine.backbones.load_progress import LoadCancelled, LoadProgress
from clover_engine.backbones.llada_moe import LLaDAMoELM, write_tiny_llada_moe
from clover_engine.backbones.safetensors_shards import read_header, shard_files
from clover_engine.checkpoint import bundled_models_dir, load_model


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return write_tiny_llada_moe(tmp_path_factory.mktemp("tiny-llada-moe") / "ckpt", seed=1)


def _tensor_bytes(directory) -> int:
    return sum(read_header(p).nbytes for p in shard_files(directory))


def test_a_lean_load_reports_every_weight_byte(moe_dir):
    seen = []
    progress = LoadProgress(on_update=lambda p: seen.append((p.phase, p.done_bytes, p.total_bytes)))
    with load_progress.watching(progress):
        load_model(moe_dir)
    total = _tensor_bytes(moe_dir)
    assert progress.phase == "reading weights"
    assert progress.done_bytes == progress.total_bytes == total > 0
    assert progress.fraction == 1.0
    done = [d for ph, d, _ in seen if ph == "reading weights"]
    assert done == sorted(done) and len(done) > 10  # one report per tensor, growing
    assert "100% of" in progress.describe()
    assert load_progress.current() is None  # the watcher is gone after the block


def test_the_clover_reader_reports_its_bytes():
    progress = LoadProgress()
    with load_progress.watching(progress):
        load_model(bundled_models_dir() / "clover-tiny")
    assert progress.phase == "reading weights"
    assert 0 < progress.done_bytes <= progress.total_bytes
    assert progress.done_bytes > 0.99 * progress.total_bytes  # the file's size: tensors plus its header


def test_stop_ends_a_load_at_its_next_tensor_and_keeps_nothing(moe_dir):
    before = alive_count(LLaDAMoELM)
    reports = []

    def stop_after_five() -> bool:
        return len(reports) >= 5

    progress = LoadProgress(should_stop=stop_after_five, on_update=lambda p: reports.append(p.done_bytes))
    with pytest.raises(LoadCancelled, match="cancelled .*reading weights"):
        with load_progress.watching(progress):
            load_model(moe_dir)
    assert len(reports) == 5  # stopped at the report that saw Stop, not at the end
    assert progress.done_bytes < _tensor_bytes(moe_dir)
    assert alive_count(LLaDAMoELM) == before  # the half-built network went with the unwound frames
    model = load_model(moe_dir)  # nothing poisoned: the same checkpoint loads whole
    assert type(model.lm) is LLaDAMoELM


def test_no_watcher_no_reports(moe_dir):
    assert load_progress.current() is None
    load_progress.begin("reading weights", 10)  # no-ops without a watcher
    load_progress.advance(5)
    load_progress.checkpoint()


def test_huggingface_hub_download_bars_add_up_and_stop_ends_them():
    progress = LoadProgress()
    bar_cls = load_progress.download_bar(progress)
    # huggingface_hub 2.x: a transfer bar (not counted) and one byte bar whose total grows per file
    transfer = bar_cls(desc="Downloading bytes", total=0, unit="B", unit_scale=True, disable=True)
    summed = bar_cls(desc="Reconstructing (incomplete total...)", total=0, unit="B", unit_scale=True, disable=True)
    files = bar_cls(desc="Fetching 2 files", total=2, disable=True)  # a count of files: a cancellation point only
    summed.total = 3_000_000
    summed.update(1_000_000)
    transfer.update(1_000_000)
    assert (progress.phase, progress.done_bytes, progress.total_bytes) == ("downloading", 1_000_000, 3_000_000)
    summed.total += 1_000_000  # a second file starts
    summed.update(500_000)
    files.update(1)
    assert progress.done_bytes == 1_500_000 and progress.total_bytes == 4_000_000
    assert progress.describe() == f"downloading: {1.5 / 4:.0%} of 4 MB"
    progress.should_stop = lambda: True
    with pytest.raises(LoadCancelled, match="downloading"):
        summed.update(1)
    for b in (transfer, summed, files):
        b.close()


def test_a_blocking_load_draws_a_bar_of_its_bytes(moe_dir, capsys):
    with load_progress.shown_as_bar(delay_s=0) as progress:
        load_model(moe_dir)
    err = capsys.readouterr().err
    assert "loading: reading weights" in err
    assert progress.done_bytes == _tensor_bytes(moe_dir)
