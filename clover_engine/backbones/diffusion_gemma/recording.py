"""Recording DiffusionGemma's sampler (backbones wing): a wrapper around the sampler ``generate``
builds, the streamer ``generate`` feeds, router hooks for the expert union, and `_Recorder`, which
turns their calls into `clover_engine.recording.events` (`BlockStart`, `StepEvent`, `BlockEnd`; the
fields each holds are listed in the `clover_engine.backbones.diffusion_gemma` package docstring).
`clover_engine.decoding.diffusion_gemma.DiffusionGemmaDecoder.generate` wraps a decode in `_recording`.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from clover_engine.recording.events import BlockEnd, BlockStart, StepEvent


class _Cancelled(Exception):
    """Raised inside ``generate`` (from the sampler wrapper) to stop a cancelled decode."""


_DECODING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> the lock its one decode holds
_DECODING_GUARD = threading.Lock()


def _decode_lock(model: torch.nn.Module) -> threading.Lock:
    with _DECODING_GUARD:
        lock = _DECODING.get(model)
        if lock is None:
            lock = _DECODING[model] = threading.Lock()
        return lock


@contextlib.contextmanager
def _recording(model: torch.nn.Module, rec: _Recorder, observe_experts: bool):
    """Within the block, ``model.generate`` builds its sampler wrapped by ``rec`` and (when
    ``observe_experts``) the routers report their expert choices to ``rec``.

    One decode per model at a time: the wrapper is set on the model object and ``generate`` draws its
    random canvases from torch's process-wide generator, so a second decode of the same model (another
    session of a served explorer, a background careful decode) waits here until the first ends.

    Raises:
        _Cancelled: the decode was cancelled while it waited for the model.
    """
    lock = _decode_lock(model)
    while not lock.acquire(timeout=0.05):
        if rec.is_cancelled():
            raise _Cancelled
    try:
        with _wrapped(model, rec, observe_experts):
            yield
    finally:
        lock.release()


@contextlib.contextmanager
def _wrapped(model: torch.nn.Module, rec: _Recorder, observe_experts: bool):
    """`_recording`'s body, under the model's lock."""
    original = model._prepare_sampler  # the bound method generate calls to build its sampler

    def prepare(generation_config: Any) -> _RecordingSampler:
        return _RecordingSampler(original(generation_config), rec)

    handles = []
    if observe_experts:
        layer_lists = [model.model.decoder.layers, model.model.encoder.language_model.layers]
        for layers in layer_lists:
            for i, layer in enumerate(layers):
                router = getattr(layer, "router", None)
                if router is not None:
                    handles.append(router.register_forward_hook(rec.router_hook(i)))
    model._prepare_sampler = prepare
    try:
        yield
    finally:
        del model._prepare_sampler  # back to the class's method
        for h in handles:
            h.remove()


class _RecordingSampler:
    """Delegates to DiffusionGemma's sampler; reports the canvas start and each step to a `_Recorder`."""

    def __init__(self, base: Any, rec: _Recorder):
        self._base, self._rec = base, rec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)

    def initialize_canvas(self, batch_size: int, device: torch.device) -> torch.Tensor:
        canvas = self._base.initialize_canvas(batch_size, device)  # a new canvas's random start
        self._rec.block_start(canvas)
        return canvas

    def accept_canvas(self, current_canvas, denoiser_canvas, logits, cur_step):
        accepted = self._base.accept_canvas(current_canvas, denoiser_canvas, logits, cur_step)
        self._rec.step(current_canvas, denoiser_canvas, logits, self._base.accepted_token_mask)
        return accepted

    def renoise_canvas(self, accepted_canvas, cur_step):
        canvas = self._base.renoise_canvas(accepted_canvas, cur_step)
        self._rec.renoised(canvas)
        return canvas


class _CanvasStreamer:
    """The streamer ``generate`` feeds: the prompt first, then each finished canvas."""

    def __init__(self, rec: _Recorder):
        self._rec, self._seen_prompt = rec, False

    def put(self, value: torch.Tensor) -> None:
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        self._rec.block_end()

    def end(self) -> None:
        pass


class _Recorder:
    """Turns the sampler's calls into events (see the package docstring for what each field holds).

    A step is only known to be a canvas's last when the canvas ends (the streamer's ``put``),
    so each step is held until the next step or the canvas end, then emitted.
    """

    def __init__(self, emit: Callable[[object], None] | None, L: int, P: int, eos_ids: set[int], top_k: int,
                 n_layers: int, is_cancelled: Callable[[], bool]):
        self.emit, self.L, self.P, self.eos_ids, self.top_k = emit, L, P, eos_ids, top_k
        self.n_layers, self.is_cancelled = n_layers, is_cancelled
        self.block_index = -1
        self.step_index = 0
        self.nfe = self.n_forced = 0
        self.canvases: list[list[int]] = []  # the argmax read-out of every finished canvas
        self.pending: dict[str, Any] | None = None
        self.held = np.zeros(L, dtype=bool)
        self.t_last = time.perf_counter()
        self._experts: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]
        self._n_enc_tokens = P

    def streamer(self) -> _CanvasStreamer:
        return _CanvasStreamer(self)

    def router_hook(self, layer: int) -> Callable:
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            self._experts[layer].append(output[2].detach().reshape(-1))  # top_k_index [tokens * k]
        return hook

    def block_start(self, canvas: torch.Tensor) -> None:
        self.block_index += 1
        self.step_index = 0
        self.held = np.zeros(self.L, dtype=bool)
        if self.emit is not None:
            self.emit(BlockStart(self.block_index, self._pos0(), self.L, self.L, np.zeros(self.L, dtype=bool),
                                 canvas[0].cpu().numpy().astype(np.int64)))

    def step(self, current: torch.Tensor, sample: torch.Tensor, logits: torch.Tensor, accept: torch.Tensor) -> None:
        if self.pending is not None:
            self._emit_step(final=False)
        self.nfe += 1
        now = time.perf_counter()
        argmax = torch.argmax(logits, dim=-1)[0]  # generate's argmax canvas, the same op on the same tensor
        p: dict[str, Any] = {"wall_s": now - self.t_last, "argmax": argmax, "accept": accept[0].cpu().numpy(),
                             "current": current[0].cpu().numpy().astype(np.int64)}
        self.t_last = now
        if self.emit is not None:
            probs = torch.softmax(logits[0], dim=-1, dtype=torch.float32)  # [L, V], as generate samples from
            k = min(self.top_k, probs.shape[-1])
            tp, tt = probs.topk(k, dim=-1)
            p.update(
                sample=sample[0].cpu().numpy().astype(np.int64),
                p_sample=probs.gather(-1, sample[0][:, None].to(probs.device))[:, 0].cpu().numpy(),
                p_argmax=probs.gather(-1, argmax[:, None])[:, 0].cpu().numpy(),
                top_tokens=tt.cpu().numpy().astype(np.int64), top_probs=tp.cpu().numpy().astype(np.float32),
                expert_union=self._take_union(),
                n_fwd=self.L + (self._n_enc_tokens if self.step_index == 0 else 0),
            )
        self.pending = p

    def renoised(self, canvas: torch.Tensor) -> None:
        assert self.pending is not None
        self.pending["next"] = canvas[0].cpu().numpy().astype(np.int64)
        if self.is_cancelled():
            raise _Cancelled

    def block_end(self) -> None:
        """The canvas ended: its last step is the argmax read-out."""
        readout = self._emit_step(final=True)
        self.canvases.append(readout.tolist())
        if self.emit is not None:
            self.emit(BlockEnd(self.block_index, self._pos0(), readout.copy(), self.step_index,
                               any(int(t) in self.eos_ids for t in readout)))
        self._n_enc_tokens = self.L  # the next canvas's first forward encodes this one

    def cancel_block(self) -> None:
        """The decode was cancelled after a step: emit it (not a read-out) and end its canvas unread."""
        if self.pending is None:
            return
        tokens = self._emit_step(final=False)
        if self.emit is not None:
            self.emit(BlockEnd(self.block_index, self._pos0(), tokens.copy(), self.step_index, False))

    def _pos0(self) -> int:
        return self.P + self.block_index * self.L

    def _take_union(self) -> np.ndarray:
        """(N,) int64 distinct experts the routers reported since the last step (-1: no router)."""
        out = np.full(self.n_layers, -1, dtype=np.int64)
        for i, parts in enumerate(self._experts):
            if parts:
                out[i] = int(torch.unique(torch.cat(parts)).numel())
        self._experts = [[] for _ in range(self.n_layers)]
        return out

    def _emit_step(self, final: bool) -> np.ndarray:
        """Emit the held step as a denoising step or as the canvas's read-out; returns its tokens (L,)."""
        p, self.pending = self.pending, None
        assert p is not None
        held_before = self.held
        current, accept = p["current"], p["accept"].astype(bool)
        if final:
            proposal = p["argmax"].cpu().numpy().astype(np.int64)
            changed = ~held_before | (proposal != current)
            accepted, forced = changed & accept, changed & ~accept
            remasked = np.zeros(self.L, dtype=bool)
            tokens = proposal
            self.held = np.ones(self.L, dtype=bool)
        else:
            proposal = p.get("sample")
            tokens = p["next"]
            if proposal is None:  # not observed: the accepted slots hold their sample
                proposal = tokens
            accepted = accept & (~held_before | (proposal != current))
            forced = np.zeros(self.L, dtype=bool)
            remasked = held_before & ~accept
            self.held = accept.copy()
        rewritten = held_before & (accepted | forced)
        self.n_forced += int(forced.sum())
        if self.emit is not None:
            conf = p["p_argmax"] if final else p["p_sample"]
            prev = np.where(rewritten | remasked, current, -1).astype(np.int64)
            self.emit(StepEvent(
                block_index=self.block_index, step_index=self.step_index, position_start=self._pos0(),
                tokens=tokens.copy(), masked_before=~held_before, confidence=np.asarray(conf, dtype=np.float32),
                candidate=proposal.copy(), top_tokens=p["top_tokens"], top_probs=p["top_probs"],
                accepted=accepted, forced=forced, eos_filled=np.zeros(self.L, dtype=bool),
                expert_union=p["expert_union"], state_norm=None, memory_share=None,
                n_tokens_forward=int(p["n_fwd"]), wall_s=float(p["wall_s"]),
                rewritten=rewritten, remasked=remasked, previous_tokens=prev,
            ))
        self.step_index += 1
        return tokens
