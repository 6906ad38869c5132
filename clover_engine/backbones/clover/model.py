"""The Clover block-diffusion model: Qwen3.5-MoE-shaped hybrid, history in state.

Reads top-down: CloverModel -> DecoderLayer -> {GatedDeltaNet | GatedAttention}
-> SparseMoE / RMSNorm. Letter table: B batch, T tokens of a forward (commit +
block), L block slots, C committed tokens, H heads, K key dim, V value dim,
E experts, N layers, W window.

What differs from an autoregressive Qwen3.5 (docs/architecture.md §3):

* History lives only in per-layer recurrent state, updated by the gated delta
  rule when a block is committed: GDN layers keep their state ``S [H_v, K, V]``
  and conv tail; full-attention layers keep a delta-rule *memory* state of
  their own (L2-normalised) keys and values, with their own gates.
* The current block attends to itself bidirectionally, with RoPE on the
  in-block q/k, and the memory read-out ``m_i = S^T q_i`` is one more unit in
  the same softmax with logit ``l_i = scale * <q_i, w_mem> + b_mem`` per head.
  `memory_share` reports its softmax mass.
* Commit is fused with the next block's first forward: one forward over
  ``[committed block(s) ++ block]``; per layer the committed tokens attend
  within their own block and read the old state, update it, and the block
  reads the new state.
* ``state+window`` mode (a labelled non-Clover variant): attention layers also
  keep the K/V of the last W committed tokens (a ring buffer) as extra keys.
* Optional (``config.attention_conv_kernel_dim > 0``, off in Qwen3.5 and the
  clover-35b-a3b preset): a causal depthwise conv on the attention layers' q/k/v
  projections, as Primer (arXiv:2109.08668) does, carrying its tail across
  forwards like the GDN conv; keys then hold the previous tokens' features that
  a copy (induction) match needs.

`CloverModel.forward` is the fast, incremental path. `CloverModel.forward_reference`
recomputes every state from scratch with the token-loop recurrence and an
explicit window slice; tests hold the fast path to it. Each forward's path
(decode, prefill, reference, train) is chosen once, as a `Pass`.

The parts live in `clover_engine.backbones.clover`: `state` (state, `Pass`, `ModelOutput`), `ops`,
`gdn` (`GatedDeltaNet`), `attention` (`GatedAttention`), `moe` (`SparseMoE`).

Wing: ``backbones``.
"""

from __future__ import annotations

import torch
from torch import nn

from clover_engine.backbones.clover.attention import GatedAttention
from clover_engine.backbones.clover.gdn import GatedDeltaNet
from clover_engine.backbones.clover.moe import SparseMoE
from clover_engine.backbones.clover.ops import GatedRMSNorm, RMSNorm, block_attention, rope
from clover_engine.backbones.base import OBSERVABLES, Capabilities
from clover_engine.backbones.clover.state import MEMORY_MODES, CloverState, LayerState, ModelOutput, Pass
from clover_engine.backbones.clover.config import CloverConfig

__all__ = [  # the model, its state and output; building blocks re-exported from clover_engine.backbones.clover
    "MEMORY_MODES", "CloverBackbone", "CloverModel", "CloverState", "DecoderLayer", "GatedAttention", "GatedDeltaNet", "GatedRMSNorm",
    "LayerState", "ModelOutput", "Pass", "RMSNorm", "SparseMoE", "block_attention", "random_model", "rope",
]


class DecoderLayer(nn.Module):
    """Pre-norm residual block: mixer (GDN or gated attention), then MoE."""

    def __init__(self, cfg: CloverConfig, idx: int):
        super().__init__()
        self.idx = idx
        self.layer_type = cfg.layer_types[idx]
        if self.layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        elif self.layer_type == "full_attention":
            self.self_attn = GatedAttention(cfg)
        else:
            raise ValueError(f"layer {idx}: unknown layer type {self.layer_type!r}")
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SparseMoE(cfg)

    def mixer(self, x: torch.Tensor, p: Pass, st: LayerState) -> torch.Tensor:
        if self.layer_type == "linear_attention":
            return self.linear_attn(x, p, st)
        return self.self_attn(x, p, st)

    def forward(self, x: torch.Tensor, p: Pass, st: LayerState) -> torch.Tensor:
        x = x + self.mixer(self.input_layernorm(x), p, st)
        h = self.post_attention_layernorm(x)
        h, union = self.mlp(h, graph_safe=True) if p.graph_safe else self.mlp(h)
        p.expert_union.append(union)
        return x + h


class CloverBackbone(nn.Module):
    """Token embedding, the decoder layers and the final norm: ``CloverModel.model``, the
    counterpart of transformers' ``Qwen3_5MoeTextModel`` (so its weights are named
    ``model.embed_tokens.weight``, ``model.layers.{i}...``, ``model.norm.weight``)."""

    def __init__(self, config: CloverConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CloverModel(nn.Module):
    """Clover block-diffusion LM (see module docstring).

    Weights are named as in transformers' ``Qwen3_5MoeForCausalLM`` wherever the tensors
    mean the same thing (``model.embed_tokens``, ``model.layers.{i}.{linear_attn,self_attn,mlp}.*``,
    ``model.norm``, ``lm_head``); the block-diffusion parameters keep Clover's own names
    (``mem_*``, ``block_temperature``, the attention ``conv1d``). Older checkpoints load
    through `clover_engine.backbones.clover.weights.LEGACY_KEYS`. ``embed_tokens``, ``layers`` and ``norm`` are
    also reachable directly on the model.

    Args:
        config: a `CloverConfig`.
    """

    def __init__(self, config: CloverConfig):
        super().__init__()
        self.config = config
        self.model = CloverBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.model_id = config.name
        self.cuda_graphs = None  # an clover_engine.backbones.clover.cuda_graphs.CUDAGraphForward that serves forward(), or None

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.embed_tokens

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.layers

    @property
    def norm(self) -> RMSNorm:
        return self.model.norm

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def capabilities(self) -> Capabilities:
        """Clover: history folded into recurrent state (`state`), plus the last W committed K/V
        (`state+window`) when the config has an attention window; every forward can report its
        expert union, the states' norms and the memory unit's share; forwards priced as Clover's;
        CUDA graphs and the parallel training forward available; commits fold whole blocks."""
        modes = ("state", "state+window") if int(self.config.attention_window or 0) > 0 else ("state",)
        return Capabilities(family="clover", memory_modes=modes, observables=frozenset(OBSERVABLES),
                            cost_family="clover", cuda_graphs=True, trains_in_parallel=True,
                            commits_whole_blocks=True)

    # ------------------------------------------------------------------ state
    def setup_state(self, batch_size: int = 1, memory_mode: str = "state") -> CloverState:
        """Allocate every layer's state once (zeros, position 0).

        Args:
            batch_size: sequences decoded together.
            memory_mode: ``"state"`` (Clover) or ``"state+window"`` (attention
                layers also keep the last ``config.attention_window`` committed K/V).

        Raises:
            ValueError: unknown mode, or ``state+window`` on a config with
                ``attention_window == 0``.
        """
        if memory_mode not in MEMORY_MODES:
            raise ValueError(f"memory_mode must be one of {MEMORY_MODES}, got {memory_mode!r}")
        W = self.config.attention_window if memory_mode == "state+window" else 0
        if memory_mode == "state+window" and W == 0:
            raise ValueError(
                "memory_mode='state+window' needs config.attention_window > 0; this model has no "
                "window -- use memory_mode='state'"
            )
        layers = []
        for layer in self.layers:
            if layer.layer_type == "linear_attention":
                layers.append(layer.linear_attn.init_state(batch_size, self.device, self.dtype))
            else:
                layers.append(layer.self_attn.init_state(batch_size, self.device, self.dtype, W))
        return CloverState(layers=layers, memory_mode=memory_mode, window=W)

    # ---------------------------------------------------------------- forward
    def forward(
        self,
        block_ids: torch.Tensor,
        state: CloverState,
        commit_ids: torch.Tensor | None = None,
        block_size: int | None = None,
        observe: bool = False,
    ) -> ModelOutput:
        """One denoising forward of the current block, with the fused commit.

        Args:
            block_ids: [B, L] int64 current block (prompt head, written tokens, MASK).
                Its slot 0 sits at absolute position ``state.position + C``.
            state: from `setup_state`; updated in place by the commit.
            commit_ids: [B, C] int64 finished tokens to fold into the state first
                (C a multiple of `block_size`, or one block), or None.
            block_size: committed block length (the decode's block_size); default C.
            observe: also return memory shares and state norms (for hooks).

        Returns:
            `ModelOutput` with logits [B, L, vocab] (fp32).
        """
        if self.cuda_graphs is not None:  # clover_engine.backbones.clover.cuda_graphs.enable_cuda_graphs: replay captured forwards
            return self.cuda_graphs(block_ids, state, commit_ids, block_size, observe)
        return self._run(block_ids, state, commit_ids, block_size, observe, reference=False)

    @torch.no_grad()
    def forward_reference(
        self,
        history_ids: torch.Tensor,
        block_ids: torch.Tensor,
        block_size: int,
        memory_mode: str = "state",
    ) -> ModelOutput:
        """The definition the fast path must equal: every state recomputed from scratch.

        Runs a fresh state over all of `history_ids` (block by block, token-loop
        gated delta rule, window taken as an explicit slice of the history's
        K/V) and then the block.

        Args:
            history_ids: [B, P] committed tokens from position 0 (P a multiple of block_size).
            block_ids: [B, L] the current block at position P.
        """
        state = self.setup_state(block_ids.shape[0], memory_mode)
        commit = history_ids if history_ids.shape[1] else None
        return self._run(block_ids, state, commit, block_size, True, reference=True)

    def forward_train(self, clean_ids: torch.Tensor, noisy_ids: torch.Tensor, block_size: int,
                      use_window: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Block-diffusion training forward (docs/architecture.md §9).

        One pass over the clean sequence gives every block-boundary state (the
        clean blocks are committed one after another); the noisy
        blocks run in the same pass, block b reading the state (and, with
        `use_window`, the clean K/V window) left by clean blocks 0..b-1 -- the
        same computation the decoder does when block b is decoded after its history.

        Args:
            clean_ids, noisy_ids: [B, T] int64, T a multiple of `block_size`; noisy =
                clean with some slots replaced by MASK.
            block_size: L.
            use_window: ``state+window`` mode (W = config.attention_window) if True.

        Returns:
            hidden: [B, T, D] final-normed hidden states of the noisy tokens (apply
            ``lm_head`` on the masked ones); aux: scalar mean MoE load-balancing loss.
        """
        B, T = clean_ids.shape
        if T % block_size:
            raise ValueError(f"sequence length {T} is not a multiple of block_size {block_size}")
        if use_window and self.config.attention_window == 0:
            raise ValueError("use_window needs config.attention_window > 0")
        state = self.setup_state(B, "state")
        pos = torch.arange(T, device=clean_ids.device).repeat(2)
        p = Pass("train", n_commit=T, block_size=block_size, pos=pos,
                 window=self.config.attention_window if use_window else 0)
        x = self.embed_tokens(torch.cat([clean_ids, noisy_ids], 1))  # [B, 2T, D]
        for layer, st in zip(self.layers, state.layers):
            x = layer(x, p, st)
        aux = torch.stack([layer.mlp.aux_loss for layer in self.layers]).mean() if self.training else x.new_zeros(())
        return self.norm(x[:, T:]), aux

    def run_layers(self, x: torch.Tensor, p: Pass, states: list[LayerState]) -> torch.Tensor:
        """The decoder layers in order, each with its own state: [B, T, hidden] -> [B, T, hidden].
        One method, so `clover_engine.backbones.clover.compiled` can compile the stack as one graph."""
        for layer, st in zip(self.layers, states):
            x = layer(x, p, st)
        return x

    def _run(self, block_ids: torch.Tensor, state: CloverState, commit_ids: torch.Tensor | None,
             block_size: int | None, observe: bool, reference: bool, pos: torch.Tensor | None = None,
             graph_safe: bool = False) -> ModelOutput:
        """Plan the forward (`Pass`: reference, prefill from a fresh state with several commit
        blocks, else decode), run every layer, advance ``state.position``.

        `pos` ([C + L] int64 on the model's device; default ``arange(position, position + C + L)``)
        and `graph_safe` (no host sync: the expert union stays on the device) are for
        `clover_engine.backbones.clover.cuda_graphs`, which captures this forward with positions in a static buffer."""
        C = 0 if commit_ids is None else commit_ids.shape[1]
        L = block_size or max(C, 1)
        if C % L:
            raise ValueError(f"commit of {C} tokens is not a whole number of blocks of {L}")
        start = state.position
        ids = block_ids if commit_ids is None else torch.cat([commit_ids, block_ids], 1)
        T = ids.shape[1]
        if start + T > self.config.max_position_embeddings:
            raise ValueError(
                f"position {start + T} exceeds max_position_embeddings="
                f"{self.config.max_position_embeddings}; shorten the prompt or max_new_tokens"
            )
        if pos is None:
            pos = torch.arange(start, start + T, device=ids.device)
        kind = "reference" if reference else "prefill" if start == 0 and C > L else "decode"
        p = Pass(kind, n_commit=C, block_size=L, pos=pos, start=start, window=state.window, observe=observe,
                 graph_safe=graph_safe)
        x = self.run_layers(self.embed_tokens(ids), p, state.layers)  # [B, T, D]
        state.position = start + C
        logits = self.lm_head(self.norm(x[:, C:])).float()  # [B, L, vocab]
        if all(isinstance(u, int) for u in p.expert_union):
            union = torch.tensor(p.expert_union, dtype=torch.int64)
        else:  # 0-d tensors, on the device: graph-safe (no sync) or compiled (clover_engine.backbones.clover.compiled) layers
            union = torch.stack([torch.as_tensor(u, dtype=torch.int64) for u in p.expert_union])
        out = ModelOutput(logits=logits, expert_union=union)
        if observe:
            out.memory_share = torch.stack(p.memory_share)  # [N, B, L]
            out.state_norm = torch.stack(p.state_norm).float()  # [N]
        return out


def random_model(cfg: CloverConfig | str, seed: int = 0, weight_scale: float = 1.0,
                 device: str | torch.device | None = None, dtype: torch.dtype | str | None = None) -> CloverModel:
    """A randomly initialised `CloverModel` in eval mode, reproducible from ``seed``.

    ``weight_scale`` multiplies every weight matrix (every parameter with >= 2 dims): 1 keeps
    the initialisation (near-uniform predictions, every step a forced fill); ~15 gives peaked
    logits, so confidences spread over (0, 1) and a decode shows accepted, forced and
    EOS-filled slots -- the stand-in the explorer's dev option and the tests use.

    With a `device` or `dtype` every parameter is created and initialised there and in that dtype
    (torch's default device and dtype are set while the modules are built), so a preset never
    exists anywhere else first: ``random_model("clover-35b-a3b", device="cuda", dtype=torch.bfloat16)``
    allocates its ~69 GB once, on the GPU. The recurrent state, the router softmax, the logits and
    the confidences stay fp32 whatever the weights' dtype. Weights drawn on another device (or in
    another dtype) are not the values the CPU fp32 build draws from the same seed.

    Args:
        cfg: a `CloverConfig` or a preset name.
        seed: torch seed (every device).
        weight_scale: multiplier of every parameter with >= 2 dims.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` ... (None = the CPU, as before).
        dtype: a floating dtype or its name (``torch.bfloat16``, ``"bfloat16"``); None = fp32.

    Raises:
        ValueError: an unknown preset name (see `CloverConfig.from_name`), a dtype that is not a
            floating type, or a CUDA device on a machine without CUDA.
    """
    config = CloverConfig.from_name(cfg) if isinstance(cfg, str) else cfg
    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32' or 'bfloat16'")
        dtype = getattr(torch, dtype)
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating type (float32, bfloat16, float16, float64), got {dtype}")
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(dev)!r} asked for but CUDA is not available here; use device='cpu'")
    torch.manual_seed(seed)
    if dev is None and dtype is None:
        model = CloverModel(config)
    else:
        old_dtype = torch.get_default_dtype()
        try:
            if dtype is not None:
                torch.set_default_dtype(dtype)
            with dev if dev is not None else torch.device("cpu"):
                model = CloverModel(config)
        finally:
            torch.set_default_dtype(old_dtype)
    if weight_scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.mul_(weight_scale)
    return model.eval()
