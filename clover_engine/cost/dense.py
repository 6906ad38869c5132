"""Bytes read and FLOPs of one forward of a dense transformer: the ``kv_cache`` cost family
(`dense_forward_cost`: Llama, Qwen2, Qwen3 adapted to block diffusion by `clover_engine.backbones.causal_lm.model`;
docs/architecture.md §4 and §7) and the ``recompute`` family (`recompute_forward_cost`: masked
diffusion without a cache, `clover_engine.backbones.masked_diffusion`). `clover_engine.cost.formulas.forward_cost` picks
between them and Clover's formulas by the model's cost family.

Wing: ``cost``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clover_engine.cost.components import DENSE_COMPONENTS, NORM_FLOPS_PER_ELEMENT, ForwardCost, check_token_counts


def _field_getter(config: Any):
    """``g(name)`` -> the config's field (a mapping's key or an attribute).

    Raises (from ``g``):
        TypeError: a config without the dense transformer's dimensions (no formula prices it).
    """
    def g(name: str) -> Any:
        try:
            return config[name] if isinstance(config, Mapping) else getattr(config, name)
        except (KeyError, AttributeError):
            raise TypeError(f"a dense transformer's forward is priced from its config's {name!r}, which "
                            f"this {type(config).__name__} has not") from None
    return g


def dense_param_counts(config: Any) -> dict[str, int]:
    """Per-layer and model-wide parameter counts of a Llama / Qwen2 / Qwen3-style dense transformer.

    ``config``: an `clover_engine.backbones.causal_lm.model.HFBlockConfig` or its ``to_dict()``.
    Returns ``attention`` (q, k, v, o per layer), ``mlp`` (gate, up, down per
    layer), ``norms`` (all RMSNorm weights), ``embedding`` and ``lm_head``
    (V x H each; a tied head is the same tensor, still read for the logits).
    """
    g = _field_getter(config)
    H, I, N = g("hidden_size"), g("intermediate_size"), g("num_hidden_layers")
    Hq, Hkv, hd, V = g("num_attention_heads"), g("num_key_value_heads"), g("head_dim"), g("vocab_size")
    return {
        "attention": H * Hq * hd + 2 * H * Hkv * hd + Hq * hd * H,
        "mlp": 3 * H * I,
        "norms": 2 * H * N + H,
        "embedding": V * H,
        "lm_head": V * H,
    }


def moe_mlp_cost(config: Any, n_tokens: int, expert_union: Any = None,
                 weight_bytes: float = 2) -> tuple[float, float, float]:
    """Bytes and FLOPs of the feed-forwards of a MoE transformer's forward over ``n_tokens`` tokens,
    priced by the expert union (the MoE diffusion backbones, `clover_engine.backbones.llada_moe`).

    Per MoE layer (``moe_layer_flags``): the router ``E * H`` and the shared expert ``3 * H * I_s`` are
    read once; the routed experts' weights are read for the **union** only, ``union_l * 3 * H * I``
    (Clover's argument, `clover_engine.cost.formulas`); every token computes its k experts,
    ``2 * T * (E * H + 3 * H * I_s + k * 3 * H * I)`` FLOPs. A dense layer is ``3 * H * intermediate_size``.

    Args:
        config: a config with ``num_experts`` > 0, ``num_experts_per_tok``, ``moe_intermediate_size``,
            ``shared_expert_intermediate_size``, ``moe_layer_flags``, ``hidden_size``, ``intermediate_size``.
        n_tokens: T.
        expert_union: the measured distinct experts per MoE layer (a sequence), one number for all,
            or None: the expectation under independent uniform routing,
            ``E * (1 - (1 - k/E)^T)`` (`clover_engine.cost.formulas.expected_union`; real routing is
            correlated, so measured unions are lower).
        weight_bytes: bytes per weight.

    Returns:
        (bytes, flops, mean union over the MoE layers).

    Raises:
        ValueError: a union with another number of entries than MoE layers, or outside ``[0, E]``.
    """
    g = _field_getter(config)
    H, E, k = g("hidden_size"), g("num_experts"), g("num_experts_per_tok")
    I, Is, dense_i = g("moe_intermediate_size"), g("shared_expert_intermediate_size") or 0, g("intermediate_size")
    flags = [bool(f) for f in g("moe_layer_flags")]
    n_moe, T = sum(flags), int(n_tokens)
    if expert_union is None:
        union = [E * (1.0 - (1.0 - k / E) ** T)] * n_moe
    elif isinstance(expert_union, (int, float)):
        union = [float(expert_union)] * n_moe
    else:
        union = [float(u) for u in expert_union]
    if len(union) != n_moe:
        raise ValueError(f"expert_union has {len(union)} entries for {n_moe} MoE layers; give one per MoE layer")
    for i, u in enumerate(union):  # up to E: a dense implementation reads every expert whatever T
        if not 0 <= u <= E:
            raise ValueError(f"expert_union[{i}] = {u:g} is outside [0, num_experts={E}]")
    expert, shared, router = 3 * H * I, 3 * H * Is, E * H
    wb = float(weight_bytes)
    nbytes = (n_moe * (router + shared) + sum(union) * expert + (len(flags) - n_moe) * 3 * H * dense_i) * wb
    flops = 2.0 * T * (n_moe * (router + shared + k * expert) + (len(flags) - n_moe) * 3 * H * dense_i)
    return float(nbytes), float(flops), float(sum(union) / n_moe) if n_moe else 0.0


def is_moe(config: Any) -> bool:
    """True for a config with routed experts that `moe_mlp_cost` can price (``num_experts`` > 0 and
    ``moe_layer_flags``, as the MoE diffusion backbones' configs have)."""
    def get(name: str) -> Any:
        return config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)

    return bool(get("num_experts")) and get("moe_layer_flags") is not None


def dense_forward_cost(
    config: Any,
    n_tokens: int,
    weight_bytes: float = 2,
    n_commit_tokens: int = 0,
    block_len: int | None = None,
    *,
    context_len: int = 0,
    act_bytes: float = 2,
    include_kv: bool = True,
    kv_write_tokens: int | None = None,
    expert_union: Any = None,
) -> ForwardCost:
    """Bytes read and FLOPs of one forward of a dense transformer with a KV cache.

    A forward pushes T tokens (C commit tokens computed causally, then the L
    window slots) through every layer, reading every weight once and the K/V
    of the ``context_len`` cached tokens once per layer:

    * bytes: ``T * H`` embedding rows + ``N * (attention + mlp)`` weights + norms
      + the LM head (``V * H``, only when L > 0), all at ``weight_bytes``;
      ``kv_cache_read = N * 2 * Hkv * hd * context_len * act_bytes``;
      ``kv_cache_write`` the same per committed token (C).
    * FLOPs: ``2 * T * params`` for the projections and MLP, ``2 * L * V * H``
      for the logits, attention ``4 * Hq * hd`` per (query, key) pair with every
      query scoring the whole context and all T tokens of the forward (an upper
      bound for the causal commit rows), 4 per normalised element.

    ``config`` is an `clover_engine.backbones.causal_lm.model.HFBlockConfig` or its ``to_dict()``; the
    returned `ForwardCost` is keyed by `DENSE_COMPONENTS`. ``kv_write_tokens`` (default C): the
    tokens whose K/V the forward appends to the cache -- a causal read that also needs every row's
    logits (the verify forward of `clover_engine.cost.drafter`) writes all T with C = 0.

    Raises:
        ValueError: token counts that do not add up, a negative context, or ``kv_write_tokens``
            outside ``[0, T]``.
        TypeError: a config without a dense transformer's dimensions.
    """
    T, C, L = check_token_counts(n_tokens, n_commit_tokens, block_len)
    if context_len < 0:
        raise ValueError(f"context_len must be >= 0, got {context_len}")
    kv_write = C if kv_write_tokens is None else int(kv_write_tokens)
    if not 0 <= kv_write <= T:
        raise ValueError(f"kv_write_tokens must be in [0, n_tokens={T}], got {kv_write_tokens}")
    g = _field_getter(config)
    H, N, V = g("hidden_size"), g("num_hidden_layers"), g("vocab_size")
    Hq, Hkv, hd = g("num_attention_heads"), g("num_key_value_heads"), g("head_dim")
    c = dense_param_counts(config)
    wb = float(weight_bytes)
    b: dict[str, float] = dict.fromkeys(DENSE_COMPONENTS, 0.0)
    f: dict[str, float] = dict.fromkeys(DENSE_COMPONENTS, 0.0)
    b["embedding"] = T * H * wb
    b["attention_mixers"] = N * c["attention"] * wb
    f["attention_mixers"] = N * T * 2 * c["attention"]
    union = 0.0
    if is_moe(config):  # routed experts: read the union, compute k per token (moe_mlp_cost)
        b["mlp"], f["mlp"], union = moe_mlp_cost(config, T, expert_union, wb)
    else:
        b["mlp"] = N * c["mlp"] * wb
        f["mlp"] = N * T * 2 * c["mlp"]
    b["norms"] = c["norms"] * wb
    f["norms"] = NORM_FLOPS_PER_ELEMENT * H * (2 * N * T + L)
    b["lm_head"] = c["lm_head"] * wb if L else 0.0
    f["lm_head"] = 2 * L * V * H
    kv_per_token = N * 2 * Hkv * hd * act_bytes
    if include_kv:
        b["kv_cache_read"] = kv_per_token * context_len
        b["kv_cache_write"] = kv_per_token * kv_write
    f["attention"] = N * 4 * Hq * hd * T * (context_len + T)
    total_b, total_f = float(sum(b.values())), float(sum(f.values()))
    return ForwardCost(
        bytes_read=total_b, flops=total_f, arithmetic_intensity=total_f / total_b,
        bytes_by_component={k: float(v) for k, v in b.items()},
        flops_by_component={k: float(v) for k, v in f.items()},
        n_tokens=T, n_commit_tokens=C, block_len=L, mean_expert_union=union,
    )


def recompute_forward_cost(
    config: Any,
    n_tokens: int,
    weight_bytes: float = 2,
    n_commit_tokens: int = 0,
    block_len: int | None = None,
    *,
    context_len: int = 0,
    canvas_tail: int = 0,
    act_bytes: float = 2,
    expert_union: Any = None,
) -> ForwardCost:
    """One forward of a masked diffusion model without a cache (Dream / LLaDA, `clover_engine.backbones.masked_diffusion`).

    Every forward recomputes the whole sequence: the ``context_len`` tokens of
    history, the C newly committed ones, the L block slots and ``canvas_tail``
    MASK positions after the block all pass through every layer, with every
    position attending to every other (a MoE model's feed-forwards priced by
    ``expert_union``, `moe_mlp_cost`). Priced by `dense_forward_cost` over
    ``T' = context_len + C + L + canvas_tail`` tokens of which only the L slots
    get logits, with no KV cache read or written.

    Raises:
        ValueError: token counts that do not add up, or a negative context or tail.
    """
    T, _, L = check_token_counts(n_tokens, n_commit_tokens, block_len)
    if context_len < 0 or canvas_tail < 0:
        raise ValueError(f"context_len and canvas_tail must be >= 0, got {context_len}, {canvas_tail}")
    total = context_len + T + canvas_tail
    return dense_forward_cost(config, total, weight_bytes, total - L, L, context_len=0, act_bytes=act_bytes,
                              include_kv=False, expert_union=expert_union)
