"""Measured break-even of block decoding on the machine at hand.

Block decoding beats autoregressive decoding only when the tokens it writes per
forward make up for what a block forward costs. On a GPU a 32-slot forward of a
small-batch decode reads about the same bytes as a one-token forward, so the
break-even is near 1 and tokens per forward is the speed-up; on a CPU the
forward's arithmetic grows with the slots it carries and the break-even climbs
with block_size. The roofline in `clover_engine.cost.devices` projects this; this
module measures it with the model's own forwards, on this device, after the same
committed prefix (medians over ``repeats`` rounds after ``warmup`` untimed ones;
each round times one forward of every shape, so a change of load on a shared
machine falls on all of them alike):

* ``t_ar``: one autoregressive step as the decoder runs ``block_size=1``: a
  one-slot forward with the last token's commit fused in;
* ``t_block``: a denoising forward of an L-slot block (no commit);
* ``t_commit``: what fusing a finished L-token block's commit into the next
  block's first forward adds (a forward with the commit minus ``t_block``).

A block of L tokens decoded in ``n`` forwards takes ``n * t_block + t_commit``;
the same L tokens autoregressively take ``L * t_ar``. They are equal at

    break-even tokens per forward = L * t_block / (L * t_ar - t_commit)

(infinite if the commit alone costs more than L autoregressive steps).

For a block drafter over a frozen causal LM (`clover_engine.backbones.drafter`, ``Capabilities.drafts``) the
same three forwards are the parts of a verify round (`clover_engine.decoding.verify`): the L-slot block
forward without a commit is the drafter's forward, the commit is the base reading L tokens (the
verification forward over ``[anchor, drafts]``), and the AR step is the base reading one token. A
round costs ``t_block + t_commit`` and writes ``a`` tokens (the accepted run plus the base's own
token), against ``a * t_ar`` autoregressively, so verify breaks even at

    verify break-even tokens per base forward = (t_block + t_commit) / t_ar

(`BreakEven.verify_tokens_per_forward`; `clover_engine.eval.drafter` times the same three parts directly).

Works for any model of the decoder protocol (``setup_state``, ``forward(block_ids,
state, commit_ids, block_size, observe)``): Clover, the transformers backbone,
Dream / LLaDA-style masked diffusion (which recomputes the whole sequence, so its
ratio is computed on that cost).

    python -m clover_engine.cost --break-even --model models/smollm2-bd --block-sizes 4,8,16,32

Wing: ``cost``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from clover_engine.backbones.base import capabilities_of


MAX_PREFIX = 8192  # committed tokens before the timed forwards, at most (memory and time of the set-up)
PREFIX_CHUNK = 256  # the prefix is committed this many tokens per forward (attention memory stays small)


@dataclass(frozen=True)
class BreakEven:
    """One measured point.

    Attributes:
        block_size: slots in the timed block forward (L).
        prefix_len: committed tokens before the timed forwards.
        t_ar_s: median seconds of an autoregressive step (one slot + one-token commit).
        t_block_s: median seconds of an L-slot denoising forward.
        t_commit_s: median extra seconds of fusing an L-token commit into a block forward (>= 0).
        repeats: timed forwards per median.
        device: ``str(model.device)``.
        threads: ``torch.get_num_threads()`` while measuring.
    """

    block_size: int
    prefix_len: int
    t_ar_s: float
    t_block_s: float
    t_commit_s: float
    repeats: int
    device: str
    threads: int

    @property
    def tokens_per_forward(self) -> float:
        """Tokens per forward block decoding must write to match autoregressive tokens/s:
        ``L * t_block / (L * t_ar - t_commit)`` (module docstring); ``inf`` when no rate suffices."""
        L = self.block_size
        room = L * self.t_ar_s - self.t_commit_s
        return L * self.t_block_s / room if room > 0 else float("inf")

    def speedup(self, tokens_per_forward: float) -> float:
        """Expected tokens/s of block decoding over autoregressive decoding at ``tokens_per_forward``
        (> 0): ``L * t_ar / (n * t_block + t_commit)`` with ``n = L / tokens_per_forward``."""
        if tokens_per_forward <= 0:
            raise ValueError(f"tokens_per_forward must be > 0, got {tokens_per_forward}")
        L = self.block_size
        return L * self.t_ar_s / (L / tokens_per_forward * self.t_block_s + self.t_commit_s)

    @property
    def verify_tokens_per_forward(self) -> float:
        """For a block drafter (module docstring): the tokens per base forward verify decoding must
        write to match the base's autoregressive tokens/s, ``(t_block + t_commit) / t_ar``."""
        return (self.t_block_s + self.t_commit_s) / self.t_ar_s

    def verify_speedup(self, tokens_per_forward: float) -> float:
        """For a block drafter: expected tokens/s of verify decoding over the base's autoregressive
        decoding at ``tokens_per_forward`` tokens per base forward (> 0): ``tpf * t_ar / (t_block + t_commit)``.

        Raises:
            ValueError: ``tokens_per_forward <= 0``.
        """
        if tokens_per_forward <= 0:
            raise ValueError(f"tokens_per_forward must be > 0, got {tokens_per_forward}")
        return tokens_per_forward / self.verify_tokens_per_forward


def _supports_protocol(model) -> bool:
    """A backbone the block decoder drives: it declares capabilities and keeps accept-once commits."""
    try:
        return not capabilities_of(model).revises_commits
    except TypeError:
        return False


def _sync(device) -> None:
    if getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)


@torch.inference_mode()
def measure_break_even(model, block_sizes=(4, 8, 16, 32), prefix_len: int = 256, repeats: int = 5,
                       warmup: int = 1, memory_mode: str = "state", seed: int = 0) -> dict[int, BreakEven]:
    """Time one-slot and L-slot denoising forwards of ``model`` after a committed prefix.

    Args:
        model: a model of the decoder protocol (`clover_engine.backbones.clover.model.CloverModel`,
            `clover_engine.backbones.causal_lm.model.HFBlockDiffusionModel`, `clover_engine.backbones.masked_diffusion` models).
        block_sizes: the L values (each >= 1).
        prefix_len: committed tokens before the timed forwards (random ordinary ids; the cost
            of a forward does not depend on which ids), committed `PREFIX_CHUNK` per forward.
            Clamped to `MAX_PREFIX` and so the prefix and the timed commits fit
            ``max_position_embeddings``.
        repeats: timed forwards per median (>= 1).
        warmup: untimed forwards first, per shape.
        memory_mode: the history mode to set up (``state`` or, for Clover, ``state+window``).
        seed: the prefix ids.

    Returns:
        {L: `BreakEven`}, in the order of ``block_sizes``.

    Raises:
        TypeError: ``model`` does not implement the decoder protocol (e.g. DiffusionGemma,
            which runs transformers' own sampler).
        ValueError: an empty ``block_sizes``, a block size < 1, ``repeats`` < 1,
            ``prefix_len`` < 1, or more timed positions than the model has.
    """
    if not _supports_protocol(model):
        raise TypeError(f"{type(model).__name__} does not implement the decoder protocol (setup_state / forward); "
                        "the break-even is measured on models the BlockDecoder drives")
    sizes = [int(b) for b in block_sizes]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"block_sizes must be a non-empty list of ints >= 1, got {list(block_sizes)!r}")
    if repeats < 1 or prefix_len < 1:
        raise ValueError(f"repeats and prefix_len must be >= 1, got repeats={repeats}, prefix_len={prefix_len}")
    cfg = model.config
    limit = int(getattr(cfg, "max_position_embeddings", prefix_len + max(sizes)) or prefix_len + max(sizes))
    added = (warmup + repeats) * (1 + sum(sizes)) + max(sizes) + 1  # the timed commits grow the history
    if limit - added < 1:
        raise ValueError(f"the timed forwards need {added} positions and the model has {limit}; "
                         "use fewer repeats or smaller block sizes")
    prefix_len = min(prefix_len, limit - added, MAX_PREFIX)
    device = model.device
    g = torch.Generator().manual_seed(seed)
    lo = 8 if cfg.vocab_size > 64 else 0  # skip the special ids of the project's tokenizers
    mask = cfg.mask_token_id

    def tokens(n: int) -> torch.Tensor:
        t = torch.randint(lo, cfg.vocab_size, (1, n), generator=g)
        t[t == mask] = lo
        return t.to(device)

    prefix = tokens(prefix_len)
    state = model.setup_state(1, memory_mode)
    # commit the prefix, PREFIX_CHUNK tokens per forward (Clover: each chunk one block)
    for i0 in range(0, prefix_len, PREFIX_CHUNK):
        chunk = prefix[:, i0: i0 + PREFIX_CHUNK]
        model(torch.full((1, 1), mask, device=device), state, commit_ids=chunk, block_size=chunk.shape[1])

    # the shapes, timed round-robin (one forward of each per round) so a change of machine load
    # falls on all of them alike: the AR step, then per L a plain block forward and one with its commit
    shapes = [(1, 1)] + [(L, c) for L in sizes for c in (0, L)]
    times: dict[tuple[int, int], list[float]] = {sh: [] for sh in shapes}
    for r in range(warmup + repeats):
        for L, commit in shapes:
            ids = torch.full((1, L), mask, device=device)
            c = tokens(commit) if commit else None
            _sync(device)
            t0 = time.perf_counter()
            model(ids, state, commit_ids=c, block_size=L)  # block_size L: a finished block's commit is one block
            _sync(device)
            if r >= warmup:
                times[(L, commit)].append(time.perf_counter() - t0)
    t_ar = statistics.median(times[(1, 1)])
    out = {}
    for L in sizes:
        t_block = statistics.median(times[(L, 0)])
        # the commit's extra cost: median of the paired differences of the same round
        t_commit = max(0.0, statistics.median(a - b for a, b in zip(times[(L, L)], times[(L, 0)])))
        out[L] = BreakEven(L, prefix_len, t_ar, t_block, t_commit, repeats, str(device), torch.get_num_threads())
    return out


def format_break_even(points: dict[int, BreakEven], label: str = "") -> str:
    """A text table of `measure_break_even`'s points, with a note on reading them."""
    first = next(iter(points.values()))
    lines = [f"measured break-even{' of ' + label if label else ''} on {first.device}, {first.threads} thread(s), "
             f"after a {first.prefix_len}-token prefix (median of {first.repeats} forwards); "
             f"autoregressive step {first.t_ar_s * 1e3:.2f} ms",
             f"{'block_size':>10}  {'block ms':>9}  {'commit ms':>9}  tokens per forward to match AR"]
    for L, p in points.items():
        lines.append(f"{L:>10}  {p.t_block_s * 1e3:>9.2f}  {p.t_commit_s * 1e3:>9.2f}  {p.tokens_per_forward:.2f}")
    lines.append("(wall-clock medians: on a busy machine or for a model whose forwards take a few ms they move "
                 "from run to run -- raise --repeats; a commit time within the noise shows as 0.00)")
    return "\n".join(lines)


__all__ = ["BreakEven", "format_break_even", "measure_break_even"]
