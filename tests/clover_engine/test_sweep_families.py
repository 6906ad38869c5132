"""`clover-explorer sweep` over the public families' own samplers, each cell measured against its careful decode.

Tiny random checkpoints of every public family (LLaDA-MoE, Fast-dLLM v2, SDAR, LLaDA2.0) are swept with their
own samplers (``--sampler llada,dream,fast_dllm_v2,sdar,llada2,llada21``) beside threshold decoding
(``--sampler block``). Each row's agreement columns must equal an independent comparison: the same model's
careful decode (`clover_engine.decoding.careful.careful_setting`) decoded here directly, compared with the
row's answer by `clover_engine.decoding.careful.agreement`. A setting that is its own careful decode says so
(``careful`` true, 100 %), and the frontier table marks a Pareto front that contains the fastest setting and
the careful decode.

Run: ``.venv/bin/python -m pytest -q tests/clover_engine/test_sweep_families.py``
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from clover_engine import sweep  # noqa: E402
from clover_engine.checkpoint import load_model, load_tokenizer  # noqa: E402
from clover_engine.decoding.careful import agreement, careful_setting  # noqa: E402
from clover_engine.decoding.samplers import decoder_for  # noqa: E402

PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Write one sentence about rivers."]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from clover_engine.backbones.block_causal import write_tiny_block_causal
    from clover_engine.backbones.llada2_moe import write_tiny_llada2_moe
    from clover_engine.backbones.llada_moe import write_tiny_llada_moe

    root = tmp_path_factory.mktemp("sweep-families")
    (root / "prompts.txt").write_text("# two prompts\n" + "\n".join(PROMPTS) + "\n")
    return {"llada": str(write_tiny_llada_moe(root / "llada-moe")),
            "fast_dllm_v2": str(write_tiny_block_causal(root / "fd", "Fast_dLLM_Qwen")),
            "sdar": str(write_tiny_block_causal(root / "sdar", "SDAR")),
            "llada2": str(write_tiny_llada2_moe(root / "llada2")),
            "prompts": f"prompts:{root / 'prompts.txt'}"}


FAMILIES = [("llada", ["llada", "dream", "block"]), ("fast_dllm_v2", ["fast_dllm_v2", "block"]),
            ("sdar", ["sdar", "block"]), ("llada2", ["llada2", "llada21", "block"])]


@pytest.mark.parametrize("family,samplers", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_every_cell_is_measured_against_the_same_models_careful_decode(tiny, tmp_path, family, samplers):
    axes = {"sampler": samplers, "threshold": [0.5, 1.0], "block_size": [8], "max_new_tokens": [16]}
    res = sweep.run_sweep([tiny[family]], [tiny["prompts"]], sweep.settings_grid(axes), tmp_path / "out",
                          traces=False, progress=False, threads=1)
    rows = res.results.to_pylist()
    assert len(rows) == len(samplers) * 2 * len(PROMPTS)
    assert {r["sampler"] for r in rows} == set(samplers)
    model, tok = load_model(tiny[family]), load_tokenizer(tiny[family])
    checked_careful = 0
    for r in rows:
        setting = sweep.setting_from_dict(json.loads(r["decode_config"]))
        answer = decoder_for(model, tok, setting).generate(PROMPTS[r["task_id"]], record_trace=False)
        assert r["tokens"] == len(answer.tokens) and r["nfe"] == answer.nfe  # the row is this setting's decode
        care = careful_setting(setting)
        reference = decoder_for(model, tok, care).generate(PROMPTS[r["task_id"]], record_trace=False).tokens
        want = agreement(answer.tokens, reference, own=care == setting)
        assert r["careful"] == want.own
        assert r["agreement"] == pytest.approx(want.token_agreement)
        assert (r["first_difference"], r["common_prefix"], r["identical"]) == \
            (want.first_difference, want.common_prefix, want.identical)
        if r["careful"]:
            checked_careful += 1
            assert r["agreement"] == 100.0 and r["identical"]
    # LLaDA and Dream write one slot a forward at any threshold: every cell of theirs is its own careful decode
    own = {"llada": 2 * 2 * len(PROMPTS), "fast_dllm_v2": len(PROMPTS), "sdar": 0, "llada2": len(PROMPTS)}[family]
    assert checked_careful >= own
    frontier = res.out_dir.joinpath(sweep.FRONTIER_NAME)
    import pyarrow.parquet as pq

    table = pq.read_table(frontier).to_pylist()
    assert [t["setting"] for t in table] == [s["setting"] for s in res.summary.to_pylist()]
    fastest = max(table, key=lambda t: (t["tokens_per_forward"], t["agreement"]))
    assert fastest["pareto"]
    best = max(t["agreement"] for t in table)
    assert any(t["pareto"] and t["agreement"] == best for t in table)


def test_an_official_sampler_refuses_an_axis_it_does_not_read_and_names_the_fix():
    with pytest.raises(ValueError, match="reads only block_size, threshold, max_new_tokens; drop \\['memory_mode'\\]"):
        sweep.settings_grid({"sampler": ["llada2"], "memory_mode": ["state"]})
    with pytest.raises(ValueError, match="unknown official sampler 'lada'"):
        sweep.settings_grid({"sampler": ["lada"]})
    grid = sweep.settings_grid({"sampler": ["block", "sdar"], "threshold": [0.8]})
    assert [sweep.setting_label(g) for g in grid] == ["sampler=block,threshold=0.8", "sampler=sdar,threshold=0.8"]
    sdar = sweep.setting_of(grid[1])
    assert sweep.setting_from_dict(sweep.setting_to_dict(sdar)) == sdar and sdar.confidence_threshold == 0.8


def test_a_sampler_on_another_familys_checkpoint_fails_its_cell_by_name(tiny, tmp_path):
    with pytest.raises(RuntimeError, match="cell .* failed: TypeError"):
        sweep.run_sweep([tiny["sdar"]], [tiny["prompts"]], sweep.settings_grid({"sampler": ["llada"], "block_size": [8],
                                                                                "max_new_tokens": [16]}),
                        tmp_path / "bad", traces=False, progress=False, threads=1)


def test_a_sweep_about_speed_alone_decodes_no_reference(tiny, tmp_path):
    """``careful=False`` (``--no-careful``): the agreement columns are null and the frontier table is empty."""
    res = sweep.run_sweep([tiny["llada2"]], [tiny["prompts"]],
                          sweep.settings_grid({"sampler": ["llada2"], "threshold": [0.5], "block_size": [8],
                                               "max_new_tokens": [16]}),
                          tmp_path / "speed", traces=False, progress=False, threads=1, careful=False)
    rows = res.results.to_pylist()
    assert rows and all(r["agreement"] is None and r["careful"] is None and r["identical"] is None for r in rows)
    assert res.summary.to_pylist()[0]["agreement"] is None
    import pyarrow.parquet as pq

    assert pq.read_table(res.out_dir / sweep.FRONTIER_NAME).num_rows == 0
    assert "agree%" in sweep.format_summary(res.summary)
