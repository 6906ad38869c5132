"""One run's numbers and text, finished or still decoding, and two runs compared.

* `generated_ids(trace)` -- what the decoder keeps (`docs/architecture.md` §5, rule 7),
  also for a trace still growing: what it would keep if it stopped now.
* `kept_at_stop(trace, held)` -- a run stopped from its page, cut back to what the page showed plus
  one forward (the decode had run ahead of the page).
* `run_stats(trace)` -- the headline numbers of one run by that rule (NFE, tokens, tokens
  per forward, forced fills, wall time, tokens/s, settings, text).
* `compare(previous, current)` -- the comparison both front ends show: `run_stats` of each
  and `compare_runs` of the two (its deltas and text diff). The table
  both draw is ``figures.compare_table`` of the same two `run_stats`.

No Panel or ipywidgets import: the Panel views, the notebook `Explorer` and the session
state share these.

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_live_views.py tests/apps/test_explorer_app.py -q``
"""

from __future__ import annotations

import difflib
import html
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from clover_viz import colors as C
from clover_engine.recording.events import BlockEnd, DecodeEnd, StepEvent
from clover_engine.recording.trace import Trace, cut_after_forwards
from clover_engine.units import format_si

RUN_LABELS = ("previous", "this run")  # how every view names the two runs it compares


# per trace: {block_index: (ids kept from that finished block, hit EOS)}
MEASURING: weakref.WeakKeyDictionary[Trace, dict[str, Any]] = weakref.WeakKeyDictionary()
"""Live runs whose careful decode is under way (`clover_viz.session_careful`): ``{"status": "measuring", "done": k,
"of": n}`` per trace, beside its metadata so that a trace saved meanwhile never replays as "measuring"."""
_BLOCK_IDS: weakref.WeakKeyDictionary[Trace, dict[int, tuple[list[int], bool]]] = weakref.WeakKeyDictionary()


def generated_ids(trace: Trace) -> list[int]:
    """The generated token ids of a trace, finished or still running, by the decoder's rule.

    Finished: the `DecodeEnd` tokens. Running: per block in order, its generated (not
    pre-filled) slots up to the first slot still masked, cut before the first EOS, stopping
    there -- exactly what the decoder keeps when it stops now (``stop_reason`` cancelled).
    Finished blocks are cached, so a live call costs the running block only. The EOS id is
    the trace's (`clover_engine.recording.slot_index.SlotIndex.eos_id`: the model config's, else learned from
    an EOS-filled slot).
    """
    if trace.decode_end is not None:
        return trace.generated_tokens.tolist()
    eos = trace.slot_index().eos_id
    cache = _BLOCK_IDS.setdefault(trace, {})
    ended = {b.block_index for b in trace.block_ends}
    prefilled = {b.block_index: np.asarray(b.prefilled, dtype=bool) for b in trace.block_starts}
    last: dict[int, Any] = {}
    steps = trace.steps
    # the last step of each block not cached yet (walk back from the end: blocks are in order)
    for ev in reversed(steps):
        b = ev.block_index
        if b in cache:
            break
        last.setdefault(b, ev)
    out: list[int] = []
    for b in sorted(set(cache) | set(last)):
        if b in cache:
            ids, hit = cache[b]
        else:
            ev = last[b]
            ids, hit = _kept_of_block(ev, prefilled.get(b, np.zeros(len(ev.tokens), dtype=bool)), eos)
            if b in ended:
                cache[b] = (ids, hit)
        out += ids
        if hit:
            break
    return out


def _kept_of_block(ev: StepEvent, pre: np.ndarray, eos: int | None) -> tuple[list[int], bool]:
    """The decoder's rule for one block as of step ``ev``: its generated (not ``pre``-filled) slots up
    to the first slot still masked, cut before the first EOS; -> (ids, whether an EOS ended them)."""
    still = np.asarray(ev.masked_before, dtype=bool) & ~(
        np.asarray(ev.accepted, dtype=bool) | np.asarray(ev.forced, dtype=bool)
        | np.asarray(ev.eos_filled, dtype=bool))
    ids: list[int] = []
    for t, p, m in zip(np.asarray(ev.tokens).tolist(), pre.tolist(), still.tolist()):
        if p:
            continue
        if m:
            break
        if eos is not None and t == eos:
            return ids, True
        ids.append(int(t))
    return ids, False


def kept_at_stop(trace: Trace, held: list[Any], keep_forwards: int = 1) -> tuple[list[Any], int]:
    """What a run stopped from its page keeps: what the page showed plus ``keep_forwards`` forwards.

    A paced decode runs up to one refresh ahead of its page (`clover_viz.session_pacing`), so by the
    time it hears Stop it has made forwards nobody saw. `ExplorerState` holds back every event that
    arrives after the Stop (``held``, ending with the decoder's `DecodeEnd`) and applies what this
    returns instead: the events up to the ``keep_forwards``-th forward after the shown ones (and a
    `BlockEnd` right after it), the block cut there closed with a `BlockEnd` of its state at that
    forward, and a `DecodeEnd` (``stop_reason`` cancelled) rebuilt for that prefix -- its tokens by
    the decoder's rule (`generated_ids`), its NFE, forced fills, wall time, bytes and FLOPs less the
    dropped forwards'.

    The cut is only made where it is exact: the rule must give the decoder's own tokens for the whole
    run (``held``'s `DecodeEnd`); for a decoder it does not describe, ``held`` comes back unchanged.

    Args:
        trace: the run's trace as shown (no `DecodeEnd` yet); not modified.
        held: the events after the Stop, in order, the last a `DecodeEnd`.
        keep_forwards: forwards kept past the shown ones (the one in flight at the click: 1).

    Returns:
        (events to record, forwards dropped).

    Raises:
        ValueError: if ``held`` does not end with a `DecodeEnd`.
    """
    if not held or not isinstance(held[-1], DecodeEnd):
        raise ValueError("kept_at_stop needs the events after the Stop up to and including the DecodeEnd")
    end, body = held[-1], held[:-1]
    cut = cut_after_forwards(body, keep_forwards)  # a block begun after the kept forward is not begun
    kept, dropped = body[:cut], [ev for ev in body[cut:] if isinstance(ev, StepEvent)]
    steps = [ev for ev in kept if isinstance(ev, StepEvent)]
    if not dropped or not steps:
        return held, 0

    def rebuilt(events: list[Any]) -> Trace:
        return Trace.from_events(list(trace.iter_events()) + events, decode_config=trace.decode_config,
                                 model_id=trace.model_id, prompt_ids=trace.prompt_ids, meta=trace.meta)

    if generated_ids(rebuilt(body)) != np.asarray(end.tokens).tolist():
        return held, 0  # the rule does not give this decoder's tokens: keep the run as it ended
    last, prefix = steps[-1], rebuilt(kept)
    # the rule reads a block's last step, ended or not: the BlockEnd closing a cut block changes no token
    tokens = np.asarray(generated_ids(prefix), dtype=np.int64)
    if not (isinstance(kept[-1], BlockEnd) and kept[-1].block_index == last.block_index):
        start = next((b for b in prefix.block_starts if b.block_index == last.block_index), None)
        pre = np.zeros(len(last.tokens), dtype=bool) if start is None else np.asarray(start.prefilled, dtype=bool)
        hit = _kept_of_block(last, pre, prefix.slot_index().eos_id)[1]
        kept.append(BlockEnd(last.block_index, last.position_start, np.asarray(last.tokens).copy(),
                             last.step_index + 1, hit))
    nfe = max(end.nfe - len(dropped), 1)
    wall_s = max(end.wall_s - sum(float(ev.wall_s) for ev in dropped), 0.0)

    def less(total: float | None, name: str) -> float | None:
        return None if total is None else total - sum(float(getattr(ev, name) or 0.0) for ev in dropped)

    return kept + [DecodeEnd(
        tokens=tokens, nfe=nfe, tokens_per_forward=len(tokens) / nfe,
        n_forced=end.n_forced - sum(int(np.asarray(ev.forced).sum()) for ev in dropped), wall_s=wall_s,
        stop_reason="cancelled", bytes_read=less(end.bytes_read, "bytes_read"), flops=less(end.flops, "flops"),
        observer_s=min(end.observer_s, wall_s))], len(dropped)


def masked_at_end(trace: Trace | None) -> int:
    """Answer slots no step ever wrote in a run that ended on its own (not stopped): a canvas sampler's last
    step writes the model's own prediction into every slot left, and where the model predicts the MASK token
    (a random or barely trained checkpoint whose tied embeddings echo their input) the slot keeps MASK, as the
    official code keeps it. The block view draws them masked and the text as MASK; the cards count them among
    the tokens (they are the answer's). 0 for a stopped run (`dropped_at_stop` tells those) or none."""
    end = trace.decode_end if trace is not None and len(trace) else None
    if end is None or end.stop_reason == "cancelled":
        return 0
    idx = trace.slot_index()
    return int(sum(int(np.sum((at < 0) & ~idx.prefilled(b, len(at)))) for b, at in idx.written_at.items()))


def masked_at_end_note(trace: Trace | None) -> str:
    """`` · 15 of 16 slots ended holding MASK: ...`` for the done line when `masked_at_end` is not 0, else ``""``."""
    n = masked_at_end(trace)
    if not n:
        return ""
    return (f" · {n} of {len(trace.decode_end.tokens)} slots ended holding MASK: the sampler's last step wrote the "
            "model's own prediction there, the MASK token (a random or barely trained model's habit; the official "
            "code keeps them too)")


def dropped_at_stop(trace: Trace) -> dict[str, Any] | None:
    """What a stopped run wrote but did not keep: the slots of its last block written after a slot
    still masked when it stopped.

    A decode stopped mid-block keeps that block's written slots only up to its first masked slot
    (`clover_engine.decoding.decoder.finished_tokens`: the text must be contiguous); slots written after the gap
    -- accepted or forced, irrevocably while the run went on -- are dropped with it.

    Returns:
        None unless the trace ended with stop_reason ``cancelled``; else ``{"block": b,
        "first_gap": slot index of the first masked slot (None: no gap), "slots": [slot indices
        dropped], "n_dropped": int, "n_forced_dropped": int}``.
    """
    end = trace.decode_end
    if end is None or end.stop_reason != "cancelled" or len(trace) == 0:
        return None
    idx = trace.slot_index()
    last = len(trace) - 1
    b = int(idx.block_of[last])
    ev = idx.steps[last]
    length = len(np.asarray(ev.tokens))
    pre = idx.prefilled(b, length)
    written = idx.written_by(b, last)
    gap = next((i for i in range(length) if not pre[i] and not written[i]), None)
    slots = [] if gap is None else [i for i in range(gap + 1, length) if written[i] and not pre[i]]
    kinds = idx.written_kind[b] if b not in idx.revised else idx.written_as_of(b, last)[3]
    n_forced = sum(1 for i in slots if kinds[i] == "forced")
    return {"block": b, "first_gap": gap, "slots": slots, "n_dropped": len(slots), "n_forced_dropped": n_forced}


def forced_past_answer(trace: Trace) -> int:
    """How many forced fills wrote slots at or after the kept answer's end: end-of-text slots (and any
    slot after the first EOS) that cost forwards but are not tokens -- the CLI's note
    (`clover_engine.generate.forced_past_answer`, the same count). Counted over the finished run's kept
    tokens; for a stopped run the slots dropped at Stop (`dropped_at_stop`) are left out: they are
    counted there."""
    from clover_engine.generate import forced_past_answer as _past  # local: the CLI module loads the decoder (~3 s)

    n_prompt = len(trace.prompt_ids) if trace.prompt_ids is not None else 0
    n = _past(trace, n_prompt + len(generated_ids(trace)))
    gone = dropped_at_stop(trace)
    return max(0, n - (gone["n_forced_dropped"] if gone else 0))


def prompt_of(trace: Trace | None) -> str | None:
    """The prompt a run decoded, as the user gave it: ``meta["prompt"]`` (before any chat template),
    else its prompt ids as text; None when the trace records neither."""
    if trace is None:
        return None
    given = (trace.meta or {}).get("prompt")
    if isinstance(given, str):
        return given
    ids = trace.prompt_ids
    if ids is None or len(ids) == 0:
        return None
    return "".join(trace.token_str(int(t)) for t in ids)


def model_of(trace: Trace | None) -> str | None:
    """How a run's model is named: its ``meta["model_label"]``, else its ``model_id``."""
    if trace is None:
        return None
    return (trace.meta or {}).get("model_label") or trace.model_id


def run_stats(trace: Trace | None) -> dict[str, Any] | None:
    """The numbers the views show for one run (None without a trace).

    Keys: ``nfe``, ``n_tokens``, ``tokens_per_forward``, ``n_forced``, ``wall_s``,
    ``tokens_per_s`` (measured on the machine that ran it), ``device`` (where it ran, from the
    trace's meta: ``"cpu"``, ``"cuda:0 (NVIDIA H200)"``; None for traces recorded before it was
    kept), ``stop_reason``,
    ``block_size``, ``threshold``, ``policy``, ``memory_mode``, ``text``; ``n_forced_past_answer``
    (`forced_past_answer`), ``model`` (`model_of`) and ``prompt`` (`prompt_of`).

    While a decode runs, ``n_tokens`` (and so tokens / forward and tokens/s) counts what the
    run would keep if it ended now -- `generated_ids` -- the same definition as the final
    numbers: no EOS fills, nothing after an EOS, nothing past a still-masked slot.
    """
    if trace is None:
        return None
    s = trace.summary()
    dc = trace.decode_config or {}
    ids = generated_ids(trace)
    n_written = len(ids)
    wall = s["wall_s"] or 0.0
    return {
        "nfe": int(s["nfe"]),
        "n_tokens": int(n_written),
        "tokens_per_forward": n_written / s["nfe"] if s["nfe"] else 0.0,
        "n_forced": int(s["n_forced"]),
        "wall_s": float(wall),
        "tokens_per_s": n_written / wall if wall > 0 else 0.0,
        "device": (trace.meta or {}).get("device"),
        "stop_reason": s["stop_reason"],
        "bytes_read": s.get("bytes_read"),
        # an official sampler's run (clover_engine.decoding.masked_diffusion_samplers / block_diffusion_samplers):
        # LLaDA's / SDAR's block_length, Dream's one canvas, SDAR's confidence_threshold; its name as the policy
        "block_size": dc.get("block_size", dc.get("block_length", dc.get("max_new_tokens"))),
        "threshold": dc.get("threshold", dc.get("confidence_threshold")),
        "policy": dc.get("policy", dc.get("sampler")),
        "memory_mode": dc.get("memory_mode"),
        "text": "".join(trace.token_str(t) for t in ids),
        "n_forced_past_answer": forced_past_answer(trace) if trace.decode_end is not None else 0,
        "model": model_of(trace),
        "prompt": prompt_of(trace),
        # its careful decode's agreement (clover_viz.session_careful), or the measurement under way
        "careful": (trace.meta or {}).get("careful") or MEASURING.get(trace),
    }


def failed_status(exc: BaseException, branch: bool, produced: int) -> str:
    """The status line after a decode (or a branch) failed with ``exc`` having recorded ``produced`` forwards: it
    says so and what the page shows now, so that it never keeps reading "decoding ..." (the error line says why)."""
    what = "not branched" if branch else f"decoding failed ({type(exc).__name__})"
    return (f"{what}: see the error (the run on display is unchanged)" if produced == 0 else
            f"{what} after {produced} forwards: see the error (the forwards before it are shown)")


def past_training_note(block_size: int | None, trained: int | None) -> str:
    """`` · block 64 is past the model's training (blocks <= 32): expect worse text`` when a run's
    block_size exceeds the largest block the model was trained on (its `Capabilities.largest_trained_block`;
    None: unknown), else ``""``. Appended to the done line, as the CLI prints its note."""
    if block_size is None or trained is None or block_size <= trained:
        return ""
    return f" · block {block_size} is past the model's training (blocks <= {trained}): expect worse text"


def chat_template_note(trace: Trace | None) -> str:
    """`` · your prompt was decoded in the model's ChatML (or own) template ('show prompt' shows it)`` when the run's
    prompt was wrapped by `clover_engine.prompting.model_input` (recorded as ``meta["chat_template"]``), else ``""``."""
    template = ((trace.meta or {}).get("chat_template") if trace is not None else None)
    if not template:
        return ""
    name = {"chatml": "ChatML", "checkpoint": "own"}.get(template, template)
    return f" · prompt decoded in the model's {name} chat template ('show prompt' shows the exact input)"


def long_prompt_note(trace: Trace | None) -> str:
    """`` · the prompt has N tokens; this model was trained on sequences of at most M ...`` when the run's
    prompt was longer than the model's training rows (recorded as ``meta["trained_context_note"]`` from
    `clover_engine.prompting.trained_context_note`), else ``""``."""
    note = (trace.meta or {}).get("trained_context_note") if trace is not None else None
    return f" · {note}" if note else ""


def careful_card(record: dict[str, Any] | None) -> tuple[str, str]:
    """(value, detail) of the number card: ``("87 %", "first difference at slot 12")``, ``("100 %", "identical")``,
    ``("its own", "one slot per forward")``, ``("measuring…", "12 of 32 forwards")``, ``("–", why)``."""
    if not record:
        return "–", "not measured"
    status = record.get("status")
    if status == "measuring":
        return "measuring…", f"{record.get('done', 0)} of {record.get('of', '?')} forwards"
    if status in ("stopped", "cancelled", "given up", "failed"):
        why = {"stopped": "the run was stopped", "cancelled": "a new decode started first",
               "given up": "Stop ended the measurement", "failed": f"it failed: {record.get('error', '')}"}[status]
        return "–", f"not measured: {why}"
    if record.get("own"):
        return "its own", "this run is one slot per forward"
    if record.get("identical"):
        return "100 %", "identical answers"
    return f"{record['token_agreement']:.0f} %", f"first difference at slot {record['first_difference']}"


SUMMARY_CSS = (
    "<style>.clover-stats{display:flex;flex-wrap:wrap;gap:8px;font-family:Inter,Helvetica,Arial,sans-serif}"
    ".clover-stats .stat{background:#f8fafc;border:1px solid #e2e8f0;border-radius:6px;padding:4px 10px;"
    "min-width:92px}.clover-stats .lbl{font-size:11px;color:#64748b}.clover-stats .val{font-size:20px;"
    "font-weight:600;color:#0f172a}.clover-stats .was{font-size:11px;color:#94a3b8}</style>")


def summary_cards_html(st: dict[str, Any] | None, prev: dict[str, Any] | None = None) -> str:
    """The run summary both front ends show -- the Panel app's number cards and the notebook `Explorer`'s
    -- as one HTML fragment: NFE, tokens, tokens per forward, forced fills, tokens/s, bytes read (cost
    model), stop reason, block size and threshold (or the policy that replaces the threshold), model; under
    each, the previous run's value when ``prev`` is given.

    Args:
        st, prev: `run_stats` of the run shown and of the previous run (None: no run yet / none).

    Each value carries a class (``clover-nfe``, ``clover-tokens``, ``clover-tpf``, ``clover-forced``,
    ``clover-tps``, ``clover-bytes``, ``clover-stop``, ``clover-settings``, ``clover-model``) so tests and
    scripts read the same numbers from either front end.
    """
    def cell(label: str, value: str, cls: str, was: str | None = None) -> str:
        sub = f'<div class="was">prev {html.escape(was)}</div>' if was is not None else ""
        return (f'<div class="stat"><div class="lbl">{label}</div>'
                f'<div class="val {cls}">{html.escape(value)}</div>{sub}</div>')

    if st is None:
        cells = '<div class="stat"><div class="lbl">no run yet</div><div class="val">press Generate</div></div>'
        return f'{SUMMARY_CSS}<div class="clover-stats">{cells}</div>'
    p = prev or {}
    has = prev is not None
    verify = st.get("policy") == "verify"  # a drafter's run: NFE counts base forwards, the base writes itself

    def settings(x: dict[str, Any]) -> str:
        if x.get("policy") in ("verify", "llada", "dream"):  # the threshold is not read
            return f"{x.get('block_size')} · {x['policy']}"
        if x.get("policy") in ("fast_dllm_v2", "sdar", "llada2", "llada21") and x.get("threshold") is not None:
            return f"{x.get('block_size')} · {x['threshold']:.2f} · {x['policy']}"
        thr = x.get("threshold")
        return f"{x.get('block_size')} · {thr:.2f}" if thr is not None else str(x.get("block_size"))

    def nbytes(x: dict[str, Any]) -> str:
        b = x.get("bytes_read")
        return f"{format_si(b, digits=3)}B" if b else "–"

    cells = "".join([
        cell("NFE (base forwards)" if verify else "NFE (forwards)", str(st["nfe"]), "clover-nfe",
             str(p.get("nfe")) if has else None),
        cell("tokens", str(st["n_tokens"]), "clover-tokens", str(p.get("n_tokens")) if has else None),
        cell("tokens / base forward" if verify else "tokens / forward", f"{st['tokens_per_forward']:.2f}",
             "clover-tpf", f"{p.get('tokens_per_forward', 0):.2f}" if has else None),
        cell("written by the base" if verify else "forced fills", str(st["n_forced"]), "clover-forced",
             str(p.get("n_forced")) if has else None),
        cell(f"tokens/s (measured on {html.escape(st.get('device') or 'this machine')}: tokens ÷ "
             "whole decode time)", format_si(st["tokens_per_s"], digits=3), "clover-tps",
             format_si(p.get("tokens_per_s"), digits=3) if has else None),
        cell("bytes read (cost model)", nbytes(st), "clover-bytes", nbytes(p) if has else None),
        cell("stop", str(st.get("stop_reason") or "running"), "clover-stop",
             str(p.get("stop_reason")) if has else None),
        cell("block · threshold", settings(st), "clover-settings", settings(p) if has else None),
        cell("model", str(st.get("model") or "–"), "clover-model", str(p.get("model")) if has else None),
        careful_cell(st.get("careful"), p.get("careful") if has else None),
    ])
    return f'{SUMMARY_CSS}<div class="clover-stats">{cells}</div>'


def careful_cell(record: dict[str, Any] | None, prev: dict[str, Any] | None = None) -> str:
    """The number card of a run's agreement with its careful decode (`careful_card`): the value (class
    ``clover-careful``), what it means under it, and the previous run's value when given."""
    value, detail = careful_card(record)
    was = f'<div class="was">prev {html.escape(careful_card(prev)[0])}</div>' if prev is not None else ""
    return (f'<div class="stat" title="the same model, prompt and settings decoded one slot per forward">'
            f'<div class="lbl">agrees with the careful decode</div><div class="val clover-careful">'
            f'{html.escape(value)}</div><div class="was clover-careful-detail">{html.escape(detail)}</div>{was}</div>')


def compare(previous: Trace | None, current: Trace | None) -> dict[str, Any] | None:
    """The previous run against the current one (None unless both exist).

    Returns ``compare_runs(run_stats(previous), run_stats(current))`` -- per metric
    (``block_size``, ``threshold``, ``nfe``, ``n_tokens``, ``tokens_per_forward``,
    ``n_forced``, ``wall_s``) ``{"a": previous, "b": current, "delta"}``, and ``text``
    (``same``, ``common_prefix`` in characters, ``similarity``, ``diff_html``) -- plus
    ``previous`` and ``current``: the two `run_stats` (what ``figures.compare_table``
    draws).
    """
    prev, cur = run_stats(previous), run_stats(current)
    if prev is None or cur is None:
        return None
    return {"previous": prev, "current": cur, **compare_runs(prev, cur)}


def diff_caption(cmp: dict[str, Any]) -> str:
    """What the text difference below a comparison compares, in plain words (HTML-escaped): a
    warning when the two runs decoded different prompts (the difference then sets unrelated answers
    side by side) or ran different models (two models' answers, not a setting's effect); else ``""``."""
    import html

    prompts = cmp.get("prompt", {}).get("same") is False
    m = cmp.get("model", {})
    models = m.get("same") is False
    if prompts:
        return html.escape("different prompts" + (f" and different models ({m['a']} vs {m['b']})" if models else "")
                           + ": the text difference compares unrelated answers")
    if models:
        return html.escape(f"different models ({m['a']} vs {m['b']}): the text difference compares the two models' "
                           "answers to the same prompt, not the effect of a setting")
    return ""


__all__ = ["MEASURING", "RUN_LABELS", "SUMMARY_CSS", "careful_card", "careful_cell", "compare", "diff_caption",
           "dropped_at_stop", "failed_status", "forced_past_answer", "generated_ids", "long_prompt_note", "masked_at_end",
           "masked_at_end_note", "model_of", "prompt_of", "run_stats", "summary_cards_html"]


# ------------------------------------------------------------------------ two runs compared
def _run_info(run: Any) -> dict[str, Any]:
    if hasattr(run, "summary") and callable(run.summary):
        info = dict(run.summary())
        info["text"] = "".join(run.token_str(int(t)) for t in run.generated_tokens)
        dc = getattr(run, "decode_config", None) or {}
        info.setdefault("threshold", dc.get("threshold"))
        info.setdefault("block_size", dc.get("block_size"))
        info.setdefault("memory_mode", dc.get("memory_mode"))
        info.setdefault("model", model_of(run))
        info.setdefault("prompt", prompt_of(run))
        return info
    if isinstance(run, Mapping):
        return dict(run)
    raise TypeError(f"compare_runs takes two Traces or summary dicts (trace.summary() + 'text'), got {type(run).__name__}")


_COMPARE_KEYS = ("block_size", "threshold", "nfe", "n_tokens", "tokens_per_forward", "n_forced", "wall_s")
_SETTING_KEYS = ("model", "memory_mode", "prompt")  # what the runs were, before the numbers


def compare_runs(a: Any, b: Any) -> dict[str, Any]:
    """Compare two runs (``a`` = previous, ``b`` = new): Traces or summary dicts (with ``text`` for the diff).

    Returns a dict: one entry per metric in ``block_size, threshold, nfe,
    n_tokens, tokens_per_forward, n_forced, wall_s`` holding ``{"a", "b",
    "delta"}`` (delta None when not numeric), and ``text`` with ``a``, ``b``,
    ``same`` (bool), ``common_prefix`` (characters), ``similarity``
    (difflib ratio) and ``diff_html`` (insertions green, deletions red).

    Also ``model``, ``memory_mode`` and ``prompt``: ``{"a", "b", "same"}`` (``same`` None when
    either run does not record it): two runs of different models or prompts are not a setting's
    effect, and the views say so.
    """
    ia, ib = _run_info(a), _run_info(b)
    out: dict[str, Any] = {}
    for k in _SETTING_KEYS:
        va, vb = ia.get(k), ib.get(k)
        out[k] = {"a": va, "b": vb, "same": None if va is None or vb is None else va == vb}
    for k in _COMPARE_KEYS:
        va, vb = ia.get(k), ib.get(k)
        num = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
        out[k] = {"a": va, "b": vb, "delta": (vb - va) if num else None}
    ta, tb = str(ia.get("text") or ""), str(ib.get("text") or "")
    prefix = 0
    for ca, cb in zip(ta, tb):
        if ca != cb:
            break
        prefix += 1
    sm = difflib.SequenceMatcher(a=ta, b=tb, autojunk=False)
    parts = []
    for op, a0, a1, b0, b1 in sm.get_opcodes():
        if op == "equal":
            parts.append(html.escape(ta[a0:a1]))
        if op in ("delete", "replace"):
            parts.append(f'<del style="background:#fee2e2;color:#991b1b">{html.escape(ta[a0:a1])}</del>')
        if op in ("insert", "replace"):
            parts.append(f'<ins style="background:#dcfce7;color:#166534;text-decoration:none">{html.escape(tb[b0:b1])}</ins>')
    out["text"] = {
        "a": ta, "b": tb, "same": ta == tb, "common_prefix": prefix, "similarity": round(sm.ratio(), 4),
        "diff_html": f'<div style="font-family:{C.MONO};white-space:pre-wrap;font-size:12px">{"".join(parts)}</div>',
    }
    return out
