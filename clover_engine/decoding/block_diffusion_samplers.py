"""The official samplers of Fast-dLLM v2 and SDAR as named policies: their settings (`FastDLLMv2Sampler`,
`SDARSampler`, with the originals' parameter names and defaults) and one denoising step of each
(`fast_dllm_v2_step`, `sdar_step`), written with the same tensor operations in the same order as the
originals, so that a decode is token for token theirs (``tests/clover_engine/test_block_diffusion_fidelity.py``
checks it against outputs of the official code committed under ``tests/data/``). LLaDA2.0's and LLaDA2.1's, on the
same machinery, are `clover_engine.decoding.llada2_samplers`.

Both run on a block-causal model (`clover_engine.backbones.block_causal.BlockCausalModel`): blocks aligned to
absolute positions, the prompt's whole blocks prefilled into the KV cache, one block denoised at a time
against the cache, and a finished block committed by one more forward over it.

* **Fast-dLLM v2** (``generate`` of ``Fast_dLLM_QwenForCausalLM``, Efficient-Large-Model hub; the same loop as
  ``batch_sample`` in ``v2/generation_functions.py`` of NVlabs/Fast-dLLM): the block is decoded in
  sub-blocks of ``small_block_size`` slots, left to right; each forward runs over the whole block, the
  logits are shifted (row j = the output at slot j - 1), and every masked slot of the sub-block whose
  probability is **strictly above** ``threshold`` is written, plus the single most probable one (always).
  The commit forward of a finished block also gives the next block's first slot, autoregressively
  (the argmax of its last output). The decode stops when the stop token is written with no MASK before it.
* **SDAR** (``block_diffusion_generate`` in ``generate.py`` of JetAstra/SDAR): every slot predicted in
  place; a token is **drawn** per slot (temperature, top-k, top-p; ``top_k=1`` is greedy) and its
  probability is the slot's confidence; a block gets ``denoising_steps`` steps with a fixed quota per
  step (`sdar_num_transfer_tokens`), written by ``remasking_strategy``: ``low_confidence_dynamic`` (all
  above ``confidence_threshold`` if they fill the quota, else the quota's top slots),
  ``low_confidence_static`` (the quota's top slots) or ``sequential`` (the quota's leftmost masked
  slots). As in the original, a quota larger than the masks left takes non-masked slots too (their
  drawn token overwrites them). SDAR's ``entropy_bounded`` is refused: in the pinned original it
  raises ``NameError`` (``transfer_index`` is never created in that branch).

One divergence, where the original never returns: Fast-dLLM v2 does not exclude the MASK id from the
candidates, so at temperature 0 a step whose every written slot takes the MASK id repeats for ever (the
same input gives the same forward); here that slot takes its best token other than MASK (a forced fill).

Draws come from a ``torch.Generator`` seeded with ``seed``, in the order the originals draw from torch's
global generator, so ``torch.manual_seed(seed)`` before the original gives the same tokens.

Shapes: L = block slots, S = sub-block slots, V = vocabulary. Wing: ``decoding``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from clover_engine.decoding.masked_diffusion_samplers import _int, _real, check_whole_blocks

DECODER = "clover_engine.decoding.block_diffusion_decoder:BlockDiffusionDecoder"
"""``"module:Class"`` of the decoder that runs these samplers (`clover_engine.decoding.samplers.decoder_for`)."""

SDAR_REMASKING = ("low_confidence_dynamic", "low_confidence_static", "sequential")


@dataclass(frozen=True)
class FastDLLMv2Sampler:
    """Fast-dLLM v2's sampler (``Fast_dLLM_QwenForCausalLM.generate``), its parameters and defaults.

    Attributes:
        max_new_tokens: answer budget, a multiple of ``block_size``: ``max_new_tokens // block_size`` blocks are
            decoded (the original has no default; 2048 here). A remainder, which the original drops silently, is
            refused with the values that work (`check_whole_blocks`).
        block_size: slots per block, the KV-cache granularity (default 32, the trained block).
        small_block_size: slots per sub-block, a divisor of ``block_size`` (default 8).
        threshold: a masked slot is written when its probability is ``> threshold`` (the original's default 1.0:
            one slot per forward; its README uses 0.9).
        top_p, temperature: token sampling (temperature 0, the default, is the argmax).
        stop_token: the id that ends the answer (None: the model's EOS).
        seed: seeds the draws at temperature > 0 (None: torch's global generator).
        top_candidates: top tokens per slot kept in events.

    The original's ``use_block_cache`` (reuse of the block's own K/V inside a sub-block) is not offered:
    it is an approximation its authors ship off by default.

    Raises:
        ValueError: a value out of range, ``block_size`` not a multiple of ``small_block_size``, or
            ``max_new_tokens`` not a multiple of ``block_size``.
    """

    max_new_tokens: int = 2048
    block_size: int = 32
    small_block_size: int = 8
    threshold: float = 1.0
    top_p: float = 0.95
    temperature: float = 0.0
    stop_token: int | None = None
    seed: int | None = None
    top_candidates: int = 5

    sampler = "fast_dllm_v2"
    DECODER = DECODER
    family = "fast_dllm_v2"

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "block_size", "small_block_size", "top_candidates"):
            object.__setattr__(self, name, _int(name, getattr(self, name), 1))
        object.__setattr__(self, "threshold", _real("threshold", self.threshold, 0.0, 1.0))
        object.__setattr__(self, "top_p", _real("top_p", self.top_p, 0.0, 1.0, lo_open=True))
        object.__setattr__(self, "temperature", _real("temperature", self.temperature, 0.0))
        if self.block_size % self.small_block_size:
            raise ValueError(f"block_size {self.block_size} must be a multiple of small_block_size "
                             f"{self.small_block_size} (Fast-dLLM v2 decodes block_size // small_block_size sub-blocks)")
        # the original decodes max_new_tokens // block_size blocks: a remainder would be dropped without a word
        check_whole_blocks("Fast-dLLM v2", self.max_new_tokens, "max_new_tokens", self.block_size, "block_size",
                           block_ok=lambda b: b % self.small_block_size == 0)
        for name in ("stop_token", "seed"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _int(name, getattr(self, name), 0))

    @property
    def canvas_length(self) -> int:
        """The answer budget (``max_new_tokens``; the commit of the last block may add one more token)."""
        return self.max_new_tokens

    def to_dict(self) -> dict:
        return {"sampler": self.sampler, **asdict(self)}


@dataclass(frozen=True)
class SDARSampler:
    """SDAR's sampler (``block_diffusion_generate`` of JetAstra/SDAR ``generate.py``), its parameters and defaults.

    Attributes:
        gen_length: answer budget; blocks up to ``ceil((P + gen_length) / block_length)`` (default 128).
        block_length: slots per block (default 8; SDAR's command line uses 4).
        denoising_steps: steps per block (default 8).
        temperature, top_k, top_p: the token draw (defaults 1.0 / 0 / 1.0: plain sampling; ``top_k=1``
            is greedy; the original divides by the temperature, so 0 is refused).
        remasking_strategy: ``low_confidence_dynamic`` (default), ``low_confidence_static`` or ``sequential``.
        confidence_threshold: the dynamic strategy writes every slot with confidence ``> threshold`` (0.85).
        stop_token_ids: ids that end the decode after the block holding one (None: the model's EOS).
        seed: seeds the draws (None: torch's global generator).
        top_candidates: top tokens per slot kept in events.

    Raises:
        ValueError: a value out of range or an unknown strategy (``entropy_bounded``: see the module docstring).
    """

    gen_length: int = 128
    block_length: int = 8
    denoising_steps: int = 8
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    remasking_strategy: str = "low_confidence_dynamic"
    confidence_threshold: float = 0.85
    stop_token_ids: tuple[int, ...] | None = None
    seed: int | None = None
    top_candidates: int = 5

    sampler = "sdar"
    DECODER = DECODER
    family = "sdar"

    def __post_init__(self) -> None:
        for name in ("gen_length", "block_length", "denoising_steps", "top_candidates"):
            object.__setattr__(self, name, _int(name, getattr(self, name), 1))
        object.__setattr__(self, "top_k", _int("top_k", self.top_k, 0))
        object.__setattr__(self, "temperature", _real("temperature", self.temperature, 0.0, lo_open=True))
        object.__setattr__(self, "top_p", _real("top_p", self.top_p, 0.0, 1.0, lo_open=True))
        object.__setattr__(self, "confidence_threshold",
                           _real("confidence_threshold", self.confidence_threshold, 0.0, 1.0))
        if self.remasking_strategy == "entropy_bounded":
            raise ValueError("remasking_strategy 'entropy_bounded' is not offered: SDAR's own generate.py raises "
                             "NameError in that branch (transfer_index is never created); use low_confidence_dynamic, "
                             "low_confidence_static or sequential")
        if self.remasking_strategy not in SDAR_REMASKING:
            raise ValueError(f"remasking_strategy must be one of {SDAR_REMASKING}, got {self.remasking_strategy!r}")
        if self.stop_token_ids is not None:
            ids = (self.stop_token_ids,) if isinstance(self.stop_token_ids, int) else tuple(self.stop_token_ids)
            object.__setattr__(self, "stop_token_ids", tuple(_int("stop_token_ids", t, 0) for t in ids))
        if self.seed is not None:
            object.__setattr__(self, "seed", _int("seed", self.seed, 0))

    @property
    def canvas_length(self) -> int:
        """The answer budget (``gen_length``; the last block may run past it to its end)."""
        return self.gen_length

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop_token_ids"] = None if self.stop_token_ids is None else list(self.stop_token_ids)
        return {"sampler": self.sampler, **d}


@dataclass
class BlockStep:
    """What one step decided over the block ([L] tensors): ``candidate`` (the token of each slot),
    ``prob`` (its probability, fp32), ``transfer`` (slots written) and ``forced`` (slots written only by
    the always-one rule: Fast-dLLM v2's argmax when nothing passed the threshold)."""

    candidate: torch.Tensor
    prob: torch.Tensor
    transfer: torch.Tensor
    forced: torch.Tensor


# ------------------------------------------------------------------------------------- Fast-dLLM v2
def fast_dllm_v2_sample(logits: torch.Tensor, top_p: float, temperature: float,
                        generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast-dLLM v2's ``sample_with_top_p``: (x_1 [1, S] int64, p_1t [1, S, V] fp32).

    Temperature 0: the argmax and the plain softmax. Otherwise softmax(logits / temperature), top-p
    filtered and renormalised, one draw per slot (the original draws ``multinomial(p_1t[0], 1)``).
    """
    if temperature <= 0:
        p_1t = torch.softmax(logits, dim=-1)
        return p_1t.argmax(dim=-1), p_1t
    probs = F.softmax(logits / temperature, dim=-1)
    sorted_probs, sorted_indices = torch.sort(probs, descending=True)
    cumulative_probs = torch.cumsum(sorted_probs, dim=-1)
    sorted_indices_to_remove = cumulative_probs > top_p
    sorted_indices_to_remove[..., 1:] = sorted_indices_to_remove[..., :-1].clone()
    sorted_indices_to_remove[..., 0] = 0
    indices_to_remove = torch.zeros_like(probs, dtype=torch.bool).scatter_(dim=-1, index=sorted_indices,
                                                                            src=sorted_indices_to_remove)
    probs[indices_to_remove] = 0
    p_1t = probs / torch.sum(probs, dim=-1, keepdim=True)
    x_1 = torch.multinomial(p_1t[0], num_samples=1, generator=generator).unsqueeze(0).squeeze(-1)
    return x_1, p_1t


def fast_dllm_v2_step(sub: torch.Tensor, logits: torch.Tensor, mask_id: int, cfg: FastDLLMv2Sampler,
                      generator: torch.Generator | None) -> BlockStep:
    """One step on a sub-block: write its masked slots above the threshold, and the most probable one.

    Args:
        sub: [1, S] int64, the sub-block, written in place.
        logits: [1, S, V] fp32, already shifted (row j = the output at the slot before j).
        mask_id: the MASK id. cfg: the settings. generator: for temperature > 0.

    Returns:
        `BlockStep` over the S slots.
    """
    mask_idx = sub == mask_id
    x_1, p_1t = fast_dllm_v2_sample(logits, cfg.top_p, cfg.temperature, generator)
    x1_p = torch.squeeze(torch.gather(p_1t, dim=-1, index=torch.unsqueeze(x_1, -1)), -1)
    prob = x1_p.clone()
    x1_p = torch.where(mask_idx, x1_p, -torch.inf)
    passed = x1_p > cfg.threshold
    unmask_idx = passed.clone()
    max_prob_idx = x1_p.argmax(dim=-1)
    unmask_idx[torch.arange(x_1.shape[0]), max_prob_idx] = True
    unmask_idx = unmask_idx & mask_idx
    sub[unmask_idx] = x_1[unmask_idx]
    forced = unmask_idx & ~passed
    if cfg.temperature <= 0 and not (unmask_idx & (x_1 != mask_id)).any():
        # every slot written took the MASK id itself: the original, deterministic at temperature 0, would repeat
        # this forward for ever; the most probable slot takes its best token other than MASK instead
        j = int(max_prob_idx[0])
        best = p_1t[0, j].clone()
        best[mask_id] = -1.0
        sub[0, j] = x_1[0, j] = int(best.argmax())
        prob[0, j] = best.max()
        unmask_idx[0, j] = forced[0, j] = True
    return BlockStep(x_1[0], prob[0], unmask_idx[0], forced[0])


# ------------------------------------------------------------------------------------- SDAR
def sdar_num_transfer_tokens(block_length: int, steps: int) -> torch.Tensor:
    """[steps] int64: the block's slots split evenly over its steps, the remainder to the first steps
    (SDAR's ``get_num_transfer_tokens``; it counts slots, not the masks left)."""
    base, remainder = block_length // steps, block_length % steps
    num_transfer_tokens = torch.zeros(steps, dtype=torch.int64) + base
    num_transfer_tokens[:remainder] += 1
    return num_transfer_tokens


def _top_k_logits(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0:
        return logits
    values, _ = torch.topk(logits, k)
    min_values = values[..., -1, None]
    return torch.where(logits < min_values, torch.full_like(logits, float("-inf")), logits)


def _top_p_logits(logits: torch.Tensor, p: float) -> torch.Tensor:
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cumulative_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    sorted_mask = cumulative_probs > p
    sorted_mask[..., 1:] = sorted_mask[..., :-1].clone()
    sorted_mask[..., 0] = False
    mask_indices = torch.scatter(torch.full_like(logits, False, dtype=torch.bool), -1, sorted_indices, sorted_mask)
    return logits.masked_fill(mask_indices, float("-inf"))


def sdar_sample(logits: torch.Tensor, cfg: SDARSampler,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """SDAR's ``sample_with_temperature_topk_topp``: one draw per slot and its probability.

    Args:
        logits: [1, L, V] fp32.

    Returns:
        (token [1, L] int64, token_prob [1, L] fp32).
    """
    orig_shape = logits.shape[:-1]
    logits = logits.reshape(-1, logits.shape[-1])
    if cfg.temperature != 1.0:
        logits = logits / cfg.temperature
    if cfg.top_k > 0:
        logits = _top_k_logits(logits, cfg.top_k)
    if cfg.top_p < 1.0:
        logits = _top_p_logits(logits, cfg.top_p)
    probs = F.softmax(logits, dim=-1)
    token = torch.multinomial(probs, num_samples=1, generator=generator)
    token_prob = torch.gather(probs, -1, token)
    return token.view(*orig_shape), token_prob.view(*orig_shape)


def sdar_step(cur: torch.Tensor, logits: torch.Tensor, mask_id: int, quota: int, cfg: SDARSampler,
              generator: torch.Generator | None) -> BlockStep:
    """One denoising step of SDAR's ``block_diffusion_generate`` on the block.

    Args:
        cur: [1, L] int64, the block, written in place.
        logits: [1, L, V] fp32 (row j predicts slot j, no shift).
        mask_id: the MASK id. quota: this step's `sdar_num_transfer_tokens`. cfg: the settings.
        generator: the draws.

    Returns:
        `BlockStep` (``forced``: slots written by the dynamic strategy's fallback to the quota).
    """
    mask_index = cur == mask_id
    x0, x0_p = sdar_sample(logits, cfg, generator)
    transfer_index = torch.zeros_like(x0, dtype=torch.bool)
    forced = torch.zeros_like(transfer_index)
    strategy = cfg.remasking_strategy
    if strategy == "sequential":
        for j in range(cur.shape[0]):
            first_mask_index = mask_index[j].nonzero(as_tuple=True)[0].min().item()
            transfer_index[j, first_mask_index:first_mask_index + quota] = True
    else:
        confidence = torch.where(mask_index, x0_p, -torch.inf)
        for j in range(confidence.shape[0]):
            high_conf_mask = confidence[j] > cfg.confidence_threshold
            if strategy == "low_confidence_dynamic" and high_conf_mask.sum() >= quota:
                transfer_index[j] = high_conf_mask
            else:
                _, idx = torch.topk(confidence[j], quota)
                transfer_index[j, idx] = True
                if strategy == "low_confidence_dynamic":
                    forced[j] = transfer_index[j] & ~high_conf_mask
    cur[transfer_index] = x0[transfer_index]
    return BlockStep(x0[0], x0_p[0], transfer_index[0], forced[0])


SAMPLER_CONFIGS = (FastDLLMv2Sampler, SDARSampler)
"""The settings classes `clover_engine.decoding.block_diffusion_decoder.BlockDiffusionDecoder` runs."""

__all__ = ["BlockStep", "FastDLLMv2Sampler", "SAMPLER_CONFIGS", "SDARSampler", "SDAR_REMASKING",
           "fast_dllm_v2_sample", "fast_dllm_v2_step", "sdar_num_transfer_tokens",
           "sdar_sample", "sdar_step"]
