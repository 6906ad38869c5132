"""Decoder rules (DESIGN.md section 4) with a scripted model, and fast path == reference.

Run: .venv/bin/python -m pytest tests/clover_engine/test_decoder.py -q
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from clover_engine.backbones.base import OBSERVABLES, Capabilities
from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.recording.events import BlockEnd, BlockStart, DecodeEnd, StepEvent
from clover_engine.backbones.clover.model import CloverModel, ModelOutput
from clover_engine.decoding.policies import Entropy, Factor, Margin, TopK
from clover_engine.tokenizer import byte_tokenizer
from helpers import CFG_CONV, ReferenceDriven, loud_model

CFG = CloverConfig.from_name("clover-test")
MASK, EOS, V = CFG.mask_token_id, CFG.eos_token_id, CFG.vocab_size


# ------------------------------------------------------------------ scripted model
class ScriptedModel(torch.nn.Module):
    """Stands in for CloverModel; `script(call, block_ids) -> list of (token, logit) per slot`.

    The chosen token gets the given logit, every other token 0, MASK gets `mask_logit`
    (so a test can make MASK the raw argmax). Records every call.
    """

    def __init__(self, script, mask_logit=-1e9):
        super().__init__()
        self.config = CFG
        self.capabilities = Capabilities(family="scripted", cost_family="clover", observables=frozenset(OBSERVABLES))
        self.script = script
        self.mask_logit = mask_logit
        self.calls = []
        self._p = torch.nn.Parameter(torch.zeros(1))

    @property
    def device(self):
        return torch.device("cpu")

    @property
    def dtype(self):
        return torch.float32

    def setup_state(self, batch_size=1, memory_mode="state"):
        return CloverModel.setup_state.__get__(self._real())(batch_size, memory_mode)

    def _real(self):
        if not hasattr(self, "_real_model"):
            object.__setattr__(self, "_real_model", CloverModel(CFG))
        return self._real_model

    def forward(self, block_ids, state, commit_ids=None, block_size=None, observe=False):
        self.calls.append(dict(block=block_ids.clone(), commit=None if commit_ids is None else commit_ids.clone(),
                               observe=observe))
        L = block_ids.shape[1]
        logits = torch.zeros(1, L, V)
        logits[..., MASK] = self.mask_logit
        for i, (tok, logit) in enumerate(self.script(len(self.calls) - 1, block_ids[0].tolist())):
            logits[0, i, tok] = logit
        n = CFG.num_hidden_layers
        return ModelOutput(logits=logits, expert_union=torch.full((n,), 2),
                           memory_share=torch.zeros(n, 1, L) if observe else None,
                           state_norm=torch.zeros(n) if observe else None)


def conf_of(logit: float) -> float:
    """Confidence the decoder computes for a slot whose token has `logit` (others 0, MASK excluded)."""
    x = torch.zeros(V)
    x[5] = logit
    x[MASK] = float("-inf")
    return float(torch.softmax(x, -1).max())


def run(script, events=None, **kw):
    model = ScriptedModel(script, kw.pop("mask_logit", -1e9))
    dec = BlockDecoder(model, None, DecodeConfig(**kw))
    hooks = [events.append] if events is not None else []
    return dec.generate(list(range(10, 18)), hooks=hooks), model  # 8 ids: aligned for B <= 8


def steps_of(events):
    return [e for e in events if isinstance(e, StepEvent)]


# ------------------------------------------------------------------------ rules
def test_equality_at_threshold_is_accepted():
    # slot 0 exactly at threshold, slot 1 just below, others low
    script = lambda call, blk: [(20 + i, 8.0 if i == 0 else (7.999 if i == 1 else 1.0)) for i in range(len(blk))]
    dry = []
    run(script, dry, block_size=4, threshold=1.0, max_new_tokens=4)
    thr = float(steps_of(dry)[0].confidence[0])  # the exact float the decoder compares
    assert thr == pytest.approx(conf_of(8.0)) and thr < 1.0
    ev = []
    run(script, ev, block_size=4, threshold=thr, max_new_tokens=4)
    first = steps_of(ev)[0]
    assert first.accepted.tolist() == [True, False, False, False]
    assert not first.forced.any()


def test_forced_fill_writes_exactly_the_most_confident_slot():
    script = lambda call, blk: [(30 + i, [1.0, 3.0, 2.0, 0.5][i]) for i in range(len(blk))]
    ev = []
    res, _ = run(script, ev, block_size=4, threshold=0.99, max_new_tokens=4)
    s = steps_of(ev)
    assert s[0].forced.tolist() == [False, True, False, False]
    assert not s[0].accepted.any()
    assert res.nfe == 4 and res.n_forced == 4  # one forced slot per forward
    assert [st.forced.argmax() for st in s] == [1, 2, 0, 3]  # descending confidence order


def test_written_slots_never_change():
    # the model changes its mind every call: candidate = 40 + call, for every slot
    script = lambda call, blk: [(40 + call, 1.0) for _ in blk]
    ev = []
    res, _ = run(script, ev, block_size=8, threshold=0.99, max_new_tokens=12)
    prev = {}
    for st in steps_of(ev):
        before = prev.get(st.block_index)
        written_now = st.accepted | st.forced
        for i in range(len(st.tokens)):
            if not st.masked_before[i] and before is not None:
                assert st.tokens[i] == before[i], "a written slot changed"
            if written_now[i]:
                assert st.tokens[i] == st.candidate[i]
        prev[st.block_index] = st.tokens.copy()
    # every generated token is the candidate of the call that wrote it (one forced per call)
    assert sorted(res.tokens) == [40 + c for c in range(12)]


def test_eos_mid_block_truncates_and_fills_without_forwards():
    # step 0: slot 2 -> EOS accepted, slot 0 accepted; slots 1 and 3.. masked
    def script(call, blk):
        out = []
        for i in range(len(blk)):
            if call == 0:
                out.append((EOS, 20.0) if i == 2 else ((50, 20.0) if i == 0 else (60, 1.0)))
            else:
                out.append((61, 20.0))
        return out

    ev = []
    res, _ = run(script, ev, block_size=8, threshold=0.9, max_new_tokens=64)
    s = steps_of(ev)
    assert s[0].eos_filled.tolist() == [False, False, False, True, True, True, True, True]
    assert len(s) == 2  # slot 1 needs one more forward; slots after EOS need none
    assert res.tokens == [50, 61]  # text after the first EOS dropped
    assert res.stop_reason == "eos" and res.nfe == 2
    assert not any(isinstance(e, BlockStart) and e.block_index == 1 for e in ev)


def test_max_steps_exhaustion_writes_everything_as_forced():
    script = lambda call, blk: [(70 + i, 1.0) for i in range(len(blk))]
    ev = []
    res, _ = run(script, ev, block_size=8, threshold=0.99, max_steps=3, max_new_tokens=8)
    s = steps_of(ev)
    assert len(s) == 3
    assert s[2].forced.sum() == 6 and s[2].masked_before.sum() == 6
    assert res.tokens == [70 + i for i in range(8)]


def test_mask_is_never_a_candidate_or_emitted():
    script = lambda call, blk: [(80, 2.0) for _ in blk]
    ev = []
    res, _ = run(script, ev, block_size=4, threshold=0.5, max_new_tokens=12, mask_logit=50.0)
    assert MASK not in res.tokens
    for st in steps_of(ev):
        assert MASK not in st.candidate.tolist() and MASK not in st.top_tokens.tolist()


def test_threshold_one_writes_one_slot_per_forward():
    script = lambda call, blk: [(90, 12.0) for _ in blk]  # confident but below 1.0
    assert conf_of(12.0) < 1.0
    ev = []
    res, _ = run(script, ev, block_size=8, threshold=1.0, max_new_tokens=16)
    assert res.nfe == 16
    assert all(st.n_written == 1 for st in steps_of(ev))


def test_prompt_alignment_and_prefill():
    # prompt of 4 ids, block 3: one full prompt block committed, 1 prompt slot pre-filled
    script = lambda call, blk: [(100, 20.0) for _ in blk]
    model = ScriptedModel(script)
    ev = []
    res = BlockDecoder(model, None, DecodeConfig(block_size=3, threshold=0.9, max_new_tokens=5)).generate(
        [11, 12, 13, 14], hooks=[ev.append])
    starts = [e for e in ev if isinstance(e, BlockStart)]
    assert [s.position_start for s in starts] == [3, 6]
    assert starts[0].prefilled.tolist() == [True, False, False]
    assert starts[1].length == 3 and starts[1].prefilled.sum() == 0
    assert model.calls[0]["commit"].tolist() == [[11, 12, 13]]
    assert model.calls[1]["commit"].tolist() == [[14, 100, 100]]  # fused commit of block 0
    assert res.tokens == [100] * 5


def test_last_block_is_shorter_when_budget_is_not_a_multiple():
    script = lambda call, blk: [(100, 20.0) for _ in blk]
    ev = []
    res, model = run(script, ev, block_size=4, threshold=0.9, max_new_tokens=6)
    assert [c["block"].shape[1] for c in model.calls] == [4, 2]
    assert len(res.tokens) == 6


def test_events_one_step_per_forward_and_slots_covered_once():
    script = lambda call, blk: [(110 + i, [9.0, 1.0, 5.0, 0.0, 9.0, 2.0, 3.0, 1.0][i % 8]) for i in range(len(blk))]
    ev = []
    res, model = run(script, ev, block_size=8, threshold=0.95, max_new_tokens=24)
    s = steps_of(ev)
    assert len(s) == res.nfe == len(model.calls)
    for b in range(3):
        cover = sum((st.accepted | st.forced).astype(int) for st in s if st.block_index == b)
        assert cover.tolist() == [1] * 8
    assert isinstance(ev[-1], DecodeEnd) and sum(isinstance(e, BlockEnd) for e in ev) == 3
    assert res.trace is not None and len(res.trace) == res.nfe


def test_no_hook_means_no_observation():
    script = lambda call, blk: [(100, 20.0) for _ in blk]
    model = ScriptedModel(script)
    dec = BlockDecoder(model, None, DecodeConfig(block_size=4, threshold=0.9, max_new_tokens=8))
    res = dec.generate([1, 2, 3], record_trace=False)
    assert res.trace is None
    assert not any(c["observe"] for c in model.calls)
    seen = []
    with dec.hooks(seen.append):
        dec.generate([1, 2, 3], record_trace=False)
    assert seen and model.calls[-1]["observe"]
    n = len(seen)
    dec.generate([1, 2, 3], record_trace=False)
    assert len(seen) == n  # the context manager removed the hook
    handle = dec.add_hook(seen.append)
    handle.remove()
    handle.remove()  # idempotent
    dec.generate([1, 2, 3], record_trace=False)
    assert len(seen) == n


def test_cancel_keeps_what_was_written():
    stop = threading.Event()

    def script(call, blk):
        if call == 5:
            stop.set()
        return [(120, 1.0) for _ in blk]

    model = ScriptedModel(script)
    dec = BlockDecoder(model, None, DecodeConfig(block_size=4, threshold=0.99, max_new_tokens=40))
    res = dec.generate([1, 2, 3, 4], cancel=stop)
    assert res.stop_reason == "cancelled"
    # equal confidences: each forward forces the first masked slot, so the six forwards
    # wrote block 0 (4 slots) and the first 2 slots of block 1, all kept
    assert res.nfe == 6 and res.tokens == [120] * 6
    assert res.trace.summary()["stop_reason"] == "cancelled"


# ----------------------------------------------------------------------- policies
def test_policies():
    conf = torch.tensor([0.9, 0.5, 0.99, 0.2])
    masked = torch.tensor([True, True, False, True])
    probs = torch.tensor([[0.9, 0.1, 0.0], [0.5, 0.45, 0.05], [0.99, 0.01, 0.0], [0.2, 0.4, 0.4]])
    assert TopK(2).select(conf, masked, probs).tolist() == [True, True, False, False]
    assert Margin(0.5).select(conf, masked, probs).tolist() == [True, False, False, False]
    ent = Entropy(0.4).select(conf, masked, probs)
    assert ent.tolist() == [True, False, False, False]
    # factor: sorted masked confs 0.9, 0.5, 0.2 -> 1*(0.1)=0.1<1 ok; 2*0.5=1.0 not < 1 -> stop
    assert Factor(1.0).select(conf, masked, probs).tolist() == [True, False, False, False]
    assert Factor(1.1).select(conf, masked, probs).tolist() == [True, True, False, False]


# -------------------------------------------------------------------- processors
def test_repetition_control_fires_and_is_recorded():
    # prompt "1 2 3 1 2" -> the next slot would repeat "3" after "1 2"
    script = lambda call, blk: [(3, 30.0) for _ in blk]
    model = ScriptedModel(script)
    ev = []
    dec = BlockDecoder(model, None, DecodeConfig(block_size=1, threshold=0.5, max_new_tokens=1,
                                                 repetition_penalty=100.0, repetition_ngram=3))
    res = dec.generate([1, 2, 3, 1, 2], hooks=[ev.append])
    f = steps_of(ev)[0].firings
    assert [(x.name, x.token) for x in f] == [("repetition", 3)]
    assert res.tokens != [3]


def test_eos_bias_fires_past_soft_limit():
    script = lambda call, blk: [(100, 3.0) for _ in blk]
    ev = []
    res, _ = run(script, ev, block_size=4, threshold=0.01, max_new_tokens=40, eos_bias_soft_limit=5,
                 eos_bias_rate=2.0)
    fired = [f for st in steps_of(ev) for f in st.firings]
    assert fired and all(f.name == "eos_bias" and f.token == EOS and f.value > 0 for f in fired)
    assert res.stop_reason == "eos" and 5 <= len(res.tokens) < 40


# -------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw, exc, words", [
    (dict(threshold=0.0), ValueError, "(0, 1]"),
    (dict(threshold=1.5), ValueError, "(0, 1]"),
    (dict(threshold=float("nan")), ValueError, "(0, 1]"),
    (dict(threshold="high"), TypeError, "threshold"),
    (dict(block_size=0), ValueError, "block_size"),
    (dict(block_size=2.5), TypeError, "block_size"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
    (dict(policy="greedy"), ValueError, "low_confidence"),
    (dict(memory_mode="kv"), ValueError, "state"),
], ids=["thr0", "thr1.5", "thrnan", "thrstr", "bs0", "bsfloat", "mnt0", "policy", "mode"])
def test_bad_config(kw, exc, words):
    with pytest.raises(exc, match=words.replace("(", r"\(").replace("[", r"\[").replace("]", r"\]")):
        DecodeConfig(**kw)


def test_bad_prompts():
    model = CloverModel(CFG)
    dec = BlockDecoder(model, byte_tokenizer(), DecodeConfig(block_size=4, max_new_tokens=2))
    with pytest.raises(ValueError, match="empty"):
        dec.generate("")
    with pytest.raises(ValueError, match="empty"):
        dec.generate([])
    with pytest.raises(ValueError, match="MASK"):
        dec.generate([1, 2, MASK, 3])
    with pytest.raises(ValueError, match="MASK"):
        dec.generate("hello <|mask|> world")
    with pytest.raises(ValueError, match="context"):
        dec.generate([1] * CFG.max_position_embeddings)
    with pytest.raises(ValueError, match="vocabulary"):
        dec.generate([1, V + 5])
    with pytest.raises(TypeError, match="prompt"):
        dec.generate(3.5)
    with pytest.raises(TypeError, match="tokenizer"):
        BlockDecoder(model, None).generate("text")
    with pytest.raises(ValueError, match="attention_window"):
        CloverModel(CloverConfig(**{**CFG.to_dict(), "attention_window": 0})).setup_state(1, "state+window")


# --------------------------------------------------------- real model: fast == reference
@pytest.mark.parametrize("mode", ["state", "state+window"])
@pytest.mark.parametrize("block_size, prompt_len", [(1, 5), (4, 8), (4, 10), (32, 32), (32, 45)],
                         ids=["bs1", "bs4-aligned", "bs4-partial", "bs32-aligned", "bs32-partial"])
@pytest.mark.parametrize("cfg", [CFG, CFG_CONV], ids=["base", "attn-conv"])
def test_fast_path_equals_reference(block_size, prompt_len, mode, cfg):
    model = loud_model(cfg=cfg)
    prompt = torch.randint(0, 256, (prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    dc = DecodeConfig(block_size=block_size, threshold=0.3, max_new_tokens=40 if block_size < 32 else 64,
                      memory_mode=mode)
    fast = BlockDecoder(model, None, dc).generate(prompt)
    wrapped = ReferenceDriven(model)
    ref = BlockDecoder(wrapped, None, dc).generate(prompt)
    assert fast.tokens == ref.tokens
    assert fast.nfe == ref.nfe
    assert wrapped.max_diff < 1e-3, wrapped.max_diff
    assert fast.n_forced < fast.nfe or block_size == 1  # the loud model does accept slots


def test_block_size_one_is_the_greedy_path():
    model = loud_model(seed=3)
    prompt = [5, 17, 99, 3, 42]
    res = BlockDecoder(model, None, DecodeConfig(block_size=1, threshold=0.95, max_new_tokens=12)).generate(prompt)
    ids = list(prompt)
    greedy = []
    for _ in range(12):
        logits = model.forward_reference(torch.tensor([ids]), torch.tensor([[MASK]]), 1).logits[0, 0]
        logits[MASK] = float("-inf")
        nxt = int(logits.argmax())
        if nxt == EOS:
            break
        greedy.append(nxt)
        ids.append(nxt)
    assert res.tokens == greedy


@pytest.mark.parametrize("mode", ["state", "state+window"])
def test_state_memory_constant_in_context(mode):
    model = CloverModel(CFG).eval()
    sizes = []
    for n in (64, 4096):
        dec = BlockDecoder(model, None, DecodeConfig(block_size=32, max_new_tokens=1, memory_mode=mode))
        captured = {}
        orig = model.setup_state

        def spy(*a, **k):
            captured["state"] = orig(*a, **k)
            return captured["state"]

        model.setup_state = spy
        try:
            dec.generate(torch.randint(0, 256, (n,)).tolist(), record_trace=False)
        finally:
            del model.setup_state
        st = captured["state"]
        assert st.position == n  # the whole prompt went into the state
        sizes.append(st.nbytes())
    assert sizes[0] == sizes[1] > 0


def test_events_own_their_arrays():
    """Block contents change in place during decoding; events must hold copies."""
    script = lambda call, blk: [(100 + call, 20.0 if i == call else 0.0) for i in range(len(blk))]
    ev = []
    run(script, ev, block_size=4, threshold=0.9, max_new_tokens=4)
    start = next(e for e in ev if isinstance(e, BlockStart))
    assert start.tokens.tolist() == [MASK] * 4
    s = steps_of(ev)
    assert [int((st.tokens != MASK).sum()) for st in s] == [1, 2, 3, 4]


def test_observer_time_is_reported_apart_from_the_decode(tmp_path):
    """`DecodeResult.observer_s` holds the hooks' and events' time (a hook that sleeps 20 ms per
    step puts at least that much in it), none without observers; the steps' own times (forward +
    selection) fit in what is left of the wall time."""
    import time

    dec = BlockDecoder(loud_model(seed=5), None, DecodeConfig(block_size=4, threshold=0.9, max_new_tokens=8))
    assert dec.generate([5, 6, 7], record_trace=False).observer_s == 0.0
    steps = []

    def slow(ev):
        if isinstance(ev, StepEvent):
            steps.append(ev)
            time.sleep(0.02)

    r = dec.generate([5, 6, 7], hooks=(slow,), record_trace=True)
    assert len(steps) >= 2
    assert 0.02 * len(steps) <= r.observer_s < r.wall_s
    assert sum(ev.wall_s for ev in steps) <= r.wall_s - r.observer_s
    # the trace keeps it, through a save and load
    assert r.trace.decode_end.observer_s == r.observer_s
    from clover_engine.recording.trace import Trace

    path = tmp_path / "t.parquet"
    r.trace.save(path)
    assert Trace.load(path).decode_end.observer_s == r.observer_s
    # a trace saved before the field existed (tests/data/small_trace.parquet) loads with 0.0
    from pathlib import Path

    old = Trace.load(Path(__file__).resolve().parents[1] / "data" / "small_trace.parquet")
    assert old.decode_end.observer_s == 0.0 and old.decode_end.wall_s > 0
