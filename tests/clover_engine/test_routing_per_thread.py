"""A model shared by two decoding threads: each reads its own forward's routing (`PerThread`).

A served explorer holds one copy of a model for every session, and a session's careful decode runs in a
background thread, so two decodes run forwards of the same MoE modules at once. What a forward records for
its decoder (each layer's `Routing`, the backbone's `RoutingStats`) must be that thread's own: the fresh-clone
CI once failed a LLaDA2 decode with "mask [96] ... indexed tensor [88, 2]" when another test's background
careful decode had just written its own tokens' routing into the shared layers.

Here thread A runs a forward, thread B runs a forward of another length on the same model, and only then
does A read what it recorded: it must be A's (equal to a forward run alone), never B's.

Run: ``.venv/bin/python -m pytest -q tests/clover_engine/test_routing_per_thread.py``
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from clover_engine.backbones.llada2_moe import write_tiny_llada2_moe
from clover_engine.backbones.llada_moe import write_tiny_llada_moe
from clover_engine.backbones.moe import PerThread
from clover_engine.backbones.sdar_moe import write_tiny_sdar_moe
from clover_engine.checkpoint import load_model

WRITERS = {"llada2": write_tiny_llada2_moe, "llada_moe": write_tiny_llada_moe, "sdar_moe": write_tiny_sdar_moe}


def _layers(model) -> list:
    """The model's MoE feed-forwards (LLaDA-MoE keeps them on its inner LM)."""
    return (model.lm if hasattr(model, "lm") and hasattr(model.lm, "moe_layers") else model).moe_layers()


def _forward(model, history: int, block: int):
    """One forward of ``block`` slots after ``history`` committed tokens; -> (union per layer, layer-0 routing rows)."""
    g = torch.Generator().manual_seed(history * 100 + block)
    ids = torch.randint(3, 60, (1, history + block), generator=g)
    state = model.setup_state(1, "state")
    model(ids[:, history:], state, commit_ids=ids[:, :history], block_size=block)
    return model.last_routing


@pytest.mark.parametrize("family", sorted(WRITERS))
def test_each_thread_reads_the_routing_of_its_own_forward(family, tmp_path):
    model = load_model(WRITERS[family](tmp_path / family))
    alone = _forward(model, 40, 8)  # what A's forward records when nothing else runs
    alone_rows = [m.last.selected.shape for m in _layers(model)]
    a_ran, b_ran = threading.Event(), threading.Event()
    seen: dict = {}

    def thread_a():
        _forward(model, 40, 8)
        a_ran.set()
        b_ran.wait(60)
        seen["a"] = model.last_routing  # after B's forward of another size on the same modules
        seen["a_layers"] = [m.last.selected.shape for m in _layers(model)]

    def thread_b():
        a_ran.wait(60)
        seen["b"] = _forward(model, 80, 16)
        b_ran.set()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert b_ran.is_set() and "a" in seen, "the two forwards did not both run"
    assert torch.equal(seen["a"].union, alone.union)
    assert torch.equal(seen["a"].union_block, alone.union_block)
    assert torch.equal(seen["a"].counts, alone.counts)
    assert seen["b"].counts.sum() > seen["a"].counts.sum()  # B routed more tokens, and A did not read them
    assert seen["a_layers"] == alone_rows  # each layer's last routing is A's own rows, never B's


def test_a_per_thread_attribute_is_unset_elsewhere_and_survives_deepcopy():
    class Holder(torch.nn.Module):
        last = PerThread()

    h = Holder()
    h.last = "mine"
    other: list = []
    t = threading.Thread(target=lambda: other.append(h.last))
    t.start()
    t.join()
    assert h.last == "mine" and other == [None]
    clone = copy.deepcopy(h)  # a module holding a threading.local in its __dict__ could not be copied
    assert clone.last is None and h.last == "mine"
    assert Holder.last.name == "last"
