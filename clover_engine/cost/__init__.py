"""Cost model: bytes read and FLOPs of one forward, rooflines, projected tokens/s.

Decoding one request is bound by the bytes read from device memory: every forward streams
the weights it touches once; block diffusion spends each byte on several tokens, and MoE
routing of a whole block widens the set of experts read. Formulas and sources:
docs/architecture.md §7.

Modules::

    clover_engine.cost.components  ForwardCost and its component names (what every family's formulas build)
    clover_engine.cost.formulas    forward_cost (formulas picked by the model's cost family, `cost_family`),
                            parameter counts, expert-union arithmetic (Clover)
    clover_engine.cost.dense       dense_forward_cost (a transformer with a KV cache), recompute_forward_cost
                            (masked diffusion, no cache)
    clover_engine.cost.drafter     a block drafter's forward, the fuse of the base's features and a verify
                            round (drafter + base verification forward), from the drafter's config
    clover_engine.cost.meter       CostMeter: a decode's forwards priced as the decoder reports them
    clover_engine.cost.devices     Device table (datasheets), this machine measured, roofline
    clover_engine.cost.projection  forwards projected onto a device (tokens/s by the roofline), and the
                            target model's expert union under an assumption (target_union)
    clover_engine.cost.trace_projection  recorded runs projected onto a device and a target model, the
                            whole run and its decode phase (project_trace)
    clover_engine.cost.parallel    one forward split over GPUs (project_parallel, ``--parallel ep=N[,tp=N]``)
    clover_engine.cost.per_step    a trace's per-forward cost series and roofline points (for the views)
    clover_engine.cost.break_even  the measured break-even: tokens per forward block decoding needs to
                            match autoregressive decoding on this machine (``--break-even``)
    clover_engine.cost.cli         text reports; ``python -m clover_engine.cost``

Wing: ``cost``.

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_cost.py -q``
"""

from clover_engine.cost.break_even import BreakEven, format_break_even, measure_break_even
from clover_engine.cost.cli import format_breakdown, format_devices, format_forward_report, format_si, main
from clover_engine.cost.dense import dense_forward_cost, dense_param_counts
from clover_engine.cost.drafter import (VerifyRoundCost, drafter_forward_cost, drafter_param_counts, verify_round_cost,
                                 verify_trace_costs)
from clover_engine.cost.devices import (DEFAULT_DEVICE, DEVICES, Device, get_device, measure_this_machine, ridge_point,
                                 roofline_time_s)
from clover_engine.cost.formulas import (COMPONENTS, DENSE_COMPONENTS, DENSE_WEIGHT_COMPONENTS, MEMORY_MODES,
                                  NORM_FLOPS_PER_ELEMENT, STATE_BYTES, UNION_ASSUMPTIONS, WEIGHT_COMPONENTS,
                                  ForwardCost, active_params_per_token, ar_step_cost, cost_family, expected_union,
                                  forced_fill_probability, forced_fill_table, forward_cost, param_counts,
                                  union_for_bytes_ratio)
from clover_engine.cost.parallel import INTERCONNECT_BYTES_PER_S, ParallelForward, project_parallel, project_parallel_table
from clover_engine.cost.per_step import (WEIGHT_DTYPES, ProjectedForwards, ar_break_even_tokens_per_forward,
                                  ar_tokens_per_s, attainable_flops_per_s, bytes_per_written_token, dtype_name,
                                  project_forwards_roofline, recorded_weight_bytes,
                                  roofline_point, running_tokens_per_s)
from clover_engine.cost.projection import Projection, project_forwards, project_tokens_per_s, target_union
from clover_engine.cost.trace_projection import DecodePhase, TraceProjection, project_trace, prompt_forward_mask

__all__ = [
    "BreakEven", "format_break_even", "measure_break_even", "WEIGHT_DTYPES", "ar_break_even_tokens_per_forward",
    "dtype_name", "recorded_weight_bytes",
    "COMPONENTS", "DEFAULT_DEVICE", "INTERCONNECT_BYTES_PER_S", "ParallelForward", "project_parallel",
    "project_parallel_table", "DENSE_COMPONENTS", "DENSE_WEIGHT_COMPONENTS", "DEVICES", "MEMORY_MODES",
    "NORM_FLOPS_PER_ELEMENT", "STATE_BYTES", "UNION_ASSUMPTIONS", "WEIGHT_COMPONENTS", "Device", "ForwardCost",
    "DecodePhase", "ProjectedForwards", "Projection", "TraceProjection", "active_params_per_token", "ar_step_cost",
    "ar_tokens_per_s", "attainable_flops_per_s", "bytes_per_written_token", "dense_forward_cost",
    "dense_param_counts", "expected_union", "forced_fill_probability", "forced_fill_table", "format_breakdown",
    "format_devices", "format_forward_report", "format_si", "forward_cost", "get_device", "cost_family", "main",
    "measure_this_machine", "param_counts", "project_forwards", "project_forwards_roofline",
    "project_tokens_per_s", "project_trace", "prompt_forward_mask", "ridge_point", "roofline_point", "roofline_time_s",
    "running_tokens_per_s", "target_union", "union_for_bytes_ratio",
    "VerifyRoundCost", "drafter_forward_cost", "drafter_param_counts", "verify_round_cost", "verify_trace_costs",
]
