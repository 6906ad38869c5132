"""History memory in context length: Clover's recurrent state against the KV cache of an
autoregressive model of the same shape (notebook 06; docs/architecture.md §3 and §7).

Per sequence, with ``sb`` bytes per state element (fp32, 4) and ``ab`` bytes per
activation element (the model's dtype), N_gdn GDN layers and N_attn attention layers:

* **Clover** (`clover_state_bytes`), constant in the context length:
  GDN ``S [Hv, Dk, Dv] * sb + (kernel - 1) * (2 Hk Dk + Hv Dv) * ab`` (state and conv tail),
  attention memory ``S [Hkv, hd, hd] * sb`` (plus the q/k/v conv tail when
  ``attention_conv_kernel_dim > 0``); ``state+window`` adds the ring buffer of W keys and
  values, ``2 * Hkv * W * hd * ab`` per attention layer. The same bytes
  `clover_engine.cost.formulas.forward_cost` charges as ``state_read`` and
  ``CloverState.nbytes()`` measures.
* **Autoregressive, same shape** (`ar_kv_cache_bytes`, `ar_history_bytes`): a Qwen3.5-MoE
  decoded token by token keeps the same GDN states (constant), but every attention layer
  keeps the keys and values of every token, ``2 * Hkv * hd * ab`` bytes per token per layer
  (the KV cache term of docs/architecture.md §7) -- linear in the context.

Wing: ``cost``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_cost_routing_memory.py -q``
"""

from __future__ import annotations

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.cost.formulas import STATE_BYTES, _as_config, forward_cost


def clover_state_bytes(config: CloverConfig | str, memory_mode: str = "state", act_bytes: float = 2,
                       state_bytes: float = STATE_BYTES, window: int = 0) -> float:
    """Bytes of one sequence's Clover history (all layers), whatever the context length.

    Args:
        config: a `CloverConfig` or preset name.
        memory_mode: ``"state"`` or ``"state+window"`` (adds the K/V ring buffer).
        act_bytes: bytes per conv-tail / window element (the model's dtype: 4 for fp32).
        state_bytes: bytes per recurrent-state element (fp32 = 4).
        window: W for ``state+window``; 0 = ``config.attention_window``.

    Raises:
        ValueError: an unknown memory mode, or ``state+window`` without a window.
    """
    cfg = _as_config(config)
    fc = forward_cost(cfg, 1, cfg.num_experts_per_tok, act_bytes=act_bytes, state_bytes=state_bytes)
    total = fc.bytes_by_component["state_read"]
    if memory_mode == "state+window":
        W = int(window) or cfg.attention_window
        if W < 1:
            raise ValueError(f"memory_mode='state+window' needs a window; {cfg.name!r} has attention_window=0")
        total += cfg.num_full_layers * 2 * cfg.num_key_value_heads * W * cfg.head_dim * act_bytes
    elif memory_mode != "state":
        raise ValueError(f"memory_mode must be 'state' or 'state+window', got {memory_mode!r}")
    return float(total)


def ar_kv_cache_bytes(config: CloverConfig | str, context_len: int, act_bytes: float = 2) -> float:
    """KV cache of an autoregressive model of this shape after ``context_len`` tokens.

    ``N_attn * 2 * Hkv * hd * context_len * act_bytes`` (keys and values of every token in
    every attention layer; GDN layers keep no cache). For ``clover-35b-a3b`` in BF16:
    20,480 bytes per token, 2.68 GB at 131,072 tokens.

    Raises:
        ValueError: a negative context length.
    """
    if context_len < 0:
        raise ValueError(f"context_len must be >= 0, got {context_len}")
    cfg = _as_config(config)
    return float(cfg.num_full_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * context_len * act_bytes)


def ar_history_bytes(config: CloverConfig | str, context_len: int, act_bytes: float = 2,
                     state_bytes: float = STATE_BYTES) -> float:
    """All history an autoregressive model of this shape holds: its GDN states plus the KV cache.

    The GDN layers' state and conv tail are the same as Clover's (constant); the attention
    layers hold `ar_kv_cache_bytes` instead of Clover's fixed-size memory state.
    """
    cfg = _as_config(config)
    channels = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim
    gdn = cfg.num_linear_layers * (
        cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * state_bytes
        + (cfg.linear_conv_kernel_dim - 1) * channels * act_bytes
    )
    return float(gdn + ar_kv_cache_bytes(cfg, context_len, act_bytes))


def crossover_tokens(config: CloverConfig | str, act_bytes: float = 2, state_bytes: float = STATE_BYTES) -> float:
    """Context length at which the AR model's KV cache alone outgrows Clover's whole state.

    ``clover_state_bytes / (KV bytes per token)``; for ``clover-35b-a3b`` in BF16 about
    3,400 tokens.
    """
    return clover_state_bytes(config, act_bytes=act_bytes, state_bytes=state_bytes) / ar_kv_cache_bytes(
        config, 1, act_bytes)


__all__ = ["ar_history_bytes", "ar_kv_cache_bytes", "clover_state_bytes", "crossover_tokens"]
