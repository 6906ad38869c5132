"""Pure figures: a `clover_engine.recording.trace.Trace` (and a position in it) -> a plotly figure.

Shared by the Panel app (``apps/explorer.py``) and the ipywidgets front end
(`clover_viz.widgets`). Every function here only *reads* the trace -- no
figure ever calls the model, so a trace recorded on a GPU draws on a laptop
(docs/architecture.md §1: figures never compute, they draw what the trace holds).
What a figure needs beyond the recorded fields comes from the engine: which step
wrote each slot and the confidence per slot and iteration from
`clover_engine.recording.trace.Trace.slot_index` (`clover_engine.recording.slot_index.SlotIndex`), per-forward cost
series and roofline points from `clover_engine.cost` (`clover_engine.cost.per_step`).

Positions: ``step`` is a global step index ``0 .. len(trace) - 1`` (negative
counts from the end, ``None`` = the last step) and means the state *after*
that step's writes.

Block view and its states (`slot_states`), one per slot of the current block:

* ``masked``   -- still masked after this step (the cell shows, faintly, the
  forward's current argmax candidate);
* ``prompt``   -- pre-filled with prompt tokens (never masked);
* ``earlier``  -- written by an earlier step of this block;
* ``eos``      -- resolved as EOS after an accepted EOS (rule 7), this step;
* ``forced``   -- written by the forced fill (or ``max_steps``) this step;
* ``accepted`` -- accepted by the policy this step; shaded by confidence.

A revisable decoder (DiffusionGemma, `clover_engine.backbones.diffusion_gemma`) can replace a written token
(the slot shows its new token, state ``accepted`` / ``forced``, with a star marker
``REWRITTEN_MARKS``) or withdraw it (state ``masked``, crossed circle ``REMASKED_MARKS``);
hovers name the token the slot held. `block_revision_marks(trace, step)` gives those
markers' data (None for accept-once traces, whose figures are unchanged).

At the last step of a stopped run the block view shows one more state, ``dropped`` (legend
``DROPPED_SWATCH``, "dropped at Stop"): slots written after a still-masked slot, which the run
did not keep (`clover_viz.runs.dropped_at_stop`). `block_trace_updates(trace, step)` gives every
non-cell trace's properties (that legend entry, the revision markers) for a view that merges payloads.

Modules and API (all return ``plotly.graph_objects.Figure`` unless noted), every
name importable from ``clover_viz.figures``:

* ``block``: `block_figure(trace, step)`, `update_block_figure(fig, trace, step)` (in place),
  `slot_states(trace, step)` -> ``np.ndarray[str]``, `block_revision_marks(trace, step)`;
  `confidence_heatmap(trace, block_index, step=None)` -- steps x slots;
  `update_confidence_heatmap(fig, trace, block_index, step=None)` (in place)
* ``text``: `text_figure(trace, step=None)` (blocks x slots grid), `text_html(trace, step=None)` -> str
* ``per_forward``: `tokens_per_forward_figure(trace)`, `cumulative_tokens_figure(trace)`,
  `expert_union_figure(trace)`, `expert_load_figure(trace)`, `expert_parallel_figure(trace)`, `state_norm_figure(trace)`, `memory_share_figure(trace, step=None)`
* ``cost``: `cost_figure(trace, device="h800")`,
  `roofline_figure(trace, device="h800", config="clover-35b-a3b")`,
  `cost_summary_html(trace, projection, step)` -> str (as run vs projected, whole run vs decode phase)
* ``compare``: `compare_runs(a, b)` -> dict, `compare_table(a, b)` -- two runs side by side
* ``branches``: `branch_list_html(rows)`, `candidates_html(slot_candidates)`, `answer_html(tokens, first_difference)`
  -> str -- the branch list and a slot's candidates (`clover_viz.session_branches`); `slot_at_cell(length, x, y)`
  (``block``) maps a click on the block view to its slot, `slot_cell(length, slot)` a slot to its cell
* ``frontier``: `frontier_figure(points)` -- tokens per forward vs agreement with the careful decode, the Pareto
  front and the current setting marked; `frontier_table_html(points)` -> str (`clover_engine.decoding.frontier`);
  `careful_overlay_html(answer, reference)` -> str, a run's answer over its careful decode's, differing slots marked
* ``_common``: `refresh_figure(fig, new_fig)` -- copy a freshly built figure into an existing
  one in place; `step_for(trace, block_index)` -- the last global step of a block; the
  trace-name constants

Names of the data traces tests and apps look up: ``BLOCK_TRACE`` ("block cells"),
``CONFIDENCE_TRACE`` ("confidence"), ``TEXT_TRACE`` ("generated"), ...

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_figures.py -q``
"""

from __future__ import annotations

from clover_viz.figures._common import (
    ACCEPTED_MARKS,
    BLOCK_TRACE,
    CONFIDENCE_TRACE,
    EOS_MARKS,
    EXPERT_TRACE,
    FORCED_MARKS,
    MEMORY_TRACE,
    NOT_APPLICABLE,
    TEXT_PROMPT_TRACE,
    TEXT_TRACE,
    refresh_figure,
    step_for,
)

# Private names re-exported (``import x as x``): the live views merge payloads into figure
# snapshots and read the trace's index (clover_viz.panel_views, clover_viz.widgets); tests too.
from clover_viz.figures._common import _empty_figure as _empty_figure
from clover_viz.figures._common import _Index as _Index
from clover_viz.figures._common import _index as _index
from clover_viz.figures._common import _resolve_step as _resolve_step
from clover_viz.figures.block import (
    DROPPED_SWATCH,
    REMASKED_MARKS,
    REWRITTEN_MARKS,
    block_figure,
    block_revision_marks,
    block_trace_updates,
    confidence_heatmap,
    slot_at_cell,
    slot_cell,
    slot_states,
    update_block_figure,
    update_confidence_heatmap,
)
from clover_viz.figures.block import _block_payload as _block_payload
from clover_viz.figures.block import _confidence_payload as _confidence_payload
from clover_viz.figures.branches import answer_html, branch_list_html, candidates_html
from clover_viz.figures.compare import COMPARE_ROWS, COMPARE_TABLE_HEIGHT, compare_runs, compare_table
from clover_viz.figures.cost import COST_SUMMARY_CLASS, cost_figure, cost_summary_html, roofline_figure
from clover_viz.figures.frontier import FRONTIER_CLASS, careful_overlay_html, frontier_figure, frontier_table_html
from clover_viz.figures.per_forward import (
    cumulative_tokens_figure,
    expert_load_figure,
    expert_parallel,
    expert_parallel_figure,
    expert_union_figure,
    memory_share_figure,
    state_norm_figure,
    tokens_per_forward_figure,
)
from clover_viz.figures.text import text_figure, text_html

__all__ = [
    "ACCEPTED_MARKS", "BLOCK_TRACE", "CONFIDENCE_TRACE", "EOS_MARKS", "EXPERT_TRACE", "FORCED_MARKS",
    "DROPPED_SWATCH", "REMASKED_MARKS", "REWRITTEN_MARKS", "block_revision_marks", "block_trace_updates",
    "COMPARE_ROWS", "COMPARE_TABLE_HEIGHT", "COST_SUMMARY_CLASS", "MEMORY_TRACE", "NOT_APPLICABLE",
    "TEXT_PROMPT_TRACE", "TEXT_TRACE", "block_figure", "compare_runs", "compare_table", "confidence_heatmap",
    "cost_figure", "cost_summary_html", "cumulative_tokens_figure", "expert_load_figure", "expert_parallel",
    "expert_parallel_figure", "expert_union_figure",
    "memory_share_figure", "refresh_figure", "roofline_figure", "slot_states", "state_norm_figure", "step_for",
    "text_figure", "text_html", "tokens_per_forward_figure", "update_block_figure", "update_confidence_heatmap",
    "answer_html", "branch_list_html", "candidates_html", "slot_at_cell", "slot_cell",
    "FRONTIER_CLASS", "careful_overlay_html", "frontier_figure", "frontier_table_html",
]
