"""LLaDA2.0 (``llada2_moe``): block diffusion with a KV cache on Ling-2.0 MoE layers, and the expert union of every forward.

Wing: ``backbones``. LLaDA2.0 (inclusionAI, "LLaDA2.0: Scaling Up Diffusion Language Models to 100B", 2025;
hub ``inclusionAI/LLaDA2.0-mini`` -- 16 B parameters, about 1.4 B active -- and ``-flash``, 100 B / 6.1 B)
writes its answer a block at a time: blocks aligned to absolute positions, attention full within a block
and causal across blocks, the block being written denoised in parallel. That is SDAR's attention, so the
model runs on the project's block-causal machinery (`clover_engine.backbones.block_causal`): the block
decoder commits every finished block's K/V to a cache once. The hub's ``generate`` instead recomputes the
prompt and the finished blocks under its block-causal mask at every step, and LLaDA2.0's own sampler here
does the same (`LLaDA2MoeModel.recompute_logits`): equal logits in exact arithmetic, but in bf16 a forward
over fewer rows rounds differently, enough to part answers on a near tie
(`clover_engine.decoding.llada2_samplers.LLaDA2Sampler.kv_cache`).

The decoder layers are the hub's ``modeling_llada2_moe.py`` (Ling-2.0 / BailingMoeV2 layout), computed here
with the same tensor operations in the same order:

* **Attention**: one fused ``query_key_value`` projection, per-head RMSNorm on queries and keys
  (``query_layernorm`` / ``key_layernorm``, always applied), RoPE on the first ``partial_rotary_factor`` of
  each head (half-split layout), grouped-query SDPA, output projection ``dense`` (bias when ``use_bias``).
* **MoE feed-forward** (`LLaDA2SparseMoe`) in layers ``i >= first_k_dense_replace``, a dense SwiGLU of
  ``intermediate_size`` before them. The router is DeepSeek-V3's auxiliary-loss-free kind (Liu et al.,
  "DeepSeek-V3 Technical Report", 2024, §2.1.2): **sigmoid** scores of fp32 logits; the expert bias
  (``expert_bias``, a buffer) is added for the choice only; **group-limited** top-k -- the E experts
  in ``n_group`` groups, a group scored by its two best experts, the ``topk_group`` best groups kept,
  the top k of their experts chosen; the k unbiased scores renormalised to sum 1 (k > 1) and multiplied by
  ``routed_scaling_factor``. Expert outputs are summed in fp32 with those weights, then the shared
  expert (``moe_intermediate_size * num_shared_experts`` wide) is added.

Each forward reports the union of the experts its tokens chose, the tokens per expert and the router's
entropy (`clover_engine.backbones.moe.RoutingStats`; the entropy of the sigmoid scores normalised over
the E experts), through `clover_engine.backbones.sdar_moe.SDARMoeModel`; the cost model prices the expert
weights by the measured union. Loading is lean: built on the meta device, filled one safetensors tensor
at a time, in the checkpoint's dtype (bf16 for the hub's).

Formats (``config.json``): ``model_type`` ``llada2_moe``, the hub's field and weight names
(``model.word_embeddings``, ``model.layers.{i}.attention.query_key_value.weight``,
``model.layers.{i}.mlp.gate.expert_bias``, ``model.layers.{i}.mlp.shared_experts.up_proj.weight``, ...). The
MASK id is the config's ``mask_token_id``, else the tokenizer's ``<|mask|>``, else 156895, and the end of
text 156892 (the hub ``generate``'s defaults); ``generation_config.json``'s ``eos_token_id`` wins.

Shape letters: T tokens of a forward, H hidden size, E experts, k experts per token, V vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from clover_engine.backbones.block_causal import (
    CHATML_TEMPLATE, BlockCausalConfig, _stop_id, _tokenizer_mask_id, block_causal_mask,
)
from clover_engine.backbones.causal_lm.model import HFBlockConfig, count_parameters
from clover_engine.backbones.llada_moe import RMSNorm, fill_random, rope
from clover_engine.backbones.moe import EXPERT_MODES, ExpertSplit, GatedMLP, MoEDims, PerThread, Routing, routing_stats
from clover_engine.backbones.safetensors_shards import (
    checkpoint_dtype, load_shards, materialize_buffers, meta_tensors, read_header, save_weights, shard_files,
)
from clover_engine.backbones.sdar_moe import SDARMoeModel
from clover_engine.prompting import CHECKPOINT, CheckpointChatTemplate

MODEL_TYPE = "llada2_moe"
MASK_TOKEN, MASK_TOKEN_ID, EOS_TOKEN_ID = "<|mask|>", 156895, 156892
"""The MASK token and the ids the hub ``generate`` of LLaDA2.0 defaults to (``mask_id``, ``eos_id``)."""
BLOCK_SIZE = 32
"""The hub ``generate``'s ``block_length`` (LLaDA2.0's model cards decode in blocks of 32)."""


@dataclass(frozen=True)
class LLaDA2Arch:
    """The dimensions of a LLaDA2.0 network, from ``config.json`` (the hub ``LLaDA2MoeConfig`` field names).

    Attributes:
        vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim:
            as named (``head_dim`` defaults to ``hidden_size // num_attention_heads``).
        intermediate_size: the dense layers' SwiGLU width. moe_intermediate_size: each expert's.
        num_experts, num_experts_per_tok, num_shared_experts: E, k and the shared experts (their width
            adds up into one SwiGLU).
        n_group, topk_group, routed_scaling_factor: the group-limited router (module docstring).
        first_k_dense_replace: layers ``i < first_k_dense_replace`` are dense.
        rotary_dim: ``int(head_dim * partial_rotary_factor)``. rope_theta, rms_norm_eps: as named.
        use_qkv_bias, use_bias: biases of ``query_key_value`` and of ``dense``.
        max_position_embeddings, tie_word_embeddings: as named.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_experts: int
    num_experts_per_tok: int
    num_shared_experts: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    first_k_dense_replace: int
    rotary_dim: int
    rope_theta: float
    rms_norm_eps: float
    use_qkv_bias: bool
    use_bias: bool
    max_position_embeddings: int
    tie_word_embeddings: bool

    @classmethod
    def from_config(cls, data: dict, where: str = "config.json") -> "LLaDA2Arch":
        """Read a ``config.json`` dict.

        Raises:
            ValueError: a missing or non-numeric field, E not divisible into ``n_group`` groups of at least
                two, ``topk_group`` outside [1, n_group], k outside [1, the experts of ``topk_group`` groups],
                or a ``rope_scaling`` other than none / default -- each naming the field.
        """
        try:
            H, heads = int(data["hidden_size"]), int(data["num_attention_heads"])
            kv = int(data.get("num_key_value_heads") or heads)
            hd = int(data.get("head_dim") or H // heads)
            E, k = int(data["num_experts"]), int(data["num_experts_per_tok"])
            groups, topk_group = int(data.get("n_group") or 1), int(data.get("topk_group") or 1)
            arch = cls(vocab_size=int(data["vocab_size"]), hidden_size=H, intermediate_size=int(data["intermediate_size"]),
                       moe_intermediate_size=int(data["moe_intermediate_size"]),
                       num_hidden_layers=int(data["num_hidden_layers"]), num_attention_heads=heads,
                       num_key_value_heads=kv, head_dim=hd, num_experts=E, num_experts_per_tok=k,
                       num_shared_experts=int(data.get("num_shared_experts") or 0), n_group=groups,
                       topk_group=topk_group, routed_scaling_factor=float(data.get("routed_scaling_factor", 1.0)),
                       first_k_dense_replace=int(data.get("first_k_dense_replace") or 0),
                       rotary_dim=int(hd * float(data.get("partial_rotary_factor", 1.0))),
                       rope_theta=float(data.get("rope_theta", 10000.0)), rms_norm_eps=float(data.get("rms_norm_eps", 1e-5)),
                       use_qkv_bias=bool(data.get("use_qkv_bias", False)), use_bias=bool(data.get("use_bias", True)),
                       max_position_embeddings=int(data.get("max_position_embeddings", 16384)),
                       tie_word_embeddings=bool(data.get("tie_word_embeddings", False)))
        except KeyError as e:
            raise ValueError(f"{where}: a LLaDA2.0 config needs {e.args[0]!r} (the hub LLaDA2MoeConfig field)") from e
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: a LLaDA2.0 config field is not a number ({e})") from e
        if E % groups or E // groups < 2:
            raise ValueError(f"{where}: num_experts={E} must split into n_group={groups} groups of at least 2 experts "
                             "(the router scores a group by its two best experts)")
        if not 1 <= topk_group <= groups:
            raise ValueError(f"{where}: topk_group={topk_group} must be in [1, n_group={groups}]")
        if not 1 <= k <= topk_group * (E // groups):
            raise ValueError(f"{where}: num_experts_per_tok={k} must be in [1, {topk_group * (E // groups)}] "
                             f"(the experts of topk_group={topk_group} groups)")
        scaling = data.get("rope_scaling")
        if scaling and (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
            raise ValueError(f"{where}: rope_scaling {scaling} is not supported (only the default RoPE of the "
                             "published LLaDA2.0 checkpoints)")
        return arch


def group_limited_top_k(router_logits: torch.Tensor, top_k: int, n_group: int, topk_group: int,
                        expert_bias: torch.Tensor | None, routed_scaling_factor: float,
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LLaDA2.0's router (``LLaDA2MoeGate`` of the hub modeling file; DeepSeek-V3's, module docstring).

    Args:
        router_logits: [T, E] fp32.
        top_k: k. n_group, topk_group: the groups and how many are kept.
        expert_bias: [E] added to the sigmoid scores for the choice only, or None.
        routed_scaling_factor: multiplies the renormalised weights.

    Returns:
        (weights [T, k] fp32, selected [T, k] int64 in descending biased score, scores [T, E] fp32 sigmoid).
    """
    scores = torch.sigmoid(router_logits.float()).type_as(router_logits)
    biased = scores if expert_bias is None else scores + expert_bias
    T = biased.shape[0]
    group_scores = biased.view(T, n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(T, n_group, biased.shape[1] // n_group).reshape(T, -1)
    _, selected = torch.topk(biased.masked_fill(~score_mask.bool(), float("-inf")), k=top_k, dim=-1)
    chosen = torch.gather(scores, dim=1, index=selected).type_as(router_logits)
    weights = chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20) if top_k > 1 else chosen
    return weights * routed_scaling_factor, selected, scores


class Router(nn.Module):
    """The router's parameters under the hub names: ``weight`` [E, H] and the ``expert_bias`` [E] buffer."""

    def __init__(self, hidden_size: int, num_experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.register_buffer("expert_bias", torch.zeros(num_experts))


class LLaDA2SparseMoe(nn.Module):
    """A LLaDA2.0 MoE feed-forward: ``gate`` (`Router`), ``experts`` (E `GatedMLP`) and, when
    ``num_shared_experts`` is set, ``shared_experts`` (one `GatedMLP` as wide as them all).

    Args:
        a: the `LLaDA2Arch`.

    Attributes:
        mode: one of `clover_engine.backbones.moe.EXPERT_MODES`: ``routed`` (only the chosen experts run,
            each on its rows) or ``all`` (every expert on every token; the reference). Same result.
        record / last: keep the last forward's `clover_engine.backbones.moe.Routing` (``probs`` = the sigmoid
            scores normalised over E).
        split: this rank's `clover_engine.backbones.moe.ExpertSplit` under expert parallelism, or None.
    """

    last = PerThread()  # each thread's own last forward (`clover_engine.backbones.moe.PerThread`)

    def __init__(self, a: LLaDA2Arch):
        super().__init__()
        self.a = a
        self.num_experts, self.top_k = a.num_experts, a.num_experts_per_tok
        self.gate = Router(a.hidden_size, a.num_experts)
        self.experts = nn.ModuleList(GatedMLP(a.hidden_size, a.moe_intermediate_size) for _ in range(a.num_experts))
        if a.num_shared_experts:
            self.shared_experts = GatedMLP(a.hidden_size, a.moe_intermediate_size * a.num_shared_experts)
        self.mode, self.record, self.last = "routed", False, None
        self.split: ExpertSplit | None = None  # expert parallel: this rank's experts (moe.split_moe_layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, H] -> [B, T, H] (input dtype).

        Raises:
            ValueError: ``mode`` not one of `EXPERT_MODES`.
        """
        a, shape = self.a, x.shape
        h = x.reshape(-1, shape[-1])
        logits = F.linear(h.type(torch.float32), self.gate.weight.type(torch.float32))
        weights, selected, scores = group_limited_top_k(logits, self.top_k, a.n_group, a.topk_group,
                                                        self.gate.expert_bias, a.routed_scaling_factor)
        if self.record:
            self.last = Routing(selected=selected, weights=weights, probs=scores / scores.sum(-1, keepdim=True))
        if self.mode not in EXPERT_MODES:
            raise ValueError(f"LLaDA2SparseMoe.mode must be one of {EXPERT_MODES}, got {self.mode!r}")
        per_slot = h.new_zeros(h.shape[0], self.top_k, h.shape[1])  # [T, k, H]: expert outputs, the router's order
        split = self.split
        experts = torch.unique(selected).tolist() if self.mode == "routed" or split else range(self.num_experts)
        for e in experts:
            if split is not None and not split.owns(e):
                continue  # another rank's expert: its rows arrive in the all-reduce below
            rows, slot = torch.where(selected == e)
            if self.mode == "routed" or split is not None:
                per_slot[rows, slot] = self.experts[e](h[rows])
            else:
                per_slot[rows, slot] = self.experts[e](h)[rows]
        if split is not None:  # expert parallel: each (token, slot) computed by one rank, the others add zeros
            split.combine(per_slot)
        y = per_slot.type(weights.dtype).mul_(weights.unsqueeze(-1)).sum(dim=1).type(h.dtype)
        return (y + self.shared_experts(h)).reshape(shape) if a.num_shared_experts else y.reshape(shape)


class Attention(nn.Module):
    """Block-causal grouped-query attention with a KV cache (module docstring), hub weight names."""

    def __init__(self, a: LLaDA2Arch, layer_idx: int):
        super().__init__()
        self.a, self.layer_idx = a, layer_idx
        hd = a.head_dim
        self.query_key_value = nn.Linear(a.hidden_size, (a.num_attention_heads + 2 * a.num_key_value_heads) * hd,
                                         bias=a.use_qkv_bias)
        self.query_layernorm = RMSNorm(hd, a.rms_norm_eps)
        self.key_layernorm = RMSNorm(hd, a.rms_norm_eps)
        self.dense = nn.Linear(a.num_attention_heads * hd, a.hidden_size, bias=a.use_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                cache: Any) -> torch.Tensor:
        """x [B, T, H]; cos / sin [1, 1, T, rotary_dim]; mask [1, 1, T, C + T] additive (or None);
        ``cache`` a transformers ``DynamicCache`` (appended to) or None."""
        a, (B, T, _) = self.a, x.shape
        heads, kv = a.num_attention_heads, a.num_key_value_heads
        qkv = self.query_key_value(x).view(B, T, heads + 2 * kv, a.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.split([heads, kv, kv], dim=-2))
        q, k = rope(self.query_layernorm(q), cos, sin), rope(self.key_layernorm(k), cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        if heads != kv:
            k, v = (t[:, :, None].expand(B, kv, heads // kv, *t.shape[2:]).reshape(B, heads, *t.shape[2:]) for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.dense(out.transpose(1, 2).contiguous().reshape(B, T, -1))


class DecoderLayer(nn.Module):
    """Pre-norm block: attention, then the MoE (layers ``>= first_k_dense_replace``) or dense feed-forward."""

    def __init__(self, a: LLaDA2Arch, i: int):
        super().__init__()
        self.attention = Attention(a, i)
        self.moe = i >= a.first_k_dense_replace
        self.mlp: nn.Module = LLaDA2SparseMoe(a) if self.moe else GatedMLP(a.hidden_size, a.intermediate_size)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache) -> torch.Tensor:
        x = x + self.attention(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LLaDA2LM(nn.Module):
    """The LLaDA2.0 network under the hub's weight names (``model.word_embeddings``, ``model.layers``,
    ``model.norm``, ``lm_head``), called like a transformers causal LM with a cache by
    `clover_engine.backbones.block_causal.BlockCausalModel`.

    Args:
        arch: the `LLaDA2Arch`.
    """

    def __init__(self, arch: LLaDA2Arch):
        super().__init__()
        self.arch = arch
        self.model = nn.Module()
        self.model.word_embeddings = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.model.layers = nn.ModuleList(DecoderLayer(arch, i) for i in range(arch.num_hidden_layers))
        self.model.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.model.word_embeddings.weight

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (the backbone reads its device and dtype from it)."""
        return self.model.word_embeddings

    def moe_layers(self) -> list[LLaDA2SparseMoe]:
        """The MoE feed-forwards, in layer order."""
        return [layer.mlp for layer in self.model.layers if layer.moe]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: Any = None, use_cache: bool = True,
                **_: Any) -> SimpleNamespace:
        """One forward of T tokens after the cached ones.

        Args:
            input_ids: [1, T] int64.
            attention_mask: [1, 1, T, C + T] additive mask (C cached tokens), or None (full attention).
            position_ids: [1, T] int64 absolute positions (default C .. C + T - 1).
            past_key_values: a transformers ``DynamicCache`` the T tokens' K/V are appended to, or None.
            use_cache: unused (the cache is appended to whenever one is given).

        Returns:
            A namespace with ``logits`` [1, T, V] in the weights' dtype.
        """
        a = self.arch
        x = self.model.word_embeddings(input_ids)
        if position_ids is None:
            start = 0 if past_key_values is None else past_key_values.get_seq_length()
            position_ids = torch.arange(start, start + input_ids.shape[1], device=x.device)[None]
        d = a.rotary_dim
        inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=x.device).float() / d))
        freqs = position_ids.float()[..., None] * inv_freq  # [1, T, d/2] fp32 (the hub: a matmul of one term)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype)[:, None], emb.sin().to(x.dtype)[:, None]
        mask = None if attention_mask is None else attention_mask.to(x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, past_key_values)
        return SimpleNamespace(logits=self.lm_head(self.model.norm(x)))


@dataclass
class LLaDA2Config(BlockCausalConfig, MoEDims):
    """`clover_engine.backbones.block_causal.BlockCausalConfig` plus the MoE dimensions
    (`clover_engine.backbones.moe.MoEDims`; the shared experts as one ``shared_expert_intermediate_size``)."""


class LLaDA2MoeModel(SDARMoeModel):
    """A LLaDA2.0 model (module docstring): block-causal decoding with the KV cache, routing reported."""

    config_cls = LLaDA2Config

    def moe_layers(self) -> list[LLaDA2SparseMoe]:
        """The MoE feed-forwards, in layer order."""
        return self.lm.moe_layers()

    def recompute_logits(self, window: torch.Tensor, block_len: int) -> torch.Tensor:
        """One forward over a whole window, as LLaDA2.0's ``generate`` runs every step: the prompt, the
        finished blocks and the block being written, under the block-causal mask from position 0, no cache.

        Args:
            window: [1, W] int64, W a multiple of ``block_len`` (blocks aligned to position 0).
            block_len: L, the block size; the last L positions are the block being written.

        Returns:
            [1, L, V] fp32 logits of the block's slots; `last_routing` covers all W tokens (the block's rows
            the last L).

        Raises:
            ValueError: W past ``max_position_embeddings``.
        """
        W = window.shape[1]
        if W > self.config.max_position_embeddings:
            raise ValueError(f"position {W} exceeds max_position_embeddings={self.config.max_position_embeddings}; "
                             "shorten the prompt or the answer budget")
        mask = block_causal_mask(0, W, block_len, self.dtype, self.device)
        logits = self.lm(input_ids=window.to(self.device), attention_mask=mask).logits
        self.last_routing = routing_stats([m.last for m in self.moe_layers()], slice(W - block_len, W))
        return logits[:, -block_len:].float()

    def set_expert_mode(self, mode: str) -> None:
        """Compute the experts ``routed`` (default) or ``all`` in every MoE layer (same result).

        Raises:
            ValueError: a mode not in `clover_engine.backbones.moe.EXPERT_MODES`.
        """
        if mode not in EXPERT_MODES:
            raise ValueError(f"expert mode must be one of {EXPERT_MODES}, got {mode!r}")
        for m in self.moe_layers():
            m.mode = mode


def load_llada2_moe(path: str | Path, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None) -> LLaDA2MoeModel:
    """Load a LLaDA2.0 checkpoint directory (hub layout, ``model_type`` ``llada2_moe``) as a `LLaDA2MoeModel`, leanly.

    Built on the meta device, then the safetensors shards are read one tensor at a time straight into
    ``dtype`` on ``device`` (peak memory: the weights plus the largest tensor). Callers hold
    `clover_engine.backbones.registry.BUILD_LOCK` (``load_model`` does).

    Args:
        path: the directory (``config.json`` + ``*.safetensors``), or a file in it.
        device: where the weights are read to.
        dtype: the weights' dtype; None = the checkpoint's own (bf16 for the hub's). Logits are fp32.

    Returns:
        The model in ``eval()`` mode; ``model_id`` = the directory's name; the block size it was trained with
        is the config's ``block_size`` / ``bd_size``, else 32 (`BLOCK_SIZE`).

    Raises:
        ValueError: no config.json, a config `LLaDA2Arch.from_config` refuses, a MASK or end-of-text id
            outside the vocabulary, no safetensors, a truncated / corrupt shard, or weights that do not
            match the architecture (missing or unexpected names, wrong shapes).
    """
    directory = Path(path)
    directory = directory.parent if directory.is_file() else directory
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{directory} has no config.json; a LLaDA2.0 checkpoint directory holds config.json "
                         "and *.safetensors")
    data = json.loads(config_path.read_text(encoding="utf-8"))
    arch = LLaDA2Arch.from_config(data, str(config_path))
    mask_id = data.get("mask_token_id")
    mask_id = int(mask_id if mask_id is not None else _tokenizer_mask_id(directory, MASK_TOKEN) or MASK_TOKEN_ID)
    eos = _stop_id(directory)
    eos = eos if eos is not None else data.get("eos_token_id", EOS_TOKEN_ID)
    eos = int(eos[0] if isinstance(eos, list) else eos)
    for what, tok in (("MASK id", mask_id), ("end-of-text id", eos)):
        if not 0 <= tok < arch.vocab_size:
            raise ValueError(f"{directory}: the {what} {tok} is outside the vocabulary [0, {arch.vocab_size}); "
                             "set mask_token_id / eos_token_id in config.json")
    shards = [read_header(f) for f in shard_files(directory)]
    dtype = dtype or checkpoint_dtype(data, shards)
    with torch.device("meta"):  # no memory, no random init; safe under BUILD_LOCK
        lm = LLaDA2LM(arch).to(dtype)
    tied = frozenset({"lm_head.weight"}) if arch.tie_word_embeddings else frozenset()
    load_shards(lm, shards, device=device, optional=tied, what="a llada2_moe model of this config")
    if tied:
        lm.lm_head.weight = lm.model.word_embeddings.weight
    materialize_buffers(lm, device)
    left = meta_tensors(lm)
    if left:
        raise ValueError(f"{directory}: {len(left)} tensor(s) were left unloaded (on the meta device): {left[:5]}")
    flags = [int(layer.moe) for layer in lm.model.layers]
    base = HFBlockConfig(name=directory.name, model_type=MODEL_TYPE, vocab_size=arch.vocab_size, mask_token_id=mask_id,
                         eos_token_id=eos, max_position_embeddings=arch.max_position_embeddings,
                         hidden_size=arch.hidden_size, intermediate_size=arch.intermediate_size,
                         num_hidden_layers=arch.num_hidden_layers, num_attention_heads=arch.num_attention_heads,
                         num_key_value_heads=arch.num_key_value_heads, head_dim=arch.head_dim,
                         tie_word_embeddings=arch.tie_word_embeddings, num_parameters=count_parameters(lm.eval()))
    block = int(data.get("block_size") or data.get("bd_size") or BLOCK_SIZE)
    cfg = LLaDA2Config(**vars(base), family="llada2", logit_shift=False, block_size=block,
                       num_experts=arch.num_experts, num_experts_per_tok=arch.num_experts_per_tok,
                       moe_intermediate_size=arch.moe_intermediate_size,
                       shared_expert_intermediate_size=arch.moe_intermediate_size * arch.num_shared_experts,
                       moe_layer_flags=flags)
    model = LLaDA2MoeModel(lm, cfg).eval()
    model.checkpoint_chat = CheckpointChatTemplate.from_directory(directory)
    model.chat_format = CHECKPOINT if model.checkpoint_chat is not None else None
    return model


def tiny_config(vocab_size: int, **changes: Any) -> dict:
    """A tiny LLaDA2.0 ``config.json`` (hub field names): 3 layers (the first dense), hidden 64, 4 / 2 heads of
    16, 8 experts of 32 in 4 groups (2 kept), top-2, one shared expert, RoPE on half of each head;
    ``changes`` override fields."""
    data = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="silu",
                use_qkv_bias=False, use_qk_norm=True, use_bias=False, rms_norm_eps=1e-6, norm_head=False,
                tie_word_embeddings=False, embedding_dropout=0.0, attention_dropout=0.0, output_dropout=0.0,
                initializer_range=0.02, max_position_embeddings=2048, rope_theta=600000.0, use_cache=False,
                rope_scaling=None, num_experts=8, num_shared_experts=1, num_experts_per_tok=2, n_group=4,
                topk_group=2, routed_scaling_factor=2.5, first_k_dense_replace=1, output_router_logits=False,
                partial_rotary_factor=0.5, pad_token_id=0, eos_token_id=2)
    data.update(changes)
    return data


def save_llada2_moe(lm: LLaDA2LM, path: str | Path, config: dict) -> Path:
    """Write ``lm`` as a LLaDA2.0 hub checkpoint: ``config.json`` (``config``, the hub ``LLaDA2MoeConfig``
    fields, with ``model_type`` ``llada2_moe`` and architecture ``LLaDA2MoeModelLM``) and ``model.safetensors``
    under the hub's weight names."""

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in lm.state_dict().items()}
    if lm.arch.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_weights(state, out / "model.safetensors")
    data = dict(config, model_type=MODEL_TYPE, architectures=["LLaDA2MoeModelLM"])
    (out / "config.json").write_text(json.dumps(data, indent=2))
    return out


def write_tiny_llada2_moe(directory: str | Path, seed: int = 0, sharpen: float = 100.0, **changes: Any) -> Path:
    """Write a tiny random LLaDA2.0 checkpoint in the hub layout, with a byte-level tokenizer (its ``<|mask|>``
    an added token, ``<|im_end|>`` the end of a turn), a ChatML chat template and ``generation_config.json``,
    to try the engine and the explorer without a download.

    ``changes`` override `tiny_config` fields; every tensor is drawn from a generator seeded with ``seed``
    (`clover_engine.backbones.llada_moe.fill_random`: the router wide, the output layer times ``sharpen``),
    the expert bias included.
    """
    from clover_engine.tokenizer import byte_tokenizer  # local: only this writer needs it

    out = Path(directory)
    tok = byte_tokenizer()
    tok.add_special_tokens([MASK_TOKEN])
    mask_id, eos, pad = tok.token_to_id(MASK_TOKEN), tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    data = tiny_config(tok.get_vocab_size(), **dict(dict(pad_token_id=pad, eos_token_id=eos), **changes))
    lm = LLaDA2LM(LLaDA2Arch.from_config(data))
    fill_random(lm, 5000 + seed, sharpen)
    save_llada2_moe(lm.eval(), out, data)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                                           "mask_token": MASK_TOKEN, "chat_template": CHATML_TEMPLATE}))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, pad], "pad_token_id": pad}))
    return out


__all__ = ["BLOCK_SIZE", "EOS_TOKEN_ID", "MASK_TOKEN", "MASK_TOKEN_ID", "MODEL_TYPE", "LLaDA2Arch", "LLaDA2Config",
           "LLaDA2LM", "LLaDA2MoeModel", "LLaDA2SparseMoe", "group_limited_top_k", "load_llada2_moe", "save_llada2_moe",
           "tiny_config", "write_tiny_llada2_moe"]
