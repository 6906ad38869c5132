"""LLaDA-MoE: masked diffusion over a mixture-of-experts transformer, with its expert union observed.

Wing: ``backbones``. LLaDA-MoE (inclusionAI, "LLaDA-MoE: A Sparse MoE Diffusion Language Model",
2025; hub ``inclusionAI/LLaDA-MoE-7B-A1B-Instruct`` / ``-Base``: 7 B parameters, about 1.4 B active,
64 experts, top-8) is LLaDA's masked diffusion -- bidirectional attention, every MASK predicted from
its own position, LLaDA's block-wise ``generate`` -- on an OLMoE-style decoder: per-head RMSNorm on
queries and keys before RoPE (``qk_layernorm``), RoPE on the first ``partial_rotary_factor`` of each
head, and a MoE feed-forward (`clover_engine.backbones.moe.MoEFeedForward`: softmax router, plus an
expert bias when the checkpoint has one, top-k, weights not renormalised) in the layers
``moe_layer_freq`` marks, a dense SwiGLU in the others, and a shared expert beside the routed ones when
``shared_expert_intermediate_size`` is set.

Decoding is the dense LLaDA's (`clover_engine.backbones.masked_diffusion.MaskedDiffusionModel` and
LLaDA's sampler, `clover_engine.decoding.masked_diffusion_decoder`); only the feed-forward differs. The
backbone declares the ``expert_union`` observable: each forward reports per layer the distinct experts
its tokens chose, and `routing` gives the union over the block's slots, over the history and over
both, the tokens each expert got and the router's entropy (`clover_engine.backbones.moe.RoutingStats`);
the cost model prices the forward's expert weights by that measured union (`clover_engine.cost.dense`).

Formats (``config.json``): ``model_type`` ``lladamoe`` / ``llada_moe``, or ``llada`` with MoE fields
(``num_experts``; copies of the hub config differ), weight names of the hub's ``LLaDAMoEModelLM``
(``model.layers.{i}.mlp.experts.{e}.gate_proj.weight``, ``model.layers.{i}.shared_expert...``). The MASK
id is the config's ``mask_token_id``, else the tokenizer's ``<|mask|>``, else 156895 (the published
LLaDA-MoE tokenizer's); the end of a turn is ``generation_config.json``'s / the config's ``eos_token_id``.
Loading is lean, as for every family: built on the meta device, filled one safetensors tensor at a time.

Shape letters: T tokens of a forward, H hidden size, V vocabulary.
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

from clover_engine.backbones.base import BlockOutput, Capabilities
from clover_engine.backbones.block_causal import CHATML_TEMPLATE, _stop_id, _tokenizer_mask_id
from clover_engine.backbones.causal_lm.model import count_parameters
from clover_engine.backbones.masked_diffusion import MaskedDiffusionConfig, MaskedDiffusionModel, MaskedDiffusionState
from clover_engine.backbones.moe import GatedMLP, MoEDims, MoEFeedForward, PerThread, RoutingStats, routing_stats
from clover_engine.backbones.safetensors_shards import (
    checkpoint_dtype, load_shards, meta_tensors, read_header, save_weights, shard_files,
)
from clover_engine.prompting import CHECKPOINT, CheckpointChatTemplate

MODEL_TYPES = ("lladamoe", "llada_moe")
"""``config.json`` ``model_type`` values of LLaDA-MoE checkpoints (plus ``llada`` with ``num_experts``)."""

MASK_TOKEN, MASK_TOKEN_ID, EOS_TOKEN_ID = "<|mask|>", 156895, 156892
"""The published LLaDA-MoE tokenizer's MASK token and ids (inclusionAI's dInfer benchmarks use them)."""


def is_moe_config(data: dict) -> bool:
    """True for a ``config.json`` (dict) of LLaDA-MoE: its model type, or ``llada`` with ``num_experts`` > 0."""
    mt = str(data.get("model_type", "")).lower()
    return mt in MODEL_TYPES or (mt == "llada" and int(data.get("num_experts") or 0) > 0)


@dataclass
class LLaDAMoEArch:
    """The architecture fields of a LLaDA-MoE ``config.json`` (the hub ``LLaDAConfig``'s names).

    Attributes:
        moe_layers: per layer, True for a MoE feed-forward (``moe_layer_freq[i] != 0``; all when absent).
        rotary_dim: dimensions of each head RoPE rotates (``head_dim * partial_rotary_factor``).
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    dense_intermediate_size: int
    expert_intermediate_size: int
    shared_expert_intermediate_size: int | None
    num_experts: int
    num_experts_per_tok: int
    moe_layers: list[bool]
    expert_bias: bool
    qk_layernorm: bool
    rope_theta: float
    rotary_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    clip_qkv: float | None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_config(cls, data: dict, where: str = "config.json") -> "LLaDAMoEArch":
        """Read and check the fields.

        Raises:
            ValueError: a missing field, a RoPE scaling other than none, an activation other than
                silu, a head count that does not divide the hidden size, or a ``moe_layer_freq`` that
                is not one entry per layer -- each naming the field and what is expected.
        """
        try:
            H, N, heads = int(data["hidden_size"]), int(data["num_hidden_layers"]), int(data["num_attention_heads"])
            E, k = int(data["num_experts"]), int(data["num_experts_per_tok"])
            vocab, expert_i = int(data["vocab_size"]), int(data["expert_intermediate_size"])
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: a LLaDA-MoE config needs hidden_size, num_hidden_layers, num_attention_heads, "
                             f"num_experts, num_experts_per_tok, vocab_size and expert_intermediate_size ({e})") from e
        if H % heads:
            raise ValueError(f"{where}: hidden_size={H} is not a multiple of num_attention_heads={heads}")
        if data.get("rope_scaling"):
            raise ValueError(f"{where}: rope_scaling={data['rope_scaling']!r} is not supported (plain RoPE only)")
        if str(data.get("hidden_act", "silu")).lower() != "silu":
            raise ValueError(f"{where}: hidden_act={data['hidden_act']!r} is not supported (silu)")
        freq = data.get("moe_layer_freq") or [1] * N
        if not isinstance(freq, list) or len(freq) != N:
            raise ValueError(f"{where}: moe_layer_freq must list one entry per layer ({N}), got {freq!r}")
        partial = float(data.get("partial_rotary_factor") or 1.0)
        if not 0 < partial <= 1:
            raise ValueError(f"{where}: partial_rotary_factor must be in (0, 1], got {partial}")
        rope = data.get("rope_parameters") or {}
        shared = data.get("shared_expert_intermediate_size")
        return cls(
            vocab_size=vocab, hidden_size=H, num_hidden_layers=N, num_attention_heads=heads,
            num_key_value_heads=int(data.get("num_key_value_heads") or heads),
            dense_intermediate_size=int(data.get("dense_intermediate_size") or 0), expert_intermediate_size=expert_i,
            shared_expert_intermediate_size=int(shared) if shared else None, num_experts=E, num_experts_per_tok=k,
            moe_layers=[bool(f) for f in freq], expert_bias=bool(data.get("moe_router_enable_expert_bias")),
            qk_layernorm=bool(data.get("qk_layernorm")),
            rope_theta=float(data.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            rotary_dim=int(H // heads * partial), rms_norm_eps=float(data.get("rms_norm_eps") or 1e-5),
            max_position_embeddings=int(data.get("max_position_embeddings") or 4096),
            tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
            attention_bias=bool(data.get("attention_bias", False)),
            clip_qkv=None if data.get("clip_qkv") is None else float(data["clip_qkv"]))


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich, 2019) computed in fp32, cast back, then scaled -- the order of the hub code."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (Su et al., RoFormer, 2021; the half-split layout) on the first ``cos.shape[-1]``
    dimensions of each head of ``x`` [B, heads, T, head_dim]; the rest pass unchanged."""
    d = cos.shape[-1]
    rot, rest = x[..., :d], x[..., d:]
    half = torch.cat((-rot[..., d // 2:], rot[..., : d // 2]), dim=-1)
    return torch.cat((rot * cos + half * sin, rest), dim=-1)


class Attention(nn.Module):
    """Bidirectional grouped-query attention with optional per-head q / k RMSNorm before RoPE."""

    def __init__(self, a: LLaDAMoEArch):
        super().__init__()
        self.a = a
        hd = a.head_dim
        self.q_proj = nn.Linear(a.hidden_size, a.num_attention_heads * hd, bias=a.attention_bias)
        self.k_proj = nn.Linear(a.hidden_size, a.num_key_value_heads * hd, bias=a.attention_bias)
        self.v_proj = nn.Linear(a.hidden_size, a.num_key_value_heads * hd, bias=a.attention_bias)
        self.o_proj = nn.Linear(a.num_attention_heads * hd, a.hidden_size, bias=a.attention_bias)
        if a.qk_layernorm:
            self.q_norm = RMSNorm(hd, a.rms_norm_eps)
            self.k_norm = RMSNorm(hd, a.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        a, (B, T, _) = self.a, x.shape
        hd = a.head_dim
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if a.qk_layernorm:
            q = self.q_norm(q.reshape(-1, hd)).reshape(B, T, -1)
            k = self.k_norm(k.reshape(-1, hd)).reshape(B, T, -1)
        if a.clip_qkv is not None:
            q, k, v = (t.clamp(-a.clip_qkv, a.clip_qkv) for t in (q, k, v))
        q = rope(q.view(B, T, -1, hd).transpose(1, 2), cos, sin)
        k = rope(k.view(B, T, -1, hd).transpose(1, 2), cos, sin)
        v = v.view(B, T, -1, hd).transpose(1, 2)
        rep = a.num_attention_heads // a.num_key_value_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class DecoderLayer(nn.Module):
    """Pre-norm block: attention, then the feed-forward (MoE or dense) plus the shared expert if any."""

    def __init__(self, a: LLaDAMoEArch, i: int):
        super().__init__()
        self.self_attn = Attention(a)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.moe = a.moe_layers[i]
        if self.moe:
            self.mlp: nn.Module = MoEFeedForward(a.hidden_size, a.expert_intermediate_size, a.num_experts,
                                                 a.num_experts_per_tok, expert_bias=a.expert_bias)
            if a.shared_expert_intermediate_size:
                self.shared_expert = GatedMLP(a.hidden_size, a.shared_expert_intermediate_size)
        else:
            self.mlp = GatedMLP(a.hidden_size, a.dense_intermediate_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        h = self.post_attention_layernorm(x)
        y = self.mlp(h)
        if hasattr(self, "shared_expert"):
            y = y + self.shared_expert(h)
        return x + y


class LLaDAMoELM(nn.Module):
    """The LLaDA-MoE network under the hub's weight names (``model.embed_tokens``, ``model.layers``,
    ``model.norm``, ``lm_head``), called like a transformers causal LM by `MaskedDiffusionModel`.

    Args:
        arch: the `LLaDAMoEArch`.
    """

    def __init__(self, arch: LLaDAMoEArch):
        super().__init__()
        self.arch = arch
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.model.layers = nn.ModuleList(DecoderLayer(arch, i) for i in range(arch.num_hidden_layers))
        self.model.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (the backbone reads its device and dtype from it)."""
        return self.model.embed_tokens

    def moe_layers(self) -> list[MoEFeedForward]:
        """The MoE feed-forwards, in layer order."""
        return [layer.mlp for layer in self.model.layers if layer.moe]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, logits_to_keep: torch.Tensor | None = None,
                **_: Any) -> SimpleNamespace:
        """One bidirectional forward.

        Args:
            input_ids: [1, T] int64.
            attention_mask: [1, 1, T, T] additive float mask, or None (every position sees every
                position; an all-zero mask is the same and is dropped).
            position_ids: [1, T] int64 (default 0 .. T-1).
            logits_to_keep: [R] int64 rows to return logits for (default all).

        Returns:
            A namespace with ``logits`` [1, R, V] in the weights' dtype.
        """
        a = self.arch
        T = input_ids.shape[1]
        x = self.model.embed_tokens(input_ids)
        pos = (torch.arange(T, device=x.device)[None] if position_ids is None else position_ids).float()
        d = a.rotary_dim
        inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=x.device).float() / d))
        freqs = pos[..., None] * inv_freq  # [1, T, d/2], fp32
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype)[:, None], emb.sin().to(x.dtype)[:, None]
        mask = None if attention_mask is None or not bool(attention_mask.any()) else attention_mask.to(x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        x = self.model.norm(x)
        if logits_to_keep is not None:
            x = x[:, logits_to_keep]
        return SimpleNamespace(logits=self.lm_head(x))


@dataclass
class LLaDAMoEConfig(MaskedDiffusionConfig, MoEDims):
    """`MaskedDiffusionConfig` plus the MoE dimensions (`clover_engine.backbones.moe.MoEDims`)."""


class LLaDAMoEModel(MaskedDiffusionModel):
    """LLaDA-MoE driven as masked diffusion, reporting its routing (module docstring).

    Attributes:
        last_routing: `RoutingStats` of the last forward (block rows = the current block's slots),
            or None before the first.
    """

    last_routing = PerThread()  # each thread's own last forward (a served model decodes for several sessions)

    def __init__(self, lm: LLaDAMoELM, config: LLaDAMoEConfig):
        super().__init__(lm, config)
        self.last_routing: RoutingStats | None = None
        for m in lm.moe_layers():
            m.record = True

    @property
    def capabilities(self) -> Capabilities:
        """Masked diffusion (no cache, forwards priced as full recomputes), with the ``expert_union`` observable."""
        return super().capabilities.replace(observables=frozenset({"expert_union"}))

    def set_expert_mode(self, mode: str) -> None:
        """Compute the experts ``routed`` (only the chosen ones; default) or ``all`` (`clover_engine.backbones.moe`).

        Raises:
            ValueError: another mode.
        """
        from clover_engine.backbones.moe import EXPERT_MODES  # local: one name, only this setter needs it

        if mode not in EXPERT_MODES:
            raise ValueError(f"expert mode must be one of {EXPERT_MODES}, got {mode!r}")
        for m in self.lm.moe_layers():
            m.mode = mode

    def forward(self, block_ids: torch.Tensor, state: MaskedDiffusionState, commit_ids: torch.Tensor | None = None,
                block_size: int | None = None, observe: bool = False, rows: slice | None = None) -> BlockOutput:
        """`MaskedDiffusionModel.forward`, plus the routing: ``expert_union`` [N MoE layers] int64 counts
        the distinct experts all T tokens chose; `last_routing` holds the rest (block / history unions,
        per-expert token counts, router entropy over the block's slots)."""
        out = super().forward(block_ids, state, commit_ids, block_size, observe, rows)
        P, L = len(state.committed), block_ids.shape[1]
        self.last_routing = routing_stats([m.last for m in self.lm.moe_layers()], slice(P, P + L))
        return BlockOutput(logits=out.logits, expert_union=self.last_routing.union)


# ------------------------------------------------------------------ loading
def _mask_token_id(directory: Path, data: dict) -> int:
    """The config's ``mask_token_id``, else the tokenizer files' ``<|mask|>``, else the published id."""
    for found in (data.get("mask_token_id"), _tokenizer_mask_id(directory, MASK_TOKEN)):
        if found is not None:
            return int(found)
    return MASK_TOKEN_ID


def _eos_token_id(directory: Path, data: dict) -> int:
    """``generation_config.json``'s first end id, else the config's, else the published one."""
    eos = _stop_id(directory)
    if eos is None:
        eos = data.get("eos_token_id")
        eos = (eos[0] if eos else None) if isinstance(eos, list) else eos
    return EOS_TOKEN_ID if eos is None else int(eos)


def load_llada_moe(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                   canvas_tail: int = 0) -> LLaDAMoEModel:
    """Load a LLaDA-MoE checkpoint directory as a `LLaDAMoEModel`, leanly (module docstring).

    Args:
        path: the directory (``config.json`` + ``*.safetensors``), or a file in it.
        device: where the weights are read to.
        dtype: floating dtype of the weights; None = the checkpoint's own (bf16 stays bf16).
        canvas_tail: MASK positions after the current block in every forward
            (`clover_engine.backbones.masked_diffusion`).

    Returns:
        The model in ``eval()`` mode, ``model_id`` = the directory's name.

    Raises:
        ValueError: no config, a config that is not LLaDA-MoE or that `LLaDAMoEArch.from_config`
            refuses, a MASK or end id outside the vocabulary, no safetensors, a truncated shard, or
            weights that do not match the architecture (`clover_engine.backbones.safetensors_shards.load_shards`).
    """
    directory = Path(path)
    directory = directory.parent if directory.is_file() else directory
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{directory} has no config.json; a LLaDA-MoE checkpoint directory holds config.json "
                         "and *.safetensors")
    data = json.loads(config_path.read_text())
    if not is_moe_config(data):
        raise ValueError(f"{config_path}: model_type={data.get('model_type')!r} without num_experts is not LLaDA-MoE")
    arch = LLaDAMoEArch.from_config(data, str(config_path))
    mask_id, eos = _mask_token_id(directory, data), _eos_token_id(directory, data)
    for what, tok in (("mask_token_id", mask_id), ("eos_token_id", eos)):
        if not 0 <= tok < arch.vocab_size:
            raise ValueError(f"{config_path}: {what}={tok} is outside the vocabulary [0, {arch.vocab_size})")
    shards = [read_header(f) for f in shard_files(directory)]
    dtype = dtype or checkpoint_dtype(data, shards)
    with torch.device("meta"):  # under BUILD_LOCK (clover_engine.checkpoint.load_model)
        lm = LLaDAMoELM(arch).to(dtype)
    optional = {f"model.layers.{i}.mlp.expert_bias" for i in range(arch.num_hidden_layers)}
    if arch.tie_word_embeddings:
        optional.add("lm_head.weight")
    load_shards(lm, shards, device=device, optional=frozenset(optional), what="a LLaDA-MoE model of this config")
    for m in lm.moe_layers():
        if m.expert_bias is not None and m.expert_bias.is_meta:  # not stored: the router's bias starts at zero
            m.expert_bias = torch.zeros(m.num_experts, device=device)
    if arch.tie_word_embeddings:
        lm.lm_head.weight = lm.model.embed_tokens.weight
    left = meta_tensors(lm)
    if left:
        raise ValueError(f"{directory}: {len(left)} tensor(s) were left unloaded (on the meta device): {left[:5]}")
    lm.eval()
    cfg = LLaDAMoEConfig(
        name=directory.name, model_type="lladamoe", vocab_size=arch.vocab_size, mask_token_id=mask_id,
        eos_token_id=eos, max_position_embeddings=arch.max_position_embeddings, hidden_size=arch.hidden_size,
        intermediate_size=arch.dense_intermediate_size, num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads, num_key_value_heads=arch.num_key_value_heads,
        head_dim=arch.head_dim, tie_word_embeddings=arch.tie_word_embeddings, num_parameters=count_parameters(lm),
        logit_shift=False, canvas_tail=int(canvas_tail), family="lladamoe", num_experts=arch.num_experts,
        num_experts_per_tok=arch.num_experts_per_tok, moe_intermediate_size=arch.expert_intermediate_size,
        shared_expert_intermediate_size=arch.shared_expert_intermediate_size or 0,
        moe_layer_flags=[int(f) for f in arch.moe_layers])
    model = LLaDAMoEModel(lm, cfg).eval()
    model.checkpoint_chat = CheckpointChatTemplate.from_directory(directory)
    model.chat_format = CHECKPOINT if model.checkpoint_chat is not None else None
    return model


def load_llada(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
               canvas_tail: int = 0) -> MaskedDiffusionModel:
    """The loader of ``model_type`` ``llada``: `load_llada_moe` for a config with experts (some copies of
    LLaDA-MoE's hub config say ``llada``), else the dense LLaDA's
    `clover_engine.backbones.masked_diffusion.load_masked_diffusion`. Arguments and errors are theirs."""
    from clover_engine.backbones.masked_diffusion import load_masked_diffusion  # local: only the dense case

    directory = Path(path)
    directory = directory.parent if directory.is_file() else directory
    try:
        data = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        data = {}  # the dense loader reports the missing or broken config
    if isinstance(data, dict) and is_moe_config(data):
        return load_llada_moe(directory, device, dtype, canvas_tail)
    return load_masked_diffusion(path, device, dtype, canvas_tail)


def save_llada_moe(lm: LLaDAMoELM, path: str | Path, config: dict) -> Path:
    """Write ``lm`` as a LLaDA-MoE hub checkpoint: ``config.json`` (``config``: the hub ``LLaDAConfig``
    fields, ``model_type`` ``lladamoe``, architecture ``LLaDAMoEModelLM``) and ``model.safetensors``
    under the hub's weight names (the expert bias stored when the config enables it)."""

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in lm.state_dict().items()}
    if lm.arch.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_weights(state, out / "model.safetensors")
    data = dict(config, model_type="lladamoe", architectures=["LLaDAMoEModelLM"])
    (out / "config.json").write_text(json.dumps(data, indent=2))
    return out


def tiny_config(vocab_size: int, num_experts: int = 8, top_k: int = 2, **changes: Any) -> dict:
    """A tiny LLaDA-MoE ``config.json`` (hub field names): 2 layers, hidden 64, 4 / 2 heads, experts of 32,
    a shared expert of 64, qk-norm, RoPE on half of each head; ``changes`` override fields."""
    data = dict(vocab_size=vocab_size, hidden_size=64, dense_intermediate_size=128, expert_intermediate_size=32,
                shared_expert_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                hidden_act="silu", max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False,
                rope_theta=50000.0, partial_rotary_factor=0.5, rope_scaling=None, attention_bias=False, clip_qkv=None,
                num_experts_per_tok=top_k, num_experts=num_experts, norm_topk_prob=False, qk_layernorm=True,
                moe_layer_freq=[1, 1], moe_router_enable_expert_bias=False, routed_scaling_factor=1,
                pad_token_id=0, eos_token_id=2, use_cache=False)
    data.update(changes)
    return data


def fill_random(lm: nn.Module, seed: int, sharpen: float) -> None:
    """Every tensor of ``lm``'s state drawn from a ``torch.Generator`` seeded with ``seed``, in name order
    (norms 1 + 0.1 N, the output layer ``sharpen`` * 0.05 N, the router 0.5 N so that tokens disagree on
    their experts, the expert bias 0.05 N, the rest 0.05 N; fp32), independent of any library's initialiser."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, t in sorted(lm.state_dict().items()):
        noise = torch.randn(t.shape, generator=g, dtype=torch.float32)
        scale = 0.5 if name.endswith("mlp.gate.weight") else sharpen * 0.05 if name == "lm_head.weight" else 0.05
        state[name] = 1.0 + 0.1 * noise if "norm" in name else scale * noise
    lm.load_state_dict(state, strict=True)


def write_tiny_llada_moe(directory: str | Path, seed: int = 0, sharpen: float = 100.0, **changes: Any) -> Path:
    """Write a tiny random LLaDA-MoE checkpoint in the hub layout, with a byte-level tokenizer (its
    ``<|mask|>`` an added token, ``<|im_end|>`` the end of a turn), a ChatML chat template and
    ``generation_config.json``, to try the engine and the explorer without a download.

    ``changes`` override `tiny_config` fields (``num_experts``, ``num_experts_per_tok``, ...); the output
    layer is multiplied by ``sharpen`` (100: some slots confident).
    """
    from clover_engine.tokenizer import byte_tokenizer  # local: only this writer needs it

    out = Path(directory)
    tok = byte_tokenizer()
    tok.add_special_tokens([MASK_TOKEN])
    mask_id, eos, pad = tok.token_to_id(MASK_TOKEN), tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    vocab = max(int(changes.pop("vocab_size", 0)), tok.get_vocab_size())  # a larger vocabulary: rows never tokenised
    data = tiny_config(vocab, **dict(dict(pad_token_id=pad, eos_token_id=eos), **changes))
    lm = LLaDAMoELM(LLaDAMoEArch.from_config(data))
    fill_random(lm, 1000 + seed, sharpen)
    save_llada_moe(lm.eval(), out, data)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                                           "mask_token": MASK_TOKEN, "chat_template": CHATML_TEMPLATE}))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, pad], "pad_token_id": pad}))
    return out


__all__ = ["EOS_TOKEN_ID", "MASK_TOKEN", "MASK_TOKEN_ID", "MODEL_TYPES", "LLaDAMoEArch", "LLaDAMoEConfig", "LLaDAMoELM",
           "LLaDAMoEModel", "fill_random", "is_moe_config", "load_llada", "load_llada_moe", "save_llada_moe", "tiny_config",
           "write_tiny_llada_moe"]
