"""The ``--parallel`` syntax (``ep=N``, ``tp=M``, ``ep=N,tp=M``), read by the runtime split
(`clover_engine.decoding.parallel`, ``clover_engine.generate --parallel``) and by the cost projection of a split
(`clover_engine.cost.parallel.parse_split`, ``python -m clover_engine.cost --parallel``). Pure text: no torch,
no model code, so the cost model can read the syntax without importing ``torch.distributed``.

Wing: ``backbones``.
"""

from __future__ import annotations


def parse_parallel(text: str) -> dict[str, int]:
    """``"ep=2"`` -> ``{"ep": 2}``; ``"tp=2"`` -> ``{"tp": 2}``; ``"ep=2,tp=2"`` -> ``{"ep": 2, "tp": 2}``.

    ep = expert parallel (`clover_engine.decoding.parallel.shard_experts`), tp = tensor parallel
    (`clover_engine.decoding.parallel.shard_heads`). Both split over the same ranks, so each given value must equal
    the world size (checked by the caller).

    Raises:
        ValueError: not ``ep=N`` and/or ``tp=M`` with ints >= 1, or a key given twice.
    """
    usage = f"--parallel expects ep=N and/or tp=M with N, M >= 1 (e.g. ep=2, tp=2, ep=2,tp=2), got {text!r}"
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, eq, val = part.partition("=")
        try:
            n = int(val) if eq else 0
        except ValueError:
            n = 0
        if key not in ("ep", "tp") or n < 1 or key in out:
            raise ValueError(usage)
        out[key] = n
    if not out:
        raise ValueError(usage)
    return out
