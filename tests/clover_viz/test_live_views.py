"""Issue 15 (explorer items 9-11) at the level of the figures and the session state, no browser:
live numbers by the final rule, the text view ending at the EOS, per-step cost independent of
the trace's length (the trace index grows in place; finished blocks' text is rendered once).

Run: .venv/bin/python -m pytest tests/clover_viz/test_live_views.py -q
"""

from __future__ import annotations

import numpy as np

from clover_viz import figures as F
from clover_viz.runs import generated_ids, run_stats
from clover_engine.recording.events import DecodeEnd
from clover_engine.recording.trace import Trace


def _replay(trace: Trace):
    """A trace fed event by event (as the explorer's drain does); yields it after each event."""
    live = Trace(decode_config=trace.decode_config, model_id=trace.model_id, prompt_ids=trace.prompt_ids,
                 meta=trace.meta)
    live.vocab = dict(trace.vocab)
    for ev in trace.iter_events():
        live(ev)
        yield live, ev


def test_live_token_counts_never_exceed_or_fall_back_from_the_final_ones(trace):
    """Item 9: the small trace has EOS-filled slots; live counts (tokens, tokens/forward) use
    the decoder's rule, so they only grow and end at the final numbers -- the old live count
    summed written slots (EOS fills included) and then dropped at DecodeEnd."""
    final = run_stats(trace)
    assert sum(int(s.eos_filled.sum()) for s in trace.steps) > 0  # the case that went wrong
    counts = []
    for live, ev in _replay(trace):
        st = run_stats(live)
        counts.append(st["n_tokens"])
        assert st["n_tokens"] <= final["n_tokens"], (ev, st["n_tokens"])
        assert st["text"] == final["text"][: len(st["text"])]
        if not isinstance(ev, DecodeEnd):
            assert generated_ids(live) == trace.generated_tokens.tolist()[: len(generated_ids(live))]
    assert counts == sorted(counts), counts
    assert counts[-2] == counts[-1] == final["n_tokens"]  # the last live number is the final one


def test_text_view_ends_at_the_first_eos(trace):
    """Item 11: no tokens written beyond the EOS, no EOS fills: one end marker, then nothing."""
    html = F.text_html(trace, len(trace) - 1, show_prompt=False)
    assert html.count("clover-end") == 1
    tail = html[html.index("clover-end"):]
    assert tail.count("<span") == 0 and tail.endswith("</span></div>"), tail
    assert "eos at iteration" not in html  # EOS-filled slots are not drawn as text
    # the generated tokens drawn are exactly the decoder's output
    n_drawn = html.count("accepted at iteration") + html.count("forced at iteration")
    assert n_drawn == len(trace.generated_tokens)


def test_index_grows_in_place_and_equals_a_fresh_one(trace):
    """Item 10: while a trace grows, the cached index is extended, not rebuilt, and matches."""
    first = None
    for live, ev in _replay(trace):
        if len(live) == 0:
            continue
        idx = F._index(live)
        first = first or idx
        assert idx is first
        fresh = F._Index(live)
        assert idx.n == fresh.n == len(live)
        assert idx.steps_of == fresh.steps_of and np.array_equal(idx.block_of, fresh.block_of)
        for b in fresh.written_at:
            assert np.array_equal(idx.written_at[b], fresh.written_at[b])
            assert np.array_equal(idx.written_kind[b], fresh.written_kind[b])


def test_text_html_renders_only_the_current_block_per_call(trace, monkeypatch):
    """Item 10: finished blocks are rendered once; a step costs its own block, whatever the length."""
    calls = []
    real = F.text._block_html
    monkeypatch.setattr(F.text, "_block_html", lambda *a: calls.append(a[2]) or real(*a))
    t = Trace.load(__file__.replace("clover_viz/test_live_views.py", "data/small_trace.parquet"))
    last = len(t) - 1
    full = F.text_html(t, last)
    n_blocks = len(F._index(t).steps_of)
    assert len(calls) == n_blocks
    calls.clear()
    assert F.text_html(t, last) == full
    assert F.text_html(t, last - 1)
    assert calls == [F._index(t).block_of[last]] * 2  # only the current block, twice
