"""Evaluate a block-diffusion model adapted from a pretrained chat base against the base's own greedy answers.

    python -m clover_engine.eval --model models/smollm2-bd [--prompts 60] [--max-new-tokens 48] \\
        [--settings 1,8/0.90,8/0.95,8/0.99,32/0.90,32/0.95,32/0.99] [--compare-base] [--workers 2]

(``clover_engine.eval`` hands a directory with ``model_type: hf-block-diffusion`` to this module.)

On the fixed prompts of `clover_engine.data.chat_prompts.eval_prompts` (hand-written
plain questions and instructions, disjoint from the training prompts), in
ChatML with the base's default system turn:

* **reference**: the base model's own ``generate`` (greedy, KV cache), up to
  ``--max-new-tokens``, timed (tokens/s of the base's generate on this machine);
* per setting ``block_size/threshold`` (LowConfidence), the adapted model's
  block decode of the same prompt, same token budget:
  - **token agreement**: share of reference positions where the decoded token
    equals the reference token (position-wise; a shorter or longer answer
    counts its missing / extra positions as disagreements), and **exact**: the
    whole answer equal;
  - **tokens per forward**, forced-fill share, tokens/s and its ratio to the
    base's generate (same prompts, same process, same thread count);
  - **error by slot index**: among blocks decoded while everything before them
    still equalled the reference, the share of slots whose token differs from
    the reference, by slot index in the block (the late-slot effect).
* ``--speed-prompts N``: back to back in one worker on the first N prompts, the
  base's own ``generate`` and block decoding at each ``--speed-block-sizes``
  (tokens/s, tokens per forward), beside the break-even measured on this machine
  (`clover_engine.cost.break_even`: the tokens per forward block decoding needs there to
  match autoregressive decoding);
* ``--compare-base``: the same settings for the unadapted base decoded
  block-wise (MASK id 16 with its own embedding), the "before" column.

Results go to ``MODEL/eval.json`` (or ``--out``) and a table on stdout.

Wing: ``eval``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import torch

from clover_engine.eval.summary import slot_errors_vs_reference, summarise_open
from clover_engine.backbones.causal_lm.adapter import chat_prompt, load_adapter_model, load_adapter_tokenizer
from clover_engine.cost.break_even import measure_break_even
from clover_engine.data.chat_prompts import eval_prompts
from clover_engine.data.open_tools import eval_turns, score_turn
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig

DEFAULT_SETTINGS = "1,8/0.90,8/0.95,8/0.99,32/0.90,32/0.95,32/0.99"

_W: dict = {}


BASE_GENERATE = "base"  # --open-settings entry: the unadapted base's greedy generate on the open turns


def parse_settings(spec: str) -> list[tuple[int, float]]:
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        b, _, t = part.partition("/")
        out.append((int(b), float(t or 0.95)))
    if not out:
        raise ValueError(f"--settings {spec!r}: give e.g. 1,8/0.95,32/0.95")
    return out


def parse_open_settings(spec: str) -> list[tuple[str, int, float]]:
    """``--open-settings`` -> ``(kind, block_size, threshold)`` jobs: `BASE_GENERATE` is the
    unadapted base's greedy generate (``("base-generate", 0, 0.0)``, first), every other entry
    a block setting of the adapted model as in `parse_settings`.

    Raises:
        ValueError: for an entry that is neither.
    """
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    jobs = [("base-generate", 0, 0.0)] if BASE_GENERATE in parts else []
    rest = ",".join(p for p in parts if p != BASE_GENERATE)
    return jobs + [("adapted", B, t) for B, t in (parse_settings(rest) if rest else [])]


def _load(kind: str, model_dir: str):
    return load_adapter_model(model_dir, adapter=kind == "adapted")


def _init(model_dir: str, threads: int, kinds: tuple[str, ...], device: str = "cpu") -> None:
    torch.set_num_threads(threads)

    _W["tok"] = load_adapter_tokenizer(model_dir)
    _W["models"] = {k: _load(k, model_dir).to(device) for k in kinds}


def _ref_job(args: tuple[int, list[int], int]) -> dict:
    i, ids, max_new = args
    m = _W["models"]["base"]
    t0 = time.perf_counter()
    toks = m.greedy_generate(ids, max_new)
    return {"i": i, "tokens": toks, "wall_s": time.perf_counter() - t0}


def _decode_job(args: tuple[str, int, list[int], int, float, int, list[int]]) -> dict:
    kind, i, ids, B, thr, max_new, ref = args
    m = _W["models"][kind]
    dc = DecodeConfig(block_size=B, threshold=thr, max_new_tokens=max_new)
    r = BlockDecoder(m, None, dc).generate(ids, record_trace=False)
    gen = r.tokens
    n = max(len(ref), 1)
    agree = sum(1 for a, b in zip(gen, ref) if a == b) / max(len(ref), len(gen), 1)
    # error by slot: blocks that start while the decode still equals the reference
    slot_err, slot_n = slot_errors_vs_reference(len(ids), B, gen, ref, m.config.eos_token_id,
                                                r.stop_reason == "eos", max_new)
    return {"kind": kind, "i": i, "B": B, "thr": thr, "tokens": gen, "nfe": r.nfe, "n_forced": r.n_forced,
            "wall_s": r.wall_s, "agree": agree, "exact": gen == ref, "slot_err": slot_err, "slot_n": slot_n,
            "ref_len": n}


def _speed_job(args: tuple[int, list[int], int, list[int], float]) -> dict:
    """Back to back in one worker: the base's generate, then the adapted model at each block size (tokens/s)."""

    i, ids, max_new, sizes, thr = args
    base, m = _W["models"]["base"], _W["models"]["adapted"]
    t0 = time.perf_counter()
    ref = base.greedy_generate(ids, max_new)
    out = {"i": i, "generate": (len(ref), time.perf_counter() - t0)}
    for B in sizes:
        r = BlockDecoder(m, None, DecodeConfig(block_size=B, threshold=thr, max_new_tokens=max_new)).generate(
            ids, record_trace=False)
        out[B] = (len(r.tokens), r.wall_s, r.nfe)
    return out


def _break_even_job(args: tuple[list[int], int]) -> dict:
    """The measured break-even of the adapted model at each block size (`clover_engine.cost.break_even`)."""

    sizes, prefix = args
    pts = measure_break_even(_W["models"]["adapted"], sizes, prefix_len=prefix, repeats=5)
    return {B: {**dataclasses.asdict(p), "tokens_per_forward": p.tokens_per_forward} for B, p in pts.items()}


def _read_ref_cache(path: Path | None, ids: list[list[int]], max_new: int) -> list[dict | None]:
    """Cached reference answers per prompt (None where missing or made for other ids / token budget)."""
    out: list[dict | None] = [None] * len(ids)
    if path is None or not Path(path).is_file():
        return out
    data = json.loads(Path(path).read_text())
    cached_max = data.get("max_new_tokens") or 0
    if cached_max < max_new:
        return out
    by_prompt = {tuple(e["prompt_ids"]): e for e in data.get("entries", [])}
    for k, x in enumerate(ids):
        e = by_prompt.get(tuple(x))
        if e is not None:  # greedy answers are prefix-consistent: a longer cached answer is cut to max_new
            toks = e["tokens"][:max_new]
            out[k] = {"tokens": toks, "wall_s": e["wall_s"] * len(toks) / max(len(e["tokens"]), 1)}
    return out


def _write_ref_cache(path: Path, ids: list[list[int]], refs: list, walls: list[float], max_new: int) -> None:
    entries = [{"prompt_ids": x, "tokens": r, "wall_s": w} for x, r, w in zip(ids, refs, walls) if r is not None]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps({"max_new_tokens": max_new, "entries": entries}) + "\n")
    os.replace(tmp, path)


def summarise(rows: list[dict], ref_tok_s: float) -> dict:
    tokens = sum(len(r["tokens"]) for r in rows)
    nfe = sum(r["nfe"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    B = rows[0]["B"]
    se = [sum(r["slot_err"][s] for r in rows) for s in range(B)]
    sn = [sum(r["slot_n"][s] for r in rows) for s in range(B)]
    tok_s = tokens / wall if wall else 0.0
    return {
        "n": len(rows), "token_agreement": sum(r["agree"] for r in rows) / len(rows),
        "exact": sum(r["exact"] for r in rows) / len(rows), "tokens_per_forward": tokens / max(nfe, 1),
        "forced_share": sum(r["n_forced"] for r in rows) / max(tokens, 1),
        "forced_per_forward": sum(r["n_forced"] for r in rows) / max(nfe, 1), "tokens_per_s": tok_s,
        "speed_vs_generate": tok_s / ref_tok_s if ref_tok_s else None,
        "error_by_slot": [round(e / n, 4) if n else None for e, n in zip(se, sn)], "slots_counted": sn,
    }


def format_table(report: dict) -> str:
    lines = [f"model {report['model']} vs its base's greedy generate ({report['n_prompts']} prompts, "
             f"<= {report['max_new_tokens']} new tokens, {report['threads']} thread(s)/worker); "
             f"base generate: {report['reference']['tokens_per_s']:.2f} tokens/s"]
    hdr = (f"{'model':<10}{'block':>6}{'thresh':>8}{'agree':>8}{'exact':>8}{'tok/fwd':>9}{'forced/fwd':>11}"
           f"{'tok/s':>8}{'vs ref*':>8}")
    lines += [hdr, "-" * len(hdr)]
    for kind in ("adapted", "base"):
        for key, s in report.get(kind, {}).items():
            b, t = key.split("/")
            lines.append(f"{kind:<10}{b:>6}{t:>8}{s['token_agreement']:>8.3f}{s['exact']:>8.3f}"
                         f"{s['tokens_per_forward']:>9.2f}"
                         f"{s.get('forced_per_forward', s['forced_share'] * s['tokens_per_forward']):>11.2f}"
                         f"{s['tokens_per_s']:>8.2f}"
                         f"{(s['speed_vs_generate'] or 0):>7.2f}x")
    lines.append("* tokens/s over the base generate's tokens/s of the reference pass"
                 + (" (cached: timed in another run, under other load -- compare with the speed section)"
                    if report["reference"].get("cache") else " (same run)"))
    sp = report.get("speed")
    if sp:
        lines.append("")
        lines.append(f"speed, back to back on the first {sp['prompts']} prompts (threshold {sp['threshold']}): "
                     f"base generate {sp['generate_tokens_per_s']:.2f} tokens/s")
        for B, v in sp["by_block_size"].items():
            be = v.get("break_even")
            need = f" (break-even here {be['tokens_per_forward']:.2f}, measured)" if be else ""
            lines.append(f"  block {B:>3}: {v['tokens_per_s']:.2f} tokens/s, {v['tokens_per_forward']:.2f} tokens/forward"
                         f"{need}, {v['speed_vs_generate']:.2f}x generate")
    lines.append("")
    lines.append("error by slot index (blocks started on the reference path; adapted model):")
    for key, s in report.get("adapted", {}).items():
        if key.startswith("1/"):
            continue
        errs = s["error_by_slot"]
        B = len(errs)
        groups = [(a, min(a + max(B // 8, 1), B)) for a in range(0, B, max(B // 8, 1))]
        parts = []
        for a, e in groups:
            n = sum(s["slots_counted"][a:e])
            err = sum((errs[k] or 0) * s["slots_counted"][k] for k in range(a, e)) / n if n else float("nan")
            parts.append(f"{a}-{e - 1}:{err:.2f}")
        lines.append(f"  {key:<10} " + " ".join(parts))
    op = report.get("open_tools")
    if op:
        lines.append(f"open-vocabulary tool calls ({op['n_tasks']} turns, unseen tools): exact / tool name")
        for key, s in op["by_setting"].items():
            groups = " ".join(f"{g} {v['exact_match']:.2f}/{v['name_correct']:.2f}" for g, v in s["by_group"].items())
            lines.append(f"  {key:<10} {s['exact_match']:.3f} / {s['name_correct']:.3f}   {groups}")
    return "\n".join(lines)


def _open_job(args: tuple[str, int, float, list[int], int, int]) -> list[dict]:
    """Open-vocabulary tool-call turns (`clover_engine.data.open_tools.eval_turns`: tool names and keys
    never in training) decoded by the adapted model at one setting, scored by ``score_turn``."""

    kind, B, thr, idx, n_tasks, max_new = args
    tok = _W["tok"]
    turns = eval_turns(n_tasks)
    if kind == "base-generate":  # B == 0: the unadapted base's own greedy generate, the reference
        m, dec, setting = _W["models"]["base"], None, BASE_GENERATE
    else:
        m, setting = _W["models"][kind], f"{B}/{thr:.2f}"
        dec = BlockDecoder(m, None, DecodeConfig(block_size=B, threshold=thr, max_new_tokens=max_new))
    out = []
    for i in idx:
        ids = tok.encode(turns[i].prompt).ids  # the turn's own ChatML (system turn with the tools), as is
        if dec is None:
            t0 = time.perf_counter()
            gen = m.greedy_generate(ids, max_new)
            r = SimpleNamespace(tokens=gen, nfe=len(gen), n_forced=0, wall_s=time.perf_counter() - t0)
        else:
            r = dec.generate(ids, record_trace=False)
        text = tok.decode(r.tokens, skip_special_tokens=False)
        sc = score_turn(text, turns[i])
        out.append(dict(setting=setting, task=i, text=text, nfe=r.nfe, n_tokens=len(r.tokens),
                        n_forced=r.n_forced, wall_s=r.wall_s, exact_match=bool(sc["exact_match"]),
                        json_valid=bool(sc["json_valid"]), name_correct=bool(sc["name_correct"]),
                        fields=sc["fields"], category=turns[i].category, natural=turns[i].natural))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clover_engine.eval", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="adapter directory of a transformers chat model, e.g. "
                                                   "models/smollm2-bd")
    ap.add_argument("--prompts", type=int, default=60, help="first N of the fixed eval prompts")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="tokens decoded per prompt (default %(default)s)")
    ap.add_argument("--settings", default=DEFAULT_SETTINGS, help="block/threshold list; '1' = block_size 1")
    ap.add_argument("--compare-base", action="store_true", help="also decode the unadapted base block-wise")
    ap.add_argument("--base-settings", default=None, help="settings for --compare-base (default: --settings)")
    ap.add_argument("--workers", type=int, default=1, help="decode processes (default %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (fp32 either way: agreement is measured exactly)")
    ap.add_argument("--out", type=Path, default=None, help="JSON output (default MODEL/eval.json)")
    ap.add_argument("--base-prompts", type=int, default=None, help="--compare-base on the first N prompts only")
    ap.add_argument("--ref-cache", type=Path, default=None,
                    help="JSON cache of the base's greedy answers and their timings (reused when prompts match)")
    ap.add_argument("--refs-only", action="store_true", help="compute (and cache) the references, then stop")
    ap.add_argument("--speed-prompts", type=int, default=0,
                    help="first N prompts: base generate and block decoding timed back to back (tokens/s ratio)")
    ap.add_argument("--speed-block-sizes", default="4,8,16,32",
                    help="comma list of block sizes timed by --speed-prompts (default %(default)s)")
    ap.add_argument("--speed-threshold", type=float, default=0.95,
                    help="confidence threshold (0-1) of the --speed-prompts decodes (default %(default)s)")
    ap.add_argument("--open-tasks", type=int, default=0,
                    help="open-vocabulary tool-call turns (clover_engine.data.open_tools: unseen tools; 0 = skip)")
    ap.add_argument("--open-settings", default="1,32/0.95",
                    help=f"settings for --open-tasks; '{BASE_GENERATE}' adds the unadapted base's own greedy "
                         "generate (the reference: what adaptation started from)")
    ap.add_argument("--open-max-new-tokens", type=int, default=96,
                    help="tokens decoded per --open-tasks turn (default %(default)s)")
    args = ap.parse_args(argv)
    from tqdm import tqdm

    settings = parse_settings(args.settings)
    base_settings = parse_settings(args.base_settings) if args.base_settings else settings
    prompts = eval_prompts()[: args.prompts]
    kinds = ("adapted", "base")
    _init(args.model, args.threads, ())  # tokenizer only, in this process
    tok = _W["tok"]
    ids = [tok.encode(chat_prompt(p)).ids for p in prompts]
    ctx = None
    mp_ctx = None
    if args.device != "cpu":
        import multiprocessing

        mp_ctx = multiprocessing.get_context("spawn")  # CUDA cannot be re-initialised in a forked worker
    pool = ProcessPoolExecutor(args.workers, initializer=_init, initargs=(args.model, args.threads, kinds, args.device),
                               mp_context=mp_ctx)
    with pool:
        cache = _read_ref_cache(args.ref_cache, ids, args.max_new_tokens)
        refs, ref_walls = [c["tokens"] if c else None for c in cache], [c["wall_s"] if c else 0.0 for c in cache]
        todo = [(i, x, args.max_new_tokens) for i, x in enumerate(ids) if refs[i] is None]
        # never overwrite a cache of longer answers with shorter ones
        todo_from_longer = bool(args.ref_cache and Path(args.ref_cache).is_file() and json.loads(
            Path(args.ref_cache).read_text()).get("max_new_tokens", 0) > args.max_new_tokens)
        for r in tqdm(pool.map(_ref_job, todo), total=len(todo), desc="reference (base generate)"):
            refs[r["i"]], ref_walls[r["i"]] = r["tokens"], r["wall_s"]
            if args.ref_cache and not todo_from_longer:
                _write_ref_cache(args.ref_cache, ids, refs, ref_walls, args.max_new_tokens)
        ref_wall = sum(ref_walls)
        ref_tok_s = sum(len(r) for r in refs) / ref_wall if ref_wall else 0.0
        if args.refs_only:
            print(f"references: {len(refs)} prompts, base generate {ref_tok_s:.2f} tokens/s")
            return 0
        jobs = [("adapted", i, x, B, t, args.max_new_tokens, refs[i]) for (B, t) in settings
                for i, x in enumerate(ids)]
        if args.compare_base:
            nb = len(ids) if args.base_prompts is None else args.base_prompts
            jobs += [("base", i, x, B, t, args.max_new_tokens, refs[i]) for (B, t) in base_settings
                     for i, x in enumerate(ids[:nb])]
        rows = list(tqdm(pool.map(_decode_job, jobs), total=len(jobs), desc="block decoding"))
        open_report = None
        if args.open_tasks:
            oj = [(kind, B, t, list(range(i, min(i + 5, args.open_tasks))), args.open_tasks, args.open_max_new_tokens)
                  for (kind, B, t) in parse_open_settings(args.open_settings) for i in range(0, args.open_tasks, 5)]
            orows: dict[str, list] = {}
            for res in tqdm(pool.map(_open_job, oj), total=len(oj), desc="open-vocabulary tool calls"):
                for r in res:
                    orows.setdefault(r["setting"], []).append(r)
            open_report = {"n_tasks": args.open_tasks, "max_new_tokens": args.open_max_new_tokens,
                           "by_setting": {k: summarise_open(v) for k, v in orows.items()},
                           "examples": {k: [{"task": r["task"], "text": r["text"], "exact_match": r["exact_match"]}
                                            for r in sorted(v, key=lambda r: r["task"])[:5]]
                                        for k, v in orows.items()}}
        speed = None
        if args.speed_prompts:
            sizes = [int(b) for b in args.speed_block_sizes.split(",")]
            sj = [(i, ids[i], args.max_new_tokens, sizes, args.speed_threshold) for i in range(args.speed_prompts)]
            srows = list(tqdm(pool.map(_speed_job, sj), total=len(sj), desc="speed (back to back)"))
            g_tok = sum(r["generate"][0] for r in srows)
            g_s = sum(r["generate"][1] for r in srows)
            speed = {"prompts": args.speed_prompts, "threshold": args.speed_threshold,
                     "generate_tokens_per_s": g_tok / g_s if g_s else None, "by_block_size": {}}
            prefix = len(ids[0]) + args.max_new_tokens // 2  # a typical history in these decodes
            be = pool.submit(_break_even_job, (sizes, prefix)).result()
            for B in sizes:
                tok_n, wall, nfe = (sum(r[B][k] for r in srows) for k in range(3))
                tps = tok_n / wall if wall else 0.0
                speed["by_block_size"][str(B)] = {
                    "tokens_per_s": tps, "tokens_per_forward": tok_n / max(nfe, 1),
                    "speed_vs_generate": tps / (g_tok / g_s) if g_s and g_tok else None,
                    "break_even": be[B]}
    report = {"model": args.model, "n_prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "threads": args.threads, "workers": args.workers, "device": args.device,
              "reference": {"tokens_per_s": ref_tok_s, "mean_len": sum(map(len, refs)) / len(refs)}}
    for kind in kinds:
        by = {}
        for r in rows:
            if r["kind"] == kind:
                by.setdefault(f"{r['B']}/{r['thr']:.2f}", []).append(r)
        if by:
            report[kind] = {k: summarise(v, ref_tok_s) for k, v in by.items()}
    report["speed"] = speed
    if open_report is not None:
        report["open_tools"] = open_report
    report["answers"] = {"prompts": prompts, "reference": [tok.decode(r) for r in refs],
                         "reference_ids": refs}
    if args.ref_cache:
        report["reference"]["cache"] = str(args.ref_cache)
    out = args.out or Path(args.model) / "eval.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(format_table(report))
    print(f"written {out}")
    del ctx
    return 0


if __name__ == "__main__":
    sys.exit(main())
