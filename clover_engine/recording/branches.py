"""A decode and its branches: `BranchTree`, the record the explorer's branch list draws and saves.

A branch (`clover_engine.decoding.branch`, `BlockDecoder.branch`) is itself a whole `Trace` whose
``meta["branch"]`` says where it left its parent and what it changed. A `BranchTree` keeps the
original decode (node 0) and every branch with its parent's node id, answers the comparison's
questions (each branch's change, NFE, tokens per forward, forced fills, and where its answer first
differs from its parent's), and saves the whole tree in one trace file.

On disk the tree is the original's trace file (Parquet or Arrow IPC, `clover_engine.recording.trace_files`)
with two more schema-metadata entries: ``clover.branches`` (JSON: ``[{"id", "parent"}, ...]``) and,
per branch, ``clover.branch.<id>`` (the branch's own trace table as an Arrow IPC stream, base64).
`Trace.load` reads such a file as the original alone, so every reader of traces keeps working;
`BranchTree.load` reads the branches too.

Wing: ``recording`` (imports no backbone and no decoder).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from clover_engine.recording.trace import Trace
from clover_engine.recording.trace_files import read_table, write_table

_INDEX_KEY = b"clover.branches"
_BRANCH_KEY = "clover.branch.{}"


def first_difference(a, b) -> int | None:
    """Index of the first generated token where two answers differ (a shorter answer that is a prefix of
    the other differs at its end); None when they are equal. a, b: sequences of token ids."""
    a, b = [int(t) for t in a], [int(t) for t in b]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def branch_label(meta: dict | None) -> str:
    """One line saying what a branch changed, from its ``meta["branch"]`` record (None: ``"original"``),
    e.g. ``"b0 s2: slot 5 ' Paris' -> ' Rome'; threshold 0.95 -> 0.8"``."""
    if not meta:
        return "original"
    parts = []
    for e in meta.get("edits", []):
        if e.get("token") is None:
            parts.append(f"slot {e['slot']} {e.get('previous_text', '')!r} re-masked")
        else:
            parts.append(f"slot {e['slot']} {e.get('previous_text', '')!r} -> {e.get('text', '')!r}")
    for k, (old, new) in (meta.get("settings") or {}).items():
        parts.append(f"{k} {old} -> {new}")
    return f"b{meta.get('block_index')} s{meta.get('step_index')}: " + ("; ".join(parts) or "no change")


@dataclass
class BranchNode:
    """One decode of the tree: ``id`` (0 = the original), ``parent`` (None for the original) and its trace."""

    id: int
    parent: int | None
    trace: Trace


class BranchTree:
    """The original decode (node 0) and its branches, each with its parent.

    Args:
        root: the original decode's `Trace`.
    """

    def __init__(self, root: Trace):
        if not isinstance(root, Trace):
            raise TypeError(f"root must be a Trace, got {type(root).__name__}")
        self.nodes: dict[int, BranchNode] = {0: BranchNode(0, None, root)}

    @property
    def root(self) -> Trace:
        """The original decode's trace."""
        return self.nodes[0].trace

    def add(self, trace: Trace, parent: int) -> int:
        """Add a branch of node ``parent`` and return its id.

        Raises:
            KeyError: no node ``parent``.
            ValueError: ``trace`` records no ``meta["branch"]`` (it is not a branch).
        """
        if parent not in self.nodes:
            raise KeyError(f"no node {parent} in this tree (nodes {sorted(self.nodes)})")
        if not trace.meta.get("branch"):
            raise ValueError("this trace is not a branch (no meta['branch']); make one with BlockDecoder.branch")
        new = max(self.nodes) + 1
        self.nodes[new] = BranchNode(new, parent, trace)
        return new

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, node: int) -> Trace:
        return self.nodes[node].trace

    def children(self, node: int) -> list[int]:
        """Ids of the branches made from ``node``, oldest first."""
        return [n.id for n in self.nodes.values() if n.parent == node]

    def depth(self, node: int) -> int:
        """Branches between ``node`` and the original (0 for the original)."""
        d = 0
        while self.nodes[node].parent is not None:
            node, d = self.nodes[node].parent, d + 1
        return d

    def rows(self) -> list[dict[str, Any]]:
        """One dict per node, in tree order (each branch after its parent): ``id``, ``parent``, ``depth``,
        ``label`` (`branch_label`), ``nfe``, ``n_tokens``, ``tokens_per_forward``, ``n_forced``, ``text`` (the
        answer, from the trace's vocabulary), ``first_difference`` (index of the first answer token that
        differs from the parent's answer; None for the original or an identical answer) and
        ``first_difference_position`` (its absolute position: prompt length + index)."""
        out = []

        def visit(node: int) -> None:
            n = self.nodes[node]
            summ = n.trace.summary()
            tokens = n.trace.generated_tokens
            diff = None
            if n.parent is not None:
                diff = first_difference(self.nodes[n.parent].trace.generated_tokens, tokens)
            P = len(n.trace.prompt_ids or [])
            out.append({
                "id": node, "parent": n.parent, "depth": self.depth(node),
                "label": branch_label(n.trace.meta.get("branch")), "nfe": summ["nfe"], "n_tokens": summ["n_tokens"],
                "tokens_per_forward": summ["tokens_per_forward"], "n_forced": summ["n_forced"],
                "text": "".join(n.trace.token_str(t) for t in tokens),
                "first_difference": diff, "first_difference_position": None if diff is None else P + diff,
            })
            for child in self.children(node):
                visit(child)

        visit(0)
        return out

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path, format: str | None = None) -> Path:
        """Write the tree to one trace file (the original's, with the branches in its metadata; module
        docstring) and return the path. ``format`` and errors as `clover_engine.recording.trace_files.write_table`."""
        table = self.root.to_arrow()
        meta = dict(table.schema.metadata or {})
        index = [{"id": n.id, "parent": n.parent} for n in self.nodes.values() if n.id != 0]
        meta[_INDEX_KEY] = json.dumps(index).encode()
        for n in self.nodes.values():
            if n.id == 0:
                continue
            sink = pa.BufferOutputStream()
            branch_table = n.trace.to_arrow()
            with pa.ipc.new_stream(sink, branch_table.schema) as writer:
                writer.write_table(branch_table)
            meta[_BRANCH_KEY.format(n.id).encode()] = base64.b64encode(sink.getvalue().to_pybytes())
        return write_table(table.replace_schema_metadata(meta), path, format)

    @classmethod
    def load(cls, path: str | Path) -> "BranchTree":
        """Read a tree written by `save`; a plain trace file gives a tree of one node.

        Raises:
            FileNotFoundError, ValueError: as `Trace.load`; ValueError also for a branch entry that
                cannot be read (the message names it).
        """
        source = str(Path(path))
        table = read_table(path)
        tree = cls(Trace._from_arrow(table, source=source))
        meta = table.schema.metadata or {}
        if _INDEX_KEY not in meta:
            return tree
        try:
            index = json.loads(meta[_INDEX_KEY])
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}: the branch index is not valid JSON ({exc}); re-save the branches") from exc
        for entry in index:
            key = _BRANCH_KEY.format(entry["id"]).encode()
            try:
                raw = base64.b64decode(meta[key])
                branch_table = pa.ipc.open_stream(pa.py_buffer(raw)).read_all()
            except (KeyError, ValueError, pa.ArrowInvalid) as exc:
                raise ValueError(f"{source}: branch {entry['id']} cannot be read ({exc}); re-save the branches") from exc
            trace = Trace._from_arrow(branch_table, source=f"{source} branch {entry['id']}")
            tree.nodes[int(entry["id"])] = BranchNode(int(entry["id"]), entry["parent"], trace)
        return tree
