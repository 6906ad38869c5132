"""Bytes read and FLOPs of one Clover forward, from the config and the measured expert union.

What a forward reads (`forward_cost`)
-------------------------------------
A forward pushes T tokens through every layer: the C committed tokens of the
finished block (the fused commit, docs/architecture.md §3) followed by the L slots
of the current block (T = C + L). Per component (the keys of
``ForwardCost.bytes_by_component`` / ``flops_by_component``; ``wb`` = bytes per
weight, H = hidden size, N = layers, E experts, k = top-k):

* ``embedding``: the T rows looked up, ``T * H * wb`` bytes, no FLOPs.
* ``gdn_mixers`` / ``attention_mixers``: every weight of the mixers (Qwen3.5
  names: in_proj_qkv/z/b/a, conv1d, A_log, dt_bias, out_proj; q/k/v/o_proj,
  mem_a/mem_b, mem_A_log, mem_dt_bias; plus the block-diffusion block
  temperature and memory unit w_mem/b_mem), read once; FLOPs ``2 * T * params``
  for the projections plus ``2 * kernel`` per conv channel per token.
* ``norms``: every RMSNorm weight (input and post-attention norm per layer,
  final norm, attention q/k norms, GDN gated output norm); 4 FLOPs per
  normalised element (square, sum, scale, weight; GDN's weightless q/k L2 norm
  counted the same way).
* ``routers``: ``N * E * H`` weights; ``2 * T * E * H`` FLOPs per layer.
* ``shared_experts``: gate_up + down + the sigmoid gate row, read once;
  ``2 * T * params`` FLOPs.
* ``routed_experts``: the **union** of experts hit by the T tokens, per layer:
  ``sum_layers union_l * 3 * ffn * H * wb`` bytes. FLOPs do not depend on the
  union: each token runs k experts, ``2 * T * k * 3 * ffn * H`` per layer.
* ``lm_head``: ``V * H * wb`` bytes once, FLOPs only for the L block slots
  whose logits are needed, ``2 * L * V * H`` (nothing when L = 0).
* ``state_read``: the recurrent state every layer reads once per forward --
  GDN: fp32 ``S [Hv, Dk, Dv]`` + conv tail ``[(kernel-1), channels]``
  (activation dtype); attention: fp32 memory ``S [Hkv, hd, hd]``. FLOPs: the
  memory read-out ``m = S^T q``, ``2 * Dk * Dv`` per token per value head (GDN)
  and ``2 * hd^2`` per token per query head (attention).
* ``state_write``: when C > 0 the updated state is written once (same bytes
  as the read). FLOPs: the gated delta rule per committed token per head,
  ``S <- exp(g) S; u = beta (v - S^T k); S <- S + k u^T`` = decay ``Dk*Dv`` +
  ``S^T k`` ``2*Dk*Dv`` + outer-product update ``2*Dk*Dv`` = ``5 * Dk * Dv``
  (docs/architecture.md §3; O(Dv) gate terms dropped).
* ``window_kv`` (``memory_mode="state+window"`` only): each attention layer
  reads the ring buffer of W committed K/V ``[2, Hkv, W, hd]`` (activation
  dtype) and writes the ``min(C, W)`` new entries; every token scores against
  and mixes the W entries, ``4 * Hq * hd * W`` FLOPs per token.
* ``block_attention``: the bidirectional in-block attention, O(l^2) per
  segment (each committed chunk of ``commit_block_len`` tokens and the block of
  L slots attend within themselves): GDN ``2 l^2 (Hk Dk + Hv Dv)`` (q.k once
  per key head -- the per-value-head temperature is a scalar scale -- and A.V
  per value head), attention ``4 l^2 Hq hd``; plus the memory-unit logit
  ``<q, w_mem>`` and the weighted add of ``m``, ``2 * d`` each per token per
  head. No bytes: block activations stay on chip.

Assumptions, stated once: a fused kernel reads each layer's state once and
writes it once per forward (the commit chunks and the block share one load);
activations between ops (a few MB per forward) and elementwise activations,
softmax exponentials and gates (< 1 % of the FLOPs) are not counted; the small
fp32 parameters (A_log, dt_bias, ...) are counted at ``wb`` bytes (a few KB).

Reference numbers (what the tests pin)
--------------------------------------
`active_params_per_token` = mixers + norms + router + shared expert + top-k
experts per layer + LM head (the embedding contributes one row, 2048 params,
and is left out). For ``clover-35b-a3b``: 2,946,677,448, i.e. **2.95B**.

`ar_step_cost` is the autoregressive baseline: one token through those
weights, **5.89 GB** in BF16 (the active parameters times 2 bytes, plus one
4 KB embedding row), so a 3.35 TB/s device is bound at **568 tokens/s** (the
write-ups round the bytes to 6 GB and quote 555). The baseline leaves out state
traffic on purpose: an AR Qwen3.5 model's per-token cache traffic (the GDN
states, 126 MB per token read+written, and a KV cache growing with context)
depends on the context and is left out of this baseline;
``include_state=True`` adds Clover's own state read+write of a one-token
commit (+139 MB, 6.03 GB).

A 32-token block-diffusion forward whose union is 32 experts per layer (4x a
single token's 8) reads **2.02x** the AR weight bytes (2.04x with its 70 MB
state read). The "1.4x" quoted in write-ups corresponds to a union of only
**~17** experts per layer (`union_for_bytes_ratio`). Independent top-8-of-256
routing would give ``E * (1 - (1 - k/E)^T)`` = 163.3 distinct experts for 32
tokens (`expected_union`); real routing within one text is correlated and
lower -- which is what the measured union shows.

Wing: ``cost``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from clover_engine.backbones.base import COST_FAMILIES, Capabilities, cost_family_of
from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.cost.components import (COMPONENTS, DENSE_COMPONENTS, DENSE_WEIGHT_COMPONENTS, NORM_FLOPS_PER_ELEMENT,
                                    WEIGHT_COMPONENTS, ForwardCost, check_token_counts)
from clover_engine.cost.dense import dense_forward_cost, recompute_forward_cost

__all__ = [  # the names of `clover_engine.cost.components` stay importable from here, where they were defined
    "COMPONENTS", "COST_FAMILIES", "DENSE_COMPONENTS", "DENSE_WEIGHT_COMPONENTS", "MEMORY_MODES",
    "NORM_FLOPS_PER_ELEMENT", "STATE_BYTES", "UNION_ASSUMPTIONS", "WEIGHT_COMPONENTS", "ForwardCost",
    "active_params_per_token", "ar_step_cost", "check_token_counts", "cost_family", "expected_union",
    "forced_fill_probability", "forced_fill_table", "forward_cost", "param_counts", "union_for_bytes_ratio",
]

MEMORY_MODES = ("state", "state+window")
UNION_ASSUMPTIONS = ("measured_fraction", "measured_vs_independent", "independent")

STATE_BYTES = 4  # recurrent states S are fp32 (docs/architecture.md §3)


def cost_family(config: Any, capabilities: Capabilities | Mapping[str, Any] | None = None) -> str:
    """Which formulas price ``config``'s forwards: one of `COST_FAMILIES`.

    From the backbone's capabilities when given (a `Capabilities`, or its record
    ``trace.meta["capabilities"]``), else from the model config's own fields, as
    `clover_engine.backbones.base.cost_family_of` reads a trace recorded before capabilities existed.
    ``config`` is a config object, its ``to_dict()``, or a Clover preset name / JSON (``clover``).
    """
    record = capabilities.to_dict() if isinstance(capabilities, Capabilities) else capabilities
    if isinstance(config, Mapping):
        fields: Mapping[str, Any] | None = config
    elif isinstance(config, str):
        fields = None  # a preset name or a config.json: a Clover config
    else:
        try:
            fields = vars(config)  # a dataclass config's fields, without copying them (priced per forward)
        except TypeError:  # no __dict__ (slots)
            fields = config.to_dict() if callable(getattr(config, "to_dict", None)) else None
    return cost_family_of(record, fields)


def _as_config(config: CloverConfig | str) -> CloverConfig:
    if isinstance(config, CloverConfig):
        return config
    if isinstance(config, str):
        if config.lstrip().startswith("{") or config.endswith(".json"):
            return CloverConfig.from_json(config)
        return CloverConfig.from_name(config)
    raise TypeError(f"config must be a CloverConfig or a preset name, got {type(config).__name__}")


# ------------------------------------------------------------------------ parameters
def param_counts(config: CloverConfig | str) -> dict[str, int]:
    """Parameter counts per piece of the model (shapes in the module docstring).

    Returns:
        ``gdn_mixer`` / ``attention_mixer``: one layer's mixer without its
        RMSNorm weights; ``gdn_matmul`` / ``attention_matmul``: the projection
        weights among them (the FLOP-carrying part); ``conv``: GDN conv1d
        weights; ``attention_conv``: the optional attention q/k/v conv1d
        weights (``attention_conv_kernel_dim``); ``norms``: all RMSNorm weights
        of the model; ``router``, ``expert``, ``shared_expert`` (gate row
        included): one layer's;
        ``embedding``, ``lm_head``; ``total``: every parameter.
    """
    cfg = _as_config(config)
    H = cfg.hidden_size
    Hk, Hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    Dk, Dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    Hq, Hkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    channels = 2 * Hk * Dk + Hv * Dv
    # GDN: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj.
    gdn_matmul = channels * H + Hv * Dv * H + 2 * Hv * H + H * Hv * Dv
    conv = channels * cfg.linear_conv_kernel_dim
    # A_log, dt_bias, block temperature (per value head, as clover_engine.backbones.clover.model), w_mem, b_mem.
    gdn_small = Hv + Hv + Hv + Hv * Dk + Hv
    # Attention: q_proj (query + gate), k_proj, v_proj, o_proj, mem_a, mem_b.
    attn_matmul = 2 * Hq * hd * H + 2 * Hkv * hd * H + H * Hq * hd + 2 * Hkv * H
    # mem_A_log, mem_dt_bias, w_mem, b_mem.
    attn_small = Hkv + Hkv + Hq * hd + Hq
    # Optional Primer-style depthwise conv on q/k/v (config.attention_conv_kernel_dim, 0 = none).
    attn_conv = (Hq + 2 * Hkv) * hd * cfg.attention_conv_kernel_dim
    norms = (
        2 * H * cfg.num_hidden_layers  # input + post-attention RMSNorm
        + H  # final norm
        + Dv * cfg.num_linear_layers  # GDN gated output norm
        + 2 * hd * cfg.num_full_layers  # q_norm, k_norm
    )
    expert = 3 * cfg.moe_intermediate_size * H  # gate_up [2F, H] + down [H, F]
    shared = 3 * cfg.shared_expert_intermediate_size * H + H  # + shared gate [1, H]
    router = cfg.num_experts * H
    counts = {
        "gdn_matmul": gdn_matmul,
        "conv": conv,
        "gdn_mixer": gdn_matmul + conv + gdn_small,
        "attention_matmul": attn_matmul,
        "attention_conv": attn_conv,
        "attention_mixer": attn_matmul + attn_conv + attn_small,
        "norms": norms,
        "router": router,
        "expert": expert,
        "shared_expert": shared,
        "embedding": cfg.vocab_size * H,
        "lm_head": 0 if cfg.tie_word_embeddings else cfg.vocab_size * H,
    }
    counts["total"] = (
        counts["gdn_mixer"] * cfg.num_linear_layers
        + counts["attention_mixer"] * cfg.num_full_layers
        + norms
        + (router + shared + cfg.num_experts * expert) * cfg.num_hidden_layers
        + counts["embedding"]
        + counts["lm_head"]
    )
    return counts


def active_params_per_token(config: CloverConfig | str) -> int:
    """Parameters one token touches: the "A3B" of 35B-A3B.

    ``mixers + norms + routers + shared experts + top_k experts per layer +
    LM head``; the embedding row (H parameters) is left out, as is usual for
    the "active parameters" of an MoE model card. For ``clover-35b-a3b``:
    2,946,677,448 (2.95B). With tied embeddings the LM head is the embedding
    matrix and is counted once.
    """
    cfg = _as_config(config)
    c = param_counts(cfg)
    lm_head = c["lm_head"] or c["embedding"]
    return int(
        c["gdn_mixer"] * cfg.num_linear_layers
        + c["attention_mixer"] * cfg.num_full_layers
        + c["norms"]
        + (c["router"] + c["shared_expert"] + cfg.num_experts_per_tok * c["expert"]) * cfg.num_hidden_layers
        + lm_head
    )


# ----------------------------------------------------------------------- forward cost
def _union_per_layer(config: CloverConfig, expert_union: Any, n_tokens: int) -> np.ndarray:
    N, E, k = config.num_hidden_layers, config.num_experts, config.num_experts_per_tok
    if isinstance(expert_union, (int, float, np.integer, np.floating)):
        u = np.full(N, float(expert_union))
    else:
        try:
            u = np.asarray(expert_union, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise TypeError(
                f"expert_union must be a number or a sequence of {N} per-layer numbers, "
                f"got {type(expert_union).__name__}"
            ) from None
        if u.size == 1:  # a 0-d array or tensor: the same union for every layer
            u = np.full(N, float(u[0]))
        if u.shape != (N,):
            raise ValueError(
                f"expert_union has {u.size} entries but {config.name!r} has {N} MoE layers; "
                "give one union per layer (or a single number for all)"
            )
    hi = min(E, n_tokens * k)
    bad = (u < 0) | (u > hi + 1e-9) | ~np.isfinite(u)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"expert_union[{i}] = {u[i]:g} is outside [0, {hi}] (num_experts={E}, "
            f"{n_tokens} tokens x top-{k}); a layer's union is the count of distinct routed experts"
        )
    return u


def _segment_lengths(n_commit: int, commit_block_len: int, block_len: int) -> list[int]:
    segs = [min(commit_block_len, n_commit - s) for s in range(0, n_commit, commit_block_len)]
    return segs + ([block_len] if block_len else [])


def forward_cost(
    config: CloverConfig | str,
    n_tokens: int,
    expert_union: float | Sequence[float] | np.ndarray,
    weight_bytes: float = 2,
    n_commit_tokens: int = 0,
    block_len: int | None = None,
    memory_mode: str = "state",
    window: int = 0,
    *,
    commit_block_len: int | None = None,
    act_bytes: float = 2,
    state_bytes: float = STATE_BYTES,
    include_state: bool = True,
    context_len: int = 0,
    capabilities: Capabilities | Mapping[str, Any] | None = None,
) -> ForwardCost:
    """Bytes read and FLOPs of one forward (formulas: module docstring; docs/architecture.md §7).

    The formulas are those of the model's cost family (`cost_family`): ``clover`` here,
    ``kv_cache`` `clover_engine.cost.dense.dense_forward_cost`, ``recompute``
    `clover_engine.cost.dense.recompute_forward_cost`.

    Args:
        config: the model (a `CloverConfig` or a preset name; for another cost family its
            config or ``to_dict()``).
        n_tokens: T, all tokens in the forward (committed + block slots).
        expert_union: distinct routed experts hit by the T tokens -- one number
            for every layer, or one per layer (the decoder's measured
            ``expert_union``). Floats are allowed (expected unions).
        weight_bytes: bytes per weight (2 = BF16, 1 = FP8, 4 = FP32).
        n_commit_tokens: C, the committed tokens at the front of the forward
            (the fused commit of the finished block; 0 otherwise).
        block_len: L, the current block's slots (those that get logits);
            default ``T - C``. ``C + L`` must equal ``T``.
        memory_mode: ``"state"`` (Clover) or ``"state+window"`` (attention
            layers also keep the K/V of the last W committed tokens).
        window: W for ``state+window``; 0 = ``config.attention_window``.
        commit_block_len: length of the commit chunks that attend within
            themselves (the decode's block_size); default L, or C when L = 0.
        act_bytes: bytes per activation element (conv tail, window K/V).
        state_bytes: bytes per recurrent-state element (fp32 = 4).
        include_state: count state (and window) traffic and the state FLOPs;
            False gives the weights-only accounting of write-ups.
        context_len: tokens already in a dense transformer's KV cache before
            this forward (`dense_forward_cost`); Clover ignores it (history is state).
        capabilities: the backbone's `Capabilities` or their record (``trace.meta["capabilities"]``),
            which name its cost family; None: read from the config (`cost_family`).

    Returns:
        A `ForwardCost`.

    Raises:
        ValueError: on token counts that do not add up, a union outside
            ``[0, min(E, T * k)]`` or with the wrong number of layers, an
            unknown memory mode, or ``state+window`` without a window.
        TypeError: on a config or union of the wrong type.
    """
    family = cost_family(config, capabilities)
    if family == "kv_cache":
        return dense_forward_cost(config, n_tokens, weight_bytes, n_commit_tokens, block_len,
                                  context_len=context_len, act_bytes=act_bytes, include_kv=include_state,
                                  expert_union=expert_union)
    if family == "recompute":  # masked diffusion (clover_engine.backbones.masked_diffusion): no cache, full recompute
        tail = config.get("canvas_tail", 0) if isinstance(config, Mapping) else getattr(config, "canvas_tail", 0)
        return recompute_forward_cost(config, n_tokens, weight_bytes, n_commit_tokens, block_len,
                                      context_len=context_len, canvas_tail=int(tail or 0), act_bytes=act_bytes,
                                      expert_union=expert_union)
    cfg = _as_config(config)
    T, C, L = check_token_counts(n_tokens, n_commit_tokens, block_len)
    if weight_bytes <= 0 or act_bytes <= 0 or state_bytes <= 0:
        raise ValueError(
            f"weight_bytes, act_bytes, state_bytes must be > 0, got {weight_bytes}, {act_bytes}, {state_bytes}"
        )
    if memory_mode not in MEMORY_MODES:
        raise ValueError(f"memory_mode must be one of {MEMORY_MODES}, got {memory_mode!r}")
    W = 0
    if memory_mode == "state+window":
        W = int(window) or cfg.attention_window
        if W < 1:
            raise ValueError(
                f"memory_mode='state+window' needs a window: pass window=W > 0 "
                f"({cfg.name!r} has attention_window={cfg.attention_window})"
            )
    elif window:
        raise ValueError(f"window={window} applies only to memory_mode='state+window'")
    chunk = int(commit_block_len) if commit_block_len else (L if L else max(C, 1))
    if chunk < 1:
        raise ValueError(f"commit_block_len must be >= 1, got {commit_block_len}")
    union = _union_per_layer(cfg, expert_union, T)

    c = param_counts(cfg)
    H, V, k = cfg.hidden_size, cfg.vocab_size, cfg.num_experts_per_tok
    n_gdn, n_attn, N = cfg.num_linear_layers, cfg.num_full_layers, cfg.num_hidden_layers
    Hk, Hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    Dk, Dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    Hq, Hkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    channels = 2 * Hk * Dk + Hv * Dv
    wb = float(weight_bytes)

    b: dict[str, float] = dict.fromkeys(COMPONENTS, 0.0)
    f: dict[str, float] = dict.fromkeys(COMPONENTS, 0.0)

    # Weights.
    b["embedding"] = T * H * wb
    b["gdn_mixers"] = n_gdn * c["gdn_mixer"] * wb
    f["gdn_mixers"] = n_gdn * T * (2 * c["gdn_matmul"] + 2 * c["conv"])
    b["attention_mixers"] = n_attn * c["attention_mixer"] * wb
    f["attention_mixers"] = n_attn * T * (2 * c["attention_matmul"] + 2 * c["attention_conv"])
    final_norm = H if L else 0
    b["norms"] = (c["norms"] - H + final_norm) * wb
    normed_per_token = (
        2 * H * N + n_gdn * (Hv * Dv + 2 * Hk * Dk) + n_attn * (Hq * hd + Hkv * hd)
    )
    f["norms"] = NORM_FLOPS_PER_ELEMENT * (T * normed_per_token + L * H)
    b["routers"] = N * c["router"] * wb
    f["routers"] = N * T * 2 * c["router"]
    b["shared_experts"] = N * c["shared_expert"] * wb
    f["shared_experts"] = N * T * 2 * c["shared_expert"]
    b["routed_experts"] = float(union.sum()) * c["expert"] * wb
    f["routed_experts"] = N * T * k * 2 * c["expert"]
    lm_head = c["lm_head"] or c["embedding"]
    b["lm_head"] = lm_head * wb if L else 0.0
    f["lm_head"] = 2 * L * V * H

    # History: recurrent state (and window K/V).
    if include_state:
        gdn_state = Hv * Dk * Dv * state_bytes + (cfg.linear_conv_kernel_dim - 1) * channels * act_bytes
        attn_state = Hkv * hd * hd * state_bytes
        if cfg.attention_conv_kernel_dim:
            attn_state += (cfg.attention_conv_kernel_dim - 1) * (Hq + 2 * Hkv) * hd * act_bytes
        state_bytes_total = n_gdn * gdn_state + n_attn * attn_state
        b["state_read"] = state_bytes_total
        f["state_read"] = T * (n_gdn * 2 * Hv * Dk * Dv + n_attn * 2 * Hq * hd * hd)
        if C:
            b["state_write"] = state_bytes_total
            f["state_write"] = C * (n_gdn * 5 * Hv * Dk * Dv + n_attn * 5 * Hkv * hd * hd)
        if W:
            b["window_kv"] = n_attn * 2 * Hkv * hd * act_bytes * (W + min(C, W))
            f["window_kv"] = n_attn * T * 4 * Hq * hd * W

    # In-block bidirectional attention + memory unit logit and mix.
    sq = sum(l * l for l in _segment_lengths(C, chunk, L))
    f["block_attention"] = (
        n_gdn * (2 * sq * (Hk * Dk + Hv * Dv) + T * Hv * (2 * Dk + 2 * Dv))
        + n_attn * (4 * sq * Hq * hd + T * Hq * 4 * hd)
    )

    total_b = float(sum(b.values()))
    total_f = float(sum(f.values()))
    return ForwardCost(
        bytes_read=total_b,
        flops=total_f,
        arithmetic_intensity=total_f / total_b,
        bytes_by_component={key: float(v) for key, v in b.items()},
        flops_by_component={key: float(v) for key, v in f.items()},
        n_tokens=T,
        n_commit_tokens=C,
        block_len=L,
        mean_expert_union=float(union.mean()),
    )


def ar_step_cost(config: CloverConfig | str, weight_bytes: float = 2, include_state: bool = False) -> ForwardCost:
    """The autoregressive baseline: one token, top-k experts per layer.

    Weights only by default (the write-ups' accounting, see the module docstring):
    for ``clover-35b-a3b`` in BF16, 5,893,358,992 bytes (5.89 GB), 568 tokens/s
    at 3.35 TB/s. ``include_state=True`` adds Clover's block-size-1 state
    traffic (read + write of every layer's state for a one-token commit).
    """
    cfg = _as_config(config)
    k = cfg.num_experts_per_tok
    fc = forward_cost(cfg, 1, k, weight_bytes, include_state=include_state)
    if not include_state:
        return fc
    # The token is also folded into the state (read + write, as a recurrent AR
    # step does); take the write side from a commit-only forward of that token.
    commit = forward_cost(cfg, 1, k, weight_bytes, n_commit_tokens=1, block_len=0)
    b = dict(fc.bytes_by_component, state_write=commit.bytes_by_component["state_write"])
    f = dict(fc.flops_by_component, state_write=commit.flops_by_component["state_write"])
    total_b, total_f = float(sum(b.values())), float(sum(f.values()))
    return ForwardCost(total_b, total_f, total_f / total_b, b, f, 1, 0, 1, float(k))


# ------------------------------------------------------------------ union arithmetic
def expected_union(num_experts: int, top_k: int, n_tokens: int | float) -> float:
    """Expected distinct experts hit by ``n_tokens`` tokens under independent uniform routing.

    ``E * (1 - (1 - k/E)^T)``: each expert is missed by one token with
    probability ``1 - k/E`` (k distinct of E, uniform), by T independent
    tokens with ``(1 - k/E)^T`` (the occupancy expectation). 256 / top-8:
    57.4 (T=8), 102.0 (16), 163.3 (32), 222.4 (64). Real routing within one
    text is correlated, so measured unions are lower.

    Raises:
        ValueError: if ``top_k`` is not in ``[1, num_experts]`` or ``n_tokens < 0``.
    """
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    return float(num_experts * (1.0 - (1.0 - top_k / num_experts) ** n_tokens))


def union_for_bytes_ratio(
    config: CloverConfig | str, ratio: float, n_tokens: int = 32, weight_bytes: float = 2
) -> float:
    """Expert union per layer at which an ``n_tokens`` forward reads ``ratio`` x the AR bytes.

    Weights only on both sides (the write-ups' accounting): bytes grow linearly
    with the union, ``bytes(u) = dense + u * N * expert_bytes``, so
    ``u = (ratio * ar_bytes - dense) / (N * expert_bytes)``. For
    ``clover-35b-a3b`` and 32 tokens the write-ups' 1.4x is u = 17.4; the
    union 32 (4x one token's 8) gives 2.02x.

    Raises:
        ValueError: if the ratio is below what the dense weights alone cost
            (the answer would be negative) -- the message gives that floor.
    """
    cfg = _as_config(config)
    ar = ar_step_cost(cfg, weight_bytes).weights_bytes_read
    zero = forward_cost(cfg, n_tokens, 0, weight_bytes, include_state=False).weights_bytes_read
    per_expert = cfg.num_hidden_layers * param_counts(cfg)["expert"] * weight_bytes
    u = (ratio * ar - zero) / per_expert
    if u < 0:
        raise ValueError(
            f"ratio {ratio} is below the dense floor {zero / ar:.3f} (union 0) of an {n_tokens}-token forward"
        )
    return float(u)


def forced_fill_probability(p: float, block: int = 32) -> float:
    """Probability that no slot of a ``block`` passes the threshold: ``(1 - p)^block``.

    The forced-fill table: if each masked slot independently passes the
    confidence threshold with probability p, an iteration writes nothing on
    its own (and the decoder forces one slot, docs/architecture.md §5 rule 4) with
    this probability. p = 0.05 / 0.1 / 0.2 / 0.5 at 32 slots: 0.194, 0.0343,
    7.9e-4, 2.3e-10.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be a probability in [0, 1], got {p}")
    if block < 0:
        raise ValueError(f"block must be >= 0, got {block}")
    return float((1.0 - p) ** block)


def forced_fill_table(ps: Sequence[float] = (0.05, 0.1, 0.2, 0.5), block: int = 32) -> dict[float, float]:
    """``{p: (1 - p)^block}`` for each p (see `forced_fill_probability`)."""
    return {float(p): forced_fill_probability(p, block) for p in ps}
