"""Cost model: bytes read and FLOPs of one Clover forward, rooflines, projected tokens/s.

Decoding one request is bound by the bytes read from device memory, not by
arithmetic: every forward streams the weights it touches once. Block
diffusion reuses each byte for several tokens; MoE routing of a whole block
widens the set of experts that must be read (DESIGN.md section 6). This module
makes that arithmetic exact per forward, from the config and the measured
expert union, and projects it onto a device with a roofline
(Williams, Waterman & Patterson, "Roofline", CACM 2009):
``time = max(bytes / bandwidth, flops / peak)``.

Everything here is a pure function of its arguments except
`measure_this_machine` (a < 2 s probe, cached on disk).

What a forward reads (`forward_cost`)
-------------------------------------
A forward pushes T tokens through every layer: the C committed tokens of the
finished block (the fused commit, DESIGN.md section 3) followed by the L slots
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
  (DESIGN.md section 3; O(Dv) gate terms dropped).
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

The seed's numbers (what the tests pin)
---------------------------------------
`active_params_per_token` = mixers + norms + router + shared expert + top-k
experts per layer + LM head (the embedding contributes one row, 2048 params,
and is left out). For ``clover-35b-a3b``: 2,946,677,448, i.e. **2.95B**.

`ar_step_cost` is the seed's autoregressive baseline: one token through those
weights, **5.89 GB** in BF16 (the active parameters times 2 bytes, plus one
4 KB embedding row), so a 3.35 TB/s device is bound at **568 tokens/s** (the
seed rounds the bytes to 6 GB and quotes 555). The baseline leaves out state
traffic on purpose: an AR Qwen3.5 model's per-token cache traffic (the GDN
states, 126 MB per token read+written, and a KV cache growing with context)
depends on the context and is not in the seed's arithmetic;
``include_state=True`` adds Clover's own state read+write of a one-token
commit (+139 MB, 6.03 GB).

A 32-token block-diffusion forward whose union is 32 experts per layer (4x a
single token's 8) reads **2.02x** the AR weight bytes (2.04x with its 70 MB
state read). The "1.4x" quoted in write-ups corresponds to a union of only
**~17** experts per layer (`union_for_bytes_ratio`). Independent top-8-of-256
routing would give ``E * (1 - (1 - k/E)^T)`` = 163.3 distinct experts for 32
tokens (`expected_union`); real routing within one text is correlated and
lower -- which is what the measured union shows.

Devices (`DEVICES`)
-------------------
Dense (no 2:4 sparsity) BF16 tensor-core peaks and memory bandwidth from
NVIDIA's datasheets; each `Device` carries its source. ``this-machine`` is
measured (`measure_this_machine`): a streaming read of a large fp32 tensor
and an fp32 ``torch.matmul`` on the CPU.

CLI::

    python -m engine.cost --config clover-35b-a3b --device h800 --tokens 32 --union 32
    python -m engine.cost --list-devices
    python -m engine.cost --trace runs/example.parquet --device h800

Tests: ``.venv/bin/python -m pytest tests/engine/test_cost.py -q``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.config import CloverConfig

# Component keys, in display order. The first eight are weights.
WEIGHT_COMPONENTS = (
    "embedding",
    "gdn_mixers",
    "attention_mixers",
    "norms",
    "routers",
    "shared_experts",
    "routed_experts",
    "lm_head",
)
COMPONENTS = WEIGHT_COMPONENTS + ("state_read", "state_write", "window_kv", "block_attention")
MEMORY_MODES = ("state", "state+window")
UNION_ASSUMPTIONS = ("measured_fraction", "measured_vs_independent", "independent")

STATE_BYTES = 4  # recurrent states S are fp32 (DESIGN.md section 3)
NORM_FLOPS_PER_ELEMENT = 4  # square, sum, scale, weight


# ----------------------------------------------------------------------------- helpers
def _as_config(config: CloverConfig | str) -> CloverConfig:
    if isinstance(config, CloverConfig):
        return config
    if isinstance(config, str):
        if config.lstrip().startswith("{") or config.endswith(".json"):
            return CloverConfig.from_json(config)
        return CloverConfig.from_name(config)
    raise TypeError(f"config must be a CloverConfig or a preset name, got {type(config).__name__}")


def _fmt_si(x: float, unit: str) -> str:
    """``12.0 GB``, ``196.5 GFLOP``: decimal SI prefixes, 4 significant digits."""
    if x == 0:
        return f"0 {unit}"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:#.4g}".rstrip(".") + f" {prefix}{unit}"
    return f"{x:#.4g}".rstrip(".") + f" {unit}"


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
    # A_log, dt_bias, block temperature (per value head, as engine.model), w_mem, b_mem.
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
@dataclass(frozen=True)
class ForwardCost:
    """Bytes read and FLOPs of one forward, with the breakdown behind them.

    Attributes:
        bytes_read: total bytes read from and written to device memory
            (weights, embedding rows, state read/write, window K/V).
        flops: total floating-point operations (a multiply-add = 2).
        arithmetic_intensity: ``flops / bytes_read`` (FLOP per byte).
        bytes_by_component, flops_by_component: one entry per key of
            `COMPONENTS` (zeros included, so tables line up).
        n_tokens, n_commit_tokens, block_len: the forward's T, C and L.
        mean_expert_union: the expert union averaged over MoE layers.
    """

    bytes_read: float
    flops: float
    arithmetic_intensity: float
    bytes_by_component: dict[str, float]
    flops_by_component: dict[str, float]
    n_tokens: int = 0
    n_commit_tokens: int = 0
    block_len: int = 0
    mean_expert_union: float = 0.0

    @property
    def weights_bytes_read(self) -> float:
        """Bytes of weights alone (the seed's accounting): the `WEIGHT_COMPONENTS` (and a dense model's ``mlp``)."""
        return float(sum(v for k, v in self.bytes_by_component.items()
                         if k in WEIGHT_COMPONENTS or k in DENSE_WEIGHT_COMPONENTS))

    def roofline_time_s(self, device: "Device | str") -> float:
        """`roofline_time_s` of this forward on ``device``."""
        return roofline_time_s(self.bytes_read, self.flops, device)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
) -> ForwardCost:
    """Bytes read and FLOPs of one forward (formulas: module docstring; DESIGN.md section 6).

    Args:
        config: the model (a `CloverConfig` or a preset name).
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
            False gives the weights-only accounting of the seed.
        context_len: tokens already in a dense transformer's KV cache before
            this forward (`dense_forward_cost`); Clover ignores it (history is state).

    Returns:
        A `ForwardCost`.

    Raises:
        ValueError: on token counts that do not add up, a union outside
            ``[0, min(E, T * k)]`` or with the wrong number of layers, an
            unknown memory mode, or ``state+window`` without a window.
        TypeError: on a config or union of the wrong type.
    """
    if _is_dense(config):
        return dense_forward_cost(config, n_tokens, weight_bytes, n_commit_tokens, block_len,
                                  context_len=context_len, act_bytes=act_bytes, include_kv=include_state)
    cfg = _as_config(config)
    T, C = int(n_tokens), int(n_commit_tokens)
    if T < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    if not 0 <= C <= T:
        raise ValueError(f"n_commit_tokens must be in [0, n_tokens={T}], got {n_commit_tokens}")
    L = T - C if block_len is None else int(block_len)
    if L < 0 or C + L != T:
        raise ValueError(
            f"n_commit_tokens ({C}) + block_len ({block_len}) must equal n_tokens ({T}); "
            "n_tokens counts the committed tokens and the block slots together"
        )
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
    H, V, E, k = cfg.hidden_size, cfg.vocab_size, cfg.num_experts, cfg.num_experts_per_tok
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
    """The seed's autoregressive baseline: one token, top-k experts per layer.

    Weights only by default (the seed's accounting, see the module docstring):
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
    tokens with ``(1 - k/E)^T`` (NOTES.md, "MoE expert union"). 256 / top-8:
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

    Weights only on both sides (the seed's accounting): bytes grow linearly
    with the union, ``bytes(u) = dense + u * N * expert_bytes``, so
    ``u = (ratio * ar_bytes - dense) / (N * expert_bytes)``. For
    ``clover-35b-a3b`` and 32 tokens the write-ups' 1.4x is u = 17.4; the
    union 32 of the seed's example gives 2.02x.

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

    The seed's forced-fill table: if each masked slot independently passes the
    confidence threshold with probability p, an iteration writes nothing on
    its own (and the decoder forces one slot, DESIGN.md section 4 rule 4) with
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


# --------------------------------------------------------------------------- devices
@dataclass(frozen=True)
class Device:
    """A device for the roofline.

    Attributes:
        name: table key (``h800`` ...) or ``this-machine``.
        bandwidth_bytes_per_s: peak memory bandwidth, bytes per second.
        peak_bf16_flops: dense BF16 tensor-core peak, FLOP per second (for
            ``this-machine``: measured fp32 matmul throughput).
        source: where the two numbers come from.
    """

    name: str
    bandwidth_bytes_per_s: float
    peak_bf16_flops: float
    source: str


DEFAULT_DEVICE = "h800"

DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device(
            "h800", 3.35e12, 989.4e12,
            "NVIDIA H800 SXM5 datasheet: 80 GB HBM3, 3.35 TB/s; BF16 tensor 1,979 TFLOPS with "
            "2:4 sparsity -> 989.4 dense (same SM configuration as H100 SXM)",
        ),
        Device(
            "h100-sxm", 3.35e12, 989.4e12,
            "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 80 GB HBM3, 3.35 TB/s; BF16 tensor "
            "1,979 TFLOPS with sparsity -> 989.4 dense",
        ),
        Device(
            "h200", 4.8e12, 989.4e12,
            "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: 141 GB HBM3e, 4.8 TB/s; BF16 tensor "
            "1,979 TFLOPS with sparsity -> 989.4 dense",
        ),
        Device(
            "a100-80gb", 2.039e12, 312e12,
            "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: HBM2e 2,039 GB/s; BF16 tensor "
            "312 TFLOPS dense (624 with sparsity)",
        ),
        Device(
            "b200", 8.0e12, 2.25e15,
            "NVIDIA B200 (Blackwell) specifications: HBM3e 8 TB/s (HGX B200 datasheet lists 7.7 TB/s "
            "for the 180 GB part); HGX B200 FP16/BF16 tensor 4.5 PFLOPS with sparsity -> 2.25 dense",
        ),
        Device(
            "rtx-4090", 1.008e12, 165.2e12,
            "NVIDIA Ada Lovelace architecture whitepaper, appendix A, GeForce RTX 4090: GDDR6X "
            "21 Gbps x 384-bit = 1,008 GB/s; peak BF16 tensor with FP32 accumulate 165.2 TFLOPS "
            "dense (330.4 sparse). BF16 always accumulates in FP32 (FP16 with FP16 accumulate is "
            "330.3 dense; 82.6 is the non-tensor FP32 rate)",
        ),
    )
}


def _default_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clover-explorer" / "this-machine.json"


def measure_this_machine(
    cache_path: str | Path | None = None,
    *,
    size_bytes: int = 64 * 2**20,
    matmul_n: int = 512,
    refresh: bool = False,
    budget_s: float = 0.8,
) -> Device:
    """Measure this machine's memory bandwidth and matmul throughput once, and cache them.

    Probe (about 1 s with the defaults, plus importing torch): bandwidth = the best over repeats of
    ``x.sum()`` (bytes read) and ``y.copy_(x)`` (read + write) on an fp32
    tensor of ``size_bytes`` (larger than a CPU's last-level cache); throughput =
    the best ``2 n^3 / t`` of an fp32 ``torch.matmul`` of two ``n x n``
    matrices. Each probe repeats for about ``budget_s / 2``. The result is
    written as JSON to ``cache_path`` (default
    ``$XDG_CACHE_HOME/clover-explorer/this-machine.json``, i.e. under
    ``~/.cache``) and reused while the probe settings and torch thread count
    match; ``refresh=True`` measures again.

    Returns:
        ``Device("this-machine", ...)`` -- its ``peak_bf16_flops`` holds the
        measured fp32 matmul rate (a CPU's usable matmul peak).
    """
    import torch  # local: the rest of the cost model needs no torch

    path = Path(cache_path) if cache_path is not None else _default_cache_path()
    settings = {"size_bytes": int(size_bytes), "matmul_n": int(matmul_n), "threads": torch.get_num_threads()}
    if not refresh and path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.get("settings") == settings and data["bandwidth_bytes_per_s"] > 0 and data["peak_flops"] > 0:
                return Device("this-machine", float(data["bandwidth_bytes_per_s"]), float(data["peak_flops"]),
                              data["source"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable cache: measure again

    def best_time(fn: Any, seconds: float) -> float:
        fn()  # warm-up
        best, end = math.inf, time.perf_counter() + seconds
        reps = 0
        while reps < 5 or time.perf_counter() < end:
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
            reps += 1
            if reps >= 500:
                break
        return max(best, 1e-9)

    n = max(int(size_bytes) // 4, 1024)
    x = torch.ones(n, dtype=torch.float32)
    y = torch.empty_like(x)
    t_sum = best_time(lambda: x.sum(), budget_s / 4)
    t_copy = best_time(lambda: y.copy_(x), budget_s / 4)
    bandwidth = max(4 * n / t_sum, 8 * n / t_copy)
    del x, y
    m = max(int(matmul_n), 16)
    a, bm = torch.randn(m, m), torch.randn(m, m)
    t_mm = best_time(lambda: torch.matmul(a, bm), budget_s / 2)
    peak = 2 * m**3 / t_mm
    source = (
        f"measured by engine.cost.measure_this_machine on {platform.node() or 'this host'} "
        f"({platform.processor() or platform.machine()}, {settings['threads']} torch threads), "
        f"{time.strftime('%Y-%m-%d')}: best of x.sum()/y.copy_(x) over a {size_bytes / 2**20:.0f} MiB "
        f"fp32 tensor; fp32 torch.matmul {m}x{m}"
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(
            {"bandwidth_bytes_per_s": bandwidth, "peak_flops": peak, "source": source, "settings": settings},
            indent=2,
        ))
    except OSError:
        pass  # a read-only home is not an error; the numbers are still returned
    return Device("this-machine", float(bandwidth), float(peak), source)


def get_device(device: "Device | str") -> Device:
    """A `Device` from the table by name (case-insensitive), ``this-machine``, or a `Device` as is.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if isinstance(device, Device):
        return device
    name = str(device).strip().lower()
    if name in DEVICES:
        return DEVICES[name]
    if name in ("this-machine", "this", "cpu", "this-cpu"):
        return measure_this_machine()
    raise ValueError(f"unknown device {device!r}; known: {', '.join(DEVICES)}, this-machine")


def roofline_time_s(bytes_read: float, flops: float, device: Device | str) -> float:
    """Roofline lower bound on the time of a kernel: ``max(bytes / BW, flops / peak)``.

    Williams, Waterman & Patterson, "Roofline: an insightful visual performance
    model for multicore architectures", CACM 52(4), 2009.
    """
    d = get_device(device)
    return max(bytes_read / d.bandwidth_bytes_per_s, flops / d.peak_bf16_flops)


def ridge_point(device: Device | str) -> float:
    """Arithmetic intensity (FLOP/byte) where the roofline turns: ``peak / BW``.

    Below it a forward is bandwidth bound (H800: 295 FLOP/byte; a 32-token
    Clover forward sits near 16).
    """
    d = get_device(device)
    return d.peak_bf16_flops / d.bandwidth_bytes_per_s


# ------------------------------------------------------------------------ projection
@dataclass(frozen=True)
class Projection:
    """Projected cost of a sequence of forwards on one device (labelled "projected").

    Attributes:
        config_name: the model configuration projected.
        device: the device name.
        n_forwards: forwards summed.
        tokens_written: tokens finalised by them.
        bytes_read, flops: totals over the forwards.
        time_s: sum of each forward's roofline time (forwards run one after another).
        tok_per_s: ``tokens_written / time_s``.
        mean_expert_union: union per layer averaged over layers and forwards.
    """

    config_name: str
    device: str
    n_forwards: int
    tokens_written: int
    bytes_read: float
    flops: float
    time_s: float
    tok_per_s: float
    mean_expert_union: float


def _forward_tuple(fw: Any) -> tuple[int, Any, int, int | None]:
    if isinstance(fw, Mapping):
        n = int(fw["n_tokens"])
        return n, fw["expert_union"], int(fw.get("n_commit", fw.get("n_commit_tokens", 0))), fw.get("block_len")
    n, union, *rest = fw
    n_commit = int(rest[0]) if rest else 0
    block_len = rest[1] if len(rest) > 1 else None
    return int(n), union, n_commit, block_len


def project_forwards(
    tokens_written: int,
    forwards: Sequence[Any],
    config: CloverConfig | str,
    device: Device | str,
    weight_bytes: float = 2,
    **forward_kwargs: Any,
) -> Projection:
    """Total bytes, FLOPs and roofline time of ``forwards``, and the tokens/s they give.

    Args:
        tokens_written: tokens finalised over all the forwards.
        forwards: one ``(n_tokens, expert_union, n_commit, block_len)`` tuple
            (or mapping with those keys) per forward; ``expert_union`` a number
            or per-layer sequence; ``n_commit`` and ``block_len`` may be left off.
        config, device, weight_bytes: as in `forward_cost` / `get_device`.
        **forward_kwargs: passed on to `forward_cost` (``memory_mode``,
            ``window``, ``commit_block_len`` ...).

    Raises:
        ValueError: for an empty list of forwards or a forward `forward_cost` refuses.
    """
    cfg = _as_config(config)
    dev = get_device(device)
    if not forwards:
        raise ValueError("no forwards to project")
    total_b = total_f = total_t = union_sum = 0.0
    for fw in forwards:
        n, union, n_commit, block_len = _forward_tuple(fw)
        fc = forward_cost(cfg, n, union, weight_bytes, n_commit, block_len, **forward_kwargs)
        total_b += fc.bytes_read
        total_f += fc.flops
        total_t += fc.roofline_time_s(dev)
        union_sum += fc.mean_expert_union
    return Projection(
        config_name=cfg.name,
        device=dev.name,
        n_forwards=len(forwards),
        tokens_written=int(tokens_written),
        bytes_read=total_b,
        flops=total_f,
        time_s=total_t,
        tok_per_s=tokens_written / total_t,
        mean_expert_union=union_sum / len(forwards),
    )


def project_tokens_per_s(
    tokens_written: int,
    forwards: Sequence[Any],
    config: CloverConfig | str,
    device: Device | str,
    weight_bytes: float = 2,
    **forward_kwargs: Any,
) -> float:
    """Projected tokens/s: ``tokens_written / sum(roofline_time_s(forward))`` (see `project_forwards`)."""
    return project_forwards(tokens_written, forwards, config, device, weight_bytes, **forward_kwargs).tok_per_s


@dataclass(frozen=True)
class TraceProjection:
    """Measured tokens/s of a recorded run beside its projections on a device.

    Attributes:
        device: the device projected onto.
        union_assumption: how the target's expert union was chosen.
        n_forwards, tokens_written: from the trace (decode forwards only).
        tokens_per_forward: ``tokens_written / n_forwards``.
        measured_wall_s: the run's wall time on the machine that recorded it
            (None if the trace has none); measured_tok_per_s likewise.
        source: projection of the model that produced the trace, with its own
            measured unions (None when its config is unknown).
        target: projection of ``target_config`` (default ``clover-35b-a3b``)
            at the same tokens per forward.
    """

    device: str
    union_assumption: str
    n_forwards: int
    tokens_written: int
    tokens_per_forward: float
    measured_wall_s: float | None
    measured_tok_per_s: float | None
    source: Projection | None
    target: Projection


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _to_list(col: Any) -> list[Any]:
    if hasattr(col, "to_pylist"):
        return col.to_pylist()
    if hasattr(col, "tolist") and not isinstance(col, np.ndarray):
        return col.tolist()
    return list(col)


def _step_rows(trace_like: Any) -> list[Any]:
    """Rows (mappings or objects) from a list, a trace with ``steps``, or a table of columns."""
    if isinstance(trace_like, (str, bytes, Path)):
        raise TypeError("project_trace takes a trace object or rows, not a path; load it with engine.trace.Trace.load")
    if isinstance(trace_like, Sequence):
        return list(trace_like)
    steps = getattr(trace_like, "steps", None)
    if steps is not None:
        steps = steps() if callable(steps) else steps
        return _step_rows(steps)
    try:
        n_col = trace_like["n_tokens_forward"]
    except (KeyError, TypeError, IndexError):
        n_col = getattr(trace_like, "n_tokens_forward", None)
        getter = lambda k: getattr(trace_like, k)  # noqa: E731
    else:
        getter = lambda k: trace_like[k]  # noqa: E731
    if n_col is None:
        raise TypeError(
            "project_trace needs per-step rows: a list of dicts (n_tokens_forward, expert_union, "
            "n_written, block_len), an object with .steps, or a table with those columns; "
            f"got {type(trace_like).__name__}"
        )
    cols = {"n_tokens_forward": _to_list(n_col)}
    optional = ("expert_union", "n_written", "block_len", "n_commit", "wall_s",
                "tokens", "accepted", "forced", "eos_filled")
    for name in optional:
        try:
            cols[name] = _to_list(getter(name))
        except (KeyError, AttributeError, TypeError):
            pass
    return [{k: v[i] for k, v in cols.items()} for i in range(len(cols["n_tokens_forward"]))]


def _row_fields(row: Any) -> tuple[int, np.ndarray, int, int, int]:
    """(n_tokens, union per layer, n_commit, block_len, n_written) of one step row."""
    n = int(_get(row, "n_tokens_forward"))
    union = np.asarray(_get(row, "expert_union"), dtype=np.float64).reshape(-1)
    block_len = _get(row, "block_len")
    if block_len is None:
        tokens = _get(row, "tokens")
        block_len = len(tokens) if tokens is not None else n
    block_len = int(block_len)
    n_commit = _get(row, "n_commit")
    n_commit = n - block_len if n_commit is None else int(n_commit)
    written = _get(row, "n_written")
    if written is None:
        parts = [_get(row, k) for k in ("accepted", "forced", "eos_filled")]
        if any(p is None for p in parts):
            raise ValueError("a step row needs n_written (or accepted/forced/eos_filled masks)")
        written = sum(int(np.sum(p)) for p in parts)
    return n, union, n_commit, block_len, int(written)


def _source_config(trace_like: Any) -> CloverConfig | None:
    for cand in (_get(trace_like, "config"), _get(_get(trace_like, "meta", {}) or {}, "model_config")):
        if isinstance(cand, CloverConfig):
            return cand
        if isinstance(cand, Mapping):
            try:
                return CloverConfig.from_dict(dict(cand))
            except (TypeError, ValueError):
                pass
    model_id = _get(trace_like, "model_id")
    if isinstance(model_id, str):
        try:
            return _as_config(Path(model_id) / "config.json" if Path(model_id).is_dir() else model_id)
        except (ValueError, TypeError, OSError):
            return None
    return None


def _measured_wall_s(trace_like: Any, rows: list[Any]) -> float | None:
    summary = _get(trace_like, "summary") if not isinstance(trace_like, Sequence) else None
    if callable(summary):
        summary = summary()
    wall = _get(summary, "wall_s") if summary is not None else None
    if wall is None:
        walls = [_get(r, "wall_s") for r in rows]
        wall = sum(walls) if walls and all(w is not None for w in walls) else None
    return float(wall) if wall is not None and wall > 0 else None


def target_union(
    union_assumption: str | int | float,
    n_tokens: int,
    measured: np.ndarray | None,
    source: CloverConfig | None,
    target: CloverConfig,
) -> float:
    """The target model's expert union per layer for one forward, under an assumption.

    * ``"measured_fraction"``: the measured fraction of the source's experts
      (mean over layers) carried over, ``union / E_src * E_tgt``. With few
      source experts this saturates (8 of 8 -> 256 of 256): a pessimistic bound.
    * ``"measured_vs_independent"``: the measured union relative to the
      independent expectation of the source, carried over to the target's
      independent expectation (how much routing correlation saves).
    * ``"independent"``: `expected_union` ``(E_tgt, k_tgt, n_tokens)``.
    * a number: that union.

    Always clipped to ``[k_tgt, min(E_tgt, n_tokens * k_tgt)]``.

    Raises:
        ValueError: for an unknown assumption, or a measured one without
            measured unions / source config.
    """
    E, k = target.num_experts, target.num_experts_per_tok
    if isinstance(union_assumption, (int, float, np.integer, np.floating)) and not isinstance(union_assumption, bool):
        u = float(union_assumption)
    elif union_assumption == "independent":
        u = expected_union(E, k, n_tokens)
    elif union_assumption in ("measured_fraction", "measured_vs_independent"):
        if measured is None or source is None:
            raise ValueError(f"union_assumption={union_assumption!r} needs the measured unions and the source config")
        m = measured[measured >= 0]
        if m.size == 0:
            raise ValueError("the trace has no MoE layer unions (all -1)")
        if union_assumption == "measured_fraction":
            u = float(m.mean()) / source.num_experts * E
        else:
            ratio = float(m.mean()) / expected_union(source.num_experts, source.num_experts_per_tok, n_tokens)
            u = ratio * expected_union(E, k, n_tokens)
    else:
        raise ValueError(
            f"union_assumption must be one of {UNION_ASSUMPTIONS} or a number, got {union_assumption!r}"
        )
    return float(min(max(u, k), min(E, n_tokens * k)))


def project_trace(
    trace_like: Any,
    device: Device | str = DEFAULT_DEVICE,
    target_config: CloverConfig | str | None = None,
    union_assumption: str | int | float = "measured_vs_independent",
    *,
    source_config: CloverConfig | str | None = None,
    weight_bytes: float = 2,
    memory_mode: str | None = None,
    window: int = 0,
) -> TraceProjection:
    """Measured vs projected tokens/s for a recorded run (issue 5, part 4).

    Projected tokens/s = ``tokens_written / sum over forwards of
    roofline_time_s`` on ``device``, for (a) the model that produced the trace
    with its measured per-layer unions and (b) ``target_config`` (default
    ``clover-35b-a3b``) running the same forwards -- same tokens per forward,
    same commits -- with its union from ``union_assumption`` (`target_union`).
    Both in ``weight_bytes`` (BF16) whatever dtype the run used.

    Args:
        trace_like: an ``engine.trace.Trace`` (duck-typed: ``.steps``,
            ``.summary()``, ``.model_id``, ``.decode_config``), a list of
            dicts or objects with ``n_tokens_forward``, ``expert_union`` (per
            layer; -1 = no MoE), ``n_written`` (or the accepted / forced /
            eos_filled masks) and ``block_len`` (or ``tokens``); an explicit
            ``n_commit`` overrides ``n_tokens_forward - block_len``; or a table
            (DataFrame, Arrow, dict) of those columns.
        device: a `Device` or name.
        source_config: the trace's model config when the trace does not say
            (looked up from ``.config``, ``.meta["model_config"]`` or a preset
            / directory ``model_id``); without it the source projection is None.

    Measured tokens/s counts the same ``tokens_written`` over the run's wall
    time (``summary()["wall_s"]``, else the sum of the steps' ``wall_s``).

    Raises:
        TypeError: for something that holds no step rows.
        ValueError: for an empty trace or an unusable union assumption.
    """
    rows = _step_rows(trace_like)
    if not rows:
        raise ValueError("the trace has no steps to project")
    target = _as_config(target_config or "clover-35b-a3b")
    source = _as_config(source_config) if source_config is not None else _source_config(trace_like)
    decode_config = _get(trace_like, "decode_config") if not isinstance(trace_like, Sequence) else None
    block_size = _get(decode_config, "block_size") if decode_config else None

    fields = [_row_fields(r) for r in rows]
    written = sum(f[4] for f in fields)
    # Prefer the decode's own count of generated tokens (up to the first EOS): slots
    # EOS-filled or written after an EOS are finalised but are not answer tokens.
    summary = _get(trace_like, "summary") if not isinstance(trace_like, Sequence) else None
    summary = summary() if callable(summary) else summary
    n_generated = _get(summary, "n_tokens") if summary is not None else None
    if n_generated:
        written = int(n_generated)
    if memory_mode is None:
        memory_mode = (_get(decode_config, "memory_mode") if decode_config else None) or "state"
    kw: dict[str, Any] = {"memory_mode": memory_mode, "window": window}
    src_proj = None
    if source is not None:
        src_fw = []
        for n, union, n_commit, block_len, _ in fields:
            u = np.where(union < 0, 0, union)
            src_fw.append((n, u, n_commit, block_len))
        src_proj = project_forwards(
            written, src_fw, source, device, weight_bytes, commit_block_len=block_size, **kw
        )
    tgt_fw = []
    for n, union, n_commit, block_len, _ in fields:
        u = target_union(union_assumption, n, union, source, target)
        tgt_fw.append((n, u, n_commit, block_len))
    tgt_kw = dict(kw)
    if memory_mode == "state+window" and not window and not target.attention_window:
        tgt_kw["window"] = source.attention_window if source is not None else 0
    tgt_proj = project_forwards(written, tgt_fw, target, device, weight_bytes, commit_block_len=block_size, **tgt_kw)
    wall = _measured_wall_s(trace_like, rows)
    return TraceProjection(
        device=get_device(device).name,
        union_assumption=str(union_assumption),
        n_forwards=len(rows),
        tokens_written=written,
        tokens_per_forward=written / len(rows),
        measured_wall_s=wall,
        measured_tok_per_s=None if wall is None else written / wall,
        source=src_proj,
        target=tgt_proj,
    )


# ------------------------------------------------------------------ dense transformers
# A transformers causal LM adapted to block diffusion (`engine.hf_model`): history in a KV cache.
DENSE_WEIGHT_COMPONENTS = ("embedding", "attention_mixers", "mlp", "norms", "lm_head")
DENSE_COMPONENTS = DENSE_WEIGHT_COMPONENTS + ("kv_cache_read", "kv_cache_write", "attention")


def _is_dense(config: Any) -> bool:
    if isinstance(config, Mapping):
        return config.get("backbone") == "transformers"
    return getattr(config, "backbone", None) == "transformers"


def dense_param_counts(config: Any) -> dict[str, int]:
    """Per-layer and model-wide parameter counts of a Llama / Qwen2 / Qwen3-style dense transformer.

    ``config``: an `engine.hf_model.HFBlockConfig` or its ``to_dict()``.
    Returns ``attention`` (q, k, v, o per layer), ``mlp`` (gate, up, down per
    layer), ``norms`` (all RMSNorm weights), ``embedding`` and ``lm_head``
    (V x H each; a tied head is the same tensor, still read for the logits).
    """
    g = (lambda k: config[k]) if isinstance(config, Mapping) else (lambda k: getattr(config, k))
    H, I, N = g("hidden_size"), g("intermediate_size"), g("num_hidden_layers")
    Hq, Hkv, hd, V = g("num_attention_heads"), g("num_key_value_heads"), g("head_dim"), g("vocab_size")
    return {
        "attention": H * Hq * hd + 2 * H * Hkv * hd + Hq * hd * H,
        "mlp": 3 * H * I,
        "norms": 2 * H * N + H,
        "embedding": V * H,
        "lm_head": V * H,
    }


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

    ``config`` is an `engine.hf_model.HFBlockConfig` or its ``to_dict()``; the
    returned `ForwardCost` is keyed by `DENSE_COMPONENTS`.
    """
    T, C = int(n_tokens), int(n_commit_tokens)
    if T < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    if not 0 <= C <= T:
        raise ValueError(f"n_commit_tokens must be in [0, n_tokens={T}], got {n_commit_tokens}")
    L = T - C if block_len is None else int(block_len)
    if L < 0 or C + L != T:
        raise ValueError(f"n_commit_tokens ({C}) + block_len ({block_len}) must equal n_tokens ({T})")
    if context_len < 0:
        raise ValueError(f"context_len must be >= 0, got {context_len}")
    g = (lambda k: config[k]) if isinstance(config, Mapping) else (lambda k: getattr(config, k))
    H, N, V = g("hidden_size"), g("num_hidden_layers"), g("vocab_size")
    Hq, Hkv, hd = g("num_attention_heads"), g("num_key_value_heads"), g("head_dim")
    c = dense_param_counts(config)
    wb = float(weight_bytes)
    b: dict[str, float] = dict.fromkeys(DENSE_COMPONENTS, 0.0)
    f: dict[str, float] = dict.fromkeys(DENSE_COMPONENTS, 0.0)
    b["embedding"] = T * H * wb
    b["attention_mixers"] = N * c["attention"] * wb
    f["attention_mixers"] = N * T * 2 * c["attention"]
    b["mlp"] = N * c["mlp"] * wb
    f["mlp"] = N * T * 2 * c["mlp"]
    b["norms"] = c["norms"] * wb
    f["norms"] = NORM_FLOPS_PER_ELEMENT * H * (2 * N * T + L)
    b["lm_head"] = c["lm_head"] * wb if L else 0.0
    f["lm_head"] = 2 * L * V * H
    kv_per_token = N * 2 * Hkv * hd * act_bytes
    if include_kv:
        b["kv_cache_read"] = kv_per_token * context_len
        b["kv_cache_write"] = kv_per_token * C
    f["attention"] = N * 4 * Hq * hd * T * (context_len + T)
    total_b, total_f = float(sum(b.values())), float(sum(f.values()))
    return ForwardCost(
        bytes_read=total_b, flops=total_f, arithmetic_intensity=total_f / total_b,
        bytes_by_component={k: float(v) for k, v in b.items()},
        flops_by_component={k: float(v) for k, v in f.items()},
        n_tokens=T, n_commit_tokens=C, block_len=L, mean_expert_union=0.0,
    )


# -------------------------------------------------------------------------------- CLI
def format_breakdown(fc: ForwardCost) -> str:
    """Plain aligned table: component, bytes, FLOPs, and the totals."""
    lines = [f"{'component':<18}{'bytes':>14}{'share':>8}{'flops':>16}{'share':>8}"]
    lines.append("-" * len(lines[0]))
    for key in fc.bytes_by_component:  # COMPONENTS order (DENSE_COMPONENTS for a dense transformer)
        bb, ff = fc.bytes_by_component[key], fc.flops_by_component[key]
        lines.append(
            f"{key:<18}{_fmt_si(bb, 'B'):>14}{bb / fc.bytes_read:>8.1%}"
            f"{_fmt_si(ff, 'FLOP'):>16}{ff / fc.flops:>8.1%}"
        )
    lines.append("-" * len(lines[0]))
    lines.append(f"{'total':<18}{_fmt_si(fc.bytes_read, 'B'):>14}{'':>8}{_fmt_si(fc.flops, 'FLOP'):>16}")
    lines.append(f"{'  weights only':<18}{_fmt_si(fc.weights_bytes_read, 'B'):>14}")
    return "\n".join(lines)


def format_forward_report(
    config: CloverConfig, device: Device, fc: ForwardCost, weight_bytes: float, tpf: Sequence[float] | None = None
) -> str:
    ar = ar_step_cost(config, weight_bytes)
    t = fc.roofline_time_s(device)
    t_ar = ar.roofline_time_s(device)
    ridge = ridge_point(device)
    bound = "bandwidth" if fc.arithmetic_intensity < ridge else "compute"
    out = [
        f"config {config.name}, {weight_bytes:g} bytes/weight; forward of {fc.n_tokens} tokens "
        f"({fc.n_commit_tokens} committed + {fc.block_len} block slots), "
        f"expert union {fc.mean_expert_union:.1f}/{config.num_experts} per layer",
        "",
        format_breakdown(fc),
        "",
        f"arithmetic intensity   {fc.arithmetic_intensity:.1f} FLOP/byte "
        f"({device.name} ridge point {ridge:.1f} -> {bound} bound)",
        f"roofline time          {t * 1e3:.3f} ms on {device.name} "
        f"(bytes {fc.bytes_read / device.bandwidth_bytes_per_s * 1e3:.3f} ms, "
        f"flops {fc.flops / device.peak_bf16_flops * 1e3:.3f} ms)",
        f"forwards/s bound       {1 / t:.1f}",
        "",
        f"AR step (1 token, union {config.num_experts_per_tok}, weights only, the seed's baseline): "
        f"{_fmt_si(ar.bytes_read, 'B')}, {_fmt_si(ar.flops, 'FLOP')}, "
        f"bound {1 / t_ar:.1f} tokens/s",
        f"bytes ratio vs AR      {fc.bytes_read / ar.bytes_read:.3f}x "
        f"(weights only {fc.weights_bytes_read / ar.weights_bytes_read:.3f}x)",
        f"break-even             {t / t_ar:.2f} tokens per forward to match AR",
    ]
    tpfs = list(tpf) if tpf else sorted({1, 2, 4, 8, fc.block_len} - {0})
    out.append("projected tokens/s bound by tokens per forward (TPF):")
    out.append("  " + "  ".join(f"TPF {x:g}: {x / t:.0f} ({x / t * t_ar:.2f}x AR)" for x in tpfs))
    return "\n".join(out)


def format_devices() -> str:
    lines = [f"{'device':<12}{'bandwidth':>12}{'BF16 dense':>14}{'ridge':>10}  source"]
    for d in DEVICES.values():
        lines.append(
            f"{d.name:<12}{d.bandwidth_bytes_per_s / 1e12:>8.3f} TB/s{d.peak_bf16_flops / 1e12:>8.1f} TFLOPS"
            f"{ridge_point(d):>7.0f} F/B  {d.source}"
        )
    lines.append(f"{'this-machine':<12}  measured on demand (--device this-machine), cached")
    return "\n".join(lines)


def format_trace_projection(p: TraceProjection, label: str = "") -> str:
    lines = [
        f"trace {label}: {p.n_forwards} forwards, {p.tokens_written} tokens written, "
        f"{p.tokens_per_forward:.2f} tokens per forward",
        f"{'':<34}{'tokens/s':>12}{'bytes/forward':>16}{'union/layer':>13}",
    ]
    if p.measured_tok_per_s is not None:
        lines.append(f"{'measured (this machine)':<34}{p.measured_tok_per_s:>12.1f}")
    else:
        lines.append(f"{'measured (this machine)':<34}{'n/a':>12}")
    for proj, note in ((p.source, "trace model, measured unions"), (p.target, f"union: {p.union_assumption}")):
        if proj is None:
            lines.append(f"{'projected (source model unknown)':<34}{'n/a':>12}")
            continue
        name = f"projected {proj.config_name} on {proj.device}"
        lines.append(
            f"{name:<34}{proj.tok_per_s:>12.1f}{_fmt_si(proj.bytes_read / proj.n_forwards, 'B'):>16}"
            f"{proj.mean_expert_union:>13.1f}  ({note})"
        )
    lines.append("projected = roofline bound (max of bytes/bandwidth, flops/peak) per forward, BF16 weights")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m engine.cost``: breakdown table, device list, or trace projection."""
    ap = argparse.ArgumentParser(prog="python -m engine.cost", description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="clover-35b-a3b",
                    help="preset name or config.json path (with --trace: the target model projected)")
    ap.add_argument("--device", default=DEFAULT_DEVICE, help=f"one of {', '.join(DEVICES)}, this-machine")
    ap.add_argument("--tokens", type=int, default=32, help="tokens in the forward (commit + block)")
    ap.add_argument("--union", default="expected",
                    help="routed experts hit per layer: a number, or 'expected' (independent routing, the default)")
    ap.add_argument("--commit", type=int, default=0, help="committed tokens among --tokens (fused commit)")
    ap.add_argument("--weight-bytes", type=float, default=2, help="bytes per weight (2 = BF16)")
    ap.add_argument("--memory-mode", default="state", choices=MEMORY_MODES)
    ap.add_argument("--window", type=int, default=0, help="W for state+window (0 = config's)")
    ap.add_argument("--tpf", type=float, nargs="*", default=None, help="tokens per forward for the tokens/s lines")
    ap.add_argument("--list-devices", action="store_true", help="print the device table and exit")
    ap.add_argument("--trace", default=None, help="a recorded run (Parquet/Arrow): measured vs projected")
    ap.add_argument("--trace-config", default=None,
                    help="config of the model that recorded --trace, if the trace does not name a preset")
    ap.add_argument("--union-assumption", default="measured_vs_independent",
                    help=f"35B union for --trace: {', '.join(UNION_ASSUMPTIONS)} or a number")
    args = ap.parse_args(argv)

    if args.list_devices:
        print(format_devices())
        return 0
    try:
        device = get_device(args.device)
        if args.trace:
            try:
                from engine.trace import Trace  # lazy: the cost model does not need it otherwise
            except ImportError as e:
                print(f"--trace needs engine.trace (Trace.load), which is not available here: {e}", file=sys.stderr)
                return 2
            trace = Trace.load(args.trace)
            ua: str | float = args.union_assumption
            try:
                ua = float(ua)
            except ValueError:
                pass
            p = project_trace(trace, device, args.config, ua, source_config=args.trace_config)
            print(format_trace_projection(p, args.trace))
            return 0
        cfg = _as_config(args.config)
        if args.union == "expected":
            union = expected_union(cfg.num_experts, cfg.num_experts_per_tok, args.tokens)
        else:
            union = float(args.union)
        fc = forward_cost(cfg, args.tokens, union, args.weight_bytes, args.commit,
                          memory_mode=args.memory_mode, window=args.window)
        print(format_forward_report(cfg, device, fc, args.weight_bytes, args.tpf))
        return 0
    except (ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
