"""The cost of the run on display: its projection onto a device and the break-even measured here.

Wing: front ends (`clover_viz`), under `clover_viz.state`. `SessionCost` is a mixin of
`clover_viz.state.ExplorerState` (its `device`, `union_assumption` and `break_even`
parameters are declared there):

* `cost_projection` -- `clover_engine.cost.project_trace` of the displayed trace, priced by the cost
  family its recorded capabilities name;
* `measure_break_even` -- how many tokens per forward block decoding of the loaded model needs
  to match its autoregressive decoding on this machine (`clover_engine.cost.break_even`), kept per
  (model, block size, memory mode); `break_even_point` / `break_even_html` read it back;
* `verify_cost_html` -- for a verify run of a drafter, what one round costs: the drafter's forward
  beside the base's verification forward (`clover_engine.cost.drafter`), shown under the break-even line.

Tests: ``.venv/bin/python -m pytest tests/apps/test_cost_tab.py -q``
"""

from __future__ import annotations

from typing import Any

from clover_engine.backbones.base import cost_family_of
from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.cost import project_trace
from clover_engine.cost.break_even import measure_break_even
from clover_engine.cost.drafter import verify_trace_costs
from clover_engine.units import format_si


class SessionCost:
    """The cost half of `ExplorerState` (a mixin; the parameters are declared there)."""

    # ------------------------------------------------------------------ cost
    def cost_projection(self, device: str | None = None) -> Any:
        """`clover_engine.cost.project_trace` of the displayed trace on `device` (None when it has no steps).

        The source model's config comes from the trace's metadata (recorded by `generate`); it is
        priced as a Clover model only when its cost family is ``clover`` (the trace's recorded
        capabilities). Another family (a MoE or masked diffusion LM, a block-causal or causal LM) is
        priced by its own family's formulas with the expert union its router chose per forward
        (`clover_engine.cost.trace_projection`), and a MoE one's measured unions carry over to the 35B-A3B
        target as a Clover model's do. A model without experts has no unions to carry over: the target falls
        back to independent routing, and the projection says so in its ``union_assumption``.
        """
        if self.trace is None or len(self.trace) == 0:
            return None
        meta = self.trace.meta or {}
        cfg = meta.get("model_config")
        family = cost_family_of(meta.get("capabilities"), cfg if isinstance(cfg, dict) else None)
        source = CloverConfig.from_dict(cfg) if isinstance(cfg, dict) and family == "clover" else None
        mode = (self.trace.decode_config or {}).get("memory_mode", "state")
        window = source.attention_window if (source is not None and mode == "state+window") else 0
        return project_trace(self.trace, device or self.device, source_config=source,
                             union_assumption=self.union_assumption, memory_mode=mode, window=window,
                             fallback_union="independent")

    # ------------------------------------------------------------------ break-even
    def _break_even_key(self) -> tuple[str, int, str] | None:
        """(model id, block_size, memory mode) of the displayed run (else the settings) on the loaded model."""
        loaded = self._loaded
        if loaded is None:
            return None
        dc = (self.trace.decode_config or {}) if self.trace is not None else {}
        return (loaded.model_id, int(dc.get("block_size", self.block_size)),
                str(dc.get("memory_mode", self.memory_mode)))

    def break_even_point(self) -> Any:
        """The `clover_engine.cost.BreakEven` measured by `measure_break_even` for the loaded model at the
        displayed run's block_size and memory mode, or None if not measured yet."""
        key = self._break_even_key()
        return None if key is None else self.break_even.get(key)

    def break_even_html(self) -> str:
        """One HTML line for the views: the measured break-even (`break_even_point`) and what the
        displayed run's tokens per forward are worth against autoregressive decoding here, or a
        hint to measure it; for a verify run, `verify_cost_html` below it. A verify run (a drafter) is read
        against the verify break-even (`clover_engine.cost.BreakEven.verify_tokens_per_forward`: a round is the
        drafter's forward plus the base's over the block), its tokens per forward counting base forwards."""
        p = self.break_even_point()
        if p is None:
            return ("<span style='color:#64748b'>break-even on this machine: not measured -- "
                    "<i>Measure break-even here</i> times this model's AR step and block forward</span>"
                    + self.verify_cost_html())
        verify = self.trace is not None and (self.trace.decode_config or {}).get("policy") == "verify"
        text = f"break-even on this machine (measured, {p.device}, {p.threads} thread(s)): "
        if verify:  # a drafter's round: its forward plus the base's over the block (clover_engine.cost.break_even)
            text += (f"verify with blocks of {p.block_size} needs <b>{p.verify_tokens_per_forward:.2f}</b> tokens per "
                     f"base forward to match the base's autoregressive decoding (base step {p.t_ar_s * 1e3:.1f} ms; "
                     f"a round: drafter {p.t_block_s * 1e3:.1f} ms + base over the block {p.t_commit_s * 1e3:.1f} ms)")
        else:
            text += (f"block {p.block_size} needs <b>{p.tokens_per_forward:.2f}</b> tokens per forward to match "
                     f"autoregressive decoding (AR step {p.t_ar_s * 1e3:.1f} ms, block forward {p.t_block_s * 1e3:.1f} ms)")
        loaded = self._loaded
        same_model = loaded is not None and self.trace is not None and self.trace.model_id in (None, loaded.model_id)
        if same_model and len(self.trace):
            tpf = float(self.trace.summary()["tokens_per_forward"] or 0.0)
            if tpf > 0:
                x = p.verify_speedup(tpf) if verify else p.speedup(tpf)
                text += (f"; this run wrote {tpf:.2f} tokens per forward: <b>{x:.2f}x</b> the AR tokens/s "
                         f"here ({'faster' if x > 1 else 'slower'})")
        return f"<div style='font-size:13px;line-height:1.6'>{text}</div>" + self.verify_cost_html()

    def measure_break_even(self, repeats: int = 5, prefix_len: int = 256) -> Any:
        """Measure on this machine how many tokens per forward block decoding of the loaded model
        needs to match its autoregressive decoding (`clover_engine.cost.measure_break_even`), at the
        displayed run's block_size and memory mode (else the settings'), after a ``prefix_len``-token
        history; stores it in `break_even` and returns it. Takes a few forwards' time (SmolLM2-135M
        on one CPU thread: ~10 s; clover-tiny: well under a second).

        Returns None and sets `error` while a decode runs (the timings would measure both), for a
        model outside the decoder protocol (DiffusionGemma) or for settings it cannot run.
        """
        if self.running:
            self.error = "Break-even not measured: a decode is running; measure when it has ended (or Stop it)."
            return None
        loaded = self._loaded if self._loaded is not None and self._loaded.holds_weights else self.load_model()
        key = self._break_even_key()
        if loaded is None or key is None:
            return None
        _, block_size, mode = key
        status = self.status
        self.status = f"measuring the break-even of block {block_size} on this machine ..."
        try:
            point = measure_break_even(loaded.model, (block_size,), prefix_len=prefix_len, repeats=repeats,
                                       memory_mode=mode)[block_size]
        except (TypeError, ValueError, RuntimeError) as exc:
            self.error = f"Break-even not measured: {exc}"
            return None
        finally:
            self.status = status  # the run's own status line comes back
        if self.error.startswith("Break-even not measured"):
            self.error = ""  # an earlier refusal is stale now
        self.break_even = {**self.break_even, key: point}
        return point

    def verify_cost_html(self) -> str:
        """For a verify run on display (a drafter, `clover_engine.decoding.verify`): one HTML paragraph saying
        what a round costs by the cost model -- the drafter's forward (its layers, per-slot heads and
        draft-vocabulary LM head over the cached context, plus the fuse of the features of the tokens
        the base read) beside the base's causal forward over ``[anchor, drafts]`` -- as the mean over
        the rounds (the prefill left out) and for the round on display (`position`), bytes and FLOPs,
        with the drafter's share. The split is `clover_engine.cost.drafter.verify_trace_costs` of the trace, at
        the dtype its events were priced at; "" for any other run, or a verify run priced before the
        drafter was (the base alone: no split reproduces its bytes)."""
        costs = verify_trace_costs(self.trace) if self.trace is not None else None
        if not costs or len(costs) < 2:
            return ""
        n = len(costs)
        rounds = costs[1:]  # event 0 is the prefill (the base reads the prompt)
        mean = {k: sum(getattr(getattr(r, part), attr) for r in rounds) / len(rounds)
                for k, (part, attr) in {"db": ("drafter", "bytes_read"), "bb": ("base", "bytes_read"),
                                        "df": ("drafter", "flops"), "bf": ("base", "flops")}.items()}

        def pair(d: float, b: float, unit: str) -> str:
            share = d / (d + b) if d + b else 0.0
            return (f"drafter <b>{format_si(d, unit, digits=3)}</b> + base <b>{format_si(b, unit, digits=3)}"
                    f"</b> ({share:.0%} drafter)")

        pos = min(max(int(self.position), 0), n - 1)
        r = costs[pos]
        if pos == 0:
            here = (f"the prefill (forward 1): base {format_si(r.base.bytes_read, 'B', digits=3)} reading the "
                    f"prompt, drafter {format_si(r.drafter.bytes_read, 'B', digits=3)} fusing its features")
        else:
            here = (f"this round (forward {pos + 1} of {n}): bytes {pair(r.drafter.bytes_read, r.base.bytes_read, 'B')}"
                    f", FLOPs {pair(r.drafter.flops, r.base.flops, 'FLOP')}")
        text = (f"<b>verify rounds</b> ({n - 1}): each round is one drafter forward (its layers, per-slot heads "
                "and the draft-vocabulary LM head over the cached context, plus fusing the features of the "
                "tokens the base read) and one base forward over [anchor, drafts]. Mean per round: bytes "
                f"{pair(mean['db'], mean['bb'], 'B')}; FLOPs {pair(mean['df'], mean['bf'], 'FLOP')}. {here}. "
                "<span style='color:#64748b'>(the cost model at the run's dtype; the Cost chart's bars are each "
                "round's sum)</span>")
        return f"<div class='clover-verify-cost' style='font-size:13px;line-height:1.6'>{text}</div>"
