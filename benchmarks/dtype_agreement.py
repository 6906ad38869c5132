"""How often a bf16 (or fp16) model changes an accepted token against the fp32 model.

    .venv/bin/python benchmarks/dtype_agreement.py [--model models/clover-tiny] [--tasks 12] \\
        [--dtype bfloat16] [--block-size 32] [--threshold 0.95] [--memory-mode state] [--threads N]

Prompts: the first ``--tasks`` held-out agent tasks (`clover_engine.data.agent.eval_tasks`,
what ``clover_engine.eval`` scores) and ``--code`` held-out stdlib code prefixes.

Two measures, printed per setting:

* **teacher-forced** (the headline ratio): the fp32 model decodes; at every
  forward the low-precision model runs on exactly the same inputs (same
  commits, same block, its own state), and for every slot the fp32 decoder
  wrote (accepted or forced) we check whether the low-precision model's
  candidate -- its argmax after the same candidate rules -- is another token.
  ``changed / written`` is how often bf16 changes an accepted token at a
  given state of the decode. Also counted: accept decisions that flip
  (confidence on the other side of the threshold).
* **free-running**: both models decode on their own; the share of prompts
  with identical output and the mean share of the fp32 tokens before the
  first difference (one early change moves everything after it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clover_engine.checkpoint import DEFAULT_MODEL_DIR  # noqa: E402
from clover_engine.threads import add_threads_argument, configure_threads  # noqa: E402


class _Paired(torch.nn.Module):
    """Runs the reference model (whose outputs the decoder uses) and the other model on the
    same inputs, each with its own state; keeps both logits of every forward."""

    def __init__(self, ref, other):
        super().__init__()
        self.ref, self.other = ref, other
        self.config, self.model_id = ref.config, getattr(ref, "model_id", ref.config.name)
        self.capabilities = ref.capabilities
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._other_state = None

    @property
    def device(self):
        return self.ref.device

    @property
    def dtype(self):
        return self.ref.dtype

    def setup_state(self, batch_size=1, memory_mode="state"):
        self._other_state = self.other.setup_state(batch_size, memory_mode)
        return self.ref.setup_state(batch_size, memory_mode)

    def forward(self, block_ids, state, commit_ids=None, block_size=None, observe=False):
        out = self.ref(block_ids, state, commit_ids=commit_ids, block_size=block_size, observe=observe)
        other = self.other(block_ids, self._other_state, commit_ids=commit_ids, block_size=block_size)
        self.pairs.append((out.logits[0].detach(), other.logits[0].detach().float()))
        return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL_DIR)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--tasks", type=int, default=12, help="held-out agent prompts")
    ap.add_argument("--code", type=int, default=4, help="held-out stdlib code prefixes (256 tokens)")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--threshold", type=float, default=0.95)
    ap.add_argument("--memory-mode", default="state", choices=("state", "state+window"))
    ap.add_argument("--max-new-tokens", type=int, default=96)
    add_threads_argument(ap)
    args = ap.parse_args(argv)
    configure_threads(args.threads)

    from clover_engine.checkpoint import load_model, load_tokenizer
    from clover_engine.data.agent import eval_tasks
    from clover_engine.data.stdlib import stdlib_files
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
    from clover_engine.recording.events import StepEvent

    ref = load_model(args.model)
    low = load_model(args.model, dtype=getattr(torch, args.dtype))
    tok = load_tokenizer(args.model)
    prompts: list = [t.prompt for t in eval_tasks(n=args.tasks)] if args.tasks else []
    for f in stdlib_files("heldout")[: args.code]:
        ids = tok.encode(f.read_text(encoding="utf-8")).ids
        if len(ids) > 256:
            prompts.append(ids[:256])
    dc = DecodeConfig(block_size=args.block_size, threshold=args.threshold, memory_mode=args.memory_mode,
                      max_new_tokens=args.max_new_tokens)

    paired = _Paired(ref, low)
    dec_pair = BlockDecoder(paired, tok, dc)
    dec_low = BlockDecoder(low, tok, dc)
    written = changed = flips = identical = 0
    prefix_share = []
    for prompt in prompts:
        paired.pairs.clear()
        steps: list[StepEvent] = []
        res = dec_pair.generate(prompt, record_trace=False,
                                hooks=[lambda e: steps.append(e) if isinstance(e, StepEvent) else None])
        assert len(steps) == len(paired.pairs)
        undecodable = dec_pair._undecodable(ref.config.vocab_size, ref.config.eos_token_id)
        for st, (lr, lo) in zip(steps, paired.pairs):
            lo = lo.masked_fill(undecodable, float("-inf"))
            lo[:, ref.config.mask_token_id] = float("-inf")
            p_lo = torch.softmax(lo, -1)
            conf_lo, cand_lo = p_lo.max(-1)
            w = torch.from_numpy(st.accepted | st.forced)
            cand_ref = torch.from_numpy(st.candidate)
            written += int(w.sum())
            changed += int((w & (cand_lo != cand_ref)).sum())
            mb = torch.from_numpy(st.masked_before)
            acc_lo = mb & (conf_lo.double() >= dc.threshold)
            flips += int((mb & (acc_lo != torch.from_numpy(st.accepted))).sum())
        res_low = dec_low.generate(prompt, record_trace=False)
        identical += res.tokens == res_low.tokens
        prefix_share.append(_common_prefix(res.tokens, res_low.tokens) / max(1, len(res.tokens)))

    n = len(prompts)
    print(f"{args.model}: {args.dtype} vs float32, block_size {dc.block_size}, threshold {dc.threshold}, "
          f"{dc.memory_mode}, {n} prompts ({min(args.tasks, n)} agent tasks, rest stdlib code)")
    print(f"teacher-forced: {changed} of {written} written slots get another token in {args.dtype}: "
          f"ratio {changed / max(1, written):.4f} (agreement {1 - changed / max(1, written):.4f}); "
          f"accept decisions flipped at {flips} masked slot-steps")
    print(f"free-running: {identical}/{n} prompts give identical output; mean share of the fp32 tokens "
          f"before the first difference {sum(prefix_share) / max(1, n):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
