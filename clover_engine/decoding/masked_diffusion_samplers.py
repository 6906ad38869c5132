"""The official samplers of LLaDA and Dream as named policies: their settings (`LLaDASampler`,
`DreamSampler`, with the originals' parameter names and defaults) and one denoising step of each
(`llada_step`, `dream_step`), written with the same tensor operations in the same order as the
originals so that a decode is token for token theirs (``tests/clover_engine/test_masked_diffusion_fidelity.py``
checks it against outputs of the official code committed under ``tests/data/``).

Both samplers denoise the whole answer canvas: ``x = prompt ++ [MASK] * gen_length``, every forward
runs over all of ``x`` (bidirectional, no cache), and the canvas starts right after the prompt (no
alignment of blocks to multiples of the block length, unlike `clover_engine.decoding.decoder.BlockDecoder`).

* **LLaDA** (Nie et al., "Large Language Diffusion Models", 2025; ``generate`` of the ML-GSAI/LLaDA
  repository): the canvas is cut into ``gen_length // block_length`` blocks decoded left to right,
  ``steps // num_blocks`` steps each; a block's masks are split evenly over its steps
  (`llada_num_transfer_tokens`, the remainder to the first steps); each step writes the top-k masked
  slots left of the block's end by ``remasking``: ``low_confidence`` (softmax probability of the
  argmax) or ``random`` (uniform scores, seeded). ``temperature > 0`` adds LLaDA's float64 Gumbel noise.
* **Dream** (Ye et al., "Dream 7B: Diffusion Large Language Models", 2025; ``DreamGenerationMixin._sample``
  of the Dream-org hub models): one canvas of ``max_new_tokens``, ``steps`` steps on the timesteps
  ``linspace(1, eps, steps + 1)``; step i writes ``int(n_masked * (1 - s / t))`` slots (the last step
  all), ranked by ``alg``: ``maskgit_plus`` (top-1 probability), ``topk_margin`` (top-1 minus top-2),
  ``entropy`` (negative entropy), or drawn by ``alg_temp`` > 0; ``origin`` writes each masked slot with
  probability ``1 - s / t`` (stochastic by nature). The logits are shifted (position i-1 predicts i).

Greedy settings (``temperature=0``, ``alg_temp`` None / 0) are deterministic; ``random``, ``origin``,
a temperature and ``alg_temp`` draw from a ``torch.Generator`` seeded with ``seed`` in the order the
originals draw from torch's global generator, so ``torch.manual_seed(seed)`` before the original
gives the same tokens. Like the originals, nothing excludes the MASK id from the candidates.
`DreamSampler`'s defaults are ``DreamGenerationConfig``'s (greedy tokens); note that Dream's
``diffusion_generate`` called without ``temperature`` / ``top_k`` / ``top_p`` reads them from the model
config, whose transformers 4.x defaults (1.0 / 50 / 1.0) make it sample.

Shapes: T = prompt + canvas positions, V = vocabulary, n = masked positions. Wing: ``decoding``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

DECODER = "clover_engine.decoding.masked_diffusion_decoder:MaskedDiffusionDecoder"
"""``"module:Class"`` of the decoder that runs these samplers (`clover_engine.decoding.samplers.decoder_for`)."""

LLADA_REMASKING = ("low_confidence", "random")
DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")


def _int(name: str, val, lo: int) -> int:
    if isinstance(val, bool) or not isinstance(val, numbers.Integral) or int(val) < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {val!r}")
    return int(val)


def _real(name: str, val, lo: float, hi: float | None = None, lo_open: bool = False) -> float:
    ok = isinstance(val, numbers.Real) and not isinstance(val, bool) and math.isfinite(float(val))
    ok = ok and (float(val) > lo if lo_open else float(val) >= lo) and (hi is None or float(val) <= hi)
    if not ok:
        raise ValueError(f"{name} must be a finite number {'>' if lo_open else '>='} {lo:g}"
                         f"{'' if hi is None else f' and <= {hi:g}'}, got {val!r}")
    return float(val)


def check_whole_blocks(family: str, budget: int, budget_field: str, block: int, block_field: str,
                       block_ok=None) -> None:
    """Refuse an answer budget that does not split into whole blocks, before any forward, saying what works.

    The samplers that decode the answer block by block (LLaDA's ``generate`` asserts ``gen_length %
    block_length == 0``; Fast-dLLM v2's decodes ``max_new_tokens // block_size`` blocks, so a remainder is
    silently dropped and a budget under one block decodes nothing) share this one refusal, so every family says
    it the same way: the sampler's own field names, the command line's flags and the explorer's controls, and a
    value of each that works -- the budget rounded up to whole blocks, or the largest block size <= ``block``
    that divides the budget (and satisfies ``block_ok``, e.g. Fast-dLLM v2's sub-blocks).

    Args:
        family: the sampler's name in the message (e.g. ``"LLaDA"``).
        budget, budget_field: the answer budget in tokens and the sampler's name for it.
        block, block_field: the block size in tokens and the sampler's name for it.
        block_ok: ``int -> bool``, extra conditions on a suggested block size (default: any).

    Raises:
        ValueError: ``budget % block != 0``.
    """
    if budget % block == 0:
        return
    up = -(-budget // block) * block
    down = next((b for b in range(min(block, budget), 0, -1) if budget % b == 0 and (block_ok is None or block_ok(b))),
                None)
    fix = f"--max-new-tokens {up}" + (f" or --block-size {down}" if down is not None else "")
    raise ValueError(f"{family}'s sampler decodes the answer in whole blocks: {budget_field} {budget} must be a "
                     f"multiple of {block_field} {block} -- use {fix} (in the explorer: max new tokens {up}"
                     + (f", or block size {down}" if down is not None else "") + ")")


@dataclass(frozen=True)
class LLaDASampler:
    """LLaDA's semi-autoregressive sampler (``generate`` of ML-GSAI/LLaDA), its parameters and defaults.

    Attributes:
        gen_length: canvas length, MASK slots after the prompt (default 128).
        block_length: slots per block, a divisor of ``gen_length`` (default 128: one block).
        steps: forwards over the whole answer, a multiple of ``gen_length // block_length`` (default 128).
        temperature: Gumbel-max temperature (0 = argmax; LLaDA draws the noise in float64).
        remasking: ``low_confidence`` (top-k by the argmax's softmax probability) or ``random``.
        seed: seeds the draws of ``random`` and of a temperature (None: torch's global generator).
        top_candidates: top tokens per slot kept in events.

    LLaDA's ``cfg_scale`` (classifier-free guidance) and its EOS switches are not offered.

    Raises:
        ValueError: a value out of range, ``gen_length`` not a multiple of ``block_length`` or
            ``steps`` not a multiple of the number of blocks (the original asserts both).
    """

    gen_length: int = 128
    block_length: int = 128
    steps: int = 128
    temperature: float = 0.0
    remasking: str = "low_confidence"
    seed: int | None = None
    top_candidates: int = 5

    sampler = "llada"
    DECODER = DECODER

    def __post_init__(self) -> None:
        for name in ("gen_length", "block_length", "steps", "top_candidates"):
            object.__setattr__(self, name, _int(name, getattr(self, name), 1))
        object.__setattr__(self, "temperature", _real("temperature", self.temperature, 0.0))
        if self.remasking not in LLADA_REMASKING:
            raise ValueError(f"remasking must be one of {LLADA_REMASKING}, got {self.remasking!r}")
        check_whole_blocks("LLaDA", self.gen_length, "gen_length", self.block_length, "block_length")
        if self.steps % self.num_blocks:
            up = -(-self.steps // self.num_blocks) * self.num_blocks
            raise ValueError(f"steps {self.steps} must be a multiple of the {self.num_blocks} blocks "
                             f"(gen_length // block_length; LLaDA's generate asserts it) -- use --steps {up}")
        if self.seed is not None:
            object.__setattr__(self, "seed", _int("seed", self.seed, 0))

    @property
    def num_blocks(self) -> int:
        """``gen_length // block_length``."""
        return self.gen_length // self.block_length

    @property
    def canvas_length(self) -> int:
        """MASK slots after the prompt (``gen_length``)."""
        return self.gen_length

    def to_dict(self) -> dict:
        return {"sampler": self.sampler, **asdict(self)}


@dataclass(frozen=True)
class DreamSampler:
    """Dream's sampler (``DreamGenerationMixin._sample`` of the Dream-org hub models), its parameters and defaults.

    Attributes:
        max_new_tokens: canvas length, MASK slots after the prompt (Dream's ``max_new_tokens``; default 128).
        steps: forwards over the canvas (Dream's default 512).
        eps: the last timestep of ``linspace(1, eps, steps + 1)`` (default 1e-3).
        alg: ``origin`` (default), ``maskgit_plus``, ``topk_margin`` or ``entropy``.
        alg_temp: None / 0 = the top slots by confidence; > 0 = slots drawn from softmax(confidence / alg_temp).
        temperature, top_p, top_k: token sampling (0 = argmax; Dream's ``sample_tokens``).
        seed: seeds every draw (None: torch's global generator).
        top_candidates: top tokens per slot kept in events.

    Raises:
        ValueError: a value out of range or an unknown ``alg``.
    """

    max_new_tokens: int = 128
    steps: int = 512
    eps: float = 1e-3
    alg: str = "origin"
    alg_temp: float | None = None
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    top_candidates: int = 5

    sampler = "dream"
    DECODER = DECODER

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "steps", "top_candidates"):
            object.__setattr__(self, name, _int(name, getattr(self, name), 1))
        object.__setattr__(self, "eps", _real("eps", self.eps, 0.0, 1.0, lo_open=True))
        object.__setattr__(self, "temperature", _real("temperature", self.temperature, 0.0))
        if self.alg not in DREAM_ALGS:
            raise ValueError(f"alg must be one of {DREAM_ALGS}, got {self.alg!r}")
        if self.alg_temp is not None:
            object.__setattr__(self, "alg_temp", _real("alg_temp", self.alg_temp, 0.0))
        if self.top_p is not None:
            object.__setattr__(self, "top_p", _real("top_p", self.top_p, 0.0, 1.0, lo_open=True))
        for name in ("top_k", "seed"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _int(name, getattr(self, name), 1 if name == "top_k" else 0))

    @property
    def canvas_length(self) -> int:
        """MASK slots after the prompt (``max_new_tokens``)."""
        return self.max_new_tokens

    def to_dict(self) -> dict:
        return {"sampler": self.sampler, **asdict(self)}


# ------------------------------------------------------------------------------------- LLaDA
def llada_num_transfer_tokens(mask_index: torch.Tensor, steps: int) -> torch.Tensor:
    """Slots to write at each step of a block: its masks split evenly, the remainder to the first steps
    (LLaDA's ``get_num_transfer_tokens``; the linear schedule of the LLaDA paper, Eq. 8).

    Args:
        mask_index: [B, block_length] bool, the block's masked slots. steps: steps of the block.

    Returns:
        [B, steps] int64.
    """
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base = mask_num // steps
    remainder = mask_num % steps
    num_transfer_tokens = torch.zeros(mask_num.size(0), steps, device=mask_index.device, dtype=torch.int64) + base
    for i in range(mask_num.size(0)):
        num_transfer_tokens[i, : remainder[i]] += 1
    return num_transfer_tokens


def llada_gumbel(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """LLaDA's ``add_gumbel_noise``: ``exp(logits) / (-log u) ** temperature`` in float64 (u uniform,
    drawn over the whole [B, T, V]); the logits unchanged at temperature 0."""
    if temperature == 0:
        return logits
    logits = logits.to(torch.float64)
    noise = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
    gumbel_noise = (-torch.log(noise)) ** temperature
    return logits.exp() / gumbel_noise


@dataclass
class SamplerStep:
    """What one step decided over the whole sequence ([1, T] tensors): ``candidate`` (the token each
    masked position would take), ``score`` (the ranking score; -inf where not eligible), ``prob``
    (softmax probability of the candidate, fp32) and ``transfer`` (positions written)."""

    candidate: torch.Tensor
    score: torch.Tensor
    prob: torch.Tensor
    transfer: torch.Tensor


def llada_step(x: torch.Tensor, logits: torch.Tensor, mask_id: int, block_end: int, k: int, cfg: LLaDASampler,
               generator: torch.Generator | None, within: tuple[int, int] | None = None) -> SamplerStep:
    """One step of LLaDA's ``generate``: writes the ``k`` best masked positions left of ``block_end`` into ``x``.

    Args:
        x: [1, T] int64, prompt ++ canvas, written in place.
        logits: [1, T, V] fp32, the forward's logits over ``x`` (row i predicts position i, no shift).
        mask_id: the MASK id. block_end: absolute end of the current block.
        k: positions to write (`llada_num_transfer_tokens`). cfg: the settings.
        generator: for ``random`` and a temperature (None: torch's global generator).
        within: ``(offset, T)`` when ``x`` and ``logits`` are one block of a sequence of T positions starting at
            ``offset`` (greedy ``low_confidence`` only: nothing is drawn). The top-k then runs over the whole
            sequence's confidence (-inf outside the block, as the original's), so that ties break as they do there.

    Returns:
        `SamplerStep` (over the block with ``within``).
    """
    mask_index = x == mask_id
    logits_with_noise = llada_gumbel(logits, cfg.temperature, generator)
    x0 = torch.argmax(logits_with_noise, dim=-1)
    p = F.softmax(logits, dim=-1)
    prob = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
    if cfg.remasking == "low_confidence":
        x0_p = prob.clone()
    else:
        x0_p = torch.rand((x0.shape[0], x0.shape[1]), device=x0.device, generator=generator)
    x0_p[:, block_end:] = -math.inf
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, -math.inf)
    transfer_index = torch.zeros_like(x0, dtype=torch.bool, device=x0.device)
    ranked, offset = confidence, 0
    if within is not None:  # the original's whole-sequence array: the same ties, the same picks
        offset, total = within
        ranked = confidence.new_full((confidence.shape[0], total), -math.inf)
        ranked[:, offset:offset + confidence.shape[1]] = confidence
    for j in range(confidence.shape[0]):
        _, select_index = torch.topk(ranked[j], k=int(k))
        pick = select_index - offset  # a pick outside the block (k past its masked slots) writes nothing there
        transfer_index[j, pick[(pick >= 0) & (pick < confidence.shape[1])]] = True
    x[transfer_index] = x0[transfer_index]
    return SamplerStep(x0, confidence, prob, transfer_index)


# ------------------------------------------------------------------------------------- Dream
def dream_timesteps(steps: int, eps: float, device=None) -> torch.Tensor:
    """[steps + 1] fp32, ``linspace(1, eps, steps + 1)`` (Dream's schedule; step i goes from t_i to t_{i+1})."""
    return torch.linspace(1, eps, steps + 1, device=device)


def _top_p_logits(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cumulative_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    sorted_indices_to_remove = cumulative_probs > top_p
    sorted_indices_to_remove[..., 1:] = sorted_indices_to_remove[..., :-1].clone()
    sorted_indices_to_remove[..., 0] = 0
    mask = torch.zeros_like(logits, dtype=torch.bool, device=logits.device)
    mask = mask.scatter_(-1, sorted_indices, sorted_indices_to_remove)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def _top_k_logits(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    top_k = min(top_k, logits.size(-1))
    indices_to_remove = logits < torch.topk(logits, top_k)[0][..., -1, None]
    return logits.masked_fill(indices_to_remove, torch.finfo(logits.dtype).min)


def dream_sample_tokens(logits: torch.Tensor, cfg: DreamSampler, generator: torch.Generator | None,
                        alg: str = "maskgit_plus") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dream's ``sample_tokens``: a token per row and its confidence by ``alg``.

    Args:
        logits: [n, V] fp32, the (shifted) logits of the masked positions.
        cfg: temperature / top_p / top_k. alg: ``maskgit_plus`` / ``origin`` (the token's probability),
            ``topk_margin`` (top-1 minus top-2 probability), ``entropy`` (sum p log(p + 1e-10), <= 0).

    Returns:
        (confidence [n] fp32, x0 [n] int64, prob [n] fp32: the probability of x0).
    """
    if cfg.temperature > 0:
        logits = logits / cfg.temperature
    if cfg.top_p is not None and cfg.top_p < 1:
        logits = _top_p_logits(logits, cfg.top_p)
    if cfg.top_k is not None:
        logits = _top_k_logits(logits, cfg.top_k)
    probs = torch.softmax(logits, dim=-1)
    if cfg.temperature > 0:
        try:  # torch.distributions.Categorical(probs).sample(): normalised probs, multinomial with replacement
            normalised = probs / probs.sum(-1, keepdim=True)
            x0 = torch.multinomial(normalised.reshape(-1, normalised.shape[-1]), 1, True, generator=generator).T
            x0 = x0.reshape(probs.shape[:-1])
            confidence = torch.gather(probs, -1, x0.unsqueeze(-1)).squeeze(-1)
        except (RuntimeError, ValueError):  # Dream falls back to the argmax when sampling fails (NaN / inf probabilities)
            confidence, x0 = probs.max(dim=-1)
    else:
        confidence, x0 = probs.max(dim=-1)
    prob = confidence
    if alg == "topk_margin":
        sorted_probs, _ = torch.sort(probs, dim=-1, descending=True)
        confidence = sorted_probs[:, 0] - sorted_probs[:, 1]
    elif alg == "entropy":
        log_probs = torch.log(probs + 1e-10)
        confidence = torch.sum(probs * log_probs, dim=-1)
    return confidence, x0, prob


def dream_step(x: torch.Tensor, logits: torch.Tensor, mask_id: int, i: int, timesteps: torch.Tensor,
               cfg: DreamSampler, generator: torch.Generator | None) -> SamplerStep:
    """Step ``i`` of Dream's ``_sample``: writes the step's quota of masked positions into ``x``.

    Args:
        x: [1, T] int64, prompt ++ canvas, written in place.
        logits: [1, T, V] fp32, already shifted (row i = the output at position i - 1).
        mask_id: the MASK id. i: the step (0-based). timesteps: `dream_timesteps`. cfg: the settings.
        generator: for ``origin``, a temperature and ``alg_temp`` (None: torch's global generator).

    Returns:
        `SamplerStep` (``score`` is the alg's confidence at masked positions, -inf elsewhere; for
        ``origin`` the probability of the drawn token, 0 where no token was drawn).
    """
    steps = cfg.steps
    mask_index = x == mask_id
    mask_logits = logits[mask_index]
    t = timesteps[i]
    s = timesteps[i + 1]
    candidate = x.clone()
    prob = torch.zeros(x.shape, dtype=logits.dtype, device=x.device)
    if cfg.alg == "origin":
        p_transfer = 1 - s / t if i < steps - 1 else 1
        x0 = torch.zeros_like(x[mask_index], device=x.device, dtype=torch.long) + mask_id
        transfer_index_t_s = torch.rand(*x0.shape, device=x.device, generator=generator) < p_transfer
        drawn_conf, x0[transfer_index_t_s], _ = dream_sample_tokens(mask_logits[transfer_index_t_s], cfg, generator)
        drawn = torch.zeros_like(x0, dtype=prob.dtype)
        drawn[transfer_index_t_s] = drawn_conf
        transfer = torch.zeros_like(mask_index)
        transfer[mask_index] = transfer_index_t_s
        x[mask_index] = x0.clone()
        candidate[mask_index] = x0
        prob[mask_index] = drawn
        score = torch.where(mask_index, prob, -math.inf)
        return SamplerStep(candidate, score, prob, transfer)
    confidence, x0, x0_prob = dream_sample_tokens(mask_logits, cfg, generator, cfg.alg)
    num_mask_token = mask_index.sum() / mask_index.shape[0]
    number_transfer_tokens = int(num_mask_token * (1 - s / t)) if i < steps - 1 else int(num_mask_token)
    full_confidence = torch.full_like(x, -torch.inf, device=x.device, dtype=logits.dtype)
    full_confidence[mask_index] = confidence
    score = full_confidence.clone()
    candidate[mask_index] = x0
    prob[mask_index] = x0_prob
    transfer = torch.zeros_like(mask_index)
    if number_transfer_tokens > 0:
        if cfg.alg_temp is None or cfg.alg_temp == 0:
            _, transfer_index = torch.topk(full_confidence, number_transfer_tokens)
        else:
            full_confidence = full_confidence / cfg.alg_temp
            full_confidence = F.softmax(full_confidence, dim=-1)
            transfer_index = torch.multinomial(full_confidence, num_samples=number_transfer_tokens, generator=generator)
        x_ = torch.zeros_like(x, device=x.device, dtype=torch.long) + mask_id
        x_[mask_index] = x0.clone()
        row_indices = torch.arange(x.size(0), device=x.device).unsqueeze(1).expand_as(transfer_index)
        x[row_indices, transfer_index] = x_[row_indices, transfer_index]
        transfer[row_indices, transfer_index] = True
    return SamplerStep(candidate, score, prob, transfer)


SAMPLER_CONFIGS = (LLaDASampler, DreamSampler)
"""The official samplers' settings classes; `clover_engine.decoding.masked_diffusion_decoder` runs them."""

__all__ = ["DREAM_ALGS", "DreamSampler", "LLADA_REMASKING", "LLaDASampler", "SAMPLER_CONFIGS", "SamplerStep",
           "check_whole_blocks", "dream_sample_tokens", "dream_step", "dream_timesteps", "llada_gumbel", "llada_num_transfer_tokens",
           "llada_step"]
