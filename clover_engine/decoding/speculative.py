"""Self-speculative decoding on a Clover model: draft with one block-diffusion forward, verify
against the model's own greedy autoregressive continuation, keep the longest matching prefix,
discard the rest.

Block diffusion (`clover_engine.decoding.decoder`, docs/architecture.md §5) writes a slot once and never takes
it back. Speculative decoding (Leviathan, Kalman & Matias, "Fast Inference from Transformers via
Speculative Decoding", ICML 2023; Chen et al., "Accelerating Large Language Model Decoding with
Speculative Sampling", 2023) uses a guess differently: a **draft** of k tokens is **verified**
against the target model's own choice at every drafted position; the longest prefix that
matches is accepted, the first mismatch is replaced by the verifier's token (the **correction**;
after a fully accepted draft, the verifier's next token, the **bonus**), and the drafted tokens
after it are discarded. With greedy verification the output is the target's greedy output,
token for token (**lossless**).

Here the target is the model itself at ``block_size = 1`` (greedy autoregressive decoding,
exactly `BlockDecoder` with ``DecodeConfig(block_size=1)``, no logits processors) and the
drafter is the same model in block mode:

* **Draft.** One forward over a block ``[h, MASK x k]`` placed at the position of ``h``, the last
  token the verifier produced (a pre-filled head slot, as the decoder does with the end of a
  prompt, §3 "Prompt"), with no commit: the state is read, not written. The draft is the argmax
  of each MASK slot (the decoder's candidate rule: MASK and ids without a token are never
  candidates). Unlike the decoder's blocks, a draft block starts wherever ``h`` is, not at a
  multiple of k.
* **Verify.** The greedy ``block_size = 1`` token at each drafted position, given the tokens
  before it. On a causal transformer one forward over the draft gives all of them, since
  position i's output predicts token i + 1. Clover has no such path inside a block: the block is
  bidirectional and there is no token shift -- slot j is predicted from its own output, whose
  input is MASK (§3) -- so one ordinary forward scores one autoregressive position. Two
  verifiers are implemented, with the same accept rule and the same tokens:

  - ``verifier="sequential"``: the autoregressive control's own forwards, one per position,
    run until the first mismatch (``a + 1`` forwards for ``a`` accepted tokens). They are
    exactly the forwards `BlockDecoder` runs at ``block_size = 1`` (the prompt committed with
    the first, then one committed token and one MASK slot per forward), so the output is the
    greedy output bit for bit. Counted as ``a + 1`` verify forwards.
  - ``verifier="parallel"``: one forward in the training layout (`CloverModel.forward_train`,
    §9) at ``block_size = 1``: the clean sequence ``[prompt, answer so far, h, draft]`` and a
    MASK query per position, query j reading the state (and window) of the clean tokens before
    j -- the autoregressive prediction of every drafted position and the bonus in one forward.
    Counted as one verify forward. The training pass starts from position 0 (it does not read a
    carried state's conv tails or window), so this forward recomputes the whole history: one
    forward in weights read, ``2 * (history + k + 2)`` token rows of compute
    (`SpeculativeResult.verify_tokens`). Its logits equal the sequential verifier's up to
    floating-point summation order.

Counting (`SpeculativeResult`): ``nfe = draft_forwards + verify_forwards``; the first token
comes from the verifier's first forward (the prompt's commit), with no draft before it.

Wing: ``decoding``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_speculative.py -q``
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from clover_engine.backbones.base import capabilities_of
from clover_engine.backbones.clover.model import MEMORY_MODES
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig

VERIFIERS = ("sequential", "parallel")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Settings of a self-speculative decode (validated on construction).

    Attributes:
        draft_size: k, MASK slots of the draft forward (>= 1).
        max_new_tokens: generated-token budget (>= 1), prompt not counted.
        memory_mode: ``state`` (Clover) or ``state+window``, for drafter and verifier alike.
        verifier: ``sequential`` (the autoregressive forwards, run until the first mismatch) or
            ``parallel`` (one training-layout forward per draft; see the module docstring).

    Raises:
        TypeError / ValueError: naming the field, the value and the valid range.
    """

    draft_size: int = 8
    max_new_tokens: int = 128
    memory_mode: str = "state"
    verifier: str = "sequential"

    def __post_init__(self) -> None:
        for name in ("draft_size", "max_new_tokens"):
            val = getattr(self, name)
            if isinstance(val, (bool, np.bool_)) or not isinstance(val, numbers.Integral):
                raise TypeError(f"{name} must be an int >= 1, got {type(val).__name__} ({val!r})")
            if int(val) < 1:
                raise ValueError(f"{name} must be an int >= 1, got {val}")
            object.__setattr__(self, name, int(val))
        if self.memory_mode not in MEMORY_MODES:
            raise ValueError(f"memory_mode must be one of {MEMORY_MODES}, got {self.memory_mode!r}")
        if self.verifier not in VERIFIERS:
            raise ValueError(f"verifier must be one of {VERIFIERS}, got {self.verifier!r}")


@dataclass
class DraftRound:
    """One draft and its verification.

    Attributes:
        position: answer position of the first drafted token (0 = the first generated token).
        draft: (k',) int64 drafted tokens (k' = draft_size, or fewer near the budget).
        verified: (a + 1,) int64 -- the verifier's tokens at the drafted positions up to the
            first mismatch, then the correction (or, after a full accept, the bonus token);
            shorter when decoding stopped inside the round (EOS or budget).
        accepted: a, the length of the longest drafted prefix equal to the verifier's tokens.
        draft_conf: (k',) float32 confidence of each drafted token in the draft forward.
    """

    position: int
    draft: np.ndarray
    verified: np.ndarray
    accepted: int
    draft_conf: np.ndarray

    @property
    def discarded(self) -> int:
        """Drafted tokens thrown away: everything after the accepted prefix."""
        return len(self.draft) - self.accepted


@dataclass
class SpeculativeResult:
    """What `SpeculativeDecoder.generate` returns.

    Attributes:
        text: decoded text of `tokens` ("" without a tokenizer).
        tokens: generated ids, up to and excluding the first EOS.
        prompt_ids: the prompt's ids.
        stop_reason: ``eos``, ``max_new_tokens`` or ``context``.
        rounds: one `DraftRound` per draft.
        draft_forwards: forwards of the drafter (one per round).
        verify_forwards: forwards of the verifier as counted by its kind (sequential: one per
            verified position, including the first token's; parallel: one per round plus the
            first token's).
        verify_tokens: token rows the verify forwards ran through the model (commits, MASK
            queries and, for the parallel verifier, the recomputed history).
        wall_s: seconds.
    """

    text: str
    tokens: list[int]
    prompt_ids: list[int]
    stop_reason: str
    rounds: list[DraftRound] = field(default_factory=list)
    draft_forwards: int = 0
    verify_forwards: int = 0
    verify_tokens: int = 0
    wall_s: float = 0.0

    @property
    def nfe(self) -> int:
        """Forwards run: drafter plus verifier."""
        return self.draft_forwards + self.verify_forwards

    @property
    def tokens_per_forward(self) -> float:
        """len(tokens) / nfe."""
        return len(self.tokens) / self.nfe if self.nfe else 0.0

    @property
    def acceptance_lengths(self) -> np.ndarray:
        """(rounds,) int64 -- accepted drafted tokens per round."""
        return np.array([r.accepted for r in self.rounds], np.int64)

    @property
    def drafted(self) -> int:
        """Drafted tokens, all rounds."""
        return int(sum(len(r.draft) for r in self.rounds))

    @property
    def discarded(self) -> int:
        """Drafted tokens discarded by verification, all rounds."""
        return int(sum(r.discarded for r in self.rounds))


class SpeculativeDecoder:
    """Greedy self-speculative decoding of a `CloverModel` (module docstring).

    Args:
        model: a `CloverModel` (eval mode is set here).
        tokenizer: a `tokenizers.Tokenizer` (for text prompts and output text) or None.
        config: a `SpeculativeConfig` (default: k = 8, sequential verifier, ``state``).

    Raises:
        TypeError: a config that is not a `SpeculativeConfig`, or a model without
            ``forward_train`` with the parallel verifier.
    """

    def __init__(self, model, tokenizer=None, config: SpeculativeConfig | None = None):
        self.config = config or SpeculativeConfig()
        if not isinstance(self.config, SpeculativeConfig):
            raise TypeError(f"config must be a SpeculativeConfig, got {type(self.config).__name__}")
        if self.config.verifier == "parallel" and not capabilities_of(model).trains_in_parallel:
            raise TypeError("the parallel verifier needs a backbone with a parallel training forward (forward_train: "
                            "CloverModel); use verifier='sequential'")
        # the decoder checks the model, encodes prompts and knows the ids that are never candidates
        self._dec = BlockDecoder(model, tokenizer)
        self.model, self.tokenizer = self._dec.model, tokenizer
        cfg = self.model.config
        never = self._dec._undecodable(cfg.vocab_size, cfg.eos_token_id).clone().to(self.model.device)
        never[cfg.mask_token_id] = True
        self._never = never  # [V] bool

    def _argmax(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[L, V] logits -> (confidence [L], token [L]): the decoder's candidate rule (§5 rule 2)."""
        probs = torch.softmax(logits.masked_fill(self._never, float("-inf")), dim=-1)
        return probs.max(-1)

    @torch.no_grad()
    def generate(self, prompt: str | Sequence[int] | torch.Tensor) -> SpeculativeResult:
        """Decode a continuation of `prompt`; the tokens are ``BlockDecoder`` at ``block_size = 1``'s.

        Args:
            prompt: text (needs a tokenizer) or token ids.

        Returns:
            `SpeculativeResult` with every round's draft and verification.

        Raises:
            TypeError / ValueError: a bad prompt (`clover_engine.decoding.decoder.BlockDecoder.encode_prompt`).
        """
        sc, model, cfg = self.config, self.model, self.model.config
        ids = self._dec.encode_prompt(prompt)
        P, mask, eos, dev = len(ids), cfg.mask_token_id, cfg.eos_token_id, model.device
        budget = min(sc.max_new_tokens, cfg.max_position_embeddings - P)
        stop_reason = "max_new_tokens" if budget == sc.max_new_tokens else "context"
        res = SpeculativeResult(text="", tokens=[], prompt_ids=ids, stop_reason=stop_reason)
        t_start = time.perf_counter()
        state = model.setup_state(1, sc.memory_mode)
        one_mask = torch.tensor([[mask]], device=dev)

        def ar_forward(commit: list[int]) -> int:
            """The autoregressive control's forward: commit `commit`, predict the next position."""
            out = model(one_mask, state, commit_ids=torch.tensor([commit], device=dev), block_size=1)
            res.verify_forwards += 1
            res.verify_tokens += len(commit) + 1
            return int(self._argmax(out.logits[0])[1][0])

        pending = ar_forward(ids)  # the first token: the verifier's first forward commits the prompt
        uncommitted: list[int] = []  # parallel verifier: accepted tokens not yet in the state
        while True:
            if pending == eos:
                res.stop_reason = "eos"
                break
            res.tokens.append(pending)
            if len(res.tokens) >= budget:
                break
            k = min(sc.draft_size, budget - len(res.tokens))
            # draft: [pending, MASK x k] at pending's position; the state is read, not written
            # (the parallel verifier's accepted tokens are committed by this forward)
            block = torch.tensor([[pending] + [mask] * k], device=dev)
            commit = torch.tensor([uncommitted], device=dev) if uncommitted else None
            out = model(block, state, commit_ids=commit, block_size=1)
            uncommitted = []
            res.draft_forwards += 1
            conf, draft = self._argmax(out.logits[0, 1:])
            draft_l = draft.tolist()
            rnd = DraftRound(position=len(res.tokens), draft=np.asarray(draft_l, np.int64), verified=np.zeros(0, np.int64),
                             accepted=0, draft_conf=conf.float().cpu().numpy())
            res.rounds.append(rnd)
            if sc.verifier == "sequential":
                verified, prev = [], pending
                for d in draft_l:
                    y = ar_forward([prev])
                    verified.append(y)
                    if y != d:
                        break
                    prev = y
                    if y == eos:
                        break
                else:  # every drafted token accepted: the next forward gives the bonus token
                    if len(res.tokens) + len(verified) < budget:
                        verified.append(ar_forward([prev]))
            else:
                verified = self._verify_parallel(ids + res.tokens + draft_l, k)
                res.verify_forwards += 1
                res.verify_tokens += 2 * (len(ids) + len(res.tokens) + k + 1)
            a = 0
            while a < min(len(verified), k) and verified[a] == draft_l[a]:
                a += 1
            verified = verified[: a + 1]
            rnd.accepted, rnd.verified = a, np.asarray(verified, np.int64)
            # emit the accepted drafted tokens; the last verified token becomes `pending`
            for y in verified[:-1]:
                if y == eos:
                    res.stop_reason = "eos"
                    break
                res.tokens.append(y)
                if len(res.tokens) >= budget:
                    break
            else:
                if verified and len(res.tokens) < budget:
                    if sc.verifier == "parallel":
                        uncommitted = [pending] + verified[:-1]
                    pending = verified[-1]
                    continue
            break
        res.wall_s = time.perf_counter() - t_start
        res.text = self.tokenizer.decode(res.tokens) if self.tokenizer is not None else ""
        return res

    def _verify_parallel(self, seq: list[int], k: int) -> list[int]:
        """One training-layout forward at block_size 1: the greedy token at each of the last k
        positions of `seq` and at the position after it (k + 1 tokens).

        Args:
            seq: [prompt, answer so far, pending token, draft of k] ids.
        """
        model, mask = self.model, self.model.config.mask_token_id
        clean = torch.tensor([seq + [mask]], device=model.device)  # the last clean token is read by no query
        T = clean.shape[1]
        queries = torch.full_like(clean, mask)
        hidden, _ = model.forward_train(clean, queries, block_size=1,
                                        use_window=self.config.memory_mode == "state+window")
        logits = model.lm_head(hidden[0, T - k - 1:]).float()  # queries at positions T-k-1 .. T-1
        return self._argmax(logits)[1].tolist()


def greedy_reference(model, tokenizer, prompt, max_new_tokens: int, memory_mode: str = "state") -> list[int]:
    """The tokens speculative decoding must reproduce: `BlockDecoder` at ``block_size = 1``.

    Returns:
        generated ids, up to and excluding the first EOS.
    """

    dc = DecodeConfig(block_size=1, max_new_tokens=max_new_tokens, memory_mode=memory_mode)
    return BlockDecoder(model, tokenizer, dc).generate(prompt, record_trace=False).tokens


def summarize_speculative(results: Sequence[SpeculativeResult]) -> dict:
    """Pooled numbers of several speculative decodes.

    Returns:
        dict: ``tokens``, ``rounds``, ``draft_forwards``, ``verify_forwards``, ``nfe``,
        ``tokens_per_forward`` (tokens / nfe), ``acceptance_length`` (mean accepted drafted
        tokens per round), ``tokens_per_round`` (mean tokens a round emits, accepted plus the
        correction), ``discard_share`` (drafted tokens discarded / drafted),
        ``one_forward_tokens_per_forward`` (tokens / (first forwards + 2 x rounds): the count
        with a verifier that scores a whole draft in one forward, whichever verifier ran).

    Raises:
        ValueError: no results.
    """
    if not results:
        raise ValueError("summarize_speculative needs at least one SpeculativeResult")
    toks = sum(len(r.tokens) for r in results)
    rounds = sum(len(r.rounds) for r in results)
    drafted = sum(r.drafted for r in results)
    acc = np.concatenate([r.acceptance_lengths for r in results]) if rounds else np.zeros(0)
    nfe = sum(r.nfe for r in results)
    one_fwd = len(results) + 2 * rounds
    return {
        "tokens": toks, "rounds": rounds,
        "draft_forwards": sum(r.draft_forwards for r in results),
        "verify_forwards": sum(r.verify_forwards for r in results), "nfe": nfe,
        "tokens_per_forward": toks / nfe if nfe else 0.0,
        "acceptance_length": float(acc.mean()) if len(acc) else math.nan,
        "tokens_per_round": float(np.mean([len(rd.verified) for r in results for rd in r.rounds])) if rounds else math.nan,
        "discard_share": sum(r.discarded for r in results) / drafted if drafted else math.nan,
        "one_forward_tokens_per_forward": toks / one_fwd,
    }
