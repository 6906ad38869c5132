"""Colours and token labels shared by every clover_viz figure.

One palette so that the block view, the text view, the heatmaps and the
legend agree: a slot that is "forced" is the same orange everywhere.

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_figures.py -q``
"""

from __future__ import annotations

import html
import unicodedata

# Slot states of the block view, in legend order (see `clover_viz.figures.slot_states`).
SLOT_STATES = ("masked", "prompt", "earlier", "eos", "forced", "accepted")
# The block view's one extra state: at the last step of a stopped run, a slot written after a slot
# still masked, which the run did not keep (`clover_viz.runs.dropped_at_stop`; the text view strikes it).
DROPPED = "dropped"
BLOCK_VIEW_STATES = (*SLOT_STATES, DROPPED)

STATE_LABELS = {
    "masked": "masked",
    "prompt": "prompt (pre-filled)",
    "earlier": "written earlier",
    "eos": "EOS-filled",
    "forced": "forced this step",
    "accepted": "accepted this step",
    "dropped": "dropped at Stop",
}

STATE_COLORS = {
    "masked": "#eef1f5",
    "prompt": "#bfdbfe",
    "earlier": "#cbd5e1",
    "eos": "#ddd6fe",
    "forced": "#f97316",
    "accepted": "#16a34a",  # legend swatch; cells shade by confidence (ACCEPTED_SCALE)
    "dropped": "#fecdd3",
}

# Accepted cells: light (low confidence) -> dark (confidence 1). Most of the
# range is spent above 0.8, where the thresholds users pick live.
ACCEPTED_SCALE = ((0.0, "#dcfce7"), (0.8, "#86efac"), (0.95, "#22c55e"), (1.0, "#166534"))

# Block-view z codes: a discrete band per state, accepted = 5 + confidence, dropped above it.
STATE_CODES = {"masked": 0.0, "prompt": 1.0, "earlier": 2.0, "eos": 3.0, "forced": 4.0, "accepted": 5.0,
               "dropped": 6.0}
Z_MAX = 7.0

FORCED_MARK = "#c2410c"
ACCEPTED_MARK = "#0f172a"
THRESHOLD_COLOR = "#dc2626"
AR_COLOR = "#64748b"
MEASURED_COLOR = "#2563eb"
PROJECTED_COLOR = "#9333ea"
TARGET_COLOR = "#db2777"

# Layout defaults shared by figures.
FONT = dict(family="Inter, Helvetica, Arial, sans-serif", size=12, color="#1f2937")
MONO = "JetBrains Mono, Menlo, Consolas, monospace"


def block_colorscale() -> list[list]:
    """Plotly colorscale over z in [0, Z_MAX]: flat bands for the discrete states, a ramp for accepted."""
    scale: list[list] = []
    eps = 1e-6
    for state in ("masked", "prompt", "earlier", "eos", "forced"):
        lo = STATE_CODES[state] / Z_MAX
        hi = (STATE_CODES[state] + 1) / Z_MAX
        scale.append([lo, STATE_COLORS[state]])
        scale.append([hi - eps, STATE_COLORS[state]])
    base = STATE_CODES["accepted"] / Z_MAX
    for frac, color in ACCEPTED_SCALE:
        scale.append([min(1.0, base + frac / Z_MAX), color])
    lo = STATE_CODES[DROPPED] / Z_MAX  # a flat band above accepted's ramp
    scale.append([lo + eps, STATE_COLORS[DROPPED]])
    scale.append([1.0, STATE_COLORS[DROPPED]])
    return scale


def accepted_color(confidence: float) -> str:
    """The hex colour of an accepted cell at ``confidence`` (what the colorscale draws)."""
    c = min(max(float(confidence), 0.0), 1.0)
    stops = ACCEPTED_SCALE
    for (f0, c0), (f1, c1) in zip(stops, stops[1:]):
        if c <= f1:
            t = 0.0 if f1 == f0 else (c - f0) / (f1 - f0)
            return _mix(c0, c1, t)
    return stops[-1][1]


def state_color(state: str, confidence: float | None = None) -> str:
    """Colour of a block cell in ``state`` (accepted cells shade by ``confidence``)."""
    if state not in STATE_COLORS:
        raise ValueError(f"unknown slot state {state!r}; expected one of {BLOCK_VIEW_STATES}")
    if state == "accepted" and confidence is not None and confidence == confidence:
        return accepted_color(confidence)
    return STATE_COLORS[state]


def _mix(a: str, b: str, t: float) -> str:
    ra, ga, ba = (int(a[i:i + 2], 16) for i in (1, 3, 5))
    rb, gb, bb = (int(b[i:i + 2], 16) for i in (1, 3, 5))
    return "#{:02x}{:02x}{:02x}".format(
        round(ra + (rb - ra) * t), round(ga + (gb - ga) * t), round(ba + (bb - ba) * t)
    )


_SPECIAL_SHORT = {"<|endoftext|>": "EOS", "<|mask|>": "MASK", "<|im_start|>": "START", "<|im_end|>": "END"}
# the block view's cells: 8 to a row in a ~400 px figure, ~48 px each; a 12 px monospace
# character is ~7 px wide, so 6 characters fit (8 ran into the next cell)
CELL_CHARS = 6


def token_label(text: str, max_chars: int = 8) -> str:
    """A short, visible, *plain* label for one token's text (escape it before putting it in HTML).

    Spaces become ``␣``, newlines ``⏎``, tabs ``⇥``, other control or
    unprintable characters ``\\xNN``; an empty string ``∅``; long tokens are
    cut with ``…``; ``<|endoftext|>`` is ``EOS``, ChatML's ``<|im_start|>`` / ``<|im_end|>``
    are ``START`` / ``END`` and any other ``<|name|>`` special token is its name in capitals
    (``<|fim_middle|>``: ``FIM_MIDDLE``, then cut to `max_chars`).
    """
    if text in _SPECIAL_SHORT:
        return _SPECIAL_SHORT[text]
    if len(text) > 4 and text.startswith("<|") and text.endswith("|>") and "<|" not in text[2:]:
        text = text[2:-2].upper()  # then shown and cut like any token
    if text == "":
        return "∅"
    out = []
    for ch in text:
        if ch == " ":
            out.append("␣")
        elif ch == "\n":
            out.append("⏎")
        elif ch == "\t":
            out.append("⇥")
        elif ch == "\r":
            out.append("␍")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    s = "".join(out)
    return s if len(s) <= max_chars else s[: max_chars - 1] + "…"


def plotly_text(text: str) -> str:
    """Escape text for plotly's pseudo-HTML labels (``<tool_call>`` must not become a tag)."""
    return html.escape(text, quote=False)
