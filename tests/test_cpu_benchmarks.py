"""The CPU benchmarks run in CI on small settings: each prints its table, and the checks that do
not depend on timing hold (same tokens with and without hooks, chunked state equal to the token loop,
bf16 agreeing with fp32, a sweep's results equal across worker counts). Their timings are not asserted:
on a shared 2-core machine absolute times and even ratios are noise; `benchmarks/RESULTS.md` records
full runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: int = 600) -> str:
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p.stdout


def test_vs_transformers_prints_the_four_decodes_and_the_hooks_change_nothing():
    out = _run("benchmarks/vs_transformers.py", "--new-tokens", "8", "--prompt-tokens", "16", "--rounds", "1",
               "--threads", "1")
    rows = {ln.split("|")[1].strip(): ln.split("|")[2:] for ln in out.splitlines() if ln.startswith("| ")}
    for name in ("transformers generate", "engine block_size 1", "engine block 32, no hooks",
                 "engine block 32, hooks + trace"):
        assert int(rows[name][0]) == 8, out  # 8 new tokens each (EOS ignored by both)
        assert float(rows[name][1]) > 0 and rows[name][2].strip().endswith("x")
    assert re.search(r"engine block_size 1 / transformers: [\d.]+x wall, [\d.]+x CPU time", out)
    assert re.search(r"hooks \+ trace overhead at block 32: -?[\d.]+ % wall", out)
    assert "wrote the same tokens: True" in out


def test_gated_delta_rule_chunked_state_equals_the_token_loop():
    out = _run("benchmarks/gated_delta_rule.py", "--repeats", "1", "--threads", "1")
    rows = [ln.split() for ln in out.splitlines() if re.match(r"\s+(16|32|64)\s", ln)]
    assert [r[0] for r in rows] == ["16", "32", "64"], out
    assert all(float(r[1]) < 1e-4 for r in rows), out  # max |S_chunk - S_loop| on repeated keys
    assert all(r[2].endswith("x") and r[3].endswith("x") for r in rows)


def test_cost_table_grows_with_tokens_per_forward():
    out = _run("benchmarks/cost_table.py")
    rows = [ln.split() for ln in out.splitlines() if re.match(r"\s+\d+\s+[\d.]+x", ln)]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4, 6, 8], out
    best = [float(r[1].rstrip("x")) for r in rows]  # union of one token's top-k: the best case
    assert best == sorted(best) and 0.9 < best[0] <= 1.0 and best[-1] > 7, out


def test_dtype_agreement_bf16_writes_the_fp32_tokens_teacher_forced():
    out = _run("benchmarks/dtype_agreement.py", "--tasks", "2", "--code", "1", "--max-new-tokens", "24")
    m = re.search(r"teacher-forced: (\d+) of (\d+) written slots .*\(agreement ([\d.]+)", out)
    assert m and int(m.group(2)) > 0, out
    assert float(m.group(3)) >= 0.95, out


def test_sweep_scaling_gives_the_same_results_with_one_and_two_workers():
    out = _run("benchmarks/sweep_scaling.py", "--tasks", "1")
    assert "results identical: True" in out, out


def test_llada2_recompute_vs_cache_prints_both_modes_and_their_ratios():
    out = _run("benchmarks/llada2_recompute_vs_cache.py", "--hidden", "128", "--layers", "2", "--prompt", "16",
               "--gen-length", "32", "--block", "8", "--repeats", "1", "--threads", "1")
    rows = {ln[:22].strip(): ln[22:].split() for ln in out.splitlines() if ln.startswith(("recompute (", "kv cache "))}
    assert set(rows) == {"recompute (original)", "kv cache"}, out
    assert int(rows["kv cache"][0]) > int(rows["recompute (original)"][0])  # prefill and commits on top
    assert re.search(r"recompute / cache: [\d.]+x wall, [\d.]+x FLOPs, [\d.]+x bytes read", out), out
    assert re.search(r"answers agree on \d+ of \d+ tokens", out), out


def test_browser_tests_under_load_keeps_cores_busy_and_reports_each_run(tmp_path):
    # small: one spinning process and a quick module, twice (RESULTS.md records the real three runs of tests/apps)
    out = _run("benchmarks/browser_tests_under_load.py", "--runs", "2", "--busy", "1", "--logs", str(tmp_path),
               "tests/test_stored_references.py")
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and not ln.startswith("| run")]
    assert len(rows) == 2 and all(r.split("|")[2].strip() == "0" and "passed" in r for r in rows), out
    assert "2 of 2 runs passed" in out and (tmp_path / "run2.log").is_file()
    bad = subprocess.run([sys.executable, "benchmarks/browser_tests_under_load.py", "--runs", "1", "--busy", "0",
                          "--logs", str(tmp_path), "tests/no_such_test.py"], capture_output=True, text=True, cwd=ROOT,
                         timeout=600, check=False)
    assert bad.returncode == 1 and "0 of 1 runs passed; failed: [1]" in bad.stdout, bad.stdout + bad.stderr


def test_vs_official_runs_our_side_of_every_family_small():
    # CI has no official code (its own virtualenv, fetched from GitHub): the harness runs our side of all five
    # families at tiny dimensions, events on and off, and both give the same tokens
    out = _run("benchmarks/vs_official.py", "--small", "--tokens", "32", "--rounds", "1", "--layers", "2",
               "--threads", "1", timeout=900)
    rows = [ln.split("|") for ln in out.splitlines() if ln.startswith("| ") and "ours, events" in ln]
    families = {r[1].split("(")[0].strip() for r in rows}
    assert families == {"fast_dllm_v2", "sdar", "llada", "dream", "llada_moe"}, out
    assert all(int(r[7]) > 0 and r[-2].strip() == "yes" for r in rows), out
    assert "official side not run (no --official-python)" in out
    assert out.rstrip().endswith("tokens identical across every side and round: yes"), out[-500:]


def test_careful_agreement_measures_each_setting_against_its_careful_decode_small():
    out = _run("benchmarks/careful_agreement.py", "--small", "--threads", "1")
    rows = [ln.split("|") for ln in out.splitlines() if ln.startswith("| clover-tiny")]
    assert len(rows) == 1, out
    tpf, agree, identical = float(rows[0][3]), float(rows[0][4].split("%")[0]), rows[0][5].strip()
    assert tpf > 0 and 0.0 <= agree <= 100.0 and re.fullmatch(r"\d / 2", identical), out


def test_moe_ep_gpu_runs_its_cpu_mode_on_two_ranks_and_splits_the_experts():
    torchrun = Path(sys.executable).with_name("torchrun")
    p = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "benchmarks/moe_ep_gpu.py", "--small",
                        "--repeats", "1", "--threads", "1"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows = [ln.split("|")[1:-1] for ln in p.stdout.splitlines() if re.match(r"\| \d ", ln)]
    assert [int(r[0]) for r in rows] == [0, 1], p.stdout
    assert all(int(r[2]) == 4 for r in rows)  # 8 experts per layer, 4 on each rank
    assert all(float(r[4].split()[0]) > 0 and r[6].strip().endswith("ms") for r in rows)
    assert re.search(r"busiest rank / mean bytes: [\d.]+", p.stdout)
