"""Model-level checks: the training forward equals the decoder's computation, shapes, errors.

Run: .venv/bin/python -m pytest tests/clover_engine/test_model.py -q
"""

import pytest
import torch

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.backbones.clover.model import CloverModel

CFG = CloverConfig.from_name("clover-test")


from helpers import CFG_CONV  # noqa: E402
from helpers import loud_model as loud  # noqa: E402


@pytest.mark.parametrize("cfg", [CFG, CFG_CONV], ids=["base", "attn-conv"])
@pytest.mark.parametrize("use_window", [False, True], ids=["state", "state+window"])
@pytest.mark.parametrize("L, T", [(1, 6), (4, 16), (8, 40), (16, 48)], ids=["L1", "L4", "L8", "L16"])
def test_training_forward_equals_reference_per_block(L, T, use_window, cfg):
    """Noisy block b in the training pass == decoding block b after clean history [0, b*L)."""
    m = loud(cfg=cfg)
    g = torch.Generator().manual_seed(2)
    clean = torch.randint(0, 256, (2, T), generator=g)
    noisy = clean.clone()
    noisy[torch.rand(2, T, generator=g) < 0.5] = CFG.mask_token_id
    mode = "state+window" if use_window else "state"
    with torch.no_grad():
        h, _ = m.forward_train(clean, noisy, L, use_window)
        logits = m.lm_head(h)
        for b in range(T // L):
            s, e = b * L, (b + 1) * L
            ref = m.forward_reference(clean[:, :s], noisy[:, s:e], L, mode).logits
            torch.testing.assert_close(logits[:, s:e], ref, atol=2e-4, rtol=1e-4)


def test_history_changes_the_block_prediction():
    """The state carries history: a different first block changes a later block's logits."""
    m = loud()
    a = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    b = a.clone()
    b[0, :4] = (b[0, :4] + 1) % 256
    blk = torch.full((1, 4), CFG.mask_token_id)
    for mode in ("state", "state+window"):
        la = m.forward_reference(a, blk, 4, mode).logits
        lb = m.forward_reference(b, blk, 4, mode).logits
        assert (la - lb).abs().max() > 1e-3


def test_bad_inputs():
    m = CloverModel(CFG)
    with pytest.raises(ValueError, match="multiple"):
        m.forward_train(torch.zeros(1, 10, dtype=torch.long), torch.zeros(1, 10, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="memory_mode"):
        m.setup_state(1, "kv-cache")
    with pytest.raises(ValueError, match="unknown preset"):
        CloverConfig.from_name("gpt2")
    with pytest.raises(ValueError, match="layer_types"):
        CloverConfig(**{**CFG.to_dict(), "layer_types": ["linear_attention"]})
    with pytest.raises(ValueError, match="unknown layer type"):
        CloverConfig(**{**CFG.to_dict(), "layer_types": ["conv"] * 4})


def test_config_json_round_trip(tmp_path):
    CFG.to_json(tmp_path / "config.json")
    assert CloverConfig.from_json(tmp_path / "config.json") == CFG
    big = CloverConfig.from_name("clover-35b-a3b")
    assert (big.num_hidden_layers, big.num_linear_layers, big.num_full_layers) == (40, 30, 10)
    assert big.layer_types[:4] == ["linear_attention"] * 3 + ["full_attention"]
    assert (big.linear_num_key_heads, big.linear_num_value_heads, big.head_dim, big.num_experts) == (16, 32, 256, 256)
