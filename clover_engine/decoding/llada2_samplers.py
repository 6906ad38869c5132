"""The official samplers of LLaDA2.0 and LLaDA2.1 as named policies: their settings (`LLaDA2Sampler`,
`LLaDA21Sampler`, with the originals' parameter names and defaults) and one denoising step of each
(`llada2_step`, `llada21_step`), written with the same tensor operations in the same order as the originals, so
that a decode is token for token theirs (``tests/clover_engine/test_llada2_fidelity.py`` checks it against outputs
of the official code committed under ``tests/data/``).

Both run on a LLaDA2.0 checkpoint (`clover_engine.backbones.llada2_moe`; LLaDA2.1 has the same layout) with
`clover_engine.decoding.block_diffusion_decoder.BlockDiffusionDecoder`: SDAR's blocks aligned to absolute
positions, attention full within a block and causal across blocks.

* **LLaDA2.0** (``generate`` of the hub's ``modeling_llada2_moe.py``): SDAR's quota schedule, greedy by default,
  every masked slot ``> threshold`` when they fill the step's quota, else the quota's most probable masked slots;
  each forward recomputes the prompt and the finished blocks (`LLaDA2Sampler`).
* **LLaDA2.1** (its hub ``generate``): the same blocks with token editing -- written slots rewritten above
  ``editing_threshold`` -- and editing-only forwards once a block has no MASK left (`LLaDA21Sampler`).

Draws come from a ``torch.Generator`` seeded with ``seed``, in the order the originals draw from torch's global
generator, so ``torch.manual_seed(seed)`` before the original gives the same tokens.

Shapes: L = block slots, V = vocabulary. Wing: ``decoding``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from clover_engine.decoding.block_diffusion_samplers import (
    DECODER, BlockStep, _top_k_logits, _top_p_logits,
)
from clover_engine.decoding.masked_diffusion_samplers import _int, _real


@dataclass(frozen=True)
class LLaDA2Sampler:
    """LLaDA2.0's sampler (``generate`` of ``LLaDA2MoeModelLM``, the hub's ``modeling_llada2_moe.py``), its
    parameters and defaults.

    Attributes:
        gen_length: answer budget; blocks up to ``ceil((P + gen_length) / block_length)`` (the original's
            default is 2048; 128 here).
        block_length: slots per block (default 32).
        steps: denoising steps per block at most (default 32), capped at ``gen_length // minimal_topk``; the
            block's slots are split evenly over them (`clover_engine.decoding.block_diffusion_samplers.sdar_num_transfer_tokens`: the step's quota).
        threshold: every masked slot whose probability is ``> threshold`` is written when they fill the
            quota, else the quota's most probable masked slots (default 0.95).
        temperature, top_k, top_p: the token draw (defaults 0.0 / None / None: the argmax, greedy).
        eos_early_stop: stop as soon as an end-of-text is written with no MASK before it (default False: the
            decode stops after the block holding one).
        minimal_topk: caps ``steps`` at ``gen_length // minimal_topk`` (default 1).
        stop_token_ids: the end-of-text ids (None: the model's EOS; the original's ``eos_id``, one id).
        seed: seeds the draws at temperature > 0 (None: torch's global generator).
        kv_cache: False (default, as the original): every forward recomputes the prompt and the finished
            blocks with the block; True: they are committed to a KV cache once (fewer FLOPs; bf16 rounding then
            differs from the original's, `clover_engine.decoding.block_diffusion_decoder`).
        top_candidates: top tokens per slot kept in events.

    Raises:
        ValueError: a value out of range.
    """

    gen_length: int = 128
    block_length: int = 32
    steps: int = 32
    threshold: float = 0.95
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    eos_early_stop: bool = False
    minimal_topk: int = 1
    stop_token_ids: tuple[int, ...] | None = None
    seed: int | None = None
    kv_cache: bool = False
    top_candidates: int = 5

    sampler = "llada2"
    DECODER = DECODER
    family = "llada2"

    def __post_init__(self) -> None:
        for name in ("gen_length", "block_length", "steps", "minimal_topk", "top_candidates"):
            object.__setattr__(self, name, _int(name, getattr(self, name), 1))
        object.__setattr__(self, "threshold", _real("threshold", self.threshold, 0.0, 1.0))
        _check_llada2_draw(self)

    @property
    def canvas_length(self) -> int:
        """The answer budget (``gen_length``)."""
        return self.gen_length

    @property
    def steps_per_block(self) -> int:
        """``min(steps, gen_length // minimal_topk)``, as the original caps it."""
        return min(self.steps, self.gen_length // self.minimal_topk)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop_token_ids"] = None if self.stop_token_ids is None else list(self.stop_token_ids)
        return {"sampler": self.sampler, **d}


def _check_llada2_draw(cfg) -> None:
    """Check and normalise what `LLaDA2Sampler` and `LLaDA21Sampler` share: the draw, the booleans, the stop ids
    and the seed (a ValueError names the field)."""
    object.__setattr__(cfg, "temperature", _real("temperature", cfg.temperature, 0.0))
    if cfg.top_k is not None:
        object.__setattr__(cfg, "top_k", _int("top_k", cfg.top_k, 0))
    if cfg.top_p is not None:
        object.__setattr__(cfg, "top_p", _real("top_p", cfg.top_p, 0.0, 1.0, lo_open=True))
    for name in ("eos_early_stop", "kv_cache"):
        if not isinstance(getattr(cfg, name), bool):
            raise ValueError(f"{name} must be True or False, got {getattr(cfg, name)!r}")
    if cfg.stop_token_ids is not None:
        ids = (cfg.stop_token_ids,) if isinstance(cfg.stop_token_ids, int) else tuple(cfg.stop_token_ids)
        object.__setattr__(cfg, "stop_token_ids", tuple(_int("stop_token_ids", t, 0) for t in ids))
    if cfg.seed is not None:
        object.__setattr__(cfg, "seed", _int("seed", cfg.seed, 0))


def llada2_sample(logits: torch.Tensor, cfg: LLaDA2Sampler,
                  generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """LLaDA2.0's ``_sample_with_temperature_topk_topp``: (token [1, L] int64, its probability [1, L] fp32).

    Greedy (temperature 0, no top-k / top-p): the argmax of the logits and its softmax probability;
    otherwise the logits over the temperature, top-k and top-p filtered, one draw per slot.
    """
    orig_shape = logits.shape[:-1]
    logits = logits.reshape(-1, logits.shape[-1])
    if cfg.temperature == 0.0 and cfg.top_k in (None, 0) and (cfg.top_p is None or cfg.top_p >= 1.0):
        probs = F.softmax(logits, dim=-1)
        token = logits.argmax(dim=-1, keepdim=True)
        return token.view(*orig_shape), probs.gather(-1, token).view(*orig_shape)
    if cfg.temperature > 0 and cfg.temperature != 1.0:
        logits = logits / cfg.temperature
    logits = _top_k_logits(logits, cfg.top_k or 0)
    if cfg.top_p is not None and cfg.top_p < 1.0:
        logits = _top_p_logits(logits, cfg.top_p)
    probs = F.softmax(logits, dim=-1)
    token = torch.multinomial(probs, num_samples=1, generator=generator)
    return token.view(*orig_shape), torch.gather(probs, -1, token).view(*orig_shape)


def llada2_step(cur: torch.Tensor, logits: torch.Tensor, mask_id: int, quota: int, cfg: LLaDA2Sampler,
                generator: torch.Generator | None) -> BlockStep:
    """One denoising step of LLaDA2.0's ``generate`` on the block.

    Every masked slot above the threshold is written when there are at least ``quota`` of them; else the
    ``min(quota, masked slots)`` most probable masked slots (unlike SDAR's, the quota never takes a slot
    already written).

    Args:
        cur: [1, L] int64, the block, written in place.
        logits: [1, L, V] fp32 (row j predicts slot j, no shift).
        mask_id: the MASK id. quota: this step's share of the block. cfg: the settings. generator: the draws.

    Returns:
        `BlockStep` (``forced``: slots written by the quota though not above the threshold).
    """
    active = cur == mask_id
    x0, x0_p = llada2_sample(logits, cfg, generator)
    transfer_index = torch.zeros_like(x0, dtype=torch.bool)
    confidence = torch.where(active, x0_p, -torch.inf)
    high_conf_mask = confidence[0] > cfg.threshold
    if int(high_conf_mask.sum()) >= quota:
        transfer_index[0] = high_conf_mask
    else:
        _, idx = torch.topk(confidence[0], k=min(quota, int(active.sum())))
        transfer_index[0, idx] = True
    if transfer_index.any():
        cur[transfer_index] = x0[transfer_index]
    return BlockStep(x0[0], x0_p[0], transfer_index[0], (transfer_index & ~high_conf_mask[None])[0])


@dataclass(frozen=True)
class LLaDA21Sampler:
    """LLaDA2.1's sampler (``generate`` of its hub ``modeling_llada2_moe.py``): LLaDA2.0's blocks and attention, with
    **token editing** -- a written slot of the block is rewritten when the model now predicts another token for it
    with probability ``> editing_threshold`` (token-to-token, T2T, beside mask-to-token, M2T; Bie et al.,
    "LLaDA2.1: Speeding Up Text Diffusion via Token Editing", arXiv:2602.08676, 2026).

    Per block, every forward recomputes the window (the prompt, the finished blocks, the block) and writes: the
    masked slots above ``threshold`` if there are at least ``num_to_transfer`` of them, else the
    ``num_to_transfer`` most probable masked slots; and every edit. Once no slot is masked the block goes on
    with editing-only forwards until one edits nothing, or ``max_post_steps`` of them ran. The prompt is never
    edited.

    Attributes:
        gen_length: answer budget; blocks up to ``ceil((P + gen_length) / block_length)`` (the original's default
            2048; 128 here). block_length: slots per block (default 32).
        threshold: mask-to-token threshold, ``>`` (default 0.95). editing_threshold: token-to-token threshold,
            ``>`` (default 0.9; 1.0 turns editing off).
        max_post_steps: editing-only forwards per block at most (default 16).
        num_to_transfer: masked slots written per forward when too few pass ``threshold`` (default 1).
        temperature, top_k, top_p: the token draw (defaults 0.0 / None / None: greedy).
        eos_early_stop: stop after a block once the answer has no MASK left and holds an end-of-text (default
            False: every block of the budget is decoded, and the answer is cut at the first end-of-text).
        stop_token_ids: the end-of-text ids (None: the model's EOS; the original's ``eos_id``).
        seed: seeds the draws at temperature > 0. top_candidates: top tokens per slot kept in events.

    One divergence, where the original never returns: at temperature 0 a forward whose only writes put the MASK id
    itself into masked slots repeats for ever; here the most probable of those slots takes its best token other
    than MASK instead (a forced fill).

    Raises:
        ValueError: a value out of range.
    """

    gen_length: int = 128
    block_length: int = 32
    threshold: float = 0.95
    editing_threshold: float = 0.9
    max_post_steps: int = 16
    num_to_transfer: int = 1
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    eos_early_stop: bool = False
    stop_token_ids: tuple[int, ...] | None = None
    seed: int | None = None
    top_candidates: int = 5

    sampler = "llada21"
    DECODER = DECODER
    family = "llada2"

    def __post_init__(self) -> None:
        for name in ("gen_length", "block_length", "num_to_transfer", "top_candidates"):
            object.__setattr__(self, name, _int(name, getattr(self, name), 1))
        object.__setattr__(self, "max_post_steps", _int("max_post_steps", self.max_post_steps, 0))
        for name in ("threshold", "editing_threshold"):
            object.__setattr__(self, name, _real(name, getattr(self, name), 0.0, 1.0))
        _check_llada2_draw(self)

    kv_cache = False  # every forward recomputes the window, as the original
    canvas_length = LLaDA2Sampler.canvas_length  # the answer budget (gen_length)
    to_dict = LLaDA2Sampler.to_dict  # the settings, stop ids as a list


def llada21_step(cur: torch.Tensor, logits: torch.Tensor, mask_id: int, editable: torch.Tensor,
                 cfg: LLaDA21Sampler, generator: torch.Generator | None) -> tuple[BlockStep, torch.Tensor]:
    """One forward's writes of LLaDA2.1's ``generate`` on the block: mask-to-token, then token-to-token edits.

    Args:
        cur: [1, L] int64, the block, written in place.
        logits: [1, L, V] fp32 (row j predicts slot j).
        mask_id: the MASK id. editable: [L] bool, the block's slots that are not the prompt's.
        cfg: the settings. generator: the draws.

    Returns:
        (`BlockStep` -- ``transfer``: masked slots written, ``forced``: of them the ones below the threshold --,
        ``edited`` [L] bool: written slots given another token).
    """
    old = cur[0].clone()
    active = cur == mask_id
    x0, x0_p = llada2_sample(logits, cfg, generator)
    mask_transfer = torch.zeros_like(x0, dtype=torch.bool)
    high_conf_mask = torch.zeros_like(active[0])
    if active.sum() > 0:
        mask_confidence = torch.where(active, x0_p, -torch.inf)
        high_conf_mask = (mask_confidence[0] > cfg.threshold) & active[0]
        if int(high_conf_mask.sum()) >= cfg.num_to_transfer:
            mask_transfer[0] = high_conf_mask
        else:
            _, idx = torch.topk(mask_confidence[0], k=min(cfg.num_to_transfer, int(active.sum())))
            mask_transfer[0, idx] = True
    editable_positions = ~active[0] & editable
    editing_confidence = torch.where(editable_positions, x0_p[0], -torch.inf)
    edited = (editing_confidence > cfg.editing_threshold) & editable_positions & (x0[0] != old)
    final = mask_transfer[0] | edited
    if final.any():
        cur[0, final] = x0[0, final]
    forced = mask_transfer[0] & ~high_conf_mask
    if cfg.temperature == 0 and mask_transfer.any() and not edited.any() and bool((cur[0, mask_transfer[0]] == mask_id).all()):
        # every slot written took the MASK id itself: the original would repeat this forward for ever
        j = int(torch.where(mask_transfer[0], x0_p[0], -torch.inf).argmax())
        best = logits[0, j].clone()
        best[mask_id] = -torch.inf
        cur[0, j] = x0[0, j] = int(best.argmax())
        x0_p[0, j] = torch.softmax(logits[0, j], -1)[cur[0, j]]
        forced[j] = True
    return BlockStep(x0[0], x0_p[0], mask_transfer[0], forced), edited


SAMPLER_CONFIGS = (LLaDA2Sampler, LLaDA21Sampler)
"""The settings classes `clover_engine.decoding.block_diffusion_decoder.BlockDiffusionDecoder` runs besides
`clover_engine.decoding.block_diffusion_samplers.SAMPLER_CONFIGS`."""

__all__ = ["LLaDA21Sampler", "LLaDA2Sampler", "SAMPLER_CONFIGS", "llada21_step", "llada2_sample", "llada2_step"]
