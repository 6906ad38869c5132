"""Bytes read and FLOPs of a block drafter over a frozen causal LM, and of the rounds it takes part in.

A drafter backbone (`clover_engine.backbones.drafter`, ``Capabilities.family == "drafter"``) keeps its history in
the base's KV cache, so the base's own forwards are the ``kv_cache`` family's
(`clover_engine.cost.dense.dense_forward_cost`); what this module adds is the drafter's side, priced from the
drafter's config section (`drafter_section`: a `DrafterConfig`, its ``to_dict()``, or the ``drafter``
dict of `clover_engine.backbones.drafter.model.DrafterLMConfig`, which a trace records in its model config).

Shapes: H = hidden size (the base's), K = base layers read (``len(target_layers)``), nL = drafter
layers, nh / nkv / hd = its attention heads / K-V heads / head width, I = its MLP width, B = its
trained block size, Vd = draft vocabulary (``draft_vocab_size``; all V when empty), Q = slots in one
drafter forward, T = context positions (tokens the base has read), ``wb`` / ``act`` = bytes per
weight / per activation element.

A verify round (`clover_engine.decoding.verify`, docs/architecture.md §4) is priced as three parts
(`verify_round_cost`), each read off the code that runs it:

* **drafter forward** (`drafter_forward_cost`, `clover_engine.backbones.drafter.net.BlockDrafter.forward`) over
  ``[anchor, MASK x k]`` (Q = k + 1 slots) after T context positions:

  - ``draft_inputs``: Q rows of the base's input embedding, Q rows of ``slot_embedding`` and the
    ``mask_embedding``, ``(2Q + 1) H wb`` bytes; no FLOPs (additions are not counted);
  - ``draft_layers``: every layer's q/k/v/o and gate/up/down weights, read once; FLOPs ``2 Q`` x
    (q_proj + o_proj + MLP params) for the slots, and ``2 (T + Q)`` x (k_proj + v_proj params): each
    layer projects the whole fused context to keys / values on every draft (the drafter keeps no
    cache of its own);
  - ``draft_norms``: 2 RMSNorm weights per layer; 4 FLOPs per normalised element (``2 nL Q H``);
  - ``draft_context``: each layer reads the T fused context rows, plus the base's last state row
    the slots start from: ``(nL T + 1) H act`` bytes;
  - ``draft_attention``: ``4 nh hd Q (T + Q)`` FLOPs per layer (scores and mix over every key; the
    mask hides keys, SDPA still computes them); no bytes (activations stay on chip);
  - ``slot_heads``: the first Q of the B per-slot maps, ``Q H^2 wb`` bytes, ``2 Q H^2`` FLOPs;
  - ``draft_lm_head``: the Vd draft-vocabulary rows of the base's LM head, ``Vd H wb`` bytes,
    ``2 Q Vd H`` FLOPs (the whole-vocabulary head is ``V / Vd`` times that: 6x for
    ``models/smollm2-drafter``'s 8,192 of 49,152).

* **feature fuse** (`fuse_cost`, `clover_engine.backbones.drafter.model.DraftedLM.read`): every token the base
  reads adds its fused feature to the drafter's context: ``feature_fuse`` weights ``(K H^2 + H) wb``,
  ``2 n K H^2 + 4 n H`` FLOPs for n tokens; ``draft_context`` writes the n fused rows and the n last-state
  rows, ``2 n H act`` bytes.

* **base verification forward** (`base_read_cost`): one causal forward of the base over the n = Q
  tokens ``[anchor, d_1 .. d_k]`` after the T cached ones: `dense_forward_cost` with all n rows' logits
  (`DraftedLM.read` returns them all: row j is the base's choice after slot j) and all n K/V entries
  appended to the cache (``kv_write_tokens = n``; the rejected tail is cropped afterwards, but it was
  written).

The Medusa-style baseline (``arch: medusa``, `clover_engine.backbones.drafter.net.MedusaDrafter`) has no layers,
no context and no fuse: its forward reads the base's last state row (``draft_inputs``, ``H wb``), the
first ``Q - 1`` of its ``B - 1`` heads (``slot_heads``, ``(Q - 1) H^2 wb`` bytes, ``2 (Q - 1) H^2`` FLOPs)
and the same draft LM-head rows (slot 0 too: the base's own head on that state).

The drafter's part of a round is the drafter forward plus the feature fuse (the base alone would
need neither); the prefill is a round with no draft (the base reads the prompt, the fuse fills the
context). Commit mode (`commit_forward_cost`) is priced the same way: the base reads the C committed
tokens (none on a block's later forwards), the drafter drafts the block's L slots.

Not counted, as elsewhere in the cost model (docs/architecture.md §7): elementwise ops (RoPE, SiLU,
residual adds), softmax exponentials, the base's hidden states concatenated for the fuse (activations
of the forward that made them), and the copy the gather of the draft-vocabulary rows makes.

Wing: ``cost``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_cost_drafter.py -q``
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from clover_engine.cost.components import DENSE_COMPONENTS, DRAFTER_COMPONENTS, NORM_FLOPS_PER_ELEMENT, ForwardCost
from clover_engine.cost.dense import dense_forward_cost

__all__ = ["VerifyRoundCost", "base_read_cost", "commit_forward_cost", "drafter_forward_cost",
           "drafter_param_counts", "drafter_section", "fuse_cost", "merge_costs", "verify_round_cost",
           "verify_trace_costs"]

WEIGHT_BYTES_CANDIDATES = (4, 2, 1, 8)
"""Bytes per weight `verify_trace_costs` tries when matching a recorded run's priced bytes (fp32, bf16 /
fp16, fp8, fp64)."""


def drafter_section(config: Any) -> Any | None:
    """The drafter's config inside a model config, or None for a model without a drafter.

    ``config``: a `clover_engine.backbones.drafter.model.DrafterLMConfig` (its ``drafter`` dict), its
    ``to_dict()`` or a trace's recorded ``model_config`` (the ``"drafter"`` key), or a drafter config
    itself (`DrafterConfig` or its dict: it has ``target_layers``). An empty section is None.
    """
    if config is None:
        return None
    if isinstance(config, Mapping):
        if "target_layers" in config:
            return config
        section = config.get("drafter")
    else:
        if hasattr(config, "target_layers"):
            return config
        section = getattr(config, "drafter", None)
    return section or None


def _getter(drafter: Any):
    """``g(name, default=...)`` -> a field of a drafter config (mapping key or attribute).

    Raises (from ``g`` without a default):
        TypeError: a config that lacks the field (not a drafter config).
    """
    missing = object()

    def g(name: str, default: Any = missing) -> Any:
        value = drafter.get(name, missing) if isinstance(drafter, Mapping) else getattr(drafter, name, missing)
        if value is missing:
            if default is missing:
                raise TypeError(f"a drafter's forward is priced from its config's {name!r}, which this "
                                f"{type(drafter).__name__} has not (not a drafter config)")
            return default
        return value
    return g


def _draft_vocab_size(drafter: Any) -> int:
    """Vd: ``draft_vocab_size`` (a `DrafterLMConfig`'s section), else ``len(draft_vocab)``, else (an empty
    list: the whole vocabulary) ``vocab_size``."""
    g = _getter(drafter)
    size = g("draft_vocab_size", None)
    if size:
        return int(size)
    vocab = g("draft_vocab", ())
    return len(vocab) if vocab else int(g("vocab_size"))


def _is_medusa(drafter: Any) -> bool:
    return _getter(drafter)("arch", "block") == "medusa"


def drafter_param_counts(drafter: Any) -> dict[str, int]:
    """Parameter counts of a `clover_engine.backbones.drafter.net.BlockDrafter` (or, for ``arch: medusa``, a
    `MedusaDrafter`: ``slot_heads`` = its ``(B - 1) H^2`` heads, every other part 0), from its config's shapes.

    Args:
        drafter: a `DrafterConfig`, its ``to_dict()``, or a `DrafterLMConfig`'s ``drafter`` section.

    Returns:
        ``fuse`` (Linear K H -> H), ``fuse_norm`` (H), ``mask_embedding`` (H), ``slot_embedding`` (B H),
        ``slot_heads`` (B H^2), per layer ``attention`` (q/k/v/o: ``2 H nh hd + 2 H nkv hd``), ``mlp``
        (``3 H I``) and ``layer_norms`` (2 H); ``total``: every trained parameter (what
        ``sum(p.numel() for p in net.parameters())`` counts); ``draft_lm_head``: the Vd rows of the
        base's LM head a draft reads (the base's, not the drafter's own, so not in ``total``).

    Raises:
        TypeError: a config without a drafter's fields.
    """
    g = _getter(drafter)
    H, nL, B = int(g("hidden_size")), int(g("num_layers")), int(g("block_size"))
    if _is_medusa(drafter):
        c = dict.fromkeys(("fuse", "fuse_norm", "mask_embedding", "slot_embedding", "attention", "mlp",
                           "layer_norms"), 0)
        c["slot_heads"] = c["total"] = (B - 1) * H * H
        c["draft_lm_head"] = _draft_vocab_size(drafter) * H
        return c
    nh, nkv, hd, I = int(g("num_heads")), int(g("num_kv_heads")), int(g("head_dim")), int(g("intermediate_size"))
    K = len(g("target_layers"))
    c = {
        "fuse": K * H * H,
        "fuse_norm": H,
        "mask_embedding": H,
        "slot_embedding": B * H,
        "slot_heads": B * H * H,
        "attention": 2 * H * nh * hd + 2 * H * nkv * hd,
        "mlp": 3 * H * I,
        "layer_norms": 2 * H,
    }
    c["total"] = (c["fuse"] + c["fuse_norm"] + c["mask_embedding"] + c["slot_embedding"] + c["slot_heads"]
                  + nL * (c["attention"] + c["mlp"] + c["layer_norms"]))
    c["draft_lm_head"] = _draft_vocab_size(drafter) * H
    return c


def _cost(b: Mapping[str, float], f: Mapping[str, float], n_tokens: int, n_commit: int, block_len: int) -> ForwardCost:
    total_b, total_f = float(sum(b.values())), float(sum(f.values()))
    return ForwardCost(bytes_read=total_b, flops=total_f, arithmetic_intensity=total_f / total_b if total_b else 0.0,
                       bytes_by_component={k: float(v) for k, v in b.items()},
                       flops_by_component={k: float(v) for k, v in f.items()},
                       n_tokens=int(n_tokens), n_commit_tokens=int(n_commit), block_len=int(block_len))


def merge_costs(parts: Iterable[ForwardCost], n_tokens: int, n_commit_tokens: int = 0,
                block_len: int | None = None) -> ForwardCost:
    """One `ForwardCost` for work done in sequence (a round's drafter and base forwards): bytes and FLOPs
    summed per component (components in first-seen order), the token counts as given (``block_len``
    default ``n_tokens - n_commit_tokens``)."""
    b: dict[str, float] = {}
    f: dict[str, float] = {}
    for p in parts:
        for k, v in p.bytes_by_component.items():
            b[k] = b.get(k, 0.0) + v
        for k, v in p.flops_by_component.items():
            f[k] = f.get(k, 0.0) + v
    L = n_tokens - n_commit_tokens if block_len is None else block_len
    return _cost(b, f, n_tokens, n_commit_tokens, L)


def _zeros(keys: tuple[str, ...]) -> tuple[dict[str, float], dict[str, float]]:
    return dict.fromkeys(keys, 0.0), dict.fromkeys(keys, 0.0)


def drafter_forward_cost(drafter: Any, n_slots: int, context_len: int, weight_bytes: float = 2,
                         act_bytes: float = 2) -> ForwardCost:
    """Bytes read and FLOPs of one drafter forward over ``n_slots`` block slots (module docstring).

    Args:
        drafter: the drafter's config (`drafter_section`).
        n_slots: Q, the slots drafted together (anchor included), 1 .. the trained block size B.
        context_len: T, context positions the slots read (the tokens the base has read).
        weight_bytes, act_bytes: bytes per weight / per activation element (2 = bf16 / fp16).

    Returns:
        A `ForwardCost` keyed by `clover_engine.cost.components.DRAFTER_COMPONENTS` (``feature_fuse`` 0:
        see `fuse_cost`), ``n_tokens = block_len = Q``.

    Raises:
        ValueError: Q outside ``[1, B]``, a negative context or non-positive byte sizes.
        TypeError: a config without a drafter's fields.
    """
    g = _getter(drafter)
    H, nL, B = int(g("hidden_size")), int(g("num_layers")), int(g("block_size"))
    nh, nkv, hd = int(g("num_heads")), int(g("num_kv_heads")), int(g("head_dim"))
    Q, T = int(n_slots), int(context_len)
    if not 1 <= Q <= B:
        raise ValueError(f"n_slots must be in [1, {B}] (the drafter's block size), got {n_slots}")
    if T < 0:
        raise ValueError(f"context_len must be >= 0, got {context_len}")
    if weight_bytes <= 0 or act_bytes <= 0:
        raise ValueError(f"weight_bytes and act_bytes must be > 0, got {weight_bytes}, {act_bytes}")
    c = drafter_param_counts(drafter)
    wb = float(weight_bytes)
    b, f = _zeros(DRAFTER_COMPONENTS)
    b["draft_lm_head"] = c["draft_lm_head"] * wb
    f["draft_lm_head"] = 2 * Q * c["draft_lm_head"]
    if _is_medusa(drafter):
        b["draft_inputs"] = H * wb
        b["slot_heads"] = (Q - 1) * H * H * wb
        f["slot_heads"] = 2 * (Q - 1) * H * H
        return _cost(b, f, Q, 0, Q)
    qo, kv = 2 * H * nh * hd, 2 * H * nkv * hd
    b["draft_inputs"] = (2 * Q + 1) * H * wb
    b["draft_layers"] = nL * (c["attention"] + c["mlp"]) * wb
    f["draft_layers"] = nL * (2 * Q * (qo + c["mlp"]) + 2 * (T + Q) * kv)
    b["draft_norms"] = nL * c["layer_norms"] * wb
    f["draft_norms"] = NORM_FLOPS_PER_ELEMENT * nL * 2 * Q * H
    b["draft_context"] = (nL * T + 1) * H * act_bytes
    f["draft_attention"] = nL * 4 * nh * hd * Q * (T + Q)
    b["slot_heads"] = Q * H * H * wb
    f["slot_heads"] = 2 * Q * H * H
    return _cost(b, f, Q, 0, Q)


def fuse_cost(drafter: Any, n_tokens: int, weight_bytes: float = 2, act_bytes: float = 2) -> ForwardCost:
    """Fusing the features of ``n_tokens`` tokens the base read into the drafter's context (module
    docstring): ``feature_fuse`` and the ``draft_context`` rows written. ``n_tokens = 0`` costs nothing.

    Raises:
        ValueError: a negative token count.
    """
    n = int(n_tokens)
    if n < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    b, f = _zeros(DRAFTER_COMPONENTS)
    if n and not _is_medusa(drafter):  # Medusa heads keep no context: nothing is fused
        c = drafter_param_counts(drafter)
        H = c["fuse_norm"]
        b["feature_fuse"] = (c["fuse"] + c["fuse_norm"]) * float(weight_bytes)
        f["feature_fuse"] = 2 * n * c["fuse"] + NORM_FLOPS_PER_ELEMENT * n * H
        b["draft_context"] = 2 * n * H * act_bytes
    return _cost(b, f, n, n, 0)


def base_read_cost(config: Any, n_tokens: int, context_len: int, weight_bytes: float = 2,
                   act_bytes: float = 2) -> ForwardCost:
    """The base's causal forward over ``n_tokens`` new tokens after ``context_len`` cached ones, with every
    row's logits and every row's K/V appended (`clover_engine.backbones.drafter.model.DraftedLM.read`):
    `dense_forward_cost` with ``C = 0, L = n, kv_write_tokens = n``. ``n_tokens = 0`` costs nothing.

    Raises:
        ValueError: a negative count or context; TypeError: a config without a dense transformer's fields.
    """
    n = int(n_tokens)
    if n < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    if n == 0:
        b, f = _zeros(DENSE_COMPONENTS)
        return _cost(b, f, 0, 0, 0)
    return dense_forward_cost(config, n, weight_bytes, 0, n, context_len=context_len, act_bytes=act_bytes,
                              kv_write_tokens=n)


@dataclass(frozen=True)
class VerifyRoundCost:
    """One verify round priced part by part (`verify_round_cost`).

    Attributes:
        drafter: the drafter's share: its forward plus the fuse of the tokens the base read
            (`clover_engine.cost.components.DRAFTER_COMPONENTS`; zeros for the prefill, which drafts nothing).
        base: the base's verification forward (`clover_engine.cost.components.DENSE_COMPONENTS`).
        total: both, every component of each (`merge_costs`); ``n_tokens`` = tokens the base read.
    """

    drafter: ForwardCost
    base: ForwardCost
    total: ForwardCost

    @property
    def drafter_bytes_share(self) -> float:
        """The drafter's fraction of the round's bytes (0 when the round read nothing)."""
        return self.drafter.bytes_read / self.total.bytes_read if self.total.bytes_read else 0.0

    @property
    def drafter_flops_share(self) -> float:
        """The drafter's fraction of the round's FLOPs (0 when the round computed nothing)."""
        return self.drafter.flops / self.total.flops if self.total.flops else 0.0


def _drafter_of(config: Any, drafter: Any | None) -> Any:
    section = drafter if drafter is not None else drafter_section(config)
    if section is None:
        raise ValueError(f"{getattr(config, 'name', None) or type(config).__name__} has no drafter section: a "
                         "verify round is priced for a drafter backbone (clover_engine.backbones.drafter)")
    return section


def verify_round_cost(config: Any, n_read: int, n_draft: int, context_len: int, weight_bytes: float = 2,
                      act_bytes: float = 2, drafter: Any | None = None) -> VerifyRoundCost:
    """One round of verify decoding: the drafter forward over ``n_draft`` slots, then the base reading the
    ``n_read`` tokens ``[anchor, drafts]`` after ``context_len`` cached ones (module docstring).

    Args:
        config: the drafter backbone's config (`clover_engine.backbones.drafter.model.DrafterLMConfig`) or its
            ``to_dict()`` (a trace's ``model_config``): the base's dimensions and the ``drafter`` section.
        n_read: tokens the base reads (``k + 1`` in a round; the prompt length for the prefill).
        n_draft: slots of the drafter forward (``k + 1``), 0 when the round drafts nothing.
        context_len: tokens the base had read before (its KV cache, the drafter's context).
        weight_bytes, act_bytes: bytes per weight / activation element.
        drafter: the drafter's config when ``config`` has no section.

    Returns:
        A `VerifyRoundCost` (drafter, base and their total).

    Raises:
        ValueError: no drafter section, or counts the part formulas refuse.
    """
    d = _drafter_of(config, drafter)
    parts = [fuse_cost(d, n_read, weight_bytes, act_bytes)]
    if n_draft:
        parts.insert(0, drafter_forward_cost(d, n_draft, context_len, weight_bytes, act_bytes))
    drafter_part = merge_costs(parts, int(n_draft), 0, int(n_draft))
    base = base_read_cost(config, n_read, context_len, weight_bytes, act_bytes)
    total = merge_costs([base, drafter_part], int(n_read), 0, int(n_read))
    return VerifyRoundCost(drafter=drafter_part, base=base, total=total)


def commit_forward_cost(config: Any, n_commit_tokens: int, block_len: int, context_len: int,
                        weight_bytes: float = 2, act_bytes: float = 2, drafter: Any | None = None) -> VerifyRoundCost:
    """One commit-mode forward of a drafter backbone (`DraftedLM.forward` under the block decoder): the base
    reads the C committed tokens after ``context_len`` (none on a block's later forwards), then the drafter
    drafts the block's L slots after ``context_len + C``.

    An approximation in two places, both within one block: the prompt head the base reads ahead of its
    commit is not told apart from the block (the decoder reports C and L only), and the drafter is priced
    over all L slots (it skips the written slots before the anchor; a block of one slot is not drafted).
    ``total`` is keyed like a verify round's, with ``n_tokens = C + L``, ``n_commit_tokens = C``.

    Raises:
        ValueError: as `verify_round_cost`.
    """
    d = _drafter_of(config, drafter)
    C, L = int(n_commit_tokens), int(block_len)
    B = int(_getter(d)("block_size"))
    parts = [fuse_cost(d, C, weight_bytes, act_bytes)]
    if L > 1:
        parts.insert(0, drafter_forward_cost(d, min(L, B), context_len + C, weight_bytes, act_bytes))
    drafter_part = merge_costs(parts, min(L, B), 0, min(L, B))
    base = base_read_cost(config, C, context_len, weight_bytes, act_bytes)
    total = merge_costs([base, drafter_part], C + L, C, L)
    return VerifyRoundCost(drafter=drafter_part, base=base, total=total)


def _round_shape(step: Any) -> tuple[int, int, int]:
    """(n_read, n_draft, context_len) of one verify event (`clover_engine.decoding.verify`): block 0 is the prefill
    (the base reads the ``n_tokens_forward`` prompt tokens into an empty cache, nothing drafted); a round's
    block starts one after its anchor, so the base had read ``position_start - 1`` tokens, and its
    ``n_tokens_forward = k + 1`` tokens were drafted together (none when k = 0)."""
    n = int(step.n_tokens_forward)
    if int(step.block_index) == 0:
        return n, 0, 0
    return n, (n if n > 1 else 0), int(step.position_start) - 1


def verify_trace_costs(trace: Any, weight_bytes: float | None = None) -> list[VerifyRoundCost] | None:
    """Every event of a recorded verify run priced part by part: the drafter's and the base's share of
    each round (`verify_round_cost`), from the trace alone (its model config's ``drafter`` section and
    each event's shape, `_round_shape`).

    Args:
        trace: an `clover_engine.recording.trace.Trace` (duck-typed: ``decode_config``, ``meta`` with
            ``model_config``, ``steps`` with ``block_index``, ``position_start``, ``n_tokens_forward``,
            ``bytes_read``).
        weight_bytes: bytes per weight to price at; None: the one of `WEIGHT_BYTES_CANDIDATES` that
            reproduces the first priced event's recorded ``bytes_read`` (the dtype the run was priced at).

    Returns:
        One `VerifyRoundCost` per event (the prefill first), or None: not a verify run, no drafter
        section in the recorded model config, no event with a cost, or (``weight_bytes`` None) no
        candidate reproduces the recorded bytes -- a run priced before the drafter was (the base alone).
    """
    dc = getattr(trace, "decode_config", None) or {}
    meta = getattr(trace, "meta", None) or {}
    config = meta.get("model_config")
    steps = list(getattr(trace, "steps", None) or [])
    if dc.get("policy") != "verify" or not isinstance(config, Mapping) or drafter_section(config) is None or not steps:
        return None
    if weight_bytes is None:
        first = next((st for st in steps if st.bytes_read), None)
        if first is None:
            return None
        recorded = float(first.bytes_read)
        weight_bytes = next((w for w in WEIGHT_BYTES_CANDIDATES if abs(
            verify_round_cost(config, *_round_shape(first), w).total.bytes_read - recorded) <= 1e-9 * recorded), None)
        if weight_bytes is None:
            return None
    return [verify_round_cost(config, *_round_shape(st), weight_bytes) for st in steps]
