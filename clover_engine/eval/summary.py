"""Per-setting metrics of scored evaluation rows: held-out agent tool calls (`summarise_agent`),
open-vocabulary tool calls (`summarise_open`) and held-out code (`summarise_code`); and one decode's
errors by slot index against a reference answer (`slot_errors_vs_reference`, which `clover_engine.eval.chat`
and `clover_engine.eval.drafter` score their block decodes with).

Pure aggregation of the rows `clover_engine.eval` (a Clover checkpoint) and `clover_engine.eval.chat` (an adapter
over a pretrained base) score; the metrics are described in `clover_engine.eval`'s module docstring.

Wing: ``eval``.
"""

from __future__ import annotations

from collections import defaultdict


def slot_errors_vs_reference(prompt_len: int, block_size: int, gen: list[int], ref: list[int], eos: int,
                             stopped_eos: bool, max_new: int) -> tuple[list[int], list[int]]:
    """Errors and counts by slot index of one block decode against the reference answer.

    Blocks sit at absolute positions that are multiples of ``block_size`` (the prompt's ``prompt_len``
    tokens come first), so answer token ``k`` is in slot ``(prompt_len + k) % block_size``. A block is
    scored only when it began while the decode still equalled the reference (every token before it
    agrees): later blocks are conditioned on a different history, and their errors are not the
    slot's. The EOS that ended an answer counts as a token -- ``gen``'s when ``stopped_eos``, the
    reference's when it is shorter than ``max_new`` (it stopped on its own).

    Args:
        prompt_len: prompt tokens before the answer.
        block_size: B, the decode's block size (>= 1).
        gen, ref: the decoded and the reference answer ids (without their EOS).
        eos: the EOS id; stopped_eos: the decode stopped on EOS; max_new: the token budget of both.

    Returns:
        (errors [B], counts [B]): per slot index, the scored tokens that differ from the reference and
        the scored tokens.
    """
    B = int(block_size)
    err, n = [0] * B, [0] * B
    full = gen + ([eos] if stopped_eos else [])
    ref_full = ref + ([eos] if len(ref) < max_new else [])
    pos = 0
    while pos < min(len(full), len(ref_full)):
        if full[:pos] != ref_full[:pos]:
            break
        end = pos + (B - (prompt_len + pos) % B)
        for k in range(pos, min(end, len(full), len(ref_full))):
            s = (prompt_len + k) % B
            n[s] += 1
            err[s] += int(full[k] != ref_full[k])
        pos = end
    return err, n


def summarise_agent(rows: list[dict]) -> dict:
    """Aggregate per-task rows of one setting into the metrics of the module docstring."""
    n = len(rows)
    if n == 0:
        return {}
    f_all = [f for r in rows for f in r["fields"]]
    by_kind, by_source = defaultdict(list), defaultdict(list)
    for f in f_all:
        by_kind[f["kind"]].append(f["correct"])
        by_source[f["source"]].append(f["correct"])
    nfe = sum(r["nfe"] for r in rows)
    toks = sum(r["n_tokens"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {
        "n_tasks": n,
        "exact_match": mean([r["exact_match"] for r in rows]),
        "json_valid": mean([r["json_valid"] for r in rows]),
        "name_correct": mean([r["name_correct"] for r in rows]),
        "field_acc": mean([f["correct"] for f in f_all]),
        "field_acc_by_kind": {k: round(mean(v), 4) for k, v in sorted(by_kind.items())},
        "field_acc_by_source": {k: round(mean(v), 4) for k, v in sorted(by_source.items())},
        "repeat_field_acc": mean([f["correct"] for f in f_all if f.get("is_repeat")]),
        "tokens_per_forward": toks / max(nfe, 1),
        "nfe_mean": nfe / n,
        "forced_fill_rate": sum(r["n_forced"] for r in rows) / max(toks, 1),
        "wall_s": wall,
        "tokens_per_s": toks / wall if wall else 0.0,
    }


def summarise_open(rows: list[dict]) -> dict:
    """`summarise_agent` of open-vocabulary rows, plus exact match and tool-name accuracy by
    category (``call``, ``chain``, ``no_tool``) and by phrasing (``natural``, ``keyed``)."""
    out = summarise_agent(rows)
    if not out:
        return out
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    groups = {c: [r for r in rows if r["category"] == c] for c in ("call", "chain", "no_tool")}
    groups["natural"] = [r for r in rows if r["natural"] and r["category"] != "no_tool"]
    groups["keyed"] = [r for r in rows if not r["natural"] and r["category"] != "no_tool"]
    out["by_group"] = {g: {"n": len(rs), "exact_match": round(mean([r["exact_match"] for r in rs]), 4),
                           "name_correct": round(mean([r["name_correct"] for r in rs]), 4)}
                       for g, rs in groups.items() if rs}
    return out


def summarise_code(rows: list[dict]) -> dict:
    """First-block accuracy, masked-slot accuracy by slot index and, where continuations ran,
    tokens per forward / forced-fill rate / token accuracy / tokens/s at 32 / 0.95 and block_size 1."""
    n = len(rows)
    if not n:
        return {}
    out = {"n_windows": n,
           "first_block_token_acc": sum(sum(r["decoded_correct"]) for r in rows) / (32 * n),
           "masked_slot_acc_by_index": [round(sum(r["slot_correct"][i] for r in rows) / n, 4) for i in range(32)],
           "first_block_nfe_mean": sum(r["nfe"] for r in rows) / n}
    for name in ("bd32", "ar1"):
        cs = [r[name] for r in rows if name in r]
        if cs:
            toks, nfe, wall = (sum(c[k] for c in cs) for k in ("n_tokens", "nfe", "wall_s"))
            out[name] = {"tokens_per_forward": toks / max(nfe, 1), "forced_fill_rate": sum(c["n_forced"] for c in cs)
                         / max(toks, 1), "token_acc": sum(c["correct"] for c in cs) / max(toks, 1),
                         "tokens_per_s": toks / wall if wall else 0.0}
    if "bd32" in out and "ar1" in out:
        out["speedup_tokens_per_s_bd32_vs_ar1"] = out["bd32"]["tokens_per_s"] / max(out["ar1"]["tokens_per_s"], 1e-9)
    return out
