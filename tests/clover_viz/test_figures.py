"""clover_viz.figures on recorded and synthetic traces: cells and colours match the trace, shapes, no model calls.

Run: .venv/bin/python -m pytest tests/clover_viz/test_figures.py -q
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from clover_viz import colors as C
from clover_viz import figures as F
from clover_engine.cost import DEVICES
from clover_engine.recording.events import StepEvent
from clover_engine.recording.trace import Trace
from conftest import SMALL_TRACE, synthetic_trace  # tests/clover_viz/conftest.py


def expected_states(trace: Trace, i: int) -> list[str]:
    """Slot states computed straight from the StepEvent fields and the block's prefill mask."""
    ev = trace.step(i)
    block = next(b for b in trace.blocks if b["block_index"] == ev.block_index)
    out = []
    for s in range(len(ev.tokens)):
        if block["prefilled"][s]:
            out.append("prompt")
        elif ev.accepted[s]:
            out.append("accepted")
        elif ev.forced[s]:
            out.append("forced")
        elif ev.eos_filled[s]:
            out.append("eos")
        elif ev.masked_before[s]:
            out.append("masked")
        else:
            out.append("earlier")
    return out


def cells(fig: go.Figure):
    heat = next(t for t in fig.data if t.name == F.BLOCK_TRACE)
    return heat


def flat_states(fig: go.Figure) -> list[str]:
    heat = cells(fig)
    return [c[0] for row in heat.customdata for c in row if c[0]]


# ------------------------------------------------------------------ block view
def test_slot_states_match_the_trace_at_every_step(trace):
    seen = set()
    for i in range(len(trace)):
        got = F.slot_states(trace, i).tolist()
        assert got == expected_states(trace, i), i
        seen.update(got)
    assert seen == set(C.SLOT_STATES)  # the recorded trace exercises every state


def test_block_figure_cells_and_colours_match_the_trace(trace):
    for i in range(len(trace)):
        fig = F.block_figure(trace, i)
        ev = trace.step(i)
        heat = cells(fig)
        z = [v for row in heat.z for v in row if v is not None]
        assert len(z) == len(ev.tokens)
        states = flat_states(fig)
        assert states == expected_states(trace, i)
        # z codes land in the colour band of their state; accepted shade = confidence
        for s, (state, code) in enumerate(zip(states, z)):
            lo = C.STATE_CODES[state]
            assert lo <= code <= lo + 1, (state, code)
            if state == "accepted":
                assert code == pytest.approx(5 + float(ev.confidence[s]))
                assert float(ev.confidence[s]) >= trace.decode_config["threshold"]
        # written cells show the token text
        texts = [t for row in heat.text for t in row][: len(ev.tokens)]
        for s, state in enumerate(states):
            if state != "masked":
                label = C.token_label(trace.token_str(int(ev.tokens[s])), C.CELL_CHARS)
                assert texts[s] == C.plotly_text(label) and len(label) <= C.CELL_CHARS


def test_colorscale_maps_state_codes_to_state_colours():
    scale = C.block_colorscale()

    def color_at(z: float) -> str:
        f = z / C.Z_MAX
        below = [c for p, c in scale if p <= f + 1e-12]
        return below[-1]

    for state in ("masked", "prompt", "earlier", "eos", "forced"):
        assert color_at(C.STATE_CODES[state] + 0.5) == C.STATE_COLORS[state]
    assert C.state_color("accepted", 1.0) == C.ACCEPTED_SCALE[-1][1]
    assert C.state_color("forced") == C.STATE_COLORS["forced"]
    with pytest.raises(ValueError, match="unknown slot state"):
        C.state_color("purple")


def test_update_block_figure_equals_a_fresh_figure(trace):
    fig = F.block_figure(trace, 0)
    for i in (3, 9, len(trace) - 1, 0):
        F.update_block_figure(fig, trace, i)
        assert fig.to_dict() == F.block_figure(trace, i).to_dict()


def _norm(obj):
    """Figure JSON without empty containers (a cleared annotation list is () in a widget, absent in a fresh figure)."""
    if isinstance(obj, dict):
        return {k: _norm(v) for k, v in obj.items() if v not in ([], {}, None)}
    if isinstance(obj, list):
        return [_norm(v) for v in obj]
    return obj


def test_refresh_figure_clears_what_the_new_figure_lacks(trace):
    import json

    fig = go.FigureWidget(F._empty_figure("", "placeholder"))  # a widget, as the Explorer holds
    for new in (F.block_figure(trace, 3), F.confidence_heatmap(trace, 1), F.confidence_heatmap(trace, 2, step=14),
                F._empty_figure("x", "no steps yet"), F.cost_figure(trace), F.block_figure(trace, 0)):
        F.refresh_figure(fig, new)
        assert _norm(json.loads(fig.to_json())) == _norm(json.loads(new.to_json()))
    assert not fig.layout.annotations  # the placeholder's message is gone


@pytest.mark.parametrize("block_size,lengths,rows,cols", [
    (1, [1, 1, 1], 1, 1),
    (64, [64], 8, 8),
    (32, [32, 5], 1, 5),  # a shorter last block
])
def test_any_block_size(block_size, lengths, rows, cols):
    t = synthetic_trace(block_size, lengths)
    fig = F.block_figure(t, -1)
    heat = cells(fig)
    assert len(heat.z) == rows and len(heat.z[0]) == cols
    assert len(flat_states(fig)) == lengths[-1]
    for i in range(len(t)):
        assert F.slot_states(t, i).tolist() == expected_states(t, i)
    # the grid changes shape in place when the block length changes
    other = F.block_figure(t, 0)
    F.update_block_figure(other, t, -1)
    assert other.to_dict() == fig.to_dict()


def test_prefilled_slots_are_prompt(trace):
    t = synthetic_trace(8, [8, 8], prefill=3)
    assert F.slot_states(t, 0).tolist()[:3] == ["prompt"] * 3
    assert "prompt" not in F.slot_states(t, -1).tolist()


# ------------------------------------------------------------------ confidence heatmap
def test_confidence_heatmap_is_steps_by_slots_with_marks_and_threshold(trace):
    for b in {s.block_index for s in trace.steps}:
        rows = [s for s in trace.steps if s.block_index == b]
        fig = F.confidence_heatmap(trace, b)
        heat = next(t for t in fig.data if t.name == F.CONFIDENCE_TRACE)
        z = np.array(heat.z, dtype=float)
        assert z.shape == (len(rows), len(rows[0].tokens))
        np.testing.assert_allclose(z, np.stack([s.confidence for s in rows]).astype(float), equal_nan=True)
        acc = next(t for t in fig.data if t.name == F.ACCEPTED_MARKS)
        forced = next(t for t in fig.data if t.name == F.FORCED_MARKS)
        assert len(acc.x) == sum(int(s.accepted.sum()) for s in rows)
        assert len(forced.x) == sum(int(s.forced.sum()) for s in rows)
        assert any("threshold 0.4" in str(t) for t in heat.colorbar.ticktext)
        assert "threshold 0.4" in fig.layout.title.text


def test_update_confidence_heatmap_equals_a_fresh_figure(trace):
    fig = F.confidence_heatmap(trace, 0, step=0)
    for block, step in ((1, None), (2, F.step_for(trace, 2)), (0, 3)):
        F.update_confidence_heatmap(fig, trace, block, step=step)
        assert fig.to_json() == F.confidence_heatmap(trace, block, step=step).to_json()  # JSON: NaN-safe
    cursor = fig.layout.shapes[0]
    assert cursor.visible and (cursor.y0, cursor.y1) == (2.5, 3.5)


# ------------------------------------------------------------------ text
def test_text_views(trace):
    fig = F.text_figure(trace)
    gen = next(t for t in fig.data if t.name == F.TEXT_TRACE)
    n_blocks = len({s.block_index for s in trace.steps})
    assert len(gen.z) == n_blocks
    written = sum(v is not None and v == v for row in gen.z for v in row)
    assert written == sum(int(s.accepted.sum() + s.forced.sum() + s.eos_filled.sum()) for s in trace.steps)
    html_all = F.text_html(trace)
    assert html_all.startswith("<div") and html_all.endswith("</div>")
    assert F.text_html(trace, color_by="step").count("<span title=") >= 19
    assert html_all.count('title="block ') == n_blocks
    # at step 0 only the first block is shown and most of it is still masked
    early = F.text_html(trace, 0)
    assert early.count('title="block ') == 1 and "░" in early
    with pytest.raises(ValueError, match="color_by"):
        F.text_html(trace, color_by="rainbow")


def test_token_labels_are_visible_and_escaped():
    assert C.token_label(" ") == "␣" and C.token_label("\n") == "⏎" and C.token_label("") == "∅"
    assert C.token_label("\x08") == "\\x08"
    assert C.token_label("<|endoftext|>") == "EOS"
    # ChatML's turn markers fit a block cell; other <|name|> specials are their name in capitals
    assert C.token_label("<|im_start|>", C.CELL_CHARS) == "START" and C.token_label("<|im_end|>") == "END"
    assert C.token_label("<|fim_middle|>", C.CELL_CHARS) == "FIM_M…" and C.token_label("<|a|>") == "A"
    assert C.token_label("<|a|><|b|>", 12) == "<|a|><|b|>"  # two specials glued: not one name
    assert C.plotly_text("<tool_call>") == "&lt;tool_call&gt;"
    assert len(C.token_label("abcdefghijkl", 8)) == 8


# ------------------------------------------------------------------ per-forward charts
def test_per_forward_charts(trace):
    S = len(trace)
    cum = F.cumulative_tokens_figure(trace)
    ar = next(t for t in cum.data if t.name.startswith("autoregressive"))
    assert list(ar.x) == list(ar.y)
    bd = next(t for t in cum.data if t.name == "block diffusion")
    written = sum(int(s.accepted.sum() + s.forced.sum()) for s in trace.steps)
    # answer tokens (before the first EOS), as the summary and the status line count them
    assert bd.y[-1] == trace.summary()["n_tokens"] == len(trace.generated_tokens) <= written
    tpf = F.tokens_per_forward_figure(trace)
    assert [len(t.x) for t in tpf.data] == [S, S, S]
    eu = F.expert_union_figure(trace)
    assert np.array(eu.data[0].z, dtype=float).shape == (4, S)  # layers x steps (clover-test has 4 layers)
    sn = F.state_norm_figure(trace)
    assert len(sn.data) == 4 and all(len(t.x) == len(trace.blocks) for t in sn.data)
    ms = F.memory_share_figure(trace, 2)
    assert np.array(ms.data[0].z).shape == (4, len(trace.step(2).tokens))
    assert np.array(F.memory_share_figure(trace).data[0].z).shape == (4, 8)


def test_cost_and_roofline(trace):
    cost = F.cost_figure(trace, device="h800")
    names = [t.name for t in cost.data]
    assert any(n.startswith("measured") for n in names)
    assert sum(n.startswith("projected") for n in names) >= 2
    assert any("clover-35b-a3b" in n for n in names)
    roof = F.roofline_figure(trace, device="h800")
    ridge = [t for t in roof.data if t.name == "ridge points"]
    assert len(ridge) == len(DEVICES)
    bd = [t for t in roof.data if "block diffusion" in t.name]  # decode-phase forwards, the prompt forward
    assert sum(len(t.x) for t in bd) == len(trace) and all("projected" in t.name for t in bd)
    assert any("autoregressive" in t.name for t in roof.data)
    assert len(F.roofline_figure(None).data) > len(DEVICES)


def test_compare_runs(trace):
    t2 = synthetic_trace(8, [8, 8])
    cmp = F.compare_runs(trace, t2)
    assert cmp["nfe"] == {"a": len(trace), "b": len(t2), "delta": len(t2) - len(trace)}
    assert cmp["text"]["same"] is False and "<ins" in cmp["text"]["diff_html"]
    same = F.compare_runs(trace, trace)
    assert same["text"]["same"] and same["tokens_per_forward"]["delta"] == 0
    assert F.compare_runs({"nfe": 3, "text": "ab"}, {"nfe": 5, "text": "ac"})["text"]["common_prefix"] == 1
    assert isinstance(F.compare_table(trace, t2), go.Figure)


# ------------------------------------------------------------------ contracts
def test_drawing_never_calls_the_model(trace, monkeypatch):
    def boom(self, *a, **k):
        raise AssertionError(f"a figure called a torch module: {type(self).__name__}")

    monkeypatch.setattr(torch.nn.Module, "__call__", boom)
    fresh = Trace.load(SMALL_TRACE)  # a trace from disk: no model anywhere
    for i in (0, len(fresh) - 1):
        F.block_figure(fresh, i)
        F.text_figure(fresh, i)
        F.text_html(fresh, i)
        F.memory_share_figure(fresh, i)
    F.confidence_heatmap(fresh, 0)
    for fn in (F.tokens_per_forward_figure, F.cumulative_tokens_figure, F.expert_union_figure,
               F.state_norm_figure, F.memory_share_figure, F.cost_figure, F.roofline_figure):
        fn(fresh)


def _non_finite(obj, path="fig") -> list[str]:
    if isinstance(obj, float) and not np.isfinite(obj):
        return [path]
    if isinstance(obj, np.ndarray) and obj.dtype.kind == "f" and obj.ndim > 1 and not np.isfinite(obj).all():
        return [path]  # 1-D float arrays travel as binary buffers (NaN fine); others as JSON lists
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _non_finite(v, f"{path}.{k}")]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in _non_finite(v, f"{path}[{i}]")][:3]
    return []


def test_figures_hold_strict_json(trace):
    """No NaN/inf in figure data: a FigureWidget's messages must be strict JSON or the widget stays blank."""
    figs = [F.block_figure(trace, 3), F.confidence_heatmap(trace, 1), F.text_figure(trace), F.text_figure(trace, 5),
            F.tokens_per_forward_figure(trace), F.cumulative_tokens_figure(trace), F.expert_union_figure(trace),
            F.state_norm_figure(trace), F.memory_share_figure(trace), F.memory_share_figure(trace, 4),
            F.cost_figure(trace), F.roofline_figure(trace)]
    for fig in figs:
        bad = _non_finite(fig.to_plotly_json())
        assert not bad, (fig.layout.title.text, bad)


def test_errors_name_what_was_expected(trace):
    with pytest.raises(ValueError, match="out of range"):
        F.block_figure(trace, len(trace))
    with pytest.raises(TypeError, match="step must be an int"):
        F.block_figure(trace, 1.5)
    with pytest.raises(TypeError, match="clover_engine.recording.trace.Trace"):
        F.block_figure({"steps": []}, 0)
    with pytest.raises(ValueError, match="no steps"):
        F.block_figure(Trace(), 0)
    with pytest.raises(ValueError, match="block 99"):
        F.confidence_heatmap(trace, 99)
    assert F.tokens_per_forward_figure(Trace()).layout.annotations[0].text == "no steps yet"


def test_live_trace_grows(trace):
    """A trace being recorded (no DecodeEnd yet) draws, and the cache follows it as it grows."""
    events = list(trace.iter_events())
    live = Trace(decode_config=trace.decode_config, model_id=trace.model_id, prompt_ids=trace.prompt_ids)
    live.vocab = dict(trace.vocab)
    n = 0
    for ev in events[:-1]:
        live(ev)
        if isinstance(ev, StepEvent):
            n += 1
            assert F.slot_states(live, -1).tolist() == expected_states(trace, n - 1)
    assert len(F.cumulative_tokens_figure(live).data[1].x) == len(trace) + 1


def test_cumulative_chart_counts_the_answer_tokens_the_summary_counts():
    """The EOS and the slots after it are not answer tokens: the chart's total equals the summary's
    (the status line's), also for a decode whose last block wrote slots past its EOS."""
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
    from clover_engine.experiments import load_bundled

    model, tok = load_bundled()
    from clover_viz.examples import WEATHER_PROMPT

    r = BlockDecoder(model, tok, DecodeConfig(block_size=32, threshold=0.95, max_new_tokens=64)).generate(
        WEATHER_PROMPT)
    trace = r.trace
    written = sum(int(ev.accepted.sum() + ev.forced.sum()) for ev in trace.steps)
    assert r.stop_reason == "eos" and written > len(r.tokens)  # the EOS slot itself was written
    fig = F.cumulative_tokens_figure(trace)
    s = trace.summary()
    assert fig.data[1].y[-1] == s["n_tokens"] == len(r.tokens)
    assert fig.data[2].y[-1] <= s["n_forced"]
