"""Recurrent state, the per-forward plan and the forward's output (docs/architecture.md §3). Wing: ``backbones``."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from clover_engine.backbones.base import BlockOutput
from clover_engine.backbones.clover.ops import rope_angles

MEMORY_MODES = ("state", "state+window")
PASS_KINDS = ("decode", "prefill", "reference", "train")


@dataclass
class LayerState:
    """Recurrent state of one layer for B sequences (allocated once, updated in place).

    Attributes:
        S: [B, H, K, V] fp32 delta-rule state (H = H_v for GDN, H_kv for attention).
        conv: [B, kernel-1, channels] conv tail (GDN layers, and attention layers
            with ``attention_conv_kernel_dim > 0``).
        win_k, win_v: [B, H_kv, W, D] ring buffer of RoPE'd keys / values
            (attention layers in ``state+window`` mode only).
    """

    S: torch.Tensor
    conv: torch.Tensor | None = None
    win_k: torch.Tensor | None = None
    win_v: torch.Tensor | None = None


@dataclass
class CloverState:
    """All layers' state plus how many tokens have been committed.

    Memory is constant in context length: nothing here grows with `position`.
    """

    layers: list[LayerState]
    memory_mode: str
    window: int
    position: int = 0  # tokens committed so far (absolute position of the next token)

    def nbytes(self) -> int:
        """Bytes held by all state tensors."""
        total = 0
        for ls in self.layers:
            for t in (ls.S, ls.conv, ls.win_k, ls.win_v):
                if t is not None:
                    total += t.numel() * t.element_size()
        return total


@dataclass
class Pass:
    """How one forward runs, chosen once by `CloverModel` and handed to every layer.

    ``kind``:

    * ``"decode"`` -- fast path: each committed block reads the state and folds itself in (chunked
      gated delta rule), then the block reads the new state; window = the ring buffer.
    * ``"prefill"`` -- fast path from a fresh state with several committed blocks (a prompt): all
      block-boundary states at once (`chunk_states`), then the block; same result as decode.
    * ``"reference"`` -- decode's order with the token-loop recurrence and the window as an
      explicit slice of the committed K/V (`CloverModel.forward_reference`).
    * ``"train"`` -- x = [clean T ++ noisy T]; clean block b and noisy block b both read the
      state before clean block b (`CloverModel.forward_train`, docs/architecture.md §9).

    Attributes:
        n_commit: C, committed tokens at the front of the forward (train: T, the clean half).
        block_size: committed block length L (the decode's block_size).
        pos: [T] int64 absolute positions of all tokens in the forward.
        start: absolute position of the first committed token (ring-buffer slot arithmetic).
        window: W, attention window keys in effect (0 = ``state`` mode).
        observe: collect `memory_share` and `state_norm` (not in train).
        graph_safe: no host sync anywhere in the forward (`clover_engine.backbones.clover.cuda_graphs`): the MoE takes a
            sync-free path and `expert_union` holds 0-d device tensors instead of ints.
        memory_share: per layer [B, L] head-mean memory share; state_norm: per layer scalar;
            expert_union: per layer int (0-d int64 tensor when `graph_safe`, and in a compiled
            few-token forward, `clover_engine.backbones.clover.compiled`).
    """

    kind: str
    n_commit: int
    block_size: int
    pos: torch.Tensor
    start: int = 0
    window: int = 0
    observe: bool = False
    graph_safe: bool = False
    memory_share: list = field(default_factory=list)
    state_norm: list = field(default_factory=list)
    expert_union: list = field(default_factory=list)
    _angles: dict = field(default_factory=dict, repr=False)

    def rope_angles(self, rot_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """cos and sin [T, rot_dim] fp32 of this forward's positions (`ops.rope_angles`), computed
        once per (rot_dim, theta) and shared by every layer; None when ``rot_dim == 0``."""
        if rot_dim == 0:
            return None
        key = (rot_dim, theta)
        if key not in self._angles:
            self._angles[key] = rope_angles(self.pos, rot_dim, theta)
        return self._angles[key]

    def __post_init__(self):
        if self.kind not in PASS_KINDS:
            raise ValueError(f"pass kind must be one of {PASS_KINDS}, got {self.kind!r}")

    def segments(self, T: int) -> list[tuple[int, int, bool]]:
        """Decode / reference order over a forward of T tokens: ``(start, end, is_commit)``
        per committed block (read the state, then fold the block in), then the block (reads the
        final state)."""
        n, L = self.n_commit, self.block_size
        return [(s, min(s + L, n), True) for s in range(0, n, L)] + [(n, T, False)]

    def record(self, share: torch.Tensor, S: torch.Tensor) -> None:
        """With `observe`: keep the block's memory share [B, H, L] (head mean) and the state's norm."""
        if self.observe:
            self.memory_share.append(share.mean(1).detach())  # [B, L]
            self.state_norm.append(torch.linalg.vector_norm(S.detach()))  # = S.norm(), without its wrapper


ModelOutput = BlockOutput  # Clover's name for the block output type (clover_engine.backbones.base)
