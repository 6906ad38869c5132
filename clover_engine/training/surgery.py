"""Model surgery for later training stages: the `clover-tiny` preset, growing a checkpoint by an
attention q/k/v conv or a front attention layer, and induction-head initialisation
(docs/architecture.md §3, §9).

Every grow step is function-preserving: the new model computes exactly what the old one did
until training moves the new weights. Layouts measured on `benchmarks/copy_toy.py` are in
models/clover-tiny/README.md.

Wing: ``training``.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.backbones.clover.model import CloverModel


def tiny_config(vocab_size: int = 4096) -> CloverConfig:
    """`clover-tiny`: 4 layers (GDN, attention) x 2, 8 experts top-2, window 512, a 3-tap conv on the
    attention q/k/v (the shipped model got a 4-tap one in stage 3); ~6.2M parameters (25 MB fp32).
    Sized so that a run fits a CPU session: attention layers every other layer so the window can
    copy, hidden 192 as in the first pilot runs."""
    return CloverConfig(
        name="clover-tiny", vocab_size=vocab_size, hidden_size=192, num_hidden_layers=4,
        full_attention_interval=2, linear_num_key_heads=4, linear_num_value_heads=4,
        linear_key_head_dim=24, linear_value_head_dim=48, linear_conv_kernel_dim=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=48, partial_rotary_factor=0.5,
        rope_theta=10000.0, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=192,
        shared_expert_intermediate_size=192, max_position_embeddings=65536, attention_window=512,
        attention_conv_kernel_dim=3, mask_token_id=1, eos_token_id=3,
    )


def small_config(vocab_size: int = 4096) -> CloverConfig:
    """`clover-small`: `tiny_config`'s layout scaled for a GPU run -- 8 layers (GDN, attention) x 4,
    hidden 512, 8 experts top-2 of FFN 512 plus a shared expert, window 1024; ~70M parameters
    (`clover_engine.cost.count_parameters` gives the exact number). bf16 weights ~140 MB."""
    return dataclasses.replace(
        tiny_config(vocab_size), name="clover-small", hidden_size=512, num_hidden_layers=8,
        linear_num_key_heads=8, linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64,
        num_attention_heads=8, head_dim=64, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        attention_window=1024, attention_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"] * 4,
    )


SIZES = {"tiny": tiny_config, "small": small_config}
"""Config builders of a fresh run, by ``clover_engine.train --size``."""


ATTENTION_CONV_WEIGHT = "self_attn.conv1d.weight"
"""Name suffix of the attention q/k/v conv taps (`GatedAttention.conv1d`)."""


def with_attention_conv(model: CloverModel, kernel: int) -> CloverModel:
    """A copy of `model` with a `kernel`-tap causal conv on its attention layers' q/k/v
    (``config.attention_conv_kernel_dim``), initialised to the identity so that the new
    model computes exactly what `model` did; every other weight is carried over.

    Raises:
        ValueError: `model` already has an attention conv of another size, or `kernel` < 1.
    """
    if kernel < 1:
        raise ValueError(f"attention conv kernel must be >= 1, got {kernel}")
    old = model.config.attention_conv_kernel_dim
    if old == kernel:
        return model
    if old:
        raise ValueError(f"model already has an attention conv of {old} taps; cannot resize it to {kernel}")
    new = CloverModel(dataclasses.replace(model.config, attention_conv_kernel_dim=kernel))
    return _carry_over(new, model.state_dict(), lambda k: k.endswith(ATTENTION_CONV_WEIGHT))


def _carry_over(new: CloverModel, state: dict, is_new) -> CloverModel:
    """Load `state` into the grown model `new`; the weights it lacks must be exactly those `is_new` names."""
    missing, unexpected = new.load_state_dict(state, strict=False)
    stray = [k for k in missing if not is_new(k)]
    if stray or unexpected:
        raise ValueError(f"weights do not fit the new model: missing {stray}, unexpected {unexpected}")
    return new


INDUCTION_TAPS = (1.0, 0.5, 0.25)
"""Attention-conv taps of an induction head's q and k for lags 1, 2, 3 (lag 0, the token itself,
gets 0): q at slot i then encodes tokens i-1, i-2, i-3 and k at position j tokens j-1, j-2, j-3,
so one q.k match finds the earlier occurrence of the current context and v (the token itself)
copies what followed it."""


def init_induction_heads(model: CloverModel, kv_heads: int, taps: tuple[float, ...] = INDUCTION_TAPS,
                         layers: list[int] | None = None) -> list[str]:
    """Turn the last `kv_heads` key/value heads of every attention layer (and the query heads that
    share them under GQA) into induction-head candidates by re-initialising their q and k conv taps
    in place to read the preceding tokens (`INDUCTION_TAPS`); their v taps and all other weights
    are left as they are (measured on `benchmarks/copy_toy.py`: models/clover-tiny/README.md).
    The idea is Primer's (arXiv:2109.08668) shifted/convolved keys; the previous-token q/k init is ours.

    Args:
        model: a CloverModel with ``config.attention_conv_kernel_dim`` >= len(`taps`) + 1
            (conv weight [channels, 1, kernel], channels = (Hq + 2 Hkv) * head_dim, q|k|v order).
        kv_heads: how many kv heads per attention layer, 1..num_key_value_heads.
        taps: the q/k taps for lags 1, 2, ...
        layers: indices of the attention layers to change (default: all of them).

    Returns:
        The names of the conv weights that were changed.

    Raises:
        ValueError: no attention conv, too few taps for `taps`, or `kv_heads` out of range.
    """
    cfg = model.config
    K = cfg.attention_conv_kernel_dim
    if K < len(taps) + 1:
        raise ValueError(f"induction heads need an attention conv of >= {len(taps) + 1} taps, the model has {K}; "
                         f"add one first (--attention-conv {len(taps) + 1})")
    if not 1 <= kv_heads <= cfg.num_key_value_heads:
        raise ValueError(f"kv_heads must be in 1..{cfg.num_key_value_heads}, got {kv_heads}")
    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rep = Hq // Hkv
    changed = []
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            if layer.layer_type != "full_attention" or (layers is not None and i not in layers):
                continue
            w = layer.self_attn.conv1d.weight  # [channels, 1, K]
            for g in range(Hkv - kv_heads, Hkv):
                rows = [slice(Hq * D + g * D, Hq * D + (g + 1) * D)]  # k of kv head g
                rows += [slice(h * D, (h + 1) * D) for h in range(g * rep, (g + 1) * rep)]  # its q heads
                for r in rows:
                    w[r] = 0.0
                    for lag, tap in enumerate(taps, start=1):
                        w[r, 0, K - 1 - lag] = tap
            changed.append(f"model.layers.{i}.{ATTENTION_CONV_WEIGHT}")
    return changed


def with_front_attention(model: CloverModel) -> CloverModel:
    """A copy of `model` with one more layer in front: a gated-attention layer (with the model's
    attention q/k/v conv) whose every head is an induction-head candidate (`init_induction_heads`)
    and whose outputs (attention o_proj, expert and shared-expert down projections) start at zero,
    so the new model computes exactly what `model` did. Layer i of `model` becomes layer i + 1.

    Why: the copy head wants to read the token embeddings before a GDN layer has mixed history
    into them (the attention-first layout learned copying in `benchmarks/copy_toy.py`, the
    GDN-first one did not; models/clover-tiny/README.md).

    Raises:
        ValueError: `model` has no attention conv of >= 4 taps (add one with `with_attention_conv`).
    """
    cfg = model.config
    if cfg.attention_conv_kernel_dim < len(INDUCTION_TAPS) + 1:
        raise ValueError(f"the front attention layer needs an attention conv of >= {len(INDUCTION_TAPS) + 1} taps, "
                         f"the model has {cfg.attention_conv_kernel_dim}; add one first (--attention-conv 4)")
    new = CloverModel(dataclasses.replace(cfg, num_hidden_layers=cfg.num_hidden_layers + 1,
                                          layer_types=["full_attention", *cfg.layer_types]))
    shifted = {}
    for k, v in model.state_dict().items():
        m = re.match(r"model\.layers\.(\d+)\.(.*)", k)
        shifted[f"model.layers.{int(m[1]) + 1}.{m[2]}" if m else k] = v
    _carry_over(new, shifted, lambda k: k.startswith("model.layers.0."))
    front = new.layers[0]
    with torch.no_grad():
        front.self_attn.o_proj.weight.zero_()
        front.mlp.experts.down_proj.zero_()
        front.mlp.shared_expert.down_proj.weight.zero_()
    init_induction_heads(new, cfg.num_key_value_heads, layers=[0])
    return new
