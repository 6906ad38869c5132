"""Self-speculative decoding (`clover_engine.decoding.speculative`): the accept rule on a scripted model, and
lossless output -- token for token the greedy ``block_size = 1`` decode -- on random models and
the bundled model, with both verifiers.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_speculative.py -q``
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import CFG_CONV, loud_model

from clover_engine.backbones.base import OBSERVABLES, Capabilities
from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.backbones.clover.model import CloverModel, ModelOutput
from clover_engine.decoding.speculative import (
    SpeculativeConfig,
    SpeculativeDecoder,
    greedy_reference,
    summarize_speculative,
)

CFG = CloverConfig.from_name("clover-test")
MASK, EOS, V = CFG.mask_token_id, CFG.eos_token_id, CFG.vocab_size


class PositionScript(torch.nn.Module):
    """Stands in for a CloverModel: a one-slot forward at position p answers ``truth[p]``; a
    longer block (a draft) answers ``draft(p, slot)`` for each MASK slot. Records the calls."""

    def __init__(self, truth: dict[int, int], draft):
        super().__init__()
        self.config, self.truth, self.draft, self.calls = CFG, truth, draft, []
        self.capabilities = Capabilities(family="scripted", cost_family="clover", observables=frozenset(OBSERVABLES))
        self._p = torch.nn.Parameter(torch.zeros(1))
        self._real = CloverModel(CFG)

    device = property(lambda self: torch.device("cpu"))
    dtype = property(lambda self: torch.float32)

    def setup_state(self, batch_size=1, memory_mode="state"):
        return self._real.setup_state(batch_size, memory_mode)

    def forward(self, block_ids, state, commit_ids=None, block_size=None, observe=False):
        C = 0 if commit_ids is None else commit_ids.shape[1]
        pos0 = state.position + C
        state.position = pos0
        L = block_ids.shape[1]
        self.calls.append((pos0, L, C))
        logits = torch.zeros(1, L, V)
        for i in range(L):
            tok = self.truth[pos0] if L == 1 else self.draft(pos0 + i, i)
            logits[0, i, tok] = 30.0
        n = CFG.num_hidden_layers
        return ModelOutput(logits=logits, expert_union=torch.full((n,), 2))


def test_accepts_the_longest_matching_prefix_and_discards_the_rest():
    prompt = [7, 8, 9]
    answer = [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, EOS]
    truth = {3 + j: t for j, t in enumerate(answer)}
    wrong_at = {3, 9}  # answer indices the drafter gets wrong (absolute position 3 + j holds answer[j])

    def draft(pos, slot):
        return 99 if pos - 3 in wrong_at else truth.get(pos, EOS)

    model = PositionScript(truth, draft)
    r = SpeculativeDecoder(model, None, SpeculativeConfig(draft_size=4, max_new_tokens=20)).generate(prompt)
    assert r.tokens == answer[:-1] and r.stop_reason == "eos"
    assert 99 not in r.tokens  # a discarded draft never reaches the output
    # (answer index of the first drafted token, accepted, drafted, the verifier's tokens)
    rounds = [(rd.position, rd.accepted, len(rd.draft), rd.verified.tolist()) for rd in r.rounds]
    assert rounds == [
        (1, 2, 4, [21, 22, 23]),  # index 3 drafted wrong: 1 and 2 accepted, 23 is the correction
        (4, 4, 4, [24, 25, 26, 27, 28]),  # all four accepted, 28 the bonus
        (9, 0, 4, [29]),  # the first drafted token is wrong: nothing accepted, one token gained
        (10, 2, 4, [30, EOS]),  # 30 and EOS accepted: the decode stops
    ]
    assert sum(len(rd.verified) for rd in r.rounds) + 1 == len(answer)
    # sequential verifier: one forward per verified token, plus the first token's
    assert r.verify_forwards == len(answer) and r.draft_forwards == len(r.rounds)
    assert r.nfe == r.verify_forwards + r.draft_forwards
    assert r.discarded == sum(len(rd.draft) - rd.accepted for rd in r.rounds)


def test_draft_forwards_read_the_state_without_writing_it():
    model = loud_model(0, CFG_CONV)
    for mode in ("state", "state+window"):
        state = model.setup_state(1, mode)
        with torch.no_grad():
            model(torch.tensor([[MASK]]), state, commit_ids=torch.tensor([[5, 6, 7, 8, 9]]), block_size=1)
            before = copy.deepcopy(state)
            model(torch.tensor([[10] + [MASK] * 6]), state, block_size=1)  # a draft: head + 6 MASK, no commit
        assert state.position == before.position
        for a, b in zip(state.layers, before.layers):
            for name in ("S", "conv", "win_k", "win_v"):
                if getattr(a, name) is not None:
                    assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("cfg, mode", [(CFG, "state"), (CFG_CONV, "state+window")], ids=["state", "window-conv"])
def test_lossless_on_random_models(cfg, mode):
    model = loud_model(1, cfg)
    for prompt, k in (([5, 9, 14, 5, 9], 1), (list(range(40, 75)), 5)):
        ref = greedy_reference(model, None, prompt, 24, mode)
        seq = SpeculativeDecoder(model, None, SpeculativeConfig(k, 24, mode)).generate(prompt)
        par = SpeculativeDecoder(model, None, SpeculativeConfig(k, 24, mode, "parallel")).generate(prompt)
        assert seq.tokens == ref and par.tokens == ref
        assert [rd.accepted for rd in seq.rounds] == [rd.accepted for rd in par.rounds]
        # the sequential verifier runs exactly the autoregressive control's forwards
        ar = BlockDecoder(model, None, DecodeConfig(block_size=1, max_new_tokens=24, memory_mode=mode)).generate(
            prompt, record_trace=False)
        assert seq.verify_forwards == ar.nfe
        assert par.verify_forwards == 1 + len(par.rounds) and par.draft_forwards == len(par.rounds)
        assert all(rd.accepted <= len(rd.draft) <= k for rd in seq.rounds)


def test_budget_and_stop_reasons():
    model = loud_model(2)
    for k in (1, 16):
        r = SpeculativeDecoder(model, None, SpeculativeConfig(k, 7)).generate([5, 6, 7])
        ref = greedy_reference(model, None, [5, 6, 7], 7)
        assert r.tokens == ref and len(r.tokens) <= 7
        assert r.stop_reason in ("eos", "max_new_tokens")
        assert all(len(rd.draft) <= 7 for rd in r.rounds)


def test_summary_counts():
    model = loud_model(3)
    rs = [SpeculativeDecoder(model, None, SpeculativeConfig(4, 30)).generate(p) for p in ([5, 6], [9, 10, 11])]
    s = summarize_speculative(rs)
    assert s["tokens"] == sum(len(r.tokens) for r in rs)
    assert s["nfe"] == s["draft_forwards"] + s["verify_forwards"]
    assert s["one_forward_tokens_per_forward"] == s["tokens"] / (2 + 2 * s["rounds"])
    assert 0 <= s["discard_share"] <= 1
    with pytest.raises(ValueError):
        summarize_speculative([])


@pytest.mark.parametrize("kw, err, match", [
    ({"draft_size": 0}, ValueError, "draft_size"),
    ({"draft_size": 2.0}, TypeError, "draft_size"),
    ({"max_new_tokens": True}, TypeError, "max_new_tokens"),
    ({"memory_mode": "kv"}, ValueError, "memory_mode"),
    ({"verifier": "tree"}, ValueError, "verifier"),
])
def test_config_errors(kw, err, match):
    with pytest.raises(err, match=match):
        SpeculativeConfig(**kw)


def test_bad_inputs():
    model = loud_model(0)
    with pytest.raises(TypeError, match="SpeculativeConfig"):
        SpeculativeDecoder(model, None, DecodeConfig())
    with pytest.raises(ValueError, match="MASK"):
        SpeculativeDecoder(model).generate([5, MASK])
    with pytest.raises(TypeError, match="tokenizer"):
        SpeculativeDecoder(model).generate("text without a tokenizer")


def test_bundled_model_is_lossless_on_a_held_out_task():
    from clover_engine import experiments as X
    from clover_engine.data.agent import eval_tasks

    model, tok = X.load_bundled(threads=None)
    task = eval_tasks(n=2)[1]
    ref = greedy_reference(model, tok, task.prompt, 40, "state+window")
    r = SpeculativeDecoder(model, tok, SpeculativeConfig(8, 40, "state+window")).generate(task.prompt)
    assert r.tokens == ref
    assert r.text == tok.decode(ref)
    assert r.acceptance_lengths.mean() > 1  # a trained drafter gets more than one token right per draft
    par = SpeculativeDecoder(model, tok, SpeculativeConfig(8, 40, "state+window", "parallel")).generate(task.prompt)
    assert par.tokens == ref and par.nfe == 1 + 2 * len(par.rounds)
