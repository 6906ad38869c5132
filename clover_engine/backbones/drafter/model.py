"""A block drafter over a frozen causal LM, as a backbone (wing ``backbones``, drafter family).

`DraftedLM` holds the frozen target (a transformers Llama / Qwen causal LM) and a trained
`clover_engine.backbones.drafter.net.BlockDrafter`. History lives in the target's KV cache, computed
causally -- exactly the target's own autoregressive computation -- and every token the target reads
adds its hidden features to the drafter's context. The drafter then proposes a whole block in one
forward. Two decoding modes use it:

* **commit** (`clover_engine.decoding.decoder.BlockDecoder`, the seed's rule): `DraftedLM.__call__`
  implements the block protocol (`clover_engine.backbones.base.Backbone`). A block's first slot still
  masked after the prompt head (the *anchor*) gets the target's own next-token logits; every other
  masked slot gets the drafter's, and the decoder writes slots by threshold / forced fill, for good.
  The target reads a block only when the decoder commits it (fused with the next block's first
  forward) -- it never checks what was written.
* **verify** (`clover_engine.decoding.verify`): `read` / `draft` / `rollback` -- the target reads the drafted
  block in one causal forward, keeps the longest prefix that equals its own argmax plus its bonus
  token, and drops the rest from its cache and the drafter's context: the output is the target's
  greedy output, token for token.

Shapes: L = block slots, V = vocabulary, H = hidden size, T = tokens the target has read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clover_engine.backbones.base import BlockOutput, Capabilities
from clover_engine.backbones.causal_lm.adapter import SMOLLM2_SYSTEM, base_spec, load_base, load_base_tokenizer
from clover_engine.backbones.causal_lm.model import HFBlockConfig, TransformersBackbone, _cache_kwarg, count_parameters
from clover_engine.backbones.drafter.files import load_drafter_net, read_drafter_config


@dataclass
class DrafterLMConfig(HFBlockConfig):
    """The target's `HFBlockConfig` (what the decoder, traces and the cost model read) plus the drafter.

    Attributes:
        drafter: the drafter's `DrafterConfig` as a dict, without its draft vocabulary list
            (``draft_vocab_size`` says how many ids it holds).
        base: the pinned target's name.
    """

    drafter: dict[str, Any] = field(default_factory=dict)
    base: str = ""


@dataclass
class DrafterState:
    """History of one decode.

    Attributes:
        cache: the target's transformers `DynamicCache` over ``committed``.
        committed: every token the target has read (prompt and written tokens), in order.
        ctx: [T, H] the drafter's fused context of those tokens (row t = position t).
        last: [T, H] the target's hidden state ``target_layers[-1]`` at those positions (a draft's
            residual stream starts from the row before its anchor).
        next_logits: [V] fp32 the target's logits after the last token read (its next-token
            prediction), None before the first read.
        pre_read: tokens of the current block the target read ahead of its commit (the prompt head).
        calls: block forwards so far (commit mode).
        memory_mode, window: ``"state"`` / 0 (the decoder and the cost model read them).
    """

    cache: Any
    committed: list[int] = field(default_factory=list)
    ctx: torch.Tensor | None = None
    last: torch.Tensor | None = None
    next_logits: torch.Tensor | None = None
    pre_read: int = 0
    calls: int = 0
    memory_mode: str = "state"
    window: int = 0

    @property
    def position(self) -> int:
        """Tokens the target has read (absolute position of the next one)."""
        return len(self.committed)


class DraftedLM(TransformersBackbone):
    """A frozen causal LM with a block drafter (see the module docstring).

    Args:
        lm: the frozen target (transformers causal LM, eval mode).
        drafter: a trained `BlockDrafter` (or `MedusaDrafter`, the baseline) whose ``hidden_size`` / ``vocab_size`` match ``lm``.
        config: `DrafterLMConfig`.

    Raises:
        ValueError: when the drafter does not fit the target (width, vocabulary, layers read).
    """

    def __init__(self, lm: nn.Module, drafter: nn.Module, config: DrafterLMConfig):
        super().__init__()
        dc = drafter.cfg
        n_states = lm.config.num_hidden_layers + 1
        if dc.hidden_size != lm.config.hidden_size or dc.vocab_size != lm.config.vocab_size:
            raise ValueError(f"the drafter was trained for hidden {dc.hidden_size} / vocabulary {dc.vocab_size}, "
                             f"the target has {lm.config.hidden_size} / {lm.config.vocab_size}: a drafter for another base")
        if max(dc.target_layers) >= n_states:
            raise ValueError(f"the drafter reads target layers {list(dc.target_layers)}, the target has {n_states} "
                             "hidden states")
        for p in lm.parameters():
            p.requires_grad_(False)
        self.lm = lm.eval()
        self.drafter = drafter.eval()
        self.config = config
        self.model_id = config.name
        V = lm.config.vocab_size
        lut = torch.full((V,), -1, dtype=torch.int64)
        lut[drafter.draft_vocab] = torch.arange(len(drafter.draft_vocab))
        self.register_buffer("_draft_index", lut, persistent=False)

    @classmethod
    def build(cls, lm: nn.Module, drafter: nn.Module, name: str, mask_token_id: int,
              eos_token_id: int | None = None, base: str = "") -> "DraftedLM":
        """A `DraftedLM` with its `DrafterLMConfig` read from ``lm``'s transformers config.

        Raises:
            ValueError: what `HFBlockConfig.from_hf` raises (model type, ids) or the drafter does not fit.
        """
        hf = HFBlockConfig.from_hf(lm.config, name, int(mask_token_id), eos_token_id=eos_token_id,
                                   num_parameters=count_parameters(lm))
        dcfg = drafter.cfg.to_dict()
        dcfg["draft_vocab_size"] = len(dcfg.pop("draft_vocab")) or drafter.cfg.vocab_size
        return cls(lm, drafter, DrafterLMConfig(**dataclasses.asdict(hf), drafter=dcfg, base=base))

    @property
    def capabilities(self) -> Capabilities:
        """A frozen causal LM (history in its KV cache, priced as one) with a drafter trained on blocks
        of ``block_size`` slots; verify mode available (``drafts``)."""
        return Capabilities(family="drafter", memory_modes=("state",), observables=frozenset(),
                            cost_family="kv_cache", chat_template=self.chat_format, chat_system=self.chat_system,
                            largest_trained_block=self.drafter.cfg.block_size, drafts=True)

    @property
    def draft_block(self) -> int:
        """The block size the drafter was trained on (anchor included)."""
        return self.drafter.cfg.block_size

    # ------------------------------------------------------------------ state
    def setup_state(self, batch_size: int = 1, memory_mode: str = "state") -> DrafterState:
        """An empty history.

        Raises:
            ValueError: ``batch_size != 1`` or a memory mode other than ``state``.
        """
        from transformers import DynamicCache  # local: transformers is heavy; imported when a decode starts

        self.check_state_args(batch_size, memory_mode, "drafter over a causal LM",
                              "the target keeps all history in its KV cache")
        return DrafterState(cache=DynamicCache())

    # ------------------------------------------------------------------ target
    @torch.no_grad()
    def read(self, state: DrafterState, ids: list[int]) -> torch.Tensor:
        """The target reads ``ids`` causally after ``state.committed`` (one forward): its KV cache, the
        drafter's context and ``next_logits`` grow.

        Returns:
            [len(ids), V] fp32 logits (row i predicts the token after ``ids[i]``).

        Raises:
            ValueError: past the target's context (``max_position_embeddings``).
        """
        if not ids:
            return torch.zeros(0, self.config.vocab_size)
        start = state.position
        if start + len(ids) > self.config.max_position_embeddings:
            raise ValueError(f"position {start + len(ids)} exceeds max_position_embeddings="
                             f"{self.config.max_position_embeddings}; shorten the prompt or max_new_tokens")
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        pos = torch.arange(start, start + len(ids), device=self.device)[None]
        out = self.lm(input_ids=x, position_ids=pos, use_cache=True, output_hidden_states=True,
                      **{_cache_kwarg(self.lm): state.cache})
        layers = self.drafter.cfg.target_layers
        dt = next(self.drafter.parameters()).dtype
        ctx = self.drafter.fuse_context(torch.cat([out.hidden_states[i][0] for i in layers], -1).to(dt))
        last = out.hidden_states[layers[-1]][0].to(dt)
        state.ctx = ctx if state.ctx is None else torch.cat([state.ctx, ctx], 0)
        state.last = last if state.last is None else torch.cat([state.last, last], 0)
        state.committed.extend(int(t) for t in ids)
        logits = out.logits[0].float()
        state.next_logits = logits[-1]
        return logits

    def rollback(self, state: DrafterState, keep: int) -> None:
        """Forget every token read after position ``keep`` (the rejected tail of a verified block):
        crops the KV cache, the context and ``committed``. ``next_logits`` is then stale: the caller
        holds the target's prediction at ``keep - 1`` from the verify forward."""
        drop = state.position - keep
        if drop > 0:
            state.cache.crop(-drop)  # a negative count (a positive length raises in transformers 5.24)
            state.ctx = state.ctx[:keep]
            state.last = state.last[:keep]
            del state.committed[keep:]

    # ------------------------------------------------------------------ drafter
    @torch.no_grad()
    def draft(self, state: DrafterState, block: list[int]) -> torch.Tensor:
        """One drafter forward over ``block`` placed right after the tokens read (its slot 0, the
        anchor, at position ``state.position``; MASK = ``config.mask_token_id``).

        Returns:
            [len(block), V] fp32 logits; ids outside the draft vocabulary are -inf.

        Raises:
            ValueError: before the prompt was read, or a block longer than the drafter's block size.
        """
        if state.ctx is None:
            raise ValueError("the target has read nothing yet: read the prompt first")
        if len(block) > self.draft_block:
            raise ValueError(f"{self.model_id} drafts blocks of at most {self.draft_block} slots (the block size it "
                             f"was trained on); use block_size {self.draft_block} or less")
        ids = torch.tensor([block], dtype=torch.long, device=self.device)
        anchors = torch.tensor([state.position], device=self.device)
        emb = self.lm.get_input_embeddings()
        head = self.lm.get_output_embeddings().weight
        sub = self.drafter(state.ctx, state.last[-1:], ids, anchors, emb, head)[0]  # [L, Vd]
        full = sub.new_full((len(block), self.config.vocab_size), float("-inf"))
        full[:, self.drafter.draft_vocab] = sub
        return full

    # ------------------------------------------------------------------ commit mode (block protocol)
    @torch.no_grad()
    def forward(self, block_ids: torch.Tensor, state: DrafterState, commit_ids: torch.Tensor | None = None,
                block_size: int | None = None, observe: bool = False) -> BlockOutput:
        """One commit-mode forward of the current block.

        Args:
            block_ids: [1, L] the block (prompt head, written tokens, MASK).
            state: from `setup_state`.
            commit_ids: [1, C] the finished block (or whole prompt blocks) to commit first: the target
                reads them (minus the prompt head it already read).
            block_size, observe: accepted for the protocol (no observables).

        Returns:
            `BlockOutput` with logits [1, L, V] fp32: the anchor slot (the first slot after the
            leading run of written slots when the block began) gets the target's next-token logits,
            later slots the drafter's, earlier ones zeros (they are not masked).
        """
        if block_ids.dim() != 2 or block_ids.shape[0] != 1:
            raise ValueError(f"block_ids must be [1, L], got shape {tuple(block_ids.shape)}")
        mask_id = self.config.mask_token_id
        block = block_ids[0].tolist()
        new_block = commit_ids is not None or state.calls == 0
        if commit_ids is not None and commit_ids.shape[1]:
            self.read(state, [int(t) for t in commit_ids[0].tolist()][state.pre_read:])
            state.pre_read = 0
        if new_block:
            head = next((i for i, t in enumerate(block) if t == mask_id), len(block))
            self.read(state, block[:head])  # the prompt head: exact causal K/V, read ahead of the commit
            state.pre_read = head
        state.calls += 1
        L, V = len(block), self.config.vocab_size
        a = state.pre_read
        logits = torch.zeros(1, L, V, device=self.device)  # on the model's device, as every backbone's
        if a >= L:
            return BlockOutput(logits=logits, expert_union=None)
        target = state.next_logits
        draft_in = list(block[a:])
        if draft_in[0] == mask_id:
            draft_in[0] = int(target.argmax())
        logits[0, a] = target
        if len(draft_in) > 1:
            logits[0, a + 1:] = self.draft(state, draft_in)[1:]
        return BlockOutput(logits=logits, expert_union=None)


def load_drafter_model(directory: str | Path, device: str | torch.device = "cpu",
                       dtype: torch.dtype | None = None) -> DraftedLM:
    """Open a drafter directory (``model_type`` ``block-drafter``): the pinned base it names (loaded
    with `clover_engine.backbones.causal_lm.adapter.load_base`, frozen) and its trained drafter (the
    registry's ``block-drafter`` row).

    Raises:
        ValueError: a bad config or weights (`clover_engine.backbones.drafter.files.load_drafter_net`).
        clover_engine.backbones.causal_lm.adapter.MissingBaseError: the pinned base is not installed (the
            message has the pip command).
    """
    directory = Path(directory)
    net, cfg = load_drafter_net(directory)
    spec = base_spec(cfg["base"])
    lm, _tok = load_base(cfg["base"])
    model = DraftedLM.build(lm, net, cfg.get("name") or directory.name, int(cfg["mask_token_id"]),
                            spec.eos_token_id, base=cfg["base"])
    model.chat_format = cfg.get("chat_format")
    if model.chat_format == "chatml":
        model.chat_system = SMOLLM2_SYSTEM
    model.to(device)
    if dtype is not None:
        model.to(dtype=dtype)
    return model.eval()


def load_drafter_tokenizer(directory: str | Path):
    """The ``tokenizers.Tokenizer`` of the pinned base a drafter directory names (a drafter ships no
    tokenizer of its own: it writes the base's vocabulary).

    Raises:
        ValueError: a bad drafter config; clover_engine.backbones.causal_lm.adapter.MissingBaseError: no base.
    """
    return load_base_tokenizer(read_drafter_config(directory)["base"])[1]
