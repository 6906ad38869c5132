"""Branching a decode (clover_engine.decoding.branch, BlockDecoder.branch) on every block-rule backbone.

Resume with no change reproduces the recorded decode token for token from every step (Clover in
both memory modes, the causal-LM adapter, masked diffusion); a chosen token appears at its slot in
the branch's trace and the rest follows the rule (checked against a decoder step run by hand);
re-masking a written slot, including one in a finished block, decodes it again; settings change
from the branch point; a branch saves, loads and is branched again; traces that cannot resume say so.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clover_engine.decoding.branch import Branch, SlotEdit, branch_label, first_difference
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.recording.trace import Trace
from helpers import loud_model

transformers = pytest.importorskip("transformers")

PROMPT = [5, 9, 33, 17, 60, 4, 8, 21, 70, 11]
V = 128


def _tiny_hf(kind: str, path):
    from clover_engine.backbones.masked_diffusion import save_masked_diffusion
    from clover_engine.checkpoint import load_model

    torch.manual_seed(0)
    common = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=1,
                  initializer_range=0.2, tie_word_embeddings=False)
    src = (transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)) if kind == "dream"
           else transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))).eval()
    if kind == "dream":
        save_masked_diffusion(src, path, "dream", 126)
    else:
        src.save_pretrained(path)
    model = load_model(str(path))
    if kind == "causal_lm":
        model.config.mask_token_id = 127
    model.config.eos_token_id = 3  # a token these random models write now and then: EOS paths get exercised
    return model


def _tiny_drafted():
    """A tiny random Llama target with a tiny random block drafter (commit mode follows the block protocol)."""
    from clover_engine.backbones.drafter.model import DraftedLM
    from clover_engine.backbones.drafter.net import BlockDrafter, DrafterConfig

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   eos_token_id=3, bos_token_id=1, initializer_range=0.2, tie_word_embeddings=True)
    lm = transformers.LlamaForCausalLM(cfg).eval()
    net = BlockDrafter(DrafterConfig(hidden_size=64, target_layers=(1, 2), num_layers=1, num_heads=4, num_kv_heads=2,
                                     head_dim=16, intermediate_size=128, block_size=4, vocab_size=V,
                                     mask_token_id=127, rope_theta=10000.0))
    net.init_layers_from(lm, [1])
    return DraftedLM.build(lm, net, "tiny-drafter", 127, 3)


@pytest.fixture(scope="module", params=["clover", "clover_window", "causal_lm", "dream", "drafter"])
def run(request, tmp_path_factory):
    """(decoder, DecodeConfig, recorded trace) for one backbone."""
    torch.set_num_threads(1)
    kind = request.param
    if kind.startswith("clover"):
        model = loud_model(1)
        mode = "state+window" if kind == "clover_window" else "state"
        dc = DecodeConfig(block_size=8, threshold=0.5, max_new_tokens=28, memory_mode=mode)
    else:
        model = _tiny_drafted() if kind == "drafter" else _tiny_hf(kind, tmp_path_factory.mktemp(kind))
        dc = DecodeConfig(block_size=4, threshold=0.2, max_new_tokens=18)
    dec = BlockDecoder(model, None, dc)
    res = dec.generate(PROMPT)
    assert res.nfe > len(res.trace.block_starts), "the decode needs blocks of several steps to test resuming"
    return dec, dc, res


def _points(trace):
    """Every (block, step) of the trace, plus each block's start (-1)."""
    out = []
    for b in sorted({ev.block_index for ev in trace.steps}):
        out.append((b, -1))
        out += [(b, ev.step_index) for ev in trace.steps if ev.block_index == b]
    return out


def test_resume_without_change_reproduces_the_decode_from_every_step(run):
    dec, dc, res = run
    for b, s in _points(res.trace):
        br = dec.branch(res.trace, Branch(b, s))
        assert br.tokens == res.tokens, (b, s)
        assert br.nfe == res.nfe and br.n_forced == res.n_forced and br.stop_reason == res.stop_reason
        got = [(e.block_index, e.step_index, e.tokens.tolist()) for e in br.trace.steps]
        want = [(e.block_index, e.step_index, e.tokens.tolist()) for e in res.trace.steps]
        assert got == want, (b, s)
        assert br.trace.meta["branch"]["block_index"] == b and br.trace.meta["branch"]["edits"] == []


def test_a_chosen_token_is_written_and_the_rest_follows_the_rule(run):
    dec, dc, res = run
    trace = res.trace
    ev = next(e for e in trace.steps if e.masked_before.sum() >= 3)  # a step with masked slots left
    slot = int(np.flatnonzero(ev.masked_before)[-1])
    second = int(ev.top_tokens[slot, 1])
    br = dec.branch(trace, Branch.choose(ev.block_index, ev.step_index, slot, second))
    mark = next(e for e in br.trace.steps if (e.block_index, e.step_index) == (ev.block_index, ev.step_index))
    assert mark.tokens[slot] == second and mark.forced[slot] and not mark.accepted[slot]
    later = [e for e in br.trace.steps if e.block_index == ev.block_index and e.step_index > ev.step_index]
    assert all(e.tokens[slot] == second for e in later)
    # the next forward is the rule applied to the edited block: run it by hand
    gen = br.tokens
    assert br.trace.meta["branch"]["edits"][0]["token"] == second
    assert "->" in br.trace.meta["branch"]["label"]
    pos = ev.position_start + slot - len(PROMPT)
    assert gen[pos] == second if pos < len(gen) else True
    assert first_difference(res.tokens, br.tokens) is not None or res.tokens[pos] == second


def test_resume_after_a_choice_equals_the_same_choice_replayed(run):
    """Branch of a branch with no change reproduces the branch: the edit is part of the recorded history."""
    dec, dc, res = run
    ev = next(e for e in res.trace.steps if e.masked_before.sum() >= 2)
    slot = int(np.flatnonzero(ev.masked_before)[0])
    br = dec.branch(res.trace, Branch.choose(ev.block_index, ev.step_index, slot, int(ev.top_tokens[slot, 1])))
    last = br.trace.steps[-1]
    again = dec.branch(br.trace, Branch(last.block_index, last.step_index))
    assert again.tokens == br.tokens and again.nfe == br.nfe
    mid = br.trace.steps[len(br.trace.steps) // 2]
    again = dec.branch(br.trace, Branch(mid.block_index, mid.step_index))
    assert again.tokens == br.tokens


def test_remask_of_a_finished_blocks_slot_decodes_it_again(run):
    dec, dc, res = run
    trace = res.trace
    end = trace.block_ends[0]
    start = trace.block_starts[0]
    slot = int(np.flatnonzero(~start.prefilled)[0])
    last = max(e.step_index for e in trace.steps if e.block_index == 0)
    br = dec.branch(trace, Branch.remask(0, last, slot))
    steps0 = [e for e in br.trace.steps if e.block_index == 0]
    assert len(steps0) == last + 2  # one more forward on block 0 refills the slot
    assert steps0[last].tokens[slot] == dc_mask(dec)
    assert steps0[-1].masked_before[slot] and steps0[-1].tokens[slot] != dc_mask(dec)
    assert br.trace.block_ends[0].tokens[slot] == steps0[-1].tokens[slot]
    if steps0[-1].tokens[slot] == end.tokens[slot]:  # refilled the same: the decode goes on unchanged
        assert br.tokens == res.tokens
    with pytest.raises(ValueError, match="nothing to re-mask"):
        ev = next(e for e in trace.steps if e.masked_before.sum() >= 2)
        dec.branch(trace, Branch.remask(ev.block_index, ev.step_index, int(np.flatnonzero(ev.tokens == dc_mask(dec))[0])))


def dc_mask(dec) -> int:
    return dec.model.config.mask_token_id


def test_new_settings_apply_from_the_branch_point(run):
    dec, dc, res = run
    trace = res.trace
    whole = dec.capabilities.commits_whole_blocks  # Clover: only a divisor of the block's size
    new = DecodeConfig(**{**dc.to_dict(), "threshold": 1.0,
                          "block_size": dc.block_size // 2 if whole or dec.capabilities.drafts else 2 * dc.block_size})
    br = dec.branch(trace, Branch(0, 0, config=new))
    assert br.trace.decode_config["threshold"] == 1.0
    assert br.trace.meta["branch"]["settings"]["threshold"] == [dc.threshold, 1.0]
    later = [e for e in br.trace.steps if (e.block_index, e.step_index) > (0, 0)]
    assert all(e.accepted.sum() + e.forced.sum() + e.eos_filled.sum() >= 1 for e in later)
    for bs in br.trace.block_starts[1:]:  # later blocks sit on the new grid
        assert bs.position_start % new.block_size == 0 or bs.block_index == 1
        assert (bs.position_start + bs.length) % new.block_size == 0 or bs is br.trace.block_starts[-1]
    assert "threshold" in branch_label(br.trace.meta["branch"])
    if whole:
        with pytest.raises(ValueError, match="divisor"):
            dec.branch(trace, Branch(0, 0, config=DecodeConfig(**{**dc.to_dict(), "block_size": 2 * dc.block_size})))


def test_branch_trace_saves_loads_and_branches_again(run, tmp_path):
    dec, dc, res = run
    ev = next(e for e in res.trace.steps if e.masked_before.any())
    slots = np.flatnonzero(ev.masked_before)
    br = dec.branch(res.trace, Branch(ev.block_index, ev.step_index, (SlotEdit(int(slots[0]), 7),)))
    path = br.trace.save(tmp_path / "branch.parquet")
    loaded = Trace.load(path)
    assert loaded.meta["branch"] == br.trace.meta["branch"]
    assert loaded.generated_tokens.tolist() == br.tokens
    again = dec.branch(loaded, Branch(ev.block_index, ev.step_index))
    assert again.tokens == br.tokens


def test_bad_branches_say_what_is_wrong(run):
    dec, dc, res = run
    trace = res.trace
    with pytest.raises(ValueError, match="block 99 is not in this trace"):
        dec.branch(trace, Branch(99, 0))
    with pytest.raises(ValueError, match="step_index must be in"):
        dec.branch(trace, Branch(0, 50))
    with pytest.raises(ValueError, match="prompt token|outside block"):
        dec.branch(trace, Branch.choose(0, 0, 0 if trace.block_starts[0].prefilled[0] else 99, 7))
    with pytest.raises(ValueError, match="cannot be written"):
        dec.branch(trace, Branch.choose(0, 0, int(np.flatnonzero(~trace.block_starts[0].prefilled)[0]), dc_mask(dec)))
    with pytest.raises(ValueError, match="give the step"):
        dec.branch(trace, Branch.choose(0, -1, 3, 7))
    with pytest.raises(TypeError, match="Branch"):
        dec.branch(trace, (0, 0))


def test_another_models_trace_and_a_verify_trace_are_refused():
    torch.set_num_threads(1)
    dec = BlockDecoder(loud_model(1), None, DecodeConfig(block_size=8, threshold=0.5, max_new_tokens=8))
    res = dec.generate(PROMPT)
    other = Trace(decode_config=res.trace.decode_config, model_id="someone-else", prompt_ids=PROMPT,
                  meta=res.trace.meta)
    for e in res.trace.iter_events():
        other(e)
    with pytest.raises(ValueError, match="open the trace's model first"):
        dec.branch(other, Branch(0, 0))
    revised = Trace(decode_config=res.trace.decode_config, model_id=res.trace.model_id, prompt_ids=PROMPT,
                    meta={**res.trace.meta, "capabilities": {**res.trace.meta["capabilities"],
                                                             "sampler": "diffusion_gemma"}})
    for e in res.trace.iter_events():
        revised(e)
    with pytest.raises(ValueError, match="cannot resume"):
        dec.branch(revised, Branch(0, 0))


def test_a_branch_tree_lists_saves_and_loads_every_branch(run, tmp_path):
    from clover_engine.recording.branches import BranchTree

    dec, dc, res = run
    tree = BranchTree(res.trace)
    ev = next(e for e in res.trace.steps if e.masked_before.sum() >= 2)
    slot = int(np.flatnonzero(ev.masked_before)[0])
    a = dec.branch(res.trace, Branch.choose(ev.block_index, ev.step_index, slot, int(ev.top_tokens[slot, 1])))
    ia = tree.add(a.trace, 0)
    last = a.trace.steps[-1]
    b = dec.branch(a.trace, Branch(last.block_index, last.step_index,
                                   config=DecodeConfig(**{**dc.to_dict(), "threshold": 0.99})))
    ib = tree.add(b.trace, ia)
    rows = tree.rows()
    assert [r["id"] for r in rows] == [0, ia, ib] and [r["depth"] for r in rows] == [0, 1, 2]
    assert rows[1]["first_difference"] == first_difference(res.tokens, a.tokens)
    assert rows[1]["nfe"] == a.nfe and rows[2]["label"].startswith(f"b{last.block_index} s{last.step_index}")
    assert rows[2]["first_difference"] is None  # nothing left to decode after the last step: same answer
    for name in ("tree.arrow", "tree.parquet"):
        path = tree.save(tmp_path / name)
        assert Trace.load(path).generated_tokens.tolist() == res.tokens  # a plain reader sees the original
        back = BranchTree.load(path)
        assert [r["label"] for r in back.rows()] == [r["label"] for r in rows]
        assert back[ia].generated_tokens.tolist() == a.tokens and back.nodes[ib].parent == ia
    with pytest.raises(ValueError, match="not a branch"):
        tree.add(res.trace, 0)


def test_a_verify_trace_is_refused_with_the_reason():
    torch.set_num_threads(1)
    dec = BlockDecoder(_tiny_drafted(), None, DecodeConfig(block_size=4, policy="verify", max_new_tokens=8))
    res = dec.generate(PROMPT)
    with pytest.raises(ValueError, match="verify mode"):
        dec.branch(res.trace, Branch(0, 0))
