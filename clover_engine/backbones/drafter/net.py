"""The block drafter network: a few transformer layers that draft a whole block in one forward,
conditioned on a frozen causal LM's hidden features.

Wing: ``backbones`` (the drafter family, `clover_engine.backbones.drafter`).

Design (ours, after DFlash -- Chen et al., "Block Diffusion for Flash Speculative Decoding",
arXiv 2602.06036 -- and Medusa / EAGLE):

* **Context = the target's features.** For every token the target has read, the hidden states
  of a few of its layers (`DrafterConfig.target_layers`, indices into transformers'
  ``hidden_states`` tuple: 0 = embeddings, i = output of layer i) are concatenated and projected
  to the drafter's width (``fuse``: Linear + RMSNorm). Each drafter layer reads them as extra
  keys / values (its own ``k_proj`` / ``v_proj`` applied to the fused feature), with RoPE at
  their absolute positions.
* **The block.** ``[anchor, x_1, ..., x_{B-1}]`` at absolute positions ``a .. a+B-1``: the anchor
  is the token the target produced at position ``a`` (its greedy next token); the other slots
  are MASK (a learned input embedding) or tokens already written. Each slot's residual stream starts
  from the target's last read state at ``a - 1`` (see `BlockDrafter`). Inside the block attention
  is bidirectional; every slot reads all context positions ``< a``.
* **Output.** The drafter's last hidden state goes through the target's frozen LM head (its embedding matrix when
  tied), restricted to the draft vocabulary (`DrafterConfig.draft_vocab`, the tokens the
  drafter may propose; all V when empty) -- the LM head is ~0.3 of a SmolLM2-135M forward on
  a CPU, so a reduced vocabulary is where a CPU draft saves most.

Shapes: H = hidden size, T = context positions, N = blocks drafted together, B = block slots,
Vd = draft vocabulary size.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ARCHS = ("block", "medusa")


@dataclass
class DrafterConfig:
    """The drafter's shape and how it reads the target.

    Attributes:
        hidden_size: the target's hidden size H (the drafter reads the target's embeddings
            and LM head, so it has the same width).
        target_layers: indices into the target's ``hidden_states`` tuple whose states are
            the context (0 = embeddings, i = after layer i).
        num_layers: drafter transformer layers.
        num_heads, num_kv_heads, head_dim: attention shape (grouped-query when
            ``num_kv_heads < num_heads``).
        intermediate_size: SwiGLU MLP width.
        block_size: B, slots drafted per forward (the anchor included).
        rope_theta: RoPE base (the target's).
        rms_norm_eps: RMSNorm epsilon.
        vocab_size: the target's vocabulary V.
        mask_token_id: the id a MASK slot carries in the block (never proposed).
        draft_vocab: the token ids the drafter may propose (sorted); empty = all V.
        init_from: the target layer indices the drafter's layers were initialised from
            (recorded, not used at run time).
        arch: ``"block"`` (`BlockDrafter`, the block-diffusion drafter) or ``"medusa"``
            (`MedusaDrafter`, the Medusa-style baseline: ``block_size - 1`` heads on the target's last
            state, no attention; only the last of ``target_layers`` is read).
    """

    hidden_size: int
    target_layers: tuple[int, ...]
    num_layers: int = 1
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    intermediate_size: int = 1536
    block_size: int = 8
    rope_theta: float = 100000.0
    rms_norm_eps: float = 1e-5
    vocab_size: int = 49152
    mask_token_id: int = 0
    draft_vocab: tuple[int, ...] = ()
    init_from: tuple[int, ...] = ()
    arch: str = "block"

    def __post_init__(self) -> None:
        self.target_layers = tuple(int(i) for i in self.target_layers)
        self.draft_vocab = tuple(int(i) for i in self.draft_vocab)
        self.init_from = tuple(int(i) for i in self.init_from)
        if not self.target_layers:
            raise ValueError("target_layers must name at least one hidden_states index of the target")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (the anchor and at least one drafted slot), got {self.block_size}")
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable fields (``draft_vocab`` as a list)."""
        d = dataclasses.asdict(self)
        for k in ("target_layers", "draft_vocab", "init_from"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DrafterConfig":
        """Inverse of `to_dict` (unknown keys ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), computed in fp32, as Llama's."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * xf).to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021, the half-split layout Llama uses).

    Args:
        x: [..., S, D] (D even); pos: [S] int64 absolute positions.
    """
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[:, None] * inv[None, :]  # [S, D/2]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype), torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class DrafterLayer(nn.Module):
    """Pre-norm transformer layer whose queries are the block's slots and whose keys / values are the
    fused target context followed by the block itself. Parameter names mirror a Llama decoder layer
    (``self_attn.q_proj`` ..., ``mlp.gate_proj`` ..., ``input_layernorm``) so it can start from one."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        H, nh, nkv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.cfg = cfg
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = nn.ModuleDict({
            "q_proj": nn.Linear(H, nh * hd, bias=False), "k_proj": nn.Linear(H, nkv * hd, bias=False),
            "v_proj": nn.Linear(H, nkv * hd, bias=False), "o_proj": nn.Linear(nh * hd, H, bias=False)})
        self.mlp = nn.ModuleDict({
            "gate_proj": nn.Linear(H, cfg.intermediate_size, bias=False),
            "up_proj": nn.Linear(H, cfg.intermediate_size, bias=False),
            "down_proj": nn.Linear(cfg.intermediate_size, H, bias=False)})

    def forward(self, x: torch.Tensor, x_pos: torch.Tensor, ctx: torch.Tensor, ctx_pos: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        """One layer.

        Args:
            x: [Q, H] block slots (all blocks flattened); x_pos: [Q] their positions.
            ctx: [T, H] fused context (not normed here: `BlockDrafter.fuse` norms it); ctx_pos: [T].
            allowed: [Q, T + Q] bool, which keys each query reads.
        """
        c = self.cfg
        a = self.self_attn
        h = self.input_layernorm(x)
        kv_in = torch.cat([ctx, h], 0)
        kv_pos = torch.cat([ctx_pos, x_pos], 0)
        q = a["q_proj"](h).view(-1, c.num_heads, c.head_dim).transpose(0, 1)  # [nh, Q, hd]
        k = a["k_proj"](kv_in).view(-1, c.num_kv_heads, c.head_dim).transpose(0, 1)  # [nkv, T+Q, hd]
        v = a["v_proj"](kv_in).view(-1, c.num_kv_heads, c.head_dim).transpose(0, 1)
        q, k = rope(q, x_pos, c.rope_theta), rope(k, kv_pos, c.rope_theta)
        rep = c.num_heads // c.num_kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[None])  # [nh, Q, hd]
        x = x + a["o_proj"](att.transpose(0, 1).reshape(-1, c.num_heads * c.head_dim))
        m = self.mlp
        h = self.post_attention_layernorm(x)
        return x + m["down_proj"](F.silu(m["gate_proj"](h)) * m["up_proj"](h))


class BlockDrafter(nn.Module):
    """The trainable drafter (the target's embeddings and LM head are passed in, frozen, never stored).

    The residual stream of slot ``j`` starts from the target's own last hidden state at position
    ``anchor - 1`` (the last of `DrafterConfig.target_layers`, the state the target's LM head read to
    write the anchor), plus the slot's token embedding (MASK: ``mask_embedding``) and a learned
    embedding of its offset ``j`` in the block; the layers' output projections start at zero, so an
    untrained drafter proposes what the target's head reads from that state (like zero-initialised
    Medusa heads), and training learns per-slot corrections (``slot_heads``) and what attention reads
    from the anchor, the block and the context. The output goes straight into the target's LM head (it already lives in
    the space that head reads).

    Args:
        cfg: `DrafterConfig`.

    Attributes:
        fuse: Linear(len(target_layers) * H -> H) then ``fuse_norm`` -- the context keys / values.
        mask_embedding: [H] input embedding of a MASK slot.
        slot_embedding: [block_size, H] embedding of a slot's offset in the block (zeros at start).
        slot_heads: [block_size, H, H] one map per slot offset after the layers, ``x + SiLU(W_j x)``
            (zeros at start: the Medusa head of Cai et al. 2024, ICML, on top of the block's attention), so
            the drafter holds Medusa's per-offset capacity and adds what attention reads.
        layers: `DrafterLayer` x ``num_layers``.
        draft_vocab: [Vd] int64 buffer, the ids the drafter proposes (all V when the config's is empty).
    """

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        H = cfg.hidden_size
        self.cfg = cfg
        self.fuse = nn.Linear(len(cfg.target_layers) * H, H, bias=False)
        self.fuse_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(H))
        self.slot_embedding = nn.Parameter(torch.zeros(cfg.block_size, H))
        self.slot_heads = nn.Parameter(torch.zeros(cfg.block_size, H, H))  # [B, out, in], Medusa-style per slot
        self.layers = nn.ModuleList(DrafterLayer(cfg) for _ in range(cfg.num_layers))
        vocab = torch.tensor(cfg.draft_vocab or range(cfg.vocab_size), dtype=torch.int64)
        self.register_buffer("draft_vocab", vocab, persistent=False)
        nn.init.normal_(self.fuse.weight, std=1.0 / math.sqrt(self.fuse.in_features))
        for layer in self.layers:  # every layer starts as the identity on the residual stream
            nn.init.zeros_(layer.self_attn["o_proj"].weight)
            nn.init.zeros_(layer.mlp["down_proj"].weight)

    def fuse_context(self, feats: torch.Tensor) -> torch.Tensor:
        """[T, K * H] concatenated target features -> [T, H] context."""
        return self.fuse_norm(self.fuse(feats))

    def forward(self, ctx: torch.Tensor, last: torch.Tensor, block_ids: torch.Tensor, anchors: torch.Tensor,
                embed: nn.Embedding, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """Draft N blocks at once.

        Args:
            ctx: [T, H] fused context of positions 0 .. T-1 (`fuse_context`).
            last: [N, H] the target's last read hidden state (``target_layers[-1]``) at each block's
                ``anchor - 1``.
            block_ids: [N, B] int64 block contents (slot 0 = anchor; MASK = `DrafterConfig.mask_token_id`);
                B <= ``block_size`` (the offset embedding has that many rows).
            anchors: [N] int64 absolute position of each block's slot 0 (each block reads context
                positions < its anchor; anchors <= T).
            embed: the target's input embedding; lm_head_weight: [V, H] its (frozen) LM head.

        Returns:
            [N, B, Vd] fp32 logits over the draft vocabulary (`draft_vocab`) for every slot.

        Raises:
            ValueError: a block longer than the ``block_size`` the drafter was built for.
        """
        N, B = block_ids.shape
        if B > self.cfg.block_size:
            raise ValueError(f"the drafter was built for blocks of at most {self.cfg.block_size} slots, got {B}")
        T = ctx.shape[0]
        dev = block_ids.device
        masked = block_ids == self.cfg.mask_token_id
        x = embed(block_ids.clamp(0, embed.num_embeddings - 1)).to(ctx.dtype)
        x = torch.where(masked[..., None], self.mask_embedding.to(x.dtype), x)
        x = (x + self.slot_embedding[:B][None] + last.to(x.dtype)[:, None, :]).reshape(N * B, -1)
        x_pos = (anchors[:, None] + torch.arange(B, device=dev)[None]).reshape(-1)
        ctx_pos = torch.arange(T, device=dev)
        blk = torch.arange(N, device=dev).repeat_interleave(B)
        see_ctx = ctx_pos[None, :] < anchors[blk][:, None]  # [Q, T]
        see_blk = blk[:, None] == blk[None, :]  # [Q, Q]
        allowed = torch.cat([see_ctx, see_blk], 1)
        for layer in self.layers:
            x = layer(x, x_pos, ctx, ctx_pos, allowed)
        x = x.view(N, B, -1)
        x = (x + F.silu(torch.einsum("nbh,bkh->nbk", x, self.slot_heads[:B]))).reshape(N * B, -1)
        w = lm_head_weight[self.draft_vocab] if self.cfg.draft_vocab else lm_head_weight
        return (x @ w.to(x.dtype).t()).float().view(N, B, -1)

    def init_layers_from(self, target: nn.Module, layer_indices: list[int]) -> None:
        """Copy a Llama-style target's decoder layers (``target.model.layers[i]``) into the drafter's
        layers (same parameter names and shapes; the output projections stay at zero, so the layers
        start as the identity) and start ``mask_embedding`` at the target's embedding of the MASK id;
        records the indices.

        Raises:
            ValueError: when the count differs from ``num_layers`` or the shapes do not match.
        """
        if len(layer_indices) != len(self.layers):
            raise ValueError(f"{len(layer_indices)} source layers for {len(self.layers)} drafter layers")
        for mine, i in zip(self.layers, layer_indices):
            src = target.model.layers[i].state_dict()
            missing = set(mine.state_dict()) - set(src)
            if missing:
                raise ValueError(f"target layer {i} has no {sorted(missing)[:3]}: not a Llama-style layer")
            keep = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
            mine.load_state_dict({k: (mine.state_dict()[k] if k in keep else src[k]) for k in mine.state_dict()})
        self.mask_embedding.data.copy_(target.get_input_embeddings().weight.data[self.cfg.mask_token_id])
        self.cfg.init_from = tuple(int(i) for i in layer_indices)


class MedusaDrafter(nn.Module):
    """Medusa-style heads (the baseline the block drafter must beat; Cai et al., "Medusa", ICML 2024):
    head ``k`` maps the target's last hidden state ``h`` at ``anchor - 1`` to ``h + SiLU(W_k h)`` and
    reads it with the target's frozen LM head, for the token ``k`` slots after the anchor. ``W_k`` starts
    at zero, so an untrained head proposes what the target's own head reads from ``h``. The heads see
    neither the context nor the block's contents: every slot is drafted from ``h`` alone.

    Same call as `BlockDrafter` (so `clover_engine.backbones.drafter.model.DraftedLM` decodes either).

    Args:
        cfg: `DrafterConfig` with ``arch == "medusa"``.

    Attributes:
        heads: ``block_size - 1`` Linear(H -> H) maps, no bias (zeros at start).
        draft_vocab: [Vd] int64 buffer, as `BlockDrafter`'s.
    """

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.heads = nn.ModuleList(nn.Linear(H, H, bias=False) for _ in range(cfg.block_size - 1))
        for head in self.heads:
            nn.init.zeros_(head.weight)
        vocab = torch.tensor(cfg.draft_vocab or range(cfg.vocab_size), dtype=torch.int64)
        self.register_buffer("draft_vocab", vocab, persistent=False)

    def fuse_context(self, feats: torch.Tensor) -> torch.Tensor:
        """[T, K * H] -> [T, H]: the last layer read (the heads read no context; kept for the common call)."""
        return feats[:, -self.cfg.hidden_size:]

    def forward(self, ctx: torch.Tensor | None, last: torch.Tensor, block_ids: torch.Tensor, anchors: torch.Tensor,
                embed: nn.Module | None, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """Draft N blocks from the target's last state alone (``ctx``, ``block_ids``' contents, ``anchors``
        and ``embed`` are not read; `BlockDrafter.forward` documents the common arguments).

        Returns:
            [N, B, Vd] fp32 logits: slot 0 the target's own head on ``last`` (its prediction of the
            anchor), slot ``k >= 1`` head ``k - 1``.

        Raises:
            ValueError: a block longer than the ``block_size`` the heads were built for.
        """
        B = block_ids.shape[1]
        if B > self.cfg.block_size:
            raise ValueError(f"the heads were built for blocks of at most {self.cfg.block_size} slots, got {B}")
        h = last.to(self.heads[0].weight.dtype)  # block_size >= 2: at least one head
        w = lm_head_weight[self.draft_vocab] if self.cfg.draft_vocab else lm_head_weight
        xs = [h] + [h + F.silu(head(h)) for head in self.heads[: B - 1]]
        return torch.stack([(x @ w.to(x.dtype).t()).float() for x in xs], 1)


def build_drafter(cfg: DrafterConfig) -> nn.Module:
    """The untrained network of ``cfg.arch``: `BlockDrafter` or `MedusaDrafter`."""
    return MedusaDrafter(cfg) if cfg.arch == "medusa" else BlockDrafter(cfg)


def target_features(hidden_states: tuple[torch.Tensor, ...], layers: tuple[int, ...]) -> torch.Tensor:
    """[1, S, H] x n_layers+1 -> [S, len(layers) * H]: the selected states, concatenated."""
    return torch.cat([hidden_states[i][0] for i in layers], -1)


def default_target_layers(num_hidden_layers: int, n: int = 4) -> tuple[int, ...]:
    """``n`` hidden_states indices spread from the lower quarter to the final (normed) state, which
    comes last -- the state the target's LM head reads, where `BlockDrafter` starts its residual stream
    (DFlash also reads several layers from shallow to deep), e.g. 30 layers -> (7, 15, 22, 30)."""
    lo, hi = max(1, num_hidden_layers // 4), num_hidden_layers
    if n == 1:
        return (hi,)
    return tuple(int(round(lo + (hi - lo) * k / (n - 1))) for k in range(n))
