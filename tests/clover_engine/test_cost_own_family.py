"""A run of a model that is not Clover (a MoE or masked diffusion LM, a block-causal backbone) is projected
as itself: every forward priced by its own family's formulas with its measured expert union
(`clover_engine.cost.trace_projection.project_trace`'s ``source``).

The check: projected at the weight bytes the run used, each forward's bytes and FLOPs are exactly what the
decoder's cost meter recorded for it (same tokens, commit, history and union); at bf16 the weights cost half
of fp32's.

Wing: ``cost``.
"""

from __future__ import annotations

import pytest

from clover_engine.backbones.block_causal import write_tiny_block_causal
from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.backbones.llada_moe import write_tiny_llada_moe
from clover_engine.checkpoint import load_model
from clover_engine.cost import project_trace
from clover_engine.decoding import decoder_for
from clover_engine.decoding.config import DecodeConfig
from clover_engine.decoding.masked_diffusion_samplers import LLaDASampler

PROMPT = list(range(40, 60))  # 20 tokens: a prompt forward that carries history


def _trace(kind: str, tmp_path):
    if kind.startswith("llada-moe"):
        model = load_model(write_tiny_llada_moe(tmp_path / kind, seed=4))
        cfg = (LLaDASampler(gen_length=32, block_length=16, steps=8) if kind == "llada-moe"  # the canvas sampler
               else DecodeConfig(block_size=8, threshold=0.9, max_new_tokens=32))  # the block decoder
        return decoder_for(model, None, cfg).generate(PROMPT).trace
    if kind.startswith("llada2"):  # LLaDA2.0's sampler: each forward recomputes the window, or uses the KV cache
        from clover_engine.backbones.llada2_moe import write_tiny_llada2_moe  # local: one case needs it
        from clover_engine.decoding.llada2_samplers import LLaDA2Sampler  # local: one case needs it

        model = load_model(write_tiny_llada2_moe(tmp_path / kind, seed=4))
        cfg = LLaDA2Sampler(gen_length=32, block_length=8, steps=8, kv_cache=kind == "llada2-kv")
        return decoder_for(model, None, cfg).generate(PROMPT).trace
    model = load_model(write_tiny_block_causal(tmp_path / kind, kind, seed=5))
    return decoder_for(model).generate(PROMPT).trace


@pytest.mark.parametrize("kind", ["llada-moe", "llada-moe-blocks", "sdar", "fast_dllm_qwen", "llada2", "llada2-kv"])
def test_the_recorded_model_is_priced_by_its_own_family_with_its_measured_union(kind, tmp_path):
    trace = _trace(kind, tmp_path)
    steps = trace.steps
    assert len(steps) >= 3 and all(st.bytes_read for st in steps)
    whole = project_trace(trace, "h200", weight_bytes=4, fallback_union="independent")  # fp32, as run
    as_run = whole.source
    assert as_run is not None and as_run.config_name == trace.model_id
    # every forward: the steps, and the prefill / commit forwards no step reports (block-causal with a KV cache)
    assert whole.n_forwards == trace.nfe == len(as_run.bytes_per_forward)
    stepped = [i for i, s in enumerate(whole.stepped) if s]
    assert len(stepped) == len(steps)
    assert [as_run.bytes_per_forward[i] for i in stepped] == pytest.approx([st.bytes_read for st in steps], rel=1e-12)
    assert [as_run.flops_per_forward[i] for i in stepped] == pytest.approx([st.flops for st in steps], rel=1e-12)
    # priced as the decoder's own meter priced them as they ran
    assert as_run.bytes_read == pytest.approx(trace.decode_end.bytes_read, rel=1e-9)
    assert as_run.flops == pytest.approx(trace.decode_end.flops, rel=1e-9)
    bf16 = project_trace(trace, "h200", weight_bytes=2, fallback_union="independent")
    assert bf16.source.bytes_read < as_run.bytes_read and bf16.source.flops == pytest.approx(as_run.flops)
    assert bf16.source.tokens_per_s == pytest.approx(bf16.tokens_written / sum(bf16.source.time_s_per_forward))
    if kind.startswith("llada"):  # the union its router chose, per forward (mean over layers), not an assumption
        unions = [float(st.expert_union.mean()) for st in steps]
        assert [bf16.source.expert_union_per_forward[i] for i in stepped] == pytest.approx(unions)
        assert max(unions) < trace.meta["model_config"]["num_experts"] or len(set(unions)) > 1


def test_the_canvas_samplers_are_the_masked_diffusion_decoders_own():
    from clover_engine.cost.trace_projection import CANVAS_SAMPLERS
    from clover_engine.decoding.masked_diffusion_samplers import SAMPLER_CONFIGS

    assert set(CANVAS_SAMPLERS) == {c.sampler for c in SAMPLER_CONFIGS}


def test_a_moe_diffusion_runs_measured_union_carries_over_to_the_35b_target(tmp_path):
    """The 35B-A3B projection of a LLaDA-MoE run uses the union its router chose (relative to independent
    routing of its own E and k), not a fallback; a dense model's run falls back to independent routing."""
    from clover_engine.cost.formulas import expected_union
    from clover_engine.cost.projection import target_union

    trace = _trace("llada-moe-blocks", tmp_path)
    cfg = trace.meta["model_config"]
    tgt = CloverConfig.from_name("clover-35b-a3b")
    proj = project_trace(trace, "h200", union_assumption="measured_vs_independent", fallback_union="independent")
    assert proj.union_assumption == "measured_vs_independent"
    target = proj.target
    st = trace.steps[1]
    ratio = float(st.expert_union.mean()) / expected_union(cfg["num_experts"], cfg["num_experts_per_tok"],
                                                            st.n_tokens_forward)
    want = min(max(ratio * expected_union(tgt.num_experts, tgt.num_experts_per_tok, st.n_tokens_forward),
                   tgt.num_experts_per_tok), min(tgt.num_experts, st.n_tokens_forward * tgt.num_experts_per_tok))
    got = target_union("measured_vs_independent", st.n_tokens_forward, st.expert_union.astype(float),
                       type("R", (), {"num_experts": cfg["num_experts"],
                                      "num_experts_per_tok": cfg["num_experts_per_tok"]})(), tgt)
    assert got == pytest.approx(want)
    assert target.expert_union_per_forward[1] == pytest.approx(want)
    dense = project_trace(_trace("sdar", tmp_path), "h200", union_assumption="measured_vs_independent",
                          fallback_union="independent")
    assert dense.union_assumption == "independent"
