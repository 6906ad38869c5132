"""Front ends of the explorer: pure trace -> plotly figures, session state, Panel and ipywidgets views.

Public API::

    from clover_viz import figures          # trace -> plotly Figure (block_figure, confidence_heatmap, ...)
    from clover_viz import Explorer         # ipywidgets front end (imports ipywidgets on first use)

Figures never call the model; they draw what an `clover_engine.recording.trace.Trace` holds.
"""

from clover_viz import figures
from clover_viz.figures import (
    block_figure,
    compare_runs,
    compare_table,
    confidence_heatmap,
    cost_figure,
    cumulative_tokens_figure,
    expert_union_figure,
    memory_share_figure,
    refresh_figure,
    roofline_figure,
    slot_states,
    state_norm_figure,
    text_figure,
    text_html,
    tokens_per_forward_figure,
    update_block_figure,
    update_confidence_heatmap,
)

__all__ = [
    "figures", "Explorer",
    "block_figure", "update_block_figure", "slot_states", "confidence_heatmap", "update_confidence_heatmap",
    "refresh_figure", "text_figure", "text_html",
    "tokens_per_forward_figure", "cumulative_tokens_figure", "expert_union_figure", "state_norm_figure",
    "memory_share_figure", "cost_figure", "roofline_figure", "compare_runs", "compare_table",
]


def __getattr__(name: str):
    if name == "Explorer":
        from clover_viz.widgets import Explorer  # local: the Panel app and plain figure users need no ipywidgets

        return Explorer
    raise AttributeError(f"module 'clover_viz' has no attribute {name!r}")
