"""Dream / LLaDA-style masked diffusion (clover_engine.backbones.masked_diffusion) on tiny random checkpoints.

A tiny random Qwen2 saved by transformers and written as a Dream checkpoint, and a tiny
random Llama written with LLaDA's weight names, load by path through ``load_model``; their
logits equal a from-scratch bidirectional forward of the source model (with Dream's shift,
without LLaDA's); every acceptance policy decodes them with events, a trace and a cost, and
the block view draws the trace.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from clover_engine.checkpoint import load_model, model_format  # noqa: E402
from clover_engine.cost import forward_cost  # noqa: E402
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig  # noqa: E402
from clover_engine.backbones.masked_diffusion import (  # noqa: E402
    MaskedDiffusionModel, load_masked_diffusion, save_masked_diffusion,
)
from clover_engine.decoding.policies import SLOT_POLICIES as POLICIES  # noqa: E402

V, MASK = 128, 126
PROMPT = [5, 9, 33, 17, 60, 4, 8, 21, 70, 11]


def _tiny(kind: str):
    torch.manual_seed(3 if kind == "qwen2" else 4)
    common = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=1,
                  initializer_range=0.2, tie_word_embeddings=False)
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()


@pytest.fixture(scope="module", params=["dream", "llada"])
def family(request, tmp_path_factory):
    torch.set_num_threads(1)
    src = _tiny("qwen2" if request.param == "dream" else "llama")
    d = tmp_path_factory.mktemp(request.param)
    save_masked_diffusion(src, d, request.param, MASK)
    return request.param, src, d


def _bidirectional_logits(src, ids: list[int]) -> torch.Tensor:
    T = len(ids)
    out = src(input_ids=torch.tensor([ids]), attention_mask=torch.zeros(1, 1, T, T),
              position_ids=torch.arange(T)[None])
    return out.logits[0].float()


def test_checkpoint_is_in_the_family_format(family):
    name, _, d = family
    cfg = json.loads((d / "config.json").read_text())
    assert model_format(d) == name
    if name == "dream":
        assert cfg["model_type"] == "Dream" and cfg["mask_token_id"] == MASK
    else:  # LLaDA's own field and weight names
        from safetensors import safe_open

        assert cfg["model_type"] == "llada" and cfg["d_model"] == 64 and cfg["n_layers"] == 2
        with safe_open(str(d / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
        assert "model.transformer.blocks.1.attn_out.weight" in keys and "model.transformer.ff_out.weight" in keys
        assert not any(k.startswith("model.layers") for k in keys)


def test_logits_are_a_bidirectional_recompute_with_the_family_shift(family):
    name, src, d = family
    model = load_model(d)
    assert isinstance(model, MaskedDiffusionModel)
    assert model.config.logit_shift is (name == "dream") and model.config.kv_cache is False
    state = model.setup_state(1, "state")
    history = PROMPT[:8]
    block = [40, MASK, 41, MASK]
    out = model(torch.tensor([block]), state, commit_ids=torch.tensor([history]), block_size=4)
    assert out.expert_union is None and out.memory_share is None and out.state_norm is None
    assert state.committed == history
    ref = _bidirectional_logits(src, history + block)
    rows = slice(7, 11) if name == "dream" else slice(8, 12)  # Dream: output i-1 predicts token i
    torch.testing.assert_close(out.logits[0], ref[rows], rtol=1e-5, atol=1e-5)
    # Not causal: a later slot's token changes an earlier slot's prediction.
    state2 = model.setup_state(1, "state")
    out2 = model(torch.tensor([[40, MASK, 42, MASK]]), state2, commit_ids=torch.tensor([history]), block_size=4)
    assert not torch.allclose(out.logits[0, 1], out2.logits[0, 1])


def test_canvas_tail_joins_attention(family):
    _, src, d = family
    model = load_masked_diffusion(d, canvas_tail=6)
    state = model.setup_state(1, "state")
    block = [40, MASK, MASK, MASK]
    out = model(torch.tensor([block]), state, commit_ids=torch.tensor([PROMPT[:8]]), block_size=4)
    ref = _bidirectional_logits(src, PROMPT[:8] + block + [MASK] * 6)
    rows = slice(7, 11) if model.config.logit_shift else slice(8, 12)
    torch.testing.assert_close(out.logits[0], ref[rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_decodes_with_events_trace_and_cost(family, policy):
    _, _, d = family
    model = load_model(d)
    events = []
    cfg = DecodeConfig(block_size=8, threshold=0.5, max_new_tokens=16, policy=policy, tokens_per_step=3,
                       max_entropy=2.0, factor=2.0)
    r = BlockDecoder(model, None, cfg).generate(PROMPT, hooks=[events.append])
    steps = [e for e in events if type(e).__name__ == "StepEvent"]
    assert r.nfe == len(steps) >= 2 and 1 <= len(r.tokens) <= 16 and MASK not in r.tokens
    assert all(e.expert_union is None for e in steps)
    assert len(r.trace.steps) == r.nfe
    # Priced as a full recompute: weights only (no cache), FLOPs growing with the history.
    assert all(e.bytes_read > 0 for e in steps)
    f = np.array([e.flops for e in steps])
    assert f[-1] > f[0]


def test_recompute_cost_prices_the_whole_sequence(family):
    _, _, d = family
    cfg = load_model(d).config.to_dict()
    one = forward_cost(cfg, 8, None, weight_bytes=4, n_commit_tokens=0, block_len=8, context_len=0)
    long = forward_cost(cfg, 8, None, weight_bytes=4, n_commit_tokens=0, block_len=8, context_len=100)
    assert long.bytes_by_component["kv_cache_read"] == 0 == long.bytes_by_component["kv_cache_write"]
    assert long.flops > 10 * one.flops  # 108 tokens through every layer against 8
    kv = dict(cfg, kv_cache=True)
    cached = forward_cost(kv, 8, None, weight_bytes=4, n_commit_tokens=0, block_len=8, context_len=100)
    assert cached.bytes_by_component["kv_cache_read"] > 0 and cached.flops < long.flops


def test_block_view_draws_a_masked_diffusion_trace(family):
    from clover_viz import figures as F

    _, _, d = family
    model = load_model(d)
    trace = BlockDecoder(model, None, DecodeConfig(block_size=8, threshold=0.5, max_new_tokens=8)).generate(PROMPT).trace
    fig = F.block_figure(trace)
    assert len(fig.data) >= 1
    for make in (F.expert_union_figure, F.state_norm_figure, F.memory_share_figure):
        assert any(F.NOT_APPLICABLE in (a.text or "") for a in make(trace).layout.annotations)


def test_bad_checkpoints_say_what_is_wrong(tmp_path):
    src = _tiny("llama")
    d = save_masked_diffusion(src, tmp_path / "llada", "llada", MASK)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(cfg, layer_norm_type="default")))
    with pytest.raises(ValueError, match="layer_norm_type"):
        load_model(d)
    (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "mask_token_id"}))
    with pytest.raises(ValueError, match="mask_token_id"):
        load_model(d)
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    with pytest.raises(ValueError, match="pickle"):
        load_model(d)
    model = load_model(save_masked_diffusion(src, tmp_path / "ok", "llada", MASK))
    with pytest.raises(ValueError, match="memory_mode"):
        model.setup_state(1, "state+window")


def _byte_level_dream(path):
    """A tiny random Dream checkpoint over the byte-level tokenizer (MASK = ``<|mask|>``, EOS = ``<|endoftext|>``)."""
    from clover_engine.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    torch.manual_seed(5)
    lm = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tok.token_to_id("<|endoftext|>"), tie_word_embeddings=True)).eval()
    save_masked_diffusion(lm, path, "dream", tok.token_to_id("<|mask|>"))
    tok.save(str(path / "tokenizer.json"))
    return path


def test_the_app_and_the_notebook_widget_open_a_dream_checkpoint_by_path(tmp_path):
    from clover_viz import figures as F
    from clover_viz.state import ExplorerState
    from clover_viz.widgets import Explorer

    d = _byte_level_dream(tmp_path / "tiny-dream")
    s = ExplorerState(model_dir="clover-test", prompt="Hello, diffusion", max_new_tokens=8, block_size=4,
                      threshold=0.5)
    try:
        s.model_dir = str(d)  # typed into the app's model field
        assert s.error == "" and s.memory_mode == "state"  # no window: the app falls back to Clover's mode
        assert s.generate()
        assert s.wait(60) and not s.running
        s.tick(0.02)
        trace = s.trace
        assert trace is not None and trace.decode_end is not None and len(trace) == trace.decode_end.nfe >= 2
        assert trace.model_id == "tiny-dream"
        assert len(F.block_figure(trace).data) >= 1
    finally:
        s.close()
        s.wait(5)
    ex = Explorer(str(d), decode_config=DecodeConfig(block_size=4, threshold=0.5, max_new_tokens=8))
    try:
        tr = ex.decode("Hi")
        assert len(tr) >= 2 and "NFE" in ex.status.value
    finally:
        ex.close()


def test_generate_cli_takes_each_policys_own_setting(tmp_path, capsys):
    from clover_engine.generate import main

    d = _byte_level_dream(tmp_path / "tiny-dream")
    common = ["--model", str(d), "--prompt", "Hello", "--block-size", "32", "--max-new-tokens", "16", "--threads", "1"]
    assert main(common + ["--policy", "top_k", "--tokens-per-step", "4"]) == 0
    out = capsys.readouterr().out
    assert "policy=top_k tokens_per_step=4" in out and "NFE=4 " in out and "threshold" not in out
    assert main(common + ["--policy", "margin", "--threshold", "0.9"]) == 0
    assert "policy=margin threshold=0.9" in capsys.readouterr().out


def test_a_dream_checkpoint_without_tokenizer_json_uses_its_vocab_and_merges(tmp_path):
    """Dream-v0-*-7B ship ``vocab.json`` + ``merges.txt`` (their tokenizer class is remote code) and no
    ``tokenizer.json``: `load_tokenizer` builds the same byte-level BPE with transformers' ``Qwen2Tokenizer``
    (added tokens from ``tokenizer_config.json``), and the explorer decodes with it."""
    from clover_engine.checkpoint import load_tokenizer
    from clover_engine.decoding import decoder_for

    d = _byte_level_dream(tmp_path / "dream-files")
    ref = load_tokenizer(d)  # from the tokenizer.json the helper wrote
    (d / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="needs tokenizer.json, or vocab.json and merges.txt"):
        load_tokenizer(d)
    (d / "vocab.json").write_text(json.dumps(ref.get_vocab(with_added_tokens=False)))
    (d / "merges.txt").write_text("#version: 0.2\n")
    specials = ["<|endoftext|>", "<|mask|>", "<|im_start|>", "<|im_end|>"]
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "DreamTokenizer", "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "eos_token": "<|endoftext|>", "added_tokens_decoder": {
            str(ref.token_to_id(t)): {"content": t, "special": True} for t in specials}}))
    tok = load_tokenizer(d)
    text = "<|im_start|>user\nHello, wörld<|im_end|>\n"
    assert tok.encode(text).ids == ref.encode(text).ids and tok.decode(tok.encode(text).ids) == "user\nHello, wörld\n"
    model = load_model(d)
    out = decoder_for(model, tok, DecodeConfig(block_size=4, threshold=0.5, max_new_tokens=8)).generate("Hi")
    assert out.trace is not None and len(out.trace) >= 2


def test_generate_cli_runs_the_official_samplers(tmp_path, capsys):
    """``--sampler llada`` / ``dream``: the CLI decodes with the checkpoint's own sampler -- the same tokens
    as `MaskedDiffusionDecoder` with the same settings -- and refuses what the sampler cannot run."""
    from clover_engine.checkpoint import load_tokenizer
    from clover_engine.decoding.masked_diffusion_decoder import MaskedDiffusionDecoder
    from clover_engine.decoding.masked_diffusion_samplers import DreamSampler, LLaDASampler
    from clover_engine.generate import main
    from clover_engine.recording.trace import Trace

    d = _byte_level_dream(tmp_path / "tiny-dream")
    model, tok = load_model(d), load_tokenizer(d)
    common = ["--model", str(d), "--prompt", "Hello", "--max-new-tokens", "16", "--threads", "1"]
    for extra, cfg in ((["--sampler", "llada", "--block-size", "8", "--steps", "8"],
                        LLaDASampler(gen_length=16, block_length=8, steps=8)),
                       (["--sampler", "dream", "--steps", "8", "--alg", "entropy"],
                        DreamSampler(max_new_tokens=16, steps=8, alg="entropy"))):
        out = tmp_path / f"{cfg.sampler}.parquet"
        assert main(common + extra + ["--trace", str(out)]) == 0
        printed = capsys.readouterr().out
        assert f"{cfg.sampler} sampler" in printed and "NFE=8" in printed, printed
        want = MaskedDiffusionDecoder(model, tok, cfg).generate("Hello")
        assert Trace.load(out).generated_tokens.tolist() == list(want.tokens)
    assert main(common + ["--sampler", "llada", "--block-size", "5"]) == 2  # 16 is no multiple of 5
    assert "multiple of block_length 5" in capsys.readouterr().err
    clover = Path(__file__).resolve().parents[2] / "models" / "clover-tiny"
    assert main(["--model", str(clover), "--prompt", "Hi", "--sampler", "dream", "--threads", "1"]) == 2
    assert "runs on a LLaDA or Dream checkpoint" in capsys.readouterr().err


def test_the_explorer_offers_the_official_samplers_as_policies(tmp_path):
    """Policy ``llada`` / ``dream`` in the explorer decodes with the family's own sampler (the same tokens as
    `MaskedDiffusionDecoder`), its run is drawn like any other, the threshold control says it is not read,
    and what the sampler cannot run is refused with the reason, keeping the run on display."""
    from clover_engine.checkpoint import load_tokenizer
    from clover_engine.decoding.masked_diffusion_decoder import MaskedDiffusionDecoder
    from clover_engine.decoding.masked_diffusion_samplers import DreamSampler, LLaDASampler
    from clover_viz import figures as F
    from clover_viz.panel_settings import SettingsPanel
    from clover_viz.state import ExplorerState

    d = _byte_level_dream(tmp_path / "tiny-dream")
    model, tok = load_model(d), load_tokenizer(d)
    s = ExplorerState(model_dir=str(d), prompt="Hello, diffusion", max_new_tokens=16, block_size=8,
                      memory_mode="state", auto_redecode=False)
    panel = SettingsPanel(state=s)
    try:
        for policy, cfg in (("llada", LLaDASampler(gen_length=16, block_length=8, steps=16)),
                            ("dream", DreamSampler(max_new_tokens=16, steps=16, alg="maskgit_plus"))):
            s.policy = policy
            panel._sync()
            assert panel.threshold.disabled and panel.threshold.name == f"Threshold (not read by {policy})"
            assert "writes by its schedule" in panel.controls_note.object and panel.controls_note.visible
            # Dream decodes one canvas: its block size is off too, and the note says why; LLaDA's blocks are read
            assert panel.block_size.disabled == (policy == "dream")
            assert ("one canvas of max new tokens" in panel.controls_note.object) == (policy == "dream")
            assert len(panel.threshold.name) <= 40 and len(panel.block_size.name) <= 40  # fits the sidebar
            assert s.generate(), s.error
            assert s.wait(60) and s.status.startswith("done"), s.status
            s.tick(0.02)
            want = MaskedDiffusionDecoder(model, tok, cfg).generate(s.trace.prompt_ids)
            assert s.trace.decode_config["sampler"] == policy and len(s.trace) == 16
            assert list(s.trace.generated_tokens) == list(want.tokens)
            assert len(F.block_figure(s.trace).data) >= 1
        shown = s.trace
        s.policy, s.max_new_tokens = "llada", 20  # 20 slots do not split into blocks of 8
        assert not s.generate()
        assert "must be a multiple of block_length 8" in s.error and "--max-new-tokens 24" in s.error and s.trace is shown
        assert not s.branch_settings(0) and "not branched" in s.error
        s.policy = "low_confidence"
        panel._sync()
        assert not panel.threshold.disabled
    finally:
        s.close()
        s.wait(5)
    clover = ExplorerState(model_dir="clover-test", policy="llada", auto_redecode=False)
    try:  # a policy the loaded model cannot run is not offered: the state says so and takes threshold decoding
        assert clover.load_model() is not None
        assert clover.policy == "low_confidence" and "llada" not in clover.param.policy.objects
        assert "policy 'llada' does not run on" in clover.status and "'low_confidence' instead" in clover.status
    finally:
        clover.close()


def test_a_block_only_llada_step_breaks_ties_as_the_whole_sequence_does():
    # the decoder runs LLaDA's greedy low_confidence step over one block's logits; when the block's confidences
    # tie (every slot certain: probability exactly 1.0) the top-k must pick what it picks over the whole sequence
    from clover_engine.decoding.masked_diffusion_samplers import LLaDASampler, llada_step

    cfg = LLaDASampler(gen_length=64, block_length=32, steps=64)
    V, P, T, M = 50, 40, 104, 49
    lo, hi = P + 32, P + 64

    def written(block_only: bool, within: bool) -> list[int]:
        x = torch.full((1, T), M)
        x[0, :P], x[0, P:lo] = 3, 5  # the prompt, and the first block written
        logits = torch.randn(1, T, V, generator=torch.Generator().manual_seed(0))
        logits[0, lo:hi, 7] = 200.0
        if block_only:
            llada_step(x[:, lo:hi], logits[:, lo:hi], M, hi - lo, 5, cfg, None, within=(lo, T) if within else None)
        else:
            llada_step(x, logits, M, hi, 5, cfg, None)
        return (x[0, lo:hi] != M).nonzero()[:, 0].tolist()

    whole = written(False, False)
    assert len(whole) == 5 and written(True, True) == whole
    assert written(True, False) != whole  # ranked over the block alone, the ties break elsewhere


def test_a_canvas_run_whose_model_predicts_mask_says_so_in_every_view(tmp_path):
    """Dream's schedule at steps = gen_length writes nothing until its last step (``int(n * (1 - s / t))`` is 0
    before it), which then writes the model's prediction into every slot left. This tiny random Dream echoes its
    input through its tied embeddings and so predicts MASK for most of them: those slots end holding MASK, as in
    the official code. The done line counts them, the block view's last step says they ended holding MASK (not
    "still masked"), and the cards still count the canvas's tokens."""
    from clover_viz import figures as F
    from clover_viz.runs import masked_at_end, run_stats
    from clover_viz.state import ExplorerState

    d = _byte_level_dream(tmp_path / "tiny-dream")
    s = ExplorerState(model_dir=str(d), prompt="Hello, diffusion", max_new_tokens=16, block_size=8,
                      memory_mode="state", auto_redecode=False)
    try:
        assert s.load_model() is not None, s.error
        s.policy = "dream"
        assert s.generate() and s.wait(60), s.error
        s.tick(0.02)
        t = s.trace
        mask_id = s.loaded_model.model.config.mask_token_id
        left = int(np.sum(np.asarray(t.decode_end.tokens) == mask_id))
        assert left > 0 and masked_at_end(t) == left
        assert f"{left} of 16 slots ended holding MASK" in s.status, s.status
        title = F.block_figure(t, step=len(t) - 1).layout.title.text
        assert f"{left} ended holding MASK" in title and "still masked" not in title, title
        assert "still masked" in F.block_figure(t, step=len(t) - 2).layout.title.text  # before the last step
        assert run_stats(t)["n_tokens"] == 16
    finally:
        s.close()
