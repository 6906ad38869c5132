"""What a session's decoding settings may hold, the `DecodeConfig` they make, and setting them
from a run's decode config.

Wing: front ends (`clover_viz`), under `clover_viz.state`. The choices and bounds here
(`BLOCK_SIZES`, `MEMORY_MODES`, the max-new-tokens range, `DEVICE_CHOICES`) are what
`ExplorerState`'s parameters offer; `SessionSettings` is a mixin of
`clover_viz.state.ExplorerState` (the parameters themselves are declared there):

* `decode_config` -- the settings as an `clover_engine.decoding.decoder.DecodeConfig` (refusing a
  memory mode the model cannot run, `_check_memory_mode`);
* `set_max_new_tokens` -- user input checked against its range, with an error saying it;
* `_take_trace_settings` -- every setting of a loaded trace the model can run and a control
  can show (the rule of `ExplorerState.load_trace`), and what was not taken, with why;
* `_show_settings` -- a run's decode config shown in the controls, without re-decoding.

Tests: ``.venv/bin/python -m pytest tests/apps/test_explorer_newcomer.py -q``
"""

from __future__ import annotations

from typing import Any

from clover_viz.models import LoadedModel
from clover_viz.runs import prompt_of
from clover_engine.cost import DEVICES
from clover_engine.recording.trace import Trace
from clover_engine.decoding.decoder import DecodeConfig

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)
MAX_NEW_TOKENS_MIN, MAX_NEW_TOKENS_MAX = 1, 2048
MEMORY_MODES = ("state", "state+window")
DEVICE_CHOICES = tuple(DEVICES) + ("this-machine",)


def _check_memory_mode(mode: str, loaded: LoadedModel | None) -> None:
    """Raise ValueError when ``loaded`` cannot run memory ``mode`` (``state+window`` without a window)."""
    if mode == "state+window" and loaded is not None and not loaded.window_available:
        raise ValueError("memory mode 'state+window' needs a model with attention_window > 0; "
                         "this model has none -- use 'state'")


class SessionSettings:
    """The settings half of `ExplorerState` (a mixin; the parameters are declared there)."""

    def decode_config(self, loaded: LoadedModel | None = None) -> Any:
        """The `clover_engine.decoding.decoder.DecodeConfig` of the current settings.

        Raises:
            ValueError: for settings the model cannot run (``state+window`` without a window).
        """
        # deferred: clover_engine.decoding.decoder loads the model code and its kernels (triton), seconds

        _check_memory_mode(self.memory_mode, loaded or self._loaded)
        return DecodeConfig(
            block_size=int(self.block_size), threshold=float(self.threshold),
            max_new_tokens=int(self.max_new_tokens), policy=self.policy, memory_mode=self.memory_mode,
            repetition_penalty=float(self.repetition_penalty) if self.repetition_control else 0.0,
            eos_bias_soft_limit=int(self.eos_soft_limit) if self.eos_bias else None,
        )

    def set_max_new_tokens(self, value: Any) -> bool:
        """Set `max_new_tokens` from user input; outside 1..2048 (or not a whole number) set `error`
        saying the valid range, keep the current value and return False."""
        lo, hi = MAX_NEW_TOKENS_MIN, MAX_NEW_TOKENS_MAX
        try:
            n = int(value)
            ok = n == value and lo <= n <= hi
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            self.error = (f"Max new tokens must be a whole number from {lo} to {hi}; got {value}. "
                          f"Kept {self.max_new_tokens}.")
            return False
        if self.error.startswith("Max new tokens"):
            self.error = ""
        self.max_new_tokens = n
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
            bs = dc.get("block_size")
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
            pol = dc.get("policy")
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
            n = dc.get("max_new_tokens")
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
            if dc.get("block_size") in BLOCK_SIZES:
                self.block_size = dc["block_size"]
            thr = dc.get("threshold")
            if isinstance(thr, (int, float)) and 0.5 <= thr <= 1.0:
                self.threshold = float(thr)
            for key in ("policy", "memory_mode"):
                if dc.get(key) in self.param[key].objects:
                    setattr(self, key, dc[key])
        finally:
            self._quiet = quiet
