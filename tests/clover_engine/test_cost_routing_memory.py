"""Expert-union arithmetic (`clover_engine.cost.routing`) and history memory in context length
(`clover_engine.cost.memory`), held to the reference numbers of docs/architecture.md §7 and to
the state the model actually allocates.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_cost_routing_memory.py -q``
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.cost import expected_union, union_for_bytes_ratio
from clover_engine.cost.memory import ar_history_bytes, ar_kv_cache_bytes, clover_state_bytes, crossover_tokens
from clover_engine.cost.routing import effective_tokens, net_gain, union_by_tokens, weights_bytes_ratio

BIG = "clover-35b-a3b"


# ----------------------------------------------------------------------------- routing
@pytest.mark.parametrize("T", [1, 2, 7.5, 32])
def test_effective_tokens_inverts_expected_union(T):
    for E, k in ((256, 8), (8, 2)):
        assert effective_tokens(expected_union(E, k, T), E, k) == pytest.approx(T, rel=1e-6)


def test_effective_tokens_edges():
    assert effective_tokens(8, 256, 8) == pytest.approx(1.0)
    assert effective_tokens(0, 256, 8) == 0.0
    assert effective_tokens(256, 256, 8) == math.inf
    with pytest.raises(ValueError, match="union"):
        effective_tokens(257, 256, 8)
    with pytest.raises(ValueError, match="top_k"):
        effective_tokens(4, 8, 8)


def test_weights_bytes_ratio_reference_numbers():
    # docs/architecture.md §7: union 32 -> 2.02x; the write-ups' 1.4x is a union of ~17
    assert weights_bytes_ratio(BIG, 32, 32) == pytest.approx(2.02, abs=0.01)
    u14 = union_for_bytes_ratio(BIG, 1.4)
    assert 17 < u14 < 18
    assert weights_bytes_ratio(BIG, 32, u14) == pytest.approx(1.4, rel=1e-9)
    # one token with its own k experts is the AR step itself
    assert weights_bytes_ratio(BIG, 1, 8) == pytest.approx(1.0, rel=1e-12)


def test_net_gain():
    assert net_gain(7.0, 1.4) == pytest.approx(5.0)
    with pytest.raises(ValueError):
        net_gain(3.0, 0.0)


def test_union_by_tokens_groups_and_masks_layers_without_moe():
    steps = [SimpleNamespace(n_tokens_forward=32, expert_union=[8, -1]),
             SimpleNamespace(n_tokens_forward=2, expert_union=[3, 2]),
             SimpleNamespace(n_tokens_forward=32, expert_union=[6, 7]),
             SimpleNamespace(n_tokens_forward=4, expert_union=None)]
    got = union_by_tokens(steps)
    assert list(got) == [2, 32]
    np.testing.assert_array_equal(got[2], [[3, 2]])
    assert got[32].shape == (2, 2) and np.isnan(got[32][0, 1]) and got[32][1, 1] == 7


# ------------------------------------------------------------------------------ memory
def test_clover_state_bytes_equals_the_allocated_state():
    from clover_engine.backbones.clover.model import random_model

    for name in ("clover-test",):
        model = random_model(name)
        assert clover_state_bytes(name, act_bytes=4) == model.setup_state(1).nbytes()
        assert clover_state_bytes(name, "state+window", act_bytes=4) == model.setup_state(1, "state+window").nbytes()
    # a config with the attention q/k/v conv (the bundled model's shape)
    cfg = CloverConfig.from_name("clover-test")
    cfg.attention_conv_kernel_dim = 4
    assert clover_state_bytes(cfg, act_bytes=4) == random_model(cfg).setup_state(1).nbytes()


def test_clover_state_bytes_35b():
    # 30 GDN layers x (32 x 128 x 128 fp32 + 3 x 8192 bf16 conv tail) + 10 x (2 x 256 x 256 fp32)
    assert clover_state_bytes(BIG) == 30 * (32 * 128 * 128 * 4 + 3 * 8192 * 2) + 10 * 2 * 256 * 256 * 4
    with pytest.raises(ValueError, match="window"):
        clover_state_bytes(BIG, "state+window")
    with pytest.raises(ValueError, match="memory_mode"):
        clover_state_bytes(BIG, "kv")


def test_ar_kv_cache_is_linear_and_crossover():
    assert ar_kv_cache_bytes(BIG, 1) == 10 * 2 * 2 * 256 * 2  # 20,480 bytes per token
    assert ar_kv_cache_bytes(BIG, 131072) == 131072 * ar_kv_cache_bytes(BIG, 1)
    assert ar_kv_cache_bytes(BIG, 0) == 0
    with pytest.raises(ValueError):
        ar_kv_cache_bytes(BIG, -1)
    n = crossover_tokens(BIG)
    assert ar_kv_cache_bytes(BIG, math.ceil(n)) >= clover_state_bytes(BIG) > ar_kv_cache_bytes(BIG, math.floor(n) - 1)
    # AR history = the same GDN states + the KV cache; Clover replaces the KV cache by the attention memory
    attn_memory = 10 * 2 * 256 * 256 * 4
    assert ar_history_bytes(BIG, 0) == clover_state_bytes(BIG) - attn_memory
