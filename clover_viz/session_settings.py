"""What a session's decoding settings may hold, the `DecodeConfig` they make, and setting them
from a run's decode config.

Wing: front ends (`clover_viz`), under `clover_viz.state`. The choices and bounds here
(`BLOCK_SIZES`, `MEMORY_MODES`, the max-new-tokens range, `DEVICE_CHOICES`) are what
`ExplorerState`'s parameters offer; `SessionSettings` is a mixin of
`clover_viz.state.ExplorerState` (the parameters themselves are declared there):

* `decode_config` -- the settings as an `clover_engine.decoding.decoder.DecodeConfig` (refusing a
  memory mode the model cannot run, `_check_memory_mode`);
* `setting_problem` / `setting_refusal` / `report_setting` -- the rule every value a control sends
  is checked against (the parameter's range or choices, a model name the server can resolve, a
  prompt within `MAX_PROMPT_CHARS`) and the one message a refused value gets, ``<Control> must be
  <rule>; got <value>. Kept <value in use>.`` (`clover_viz.panel_checks` applies them to every
  control of the Panel app);
* `set_max_new_tokens` -- user input checked against its range, with an error saying it;
* `_take_trace_settings` -- every setting of a loaded trace the model can run and a control
  can show (the rule of `ExplorerState.load_trace`), and what was not taken, with why;
* `_show_settings` -- a run's decode config shown in the controls, without re-decoding.

Tests: ``.venv/bin/python -m pytest tests/apps/test_explorer_newcomer.py -q``
"""

from __future__ import annotations

import dataclasses

import math
import textwrap
from typing import Any

import param

from clover_viz.models import LoadedModel, resolve_model
from clover_viz.runs import prompt_of
from clover_engine.cost import DEVICES
from clover_engine.recording.trace import Trace
from clover_engine.decoding.decoder import DecodeConfig
from clover_engine.decoding.block_diffusion_samplers import FastDLLMv2Sampler, SDARSampler
from clover_engine.decoding.llada2_samplers import LLaDA21Sampler, LLaDA2Sampler
from clover_engine.decoding.masked_diffusion_samplers import DreamSampler, LLaDASampler
from clover_engine.decoding.policies import POLICIES, SLOT_POLICIES
from clover_engine.decoding.samplers import (  # noqa: F401  (OFFICIAL_SAMPLERS: re-exported)
    OFFICIAL_SAMPLERS,
    check_official_sampler,
    official_setting,
)

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)
MAX_NEW_TOKENS_MIN, MAX_NEW_TOKENS_MAX = 1, 2048
MEMORY_MODES = ("state", "state+window")
POLICY_HELP = (
    "Which slots a forward writes; the list offers what the loaded model runs. Threshold decoding, on every model: "
    "'low_confidence' (every slot at or above the threshold, else the most confident one is forced), 'top_k', "
    "'margin', 'entropy', 'factor' (the same rule over another confidence). 'verify': a block drafter over a "
    "frozen base (smollm2-drafter) -- the base keeps what it would write itself. Each public family's own "
    "official sampler, on its checkpoints: 'llada' (LLaDA's generate: a canvas of max new tokens, one slot per "
    "forward by its schedule, in blocks of block_size), 'dream' (Dream's diffusion_generate, maskgit_plus, one "
    "canvas), 'fast_dllm_v2' (Fast-dLLM v2: blocks, sub-blocks of 8, > threshold), 'sdar' (SDAR: "
    "low_confidence_dynamic > threshold), 'llada2' (LLaDA2.0: > threshold, the window recomputed each step), "
    "'llada21' (LLaDA2.1: the same plus token-to-token edits of written slots).")
"""The policy control's help (`clover_viz.state.ExplorerState.policy`): which sampler each policy is."""
THRESHOLD_UNUSED = {"verify": "verify writes what the base would: the threshold is not read",
                    "llada": "the llada sampler writes by its schedule (one slot per forward): the threshold is "
                             "not read",
                    "dream": "the dream sampler writes by its schedule (one slot per forward): the threshold is "
                             "not read"}
"""Policy -> why the threshold control is off (fast_dllm_v2, sdar, llada2 and llada21 read it: ``> threshold``)."""
BLOCK_SIZE_UNUSED = {"dream": "the dream sampler decodes one canvas of max new tokens: the block size is not read"}
"""Policy -> why the block size control is off (every other policy decodes in blocks of it)."""


def unused_controls(policy: str) -> tuple[str, ...]:
    """The controls ``policy`` does not read, as the page labels them (``("Threshold", "Block size")`` for
    dream); the page disables them and says why (`unused_controls_note`)."""
    return tuple(label for label, why in (("Threshold", THRESHOLD_UNUSED), ("Block size", BLOCK_SIZE_UNUSED))
                 if policy in why)


def unused_controls_note(policy: str) -> str:
    """Why the controls ``policy`` does not read are off, one sentence each; "" when it reads them all."""
    return " ".join(f"{why[policy][0].upper()}{why[policy][1:]}." for why in (THRESHOLD_UNUSED, BLOCK_SIZE_UNUSED)
                    if policy in why)
DEVICE_CHOICES = tuple(DEVICES) + ("this-machine",)
MAX_PROMPT_CHARS = 2_000_000  # the prompt box's limit: > 30x the largest bundled context (65,536 tokens)
# what the page calls each setting (the refusals name the control, not the parameter)
SETTING_LABELS = {
    "model_dir": "Model directory", "dev_sharpen_random": "Sharpen random model", "example": "Example prompt",
    "prompt": "Prompt", "threshold": "Threshold", "block_size": "Block size", "policy": "Policy",
    "memory_mode": "Memory mode", "max_new_tokens": "Max new tokens", "repetition_control": "Repetition control",
    "repetition_penalty": "Repetition penalty", "eos_bias": "Progressive EOS bias",
    "eos_soft_limit": "EOS soft limit", "device": "Project onto device", "union_assumption": "35B-A3B expert union",
    "speed": "Playback speed",
}


def shown_value(value: Any) -> str:
    """A value as a refusal quotes it: numbers as they are, text quoted (at most 40 characters), ``on`` /
    ``off``, ``nothing`` for None; anything else by its type."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float)):
        text = str(value)
        return text if len(text) <= 40 else f"a {len(text)}-digit number"
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:40]) + f"... ({len(value):,} characters)"
    if value is None:
        return "nothing"
    return f"a {type(value).__name__} ({textwrap.shorten(repr(value), 40)})"


def refusal_text(label: str, rule: str, got: str, kept: str) -> str:
    """The one message of a refused control value: ``Threshold must be a number from 0.5 to 1; got 5.
    Kept 0.95.`` (the shape of the max-new-tokens box's message since it existed)."""
    return f"{label} must be {rule}; got {got}. Kept {kept}."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def official_sampler(name: str, loaded: LoadedModel | None, max_new_tokens: int, block_size: int,
                     threshold: float = 0.9
                     ) -> LLaDASampler | DreamSampler | FastDLLMv2Sampler | SDARSampler | LLaDA2Sampler | LLaDA21Sampler:
    """The explorer's settings as a public family's official sampler, for the loaded model: the model is
    checked (`clover_engine.decoding.samplers.check_official_sampler`), then the sampler is built from the
    budget, block size and threshold (`clover_engine.decoding.samplers.official_setting`, which lists what each
    sampler reads).

    Raises:
        ValueError: a model of another family, or a budget LLaDA cannot split into blocks, with what to change.
    """
    family = loaded.capabilities.family if loaded is not None else None
    check_official_sampler(name, family, getattr(loaded.config, "family", None) if loaded is not None else None)
    return official_setting(name, max_new_tokens, block_size, threshold)


def policies_for(loaded: LoadedModel | None) -> list[str]:
    """The policies the loaded model can run, in the policy list's order: the slot policies of threshold
    decoding (every backbone), ``verify`` for a model that drafts (`Capabilities.drafts`), and each official
    sampler `official_sampler` accepts for this model (LLaDA's and Dream's on their checkpoints, Fast-dLLM v2's,
    SDAR's, LLaDA2.0's and LLaDA2.1's on theirs). Every policy when no model is loaded."""
    if loaded is None:
        return [*POLICIES, *OFFICIAL_SAMPLERS]
    out = list(SLOT_POLICIES) + (["verify"] if loaded.capabilities.drafts else [])
    for name in OFFICIAL_SAMPLERS:
        try:  # the sampler's own check of the model, on a budget every sampler can split
            official_sampler(name, loaded, 32, 32, 0.9)
        except ValueError:
            continue
        out.append(name)
    return out


def controls_of(dc: Any) -> tuple[int, float | None]:
    """(block size, threshold) that the block size and threshold controls show for a `DecodeConfig` or an
    official sampler's settings; the threshold is None where the sampler reads none (LLaDA, Dream, verify)."""
    name = getattr(dc, "sampler", None)
    if name == "sdar":
        return int(dc.block_length), float(dc.confidence_threshold)
    if name in ("llada2", "llada21"):
        return int(dc.block_length), float(dc.threshold)
    if name == "llada":
        return int(dc.block_length), None
    if name == "dream":
        return int(dc.max_new_tokens), None
    return int(dc.block_size), (None if getattr(dc, "policy", "") == "verify" else float(dc.threshold))


def with_controls(dc: Any, block_size: int, threshold: float) -> Any:
    """``dc`` with the block size and threshold controls' values put into the sampler's own parameters
    (Fast-dLLM v2: ``block_size`` / ``threshold``, its sub-block kept when it divides the block, else the whole
    block; SDAR: ``block_length`` / ``confidence_threshold``; LLaDA: ``block_length``; Dream: unchanged)."""
    name = getattr(dc, "sampler", None)
    if name == "sdar":
        return dataclasses.replace(dc, block_length=block_size, confidence_threshold=threshold)
    if name == "llada21":
        return dataclasses.replace(dc, block_length=block_size, threshold=threshold)
    if name == "llada2":  # its steps follow the block, as the explorer sets them
        return dataclasses.replace(dc, block_length=block_size, steps=block_size, threshold=threshold)
    if name == "fast_dllm_v2":
        sub = dc.small_block_size if block_size % dc.small_block_size == 0 else block_size
        return dataclasses.replace(dc, block_size=block_size, small_block_size=sub, threshold=threshold)
    if name == "llada":
        return dataclasses.replace(dc, block_length=block_size)
    if name == "dream":
        return dc
    return dataclasses.replace(dc, threshold=threshold, block_size=block_size)


def sampler_summary(dc: Any) -> str:
    """One line for the status bar: what a `DecodeConfig` or an official sampler's settings will do."""
    name = getattr(dc, "sampler", None)
    if name == "fast_dllm_v2":
        return (f"the fast_dllm_v2 sampler, blocks of {dc.block_size} in sub-blocks of {dc.small_block_size}, "
                f"threshold > {dc.threshold:.2f}")
    if name == "sdar":
        return (f"the sdar sampler, blocks of {dc.block_length}, {dc.denoising_steps} steps each, "
                f"{dc.remasking_strategy} > {dc.confidence_threshold:.2f}, temperature {dc.temperature:g}")
    if name == "llada21":
        return (f"the llada21 sampler, blocks of {dc.block_length}, > {dc.threshold:.2f}, written slots edited "
                f"> {dc.editing_threshold:.2f} (up to {dc.max_post_steps} editing-only forwards a block), "
                + ("greedy" if dc.temperature == 0 else f"temperature {dc.temperature:g}"))
    if name == "llada2":
        return (f"the llada2 sampler, blocks of {dc.block_length}, {dc.steps_per_block} steps each at most, "
                f"> {dc.threshold:.2f}, " + ("greedy" if dc.temperature == 0 else f"temperature {dc.temperature:g}")
                + (", finished blocks in a KV cache" if dc.kv_cache else ", the window recomputed each step"))
    if name in OFFICIAL_SAMPLERS:  # llada / dream: their schedule, no threshold
        return (f"the {name} sampler, canvas {dc.canvas_length}, {dc.steps} steps"
                + (f", blocks of {dc.block_length}" if name == "llada" else ""))
    return f"block_size {dc.block_size}, threshold {dc.threshold:.2f}"


def _check_memory_mode(mode: str, loaded: LoadedModel | None) -> None:
    """Raise ValueError when ``loaded`` cannot run memory ``mode`` (``state+window`` without a window)."""
    if mode == "state+window" and loaded is not None and not loaded.window_available:
        raise ValueError("memory mode 'state+window' needs a model with attention_window > 0; "
                         "this model has none -- use 'state'")


class SessionSettings:
    """The settings half of `ExplorerState` (a mixin; the parameters are declared there)."""

    def decode_config(self, loaded: LoadedModel | None = None) -> Any:
        """The `clover_engine.decoding.decoder.DecodeConfig` of the current settings, or -- policy
        ``llada`` / ``dream`` -- the family's official sampler settings (`official_sampler`).

        Raises:
            ValueError: for settings the model cannot run (``state+window`` without a window; an official
                sampler on another family).
        """
        # deferred: clover_engine.decoding.decoder loads the model code and its kernels (triton), seconds

        if self.policy in OFFICIAL_SAMPLERS:  # a masked diffusion family's own sampler, not the block decoder
            return official_sampler(self.policy, loaded or self._loaded, int(self.max_new_tokens),
                                    int(self.block_size), float(self.threshold))
        _check_memory_mode(self.memory_mode, loaded or self._loaded)
        return DecodeConfig(
            block_size=int(self.block_size), threshold=float(self.threshold),
            max_new_tokens=int(self.max_new_tokens), policy=self.policy, memory_mode=self.memory_mode,
            repetition_penalty=float(self.repetition_penalty) if self.repetition_control else 0.0,
            eos_bias_soft_limit=int(self.eos_soft_limit) if self.eos_bias else None,
        )

    _refused: str = ""  # the last refusal `report_setting` showed (cleared by the next value taken)

    def setting_rule(self, name: str) -> str:
        """What setting ``name`` (a parameter of `ExplorerState`) takes, as a refusal says it:
        ``a number from 0.5 to 1``, ``one of 1, 2, 4, 8, 16, 32, 64``, ``on or off`` ..."""
        p = self.param[name]
        if isinstance(p, param.Boolean):
            return "on or off"
        if isinstance(p, param.Selector):
            return "one of " + ", ".join(map(str, p.objects))
        if isinstance(p, param.Number):
            lo, hi = p.bounds or (None, None)
            kind = "a whole number" if isinstance(p, param.Integer) else "a number"
            if lo is not None and hi is not None:
                return f"{kind} from {lo:g} to {hi:g}"
            return kind if lo is None else f"{kind} of at least {lo:g}"
        if name == "prompt":
            return f"text of at most {MAX_PROMPT_CHARS:,} characters"
        return "text"

    def setting_refusal(self, name: str, got: str) -> str:
        """The message for a value of setting ``name`` that is not one it takes; ``got`` says what came
        (`shown_value` of it, or ``option 99`` for a choice by position)."""
        current = getattr(self, name)
        kept = (f"the prompt as it was ({len(current):,} characters)" if name == "prompt" and len(current) > 40
                else shown_value(current).strip("'") if isinstance(current, str) and name != "prompt"
                else shown_value(current))
        return refusal_text(SETTING_LABELS.get(name, name.replace("_", " ").capitalize()), self.setting_rule(name),
                            got, kept)

    def setting_problem(self, name: str, value: Any) -> str | None:
        """None when setting ``name`` takes ``value``; else the message saying why not (`setting_refusal`).

        The rule is the parameter's own (its bounds, its choices, its type), plus what only the server
        can tell: a memory mode the loaded model runs, a model name this server resolves (inside its model
        roots; the message of a failed load, ``Model not loaded: ...``), a prompt of at most
        `MAX_PROMPT_CHARS` characters. Nothing is set and nothing is raised.

        Raises:
            KeyError: for a name that is no parameter of the state (a programming error).
        """
        p = self.param[name]
        if isinstance(p, param.Boolean):
            ok = isinstance(value, bool)
        elif isinstance(p, param.Selector):
            ok = any(value == o and isinstance(value, bool) == isinstance(o, bool) for o in p.objects)
            if ok and name == "memory_mode":
                try:
                    _check_memory_mode(value, self._loaded)
                except ValueError as exc:
                    return f"Memory mode {value} is not available: {exc}. Kept {self.memory_mode}."
        elif isinstance(p, param.Number):
            lo, hi = p.bounds or (None, None)
            ok = (_is_number(value) and (lo is None or value >= lo) and (hi is None or value <= hi)
                  and (not isinstance(p, param.Integer) or isinstance(value, int)))
        elif isinstance(p, param.String):
            ok = isinstance(value, str) and (name != "prompt" or len(value) <= MAX_PROMPT_CHARS)
            if not ok and name == "prompt" and isinstance(value, str):
                return self.setting_refusal(name, f"{len(value):,} characters")
            if ok and name == "model_dir" and value != self.model_dir:
                try:
                    resolve_model(value, self.dev_sharpen_random, roots=self._model_roots)
                except (ValueError, TypeError, OSError) as exc:
                    # "Kept" names a model only when one is loaded (a first load that failed left none)
                    kept = (f"Kept {self.model_dir}." if self.model_ok else
                            "No model is loaded: pick a bundled model, or name a folder or hub id this server lists.")
                    return f"Model not loaded: {exc}. {kept}"
        else:
            ok = True
        return None if ok else self.setting_refusal(name, shown_value(value))

    def report_setting(self, message: str | None) -> None:
        """Show a refused control value (``message``: set `error`), or say a control's value was taken
        (None: a refusal still on show is cleared; any other error stays)."""
        if message:
            self.error = message
            self._refused = message
        elif self._refused and self.error == self._refused:
            self.error = ""
            self._refused = ""

    def set_max_new_tokens(self, value: Any) -> bool:
        """Set `max_new_tokens` from user input; outside 1..2048 (or not a whole number) set `error`
        saying the valid range (`setting_problem`), keep the current value and return False."""
        problem = self.setting_problem("max_new_tokens", value)
        self.report_setting(problem)
        if problem is not None:
            return False
        self.max_new_tokens = int(value)
        return True

    def _take_trace_settings(self, trace: Trace) -> tuple[list[str], list[str]]:
        """Set every setting of ``trace`` the loaded model can run and a control can show (the rule of
        `load_trace`), without re-decoding. Returns (settings taken, settings not taken with why)."""
        # deferred: clover_engine.decoding.decoder loads the model code and its kernels (triton), seconds

        dc = trace.decode_config or {}
        loaded = self._loaded
        taken: list[str] = []
        left: list[str] = []
        quiet, self._quiet = self._quiet, True
        try:
            bs = dc.get("block_size", dc.get("block_length"))  # an official sampler's run: its block_length
            if bs in BLOCK_SIZES:
                self.block_size = bs
                taken.append(f"block size {bs}")
            elif bs is not None:
                left.append(f"block size {bs} (the control offers {', '.join(map(str, BLOCK_SIZES))})")
            thr = dc.get("threshold")
            lo, hi = self.param.threshold.bounds
            if isinstance(thr, (int, float)) and lo <= thr <= hi:
                self.threshold = float(thr)
                taken.append(f"threshold {thr:g}")
            elif thr is not None:
                left.append(f"threshold {thr:g} (the slider spans {lo:g}-{hi:g})")
            pol = dc.get("policy", dc.get("sampler"))
            if pol in self.param.policy.objects:
                self.policy = pol
                taken.append(f"policy {pol}")
            elif pol is not None:
                left.append(f"policy {pol} (not offered here)")
            mode = dc.get("memory_mode")
            if mode in MEMORY_MODES:
                if mode == "state+window" and loaded is not None and not loaded.window_available:
                    left.append(f"memory mode {mode} ({loaded.label} has no attention window)")
                else:
                    self.memory_mode = mode
                    taken.append(f"memory mode {mode}")
            elif mode is not None:
                left.append(f"memory mode {mode} (not offered here)")
            n = dc.get("max_new_tokens", dc.get("gen_length"))
            if isinstance(n, int) and MAX_NEW_TOKENS_MIN <= n <= MAX_NEW_TOKENS_MAX:
                self.max_new_tokens = n
                taken.append(f"max new tokens {n}")
            elif n is not None:
                left.append(f"max new tokens {n} (the control takes {MAX_NEW_TOKENS_MIN}-{MAX_NEW_TOKENS_MAX})")
            rp = dc.get("repetition_penalty")
            if isinstance(rp, (int, float)) and rp <= 0:
                self.repetition_control = False
                taken.append("repetition penalty off")
            elif isinstance(rp, (int, float)):
                lo, hi = self.param.repetition_penalty.bounds
                if lo <= rp <= hi:
                    self.repetition_control, self.repetition_penalty = True, float(rp)
                    taken.append(f"repetition penalty {rp:g}")
                else:
                    left.append(f"repetition penalty {rp:g} (the control takes {lo:g}-{hi:g})")
            if "eos_bias_soft_limit" in dc:
                lim = dc["eos_bias_soft_limit"]
                lo, hi = self.param.eos_soft_limit.bounds
                if lim is None:
                    self.eos_bias = False
                    taken.append("EOS bias off")
                elif isinstance(lim, int) and lo <= lim <= hi:
                    self.eos_bias, self.eos_soft_limit = True, lim
                    taken.append(f"EOS bias after {lim} tokens")
                else:
                    left.append(f"EOS bias soft limit {lim} (the control takes {lo}-{hi})")
            text = prompt_of(trace)
            if text and text.strip():
                self.prompt = text
                taken.append("prompt")
            else:
                left.append("prompt (the trace records none)")
        finally:
            self._quiet = quiet
        # decoder fields no control sets: Generate uses the decoder's defaults for them
        defaults = DecodeConfig().to_dict()
        covered = {"block_size", "threshold", "policy", "memory_mode", "max_new_tokens", "repetition_penalty",
                   "eos_bias_soft_limit"}
        for key, value in dc.items():
            if key not in covered and key in defaults and value != defaults[key]:
                left.append(f"{key.replace('_', ' ')} {value} (no control: {self.generate_button} uses "
                            f"{defaults[key]})")
        return taken, left

    def _show_settings(self, dc: dict[str, Any]) -> None:
        """Set the settings a run's decode config can be shown with (block size, threshold,
        policy, memory mode; values outside their choices are left), without re-decoding."""
        quiet, self._quiet = self._quiet, True
        try:
            if dc.get("block_size", dc.get("block_length")) in BLOCK_SIZES:
                self.block_size = dc.get("block_size", dc.get("block_length"))
            thr = dc.get("threshold")
            if isinstance(thr, (int, float)) and 0.5 <= thr <= 1.0:
                self.threshold = float(thr)
            if dc.get("policy", dc.get("sampler")) in self.param.policy.objects:
                self.policy = dc.get("policy", dc.get("sampler"))
            if dc.get("memory_mode") in self.param.memory_mode.objects:
                self.memory_mode = dc["memory_mode"]
        finally:
            self._quiet = quiet
