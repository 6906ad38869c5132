"""The cost model prices a drafter backbone's rounds (clover_engine.cost.drafter): the drafter's own forward and
the fuse of the base's features beside the base's verification forward.

Checked against the drafter module itself, not against the formulas restated: the drafter's bytes are a
hand count from its parameters' shapes, its matmul FLOPs torch's own FLOP counter over a real draft, and
a verify trace's per-round bytes the sum of its drafter and base parts, which the run's totals add up to.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_cost_drafter.py -q``
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from clover_engine.backbones.drafter.model import DraftedLM  # noqa: E402
from clover_engine.backbones.drafter.net import BlockDrafter, DrafterConfig  # noqa: E402
from clover_engine.cost import dense_forward_cost  # noqa: E402
from clover_engine.cost.components import DRAFTER_WEIGHT_COMPONENTS  # noqa: E402
from clover_engine.cost.drafter import (base_read_cost, drafter_forward_cost, drafter_param_counts,  # noqa: E402
                                 drafter_section, fuse_cost, verify_round_cost,
                                 verify_trace_costs)
from clover_engine.cost.meter import CostMeter  # noqa: E402
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig  # noqa: E402
from clover_engine.recording.trace import Trace  # noqa: E402

V, EOS, MASK = 128, 2, 120
PROMPT = [5, 9, 33, 17, 60, 4, 8, 21, 70, 11]
DRAFT_VOCAB = tuple(range(3, 3 + 40))  # a reduced draft vocabulary: Vd = 40 of V = 128


@pytest.fixture(scope="module")
def drafted():
    """A tiny random Llama base (tied head) with a 2-layer drafter over 3 of its hidden states."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   eos_token_id=EOS, bos_token_id=1, initializer_range=0.2, tie_word_embeddings=True)
    lm = transformers.LlamaForCausalLM(cfg).eval()
    net = BlockDrafter(DrafterConfig(hidden_size=64, target_layers=(0, 1, 2), num_layers=2, num_heads=4,
                                     num_kv_heads=2, head_dim=16, intermediate_size=96, block_size=4, vocab_size=V,
                                     mask_token_id=MASK, rope_theta=10000.0, draft_vocab=DRAFT_VOCAB))
    for p in net.parameters():  # non-zero everywhere, so drafts vary
        torch.nn.init.normal_(p, std=0.05)
    return DraftedLM.build(lm, net, "tiny-drafter", MASK, EOS)


def test_param_counts_are_the_modules_own(drafted):
    net = drafted.drafter
    c = drafter_param_counts(net.cfg)
    assert c["total"] == sum(p.numel() for p in net.parameters())
    assert c["fuse"] == net.fuse.weight.numel() and c["slot_heads"] == net.slot_heads.numel()
    layer = net.layers[0]
    assert c["attention"] == sum(p.numel() for p in layer.self_attn.parameters())
    assert c["mlp"] == sum(p.numel() for p in layer.mlp.parameters())
    assert c["draft_lm_head"] == drafted.lm.get_output_embeddings().weight[net.draft_vocab].numel() == 40 * 64
    # the config section a model (and a trace) records prices the same as the DrafterConfig
    assert drafter_param_counts(drafter_section(drafted.config)) == c
    assert drafter_param_counts(drafter_section(drafted.config.to_dict())) == c


@pytest.mark.parametrize("wb", [2, 4])
@pytest.mark.parametrize("Q,T", [(4, 10), (2, 31)])
def test_drafter_bytes_are_a_hand_count_from_its_parameter_shapes(drafted, wb, Q, T):
    """Weights read by one draft of Q slots: every layer parameter, the first Q slot heads and slot
    embeddings, the MASK embedding, Q embedding rows and the draft vocabulary's rows of the base's head;
    plus the context rows each layer reads and the one last-state row."""
    net, H = drafted.drafter, 64
    layers = sum(p.numel() for p in net.layers.parameters())
    heads = net.slot_heads[:Q].numel()
    head_rows = drafted.lm.get_output_embeddings().weight[net.draft_vocab].numel()
    inputs = drafted.lm.get_input_embeddings().weight[:Q].numel() + net.slot_embedding[:Q].numel() \
        + net.mask_embedding.numel()
    weights = (layers + heads + head_rows + inputs) * wb
    fc = drafter_forward_cost(net.cfg, Q, T, weight_bytes=wb, act_bytes=2)
    assert fc.weights_bytes_read == weights
    assert fc.bytes_read == weights + (len(net.layers) * T + 1) * H * 2
    fuse = fuse_cost(net.cfg, 5, weight_bytes=wb, act_bytes=2)
    assert fuse.weights_bytes_read == (net.fuse.weight.numel() + net.fuse_norm.weight.numel()) * wb
    assert fuse.bytes_read == fuse.weights_bytes_read + 2 * 5 * H * 2  # the fused and last-state rows written


def test_drafter_matmul_flops_match_torchs_counter(drafted):
    """torch's FLOP counter over a real draft (matmuls, einsum, SDPA) equals the formula's matmul parts;
    norms (4 per element) are the cost model's own addition."""
    from torch.utils.flop_counter import FlopCounterMode

    state = drafted.setup_state()
    drafted.read(state, PROMPT)
    T = state.position
    with FlopCounterMode(display=False) as counter:
        drafted.draft(state, [7, MASK, MASK, MASK])
    fc = drafter_forward_cost(drafted.drafter.cfg, 4, T)
    f = fc.flops_by_component
    matmul = f["draft_layers"] + f["draft_attention"] + f["slot_heads"] + f["draft_lm_head"]
    assert counter.get_total_flops() == matmul
    assert fc.flops == matmul + f["draft_norms"]
    with FlopCounterMode(display=False) as counter:  # the fuse of 3 tokens the base reads
        drafted.drafter.fuse_context(torch.zeros(3, 3 * 64))
    assert counter.get_total_flops() == fuse_cost(drafted.drafter.cfg, 3).flops - 4 * 3 * 64


def test_a_verify_round_is_drafter_plus_base(drafted):
    r = verify_round_cost(drafted.config, 4, 4, 30, weight_bytes=4)
    base = dense_forward_cost(drafted.config, 4, 4, 0, 4, context_len=30)
    kv_row = 2 * 2 * 2 * 16 * 2  # layers x (K, V) x kv heads x head_dim x act bytes
    assert r.base.bytes_read == base.bytes_read + 4 * kv_row  # the 4 rows read are appended to the cache
    assert r.drafter.bytes_read == (drafter_forward_cost(drafted.drafter.cfg, 4, 30, 4).bytes_read
                                    + fuse_cost(drafted.drafter.cfg, 4, 4).bytes_read)
    assert r.total.bytes_read == pytest.approx(r.base.bytes_read + r.drafter.bytes_read)
    assert r.total.flops == pytest.approx(r.base.flops + r.drafter.flops)
    assert 0 < r.drafter_bytes_share < 1
    assert set(DRAFTER_WEIGHT_COMPONENTS) <= set(r.total.bytes_by_component)
    prefill = verify_round_cost(drafted.config, len(PROMPT), 0, 0)
    assert prefill.drafter.bytes_by_component["draft_layers"] == 0  # nothing drafted: the fuse only
    assert prefill.drafter.bytes_read == fuse_cost(drafted.drafter.cfg, len(PROMPT)).bytes_read
    assert base_read_cost(drafted.config, 0, 5).bytes_read == 0
    with pytest.raises(ValueError, match="block size"):
        drafter_forward_cost(drafted.drafter.cfg, 5, 0)
    with pytest.raises(ValueError, match="no drafter"):
        CostMeter({k: v for k, v in drafted.config.to_dict().items() if k != "drafter"}, 2, "state", 0, 4,
                  drafted.capabilities).verify_round(4, 4, 10)


def test_verify_trace_prices_every_round_drafter_plus_base(drafted, tmp_path):
    res = BlockDecoder(drafted).generate(PROMPT, config=DecodeConfig(block_size=4, max_new_tokens=16,
                                                                     policy="verify"))
    tr = res.trace
    wb = drafted.dtype.itemsize
    costs = verify_trace_costs(tr)
    assert len(costs) == len(tr) == len(res.accepted_lengths) + 1
    ctx = len(PROMPT)
    for i, (st, r) in enumerate(zip(tr.steps, costs)):
        assert st.bytes_read == r.total.bytes_read and st.flops == r.total.flops  # what the run recorded
        if i == 0:
            assert r.base.bytes_read == base_read_cost(drafted.config, len(PROMPT), 0, wb).bytes_read
            assert r.drafter.bytes_read == fuse_cost(drafted.drafter.cfg, len(PROMPT), wb).bytes_read
            continue
        n = int(st.n_tokens_forward)  # [anchor, drafts]
        assert r.base.bytes_read == base_read_cost(drafted.config, n, ctx, wb).bytes_read
        assert r.drafter.bytes_read == (fuse_cost(drafted.drafter.cfg, n, wb).bytes_read + (
            drafter_forward_cost(drafted.drafter.cfg, n, ctx, wb).bytes_read if n > 1 else 0))
        # a round's bytes are more than the base's verification forward alone (what it was priced at before)
        assert st.bytes_read > dense_forward_cost(drafted.config, n, wb, 0, n, context_len=ctx).bytes_read
        ctx += res.accepted_lengths[i - 1] + 1  # the accepted run and the target's own token stay read
    assert res.bytes_read == pytest.approx(sum(r.total.bytes_read for r in costs))
    loaded = Trace.load(tr.save(tmp_path / "verify.parquet"))
    assert [r.total.bytes_read for r in verify_trace_costs(loaded)] == [st.bytes_read for st in tr.steps]
    assert verify_trace_costs(loaded, weight_bytes=2)[1].total.bytes_read < costs[1].total.bytes_read  # fp32 run
    # a run priced as the base alone (before the drafter was priced): no weight size reproduces it, no split
    old = SimpleNamespace(decode_config=loaded.decode_config, meta=loaded.meta, steps=[dataclasses.replace(
        st, bytes_read=dense_forward_cost(drafted.config, int(st.n_tokens_forward), wb, 0,
                                          int(st.n_tokens_forward)).bytes_read) for st in loaded.steps])
    assert verify_trace_costs(old) is None


def test_commit_mode_forwards_price_the_base_only_when_it_reads(drafted):
    """Commit mode: a block's later forwards run the drafter alone (the base reads a block when it is
    committed), so they read fewer bytes than the base's weights."""
    res = BlockDecoder(drafted).generate(PROMPT, config=DecodeConfig(block_size=4, max_new_tokens=12, threshold=1.0))
    base_weights = dense_forward_cost(drafted.config, 1, drafted.dtype.itemsize, 0, 1).weights_bytes_read
    steps = res.trace.steps
    later = [st for st in steps if int(st.n_tokens_forward) == len(st.tokens)]  # no commit in the forward
    committing = [st for st in steps if int(st.n_tokens_forward) > len(st.tokens)]
    assert later and committing
    assert all(st.bytes_read < base_weights for st in later)
    assert all(st.bytes_read > base_weights for st in committing)


def test_cost_tab_shows_a_verify_round_as_drafter_plus_base(drafted):
    """The explorer's Cost tab (under its break-even line) splits a verify run's rounds into the drafter's
    forward and the base's, the two adding up to the bytes each event recorded."""
    pytest.importorskip("panel")
    from tokenizers import Tokenizer, models, pre_tokenizers

    from clover_viz.models import LoadedModel
    from clover_viz.panel_views import CostView
    from clover_viz.state import ExplorerState
    from clover_engine.units import format_si

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    s = ExplorerState(max_new_tokens=12)
    s.use_model(LoadedModel.in_memory(drafted, tok, label="tiny drafter"))
    assert s.policy == "verify"
    s.prompt = " ".join(f"t{i}" for i in PROMPT)
    assert s.generate() and s.wait(60)
    s.drain()
    costs = verify_trace_costs(s.trace)
    assert [r.total.bytes_read for r in costs] == [st.bytes_read for st in s.trace.steps]
    rounds = len(s.trace) - 1
    mean_d = sum(r.drafter.bytes_read for r in costs[1:]) / rounds
    mean_b = sum(r.base.bytes_read for r in costs[1:]) / rounds
    s.position = len(s.trace) - 1
    view = CostView(state=s)
    view.refresh()
    html = view.break_even.object
    assert f"verify rounds</b> ({rounds})" in html
    assert f"drafter <b>{format_si(mean_d, 'B', digits=3)}</b> + base <b>{format_si(mean_b, 'B', digits=3)}</b>" in html
    last = costs[-1]
    assert f"this round (forward {len(s.trace)} of {len(s.trace)})" in html
    assert f"({last.drafter_bytes_share:.0%} drafter)" in html
    s.position = 0
    assert "the prefill (forward 1)" in s.verify_cost_html()
    s.trace.decode_config["policy"] = "low_confidence"  # another run: nothing claimed
    assert s.verify_cost_html() == "" and "verify rounds" not in s.break_even_html()


def test_measured_break_even_of_a_drafter_times_the_parts_of_a_verify_round(drafted, monkeypatch):
    """On a drafter, the break-even's block forward is the drafter's forward alone, its commit the base
    reading the block and its AR step the base reading one token -- so the Cost tab reads a verify run
    against ``(t_block + t_commit) / t_ar`` (`BreakEven.verify_tokens_per_forward`)."""
    from clover_engine.cost.break_even import measure_break_even

    calls = []
    read, draft = drafted.read, drafted.draft
    monkeypatch.setattr(drafted, "read", lambda st, ids: calls.append(("read", len(ids))) or read(st, ids))
    monkeypatch.setattr(drafted, "draft", lambda st, blk: calls.append(("draft", len(blk))) or draft(st, blk))
    measure_break_even(drafted, (4,), prefix_len=8, repeats=1, warmup=0)
    timed = [c for c in calls[calls.index(("read", 8)) + 1:] if c[1]]  # after the prefix; empty reads cost nothing
    assert timed == [("read", 1), ("draft", 4), ("read", 4), ("draft", 4)]  # AR step | block | block + commit


def test_cost_tab_reads_a_verify_run_against_the_verify_break_even(drafted):
    pytest.importorskip("panel")
    from tokenizers import Tokenizer, models, pre_tokenizers

    from clover_viz.models import LoadedModel
    from clover_viz.state import ExplorerState

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    s = ExplorerState(max_new_tokens=12)
    s.use_model(LoadedModel.in_memory(drafted, tok, label="tiny drafter"))
    s.prompt = " ".join(f"t{i}" for i in PROMPT)
    assert s.generate() and s.wait(60)
    s.drain()
    p = s.measure_break_even(repeats=1, prefix_len=8)
    assert p is not None and p.block_size == drafted.draft_block
    html = s.break_even_html()
    tpf = float(s.trace.summary()["tokens_per_forward"])
    assert f"verify with blocks of {p.block_size} needs <b>{p.verify_tokens_per_forward:.2f}</b> tokens per base" in html
    assert f"<b>{p.verify_speedup(tpf):.2f}x</b>" in html
    s.trace.decode_config["policy"] = "low_confidence"  # a commit-mode run: the block formula
    assert f"needs <b>{p.tokens_per_forward:.2f}</b> tokens per forward" in s.break_even_html()
