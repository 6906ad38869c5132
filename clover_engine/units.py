"""Number formatting shared by the CLIs and the views: one SI-prefix formatter. Wing: ``ground``."""

from __future__ import annotations

import math

_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def format_si(x: float | None, unit: str = "", digits: int = 4, missing: str = "–") -> str:
    """Format ``x`` with a decimal SI prefix: ``12.00 GB``, ``196.5 GFLOP``, ``1.23k``.

    Args:
        x: the value (any real; ``None`` or NaN / inf print ``missing``).
        unit: appended after the prefix with one space (``"B"``, ``"FLOP"``); empty for a
            bare number (``"1.23k"``, no space).
        digits: significant digits (trailing zeros kept, a trailing point dropped).
        missing: what a missing value prints as.

    Prefixes are the SI decimal ones (k = 1e3 ... P = 1e15), never binary (KiB).
    """
    if x is None or not math.isfinite(x):
        return missing
    sep = " " if unit else ""
    if x == 0:
        return f"0{sep}{unit}"
    for factor, prefix in _PREFIXES:
        if abs(x) >= factor:
            return f"{x / factor:#.{digits}g}".rstrip(".") + f"{sep}{prefix}{unit}"
    return f"{x:#.{digits}g}".rstrip(".") + f"{sep}{unit}"


__all__ = ["format_si"]
