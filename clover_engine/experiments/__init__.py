"""Measurements behind the tutorial notebooks (``notebooks/01`` to ``04``). Wing ``experiments``.

Decode held-out agent tasks (`clover_engine.data.agent.eval_tasks`) in several decode settings on
the same prompts, keep what every forward wrote (`TaskRun`), and reduce the runs to the
numbers the notebooks draw and assert:

* `decode_tasks` -- each task in each setting, interleaved task by task (so a busy machine
  slows every setting alike and the tokens/s of the settings compare);
* `task_run_from_trace` -- the same `TaskRun` rebuilt from a saved trace (an `clover_engine.sweep`
  decode), with no decode;
* `summarize` -- exact match, field accuracy, tokens per forward, NFE, forced fills, tokens/s;
* `calibration` -- wrong share among written tokens by the confidence at which they were
  written;
* `slot_errors` -- error rate of the decoded answer by slot index (absolute position mod
  block_size); `distance_errors` -- of the writes by distance from the last clean token
  (`clean_distance`); `first_forward_errors` -- the same for the argmax of each block's first
  forward (every slot masked at once);
* `forced_fill_table` / `forced_fill_excess` / `independent_forced_fill` -- forced fills per
  iteration beside what independent slots would give, ``(1 - p) ** m``;
* `knee_index` -- the knee of a trade-off curve.

A decoded token is *right* when it is part of the best alignment of the decoded answer with
the target (`difflib.SequenceMatcher` matching blocks; the target is the ground-truth
completion ``<tool_call>{...}</tool_call><|im_end|>``, tokenized -- prompt and target
tokenize apart exactly, as `clover_engine.data.agent` writes them). Aligning, not comparing
position by position, keeps one dropped or doubled character from marking everything after
it wrong. A first-forward prediction (`first_forward_errors`) is compared position by
position, in blocks whose history is the target's. Everything but wall time is
deterministic: greedy decoding of fixed tasks.

Terms (docs/architecture.md §5): *iteration* = one forward of the current block; NFE =
forwards per answer; tokens per forward = generated tokens / NFE; *forced fill* = the
single most confident masked slot written because none reached the threshold.

Modules; the names of the first five are re-exported here, the notebooks' public API
(``from clover_engine import experiments as X``, then ``X.<name>``)::

    clover_engine.experiments.bundled       REPO_ROOT, bundled_model_dir, load_bundled
    clover_engine.experiments.tasks         TaskRun (KIND_* write codes), decode_task, decode_tasks, task_run_from_trace
    clover_engine.experiments.summary       summarize, knee_index
    clover_engine.experiments.errors        calibration, slot_errors, clean_distance, distance_errors,
                                     first_forward_errors, grouped_rate
    clover_engine.experiments.forced_fills  forced_fill_table, forced_fill_excess, independent_forced_fill
    clover_engine.experiments.chains        long tool-call chains (notebook 07; not re-exported)
    clover_engine.experiments.memory        constant memory in context length (notebook 06; not re-exported)

Tests: ``.venv/bin/python -m pytest tests/clover_engine/test_experiments.py -q``
"""

from clover_engine.experiments.bundled import REPO_ROOT, bundled_model_dir, load_bundled
from clover_engine.experiments.errors import (
    calibration,
    clean_distance,
    distance_errors,
    first_forward_errors,
    grouped_rate,
    slot_errors,
)
from clover_engine.experiments.forced_fills import forced_fill_excess, forced_fill_table, independent_forced_fill
from clover_engine.experiments.summary import knee_index, summarize
from clover_engine.experiments.tasks import (
    KIND_ACCEPTED,
    KIND_EOS,
    KIND_FORCED,
    TaskRun,
    decode_task,
    decode_tasks,
    task_run_from_trace,
)

__all__ = [
    "KIND_ACCEPTED", "KIND_EOS", "KIND_FORCED", "REPO_ROOT", "TaskRun", "bundled_model_dir", "calibration",
    "clean_distance", "decode_task", "decode_tasks", "distance_errors", "first_forward_errors", "forced_fill_excess",
    "forced_fill_table", "grouped_rate", "independent_forced_fill", "knee_index", "load_bundled", "slot_errors",
    "summarize", "task_run_from_trace",
]
