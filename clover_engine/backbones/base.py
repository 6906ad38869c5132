"""The backbone protocol: what the block decoder calls on a model, and what a model declares it can do.

Wing: ``backbones`` (above ``recording``, below ``cost`` and ``decoding``). Every model family the
engine decodes -- Clover (`clover_engine.backbones.clover.model`), a causal LM with token shift (`clover_engine.backbones.causal_lm.model`), masked
diffusion (`clover_engine.backbones.masked_diffusion`), DiffusionGemma (`clover_engine.backbones.diffusion_gemma`) -- implements
`Backbone` and declares a `Capabilities` record. The decoder, the cost model, the explorer's views
and the command lines ask `capabilities_of(model)` what a model can do (which memory modes run,
which observables its forwards emit, how its forwards are priced, whether it revises what it
committed, its chat template, the largest block it was trained on); nothing asks a model's type,
its config's class or whether it has some attribute.

The protocol (shapes; B = batch, always 1 in the decoder; L = block slots; V = vocabulary;
N = layers)::

    model.config            -> a config with vocab_size, mask_token_id, eos_token_id,
                               max_position_embeddings, name, to_dict()
    model.device, model.dtype
    model.capabilities      -> Capabilities
    model.setup_state(batch_size=1, memory_mode="state") -> a state with .memory_mode and .window
    model(block_ids [B, L] int64, state, commit_ids [B, C] int64 | None, block_size=L, observe=False)
                            -> BlockOutput (logits [B, L, V] fp32 ...); commits commit_ids into
                               the state first, then predicts every slot of block_ids

The record a trace keeps is `Capabilities.to_dict` (``meta["capabilities"]``); `cost_family_of`
reads the cost family from it, or, for a trace recorded before capabilities existed, from the
fields its model config had then (``backbone``, ``kv_cache``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

COST_FAMILIES = ("clover", "kv_cache", "recompute")
"""How a backbone's forwards are priced (`clover_engine.cost`): ``clover`` -- history folded into recurrent
state (constant bytes per forward in context length); ``kv_cache`` -- a causal LM whose history is a
KV cache read by every forward; ``recompute`` -- no cache, every forward recomputes the whole sequence
(masked diffusion, DiffusionGemma)."""

OBSERVABLES = ("expert_union", "state_norm", "memory_share")
"""Per-forward observations a backbone may emit in its `BlockOutput` (the views draw the ones it declares,
and say "not applicable" for the others)."""


@dataclass
class BlockOutput:
    """Result of one forward over a block.

    Attributes:
        logits: [B, L, V] fp32 logits of the block slots.
        expert_union: [N] int64 distinct routed experts over all T tokens of the forward, per layer,
            or None for a dense backbone. The decoder records only the observables a backbone
            declares (`Capabilities.observables`); the others are recorded as None.
        memory_share: [N, B, L] fp32 softmax mass on the memory unit (head mean), or None.
        state_norm: [N] fp32 Frobenius norm of each layer's recurrent state after the commit, or None.
    """

    logits: torch.Tensor
    expert_union: torch.Tensor | None
    memory_share: torch.Tensor | None = None
    state_norm: torch.Tensor | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a backbone can do, declared by the backbone (never sniffed).

    Attributes:
        family: the model family (``clover``, ``causal_lm``, ``masked_diffusion``, ``diffusion_gemma``,
            or a new family's name).
        memory_modes: the memory modes its `setup_state` accepts (``state``; ``state+window`` where
            the model keeps an attention window), the first the default.
        observables: which of `OBSERVABLES` its forwards emit.
        cost_family: one of `COST_FAMILIES` (how `clover_engine.cost` prices its forwards).
        revises_commits: it can rewrite or withdraw tokens it accepted (DiffusionGemma); such a model
            runs its own sampler, not the block decoder's accept-once rule.
        sampler: the decoding algorithm that drives it, a key of `clover_engine.decoding.samplers.SAMPLERS`:
            ``block`` (`clover_engine.decoding.decoder.BlockDecoder`, which calls the protocol's forward), or the
            name of a model's own sampler (``diffusion_gemma``: `clover_engine.decoding.diffusion_gemma.
            DiffusionGemmaDecoder`; such a model implements only ``config``, ``device``, ``dtype`` and
            ``capabilities`` of the protocol). `clover_engine.decoding.decoder_for` picks the decoder by it.
        chat_template: the chat template a plain prompt is wrapped in: ``"checkpoint"`` (the
            checkpoint's own, which the model carries as ``checkpoint_chat``), ``"chatml"``, or None
            (`clover_engine.prompting`).
        chat_system: the default system turn of that template (None: no system turn).
        largest_trained_block: the largest block_size it was trained on, or None when unknown.
        trained_context: the longest sequence (prompt + answer, tokens) it was trained on, when that is
            shorter than the hard context and its files say so (an adapter's recipe ``max_len``); None:
            unknown, or the whole context. A longer prompt still decodes, with a warning
            (`clover_engine.prompting.trained_context_note`).
        cuda_graphs: `clover_engine.backbones.clover.cuda_graphs` can capture its forward.
        trains_in_parallel: it has ``forward_train`` (one forward over a whole noisy sequence), which the
            parallel verifier of `clover_engine.decoding.speculative` and `clover_engine.train` use.
        drafts: it drafts blocks for a target to verify (``read`` / ``draft`` / ``rollback``,
            `clover_engine.backbones.drafter.model.DraftedLM`), so ``DecodeConfig(policy="verify")`` runs
            on it (`clover_engine.decoding.verify`).
        commits_whole_blocks: its commit path folds history in whole blocks of ``block_size`` (Clover's
            chunked gated delta rule: a commit of C tokens needs C % block_size == 0), so a branch
            (`clover_engine.decoding.branch`) can change block_size only to a divisor of the finished block's size.
    """

    family: str
    memory_modes: tuple[str, ...] = ("state",)
    observables: frozenset[str] = frozenset()
    cost_family: str = "recompute"
    revises_commits: bool = False
    sampler: str = "block"
    chat_template: str | None = None
    chat_system: str | None = None
    largest_trained_block: int | None = None
    trained_context: int | None = None
    cuda_graphs: bool = False
    trains_in_parallel: bool = False
    drafts: bool = False
    commits_whole_blocks: bool = False

    def __post_init__(self) -> None:
        if self.cost_family not in COST_FAMILIES:
            raise ValueError(f"cost_family must be one of {COST_FAMILIES}, got {self.cost_family!r}")
        unknown = set(self.observables) - set(OBSERVABLES)
        if unknown:
            raise ValueError(f"unknown observables {sorted(unknown)}; expected a subset of {OBSERVABLES}")
        if not self.memory_modes:
            raise ValueError("memory_modes must name at least one mode ('state')")

    def emits(self, observable: str) -> bool:
        """Whether its forwards emit ``observable`` (one of `OBSERVABLES`)."""
        return observable in self.observables

    def runs(self, memory_mode: str) -> bool:
        """Whether ``memory_mode`` is one of its `memory_modes`."""
        return memory_mode in self.memory_modes

    def replace(self, **changes: Any) -> Capabilities:
        """A copy with ``changes`` (a loader adding what it knows: chat template, trained block)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable fields (a trace's ``meta["capabilities"]``)."""
        d = dataclasses.asdict(self)
        d["memory_modes"] = list(self.memory_modes)
        d["observables"] = sorted(self.observables)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Capabilities:
        """Inverse of `to_dict` (unknown keys ignored: traces from later versions load)."""
        known = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in data.items() if k in known}
        if "memory_modes" in kw:
            kw["memory_modes"] = tuple(kw["memory_modes"])
        if "observables" in kw:
            kw["observables"] = frozenset(kw["observables"])
        return cls(**kw)


@runtime_checkable
class Backbone(Protocol):
    """What the block decoder calls on a model (shapes in the module docstring)."""

    config: Any

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def setup_state(self, batch_size: int = 1, memory_mode: str = "state") -> Any: ...

    def __call__(self, block_ids: torch.Tensor, state: Any, commit_ids: torch.Tensor | None = None,
                 block_size: int | None = None, observe: bool = False) -> BlockOutput: ...


def capabilities_of(model: Any) -> Capabilities:
    """The `Capabilities` a model declares (``model.capabilities``); a decoder-like object that holds
    its model as ``.model`` answers for it.

    Raises:
        TypeError: for an object that declares none, naming the protocol to implement.
    """
    caps = getattr(model, "capabilities", None)
    if caps is None and getattr(model, "model", None) is not None and model.model is not model:
        return capabilities_of(model.model)
    if not isinstance(caps, Capabilities):
        raise TypeError(
            f"{type(model).__name__} declares no capabilities: a backbone implements "
            "clover_engine.backbones.base.Backbone, whose `capabilities` property returns a Capabilities record")
    return caps


def cost_family_of(record: Mapping[str, Any] | None, model_config: Mapping[str, Any] | None = None) -> str:
    """The cost family of a recorded run: from its capabilities record (``meta["capabilities"]``), else,
    for a trace saved before capabilities were recorded, from its model config as it was then
    (``backbone: "transformers"`` with ``kv_cache`` false: ``recompute``; with a KV cache:
    ``kv_cache``; another ``backbone`` such as ``diffusion_gemma``: ``recompute``; none: ``clover``).
    """
    if record and record.get("cost_family") in COST_FAMILIES:
        return str(record["cost_family"])
    cfg = model_config or {}
    backbone = cfg.get("backbone")
    if backbone is None:
        return "clover"
    if backbone == "transformers":
        return "kv_cache" if cfg.get("kv_cache", True) else "recompute"
    return "recompute"
