"""Evaluate a Clover checkpoint: held-out agent tool calls and held-out stdlib code.

    .venv/bin/python -m clover_engine.eval --model models/clover-tiny [--tasks 300] [--workers 2] [--threads N] \
        [--out eval.json] [--sweep-out runs/eval-sweep | --from-sweep runs/eval-sweep]

``--threads`` is per worker process (default: ``OMP_NUM_THREADS`` if set, else
`clover_engine.threads.default_threads` divided among the workers, at least 1).

Agent tasks (`clover_engine.data.agent.eval_tasks`, seeds >= 10,000,000, disjoint from
training): each prompt is decoded in four settings -- block_size 32 /
threshold 0.95 and block_size 1 (autoregressive greedy), each in the `state`
and `state+window` memory modes -- and scored by exact comparison with the
ground-truth call: exact match, JSON validity, tool-name accuracy, per-field
value accuracy (by kind and by source: copied from the request vs from an
earlier tool response), tokens per forward, NFE, forced-fill rate, wall time
and tokens/s. All settings run in the same process pool on the same prompts,
so the tokens/s ratio block-diffusion / block_size 1 is measured side by side.

Where written tokens go wrong (`summarise_writes`, per setting, for the agent tasks and the
open-vocabulary turns): every write of every decode is kept with its confidence, slot and
iteration; a written token is wrong when it is off its answer's alignment with the ground truth.
Reported: the wrong share among tokens accepted at >= the threshold (calibration) and by
confidence bin, the error of the answer tokens by slot index (absolute position mod 32, so the
block_size-1 control is counted on the same slots), and the error by distance from the last clean
token (`clover_engine.experiments.clean_distance`). Rows read from a sweep (below) carry no writes.
The recording hook runs inside the decode, and its host work (~0.25-0.5 ms per forward on a
2-core CPU) would weigh more on block_size 1, which makes more forwards per token; the tokens/s
reported leave it out (`clover_engine.decoding.decoder.DecodeResult.observer_s` is subtracted). The forward's own
observed quantities (memory share, state norm per layer) stay in, and rows read from a sweep
(``--from-sweep``) carry the sweep's wall times, observers included.

Open-vocabulary tool calls (`clover_engine.data.open_tools.eval_turns`, ``--open-tasks``): tool
names, argument keys and enum values from a vocabulary disjoint from training, requests in
English clauses or ``key: value``, chains that copy from a tool response, and turns that need
no tool -- exact match and tool-name accuracy per category and phrasing, in the same settings.

Agent tasks through `clover_engine.sweep` (the settings above are a sweep grid: block size x threshold x
memory mode on the task set ``agent-eval:N``): ``--sweep-out DIR`` runs them as a sweep into DIR
(``results.parquet``, resumable, the sweep's process pool) and scores the sweep's rows;
``--from-sweep DIR`` decodes no agent task and reads an existing sweep's ``results.parquet``
(pandas), taking for each setting the rows of this model whose full `DecodeConfig` is the
setting's. Either way the agent rows are re-scored from their text (`score_call`, for the
per-field kinds and sources the sweep table does not keep), so the report is the one the
built-in loop writes, save the timings. Open-vocabulary turns, code and the probe run as usual.

Value-copy probe (`clover_engine.training.probes.value_probe`): the true call in place with its values masked, one
forward -- copying measured apart from the call's structure. Run twice: in blocks of 32
(every value slot masked at once: one-shot recall, what a block-diffusion forward faces
first) and in blocks of 1 (teacher-forced: each value token with every earlier token
clean, what autoregressive decoding faces when it has been right so far; it needs the
induction / previous-token match that copying a multi-token value rests on).

Unseen-tool name/key probe (`clover_engine.training.probes.open_name_probe`, on the first
min(``--probe-tasks``, ``--open-tasks``) open turns): the true open-vocabulary call in place with its tool name and argument keys
masked, teacher-forced -- the name's first token (picking the tool) apart from its later tokens
and the keys (copying them from the schema).

Stdlib (held-out split by file): after a real 256-token prefix, (a) token
accuracy of the first decoded block (32 / 0.95) against the file's next 32
tokens, (b) with the block fully masked, one forward: argmax accuracy by slot
index 0..31 (the data behind the late-slot experiment).

Wing: ``eval``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from tqdm import tqdm

from clover_engine.backbones.base import capabilities_of
from clover_engine.backbones.registry import model_type_of
from clover_engine.eval import drafter as eval_drafter
from clover_engine.eval.summary import summarise_agent, summarise_code, summarise_open  # re-exported (tests, notebooks)
from clover_engine.training.probes import open_name_probe, value_probe
from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.checkpoint import DEFAULT_MODEL_DIR, file_as_model_dir, find_model_dir, load_model, load_tokenizer
from clover_engine.data.agent import eval_tasks, score_call
from clover_engine.data.open_tools import eval_turns, score_turn
from clover_engine.data.packages import package_files
from clover_engine.data.stdlib import stdlib_files
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.experiments.errors import calibration, distance_errors, grouped_rate, slot_errors
from clover_engine.experiments.sweep.runner import run_sweep
from clover_engine.experiments.tasks import KIND_ACCEPTED, decode_task
from clover_engine.threads import add_threads_argument, configure_threads, default_threads
from clover_engine.backbones.causal_lm.adapter import read_adapter_config
from clover_engine.eval.chat import main as hf_main

SETTINGS = {
    "bd32-window": dict(block_size=32, threshold=0.95, memory_mode="state+window"),
    "ar1-window": dict(block_size=1, threshold=0.95, memory_mode="state+window"),
    "bd32-state": dict(block_size=32, threshold=0.95, memory_mode="state"),
    "ar1-state": dict(block_size=1, threshold=0.95, memory_mode="state"),
}

_W: dict = {}


def _init(model_dir: str, threads: int) -> None:
    torch.set_num_threads(threads)
    _W["model"] = load_model(model_dir)
    _W["tok"] = load_tokenizer(model_dir)


def _decode_and_score(setting: str, idx: list[int], turns: list, max_new: int, score, extra=None) -> list[dict]:
    """Decode ``turns[i].prompt`` for i in `idx` in `setting` (worker process) and score each
    text with ``score(text, turn)``; one row per task (``extra(turn)`` adds fields). Every
    write is kept (`clover_engine.experiments.decode_task`): the row's ``run`` is its `TaskRun`, for
    `summarise_writes`."""

    if not capabilities_of(_W["model"]).runs(SETTINGS[setting]["memory_mode"]):  # state+window without a window
        return []
    cfg = DecodeConfig(max_new_tokens=max_new, **SETTINGS[setting])
    out = []
    for i in idx:
        r = decode_task(_W["model"], _W["tok"], turns[i], cfg, setting=setting, index=i, score=score)
        out.append(dict(setting=setting, task=i, text=r.text, nfe=r.nfe, n_tokens=len(r.tokens),
                        n_forced=r.n_forced, wall_s=r.wall_s, exact_match=r.exact_match,
                        json_valid=r.json_valid, name_correct=r.name_correct,
                        fields=r.fields, run=r, **(extra(turns[i]) if extra else {})))
    return out


def summarise_writes(rows: list[dict], threshold: float = 0.95, block_size: int = 32) -> dict:
    """Where the written tokens go wrong, from the rows' `TaskRun`s (rows without one, e.g. read
    from a sweep, are left out; {} when none has one).

    A written token is wrong when it is not part of its answer's alignment with the ground truth
    (`clover_engine.experiments.TaskRun.write_correct`). Returns:

    * ``wrong_share_accepted``: wrong share among the tokens accepted at >= `threshold` (the
      calibration target), ``n_accepted``;
    * ``calibration``: `clover_engine.experiments.calibration` by confidence bin (0.5 / 0.8 / 0.9 / 0.95 /
      0.99): ``lo``, ``n``, ``wrong_share``;
    * ``error_by_slot``: `clover_engine.experiments.slot_errors` of the answer tokens by slot index (absolute
      position mod `block_size`, whatever the setting's own block size: a block_size-1 control is
      counted on the same slots), pooled in groups of 4 slots (0-3, ..., 28-31);
    * ``error_by_distance``: `clover_engine.experiments.distance_errors` by distance from the last clean
      token (1, 2, 3-4, 5-8, 9-16, 17+).
    """

    runs = [r["run"] for r in rows if r.get("run") is not None]
    if not runs:
        return {}
    acc = [(r.write_kind == KIND_ACCEPTED) & (r.write_conf >= threshold) for r in runs]
    wrong = sum(int((~r.write_correct[a]).sum()) for r, a in zip(runs, acc))
    n_acc = sum(int(a.sum()) for a in acc)
    cal = calibration(runs, (0.0, 0.5, 0.8, 0.9, threshold, 0.99, 1.0))
    se = slot_errors(runs, block_size)
    de = distance_errors(runs)
    r4 = lambda xs: [None if x != x else round(float(x), 4) for x in xs]  # noqa: E731  NaN -> None (JSON)
    return {"n_accepted": n_acc, "wrong_share_accepted": round(wrong / n_acc, 4) if n_acc else None,
            "calibration": {"lo": r4(cal["lo"]), "n": cal["n"].tolist(), "wrong_share": r4(cal["wrong_share"])},
            "error_by_slot": {"group": 4, "rate": r4(grouped_rate(se["errors"], se["n"], 4)),
                              "n": se["n"].reshape(-1, 4).sum(1).tolist()},
            "error_by_distance": {"lo": de["lo"].tolist(), "n": de["n"].tolist(), "wrong_share": r4(de["wrong_share"])}}


def _agent_job(args: tuple[str, list[int], int, int]) -> list[dict]:
    """Fixed-tool agent tasks (`clover_engine.data.agent.eval_tasks`), scored by `score_call`."""

    setting, idx, n_tasks, max_new = args
    return _decode_and_score(setting, idx, eval_tasks(n=n_tasks), max_new, score_call)


def sweep_values(setting: str, max_new: int) -> dict:
    """The `clover_engine.sweep` grid values of an eval setting: ``{block_size, threshold, memory_mode,
    max_new_tokens}`` (every other `DecodeConfig` field at its default, as `_decode_and_score`)."""
    return {**SETTINGS[setting], "max_new_tokens": max_new}


def _same_model(spec: str, model: str) -> bool:
    if spec == model:
        return True
    return Path(spec).is_dir() and Path(model).is_dir() and Path(spec).resolve() == Path(model).resolve()


def agent_rows_from_sweep(results_path: str | Path, model: str, counts: dict[str, int], max_new: int) -> dict[str, list]:
    """Per-task agent rows of `summarise_agent` from a sweep's results table, no decoding.

    Args:
        results_path: a sweep's ``results.parquet`` (`clover_engine.sweep.RESULT_SCHEMA`), or its folder.
        model: the model spec or checkpoint directory (matched by resolved path).
        counts: ``{eval setting: tasks}`` -- tasks 0 .. n-1 of ``agent-eval`` (any ``agent-eval:M``
            task set with M >= n holds them: the held-out tasks are a fixed sequence).
        max_new: the ``max_new_tokens`` of the settings.

    Returns:
        ``{setting: rows}``, rows in task order, each re-scored from its text with `score_call`.

    Raises:
        FileNotFoundError: no results table there.
        ValueError: a setting's tasks missing from the table (the message names them and the sweep
            command that adds them).
    """
    import dataclasses

    import pandas as pd

    path = Path(results_path)
    path = path / "results.parquet" if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"no sweep results table at {path} (python -m clover_engine.sweep ... --out DIR writes one)")
    df = pd.read_parquet(path)
    df = df[df["task_set"].str.startswith("agent-eval:") & df["model"].map(lambda m: _same_model(m, model))]
    turns = eval_tasks(n=max(counts.values(), default=0))
    out: dict[str, list] = {}
    for setting, n in counts.items():
        cfg = json.dumps(dataclasses.asdict(DecodeConfig(**sweep_values(setting, max_new))), sort_keys=True)
        sel = df[(df["decode_config"] == cfg) & (df["task_id"] < n)].drop_duplicates("task_id").sort_values("task_id")
        missing = sorted(set(range(n)) - set(sel["task_id"].tolist()))
        if missing:
            v = sweep_values(setting, max_new)
            raise ValueError(
                f"{path}: setting {setting} ({v}) of model {model} lacks agent tasks {missing[:10]}"
                f"{' ...' if len(missing) > 10 else ''}; add them with: python -m clover_engine.sweep --models {model} "
                f"--tasks agent-eval:{n} --block-size {v['block_size']} --threshold {v['threshold']} "
                f"--memory-mode {v['memory_mode']} --max-new-tokens {max_new} --out {path.parent}")
        rows = []
        for r in sel.itertuples(index=False):
            sc = score_call(r.text, turns[r.task_id])
            rows.append({"setting": setting, "task": int(r.task_id), "text": r.text, "nfe": int(r.nfe),
                         "n_tokens": int(r.tokens), "n_forced": int(r.forced_fills), "wall_s": float(r.wall_s),
                         "exact_match": bool(sc["exact_match"]), "json_valid": bool(sc["json_valid"]),
                         "name_correct": bool(sc["name_correct"]), "fields": sc["fields"]})
        out[setting] = rows
    return out


def run_agent_sweep(out_dir: str | Path, model: str, counts: dict[str, int], max_new: int, workers: int,
                    threads: int | None) -> None:
    """Decode the agent settings as `clover_engine.sweep` sweeps into `out_dir` (resumed if there): one sweep per
    distinct task count, ``agent-eval:N`` with the settings that need N tasks, no traces."""

    by_n: dict[int, list[str]] = defaultdict(list)
    for setting, n in counts.items():
        by_n[n].append(setting)
    for n, names in sorted(by_n.items()):
        run_sweep([model], [f"agent-eval:{n}"], [sweep_values(s, max_new) for s in names], out_dir,
                  workers=workers, threads=threads, traces=False)


def _has_window(model_dir: str) -> bool:
    """Whether the checkpoint's config sets an attention window (True when it cannot be read)."""

    try:
        return bool(CloverConfig.from_json(Path(model_dir) / "config.json").attention_window)
    except (OSError, ValueError, TypeError, KeyError):
        return True


def _open_job(args: tuple[str, list[int], int, int]) -> list[dict]:
    """Open-vocabulary tool-call turns (`clover_engine.data.open_tools.eval_turns`): tools, names and
    keys the model never saw; scored by `clover_engine.data.open_tools.score_turn`."""

    setting, idx, n_tasks, max_new = args
    return _decode_and_score(setting, idx, eval_turns(n_tasks), max_new, score_turn,
                             lambda t: {"category": t.category, "natural": t.natural})


def _code_files(source: str) -> list:
    """Held-out code files: ``stdlib`` (`clover_engine.data.stdlib`, split by file) or ``packages``
    (`clover_engine.data.packages`, whole packages never trained on)."""
    if source == "stdlib":
        return stdlib_files("heldout")

    return package_files("heldout")


def _code_job(args: tuple[str, list[int], int, int]) -> list[dict]:
    """Held-out code after a real ``prefix``-token context (up to 3 windows per file): (a) the first
    block decoded at 32 / 0.95 against the file's next 32 tokens, (b) the block fully masked, one
    forward, argmax accuracy by slot index, and (c) with ``continue_tokens`` > 0, a continuation of
    that many tokens at 32 / 0.95 and at block_size 1, each timed (tokens per forward, forced
    fills, token accuracy against the file, tokens/s)."""

    source, file_idx, prefix, n_cont = args
    model, tok = _W["model"], _W["tok"]
    cfg = model.config
    files = _code_files(source)
    dec = BlockDecoder(model, tok, DecodeConfig(block_size=32, threshold=0.95, max_new_tokens=32))
    cont = {name: BlockDecoder(model, tok, DecodeConfig(block_size=bs, threshold=0.95, max_new_tokens=n_cont,
                                                         eos_bias_soft_limit=None))
            for name, bs in (("bd32", 32), ("ar1", 1))} if n_cont else {}
    out = []
    for fi in file_idx:
        ids = tok.encode(files[fi].read_text(encoding="utf-8")).ids
        for start in range(0, max(0, len(ids) - prefix - max(32, n_cont)), 2048)[:3]:
            ctx, truth = ids[start:start + prefix], ids[start + prefix:start + prefix + max(32, n_cont)]
            r = dec.generate(ctx, record_trace=False)
            gen = (r.tokens + [-1] * 32)[:32]
            state = model.setup_state(1, "state")
            with torch.no_grad():
                logits = model(torch.full((1, 32), cfg.mask_token_id), state,
                               commit_ids=torch.tensor([ctx]), block_size=32).logits[0]
            logits[:, cfg.mask_token_id] = float("-inf")
            pred = logits.argmax(-1).tolist()
            row = dict(decoded_correct=[int(a == b) for a, b in zip(gen, truth[:32])],
                       slot_correct=[int(a == b) for a, b in zip(pred, truth[:32])], nfe=r.nfe)
            for name, cdec in cont.items():
                rc = cdec.generate(ctx, record_trace=False)
                row[name] = dict(n_tokens=len(rc.tokens), nfe=rc.nfe, n_forced=rc.n_forced, wall_s=rc.wall_s,
                                 correct=sum(int(a == b) for a, b in zip(rc.tokens, truth)))
            out.append(row)
    return out


def _hf_model_dir(argv: list[str] | None) -> bool:
    """True when ``--model`` names a block-diffusion adapter over a pretrained base (`clover_engine.eval.chat`)."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    model = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--model"),
                 next((a.split("=", 1)[1] for a in args if a.startswith("--model=")), None))

    return model is not None and read_adapter_config(model) is not None


def _drafter_dir(argv: list[str] | None) -> bool:
    """True when ``--model`` names a block drafter over a frozen base (`clover_engine.eval.drafter`)."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    model = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--model"),
                 next((a.split("=", 1)[1] for a in args if a.startswith("--model=")), None))
    try:
        return model is not None and model_type_of(model) == "block-drafter"
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    if _drafter_dir(argv):
        import sys

        return eval_drafter.main(list(sys.argv[1:] if argv is None else argv))
    if _hf_model_dir(argv):
        import sys

        return hf_main(list(sys.argv[1:] if argv is None else argv))
    ap = argparse.ArgumentParser(prog="python -m clover_engine.eval", description=__doc__.splitlines()[0])

    ap.add_argument("--model", default=DEFAULT_MODEL_DIR, type=find_model_dir, help=f"checkpoint directory (default {DEFAULT_MODEL_DIR})")
    ap.add_argument("--tasks", type=int, default=300,
                    help="held-out agent tasks (clover_engine.data.agent, never trained on) per setting (default %(default)s)")
    ap.add_argument("--ar-tasks", type=int, default=None,
                    help="tasks for the block_size-1 settings (default: --tasks); the speed ratio uses the common ones")
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma list of {list(SETTINGS)}")
    ap.add_argument("--stdlib-files", type=int, default=30, help="held-out files for the code metrics (0 = skip)")
    ap.add_argument("--package-files", type=int, default=0,
                    help="files of held-out packages (clover_engine.data.packages: never trained on) for the code metrics, "
                         "with 64-token continuations at 32 / 0.95 and block_size 1 (0 = skip)")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="tokens decoded per agent task (default %(default)s)")
    ap.add_argument("--probe-tasks", type=int, default=100, help="tasks for the value-copy probe (0 = skip)")
    ap.add_argument("--open-tasks", type=int, default=100,
                    help="open-vocabulary tool-call turns (unseen tool names and keys, natural phrasing; 0 = skip)")
    ap.add_argument("--workers", type=int, default=2, help="decode processes (default %(default)s)")

    add_threads_argument(ap)  # per worker process; without --threads / OMP_NUM_THREADS: the default / workers
    ap.add_argument("--out", type=Path, default=None, help="JSON output (default MODEL/eval.json)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--sweep-out", type=Path, default=None, metavar="DIR",
                     help="decode the agent tasks with clover_engine.sweep into DIR (results.parquet, resumable)")
    src.add_argument("--from-sweep", type=Path, default=None, metavar="DIR",
                     help="decode no agent task: read them from an existing sweep's DIR/results.parquet")
    args = ap.parse_args(argv)
    try:
        if args.threads is None and not os.environ.get("OMP_NUM_THREADS"):
            args.threads = max(1, default_threads() // max(1, args.workers))
        args.threads = configure_threads(args.threads)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if Path(args.model).is_file():
        raise SystemExit(f"error: {file_as_model_dir(args.model)}")
    if not Path(args.model).is_dir():
        raise SystemExit(f"error: no model directory {args.model!r}")
    settings = [s for s in args.settings.split(",") if s]
    bad = [s for s in settings if s not in SETTINGS]
    if bad:
        raise SystemExit(f"error: unknown settings {bad}; choose from {list(SETTINGS)}")
    out_path = args.out or Path(args.model) / "eval.json"
    chunk = 10
    n_ar = args.tasks if args.ar_tasks is None else min(args.ar_tasks, args.tasks)
    jobs = [(s, list(range(i, min(i + chunk, n_ar if s.startswith("ar1") else args.tasks))), args.tasks,
             args.max_new_tokens)
            for i in range(0, args.tasks, chunk) for s in settings
            if i < (n_ar if s.startswith("ar1") else args.tasks)]  # interleaved: settings share load
    rows: dict[str, list] = defaultdict(list)
    t0 = time.perf_counter()
    if args.sweep_out or args.from_sweep:  # the agent grid through clover_engine.sweep, not the loop below
        counts = {s: n_ar if s.startswith("ar1") else args.tasks for s in settings if args.tasks}
        if not _has_window(args.model):  # as _decode_and_score: no state+window rows without a window
            counts = {s: n for s, n in counts.items() if SETTINGS[s]["memory_mode"] != "state+window"}
        try:
            if args.sweep_out:
                run_agent_sweep(args.sweep_out, args.model, counts, args.max_new_tokens, args.workers, args.threads)
            rows.update(agent_rows_from_sweep(args.sweep_out or args.from_sweep, args.model, counts,
                                              args.max_new_tokens))
        except (ValueError, FileNotFoundError) as e:
            raise SystemExit(f"error: {e}") from None
        jobs = []

    n_files = min(args.stdlib_files, len(stdlib_files("heldout")))
    code_jobs = [("stdlib", [i], 256, 0) for i in range(n_files)]
    if args.package_files:
        held = package_files("heldout")  # spread over the held-out packages: every k-th file
        step = max(1, len(held) // args.package_files)
        code_jobs += [("packages", [i], 256, 64) for i in range(0, len(held), step)[: args.package_files]]
    code_rows: dict[str, list] = defaultdict(list)
    open_jobs = [(s, list(range(i, min(i + chunk, args.open_tasks))), args.open_tasks, args.max_new_tokens)
                 for i in range(0, args.open_tasks, chunk) for s in settings]
    open_rows: dict[str, list] = defaultdict(list)
    with ProcessPoolExecutor(args.workers, initializer=_init, initargs=(args.model, args.threads)) as pool:
        with tqdm(total=len(jobs) + len(open_jobs) + len(code_jobs), desc="eval", unit="job") as bar:
            for res in pool.map(_agent_job, jobs):
                for r in res:
                    rows[r["setting"]].append(r)
                bar.update()
            for res in pool.map(_open_job, open_jobs):
                for r in res:
                    open_rows[r["setting"]].append(r)
                bar.update()
            for job, res in zip(code_jobs, pool.map(_code_job, code_jobs)):
                code_rows[job[0]] += res
                bar.update()
    report = {"model": str(args.model), "n_tasks": args.tasks, "n_tasks_block_size_1": n_ar, "wall_s_total": time.perf_counter() - t0,
              "threads_per_worker": args.threads, "workers": args.workers,
              "agent": {s: summarise_agent(rows[s]) for s in settings},
              "writes": {s: w for s in settings if (w := summarise_writes(rows[s]))}}
    if open_rows:
        report["open_tools"] = {s: summarise_open(open_rows[s]) for s in settings if open_rows[s]}
        report["open_tools_writes"] = {s: w for s in settings if (w := summarise_writes(open_rows[s]))}
        report["open_tools_tasks"] = args.open_tasks
    for mode in ("window", "state"):
        bd, ar = rows.get(f"bd32-{mode}"), rows.get(f"ar1-{mode}")
        if bd and ar:  # tokens/s on the prompts both settings decoded
            common = {r["task"] for r in ar}
            a = summarise_agent([r for r in bd if r["task"] in common])
            b = summarise_agent(ar)
            report[f"speedup_tokens_per_s_bd32_vs_ar1_{mode}"] = a["tokens_per_s"] / max(b["tokens_per_s"], 1e-9)
            report[f"speedup_common_tasks_{mode}"] = len(common)
    for source, rs in code_rows.items():  # "stdlib", "packages"
        report[source] = summarise_code(rs)
    if args.probe_tasks:
        torch.set_num_threads(args.threads)
        model, tok = load_model(args.model), load_tokenizer(args.model)
        report["value_probe"] = value_probe(model, tok, args.probe_tasks)
        report["value_probe_teacher_forced"] = value_probe(model, tok, args.probe_tasks, block_size=1)
        report["value_probe_tasks"] = args.probe_tasks
        if args.open_tasks:
            # the first min(--probe-tasks, --open-tasks) open turns: a blocks-of-1 pass over a ~600-token
            # turn builds one window per token, so it costs like the value probe, not like a decode
            report["open_name_probe"] = open_name_probe(model, tok, min(args.probe_tasks, args.open_tasks))
            report["open_name_probe_tasks"] = min(args.probe_tasks, args.open_tasks)
    report["exact_tasks"] = {s: sorted(r["task"] for r in rows[s] if r["exact_match"]) for s in settings}
    report["examples"] = {s: [{"task": r["task"], "text": r["text"], "exact_match": r["exact_match"]}
                              for r in sorted(rows[s], key=lambda r: r["task"])[:5]] for s in settings}
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(report))
    print(f"written {out_path}")
    return 0


def format_table(report: dict) -> str:
    """Plain-text table of the agent metrics (one column per setting) and the code metrics."""
    agent = {k: v for k, v in report["agent"].items() if v}
    keys = [("exact_match", "{:.3f}"), ("json_valid", "{:.3f}"), ("name_correct", "{:.3f}"),
            ("field_acc", "{:.3f}"), ("repeat_field_acc", "{:.3f}"), ("tokens_per_forward", "{:.2f}"),
            ("nfe_mean", "{:.1f}"), ("forced_fill_rate", "{:.3f}"), ("tokens_per_s", "{:.1f}")]
    lines = [f"{'agent tasks':28s}" + "".join(f"{s:>14s}" for s in agent),
             f"{'n_tasks':28s}" + "".join(f"{v['n_tasks']:>14d}" for v in agent.values())] if agent else []
    for k, fmt in keys if agent else ():
        lines.append(f"{k:28s}" + "".join(f"{fmt.format(v[k]):>14s}" for v in agent.values()))
    srcs = sorted({s for v in agent.values() for s in v["field_acc_by_source"]})
    for src in srcs:
        lines.append(f"{'field_acc from ' + src:28s}" + "".join(
            f"{v['field_acc_by_source'].get(src, float('nan')):>14.3f}" for v in agent.values()))
    kinds = sorted({k for v in agent.values() for k in v["field_acc_by_kind"]})
    for kind in kinds:
        lines.append(f"{'field_acc ' + kind:28s}" + "".join(
            f"{v['field_acc_by_kind'].get(kind, float('nan')):>14.3f}" for v in agent.values()))
    for k in ("speedup_tokens_per_s_bd32_vs_ar1_window", "speedup_tokens_per_s_bd32_vs_ar1_state"):
        if k in report:
            mode = k.rsplit("_", 1)[1]
            lines.append(f"{k}: {report[k]:.2f}x (same {report['speedup_common_tasks_' + mode]} prompts, same run)")
    lines += _writes_lines(report.get("writes", {}), "agent tasks")
    for key, how in (("value_probe", "blocks of 32, all values masked"),
                     ("value_probe_teacher_forced", "blocks of 1, teacher-forced")):
        for mode, accs in report.get(key, {}).items():
            lines.append(f"value-copy probe ({mode}, {report['value_probe_tasks']} tasks, {how}): "
                         + ", ".join(f"{k} {v:.3f}" for k, v in accs.items()))
    for mode, accs in report.get("open_name_probe", {}).items():
        lines.append(f"unseen-tool name/key probe ({mode}, teacher-forced, {report.get('open_name_probe_tasks')} turns): "
                     + ", ".join(f"{k} {v:.3f}" for k, v in accs.items()))
    if report.get("open_tools"):
        ot = report["open_tools"]
        lines.append(f"{'open-vocabulary tools':28s}" + "".join(f"{s:>14s}" for s in ot))
        for k, fmt in (("exact_match", "{:.3f}"), ("name_correct", "{:.3f}"), ("field_acc", "{:.3f}"),
                       ("tokens_per_forward", "{:.2f}"), ("forced_fill_rate", "{:.3f}")):
            lines.append(f"{'  ' + k:28s}" + "".join(f"{fmt.format(v[k]):>14s}" for v in ot.values()))
        groups = [g for g in ("call", "chain", "no_tool", "natural", "keyed") if any(g in v["by_group"] for v in ot.values())]
        for g in groups:
            lines.append(f"{'  ' + g + ' exact / name':28s}" + "".join(
                f"{v['by_group'][g]['exact_match']:>8.3f}/{v['by_group'][g]['name_correct']:.2f}" if g in v["by_group"]
                else f"{'':>14s}" for v in ot.values()))
        lines += _writes_lines(report.get("open_tools_writes", {}), "open-vocabulary tools")
    if "stdlib" in report:
        s = report["stdlib"]
        acc = s["masked_slot_acc_by_index"]
        lines.append(f"stdlib held-out ({s['n_windows']} windows): first-block token acc {s['first_block_token_acc']:.3f}, "
                     f"NFE {s['first_block_nfe_mean']:.1f}; masked-slot acc slot0 {acc[0]:.3f} "
                     f"slot15 {acc[15]:.3f} slot31 {acc[31]:.3f}")
    if report.get("packages"):
        s = report["packages"]
        lines.append(f"held-out packages ({s['n_windows']} windows, never trained on): first-block token acc "
                     f"{s['first_block_token_acc']:.3f}")
        for name in ("bd32", "ar1"):
            if name in s:
                c = s[name]
                lines.append(f"  64-token continuation {name}: {c['tokens_per_forward']:.2f} tokens/forward, forced "
                             f"{c['forced_fill_rate']:.3f}, token acc {c['token_acc']:.3f}, {c['tokens_per_s']:.1f} tokens/s")
        if "speedup_tokens_per_s_bd32_vs_ar1" in s:
            lines.append(f"  tokens/s bd32 / ar1: {s['speedup_tokens_per_s_bd32_vs_ar1']:.2f}x (same windows, same run)")
    return "\n".join(lines)


def _writes_lines(writes: dict, what: str) -> list[str]:
    """`format_table`'s rows for `summarise_writes` results (one column per setting)."""
    if not writes:
        return []
    fmt = lambda x: f"{x:>14.3f}" if x is not None else f"{'-':>14s}"  # noqa: E731
    first = next(iter(writes.values()))
    lines = [f"wrong share of written tokens, {what}:",
             f"{'':28s}" + "".join(f"{s:>14s}" for s in writes),
             f"{'  accepted >= threshold':28s}" + "".join(fmt(w["wrong_share_accepted"]) for w in writes.values())]
    for i, lo in enumerate(first["calibration"]["lo"]):
        hi = first["calibration"]["lo"][i + 1] if i + 1 < len(first["calibration"]["lo"]) else 1.0
        lines.append(f"{f'  confidence {lo:.2f}-{hi:.2f}':28s}"
                     + "".join(fmt(w["calibration"]["wrong_share"][i]) for w in writes.values()))
    for i in range(len(first["error_by_slot"]["rate"])):
        g = first["error_by_slot"]["group"]
        lines.append(f"{f'  answer tokens, slot {g * i}-{g * i + g - 1}':28s}"
                     + "".join(fmt(w["error_by_slot"]["rate"][i]) for w in writes.values()))
    los = first["error_by_distance"]["lo"]
    for i, lo in enumerate(los):
        name = f"{lo}" if i + 1 < len(los) and los[i + 1] == lo + 1 else f"{lo}+" if i + 1 == len(los) else f"{lo}-{los[i + 1] - 1}"
        lines.append(f"{'  distance from clean ' + name:28s}"
                     + "".join(fmt(w["error_by_distance"]["wrong_share"][i]) for w in writes.values()))
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
