"""Sweeps (experiments wing): decode settings x task sets x models -> one results table, on one
machine or a Ray cluster -- the machinery behind ``python -m clover_engine.sweep``.

Three modules, one job each:

* `clover_engine.experiments.sweep.grid` -- task sets, model specs, settings grids and the cells they make;
* `clover_engine.experiments.sweep.runner` -- decoding and scoring a cell, the workers (in process, a
  process pool, Ray actors) and `run_sweep`, the driver;
* `clover_engine.experiments.sweep.results` -- the results and summary tables: schemas, reading and
  atomic writing, picking one grid's rows, fingerprints, the summary.

`clover_engine.sweep` is the command line and re-exports the public names (``from clover_engine import sweep``).

Every combination of the comma lists (``--sampler``, ``--block-size``, ``--threshold``, ``--policy``,
``--memory-mode``, ...) is one *setting*; every (model, setting, task) is one *cell*, one decode: by
`clover_engine.decoding.decoder.BlockDecoder` (``--sampler block``, the default: threshold decoding) or by a
public family's own sampler on its checkpoints (``--sampler llada,dream,fast_dllm_v2,sdar,llada2,llada21``, built
from ``--max-new-tokens``, ``--block-size`` and ``--threshold`` by `clover_engine.decoding.samplers.official_setting`).
Every cell is also compared with the same model's *careful decode* of its prompt (one slot per forward,
`clover_engine.decoding.careful`), decoded once per (model, prompt, careful setting) by each worker. The
output folder holds

* ``results.parquet`` -- one row per cell (`RESULT_SCHEMA`): model, setting, task, generated
  tokens, NFE, tokens per forward, forced fills, stop reason, text, the agent scores where the
  task is checkable (exact match and field accuracy as `clover_engine.data.agent.score_call` gives
  them), the agreement with the careful decode (%, first differing slot, common prefix, identical), the cost model's bytes and FLOPs, the path of the saved trace (relative to the
  folder), and the volatile columns `VOLATILE_COLUMNS` (wall time, worker);
* ``summary.parquet`` -- one row per (model, task set, setting), printed at the end;
* ``frontier.parquet`` -- the same rows as speed (tokens per forward) against what it cost (agreement with
  the careful decode, identical answers), the Pareto-optimal settings marked (`frontier_table`); the
  ``clover-explorer sweep`` command draws it, one plot per model (``frontier-<model>.html``);
* ``traces/<cell_id>.parquet`` -- each cell's `clover_engine.recording.trace.Trace` (unless ``--no-traces``).

Task sets: ``agent-eval:N`` (the first N held-out tool-call tasks of
`clover_engine.data.agent.eval_tasks`, scored), ``chat-eval:N`` (the first N fixed chat prompts of
`clover_engine.data.chat_prompts.eval_prompts`, wrapped in a user turn for chat models, unscored) and
``prompts:FILE`` (one prompt per line, ``#`` lines skipped, unscored). Models: checkpoint
directories (`clover_engine.checkpoint.load_model`) or ``random:PRESET[:SCALE]`` (`clover_engine.backbones.clover.model.random_model`
with seed 0 and weight scale SCALE, default 1, with the byte tokenizer).

Execution. Cells run serially (``--workers 1``), on a local process pool (``--workers N``,
``spawn`` processes), or on Ray (``--ray local`` starts a local Ray instance, ``--ray auto``
joins the running cluster, ``--ray ADDRESS`` a given one): one actor per worker loads each
model once and runs cells one at a time; an actor that dies is restarted and its cell retried
(``max_restarts`` / ``max_task_retries``), and a cell whose actor cannot come back goes to
another. Checkpoint paths must exist on every node; prompts travel with the cells, and traces
come back to the driver, which alone writes the output folder.

Resuming. The results table is rewritten (atomically) as cells finish; a re-run with the same
``--out`` reads it and skips every cell already there (cells are keyed by `cell_id`, a hash of
model, task set, task index, prompt and the full `DecodeConfig`). Decoding is greedy and each
cell is seeded from its id, so rows are identical whatever the number of workers or the backend;
rows are written in grid order. Only the `VOLATILE_COLUMNS` differ between runs. ``--interleave``
hands the cells out task by task (task 0 in every setting, then task 1, ...) so a changing machine
load slows every setting alike; the rows are the same. A folder keeps the rows of every grid run into
it: `grid_rows` picks one grid's. A cell id does not cover the checkpoint's weights or the code, so
`fingerprint` (a hash of files) can name a folder per version of them.
"""
