"""What speed costs on the bundled language models: each setting's answers against the careful decode, over a
prompt set.

For every prompt, each model decodes its **careful decode** -- the same settings one slot per forward
(`clover_engine.decoding.careful.careful_setting`: top-k with one slot a step at the same block size) -- and each
setting of the grid; a setting's answer is compared with the careful one (`clover_engine.decoding.careful.
agreement`): token agreement in %, identical answers, the first slot where they part. For the SmolLM2 models the
base model's own greedy answer is a second reference: the drafter in ``verify`` writes exactly that answer (its
base keeps what it would write itself), and smollm2-bd adapts that same base (``smollm2-135m-instruct``).

Printed per model and setting (sums over the prompts): tokens per forward (tokens / NFE), mean agreement with
the careful decode, identical answers out of the prompts, the median first difference, and for SmolLM2 the mean
agreement with the base's greedy answer. Prompts: ``agent-eval`` for clover-tiny (its tool-call domain),
``chat-eval`` plain questions in the chat template for the SmolLM2 models.

Run: ``.venv/bin/python benchmarks/careful_agreement.py --threads 2 [--prompts 20 --max-new-tokens 64]``
(``--small`` for CI: 2 prompts, 16 tokens, one threshold).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from clover_engine.threads import add_threads_argument, configure_threads  # noqa: E402


def _load(name: str):
    from clover_engine.checkpoint import load_model, load_tokenizer

    path = ROOT / "models" / name
    return load_model(path), load_tokenizer(path)


def _prompts(kind: str, n: int) -> list[str]:
    from clover_engine.experiments.sweep.grid import load_task_set

    return [t.prompt for t in load_task_set(f"{kind}:{n}")]


def run(args) -> list[dict]:
    from tqdm import tqdm

    from clover_engine.checkpoint import best_memory_mode
    from clover_engine.decoding.careful import agreement, careful_setting
    from clover_engine.decoding.config import DecodeConfig
    from clover_engine.decoding.samplers import decoder_for
    from clover_engine.prompting import model_input

    thresholds = [float(t) for t in args.thresholds.split(",")]
    n, T = args.prompts, args.max_new_tokens
    rows: list[dict] = []
    base_answers: dict[str, list[int]] = {}  # chat prompt -> the SmolLM2 base's greedy answer (the drafter's verify)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if any(m.startswith("smollm2") for m in models) and "smollm2-drafter" not in models:
        models.append("smollm2-drafter")  # the base's answers come from its verify
    models.sort(key=lambda m: m != "smollm2-drafter")  # the base's answers first
    for name in models:
        model, tok = _load(name)
        caps = model.capabilities
        mode = best_memory_mode(ROOT / "models" / name)[0]  # the model's best measured mode, as the app starts in
        mode = mode if mode in caps.memory_modes else "state"
        block = caps.largest_trained_block if caps.drafts else args.block_size
        settings = [(f"threshold {t:.2f}", DecodeConfig(block_size=block, threshold=t, max_new_tokens=T,
                                                        memory_mode=mode)) for t in thresholds]
        if caps.drafts:  # verify first: its answer is the base's, the second reference of the commit runs
            settings = [("verify", DecodeConfig(block_size=block, policy="verify", max_new_tokens=T, memory_mode=mode)),
                        *[(f"commit, {label}", dc) for label, dc in settings]]
        chat = name.startswith("smollm2")
        prompts = _prompts("chat-eval" if chat else "agent-eval", n)
        per = {label: [] for label, _ in settings}
        for prompt in tqdm(prompts, desc=name, unit="prompt"):
            text = model_input(prompt, model).text if chat else prompt
            care_cfg = careful_setting(settings[-1][1])  # a threshold setting's (verify is its own)
            care = decoder_for(model, tok, care_cfg).generate(text, record_trace=False)
            for label, dc in settings:
                r = decoder_for(model, tok, dc).generate(text, record_trace=False)
                if label == "verify":
                    base_answers[prompt] = [int(t) for t in r.tokens]
                own = label == "verify"  # the base's own answer: its own reference
                a = agreement(r.tokens, r.tokens if own else care.tokens, own=own)
                base = agreement(r.tokens, base_answers[prompt]) if chat and prompt in base_answers else None
                per[label].append((r, a, base))
        for label, results in per.items():
            toks = sum(len(r.tokens) for r, _, _ in results)
            nfe = sum(r.nfe for r, _, _ in results)
            firsts = [a.first_difference for _, a, _ in results if a.first_difference is not None]
            bases = [b.token_agreement for _, _, b in results if b is not None]
            rows.append(dict(model=name, setting=label, prompts=len(results), tokens_per_forward=toks / max(nfe, 1),
                             agreement=statistics.fmean(a.token_agreement for _, a, _ in results),
                             identical=sum(a.identical for _, a, _ in results),
                             median_first_difference=statistics.median(firsts) if firsts else None,
                             vs_base=statistics.fmean(bases) if bases else None,
                             identical_to_base=sum(b.identical for _, _, b in results if b is not None) if bases else None))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="clover-tiny,smollm2-bd,smollm2-drafter", help="bundled models (models/...)")
    ap.add_argument("--prompts", type=int, default=20, help="prompts per model (agent-eval / chat-eval)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--thresholds", default="0.5,0.7,0.9,0.95")
    ap.add_argument("--block-size", type=int, default=32, help="block size of threshold decoding (the drafter: its own)")
    ap.add_argument("--small", action="store_true", help="CI: 2 prompts, 16 tokens, threshold 0.9, clover-tiny only")
    add_threads_argument(ap)
    args = ap.parse_args(argv)
    if args.small:
        args.prompts, args.max_new_tokens, args.thresholds, args.models = 2, 16, "0.9", "clover-tiny"
    configure_threads(args.threads)
    rows = run(args)
    print(f"\n{args.prompts} prompts per model, {args.max_new_tokens} new tokens, threads {args.threads}")
    print("| model | setting | tokens / forward | agreement with the careful decode | identical answers | "
          "median first difference | agreement with the base's greedy answer | identical to the base |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        mfd = "–" if r["median_first_difference"] is None else f"{r['median_first_difference']:g}"
        base = "–" if r["vs_base"] is None else f"{r['vs_base']:.1f} %"
        ib = "–" if r["identical_to_base"] is None else f"{r['identical_to_base']} / {r['prompts']}"
        own = " (its own reference: the base's answer)" if r["setting"] == "verify" else ""
        print(f"| {r['model']} | {r['setting']} | {r['tokens_per_forward']:.2f} | {r['agreement']:.1f} %{own} | "
              f"{r['identical']} / {r['prompts']} | {mfd} | {base} | {ib} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
