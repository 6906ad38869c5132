"""Session state of the explorer: settings, the running decode, the traces, playback.

`ExplorerState` is a `param.Parameterized` with bounds and docs and no UI
import, so the Panel app (`clover_viz.panel_views`, `apps/explorer.py`), the
ipywidgets views and the tests all drive the same object.

Threading model (a worker thread decodes; only the UI thread touches params)::

    generate() --(UI thread)--> validate prompt, model, settings; new Trace; start worker
    worker thread: BlockDecoder.generate(hooks=[queue.put], cancel=Event) -- touches no param
    tick(dt) / drain() --(UI thread, periodic callback)--> pop events into the Trace,
                                                           bump `trace_version`, move `position`
    stop() sets the run's cancel Event: the decoder stops after its current forward and
    keeps what it wrote (the trace then ends with stop_reason "cancelled").

A new `generate()` while a decode runs (a threshold drag released twice)
cancels the running one and throws its partial trace away; `previous` always
holds the last run that was not superseded, so the comparison is between two
whole runs. Errors (empty prompt, a bad model directory, a setting the model
cannot run) set `error` and leave `trace` / `previous` as they were.

Models: `model_dir` names a checkpoint directory. When it is the default
(`DEFAULT_MODEL_DIR`) and that directory does not exist yet (the bundled model
is being trained), or when it is ``"clover-test"``, a seeded random
``clover-test`` model with the byte tokenizer is used and labelled
`RANDOM_MODEL_LABEL`. `dev_sharpen_random` (a development option, off by
default) multiplies that random model's matrices by `DEV_WEIGHT_SCALE` so its
confidences spread over (0, 1) like a trained model's -- still noise.
Loaded models are cached per process (`load_model_cached`), keyed by the
resolved directory and its weights' modification time.

Tests: ``.venv/bin/python -m pytest tests/apps/test_explorer_app.py -q``
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import queue
import re
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import param

from engine.cost import DEFAULT_DEVICE, DEVICES, UNION_ASSUMPTIONS
from engine.events import BlockStart, DecodeEnd, StepEvent
from engine.policies import POLICIES
from engine.trace import Trace

REPO_ROOT = Path(__file__).resolve().parents[1]
from engine.checkpoint import DEFAULT_MODEL_DIR  # noqa: E402  (one place for the default)
RANDOM_MODEL_NAME = "clover-test"
RANDOM_MODEL_LABEL = "random clover-test (no trained model found)"
RANDOM_MODEL_SEED = 0
DEV_WEIGHT_SCALE = 15.0
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)
MAX_NEW_TOKENS_MIN, MAX_NEW_TOKENS_MAX = 1, 2048
MEMORY_MODES = ("state", "state+window")
DEVICE_CHOICES = tuple(DEVICES) + ("this-machine",)

# The example prompts, one constant. The two agent prompts are held-out conversations of
# engine.data.agent (seeds EVAL_SEED_START + 3 and + 0) in the chat layout the bundled
# model is trained on; each ends at "<|im_start|>assistant\n", where the tool call starts.
_TOOLS_REFUND = (
    '{"name": "refund_order", "description": "Refund an order; confirm_order_id must repeat order_id.", '
    '"parameters": {"type": "object", "properties": {"order_id": {"type": "string"}, "amount": '
    '{"type": "integer"}, "confirm_order_id": {"type": "string", "description": "repeat order_id"}}, '
    '"required": ["order_id", "amount", "confirm_order_id"]}}\n'
)
EXAMPLE_PROMPTS: dict[str, str] = {
    "agent tool call": (
        "<|im_start|>system\nYou are a helpful assistant with tools:\n"
        + _TOOLS_REFUND
        + '{"name": "track_package", "description": "Track a package.", "parameters": {"type": "object", '
        '"properties": {"tracking_id": {"type": "string"}}, "required": ["tracking_id"]}}\n'
        '{"name": "find_customer", "description": "Find a customer by name.", "parameters": {"type": '
        '"object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}<|im_end|>\n'
        "<|im_start|>user\nGood morning. Please find a customer (name Zara Eriksen).<|im_end|>\n"
        "<|im_start|>assistant\n"
    ),
    "code completion": (
        "def _splitext(p, sep, altsep, extsep):\n"
        '    """Split the extension from a pathname.\n\n'
        "    Extension is everything from the last dot to the end, ignoring\n"
        '    leading dots.  Returns "(root, ext)"; ext may be empty."""\n'
        "    sepIndex = p.rfind(sep)\n"
    ),
    "long tool chain": (
        "<|im_start|>system\nYou are a helpful assistant with tools:\n"
        '{"name": "cancel_booking", "description": "Cancel a booking; confirm_booking_id must repeat '
        'booking_id.", "parameters": {"type": "object", "properties": {"booking_id": {"type": "string"}, '
        '"passenger": {"type": "string"}, "confirm_booking_id": {"type": "string", "description": '
        '"repeat booking_id"}}, "required": ["booking_id", "passenger", "confirm_booking_id"]}}\n'
        '{"name": "add_ticket_note", "description": "Add a note to a ticket.", "parameters": {"type": '
        '"object", "properties": {"ticket_id": {"type": "string"}, "author": {"type": "string"}}, '
        '"required": ["ticket_id", "author"]}}\n'
        '{"name": "get_order", "description": "Look up an order.", "parameters": {"type": "object", '
        '"properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}\n'
        + _TOOLS_REFUND.rstrip("\n")
        + "<|im_end|>\n<|im_start|>user\nHey. Please refund an order (order_id=ORD-14712, amount=18859), "
        "then add a note to a ticket (ticket_id=TCK-514151, author=Ivan Larsen), then refund an order "
        "(order_id=ORD-47154, amount=5426), then add a note to a ticket (ticket_id=TCK-678677, author=Emil "
        "Torres), then cancel a booking (booking_id=3QNX29, passenger=Jonas Costa), and finally look up an "
        "order (order_id=ORD-44840).<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>{"name": "refund_order", "arguments": {"order_id": "ORD-14712", "amount": 18859, '
        '"confirm_order_id": "ORD-14712"}}</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>{"status": "ok", "refund_date": "2028-12-26"}</tool_response>'
        "<|im_end|>\n<|im_start|>assistant\n"
        '<tool_call>{"name": "add_ticket_note", "arguments": {"ticket_id": "TCK-514151", "author": '
        '"Ivan Larsen"}}</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>{"ticket_id": "TCK-514151", "note_id": "NOTE-55310"}'
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
        '<tool_call>{"name": "refund_order", "arguments": {"order_id": "ORD-47154", "amount": 5426, '
        '"confirm_order_id": "ORD-47154"}}</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>{"status": "ok", "refund_date": "2029-07-17"}</tool_response>'
        "<|im_end|>\n<|im_start|>assistant\n"
        '<tool_call>{"name": "add_ticket_note", "arguments": {"ticket_id": "TCK-678677", "author": '
        '"Emil Torres"}}</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>{"ticket_id": "TCK-678677", "note_id": "NOTE-54110"}'
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
        '<tool_call>{"name": "cancel_booking", "arguments": {"booking_id": "3QNX29", "passenger": '
        '"Jonas Costa", "confirm_booking_id": "3QNX29"}}</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>{"status": "ok", "refund": 66491}</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    ),
}
DEFAULT_EXAMPLE = "agent tool call"


# ----------------------------------------------------------------------------- models
@dataclass(frozen=True)
class ModelSpec:
    """What `model_dir` resolves to (hashable: the model cache key).

    Attributes:
        kind: ``"checkpoint"`` (a directory on disk) or ``"random"`` (seeded clover-test).
        path: the resolved directory (``""`` for a random model).
        mtime_ns: modification time of the directory's weights (reloads a re-trained model).
        dev_scale: weight multiplier of a random model (1.0 = none; the dev option).
        fallback: True when the default directory was missing and the random model stands in.
    """

    kind: str
    path: str = ""
    mtime_ns: int = 0
    dev_scale: float = 1.0
    fallback: bool = False


@dataclass
class LoadedModel:
    """A model ready to decode: the model, its tokenizer, and how to label it in the UI."""

    spec: ModelSpec
    model: Any
    tokenizer: Any
    label: str

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def window_available(self) -> bool:
        """Whether ``state+window`` can run (the model has an attention window)."""
        return int(self.model.config.attention_window) > 0


def resolve_model(model_dir: str, dev_sharpen_random: bool = False) -> ModelSpec:
    """Turn the model-directory text into a `ModelSpec` (no loading).

    Relative paths are tried against the working directory, then the repository root; a bare
    name also as a bundled model, ``models/<name>`` (``clover-tiny``, ``smollm2-bd``).

    Raises:
        ValueError: for a directory that does not exist (other than the default one) or
            one without ``config.json``, saying what to pass instead.
    """
    text = (model_dir or "").strip()
    scale = DEV_WEIGHT_SCALE if dev_sharpen_random else 1.0
    if text == RANDOM_MODEL_NAME:
        return ModelSpec("random", dev_scale=scale)
    if not text:
        raise ValueError(
            f"the model directory is empty; enter a checkpoint directory (default {DEFAULT_MODEL_DIR}) "
            f"or '{RANDOM_MODEL_NAME}' for a random test model"
        )
    path = Path(text).expanduser()
    candidates = [path] if path.is_absolute() else [Path.cwd() / path, REPO_ROOT / path]
    if not path.is_absolute() and len(path.parts) == 1:  # a bundled model by name: "smollm2-bd"
        candidates.append(REPO_ROOT / "models" / path)
    found = next((p for p in candidates if p.is_dir()), None)
    if found is None:
        if text.rstrip("/") == DEFAULT_MODEL_DIR:
            return ModelSpec("random", dev_scale=scale, fallback=True)
        raise ValueError(
            f"no model directory at {text!r}; enter a checkpoint directory holding config.json and "
            f"model.safetensors (default {DEFAULT_MODEL_DIR}), or '{RANDOM_MODEL_NAME}' for a random test model"
        )
    found = found.resolve()
    if not (found / "config.json").is_file():
        if text.rstrip("/") == DEFAULT_MODEL_DIR:  # the bundled model is still being trained
            return ModelSpec("random", dev_scale=scale, fallback=True)
        raise ValueError(
            f"{text!r} is a directory but has no config.json; a checkpoint directory holds config.json, "
            "model.safetensors and tokenizer.json"
        )
    weights = [p for p in (found / "model.safetensors", found / "model.safetensors.index.json") if p.is_file()]
    mtime = max((p.stat().st_mtime_ns for p in weights), default=0)
    return ModelSpec("checkpoint", str(found), mtime)


def build_model(spec: ModelSpec) -> LoadedModel:
    """Load (or build) the model a `ModelSpec` names. Slow: call through `load_model_cached`.

    Raises:
        ValueError: from `engine.checkpoint` for a damaged or mismatched checkpoint.
    """
    import torch

    from engine.checkpoint import load_model, load_tokenizer
    from engine.config import CloverConfig
    from engine.model import CloverModel
    from engine.tokenizer import byte_tokenizer

    if spec.kind == "random":
        torch.manual_seed(RANDOM_MODEL_SEED)
        model = CloverModel(CloverConfig.from_name(RANDOM_MODEL_NAME)).eval()
        label = RANDOM_MODEL_LABEL if spec.fallback else f"random {RANDOM_MODEL_NAME}"
        if spec.dev_scale != 1.0:
            with torch.no_grad():
                for p in model.parameters():
                    if p.dim() >= 2:
                        p.mul_(spec.dev_scale)
            label += f" [dev: weights x{spec.dev_scale:g}]"
        return LoadedModel(spec, model, byte_tokenizer(), label)
    model = load_model(spec.path)
    try:
        tokenizer = load_tokenizer(spec.path)
    except ValueError:
        tok = byte_tokenizer()
        if model.config.vocab_size < tok.get_vocab_size() or model.config.mask_token_id != tok.token_to_id(
                "<|mask|>"):
            raise
        tokenizer = tok  # a byte-level checkpoint saved without tokenizer.json
    return LoadedModel(spec, model, tokenizer, f"{Path(spec.path).name} ({spec.path})")


_MODEL_CACHE: dict[ModelSpec, LoadedModel] = {}
_MODEL_CACHE_LOCK = threading.Lock()


def load_model_cached(spec: ModelSpec) -> LoadedModel:
    """`build_model` once per process and spec (sessions share models; decoding never mutates them)."""
    with _MODEL_CACHE_LOCK:
        if spec not in _MODEL_CACHE:
            if len(_MODEL_CACHE) >= 4:
                _MODEL_CACHE.pop(next(iter(_MODEL_CACHE)))
            _MODEL_CACHE[spec] = build_model(spec)
        return _MODEL_CACHE[spec]


# ----------------------------------------------------------------------------- run summaries
def run_stats(trace: Trace | None) -> dict[str, Any] | None:
    """The numbers the comparison shows for one run (None without a trace).

    Keys: ``nfe``, ``n_tokens``, ``tokens_per_forward``, ``n_forced``, ``wall_s``,
    ``tok_per_s`` (measured on the machine that ran it), ``stop_reason``,
    ``block_size``, ``threshold``, ``policy``, ``text``.

    While a decode runs, ``n_tokens`` (and so tokens / forward and tokens/s) counts what the
    run would keep if it ended now -- `generated_ids` -- the same definition as the final
    numbers: no EOS fills, nothing after an EOS, nothing past a still-masked slot.
    """
    if trace is None:
        return None
    s = trace.summary()
    dc = trace.decode_config or {}
    ids = generated_ids(trace)
    n_written = len(ids)
    wall = s["wall_s"] or 0.0
    return {
        "nfe": int(s["nfe"]),
        "n_tokens": int(n_written),
        "tokens_per_forward": n_written / s["nfe"] if s["nfe"] else 0.0,
        "n_forced": int(s["n_forced"]),
        "wall_s": float(wall),
        "tok_per_s": n_written / wall if wall > 0 else 0.0,
        "stop_reason": s["stop_reason"],
        "block_size": dc.get("block_size"),
        "threshold": dc.get("threshold"),
        "policy": dc.get("policy"),
        "text": "".join(trace.token_str(t) for t in ids),
    }


def eos_token_id(trace: Trace) -> int | None:
    """The EOS id of the model that recorded ``trace``: from its model config, else from an
    EOS-filled slot (those hold EOS), else None."""
    cfg = (trace.meta or {}).get("model_config")
    if isinstance(cfg, dict) and cfg.get("eos_token_id") is not None:
        return int(cfg["eos_token_id"])
    for ev in trace.steps:
        if ev.eos_filled.any():
            return int(ev.tokens[int(ev.eos_filled.argmax())])
    return None


# per trace: {block_index: (ids kept from that finished block, hit EOS)}
_BLOCK_IDS: "weakref.WeakKeyDictionary[Trace, dict[int, tuple[list[int], bool]]]" = weakref.WeakKeyDictionary()


def generated_ids(trace: Trace) -> list[int]:
    """The generated token ids of a trace, finished or still running, by the decoder's rule.

    Finished: the `DecodeEnd` tokens. Running: per block in order, its generated (not
    pre-filled) slots up to the first slot still masked, cut before the first EOS, stopping
    there -- exactly what the decoder keeps when it stops now (``stop_reason`` cancelled).
    Finished blocks are cached, so a live call costs the running block only.
    """
    if trace.decode_end is not None:
        return trace.generated_tokens.tolist()
    eos = eos_token_id(trace)
    cache = _BLOCK_IDS.setdefault(trace, {})
    ended = {b.block_index for b in trace.block_ends}
    prefilled = {b.block_index: np.asarray(b.prefilled, dtype=bool) for b in trace.block_starts}
    last: dict[int, Any] = {}
    steps = trace.steps
    # the last step of each block not cached yet (walk back from the end: blocks are in order)
    for ev in reversed(steps):
        b = ev.block_index
        if b in cache:
            break
        last.setdefault(b, ev)
    out: list[int] = []
    for b in sorted(set(cache) | set(last)):
        if b in cache:
            ids, hit = cache[b]
        else:
            ev = last[b]
            still = np.asarray(ev.masked_before, dtype=bool) & ~(
                np.asarray(ev.accepted, dtype=bool) | np.asarray(ev.forced, dtype=bool)
                | np.asarray(ev.eos_filled, dtype=bool))
            pre = prefilled.get(b, np.zeros(len(ev.tokens), dtype=bool))
            toks = np.asarray(ev.tokens).tolist()
            ids, hit = [], False
            for t, p, m in zip(toks, pre.tolist(), still.tolist()):
                if p:
                    continue
                if m:
                    break
                if eos is not None and t == eos:
                    hit = True
                    break
                ids.append(int(t))
            if b in ended:
                cache[b] = (ids, hit)
        out += ids
        if hit:
            break
    return out


def trace_text(trace: Trace) -> str:
    """The generated text of a trace from its stored vocabulary (works without a tokenizer)."""
    return "".join(trace.token_str(t) for t in generated_ids(trace))


def text_diff(old: str, new: str) -> list[tuple[str, str]]:
    """Character-level diff of two texts as ``[(op, text)]``, op in ``equal``/``insert``/``delete``."""
    ops: list[tuple[str, str]] = []
    sm = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            ops.append(("equal", old[i1:i2]))
        else:
            if i2 > i1:
                ops.append(("delete", old[i1:i2]))
            if j2 > j1:
                ops.append(("insert", new[j1:j2]))
    return ops


def _snapshot(event: Any) -> Any:
    """Copy an event's arrays at emit time (in the worker thread).

    On the CPU, ``BlockStart.tokens`` shares memory with the decoder's block tensor, which
    the decoder then fills in place; without a copy the start record would show the final
    tokens instead of the masks.
    """
    if isinstance(event, BlockStart):
        return dataclasses.replace(event, tokens=event.tokens.copy(), prefilled=event.prefilled.copy())
    return event


def _trace_error(label: str, path: Path | None, exc: BaseException) -> str:
    """A trace-loading error for the page: names the user's file and the Open button, not the
    temporary path it was read from nor the Python API."""
    detail = str(exc)
    if path is not None:
        detail = detail.replace(repr(str(path)), "the file").replace(str(path), "the file")
    if "is not a trace file" in detail:
        detail = "it is neither a Parquet nor an Arrow file: " + detail.split("found ", 1)[-1].split(". ")[0]
    elif "cannot be read" in detail:
        detail = "it looks like Parquet or Arrow but is damaged"
    else:  # a table without the explorer's metadata or columns: keep what is wrong, drop API advice
        detail = re.sub(r"\s*(Save traces with|Use|use) [\w.]+\(\)[^.;]*[.;]?", "", detail)
        detail = re.sub(r"[;,]?\s*re-save the trace", "", detail)
        detail = re.sub(r"(engine\.trace\.)?Trace\.\w+\(\)", "the Save trace button", detail).strip().rstrip(".;,")
    if isinstance(exc, FileNotFoundError):
        return f"Trace not loaded: {label!r} was not found. Choose a trace file with the Open button."
    return (f"Trace not loaded: {label!r} is not a trace this explorer can replay ({detail}). Choose a .parquet "
            "or .arrow file saved with the 'Save trace' button, using the Open button.")


@dataclass
class _Run:
    """One decode in a worker thread."""

    run_id: int
    cancel: threading.Event
    thread: threading.Thread | None = None
    superseded: bool = False
    user_stopped: bool = False
    step_times: list = dataclasses.field(default_factory=list)


# ----------------------------------------------------------------------------- the state
class ExplorerState(param.Parameterized):
    """Everything one explorer session holds. No UI imports; drive it from any front end.

    Settings are plain parameters; `generate`, `stop`, `load_trace`, `play` ... are the
    actions; `tick(dt)` must be called periodically on the UI thread (it drains the worker's
    events and advances playback).
    """

    # --- model and prompt
    model_dir = param.String(default=DEFAULT_MODEL_DIR, doc=(
        "Checkpoint directory (config.json, model.safetensors, tokenizer.json), or 'clover-test' for a "
        "random test model. The default falls back to random clover-test while it does not exist."))
    dev_sharpen_random = param.Boolean(default=False, doc=(
        f"Development option: multiply the random clover-test model's matrices by {DEV_WEIGHT_SCALE:g} so "
        "its confidences spread out like a trained model's. Its output is still noise."))
    example = param.Selector(default=DEFAULT_EXAMPLE, objects=list(EXAMPLE_PROMPTS), doc=(
        "Example prompt; choosing one replaces the prompt text."))
    prompt = param.String(default=EXAMPLE_PROMPTS[DEFAULT_EXAMPLE], doc="Prompt text (chat layout for agents).")

    # --- decoding settings (DecodeConfig)
    threshold = param.Number(default=0.95, bounds=(0.5, 1.0), step=0.01, doc=(
        "LowConfidence threshold: a masked slot is written when its confidence >= threshold."))
    block_size = param.Selector(default=32, objects=list(BLOCK_SIZES), doc=(
        "Slots per block B (1 = autoregressive greedy decoding)."))
    policy = param.Selector(default="low_confidence", objects=list(POLICIES), doc="Acceptance policy.")
    memory_mode = param.Selector(default="state", objects=list(MEMORY_MODES), doc=(
        "'state' keeps history only in recurrent state (Clover); 'state+window' also keeps the last W "
        "committed K/V in attention layers (a labelled non-Clover variant; needs attention_window > 0)."))
    max_new_tokens = param.Integer(default=128, bounds=(MAX_NEW_TOKENS_MIN, MAX_NEW_TOKENS_MAX),
                                   doc="Generated-token budget.")
    repetition_control = param.Boolean(default=False, doc="n-gram repetition penalty (model card).")
    repetition_penalty = param.Number(default=2.0, bounds=(0.1, 20.0), doc="Logit penalty when on.")
    eos_bias = param.Boolean(default=False, doc="Progressive EOS bias past a soft length limit (model card).")
    eos_soft_limit = param.Integer(default=96, bounds=(0, 4096), doc="Generated tokens before EOS is favoured.")
    auto_redecode = param.Boolean(default=True, doc=(
        "Re-decode when threshold or block_size changes (sliders set them on release)."))

    # --- cost panel
    device = param.Selector(default=DEFAULT_DEVICE, objects=list(DEVICE_CHOICES), doc=(
        "Device for projected tokens/s and the roofline ('this-machine' is measured once)."))
    union_assumption = param.Selector(default="measured_vs_independent", objects=list(UNION_ASSUMPTIONS), doc=(
        "How the 35B-A3B expert union per forward is derived from the recorded run "
        "(engine.cost.target_union); 'measured_fraction' saturates for models with few experts."))

    # --- outputs (set by the state itself)
    trace = param.ClassSelector(class_=Trace, default=None, allow_None=True, doc="The run on display.")
    previous = param.ClassSelector(class_=Trace, default=None, allow_None=True, doc=(
        "The run before it, kept for comparison."))
    trace_version = param.Integer(default=0, doc="Bumped whenever `trace` gains events.")
    running = param.Boolean(default=False, doc="A decode is running.")
    progress = param.Integer(default=0, bounds=(0, 100), doc="Generated tokens / budget of the running decode, %.")
    status = param.String(default="", doc="One line on what the session is doing.")
    error = param.String(default="", doc="The last error (empty when none).")
    model_label = param.String(default="", doc="What model is loaded, said plainly.")
    window_available = param.Boolean(default=True, doc="The model supports 'state+window'.")

    # --- playback
    position = param.Integer(default=0, bounds=(0, None), doc="Step (forward) index on display.")
    n_steps = param.Integer(default=0, doc="Steps in `trace`.")
    playing = param.Boolean(default=False, doc="Playback is advancing `position`.")
    speed = param.Number(default=8.0, bounds=(0.5, 60.0), doc="Playback speed, steps per second.")

    def __init__(self, loader: Any = None, **params: Any) -> None:
        super().__init__(**params)
        self._loader = loader or load_model_cached
        self._loaded: LoadedModel | None = None
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._run: _Run | None = None
        self._run_counter = 0
        self._quiet = False  # settings changed by the state itself: no re-decode
        self._play_accum = 0.0
        self._closed = False
        self.stop_timing: dict[str, Any] = {}

    # ------------------------------------------------------------------ model
    @property
    def loaded_model(self) -> LoadedModel | None:
        """The model of the last successful load (None before the first)."""
        return self._loaded

    def load_model(self, adjust_mode: bool = True) -> LoadedModel | None:
        """Resolve and load `model_dir` (cached). On failure set `error` and return None.

        With ``adjust_mode``, a memory mode the model cannot run falls back to ``state``.
        """
        try:
            spec = resolve_model(self.model_dir, self.dev_sharpen_random)
            loaded = self._loader(spec)
        except (ValueError, TypeError, OSError) as exc:
            self.error = f"Model not loaded: {exc}"
            return None
        self._loaded = loaded
        self.model_label = loaded.label
        self.window_available = loaded.window_available
        if adjust_mode and not loaded.window_available and self.memory_mode == "state+window":
            self.memory_mode = "state"
        return loaded

    @param.depends("model_dir", "dev_sharpen_random", watch=True)
    def _on_model_change(self) -> None:
        if self.load_model() is not None:
            self.error = ""

    @param.depends("example", watch=True)
    def _on_example(self) -> None:
        self.prompt = EXAMPLE_PROMPTS[self.example]

    @param.depends("threshold", "block_size", watch=True)
    def _on_decode_setting(self) -> None:
        if self.auto_redecode and not self._quiet and self.trace is not None and not self._closed:
            self.generate()

    def decode_config(self, loaded: LoadedModel | None = None) -> Any:
        """The `engine.decoder.DecodeConfig` of the current settings.

        Raises:
            ValueError: for settings the model cannot run (``state+window`` without a window).
        """
        from engine.decoder import DecodeConfig

        loaded = loaded or self._loaded
        if self.memory_mode == "state+window" and loaded is not None and not loaded.window_available:
            raise ValueError("memory mode 'state+window' needs a model with attention_window > 0; "
                             "this model has none -- use 'state'")
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

    # ------------------------------------------------------------------ decoding
    def generate(self) -> bool:
        """Start decoding `prompt` with the current settings in a worker thread.

        A decode already running is cancelled and its partial trace dropped. Returns False
        (and sets `error`, keeping the runs on display) when the prompt, the model or the
        settings are unusable.
        """
        from engine.decoder import BlockDecoder

        if self._closed:
            return False
        if not self.prompt or not self.prompt.strip():
            self.error = "The prompt is empty: type a prompt or pick an example, then Generate."
            return False
        loaded = self.load_model(adjust_mode=False)
        if loaded is None:
            return False
        try:
            dc = self.decode_config(loaded)
            decoder = BlockDecoder(loaded.model, loaded.tokenizer, dc)
            prompt_ids = decoder.encode_prompt(self.prompt)
        except (ValueError, TypeError) as exc:
            self.error = f"Cannot decode: {exc}"
            return False
        self.error = ""

        if self._run is not None and self.running:
            self._run.superseded = True
            self._run.cancel.set()
        elif self.trace is not None:
            self.previous = self.trace
        self._run_counter += 1
        run = _Run(self._run_counter, threading.Event())
        tok = loaded.tokenizer
        live = Trace(
            decode_config=dc.to_dict(), model_id=loaded.model.model_id,
            token_text=lambda i: tok.decode([i], skip_special_tokens=False), prompt_ids=prompt_ids,
            meta={"model_label": loaded.label, "model_config": loaded.config.to_dict(),
                  "dev_weight_scale": loaded.spec.dev_scale, "recorded_on": "cpu"},
        )
        events = self._events

        def hook(ev: Any, _rid: int = run.run_id) -> None:
            if isinstance(ev, StepEvent):
                run.step_times.append(time.monotonic())  # when each forward ended (stop timing)
            events.put((_rid, "event", _snapshot(ev)))

        def work() -> None:
            try:
                decoder.generate(prompt_ids, hooks=[hook], record_trace=False, cancel=run.cancel)
            except Exception as exc:  # reported on the UI thread by drain()
                events.put((run.run_id, "error", exc))
            finally:
                events.put((run.run_id, "exit", None))

        run.thread = threading.Thread(target=work, name=f"clover-decode-{run.run_id}", daemon=True)
        self._run = run
        self._budget = dc.max_new_tokens
        self._written = 0
        self.playing = False
        with param.parameterized.batch_call_watchers(self):
            self.trace = live
            self.n_steps = 0
            self.position = 0
            self.progress = 0
            self.running = True
            self.status = f"decoding with {loaded.label}: block_size {dc.block_size}, threshold {dc.threshold:.2f}"
        run.thread.start()
        return True

    def stop(self) -> None:
        """Cancel the running decode; it stops after its current forward and keeps what it wrote.

        `stop_timing` records when (monotonic seconds) and at which NFE (steps shown) the stop
        was asked for, and, once the decode has ended, when and at which NFE it ended.
        """
        if self._run is not None and self.running:
            self._run.user_stopped = True
            self._run.cancel.set()
            self.stop_timing = {"requested_at": time.monotonic(), "nfe_shown": self.n_steps,
                                "nfe_recorded": len(self.trace) if self.trace is not None else 0}
            self.status = "stopping..."

    def wait(self, timeout: float = 30.0) -> bool:
        """Block until the running decode's thread ends, then drain (for tests and scripts).

        Returns True when nothing is running any more (and the worker thread has ended).
        """
        run = self._run
        if run is not None and run.thread is not None:
            run.thread.join(timeout)
        self.drain()
        return not self.running and (run is None or run.thread is None or not run.thread.is_alive())

    def drain(self) -> int:
        """Move the worker's queued events into `trace` (UI thread). Returns events applied."""
        applied = 0
        run = self._run
        while True:
            try:
                run_id, kind, payload = self._events.get_nowait()
            except queue.Empty:
                break
            if run is None or run_id != run.run_id or run.superseded:
                continue  # a superseded run's leftovers
            if kind == "event":
                self.trace(payload)
                applied += 1
                if isinstance(payload, StepEvent):
                    self._written += payload.n_written
                elif isinstance(payload, DecodeEnd):
                    self._finish(payload)
            elif kind == "error":
                self._fail(payload)
            elif kind == "exit" and self.running:  # ended without DecodeEnd (error path)
                self.running = False
        if applied and self.trace is not None:
            n_old, n_new = self.n_steps, len(self.trace)
            with param.parameterized.batch_call_watchers(self):
                self.n_steps = n_new
                if n_new and (n_old == 0 or self.position >= n_old - 1):
                    self.position = n_new - 1  # follow the newest step unless the user scrubbed back
                if self.running:
                    n_tok = len(generated_ids(self.trace))
                    self.progress = min(100, int(100 * n_tok / max(self._budget, 1)))
                    blk = self.trace.step(-1).block_index if n_new else 0  # 0-based, as in the figures
                    status = f"decoding: block {blk}, {n_tok}/{self._budget} tokens, NFE {n_new}"
                    self.status = "stopping... " + status if self._run.user_stopped else status
                self.trace_version += 1
        return applied

    def _finish(self, end: DecodeEnd) -> None:
        run = self._run
        if run is not None and run.user_stopped and self.stop_timing:
            asked = self.stop_timing["requested_at"]
            self.stop_timing = dict(self.stop_timing, ended_at=time.monotonic(), final_nfe=int(end.nfe),
                                    forwards_after_request=sum(t > asked for t in run.step_times))
        self.running = False
        self.progress = 100
        tpf = f"{end.tokens_per_forward:.2f}"
        if end.stop_reason == "cancelled":
            self.status = f"stopped: kept {len(end.tokens)} tokens after {end.nfe} forwards"
        else:
            self.status = (f"done: {len(end.tokens)} tokens in {end.nfe} forwards ({tpf} tokens/forward), "
                           f"{end.n_forced} forced, stop: {end.stop_reason}")
        assert run is not None and not run.superseded, run

    def _fail(self, exc: BaseException) -> None:
        self.running = False
        self.error = f"Decoding failed: {type(exc).__name__}: {exc}"
        if self.trace is not None and len(self.trace) == 0:
            with param.parameterized.batch_call_watchers(self):  # nothing produced: show the last run again
                self.trace, self.previous = self.previous, None
                self.n_steps = len(self.trace) if self.trace is not None else 0
                self.position = max(self.n_steps - 1, 0)
                self.trace_version += 1

    # ------------------------------------------------------------------ playback
    def tick(self, dt: float = 0.1) -> None:
        """Periodic work on the UI thread: drain events, then advance playback by ``dt`` seconds."""
        self.drain()
        if not self.playing:
            return
        if self.n_steps == 0:
            self.playing = False
            return
        self._play_accum += dt * self.speed
        adv = int(self._play_accum)
        if adv:
            self._play_accum -= adv
            last = self.n_steps - 1
            new = min(self.position + adv, last)
            self.position = new
            if new >= last and not self.running:
                self.playing = False

    def play(self) -> None:
        """Start playback (from the first step when at the end)."""
        if self.n_steps == 0:
            return
        if self.position >= self.n_steps - 1 and not self.running:
            self.position = 0
        self._play_accum = 0.0
        self.playing = True

    def pause(self) -> None:
        self.playing = False

    def toggle_play(self) -> None:
        self.pause() if self.playing else self.play()

    def step(self, delta: int = 1) -> None:
        """Move `position` by ``delta`` steps (clipped), pausing playback."""
        self.playing = False
        if self.n_steps:
            self.position = min(max(self.position + int(delta), 0), self.n_steps - 1)

    def seek(self, position: int) -> None:
        """Jump to a step (clipped)."""
        if self.n_steps:
            self.position = min(max(int(position), 0), self.n_steps - 1)

    # ------------------------------------------------------------------ traces on disk
    def load_trace(self, source: str | Path | bytes, name: str = "") -> bool:
        """Show a saved trace (a path or the bytes of a .parquet / .arrow file) for replay.

        The current run becomes `previous`; a running decode is cancelled. The settings
        widgets take the trace's settings (without re-decoding). Returns False and sets
        `error` for a file that is not a trace.
        """
        label = name or ("the uploaded file" if isinstance(source, (bytes, bytearray)) else Path(source).name)
        path: Path | None = None
        try:
            if isinstance(source, (bytes, bytearray)):
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(tmp) / "trace.bin"
                    path.write_bytes(bytes(source))
                    loaded = Trace.load(path)
            else:
                path = Path(source)
                loaded = Trace.load(source)
                name = name or Path(source).name
        except (ValueError, FileNotFoundError, OSError, KeyError, TypeError) as exc:
            self.error = _trace_error(label, path, exc)
            return False
        if self._run is not None and self.running:
            self._run.superseded = True
            self._run.cancel.set()
        elif self.trace is not None:
            self.previous = self.trace
        self.error = ""
        dc = loaded.decode_config or {}
        self._quiet = True
        try:
            with param.parameterized.batch_call_watchers(self):
                if dc.get("block_size") in BLOCK_SIZES:
                    self.block_size = dc["block_size"]
                thr = dc.get("threshold")
                if isinstance(thr, (int, float)) and 0.5 <= thr <= 1.0:
                    self.threshold = float(thr)
                for key in ("policy", "memory_mode"):
                    if dc.get(key) in self.param[key].objects:
                        setattr(self, key, dc[key])
                self.trace = loaded
                self.running = False
                self.playing = False
                self.n_steps = len(loaded)
                self.position = 0
                self.progress = 100
                self.trace_version += 1
                label = (loaded.meta or {}).get("model_label") or loaded.model_id
                self.status = f"loaded trace {name or ''}: {len(loaded)} steps from {label}; press play to replay"
        finally:
            self._quiet = False
        return True

    def trace_bytes(self, format: str = "parquet") -> io.BytesIO:
        """The displayed trace as the bytes of a file (for a download).

        Raises:
            ValueError: when there is no trace to save.
        """
        if self.trace is None or len(self.trace) == 0:
            raise ValueError("there is no run to save yet: Generate first")
        with tempfile.TemporaryDirectory() as tmp:
            path = self.trace.save(Path(tmp) / f"trace.{format}", format=format)
            return io.BytesIO(path.read_bytes())

    # ------------------------------------------------------------------ comparison / cost
    def comparison(self) -> dict[str, Any] | None:
        """Current vs previous run: both `run_stats` and the text diff (None without both)."""
        cur, prev = run_stats(self.trace), run_stats(self.previous)
        if cur is None or prev is None:
            return None
        return {"current": cur, "previous": prev, "diff": text_diff(prev["text"], cur["text"])}

    def cost_projection(self, device: str | None = None) -> Any:
        """`engine.cost.project_trace` of the displayed trace on `device` (None when it has no steps).

        The source model's config comes from the trace's metadata (recorded by `generate`).
        """
        from engine.config import CloverConfig
        from engine.cost import project_trace

        if self.trace is None or len(self.trace) == 0:
            return None
        cfg = (self.trace.meta or {}).get("model_config")
        source = CloverConfig.from_dict(cfg) if isinstance(cfg, dict) else None
        mode = (self.trace.decode_config or {}).get("memory_mode", "state")
        window = source.attention_window if (source is not None and mode == "state+window") else 0
        return project_trace(self.trace, device or self.device, source_config=source,
                             union_assumption=self.union_assumption, memory_mode=mode, window=window)

    # ------------------------------------------------------------------ session end
    def close(self) -> None:
        """End the session's work: cancel a running decode, start no new one (idempotent)."""
        self._closed = True
        self.playing = False
        if self._run is not None:
            self._run.superseded = True
            self._run.cancel.set()
        self.running = False
