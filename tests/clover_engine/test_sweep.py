"""clover_engine.sweep: serial, process pool and Ray give the same results table; resuming skips finished
cells; a worker killed mid-sweep loses nothing. Tiny grids on the random clover-test (8 cells)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from clover_engine import sweep
from clover_engine.experiments.sweep import runner

MODEL = "random:clover-test:15"  # peaked logits: decodes both accept and force slots


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts.write_text("# short prompts\nThe cat sat on\nHello, world\n\nOne two three four\n")
    tasks = [f"prompts:{prompts}", "agent-eval:1"]
    settings = sweep.settings_grid({"block_size": [4, 8], "threshold": [0.5], "max_new_tokens": [8]})
    return [MODEL], tasks, settings


_bytes = sweep.canonical_bytes


@pytest.fixture(scope="module")
def serial(grid, tmp_path_factory):
    return sweep.run_sweep(*grid, tmp_path_factory.mktemp("serial"), workers=1, threads=1, progress=False)


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_serial_table(serial):
    t = serial.results
    assert serial.ran == t.num_rows == 8 and serial.skipped == 0
    assert t.schema == sweep.RESULT_SCHEMA
    assert len(set(t.column("cell_id").to_pylist())) == 8
    rows = t.to_pylist()
    assert [(r["block_size"], r["task_set"].split(":")[0], r["task_id"]) for r in rows] == [
        (bs, ts, i) for bs in (4, 8) for ts, n in (("prompts", 3), ("agent-eval", 1)) for i in range(n)]
    for r in rows:
        assert 1 <= r["tokens"] <= 8 and r["nfe"] >= 1 and r["tokens_per_forward"] == pytest.approx(r["tokens"] / r["nfe"])
        assert (r["exact_match"] is None) == r["task_set"].startswith("prompts")  # only agent tasks are scored
        trace = serial.out_dir / r["trace_path"]
        assert trace.is_file()
        from clover_engine.recording.trace import Trace

        tr = Trace.load(trace)
        assert tr.nfe == r["nfe"] and tr.model_id == MODEL
    s = serial.summary
    assert s.num_rows == 4 and sum(s.column("cells").to_pylist()) == 8
    on_disk = pq.read_table(serial.out_dir / sweep.RESULTS_NAME)
    assert _bytes(on_disk) == _bytes(t)


def test_process_pool_matches_serial_and_survives_a_killed_worker(grid, serial, tmp_path):
    marker = tmp_path / "killed"
    pool = sweep.run_sweep(*grid, tmp_path / "pool", workers=2, threads=1, progress=False,
                           kill_once=(str(marker), 5))
    assert marker.exists()  # a worker process did die (the pool broke and was rebuilt)
    assert _bytes(pool.results) == _bytes(serial.results)
    assert len(set(pool.results.column("worker").to_pylist())) >= 2  # more than one process decoded


def test_ray_matches_serial_and_survives_a_killed_worker(grid, serial, tmp_path, ray_session):
    marker = tmp_path / "killed"
    res = sweep.run_sweep(*grid, tmp_path / "out", workers=2, threads=1, ray_address="auto", progress=False,
                          kill_once=(str(marker), 2))
    assert marker.exists()  # a worker did die
    ids = res.results.column("cell_id").to_pylist()
    assert sorted(ids) == sorted(serial.results.column("cell_id").to_pylist()) and len(set(ids)) == len(ids)
    assert _bytes(res.results) == _bytes(serial.results)
    assert len(set(res.results.column("worker").to_pylist())) == 3  # two actors, one restarted with a new pid
    assert _bytes(res.summary.drop_columns(["wall_s", "tokens_per_s"])) == \
        _bytes(serial.summary.drop_columns(["wall_s", "tokens_per_s"]))


def test_resume_skips_finished_cells(grid, serial, tmp_path):
    models, tasks, settings = grid
    first = sweep.run_sweep(models, tasks, settings[:1], tmp_path, threads=1, progress=False)
    assert (first.ran, first.skipped) == (4, 0)
    walls = dict(zip(first.results.column("cell_id").to_pylist(), first.results.column("wall_s").to_pylist()))
    again = sweep.run_sweep(models, tasks, settings, tmp_path, threads=1, progress=False)
    assert (again.ran, again.skipped) == (4, 4)
    kept = {r["cell_id"]: r["wall_s"] for r in again.results.to_pylist() if r["cell_id"] in walls}
    assert kept == walls  # the finished cells were not decoded again
    assert _bytes(again.results) == _bytes(serial.results)  # and the table is in grid order
    done = sweep.run_sweep(models, tasks, settings, tmp_path, threads=1, progress=False)
    assert (done.ran, done.skipped) == (0, 8)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="unknown task set 'agent:3'"):
        sweep.load_task_set("agent:3")
    with pytest.raises(ValueError, match="count >= 1"):
        sweep.load_task_set("agent-eval:zero")
    with pytest.raises(ValueError, match="unknown sweep axes \\['temperature'\\]"):
        sweep.settings_grid({"temperature": [0.5]})
    with pytest.raises(ValueError, match="threshold"):
        sweep.settings_grid({"threshold": [1.5]})
    with pytest.raises(ValueError, match="weight scale"):
        sweep.load_sweep_model("random:clover-test:-1")
    with pytest.raises(ValueError, match="no checkpoint directory"):
        sweep.load_sweep_model("models/nothing-here")
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        sweep.run_sweep([MODEL], ["agent-eval:1"], [{}], "unused", workers=0)


def test_cli(tmp_path, capsys):
    assert "--threads N" in sweep.build_parser().format_help() and "OMP_NUM_THREADS" in sweep.build_parser().format_help()
    argv = ["--models", MODEL, "--tasks", "chat-eval:1", "--block-size", "4", "--max-new-tokens", "4",
            "--out", str(tmp_path), "--threads", "1", "--no-traces", "--no-progress"]
    assert sweep.main(argv) == 0
    assert "1 cells decoded, 0 already done" in capsys.readouterr().out
    t = pq.read_table(tmp_path / sweep.RESULTS_NAME)
    assert t.column("trace_path").to_pylist() == [None] and not (tmp_path / sweep.TRACES_DIR).exists()
    argv[argv.index("--block-size") + 1] = "0"
    assert sweep.main(argv) == 2
    assert "block_size must be an int >= 1" in capsys.readouterr().err


def test_failing_cell_is_named_and_finished_cells_kept(grid, tmp_path):
    models, tasks, _ = grid
    settings = [{"block_size": 4, "max_new_tokens": 4}, {"block_size": 10_000, "max_new_tokens": 4}]  # > context
    with pytest.raises(RuntimeError, match=r"cell [0-9a-f]{16} \(model random:clover-test:15, block_size=10000"):
        sweep.run_sweep(models, tasks, settings, tmp_path, threads=1, progress=False)
    kept = sweep.read_results(tmp_path)
    assert kept.num_rows == 4 and set(kept.column("block_size").to_pylist()) == {4}


def test_failing_cell_on_ray_is_named(grid, tmp_path, ray_session):
    models, tasks, _ = grid
    settings = [{"block_size": 10_000, "max_new_tokens": 4}]
    with pytest.raises(RuntimeError, match=r"cell [0-9a-f]{16} \(model random:clover-test:15, block_size=10000.*context"):
        sweep.run_sweep(models, tasks, settings, tmp_path, workers=2, threads=1, ray_address="auto", progress=False)


def test_grid_rows_picks_one_grid_in_grid_order(grid, serial):
    models, tasks, settings = grid
    t = serial.results
    shuffled = t.take(list(range(t.num_rows))[::-1])  # another order, and rows of both settings
    rows = sweep.grid_rows(shuffled, models, tasks, settings[1:])
    assert rows.schema == sweep.RESULT_SCHEMA
    assert rows.column("cell_id").to_pylist() == t.column("cell_id").to_pylist()[4:]
    assert set(rows.column("block_size").to_pylist()) == {8}
    with pytest.raises(ValueError, match="4 of the grid's 4 cells are not in the results table"):
        sweep.grid_rows(t, models, tasks, sweep.settings_grid({"block_size": [4], "threshold": [0.9],
                                                               "max_new_tokens": [8]}))


def test_interleave_runs_task_by_task_and_writes_the_same_table(grid, serial, tmp_path, monkeypatch):
    order = []
    real = sweep.run_cell

    def spy(cell, *args, **kwargs):
        order.append((cell.task.task_id, cell.index))
        return real(cell, *args, **kwargs)

    monkeypatch.setattr(runner, "run_cell", spy)  # where the workers look it up
    res = sweep.run_sweep(*grid, tmp_path, threads=1, progress=False, interleave=True)
    assert order == sorted(order) and [i for _, i in order[:4]] == [0, 3, 4, 7]  # task 0 of both sets, both settings
    assert _bytes(res.results) == _bytes(serial.results)  # same rows, in grid order
    assert "--interleave" in sweep.build_parser().format_help()


def test_fingerprint_follows_content(tmp_path):
    d = tmp_path / "pkg"
    (d / "__pycache__").mkdir(parents=True)
    (d / "a.py").write_text("x = 1\n")
    (d / "w.bin").write_bytes(b"\0\1")
    f0 = sweep.fingerprint([d])
    assert len(f0) == 12 and int(f0, 16) >= 0 and len(sweep.fingerprint([d], length=64)) == 64
    (d / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    assert sweep.fingerprint([d]) == f0  # bytecode caches do not count
    (d / "a.py").write_text("x = 2\n")
    assert sweep.fingerprint([d]) != f0
    (d / "a.py").write_text("x = 1\n")
    assert sweep.fingerprint([d]) == f0
    assert sweep.fingerprint([d / "a.py"]) != f0 and sweep.fingerprint([d, d / "a.py"]) != f0
    with pytest.raises(FileNotFoundError, match="no file or directory"):
        sweep.fingerprint([tmp_path / "missing"])
    with pytest.raises(ValueError, match="length"):
        sweep.fingerprint([d], length=0)
