"""The Medusa-style baseline as a drafter backbone (clover_engine.backbones.drafter.net.MedusaDrafter): it decodes
through the same `DraftedLM`, so verify mode is the target's greedy answer whatever the heads propose, it
saves and loads as ``arch: medusa``, and the cost model prices its forward from its own parameters.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_medusa_drafter.py -q``
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from clover_engine.backbones.drafter.files import load_drafter_net, save_drafter  # noqa: E402
from clover_engine.backbones.drafter.model import DraftedLM  # noqa: E402
from clover_engine.backbones.drafter.net import BlockDrafter, DrafterConfig, MedusaDrafter, build_drafter  # noqa: E402
from clover_engine.cost.drafter import drafter_forward_cost, drafter_param_counts, fuse_cost  # noqa: E402
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig  # noqa: E402

V, EOS, MASK, H = 128, 2, 120, 64
PROMPTS = [[5, 9, 33, 17, 60, 4, 8, 21, 70, 11], [40, 41, 42]]
DRAFT_VOCAB = tuple(range(2, 2 + 48))


def _config(**kw) -> DrafterConfig:
    base = dict(hidden_size=H, target_layers=(2,), num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16,
                intermediate_size=128, block_size=4, vocab_size=V, mask_token_id=MASK, rope_theta=10000.0,
                arch="medusa")
    return DrafterConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def medusa():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   eos_token_id=EOS, bos_token_id=1, initializer_range=0.2, tie_word_embeddings=True)
    lm = transformers.LlamaForCausalLM(cfg).eval()
    net = build_drafter(_config(draft_vocab=DRAFT_VOCAB))
    for p in net.parameters():  # non-zero heads, so drafts differ from the target's own head
        torch.nn.init.normal_(p, std=0.05)
    return DraftedLM.build(lm, net, "tiny-medusa", MASK, EOS)


def _greedy(lm, prompt: list[int], n: int) -> list[int]:
    out = lm.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                      max_new_tokens=n, do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
    gen = out[0, len(prompt):].tolist()
    return gen[: gen.index(EOS)] if EOS in gen else gen


def test_the_config_names_the_network_and_refuses_an_unknown_arch():
    assert isinstance(build_drafter(_config()), MedusaDrafter)
    assert isinstance(build_drafter(_config(arch="block")), BlockDrafter)
    with pytest.raises(ValueError, match="arch must be one of"):
        _config(arch="eagle")


def test_slot_zero_is_the_targets_own_head_and_untrained_heads_repeat_it():
    net = build_drafter(_config())  # zero-initialised heads
    last, w = torch.randn(3, H), torch.randn(V, H)
    logits = net(None, last, torch.full((3, 4), MASK), torch.tensor([5, 6, 7]), None, w)
    assert logits.shape == (3, 4, V)
    assert torch.allclose(logits[:, 0], last @ w.t(), atol=1e-5)
    assert torch.allclose(logits[:, 1:], logits[:, :1].expand(3, 3, V), atol=1e-5)
    with pytest.raises(ValueError, match="at most 4 slots"):
        net(None, last, torch.full((3, 5), MASK), torch.tensor([5, 6, 7]), None, w)


@pytest.mark.parametrize("block_size", [2, 4])
def test_verify_with_medusa_heads_is_the_targets_greedy_answer(medusa, block_size):
    dec = BlockDecoder(medusa)
    for prompt in PROMPTS:
        ref = _greedy(medusa.lm, prompt, 24)
        r = dec.generate(prompt, config=DecodeConfig(block_size=block_size, max_new_tokens=24, policy="verify"))
        assert r.tokens == ref
        assert r.nfe == 1 + len(r.accepted_lengths)
        assert all(0 <= a <= block_size - 1 for a in r.accepted_lengths)


def test_commit_mode_writes_the_heads_drafts_after_the_targets_anchor(medusa):
    """A block's slot 0 takes the target's next-token logits (any id); every later slot the heads' (the
    draft vocabulary only) -- the prompt is 8 tokens, so the blocks of 4 start at answer positions 0, 4, 8."""
    r = BlockDecoder(medusa).generate(PROMPTS[0][:8], config=DecodeConfig(block_size=4, threshold=0.95,
                                                                           max_new_tokens=12))
    assert r.nfe >= 3 and MASK not in r.tokens
    drafted = [t for j, t in enumerate(r.tokens) if j % 4]
    assert drafted and set(drafted) <= set(DRAFT_VOCAB)
    assert any(t not in DRAFT_VOCAB for t in _greedy(medusa.lm, PROMPTS[0][:8], 12)), "the check needs such ids"


def test_saved_and_loaded_as_medusa(medusa, tmp_path):
    d = save_drafter(tmp_path / "m", medusa.drafter, base="tiny")
    net, cfg = load_drafter_net(d)
    assert cfg["drafter"]["arch"] == "medusa" and isinstance(net, MedusaDrafter)
    for k, v in medusa.drafter.state_dict().items():
        assert torch.equal(net.state_dict()[k], v.half().float())


def test_cost_model_prices_the_heads_from_their_parameters(medusa):
    from torch.utils.flop_counter import FlopCounterMode

    net = medusa.drafter
    c = drafter_param_counts(net.cfg)
    assert c["total"] == c["slot_heads"] == sum(p.numel() for p in net.parameters()) == 3 * H * H
    assert c["draft_lm_head"] == len(DRAFT_VOCAB) * H
    state = medusa.setup_state()
    medusa.read(state, PROMPTS[0])
    for Q in (2, 4):
        with FlopCounterMode(display=False) as counter:
            medusa.draft(state, [7] + [MASK] * (Q - 1))
        fc = drafter_forward_cost(net.cfg, Q, state.position, weight_bytes=2)
        assert counter.get_total_flops() == fc.flops == 2 * (Q - 1) * H * H + 2 * Q * len(DRAFT_VOCAB) * H
        assert fc.weights_bytes_read == ((Q - 1) * H * H + len(DRAFT_VOCAB) * H + H) * 2
    assert fuse_cost(net.cfg, 5).bytes_read == fuse_cost(net.cfg, 5).flops == 0  # no context is fused
