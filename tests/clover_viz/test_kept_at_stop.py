"""A run stopped from its page keeps what the page showed plus one forward (`clover_viz.runs.kept_at_stop`).

The check is against the decoder itself: a run cut back to forward k+1 must equal, event for event
where it matters (tokens, NFE, forced fills, bytes, FLOPs, steps, block ends), the same decode
cancelled by the decoder at forward k+1 -- for the Clover decoder, a block-causal (SDAR) one and a
masked diffusion (LLaDA-MoE) one.

Wing: ``clover_viz``.
"""

from __future__ import annotations

import numpy as np
import pytest

from clover_engine.backbones.block_causal import write_tiny_block_causal
from clover_engine.backbones.clover.model import random_model
from clover_engine.backbones.llada_moe import write_tiny_llada_moe
from clover_engine.checkpoint import load_model
from clover_engine.decoding import decoder_for
from clover_engine.decoding.config import DecodeConfig
from clover_engine.decoding.masked_diffusion_samplers import LLaDASampler
from clover_engine.recording.events import BlockEnd, DecodeEnd, StepEvent
from clover_engine.recording.trace import Trace
from clover_viz.runs import generated_ids, kept_at_stop

PROMPT = [5, 9, 14, 3, 7]


def _decoder(kind: str, tmp_path):
    if kind == "clover":
        model = random_model("clover-test", seed=1, weight_scale=15.0).eval()
        return decoder_for(model, None, DecodeConfig(block_size=8, threshold=0.9, max_new_tokens=64))
    if kind == "sdar":
        return decoder_for(load_model(write_tiny_block_causal(tmp_path / "sdar", "sdar", seed=2)))
    if kind.startswith("llada2"):  # LLaDA2.0's sampler; LLaDA2.1's with token editing (low thresholds: many edits)
        from clover_engine.backbones.llada2_moe import write_tiny_llada2_moe  # local: two cases need it
        from clover_engine.decoding.llada2_samplers import LLaDA21Sampler, LLaDA2Sampler  # local: as above

        cfg = (LLaDA2Sampler(gen_length=32, block_length=8, steps=8, threshold=0.99) if kind == "llada2"
               else LLaDA21Sampler(gen_length=32, block_length=8, threshold=0.6, editing_threshold=0.4))
        return decoder_for(load_model(write_tiny_llada2_moe(tmp_path / kind, seed=1, sharpen=12.0)), None, cfg)
    # LLaDA's sampler with one token per step (steps == gen_length), two blocks of 16
    cfg = LLaDASampler(gen_length=32, block_length=16, steps=32)
    return decoder_for(load_model(write_tiny_llada_moe(tmp_path / "llada-moe", seed=3)), None, cfg)


def _run(dec, stop_after: int) -> Trace:
    """Decode PROMPT, cancelled by the decoder after its ``stop_after``-th forward; -> its trace."""
    seen: list[int] = []

    def hook(ev):
        if isinstance(ev, StepEvent):
            seen.append(1)

    return dec.generate(PROMPT, hooks=[hook], cancel=lambda: len(seen) >= stop_after).trace


@pytest.mark.parametrize("kind", ["clover", "sdar", "llada-moe", "llada2", "llada21"])
def test_a_run_cut_back_equals_the_decoder_stopped_one_forward_after_the_shown(kind, tmp_path):
    dec = _decoder(kind, tmp_path)
    ahead = _run(dec, 14)  # the decode ran ahead of its page to forward 14 before it heard the Stop
    assert ahead.decode_end.stop_reason == "cancelled" and len(ahead) == 14, ahead.decode_end
    checked = 0
    for shown in (1, 4, 7, 10):
        page, held = ahead.split(shown)
        events, dropped = kept_at_stop(page, held)
        assert dropped == 14 - shown - 1, (shown, dropped)
        for ev in events:
            page(ev)
        want = _run(dec, shown + 1)  # the same decode, stopped by the decoder at the kept forward
        got_end, want_end = page.decode_end, want.decode_end
        assert got_end.tokens.tolist() == want_end.tokens.tolist() == generated_ids(want)
        assert (got_end.nfe, got_end.n_forced, got_end.stop_reason) == (want_end.nfe, want_end.n_forced, "cancelled")
        for name in ("bytes_read", "flops"):
            g, w = getattr(got_end, name), getattr(want_end, name)
            assert (g is None and w is None) or g == pytest.approx(w, rel=1e-9), name
        assert len(page) == len(want) == shown + 1
        assert [(b.block_index, b.n_steps, b.hit_eos, b.tokens.tolist()) for b in page.block_ends] == \
            [(b.block_index, b.n_steps, b.hit_eos, b.tokens.tolist()) for b in want.block_ends]
        assert abs(got_end.tokens_per_forward - want_end.tokens_per_forward) < 1e-12
        checked += 1
    assert checked == 4


def test_nothing_is_cut_when_no_forward_ran_past_the_kept_one(tmp_path):
    dec = _decoder("clover", tmp_path)
    ahead = _run(dec, 6)
    page, held = ahead.split(5)  # one forward after the shown ones: all of it is kept
    events, dropped = kept_at_stop(page, held)
    assert dropped == 0 and events is held


def test_a_decoder_the_rule_does_not_describe_keeps_its_run(tmp_path):
    """Where the rule would not give the decoder's own tokens for the whole run, nothing is cut."""
    dec = _decoder("clover", tmp_path)
    ahead = _run(dec, 10)
    page, held = ahead.split(3)
    end = held[-1]
    forged = held[:-1] + [DecodeEnd(tokens=np.append(end.tokens, 7), nfe=end.nfe, tokens_per_forward=1.0,
                                    n_forced=end.n_forced, wall_s=end.wall_s, stop_reason="cancelled")]
    events, dropped = kept_at_stop(page, forged)
    assert dropped == 0 and events is forged


def test_held_events_must_end_with_the_decode_end(tmp_path):
    dec = _decoder("clover", tmp_path)
    whole = _run(dec, 6)
    page, held = whole.split(2)
    with pytest.raises(ValueError, match="DecodeEnd"):
        kept_at_stop(page, held[:-1])
    # Trace.split: the head holds the first forwards (and no DecodeEnd), the rest holds every later event
    assert len(page) == 2 and page.decode_end is None and page.vocab == {k: whole.vocab[k] for k in page.vocab}
    assert sum(isinstance(ev, StepEvent) for ev in held) == 4 and isinstance(held[-1], DecodeEnd)
    assert any(isinstance(ev, BlockEnd) for ev in held)
    with pytest.raises(ValueError, match="n_steps"):
        whole.split(-1)
