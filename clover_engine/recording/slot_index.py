"""SlotIndex: which step wrote each slot of each block of a `clover_engine.recording.trace.Trace`.

A trace stores one `StepEvent` per forward; the views ask the converse questions --
which steps belong to block b, which step wrote slot s, with what confidence, and was
it accepted, forced or EOS-filled (docs/architecture.md §5-6). `SlotIndex` answers them
from the step masks and keeps the answers: `Trace.slot_index` returns the trace's own
index, extended in place when the trace grows (a live decode), so a new step costs its
own slots, not a pass over the whole trace.

Indices: ``i`` is a global step index ``0 .. S - 1``, ``b`` a block index, ``s`` a slot
``0 .. L - 1`` of its block; an *iteration* of a block is the position of a step among
that block's steps (0-based). Slot states (`SlotIndex.slot_states`), one per slot after
step ``i``: ``masked``, ``prompt`` (pre-filled, never masked), ``earlier`` (written by an
earlier step of the block), ``eos`` (EOS-filled this step), ``forced`` (forced fill or
``max_steps`` this step) and ``accepted`` (accepted by the policy this step).

Revisable decoders (`clover_engine.backbones.diffusion_gemma`) may replace a written token by another
(`StepEvent.rewritten`) or withdraw it (`StepEvent.remasked`). A block with any such step
is *revised* (`SlotIndex.revised`); its history is then read step by step: a slot holds
a written token after step ``i`` when it held one before and was not remasked, or was
written at ``i``. For a block that was never revised every answer is the accept-once one
(written once, held from then on), computed as before.

Wing: ``recording``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_slot_index.py -q``
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

WRITE_KINDS = ("accepted", "forced", "eos")
"""How a slot was written, in the order a step's masks are read: the `StepEvent` masks
``accepted``, ``forced`` and ``eos_filled``."""


class SlotIndex:
    """Per-block write index of a trace (see the module docstring).

    Args:
        trace: an `clover_engine.recording.trace.Trace` (``steps``, ``block_starts``, ``decode_config``,
            ``meta``); its steps so far are indexed.

    Attributes:
        n: steps indexed (S).
        steps: the trace's `StepEvent` list (the trace's own, growing list).
        block_of, iter_of: (S,) int64, each step's ``block_index`` and ``step_index``.
        n_accepted, n_forced, n_eos: (S,) int64, slots each step accepted / forced /
            EOS-filled.
        blocks: ``{b: {"block_index", "prefilled", "block_size"}}`` from the block starts.
        steps_of: ``{b: [global step, ...]}`` in order.
        written_at: ``{b: (L,) int64}`` the global step that wrote each slot, -1 never.
        written_iter: ``{b: (L,) int64}`` the iteration of the block that wrote it, -1 never.
        written_conf: ``{b: (L,) float64}`` its confidence when written (NaN: never
            written, or EOS-filled).
        written_kind: ``{b: (L,) object}`` one of `WRITE_KINDS`, ``""`` never written.
            For a revised block these describe the write of the token each slot holds at
            the end (a slot remasked after its last write reads as never written);
            `written_as_of` gives them at any step.
        n_rewritten, n_remasked: (S,) int64, slots each step rewrote / remasked (0 for
            accept-once decoders).
        revised: block indices with at least one rewritten or remasked slot.
        revisable: True when the trace comes from a revisable decoder (``meta["revisable"]``,
            set by `clover_engine.backbones.diffusion_gemma`) or has a revised block; views then show the
            revision marks even before the first revision.
        eos_id: the EOS token id from ``meta["model_config"]["eos_token_id"]``, else
            learned from the first EOS-filled slot, else None.

    A slot written twice keeps its last write.
    """

    def __init__(self, trace: Any) -> None:
        self.n = 0
        self.steps: list[Any] = []
        self.block_of = np.zeros(0, dtype=np.int64)
        self.iter_of = np.zeros(0, dtype=np.int64)
        self.n_accepted = np.zeros(0, dtype=np.int64)
        self.n_forced = np.zeros(0, dtype=np.int64)
        self.n_eos = np.zeros(0, dtype=np.int64)
        self.n_rewritten = np.zeros(0, dtype=np.int64)
        self.n_remasked = np.zeros(0, dtype=np.int64)
        self.revised: set[int] = set()
        self.blocks: dict[int, dict[str, Any]] = {}
        self.steps_of: dict[int, list[int]] = {}
        self.written_at: dict[int, np.ndarray] = {}
        self.written_iter: dict[int, np.ndarray] = {}
        self.written_conf: dict[int, np.ndarray] = {}
        self.written_kind: dict[int, np.ndarray] = {}
        self.eos_id: int | None = None
        self._decode_block_size: Any = None
        self._declared_revisable = bool((getattr(trace, "meta", None) or {}).get("revisable"))
        cfg = (getattr(trace, "meta", None) or {}).get("model_config")
        if isinstance(cfg, Mapping) and cfg.get("eos_token_id") is not None:
            self.eos_id = int(cfg["eos_token_id"])
        self.extend(trace)

    def extend(self, trace: Any) -> None:
        """Take in the steps (and block starts) recorded since the last call."""
        steps = trace.steps
        new = range(self.n, len(steps))
        starts = trace.block_starts  # a copy of the list: cheap, unlike ``trace.blocks``
        if len(self.blocks) != len(starts):
            self.blocks = {b.block_index: {"block_index": b.block_index, "prefilled": b.prefilled,
                                           "block_size": b.block_size} for b in starts}
        self._decode_block_size = (trace.decode_config or {}).get("block_size")
        self.steps = steps

        def column(get: Any) -> np.ndarray:
            return np.array([get(steps[i]) for i in new], dtype=np.int64)

        self.block_of = np.concatenate([self.block_of, column(lambda s: s.block_index)])
        self.iter_of = np.concatenate([self.iter_of, column(lambda s: s.step_index)])
        self.n_accepted = np.concatenate([self.n_accepted, column(lambda s: int(np.sum(s.accepted)))])
        self.n_forced = np.concatenate([self.n_forced, column(lambda s: int(np.sum(s.forced)))])
        self.n_eos = np.concatenate([self.n_eos, column(lambda s: int(np.sum(s.eos_filled)))])
        self.n_rewritten = np.concatenate([self.n_rewritten, column(lambda s: int(np.sum(_rev(s, "rewritten"))))])
        self.n_remasked = np.concatenate([self.n_remasked, column(lambda s: int(np.sum(_rev(s, "remasked"))))])
        for i in new:
            ev = steps[i]
            b = int(ev.block_index)
            if b not in self.steps_of:
                L = len(ev.tokens)
                self.steps_of[b] = []
                self.written_at[b] = np.full(L, -1, dtype=np.int64)
                self.written_iter[b] = np.full(L, -1, dtype=np.int64)
                self.written_conf[b] = np.full(L, np.nan, dtype=np.float64)
                self.written_kind[b] = np.full(L, "", dtype=object)
            self.steps_of[b].append(i)
            it = len(self.steps_of[b]) - 1
            at, conf, kind = self.written_at[b], self.written_conf[b], self.written_kind[b]
            if self.n_rewritten[i] or self.n_remasked[i]:
                self.revised.add(b)
            gone = _rev(ev, "remasked")
            if gone.any():  # withdrawn: the slot holds no written token any more
                at[gone], self.written_iter[b][gone], conf[gone], kind[gone] = -1, -1, np.nan, ""
            for name, mask in zip(WRITE_KINDS, (ev.accepted, ev.forced, ev.eos_filled)):
                m = np.asarray(mask, dtype=bool)
                if not m.any():
                    continue
                at[m] = i
                self.written_iter[b][m] = it
                kind[m] = name
                if name != "eos":
                    conf[m] = np.asarray(ev.confidence, dtype=np.float64)[m]
                elif self.eos_id is None:  # EOS-filled slots hold EOS: learn the id from them
                    self.eos_id = int(np.asarray(ev.tokens)[m][0])
        self.n = len(steps)

    @property
    def revisable(self) -> bool:
        """Whether the decoder that recorded the trace may rewrite or withdraw written tokens."""
        return self._declared_revisable or bool(self.revised)

    # ------------------------------------------------------------------ per block

    def prefilled(self, block: int, length: int) -> np.ndarray:
        """(length,) bool: the block's pre-filled (prompt) slots; all False when the block
        start is unknown or its mask has another length."""
        info = self.blocks.get(block)
        if info is None or info.get("prefilled") is None:
            return np.zeros(length, dtype=bool)
        p = np.asarray(info["prefilled"], dtype=bool)
        return p if len(p) == length else np.resize(p, length) & False

    def block_size(self) -> int:
        """The decode's block size: from a block start, else the decode config, else the
        longest block seen (1 for an empty trace)."""
        for info in self.blocks.values():
            if info.get("block_size"):
                return int(info["block_size"])
        if self._decode_block_size:
            return int(self._decode_block_size)
        return max((len(s.tokens) for s in self.steps), default=1)

    def last_step(self, block: int) -> int:
        """The last global step of ``block``.

        Raises:
            ValueError: for a block with no steps in the trace.
        """
        self._check_block(block)
        return self.steps_of[block][-1]

    def written_by(self, block: int, step: int) -> np.ndarray:
        """(L,) bool: slots of ``block`` holding a token written at or before global step
        ``step`` (pre-filled slots excluded: they are never written). For a revised block,
        a slot remasked since its last write is not counted."""
        if block in self.revised:
            return self.written_as_of(block, step)[0] >= 0
        at = self.written_at[block]
        return (at >= 0) & (at <= step)

    def written_as_of(self, block: int, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per slot of ``block``, the write of the token it holds after global step ``step``:
        ``(at, iteration, confidence, kind)`` shaped like `written_at`, `written_iter`,
        `written_conf`, `written_kind` (-1 / NaN / ``""`` for a slot holding no written token).

        For a block that was never revised these are those arrays themselves when ``step`` is
        at or after the block's last step, else masked to the writes up to ``step``.

        Raises:
            KeyError: for a block with no steps in the trace.
        """
        at_end = self.written_at[block]
        if block not in self.revised:
            if step >= self.steps_of[block][-1]:
                return at_end, self.written_iter[block], self.written_conf[block], self.written_kind[block]
            keep = (at_end >= 0) & (at_end <= step)
            return (np.where(keep, at_end, -1), np.where(keep, self.written_iter[block], -1),
                    np.where(keep, self.written_conf[block], np.nan),
                    np.where(keep, self.written_kind[block], "").astype(object))
        L = len(at_end)
        at = np.full(L, -1, dtype=np.int64)
        it = np.full(L, -1, dtype=np.int64)
        conf = np.full(L, np.nan, dtype=np.float64)
        kind = np.full(L, "", dtype=object)
        for r, i in enumerate(self.steps_of[block]):
            if i > step:
                break
            ev = self.steps[i]
            gone = _rev(ev, "remasked")
            at[gone], it[gone], conf[gone], kind[gone] = -1, -1, np.nan, ""
            for name, mask in zip(WRITE_KINDS, (ev.accepted, ev.forced, ev.eos_filled)):
                m = np.asarray(mask, dtype=bool)
                at[m], it[m], kind[m] = i, r, name
                conf[m] = np.asarray(ev.confidence, dtype=np.float64)[m] if name != "eos" else np.nan
        return at, it, conf, kind

    def slot_states(self, step: int) -> np.ndarray:
        """(L,) str: the state of each slot of step ``step``'s block after that step
        (``0 <= step < n``; names in the module docstring). In a revised block a rewritten
        slot has the kind of its new write (``accepted`` / ``forced``; `rewritten_at` tells
        it apart) and a remasked one is ``masked``."""
        b = int(self.block_of[step])
        if b in self.revised:
            at, _, _, kind = self.written_as_of(b, step)
        else:
            at = self.written_at[b]
            kind = self.written_kind[b]
        out = np.full(len(at), "masked", dtype=object)
        earlier = (at >= 0) & (at < step)
        now = at == step
        out[earlier] = "earlier"
        out[now] = kind[now]
        out[self.prefilled(b, len(at))] = "prompt"
        return out.astype(str)

    def rewritten_at(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What global step ``step`` revised: ``(rewritten, remasked, previous_tokens)``,
        (L,) bool, (L,) bool and (L,) int64 (-1 where neither), as recorded in its
        `clover_engine.recording.events.StepEvent` (all False / -1 for accept-once decoders)."""
        ev = self.steps[step]
        return _rev(ev, "rewritten"), _rev(ev, "remasked"), _rev(ev, "previous_tokens")

    def confidence_rows(self, block: int) -> np.ndarray:
        """(R, L) float64: the recorded confidence of every slot at each of the block's R
        iterations (NaN where the slot was not masked before that forward).

        Raises:
            ValueError: for a block with no steps in the trace.
        """
        self._check_block(block)
        rows = self.steps_of[block]
        z = np.full((len(rows), len(self.steps[rows[0]].tokens)), np.nan)
        for r, i in enumerate(rows):
            z[r] = np.asarray(self.steps[i].confidence, dtype=np.float64)
        return z

    def writes(self, block: int) -> dict[str, tuple[list[int], list[int]]]:
        """Every write of the block by kind: ``{kind: (slots, iterations)}`` for each of
        `WRITE_KINDS`, in iteration order then slot order (a slot written twice appears
        twice, unlike ``written_at``).

        Raises:
            ValueError: for a block with no steps in the trace.
        """
        self._check_block(block)
        out: dict[str, tuple[list[int], list[int]]] = {k: ([], []) for k in WRITE_KINDS}
        for r, i in enumerate(self.steps_of[block]):
            ev = self.steps[i]
            for name, m in zip(WRITE_KINDS, (ev.accepted, ev.forced, ev.eos_filled)):
                for s in np.flatnonzero(np.asarray(m, dtype=bool)).tolist():
                    out[name][0].append(s)
                    out[name][1].append(r)
        return out

    def _check_block(self, block: int) -> None:
        if block not in self.steps_of:
            raise ValueError(f"block {block} has no steps in this trace (blocks: {sorted(self.steps_of)})")


def _rev(ev: Any, name: str) -> np.ndarray:
    """A revision field of a step (``rewritten`` / ``remasked`` / ``previous_tokens``), as an
    array; the "nothing rewritten" default for an event object that lacks it."""
    value = getattr(ev, name, None)
    L = len(ev.tokens)
    if value is None:
        return np.full(L, -1, dtype=np.int64) if name == "previous_tokens" else np.zeros(L, dtype=bool)
    return np.asarray(value, dtype=np.int64 if name == "previous_tokens" else bool)


__all__ = ["WRITE_KINDS", "SlotIndex"]
