"""A decode's cost accounting: the decoder reports each forward's facts (tokens in it,
committed tokens, block slots, prefix length, expert union); the meter prices them with
`clover_engine.cost.formulas.forward_cost` and keeps the totals. The decoder builds one only when
a hook is registered, so a decode without hooks does no cost work. The formulas are those of the
model's cost family (`clover_engine.cost.formulas.cost_family`: from the backbone's capabilities). A drafter
backbone (its config has a ``drafter`` section, `clover_engine.cost.drafter.drafter_section`) is priced as
its base's forwards plus the drafter's: `CostMeter.verify_round` for a verify round, `CostMeter.forward`
for a commit-mode forward (`clover_engine.cost.drafter`).

Wing: ``cost``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clover_engine.backbones.base import Capabilities
from clover_engine.cost.drafter import VerifyRoundCost, commit_forward_cost, drafter_section, verify_round_cost
from clover_engine.cost.formulas import ForwardCost, cost_family, forward_cost


class CostMeter:
    """Bytes read and FLOPs of every forward of one decode, and their sums.

    Args:
        config: the model's config (a `CloverConfig`, or another backbone's config).
        weight_bytes: bytes per weight (the model's dtype itemsize).
        memory_mode: the decode's memory mode (``state+window`` prices the window's K/V).
        window: W of the decode's state (0 without a window).
        block_size: the decode's block size (committed blocks are attention segments of it).
        capabilities: the model's `Capabilities` (or their record), which name its cost family;
            None: the family is read from the config's fields (`cost_family`).
    """

    def __init__(self, config: Any, weight_bytes: float, memory_mode: str, window: int, block_size: int,
                 capabilities: Capabilities | Mapping[str, Any] | None = None):
        self.config, self.weight_bytes = config, float(weight_bytes)
        self.capabilities = capabilities
        self.cost_family = cost_family(config, capabilities)
        self.memory_mode, self.window, self.block_size = memory_mode, int(window), int(block_size)
        # a drafter backbone: its base's history is a KV cache, its drafter adds its own forwards
        self.drafter = drafter_section(config) if self.cost_family == "kv_cache" else None
        self.bytes_read = 0.0
        self.flops = 0.0
        # Clover's cost does not depend on the context length (history is state), and the union
        # enters only through its sum over layers (routed-expert bytes, mean union): a decode's
        # forwards repeat a few (C, L, sum of the union) keys, priced once each
        self._memo: dict | None = {} if self.cost_family == "clover" else None

    def forward(self, n_commit_tokens: int, block_len: int, expert_union: Sequence[int] | None,
                context_len: int) -> ForwardCost:
        """Price one forward and add it to the totals.

        Args:
            n_commit_tokens: committed tokens folded in by this forward (C).
            block_len: slots of the current block in it (L).
            expert_union: (N,) distinct routed experts per layer, or None (no MoE).
            context_len: tokens of history before the committed ones (a KV cache's length).

        Returns:
            The forward's `ForwardCost` (bytes, FLOPs, breakdown); for a Clover model the same
            object for forwards with the same C, L and summed union (treat it as read-only); for a
            drafter backbone (commit mode) the base's read of the C committed tokens plus the
            drafter's forward over the L slots (`clover_engine.cost.drafter.commit_forward_cost`).
        """
        if self.drafter is not None:
            cost = commit_forward_cost(self.config, n_commit_tokens, block_len, context_len, self.weight_bytes,
                                       drafter=self.drafter).total
            self.bytes_read += cost.bytes_read
            self.flops += cost.flops
            return cost
        union = None if expert_union is None else list(expert_union)
        key = None if self._memo is None or union is None else (n_commit_tokens, block_len, sum(union), len(union))
        cost = None if key is None else self._memo.get(key)
        if cost is None:
            cost = forward_cost(self.config, n_commit_tokens + block_len, union, weight_bytes=self.weight_bytes,
                                n_commit_tokens=n_commit_tokens, block_len=block_len, memory_mode=self.memory_mode,
                                window=self.window, commit_block_len=self.block_size, context_len=context_len,
                                capabilities=self.capabilities)
            if key is not None:
                self._memo[key] = cost
        self.bytes_read += cost.bytes_read
        self.flops += cost.flops
        return cost

    def verify_round(self, n_read: int, n_draft: int, context_len: int) -> VerifyRoundCost:
        """Price one round of verify decoding of a drafter backbone and add it to the totals.

        Args:
            n_read: tokens the base reads in the round (``[anchor, drafts]``; the prompt for the prefill).
            n_draft: slots of the drafter forward (``k + 1``), 0 when nothing is drafted.
            context_len: tokens the base had read before the round.

        Returns:
            The round's `clover_engine.cost.drafter.VerifyRoundCost` (drafter, base and total).

        Raises:
            ValueError: the model has no drafter (`clover_engine.cost.drafter.verify_round_cost`).
        """
        cost = verify_round_cost(self.config, n_read, n_draft, context_len, self.weight_bytes, drafter=self.drafter)
        self.bytes_read += cost.total.bytes_read
        self.flops += cost.total.flops
        return cost
