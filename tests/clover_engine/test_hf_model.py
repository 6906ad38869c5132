"""The transformers backbone (clover_engine.backbones.causal_lm.model) on tiny random Llama / Qwen2 models saved by transformers.

Covers the whole path: KV prefix + bidirectional window with token shift equals a
from-scratch recompute, block_size=1 equals the model's own greedy ``generate``,
events / trace (None for the Clover-only observables) / cost, loading by path,
and the figures saying "not applicable to this model".
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from clover_engine.checkpoint import load_model  # noqa: E402
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig  # noqa: E402
from clover_engine.backbones.causal_lm.model import HFBlockDiffusionModel, block_window_mask  # noqa: E402

V = 128
PROMPT = [5, 9, 33, 17, 60, 4, 8, 21, 70, 11]


def _save_tiny(kind: str, path) -> str:
    torch.manual_seed(0 if kind == "llama" else 1)
    common = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=1,
                  initializer_range=0.2, tie_word_embeddings=False)
    if kind == "llama":
        lm = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        lm = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    lm.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, tmp_path_factory):
    torch.set_num_threads(1)
    d = _save_tiny(request.param, tmp_path_factory.mktemp(request.param))
    model = load_model(d)
    assert isinstance(model, HFBlockDiffusionModel)
    ref = model.greedy_generate(PROMPT, 24)
    # MASK must not be a token the greedy path writes (the decoder never proposes MASK).
    model.config.mask_token_id = next(i for i in range(V - 1, 2, -1) if i not in ref and i not in PROMPT)
    return model, ref


def _reference_logits(model: HFBlockDiffusionModel, history: list[int], block: list[int]) -> torch.Tensor:
    """From scratch, no cache: [history[:-1] causal] ++ [history[-1], block[:-1]] bidirectional; rows of the window."""
    causal, window = history[:-1], history[-1:] + block[:-1]
    ids = torch.tensor([causal + window])
    mask = block_window_mask(0, len(causal), len(window), torch.float32)
    out = model.lm(input_ids=ids, attention_mask=mask, position_ids=torch.arange(ids.shape[1])[None])
    return out.logits[0, len(causal):].float()


def test_block_size_1_equals_generate(tiny):
    model, ref = tiny
    r = BlockDecoder(model, None, DecodeConfig(block_size=1, max_new_tokens=24)).generate(PROMPT)
    assert r.tokens == ref
    assert r.nfe == len(ref) + (r.stop_reason == "eos")  # one token per forward: a one-token window is kept


def test_kv_prefix_and_token_shift_match_recompute(tiny):
    model, _ = tiny
    mask = model.config.mask_token_id
    B = 4
    state = model.setup_state(1, "state")
    history = PROMPT[:8]  # two prompt blocks of 4, committed with the first forward
    blocks = [[40, mask, 41, mask], [mask, mask, mask, mask], [42, 43, 44, 45]]
    commit = torch.tensor([history])
    seen = list(history)
    for blk in blocks:
        for _ in range(2):  # two denoising forwards per block: the second reuses the cache, no commit
            out = model(torch.tensor([blk]), state, commit_ids=commit, block_size=B)
            commit = None
            assert out.expert_union is None and out.state_norm is None and out.memory_share is None
            ref = _reference_logits(model, seen, blk)
            torch.testing.assert_close(out.logits[0], ref, atol=2e-4, rtol=1e-4)
            assert state.n_cached == len(seen) - 1  # every committed token but the last is cached
        commit = torch.tensor([blk])
        seen += blk


def test_events_trace_cost_and_none_fields(tiny, tmp_path):
    from clover_engine.recording.events import StepEvent
    from clover_engine.recording.trace import Trace

    model, _ = tiny
    events = []
    dec = BlockDecoder(model, None, DecodeConfig(block_size=4, threshold=0.3, max_new_tokens=12))
    r = dec.generate(PROMPT[:6], hooks=[events.append])  # prompt head of 2 prefilled in block 1
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert len(steps) == r.nfe and len(r.tokens) == 12
    assert all(s.expert_union is None and s.state_norm is None and s.memory_share is None for s in steps)
    assert all(s.bytes_read > 0 and s.flops > 0 for s in steps)
    assert r.trace.meta["model_config"]["backbone"] == "transformers"
    path = r.trace.save(tmp_path / "t.parquet")
    t = Trace.load(path)
    assert len(t) == r.nfe and t.column("expert_union") == [None] * r.nfe
    assert t.steps[0].memory_share is None
    np.testing.assert_array_equal(t.generated_tokens, np.asarray(r.tokens))


def test_dense_cost_counts_kv_cache():
    from clover_engine.cost import dense_forward_cost, format_breakdown

    cfg = dict(backbone="transformers", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152)
    a = dense_forward_cost(cfg, 32, 2, 0, 32, context_len=0)
    b = dense_forward_cost(cfg, 32, 2, 0, 32, context_len=1000)
    kv = 30 * 2 * 3 * 64 * 2  # bytes per cached token, bf16
    assert b.bytes_read - a.bytes_read == pytest.approx(1000 * kv)
    # SmolLM2-135M: 134.5M parameters read once per forward (tied head read for the logits, embedding rows only)
    assert a.weights_bytes_read / 2 == pytest.approx(30 * (576 * 576 * 2 + 2 * 576 * 192 + 3 * 576 * 1536)
                                                     + 61 * 576 + 49152 * 576 + 32 * 576)
    assert "kv_cache_read" in format_breakdown(b)


def test_figures_say_not_applicable(tiny):
    from clover_viz import figures as F

    model, _ = tiny
    r = BlockDecoder(model, None, DecodeConfig(block_size=4, threshold=0.3, max_new_tokens=8)).generate(PROMPT)
    for fig in (F.expert_union_figure(r.trace), F.state_norm_figure(r.trace), F.memory_share_figure(r.trace)):
        assert any(F.NOT_APPLICABLE in (a.text or "") for a in fig.layout.annotations)
    # the figures every run draws still render (block view, heatmap, tokens per forward, cost)
    for name in ("block_figure", "confidence_heatmap", "text_figure", "tokens_per_forward_figure", "cumulative_tokens_figure",
                 "cost_figure", "roofline_figure"):
        if hasattr(F, name):
            getattr(F, name)(r.trace)


def test_state_window_mode_refused(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match="KV cache"):
        model.setup_state(1, "state+window")


def test_config_has_no_clover_fields_and_old_traces_still_load(tiny, tmp_path):
    """HFBlockConfig carries no Clover fields (what the model can do is its Capabilities); a trace saved when
    it still had ``attention_window`` / ``num_experts`` (and no capabilities record) loads and is priced as
    a KV-cache transformer's."""
    import dataclasses

    from clover_engine.backbones.base import cost_family_of
    from clover_engine.backbones.causal_lm.model import HFBlockConfig
    from clover_engine.backbones.clover.config import recorded_clover_config
    from clover_engine.recording.trace import Trace

    model, _ = tiny
    names = {f.name for f in dataclasses.fields(HFBlockConfig)}
    assert not names & {"attention_window", "num_experts"}
    assert not model.capabilities.runs("state+window") and not model.capabilities.emits("expert_union")
    r = BlockDecoder(model, None, DecodeConfig(block_size=4, threshold=0.3, max_new_tokens=8)).generate(PROMPT[:6])
    old = {**r.trace.meta["model_config"], "attention_window": 0, "num_experts": 0}  # as such traces recorded it
    r.trace.meta["model_config"] = old
    del r.trace.meta["capabilities"]
    back = Trace.load(r.trace.save(tmp_path / "old.parquet"))
    assert back.meta["model_config"]["attention_window"] == 0 and "capabilities" not in back.meta
    assert HFBlockConfig.from_dict(back.meta["model_config"]) == model.config
    assert cost_family_of(back.meta.get("capabilities"), back.meta["model_config"]) == "kv_cache"
    assert recorded_clover_config(back) is None and len(back) == r.nfe
