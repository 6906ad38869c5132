"""Sweep grids (experiments wing): the task sets, the model specs, the settings grid and the cells
of a sweep (one cell = one model x setting x task, keyed by a hash of what it decodes).

Part of `clover_engine.experiments.sweep` (the package docstring describes a sweep); re-exported by `clover_engine.sweep`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clover_engine.backbones.base import capabilities_of
from clover_engine.backbones.hub import parse_hub_id
from clover_engine.checkpoint import load_model, load_tokenizer
from clover_engine.decoding.decoder import DecodeConfig
from clover_engine.decoding.samplers import OFFICIAL_SAMPLERS, official_setting
from clover_engine.backbones.clover.model import random_model
from clover_engine.data.agent import eval_tasks
from clover_engine.data.chat_prompts import eval_prompts
from clover_engine.tokenizer import byte_tokenizer

GRID_AXES: dict[str, type] = {
    "sampler": str, "block_size": int, "threshold": float, "policy": str, "memory_mode": str, "max_new_tokens": int,
    "max_steps": int, "tokens_per_step": int, "max_entropy": float, "factor": float,
    "repetition_penalty": float, "eos_bias_soft_limit": int,
}
"""What a sweep can vary (CLI: ``--block-size 8,32`` ...), with their types: ``sampler`` (``block``, the default:
threshold decoding by `clover_engine.decoding.decoder.BlockDecoder`; or a public family's own sampler, one of
`clover_engine.decoding.samplers.OFFICIAL_SAMPLERS`) and the `DecodeConfig` fields."""
OFFICIAL_AXES = ("sampler", "block_size", "threshold", "max_new_tokens")
"""The axes an official sampler's setting reads (`clover_engine.decoding.samplers.official_setting`)."""


# ----------------------------------------------------------------------------- tasks and models

@dataclass(frozen=True)
class SweepTask:
    """One prompt of a task set.

    Attributes:
        task_set: the set's name (``agent-eval:20``); task_id: index in the set.
        prompt: the prompt text.
        kind: ``agent`` (scored against `turn`), ``chat`` (a user request: chat models get it as a
            ChatML user turn) or ``text`` (passed as is).
        turn: the `clover_engine.data.agent.CallTurn` scored against (``agent`` only).
    """

    task_set: str
    task_id: int
    prompt: str
    kind: str
    turn: Any = None


def _count(name: str, text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"task set {name!r}: expected a count >= 1 after the colon, e.g. 'agent-eval:20'")
    return n


def load_task_set(name: str) -> list[SweepTask]:
    """The prompts of a named task set (see the module docstring for the names).

    Raises:
        ValueError: an unknown name, a count that is not an int >= 1, a missing or empty prompt file.
    """
    kind, _, arg = name.partition(":")
    if kind == "agent-eval":
        return [SweepTask(name, i, t.prompt, "agent", t) for i, t in enumerate(eval_tasks(n=_count(name, arg)))]
    if kind == "chat-eval":
        prompts = eval_prompts()
        n = _count(name, arg)
        if n > len(prompts):
            raise ValueError(f"task set {name!r}: only {len(prompts)} chat-eval prompts exist")
        return [SweepTask(name, i, p, "chat") for i, p in enumerate(prompts[:n])]
    if kind == "prompts":
        path = Path(arg)
        if not path.is_file():
            raise ValueError(f"task set {name!r}: no prompt file {arg!r} (one prompt per line)")
        lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if not lines:
            raise ValueError(f"task set {name!r}: {arg} holds no prompt (one per line, '#' lines skipped)")
        return [SweepTask(name, i, p, "text") for i, p in enumerate(lines)]
    raise ValueError(f"unknown task set {name!r}; expected 'agent-eval:N', 'chat-eval:N' or 'prompts:FILE'")


def load_sweep_model(spec: str):
    """``(model, tokenizer)`` for a model spec: a checkpoint directory, a hub id ``org/name[@revision]``
    (`clover_engine.backbones.hub`, through `load_model`) or ``random:PRESET[:SCALE]``.

    Raises:
        ValueError: no checkpoint there, an unknown preset, a scale that is not a positive number,
            a preset the byte tokenizer does not fit, or a model `BlockDecoder` cannot drive
            (DiffusionGemma runs its own sampler).
    """
    if spec.startswith("random:"):
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"model {spec!r}: expected 'random:PRESET' or 'random:PRESET:SCALE'")
        try:
            scale = float(parts[2]) if len(parts) == 3 else 1.0
        except ValueError:
            scale = -1.0
        if not scale > 0:
            raise ValueError(f"model {spec!r}: the weight scale must be a number > 0, e.g. 'random:clover-test:15'")
        model, tok = random_model(parts[1], seed=0, weight_scale=scale), byte_tokenizer()
        if model.config.vocab_size < tok.get_vocab_size() or model.config.mask_token_id != tok.token_to_id("<|mask|>"):
            raise ValueError(f"model {spec!r}: preset {parts[1]!r} does not fit the byte tokenizer "
                             "(use 'random:clover-test' or a checkpoint directory)")
        model.model_id = spec
        return model, tok

    if not Path(spec).is_dir() and parse_hub_id(spec) is None:
        raise ValueError(f"model {spec!r}: no checkpoint directory there (or use 'random:clover-test', or a "
                         "hub id org/name[@revision])")
    model = load_model(spec)

    if capabilities_of(model).revises_commits:
        raise ValueError(f"model {spec!r}: a revisable sampler (DiffusionGemma) has its own generate; "
                         "sweeps drive clover_engine.decoding.decoder.BlockDecoder")
    return model, load_tokenizer(spec)


def setting_of(values: dict) -> Any:
    """The decode setting of one grid combination: a `DecodeConfig` (``sampler`` ``block`` or absent), or a
    public family's official sampler built from the budget, block size and threshold
    (`clover_engine.decoding.samplers.official_setting`; unset ones at `DecodeConfig`'s defaults).

    Raises:
        ValueError: an unknown sampler, an axis the official sampler does not read (only `OFFICIAL_AXES`), or a
            value the setting refuses (its message names the field and the valid range).
    """
    values = dict(values)
    sampler = values.pop("sampler", "block")
    try:
        if sampler == "block":
            return DecodeConfig(**values)
        extra = [k for k in values if k not in OFFICIAL_AXES]
        if extra:
            raise ValueError(f"sampler {sampler!r} reads only {', '.join(OFFICIAL_AXES[1:])}; drop {extra} from "
                             "the grid (or sweep it with --sampler block)")
        base = DecodeConfig(**values)
        return official_setting(sampler, base.max_new_tokens, base.block_size, base.threshold)
    except TypeError as e:
        raise ValueError(str(e)) from None


def setting_to_dict(setting: Any) -> dict:
    """A cell's setting as plain values: ``dataclasses.asdict`` of a `DecodeConfig`, or an official sampler's
    ``to_dict()`` (which names its ``sampler``). `setting_from_dict` inverts it."""
    return setting.to_dict() if getattr(setting, "sampler", None) in OFFICIAL_SAMPLERS else dataclasses.asdict(setting)


def setting_from_dict(values: dict) -> Any:
    """The setting `setting_to_dict` wrote: a `DecodeConfig`, or the official sampler its ``sampler`` names."""
    name = values.get("sampler")
    if name not in OFFICIAL_SAMPLERS:
        return DecodeConfig(**values)
    cls = type(official_setting(name, 32, 32))
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def settings_grid(axes: dict[str, Sequence]) -> list[dict]:
    """Every combination of the axes' values, in order (the last axis varies fastest).

    Args:
        axes: ``{axis: [values]}`` for axes in `GRID_AXES` (``sampler`` and `DecodeConfig` fields).

    Returns:
        One ``{field: value}`` dict per combination (validated by `setting_of`).

    Raises:
        ValueError: an unknown field, an empty value list, a repeated combination, or a value
            `DecodeConfig` refuses (its message names the field and the valid range).
    """
    bad = [k for k in axes if k not in GRID_AXES]
    if bad:
        raise ValueError(f"unknown sweep axes {bad}; expected some of {list(GRID_AXES)}")
    empty = [k for k, v in axes.items() if not len(v)]
    if empty:
        raise ValueError(f"sweep axes {empty} have no values; give at least one each")
    keys = list(axes)
    grid = [dict(zip(keys, combo)) for combo in itertools.product(*(axes[k] for k in keys))]
    for g in grid:
        setting_of(g)
    if len({json.dumps(g, sort_keys=True) for g in grid}) != len(grid):
        raise ValueError(f"the sweep axes repeat a value: {axes}")
    return grid


def setting_label(values: dict) -> str:
    """``block_size=8,threshold=0.9`` -- the swept values of one setting, in axis order."""
    return ",".join(f"{k}={v}" for k, v in values.items()) or "default"


# ----------------------------------------------------------------------------- cells

@dataclass(frozen=True)
class Cell:
    """One decode of a sweep: `task` decoded by `model` with `config` (a `DecodeConfig` as a dict).

    Attributes:
        index: position in grid order (model, then setting, then task set, then task).
        cell_id: 16 hex digits, a hash of model, task set, task index, prompt and full config.
        model: the model spec; setting: `setting_label`; config: the full setting as plain values
            (`setting_to_dict`: a `DecodeConfig`, or a family's official sampler).
        task: the `SweepTask`.
    """

    index: int
    cell_id: str
    model: str
    setting: str
    config: dict
    task: SweepTask


def make_cells(models: Sequence[str], task_sets: Sequence[str], settings: Sequence[dict]) -> list[Cell]:
    """The cells of a sweep, in grid order.

    Args:
        models: model specs (`load_sweep_model`); task_sets: task set names (`load_task_set`);
        settings: ``{field: value}`` dicts (`settings_grid`), unset fields at `DecodeConfig`'s defaults.

    Raises:
        ValueError: an empty or repeated list, or as `load_task_set` / `DecodeConfig`.
    """
    for what, xs in (("models", models), ("task sets", task_sets), ("settings", settings)):
        if not len(xs):
            raise ValueError(f"a sweep needs at least one of {what}")
        keys = [json.dumps(x, sort_keys=True) for x in xs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"the sweep's {what} repeat an entry: {list(xs)}")
    tasks = {name: load_task_set(name) for name in task_sets}
    cells = []
    for model in models:
        for values in settings:
            cfg = setting_to_dict(setting_of(values))
            for name in task_sets:
                for t in tasks[name]:
                    key = json.dumps([model, name, t.task_id, t.prompt, cfg], sort_keys=True)
                    cid = hashlib.sha256(key.encode()).hexdigest()[:16]
                    cells.append(Cell(len(cells), cid, model, setting_label(values), cfg, t))
    return cells
