"""Block diffusion over a transformers causal LM (Llama / Qwen2 / Qwen3): the second backbone.

The Clover model keeps history in recurrent state; this backbone keeps it in a
transformers `DynamicCache` and implements the same small protocol the
`clover_engine.decoding.decoder.BlockDecoder` drives (``config``, ``device``, ``dtype``,
``setup_state``, ``forward(block_ids, state, commit_ids, block_size, observe)
-> BlockOutput``), so the decoder's rules, policies, logits processors,
events and traces are the same for both. It is how Fast-dLLM v2 adapts an
autoregressive model to block diffusion:

* **History in the KV cache, computed causally.** Committed tokens go into
  the cache once, with a causal mask, exactly as autoregressive decoding
  would compute them. The commit of a finished block is fused with the next
  block's first denoising forward (one forward over ``[commit ++ window]``).
* **Token shift.** The current window is ``[last committed token, slot_0 ..
  slot_{L-2}]`` at absolute positions ``P-1 .. P+L-2`` (P = committed
  tokens), and output j predicts slot j -- the autoregressive head keeps
  doing what it was trained to do: predict the token after its input. The
  cache therefore holds every committed token but the last one.
* **The window is bidirectional** over itself and attends to the whole
  prefix: one 4D additive mask (0 / -inf) through ``attention_mask``,
  explicit ``position_ids``; the window's own K/V are dropped after the
  forward (``cache.crop(-q)``) because they were computed with MASK inputs.
  A one-token window (``block_size=1``) attends to the prefix and itself
  only, i.e. causally: its K/V are exact and kept, so ``block_size=1`` runs
  one token per forward and reproduces the base model's own greedy
  ``generate`` token for token.
* **MASK.** A vocabulary position chosen per model (`HFBlockConfig.mask_token_id`);
  with an adapter (`clover_engine.backbones.causal_lm.adapter`) its *input* embedding is a learned
  vector (``mask_embedding``) so the base's meaning of that token never
  leaks in. The decoder never proposes MASK as a candidate.

Clover-only observables (expert union, recurrent-state norms, memory share)
have no meaning here: `BlockOutput` carries ``None`` for them and the events,
traces and views say "not applicable to this model".

History modes: only ``state`` (the API default) is accepted; for this backbone
it means "all committed history, in the KV cache". ``state+window`` is a
Clover variant and is refused with a clear message.

Shape letters as in `clover_engine`: L block slots, C committed tokens, V vocab.

Wing: ``backbones``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clover_engine.backbones.base import BlockOutput, Capabilities

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
FORMAT = "hf-block-diffusion"


@dataclass
class HFBlockConfig:
    """What the decoder, traces and the cost model need to know about a transformers backbone.

    Attributes:
        name: model id shown in traces and views.
        model_type: transformers ``model_type`` (``llama``, ``qwen2``, ``qwen3``).
        vocab_size, mask_token_id, eos_token_id, max_position_embeddings: as for Clover.
        hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
        num_key_value_heads, head_dim, tie_word_embeddings: the dense
            transformer's dimensions (drive `clover_engine.cost.dense_forward_cost`).
        num_parameters: parameters of the base model (embedding counted once if tied).
        backbone: ``"transformers"`` (Clover configs have no such field).
    """

    name: str
    model_type: str
    vocab_size: int
    mask_token_id: int
    eos_token_id: int
    max_position_embeddings: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    num_parameters: int = 0
    backbone: str = "transformers"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HFBlockConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_hf(cls, hf_config: Any, name: str, mask_token_id: int, eos_token_id: int | None = None,
                num_parameters: int = 0) -> "HFBlockConfig":
        """Read the dimensions from a transformers config.

        Raises:
            ValueError: for a model type other than `SUPPORTED_MODEL_TYPES`, or
                MASK / EOS ids outside the vocabulary.
        """
        mt = getattr(hf_config, "model_type", None)
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {mt!r} is not supported by the block-diffusion adapter; "
                             f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        eos = hf_config.eos_token_id if eos_token_id is None else eos_token_id
        if isinstance(eos, (list, tuple)):
            eos = eos[0]
        if eos is None:
            raise ValueError("the model config names no eos_token_id; pass eos_token_id=")
        V = int(hf_config.vocab_size)
        for what, tok in (("mask_token_id", mask_token_id), ("eos_token_id", eos)):
            if not 0 <= int(tok) < V:
                raise ValueError(f"{what}={tok} is outside the vocabulary [0, {V})")
        if int(mask_token_id) == int(eos):
            raise ValueError(f"mask_token_id and eos_token_id are both {eos}; MASK must be its own id")
        n_heads = int(hf_config.num_attention_heads)
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // n_heads
        return cls(
            name=name, model_type=mt, vocab_size=V, mask_token_id=int(mask_token_id), eos_token_id=int(eos),
            max_position_embeddings=int(hf_config.max_position_embeddings),
            hidden_size=int(hf_config.hidden_size), intermediate_size=int(hf_config.intermediate_size),
            num_hidden_layers=int(hf_config.num_hidden_layers), num_attention_heads=n_heads,
            num_key_value_heads=int(getattr(hf_config, "num_key_value_heads", None) or n_heads),
            head_dim=int(head_dim), tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            num_parameters=int(num_parameters),
        )


@dataclass
class HFBlockState:
    """History of one decode: the KV cache and the committed tokens.

    Attributes:
        cache: a transformers `DynamicCache` holding K/V of ``committed[:n_cached]``.
        committed: every committed token id (prompt blocks and finished blocks).
        n_cached: tokens whose K/V are in `cache` (``len(committed) - 1`` after a
            commit: the last committed token opens the next window).
        memory_mode: always ``"state"`` (history = the KV cache).
        window: 0 (the decoder and cost model read it; no ring buffer here).
    """

    cache: Any
    committed: list[int] = field(default_factory=list)
    n_cached: int = 0
    memory_mode: str = "state"
    window: int = 0

    @property
    def position(self) -> int:
        """Tokens committed so far (absolute position of slot 0 of the next block)."""
        return len(self.committed)

    def nbytes(self) -> int:
        """Bytes held by the KV cache."""
        return kv_cache_nbytes(self.cache)


def kv_cache_nbytes(cache: Any) -> int:
    """Bytes of the keys and values a transformers ``DynamicCache`` holds (0 for an empty one)."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def block_window_mask(n_prefix: int, n_causal: int, n_window: int, dtype: torch.dtype,
                      device: torch.device | str = "cpu") -> torch.Tensor:
    """The additive 4D mask of one fused forward: ``[1, 1, q, n_prefix + q]``, q = n_causal + n_window.

    Rows of the ``n_causal`` commit tokens see the prefix (cache) and the commit
    tokens up to themselves; rows of the window see everything (prefix, commit,
    the whole window). 0 = attend, the dtype's minimum = blocked.
    """
    q = n_causal + n_window
    kv = n_prefix + q
    allowed = torch.ones(q, kv, dtype=torch.bool, device=device)
    if n_causal:
        cols = torch.arange(kv, device=device)
        rows = torch.arange(n_causal, device=device)
        allowed[:n_causal] = cols[None, :] <= (n_prefix + rows)[:, None]
    mask = torch.zeros(q, kv, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


class TransformersBackbone(nn.Module):
    """What the transformers-backed backbones share: the wrapped LM (``self.lm``) gives the device
    and dtype, and a history of one sequence in ``state`` mode (`check_state_args`)."""

    lm: nn.Module
    # set by the loaders that know them (clover_engine.backbones.causal_lm.adapter, .masked_diffusion): the chat
    # template a plain prompt is wrapped in (clover_engine.prompting: "chatml", or "checkpoint" with the
    # checkpoint's own template in checkpoint_chat), its default system turn, and the largest block_size
    # the adapter trained on
    chat_format: str | None = None
    chat_system: str | None = None
    checkpoint_chat: object | None = None
    trained_block: int | None = None
    trained_context: int | None = None  # tokens per training row (an adapter's recipe max_len)

    @property
    def capabilities(self) -> Capabilities:
        """A causal LM with token shift: history in its KV cache (`state` only), no expert union,
        states or memory unit to observe, forwards priced as a KV-cache transformer's."""
        return Capabilities(family="causal_lm", memory_modes=("state",), observables=frozenset(),
                            cost_family="kv_cache", chat_template=self.chat_format, chat_system=self.chat_system,
                            largest_trained_block=self.trained_block, trained_context=self.trained_context)

    @property
    def device(self) -> torch.device:
        return self.lm.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm.get_input_embeddings().weight.dtype

    @staticmethod
    def check_state_args(batch_size: int, memory_mode: str, backbone: str, history: str) -> None:
        """Raise ValueError unless ``batch_size == 1`` and ``memory_mode == "state"`` (``history`` says
        what ``state`` means for ``backbone``)."""
        if batch_size != 1:
            raise ValueError(f"the {backbone} decodes one sequence at a time, got batch_size={batch_size}")
        if memory_mode != "state":
            raise ValueError(f"memory_mode={memory_mode!r} is a Clover variant; {history} -- use memory_mode='state'")


class HFBlockDiffusionModel(TransformersBackbone):
    """A transformers causal LM driven as a block-diffusion model (see module docstring).

    Args:
        lm: a ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM``
            (or a peft model wrapping one).
        config: its `HFBlockConfig`.
        mask_embedding: optional ``[hidden]`` input embedding used for MASK
            inputs instead of the embedding row of ``config.mask_token_id``.
    """

    def __init__(self, lm: nn.Module, config: HFBlockConfig, mask_embedding: torch.Tensor | None = None):
        super().__init__()
        self.lm = lm
        self.config = config
        self.model_id = config.name
        if mask_embedding is not None:
            self.mask_embedding = nn.Parameter(mask_embedding.detach().clone().reshape(-1))
        else:
            self.mask_embedding = None

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings of ``ids`` [B, T] -> [B, T, D], MASK rows replaced by `mask_embedding`."""
        x = self.lm.get_input_embeddings()(ids)
        if self.mask_embedding is not None:
            is_mask = (ids == self.config.mask_token_id).unsqueeze(-1)
            x = torch.where(is_mask, self.mask_embedding.to(x.dtype), x)
        return x

    # ------------------------------------------------------------------ state
    def setup_state(self, batch_size: int = 1, memory_mode: str = "state") -> HFBlockState:
        """An empty history (no committed tokens, empty KV cache).

        Raises:
            ValueError: ``batch_size != 1`` or a memory mode other than ``state``.
        """
        from transformers import DynamicCache

        self.check_state_args(batch_size, memory_mode, "transformers backbone",
                              "this transformers-backed model keeps all history in its KV cache")
        return HFBlockState(cache=DynamicCache())

    # ------------------------------------------------------------------ forward
    def forward(self, block_ids: torch.Tensor, state: HFBlockState, commit_ids: torch.Tensor | None = None,
                block_size: int | None = None, observe: bool = False) -> BlockOutput:
        """One denoising forward of the current block, with the fused causal commit.

        Args:
            block_ids: [1, L] the current block (prompt head, written tokens, MASK);
                slot 0 sits at absolute position ``state.position`` after the commit.
            state: from `setup_state`; the commit updates it in place.
            commit_ids: [1, C] finished tokens to append to the history first, or None.
            block_size: unused (commits need no chunking here); accepted for the protocol.
            observe: unused (no Clover observables); accepted for the protocol.

        Returns:
            `BlockOutput` with logits [1, L, V] (fp32; row j predicts slot j) and
            ``None`` for expert_union, memory_share and state_norm.
        """
        if block_ids.dim() != 2 or block_ids.shape[0] != 1:
            raise ValueError(f"block_ids must be [1, L], got shape {tuple(block_ids.shape)}")
        if commit_ids is not None and commit_ids.shape[1]:
            state.committed.extend(int(t) for t in commit_ids[0].tolist())
        committed = state.committed
        L = block_ids.shape[1]
        if len(committed) + L > self.config.max_position_embeddings:
            raise ValueError(
                f"position {len(committed) + L} exceeds max_position_embeddings="
                f"{self.config.max_position_embeddings}; shorten the prompt or max_new_tokens"
            )
        cache = state.cache
        if state.n_cached > max(len(committed) - 1, 0):  # a kept one-token window, and no commit since
            drop = state.n_cached - max(len(committed) - 1, 0)
            cache.crop(-drop)
            state.n_cached -= drop
        pending = committed[state.n_cached:]
        block = block_ids[0].tolist()
        if committed:
            causal, window = pending[:-1], pending[-1:] + block[: L - 1]
        else:  # nothing committed: slot 0 is a prompt token (never masked); rows 1.. are shifted
            causal, window = [], block[: L - 1]
        n_c, n_w = len(causal), len(window)
        V = self.config.vocab_size
        if n_c + n_w == 0:
            return BlockOutput(logits=torch.zeros(1, L, V), expert_union=None)
        device = self.device
        ids = torch.tensor([causal + window], dtype=torch.long, device=device)
        start = state.n_cached
        pos = torch.arange(start, start + n_c + n_w, device=device)[None]
        x = self.embed(ids)
        mask = block_window_mask(start, n_c, n_w, x.dtype, device)
        out = self.lm(inputs_embeds=x, attention_mask=mask, position_ids=pos, use_cache=True,
                      logits_to_keep=max(n_w, 1), **{_cache_kwarg(self.lm): cache})
        logits = out.logits[:, -n_w:].float() if n_w else out.logits[:, :0].float()
        if n_w == 1 and committed:
            state.n_cached = start + n_c + 1  # a one-token window is causal: its K/V are exact, keep them
        else:
            if n_w:
                cache.crop(-n_w)
            state.n_cached = start + n_c
        if not committed:
            logits = torch.cat([logits.new_zeros(1, 1, logits.shape[-1]), logits], 1)
        return BlockOutput(logits=logits, expert_union=None)

    # ------------------------------------------------------------------ greedy reference
    @torch.no_grad()
    def greedy_generate(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        """The base model's own ``generate`` (greedy, KV cache), stopping at EOS (excluded)."""
        ids = torch.tensor([prompt_ids], device=self.device)
        out = self.lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                               do_sample=False, eos_token_id=self.config.eos_token_id,
                               pad_token_id=self.config.eos_token_id)
        gen = out[0, len(prompt_ids):].tolist()
        return gen[: gen.index(self.config.eos_token_id)] if self.config.eos_token_id in gen else gen


def _cache_kwarg(lm: nn.Module) -> str:
    """``cache`` (transformers >= 5.24) or ``past_key_values`` (earlier), whichever ``forward`` takes."""
    import inspect

    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def count_parameters(lm: nn.Module) -> int:
    """Distinct parameters of ``lm`` (a tied embedding counted once)."""
    seen, n = set(), 0
    for p in lm.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def default_mask_token_id(vocab_size: int, tokenizer: Any = None) -> int:
    """MASK for a plain transformers checkpoint without an adapter config.

    The tokenizer's own mask token if it has one, else the last vocabulary id
    (a rarely used or padding row in Llama / Qwen vocabularies).
    """
    if tokenizer is not None:
        mid = getattr(tokenizer, "mask_token_id", None)
        if mid is not None and 0 <= mid < vocab_size:
            return int(mid)
    return vocab_size - 1


def load_pretrained_backbone(directory: str | Path, device: str | torch.device = "cpu",
                             dtype: torch.dtype | None = None) -> HFBlockDiffusionModel:
    """Open a transformers Llama / Qwen2 / Qwen3 ``save_pretrained`` directory as a block-diffusion
    model with token shift, no adapter (the registry's ``llama`` / ``qwen2`` / ``qwen3`` rows);
    ``dtype`` None keeps fp32. Raises what `wrap_pretrained` raises.

    Lean: transformers' ``from_pretrained`` builds on the meta device and reads the shards one
    by one straight into `dtype` (a bf16 checkpoint asked for in bf16 is never materialised in
    fp32 first; ``benchmarks/load_memory.py`` measures its peak)."""
    directory = Path(directory)
    model = wrap_pretrained(str(directory), name=directory.name, device=device, dtype=dtype or torch.float32)
    if dtype is not None:
        model.to(dtype=dtype)  # the block-diffusion extras (MASK embedding) follow the weights' dtype
    return model.eval()


def wrap_pretrained(path: str, name: str | None = None, mask_token_id: int | None = None,
                    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> HFBlockDiffusionModel:
    """Load a transformers checkpoint directory (``save_pretrained``) as a block-diffusion model, no adapter.

    Raises:
        ValueError: an unsupported ``model_type`` (the message lists the supported ones).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = AutoConfig.from_pretrained(path)
    if getattr(hf_cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{path}: model_type {getattr(hf_cfg, 'model_type', None)!r} is not supported; "
                         f"the transformers backbone loads {', '.join(SUPPORTED_MODEL_TYPES)}")
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    mid = default_mask_token_id(hf_cfg.vocab_size) if mask_token_id is None else mask_token_id
    from pathlib import Path

    cfg = HFBlockConfig.from_hf(hf_cfg, name or Path(path).name, mid, num_parameters=count_parameters(lm))
    return HFBlockDiffusionModel(lm, cfg).eval()
