"""Evaluate a block drafter over its frozen base: verify and commit side by side, in one run.

    python -m clover_engine.eval --model models/smollm2-drafter [--prompts 60] [--max-new-tokens 64] \\
        [--open-tasks 20] [--thresholds 0.80,0.90,0.95,0.99] [--compare models/smollm2-bd] [--device cuda]

Wing ``eval`` (``clover_engine.eval`` hands a directory with ``model_type: block-drafter`` to this module).

On the fixed plain questions of `clover_engine.data.chat_prompts.eval_prompts` (hand-written, disjoint
from the training prompts) in ChatML with the base's system turn, and on open-vocabulary
tool-call turns (`clover_engine.data.open_tools.eval_turns`: tool names and keys never in training):

* **reference**: the base's own greedy ``generate`` (KV cache), timed -- tokens/s of autoregressive
  decoding on this machine, same process, same threads;
* **verify** (``policy="verify"``, block ``--block-size``): tokens per *target* forward, the accepted
  run of every round, acceptance by slot index (the share of rounds whose draft survives up to slot
  j), exact agreement with the reference (lossless: expected 100 %), tokens/s and its ratio to the
  reference;
* **commit** at each ``--thresholds`` (the seed's rule on the drafter's confidences, block
  ``--block-size``): token agreement with the reference (position-wise, as `clover_engine.eval.chat`),
  exact answers, tokens per decoder step (one drafter forward each; the target reads each finished
  block once more), error by slot index among blocks started while the answer still equalled the
  reference, tokens/s;
* **break-even** of this machine: the time of one verify round (a drafter forward over the block
  plus a target forward over it) over the time of one autoregressive target step, after a
  256-token prefix -- the tokens per target forward verify mode needs to beat ``generate`` here;
* ``--compare DIR``: another model decoded at the same block size and ``--compare-thresholds`` on the
  same prompts (e.g. ``smollm2-bd``, the adapted route), so the two routes stand side by side.

Results go to ``MODEL/eval.json`` (or ``--out``) and a table on stdout. ``--device cuda`` runs every model
there (fp32 either way, as `clover_engine.eval.chat`: agreement with the reference is measured exactly); times are
taken after the device has finished (`_sync`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from clover_engine.checkpoint import load_model, load_tokenizer
from clover_engine.data.chat_prompts import eval_prompts
from clover_engine.data.open_tools import eval_turns, score_turn
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.eval.summary import slot_errors_vs_reference
from clover_engine.prompting import model_input


def _agreement(gen: list[int], ref: list[int]) -> float:
    return sum(1 for a, b in zip(gen, ref) if a == b) / max(len(ref), len(gen), 1)


def _sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a CUDA timing ends there; nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def _greedy(model, ids: list[int], max_new: int) -> tuple[list[int], float]:
    """The base's own greedy generate (the frozen target of a drafter, ``.lm``), timed."""
    lm, eos = model.lm, model.config.eos_token_id
    _sync(model.device)
    t0 = time.perf_counter()
    x = torch.tensor([ids], device=model.device)
    out = lm.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                      eos_token_id=eos, pad_token_id=eos)
    _sync(model.device)
    wall = time.perf_counter() - t0
    gen = out[0, len(ids):].tolist()
    return (gen[: gen.index(eos)] if eos in gen else gen), wall


@torch.no_grad()
def break_even(model, block_size: int, prefix: int = 256, repeats: int = 5) -> dict:
    """Median seconds of one autoregressive target step, one target forward over a block, and one drafter
    forward, after a ``prefix``-token history; the ratio is the tokens per target forward verify needs."""
    ids = list(range(100, 100 + prefix))

    def timed(fn):
        ts = []
        for _ in range(repeats):
            st = model.setup_state()
            model.read(st, ids)
            _sync(model.device)
            t0 = time.perf_counter()
            fn(st)
            _sync(model.device)
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    mask = model.config.mask_token_id
    t1 = timed(lambda st: model.read(st, [7]))
    tb = timed(lambda st: model.read(st, [7] * block_size))
    td = timed(lambda st: model.draft(st, [7] + [mask] * (block_size - 1)))
    return {"prefix": prefix, "block_size": block_size, "ar_step_s": t1, "verify_forward_s": tb, "draft_forward_s": td,
            "break_even_tokens_per_forward": (tb + td) / t1}


def evaluate(model_dir: str, n_prompts: int, max_new: int, block_size: int, thresholds: list[float],
             open_tasks: int, compare: str | None, compare_thresholds: list[float] | None = None,
             device: str = "cpu") -> dict:
    """Run everything in the module docstring (every model on ``device``, fp32); returns the report."""
    model = load_model(model_dir, device=device)
    tok = load_tokenizer(model_dir)
    prompts = eval_prompts()[:n_prompts]
    jobs = [("plain", i, tok.encode(model_input(p, model).text).ids) for i, p in enumerate(prompts)]
    turns = eval_turns(open_tasks) if open_tasks else []
    jobs += [("tools", i, tok.encode(t.prompt).ids) for i, t in enumerate(turns)]
    other = load_model(compare, device=device) if compare else None
    dec = BlockDecoder(model, tok)
    rows = []
    for kind, i, ids in tqdm(jobs, desc="drafter eval", unit="prompt"):
        ref, ref_s = _greedy(model, ids, max_new)
        row = {"kind": kind, "i": i, "ref_len": len(ref), "ref_s": ref_s}
        r = dec.generate(ids, record_trace=False,
                         config=DecodeConfig(block_size=block_size, max_new_tokens=max_new, policy="verify"))
        row["verify"] = {"exact": r.tokens == ref, "agree": _agreement(r.tokens, ref), "n": len(r.tokens),
                         "target_forwards": r.nfe, "draft_forwards": r.draft_forwards, "wall_s": r.wall_s,
                         "accepted": r.accepted_lengths, "drafted": r.drafted}
        if kind == "tools":
            row["verify"]["tool"] = score_turn(tok.decode(r.tokens, skip_special_tokens=False), turns[i])
            row["ref_tool"] = score_turn(tok.decode(ref, skip_special_tokens=False), turns[i])
        for name, m, thrs in (("commit", model, thresholds), ("compare", other, compare_thresholds or thresholds)):
            if m is None:
                continue
            d = BlockDecoder(m, tok)
            for thr in thrs:
                c = d.generate(ids, record_trace=False,
                               config=DecodeConfig(block_size=block_size, threshold=thr, max_new_tokens=max_new))
                err, cnt = slot_errors_vs_reference(len(ids), block_size, c.tokens, ref, m.config.eos_token_id,
                                                    c.stop_reason == "eos", max_new)
                row[f"{name}/{thr:.2f}"] = {"exact": c.tokens == ref, "agree": _agreement(c.tokens, ref),
                                            "n": len(c.tokens), "steps": c.nfe, "n_forced": c.n_forced,
                                            "wall_s": c.wall_s, "slot_err": err, "slot_n": cnt}
                if kind == "tools":
                    row[f"{name}/{thr:.2f}"]["tool"] = score_turn(tok.decode(c.tokens, skip_special_tokens=False),
                                                                  turns[i])
        rows.append(row)
    report = {"model": Path(model_dir).name, "compare": Path(compare).name if compare else None,
              "block_size": block_size, "max_new_tokens": max_new, "threads": torch.get_num_threads(),
              "device": str(model.device), "break_even": break_even(model, block_size)}
    for kind in ("plain", "tools"):
        sub = [r for r in rows if r["kind"] == kind]
        if sub:
            report[kind] = summarise(sub, block_size, thresholds, compare_thresholds or thresholds if compare else None)
    report["rows"] = rows
    return report


def summarise(rows: list[dict], B: int, thresholds: list[float], compare_thresholds: list[float] | None) -> dict:
    """Headline numbers of one prompt set (see the module docstring)."""
    ref_tok = sum(r["ref_len"] for r in rows)
    ref_s = sum(r["ref_s"] for r in rows)
    out = {"prompts": len(rows), "reference_tokens_per_s": ref_tok / ref_s if ref_s else 0.0}
    v = [r["verify"] for r in rows]
    acc = [a for x in v for a, k in zip(x["accepted"], x["drafted"]) if k == B - 1]
    reach = [sum(1 for a in acc if a >= j) / max(len(acc), 1) for j in range(1, B)]
    n_tok = sum(x["n"] for x in v)
    wall = sum(x["wall_s"] for x in v)
    out["verify"] = {"tokens_per_target_forward": n_tok / max(sum(x["target_forwards"] for x in v), 1),
                     "exact": sum(x["exact"] for x in v) / len(v), "agree": statistics.mean(x["agree"] for x in v),
                     "mean_accepted_per_round": statistics.mean(acc) if acc else 0.0,
                     "accepted_through_slot": [round(p, 4) for p in reach],
                     "tokens_per_s": n_tok / wall if wall else 0.0,
                     "speed_vs_generate": (n_tok / wall) / (ref_tok / ref_s) if wall and ref_s else 0.0}
    if "tool" in v[0]:
        out["verify"]["tool_exact"] = sum(x["tool"]["exact_match"] for x in v) / len(v)
        out["verify"]["tool_name"] = sum(x["tool"]["name_correct"] for x in v) / len(v)
        out["reference_tool_exact"] = sum(r["ref_tool"]["exact_match"] for r in rows) / len(rows)
    for name, thrs in (("commit", thresholds), ("compare", compare_thresholds or [])):
        for thr in thrs:
            key = f"{name}/{thr:.2f}"
            c = [r[key] for r in rows]
            n_tok, wall = sum(x["n"] for x in c), sum(x["wall_s"] for x in c)
            err = [sum(x["slot_err"][s] for x in c) for s in range(B)]
            cnt = [sum(x["slot_n"][s] for x in c) for s in range(B)]
            out[key] = {"tokens_per_step": n_tok / max(sum(x["steps"] for x in c), 1),
                        "agree": statistics.mean(x["agree"] for x in c), "exact": sum(x["exact"] for x in c) / len(c),
                        "forced_share": sum(x["n_forced"] for x in c) / max(n_tok, 1),
                        "error_by_slot": [round(e / n, 4) if n else None for e, n in zip(err, cnt)],
                        "tokens_per_s": n_tok / wall if wall else 0.0,
                        "speed_vs_generate": (n_tok / wall) / (ref_tok / ref_s) if wall and ref_s else 0.0}
            if "tool" in c[0]:
                out[key]["tool_exact"] = sum(x["tool"]["exact_match"] for x in c) / len(c)
                out[key]["tool_name"] = sum(x["tool"]["name_correct"] for x in c) / len(c)
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def format_table(report: dict) -> str:
    """The report as a plain-text table."""
    lines = [f"{report['model']} block {report['block_size']}, <= {report['max_new_tokens']} new tokens, "
             f"{report['threads']} thread(s)"]
    be = report["break_even"]
    lines.append(f"break-even here: verify needs {be['break_even_tokens_per_forward']:.2f} tokens per target forward "
                 f"(AR step {be['ar_step_s'] * 1e3:.0f} ms, verify forward {be['verify_forward_s'] * 1e3:.0f} ms, "
                 f"draft {be['draft_forward_s'] * 1e3:.0f} ms, {be['prefix']}-token prefix)")
    for kind in ("plain", "tools"):
        s = report.get(kind)
        if not s:
            continue
        ref_tool = f"; the base's own tool calls exact: {s['reference_tool_exact']:.1%}" if "reference_tool_exact" in s else ""
        lines.append(f"\n{kind}: {s['prompts']} prompts; base generate {s['reference_tokens_per_s']:.1f} tok/s{ref_tool}")
        lines.append(f"{'setting':<16}{'tok/fwd':>9}{'agree':>8}{'exact':>8}{'tok/s':>8}{'vs gen':>8}{'tool exact':>12}")
        v = s["verify"]
        lines.append(f"{'verify':<16}{v['tokens_per_target_forward']:>9.2f}{v['agree']:>8.1%}{v['exact']:>8.1%}"
                     f"{v['tokens_per_s']:>8.1f}{v['speed_vs_generate']:>7.2f}x{_pct(v.get('tool_exact')):>12}")
        for key, c in s.items():
            if "/" in key:
                lines.append(f"{key:<16}{c['tokens_per_step']:>9.2f}{c['agree']:>8.1%}{c['exact']:>8.1%}"
                             f"{c['tokens_per_s']:>8.1f}{c['speed_vs_generate']:>7.2f}x{_pct(c.get('tool_exact')):>12}")
        lines.append(f"verify: draft survives through slot 1..: {v['accepted_through_slot']}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m clover_engine.eval", description="Evaluate a block drafter over its base: "
                                "verify and commit against the base's greedy answers.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", required=True, help="drafter directory (model_type block-drafter)")
    p.add_argument("--prompts", type=int, default=60, help="plain questions (of the 60 fixed ones)")
    p.add_argument("--open-tasks", type=int, default=20, help="open-vocabulary tool-call turns (0: none)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="token budget per answer")
    p.add_argument("--block-size", type=int, default=8, help="block size of both modes")
    p.add_argument("--thresholds", default="0.80,0.90,0.95,0.99", help="commit-mode thresholds")
    p.add_argument("--compare", default=None, help="another model directory decoded at the same block size")
    p.add_argument("--compare-thresholds", default="0.95", help="its thresholds")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--device", default="cpu", help="cpu or cuda (fp32 either way: agreement is measured exactly)")
    p.add_argument("--out", type=Path, default=None, help="report JSON (default MODEL/eval.json)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        thresholds = [float(t) for t in args.thresholds.split(",") if t.strip()]
        report = evaluate(args.model, args.prompts, args.max_new_tokens, args.block_size, thresholds,
                          args.open_tasks, args.compare,
                          [float(t) for t in args.compare_thresholds.split(",") if t.strip()], device=args.device)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = args.out or Path(args.model) / "eval.json"
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(format_table(report))
    print(f"report written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
