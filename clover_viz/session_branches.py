"""Branching the run on display: a slot's candidates at a step, a branch decoded live, the session's
tree of branches, which branch is shown and which two runs the comparison sets side by side.

Wing: front ends (`clover_viz`), under `clover_viz.state`. `SessionBranches` is a mixin of
`clover_viz.state.ExplorerState` (its `branch_version` parameter is declared there, and the decode
worker it starts a branch on is the state's `_start_run`, the one Generate uses):

* `slot_candidates` -- what a slot held at a step and the tokens it could have taken: the step's
  top-K for a slot still masked, the top-K of the step that wrote it for a written one
  (`SlotCandidates`);
* `branch` (``Branch`` of `clover_engine.decoding.branch`) and its shortcuts `branch_choose`,
  `branch_remask`, `branch_settings` -- ``BlockDecoder.branch`` of the shown run in the decode
  worker: the live views draw it as a decode (the parent's steps up to the branch point first), one
  decode per session, Stop and a new Generate cancel it; an engine refusal is shown as an error and
  the runs on display stay;
* `branches` -- the session's `clover_engine.recording.branches.BranchTree`: the run a first branch was made
  from is its original (node 0), every branch attaches to the run it was made from; `branch_rows`,
  `show_branch`;
* `compare_pick` -- which two runs `ExplorerState.comparison` compares (default: previous vs this
  run); `comparison_labels` names them.

The tree is saved and opened with the trace (`clover_viz.session_traces`).

Tests: ``.venv/bin/python -m pytest tests/clover_viz/test_branching.py -q``
"""

from __future__ import annotations

import ast
import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import param

from clover_viz import colors as C
from clover_viz.runs import RUN_LABELS
from clover_viz.session_settings import OFFICIAL_SAMPLERS
from clover_engine.decoding import decoder_for  # imports the decoder it picks only when called
from clover_engine.decoding.branch import Branch, parent_config
from clover_engine.recording.branches import BranchTree
from clover_engine.recording.trace import Trace

PREVIOUS, CURRENT = "previous", "this run"  # the comparison's default picks (`RUN_LABELS`)
PICK_LABELS = {PREVIOUS: "previous run", CURRENT: "this run (shown)"}  # how the pickers name those two
BUSY = "a decode is running (or a model loading): wait for it to end, or Stop it, then branch"


@dataclass
class SlotCandidates:
    """One slot of the block view at one step, and what a branch there can do.

    Attributes:
        step: the global step (0-based) the block view shows; the branch applies after it.
        block_index, step_index: that step's block and its iteration in the block (0-based): the
            `Branch` point.
        slot, position: the slot in its block (0-based) and its absolute position.
        state: the slot's state after the step (`clover_viz.figures.slot_states`: ``masked``,
            ``prompt``, ``earlier``, ``accepted``, ``forced``, ``eos``).
        token, token_text: the token it holds after the step (None while masked).
        written_step: the global step that wrote it (None: masked or prompt).
        source_step: the global step whose forward the candidates come from (None: a prompt slot).
        candidates: ``[{"token", "text", "prob"}, ...]`` best first.
        can_choose, can_remask: whether a token can be chosen / the slot re-masked there.
        block_finished: the step is its block's last (the block is history for later blocks).
        note: one line for the user (why an action is not offered, or what a branch here does).
    """

    step: int
    block_index: int
    step_index: int
    slot: int
    position: int
    state: str
    token: int | None = None
    token_text: str = ""
    written_step: int | None = None
    source_step: int | None = None
    candidates: list[dict[str, Any]] = field(default_factory=list)
    can_choose: bool = False
    can_remask: bool = False
    block_finished: bool = False
    note: str = ""


def slot_candidates(trace: Trace, step: int, slot: int | None = None, position: int | None = None) -> SlotCandidates:
    """The candidates of a slot of ``trace`` after global step ``step`` (`SlotCandidates`).

    Give ``slot`` (in the block of ``step``) or ``position`` (an absolute position: a slot of an
    earlier, finished block is read after that block's last step -- where a branch must re-mask it).

    Raises:
        ValueError: an empty trace, a step, slot or position outside it (the message gives the range).
    """
    n = len(trace)
    if n == 0:
        raise ValueError("there is no step to branch from yet: decode first")
    if not -n <= int(step) < n:
        raise ValueError(f"step {step} is outside this run (steps 0..{n - 1})")
    i = int(step) % n
    idx = trace.slot_index()
    if position is not None:
        starts = {b.block_index: b for b in trace.block_starts}
        b_now = int(idx.block_of[i])
        hit = [b for b, st in starts.items() if b <= b_now and st.position_start <= position < st.position_start + st.length]
        if not hit:
            first = min(starts.values(), key=lambda s: s.position_start).position_start if starts else 0
            last = starts[b_now].position_start + starts[b_now].length - 1 if b_now in starts else first
            raise ValueError(f"position {position} is not in a block decoded by step {i} (positions {first}..{last})")
        b = hit[0]
        slot = int(position) - int(starts[b].position_start)
        if b != b_now:
            i = idx.last_step(b)
    if slot is None:
        raise ValueError("give a slot (in the block of the step) or a position")
    ev = idx.steps[i]
    b, L = int(idx.block_of[i]), len(ev.tokens)
    if not 0 <= int(slot) < L:
        raise ValueError(f"slot {slot} is outside block {b} (slots 0..{L - 1})")
    slot = int(slot)
    state = str(idx.slot_states(i)[slot])
    at = idx.written_as_of(b, i)[0]
    out = SlotCandidates(step=i, block_index=b, step_index=int(ev.step_index), slot=slot,
                         position=int(ev.position_start) + slot, state=state,
                         block_finished=i == idx.last_step(b))
    if state == "prompt":
        out.token, out.token_text = int(ev.tokens[slot]), trace.token_str(int(ev.tokens[slot]))
        out.note = "a prompt token: pre-filled, never decoded, so it cannot be chosen or re-masked"
        return out
    if state == "masked":
        out.source_step = i
        out.can_choose = True
        out.note = f"still masked after step {i + 1}: choosing writes it there (forced), and the decode goes on"
    else:
        out.token = int(ev.tokens[slot])
        out.token_text = trace.token_str(out.token)
        out.written_step = out.source_step = int(at[slot])
        out.can_choose = out.can_remask = True
        when = "this step" if out.written_step == i else f"step {out.written_step + 1}"
        later = out.block_finished and b < int(idx.block_of[-1])
        out.note = (f"written at {when}: choosing another token rewrites it after step {i + 1}, re-masking lets "
                    "the rule decode it again" + ("; its block is finished, so the branch decodes every later "
                                                    "block again" if later else ""))
    src = idx.steps[out.source_step]
    for t, p in zip(np.asarray(src.top_tokens[slot]).tolist(), np.asarray(src.top_probs[slot]).tolist()):
        if t >= 0 and p == p:
            out.candidates.append({"token": int(t), "text": trace.token_str(int(t)), "prob": float(p)})
    return out


def candidate_label(c: dict[str, Any], current: int | None = None) -> str:
    """How a candidate is listed: ``␣the  0.412  (id 262)`` (`clover_viz.colors.token_label`), ``◀ holds`` on
    the token the slot holds."""
    return (f"{C.token_label(c['text'], 16)}  {c['prob']:.3f}  (id {c['token']})"
            + ("  ◀ holds" if c["token"] == current else ""))


class SessionBranches:
    """The branching half of `ExplorerState` (a mixin; `branch_version` is declared there)."""

    branches: BranchTree | None = None  # the session's tree (None until the first branch or a tree is opened)
    _compare: tuple[Any, Any] | None = None  # `compare_pick`; None: previous vs this run

    # ------------------------------------------------------------------ a slot's candidates
    def slot_candidates(self, step: int | None = None, slot: int | None = None,
                        position: int | None = None) -> SlotCandidates:
        """`slot_candidates` of the run on display at ``step`` (default: the playback `position`).

        Raises:
            ValueError: no run, or a step / slot / position outside it.
        """
        if self.trace is None:
            raise ValueError(f"there is no run to branch from yet: {self.generate_button} first")
        return slot_candidates(self.trace, self.position if step is None else step, slot, position)

    def token_id(self, entry: Any) -> int:
        """A token typed by the user: an id (``262``) or one token's text (``' the'`` quoted, or bare)
        in the loaded model's tokenizer.

        Raises:
            ValueError: empty, or text that is not exactly one token (the message lists its tokens).
        """
        if isinstance(entry, (int, np.integer)):
            return int(entry)
        text = str(entry or "")
        if not text.strip():
            raise ValueError("type a token id (e.g. 262) or one token's text")
        if text.strip().lstrip("-").isdigit():
            return int(text.strip())
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            try:
                text = str(ast.literal_eval(text))
            except (ValueError, SyntaxError):
                pass
        loaded = self._loaded
        if loaded is None or loaded.tokenizer is None:
            raise ValueError(f"no tokenizer loaded to read {text!r}: type the token's id instead")
        ids = list(loaded.tokenizer.encode(text, add_special_tokens=False).ids)
        if len(ids) != 1:
            parts = ", ".join(f"{loaded.tokenizer.decode([t], skip_special_tokens=False)!r} (id {t})" for t in ids)
            raise ValueError(f"{text!r} is {len(ids)} tokens for this tokenizer ({parts or 'none'}); "
                             "choose one token, or type its id")
        return int(ids[0])

    # ------------------------------------------------------------------ branching
    def branch_choose(self, step: int, slot: int, token: Any) -> bool:
        """Branch the shown run with ``token`` (an id, or text for `token_id`) written at ``slot`` after
        global ``step`` (`branch`)."""
        if self.running or self.loading:
            return self._refuse_branch(BUSY)
        try:
            c = self.slot_candidates(step, slot)
            tok = self.token_id(token)
        except ValueError as exc:
            return self._refuse_branch(str(exc))
        if not c.can_choose:
            return self._refuse_branch(f"slot {c.slot} of block {c.block_index}: {c.note}")
        return self.branch(Branch.choose(c.block_index, c.step_index, c.slot, tok))

    def branch_remask(self, step: int, slot: int | None = None, position: int | None = None) -> bool:
        """Branch the shown run with a written slot re-masked after global ``step`` (a ``position`` in an
        earlier, finished block: after that block's last step)."""
        if self.running or self.loading:
            return self._refuse_branch(BUSY)
        try:
            c = self.slot_candidates(step, slot, position)
        except ValueError as exc:
            return self._refuse_branch(str(exc))
        if not c.can_remask:
            return self._refuse_branch(f"slot {c.slot} of block {c.block_index}: " + (
                c.note if c.state == "prompt" else f"still masked after step {c.step + 1}, so there is nothing to "
                "re-mask; choose a token for it"))
        return self.branch(Branch.remask(c.block_index, c.step_index, c.slot))

    def branch_settings(self, step: int | None = None, **overrides: Any) -> bool:
        """Branch the shown run after global ``step`` (default: the playback `position`) with the
        current settings (`decode_config`: threshold, block size, policy, memory ...) from there on,
        ``overrides`` replacing fields of them (``threshold=0.8``: the app's sidebar re-decodes the whole
        prompt when its threshold or block size moves, so the slot panel passes its own)."""
        if self.running or self.loading:
            return self._refuse_branch(BUSY)
        if self.trace is None or len(self.trace) == 0:
            return self._refuse_branch(f"there is no run to branch from yet: {self.generate_button} first")
        n = len(self.trace)
        i = self.position if step is None else int(step)
        if not 0 <= i < n:
            return self._refuse_branch(f"step {i} is outside this run (steps 0..{n - 1})")
        ev = self.trace.step(i)
        if self.policy in OFFICIAL_SAMPLERS or (self.trace.decode_config or {}).get("sampler"):
            name = (self.trace.decode_config or {}).get("sampler") or self.policy
            return self._refuse_branch(f"a branch re-decodes with the block decoder; the {name} sampler's runs "
                                       "are not branched -- decode with a slot policy to branch")
        try:
            dc = dataclasses.replace(self.decode_config(), **overrides)
        except (ValueError, TypeError) as exc:
            return self._refuse_branch(str(exc))
        return self.branch(Branch(int(ev.block_index), int(ev.step_index), config=dc))

    def branch(self, at: Branch, parent: Trace | int | None = None) -> bool:
        """Decode a branch of a run in the decode worker, drawn live like a decode.

        ``explorer.state.branch(Branch.choose(0, 2, 5, 262))`` writes token 262 at slot 5 of block 0
        after that block's step 2 (0-based) and decodes on from there; ``Branch.remask(b, s, slot)``
        re-masks a written slot; ``Branch(b, s, config=DecodeConfig(...))`` changes the settings from
        that step on (`clover_engine.decoding.branch`). Then `wait` (a script) or `tick` (a front end) as for
        `generate`. The branch joins `branches` under ``parent`` when it ends (stopped or not).

        Args:
            at: the `clover_engine.decoding.branch.Branch`.
            parent: the run to branch (a `Trace`, or a node id of `branches`; default: the run on display).

        Returns False with `error` set (the runs on display unchanged) when it cannot start: a decode
        running, no run, no model, a sampler that cannot branch. The engine's own refusals (a slot
        still masked, a token the tokenizer cannot write, a trace of another model, verify mode ...)
        come from the worker the same way: `error` says why and the runs on display come back.
        """
        if self._closed:
            return False
        if not isinstance(at, Branch):
            return self._refuse_branch(f"expected an clover_engine.decoding.branch.Branch, got {type(at).__name__}")
        if self.running or self.loading:
            return self._refuse_branch(BUSY)
        if isinstance(parent, int):
            if self.branches is None or parent not in self.branches.nodes:
                return self._refuse_branch(f"there is no branch #{parent} in this session")
            parent = self.branches[parent]
        source = self.trace if parent is None else parent
        if source is None or len(source) == 0:
            return self._refuse_branch(f"there is no run to branch from yet: {self.generate_button} first")
        loaded = self.load_model(adjust_mode=False)
        if loaded is None:
            return False
        try:
            dc = at.config or parent_config(source)
            decoder = loaded.decoder or decoder_for(loaded.model, loaded.tokenizer, dc)
        except (ValueError, TypeError) as exc:
            return self._refuse_branch(str(exc))
        if not hasattr(decoder, "branch"):
            return self._refuse_branch(f"{loaded.label} decodes with {type(decoder).__name__}, which cannot resume "
                                       "a recorded decode")
        self.error = ""
        tok = loaded.tokenizer
        meta = {k: v for k, v in source.meta.items() if k != "branch"}
        live = Trace(decode_config=dc.to_dict(), model_id=source.model_id,
                     token_text=(lambda i: tok.decode([i], skip_special_tokens=False)) if tok is not None else None,
                     prompt_ids=source.prompt_ids, meta=meta)
        live.vocab = dict(source.vocab)

        def decode(hook: Any, cancel: threading.Event) -> Any:
            result = decoder.branch(source, at, hooks=[hook], cancel=cancel)
            return ("branched", source, result.trace.meta.get("branch"))

        where = f"block {at.block_index}, after iteration {at.step_index + 1}"
        self._start_run(live, decode, dc.max_new_tokens, f"branching at {where}: replaying the run up to there, "
                        "then decoding on", previous=source, kind="branch")
        return True

    def _refuse_branch(self, why: str) -> bool:
        """A branch that did not start: `error` says why; the runs on display stay."""
        self.error = f"Not branched: {why}"
        if not self.running:
            self.status = "not branched: see the error (the run on display is unchanged)"
        return False

    def _on_result(self, payload: Any) -> None:
        """The worker's result on the UI thread: a finished branch joins the tree under its parent."""
        if not (isinstance(payload, tuple) and payload and payload[0] == "branched"):
            return
        _, parent, meta = payload
        live = self.trace
        if live is None or not meta:
            return
        live.meta["branch"] = meta
        node = self._node_of(parent)
        if node is None:  # a first branch of this run: it becomes the original of a new tree
            self.branches, self._compare, node = BranchTree(parent), None, 0
        new = self.branches.add(live, node)
        self.status = f"branch #{new} ({meta.get('label', '')}) " + self.status
        self.branch_version += 1

    # ------------------------------------------------------------------ the tree
    def _node_of(self, trace: Any) -> int | None:
        """The node id of ``trace`` (the object itself) in `branches`, else None."""
        if self.branches is None or trace is None:
            return None
        return next((n.id for n in self.branches.nodes.values() if n.trace is trace), None)

    @property
    def shown_node(self) -> int | None:
        """The node of `branches` on display (None: the run shown is not in the tree)."""
        return self._node_of(self.trace)

    def branch_rows(self) -> list[dict[str, Any]]:
        """`BranchTree.rows` of `branches` (empty without a tree) plus ``shown`` (the node on display),
        ``tokens`` (the answer's token texts) and ``name`` (``#2``; ``#0 original``)."""
        if self.branches is None:
            return []
        shown = self.shown_node
        rows = self.branches.rows()
        for r in rows:
            t = self.branches[r["id"]]
            r["shown"] = r["id"] == shown
            r["tokens"] = [t.token_str(int(x)) for x in t.generated_tokens]
            r["name"] = f"#{r['id']}" + (" original" if r["id"] == 0 else "")
        return rows

    def show_branch(self, node: int) -> bool:
        """Show node ``node`` of `branches` in every view (its parent becomes `previous`, so the default
        comparison is the branch against the run it was made from). Returns False with `error` set for
        an unknown node or while a decode runs."""
        if self.branches is None or node not in self.branches.nodes:
            self.error = f"No branch #{node} in this session."
            return False
        if self.running:
            self.error = "A decode is running: wait for it to end (or Stop it) before showing another branch."
            return False
        t = self.branches[node]
        if t is self.trace:
            return True
        parent = self.branches.nodes[node].parent
        self.error = ""
        with param.parameterized.batch_call_watchers(self):
            self.previous = self.branches[parent] if parent is not None else self.trace
            self.trace = t
            self.playing = False
            self.n_steps = len(t)
            self.position = max(len(t) - 1, 0)
            self.progress = 100
            self.trace_version += 1
            label = (t.meta.get("branch") or {}).get("label", "original")
            self.status = (f"showing #{node} ({label})" + (f"; previous = its parent #{parent}" if parent is not None
                                                            else "") + "; press play to replay")
            self.branch_version += 1
        return True

    def _set_tree(self, tree: BranchTree | None) -> None:
        """Make ``tree`` the session's (an opened file's); the comparison goes back to previous vs this run."""
        self.branches, self._compare = tree, None
        self.branch_version += 1

    # ------------------------------------------------------------------ the comparison's two runs
    def compare_pick(self, a: Any = PREVIOUS, b: Any = CURRENT) -> bool:
        """Compare runs ``a`` and ``b``: ``"previous"``, ``"this run"`` or a node id of `branches`
        (`ExplorerState.comparison` then compares them; the default pair is previous vs this run).
        Returns False with `error` set for an unknown run."""
        for key in (a, b):
            if key in (PREVIOUS, CURRENT):
                continue
            if self.branches is None or not isinstance(key, (int, np.integer)) or int(key) not in self.branches.nodes:
                self.error = f"Nothing to compare: no run {key!r} in this session (previous, this run or #0..)."
                return False
        self._compare = None if (a, b) == (PREVIOUS, CURRENT) else (a, b)
        self.branch_version += 1
        return True

    def _run_of(self, key: Any) -> Any:
        if key == PREVIOUS:
            return self.previous
        if key == CURRENT:
            return self.trace
        return self.branches[int(key)] if self.branches is not None and int(key) in self.branches.nodes else None

    def compared_runs(self) -> tuple[Any, Any]:
        """The two traces the comparison shows: `compare_pick`'s, else (`previous`, `trace`)."""
        a, b = self._compare or (PREVIOUS, CURRENT)
        return self._run_of(a), self._run_of(b)

    def comparison_labels(self) -> tuple[str, str]:
        """What the comparison calls its two runs: `clover_viz.runs.RUN_LABELS`, or ``#k`` for branches."""
        if self._compare is None:
            return RUN_LABELS
        return tuple(k if k in (PREVIOUS, CURRENT) else f"#{k}" + (" original" if k == 0 else "")
                     for k in self._compare)


__all__ = ["CURRENT", "PICK_LABELS", "PREVIOUS", "SessionBranches", "SlotCandidates", "candidate_label", "slot_candidates"]
