"""The block drafter over a frozen causal LM (clover_engine.backbones.drafter): both decoding modes end to end on a
tiny random Llama target with a tiny random drafter.

verify mode must equal the target's own greedy ``generate`` token for token whatever the drafter proposes;
commit mode runs the seed's rule on the drafter's confidences (at block_size 1 every slot is the anchor, so
it is the target's greedy decode too).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from clover_engine.backbones.base import capabilities_of  # noqa: E402
from clover_engine.backbones.drafter.files import load_drafter_net, save_drafter  # noqa: E402
from clover_engine.backbones.drafter.model import DraftedLM  # noqa: E402
from clover_engine.backbones.drafter.net import BlockDrafter, DrafterConfig  # noqa: E402
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig  # noqa: E402
from clover_engine.recording.trace import Trace  # noqa: E402

V, EOS = 128, 2
PROMPTS = [[5, 9, 33, 17, 60, 4, 8, 21, 70, 11], [40, 41, 42], [7] * 13]


@pytest.fixture(scope="module")
def drafted():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   eos_token_id=EOS, bos_token_id=1, initializer_range=0.2, tie_word_embeddings=True)
    lm = transformers.LlamaForCausalLM(cfg).eval()
    seen = {t for p in PROMPTS for t in p + _greedy_lm(lm, p, 40)}
    mask = next(i for i in range(V - 1, 2, -1) if i not in seen)  # MASK must not be a token the target writes
    net = BlockDrafter(DrafterConfig(hidden_size=64, target_layers=(1, 2), num_layers=1, num_heads=4, num_kv_heads=2,
                                     head_dim=16, intermediate_size=128, block_size=4, vocab_size=V,
                                     mask_token_id=mask, rope_theta=10000.0))
    net.init_layers_from(lm, [1])
    return DraftedLM.build(lm, net, "tiny-drafter", mask, EOS)


def _greedy(model: DraftedLM, prompt: list[int], n: int) -> list[int]:
    return _greedy_lm(model.lm, prompt, n)


def _greedy_lm(lm, prompt: list[int], n: int) -> list[int]:
    out = lm.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                            max_new_tokens=n, do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
    gen = out[0, len(prompt):].tolist()
    return gen[: gen.index(EOS)] if EOS in gen else gen


def test_declares_drafting(drafted):
    caps = capabilities_of(drafted)
    assert caps.drafts and caps.family == "drafter" and caps.cost_family == "kv_cache"
    assert caps.largest_trained_block == 4


@pytest.mark.parametrize("block_size", [2, 3, 4])
def test_verify_equals_greedy_generate(drafted, block_size):
    dec = BlockDecoder(drafted)
    for prompt in PROMPTS:
        ref = _greedy(drafted, prompt, 30)
        res = dec.generate(prompt, config=DecodeConfig(block_size=block_size, max_new_tokens=30, policy="verify"))
        assert res.tokens == ref
        assert res.nfe == 1 + len(res.accepted_lengths)  # the prefill, then one target forward per round
        assert res.draft_forwards == sum(1 for k in res.drafted if k)
        assert sum(res.accepted_lengths) + len(res.accepted_lengths) + 1 >= len(res.tokens)
        assert all(0 <= a <= block_size - 1 for a in res.accepted_lengths)


def test_verify_with_an_oracle_drafter_writes_whole_blocks(drafted, monkeypatch):
    """A drafter that proposes exactly the target's continuation is accepted in full: block_size tokens
    per verify forward (the accept rule counts right, the bonus is added)."""
    B = 4
    prompt, ref = next((p, r) for p in PROMPTS if len(r := _greedy(drafted, p, 40)) >= 34)  # no EOS before 34

    def oracle(state, block):
        done = len(state.committed) - len(prompt)  # generated tokens the target has read before the anchor
        logits = torch.full((len(block), V), -10.0)
        for j in range(1, len(block)):
            logits[j, ref[done + j]] = 10.0
        return logits

    monkeypatch.setattr(drafted, "draft", oracle)
    res = BlockDecoder(drafted).generate(prompt, config=DecodeConfig(block_size=B, max_new_tokens=33, policy="verify"))
    assert res.tokens == ref[:33]
    assert res.accepted_lengths == [B - 1] * 8
    assert res.nfe == 9 and res.tokens_per_forward == pytest.approx(33 / 9)


def test_verify_events_show_draft_accepted_run_and_rejected_slot(drafted, tmp_path):
    dec = BlockDecoder(drafted)
    res = dec.generate(PROMPTS[0], config=DecodeConfig(block_size=4, max_new_tokens=24, policy="verify"))
    tr = res.trace
    assert tr.meta["verify"]["accepted_lengths"] == res.accepted_lengths
    steps = tr.steps[1:]
    assert len(steps) == len(res.accepted_lengths)
    for st, n in zip(steps, res.accepted_lengths):
        assert int(st.accepted.sum()) == n and bool(st.accepted[:n].all())
        assert int(st.forced.sum()) == 1 and bool(st.forced[n])  # the target's own token right after the run
        drafted_slots = st.candidate[: len(st.candidate) - 1]
        assert (drafted_slots >= 0).all()  # every drafted slot records its draft
        if n < len(st.candidate) - 1:  # a rejection: the draft differs from what the target wrote there
            assert st.candidate[n] != st.tokens[n]
    loaded = Trace.load(tr.save(tmp_path / "verify.parquet"))
    assert loaded.generated_tokens.tolist() == res.tokens
    assert len(loaded) == len(tr)
    # the views name no threshold for a verify run (none was read); a commit run's they do
    from clover_viz import figures as F

    fig = F.block_figure(loaded, 3)
    assert "still masked" in fig.layout.title.text and "threshold" not in fig.layout.title.text
    assert "threshold" not in F.confidence_heatmap(loaded, 1).layout.title.text
    commit = dec.generate(PROMPTS[0], config=DecodeConfig(block_size=4, max_new_tokens=8)).trace
    assert "threshold 0.95" in F.block_figure(commit, 1).layout.title.text


def test_commit_mode_block_size_1_is_the_targets_greedy_decode(drafted):
    dec = BlockDecoder(drafted)
    for prompt in PROMPTS:
        res = dec.generate(prompt, config=DecodeConfig(block_size=1, max_new_tokens=20, threshold=0.95))
        assert res.tokens == _greedy(drafted, prompt, 20)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_commit_mode_blocks_follow_the_seed_rule(drafted, prompt):
    """block 4, threshold 1.0: one slot per forward (forced fill); the anchor slot of the first block is the
    target's own next token; the trace records every step."""
    dec = BlockDecoder(drafted)
    res = dec.generate(prompt, config=DecodeConfig(block_size=4, max_new_tokens=12, threshold=1.0))
    assert res.trace is not None and len(res.trace) == res.nfe
    greedy0 = _greedy(drafted, prompt, 1)[0]
    first = res.trace.steps[0]
    anchor = len(prompt) % 4  # the first slot after the prompt head
    assert first.candidate[anchor] == greedy0
    assert res.n_forced == res.nfe  # threshold 1.0: nothing passes, one forced fill per forward


def test_drafter_directory_round_trip_and_corrupt_weights(drafted, tmp_path):
    d = save_drafter(tmp_path / "tiny", drafted.drafter, base="tiny")
    net, cfg = load_drafter_net(d)
    assert cfg["model_type"] == "block-drafter"
    for k, v in drafted.drafter.state_dict().items():
        assert torch.equal(net.state_dict()[k], v.half().float())  # stored in fp16
    (d / "drafter.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="cannot read the drafter's weights"):
        load_drafter_net(d)


def test_a_block_longer_than_the_drafter_is_refused_with_the_fix(drafted):
    with pytest.raises(ValueError, match="block_size 4 or less"):
        BlockDecoder(drafted).generate(PROMPTS[0], config=DecodeConfig(block_size=8, max_new_tokens=8, policy="verify"))


def test_verify_refused_for_a_model_that_does_not_draft():
    from tests.toy_backbone import ToyBackbone, ToyConfig

    dec = BlockDecoder(ToyBackbone(ToyConfig()))
    with pytest.raises(ValueError, match="verify"):
        dec.generate([3, 4, 5], config=DecodeConfig(block_size=4, max_new_tokens=4, policy="verify"))


def test_explorer_starts_a_drafter_in_verify_at_its_block_and_leaves_verify_for_other_models(drafted):
    from clover_viz.models import LoadedModel
    from clover_viz.state import ExplorerState
    from tests.toy_backbone import ToyBackbone, ToyConfig

    s = ExplorerState()
    s.use_model(LoadedModel.in_memory(drafted, None, label="tiny drafter"))
    assert (s.policy, s.block_size) == ("verify", 4)  # its trained block
    s.use_model(LoadedModel.in_memory(ToyBackbone(ToyConfig()), None, label="toy"))
    assert (s.policy, s.block_size) == ("low_confidence", 32)  # verify cannot run there
    chosen = ExplorerState(policy="margin")  # a policy the user chose is kept
    chosen.use_model(LoadedModel.in_memory(drafted, None, label="tiny drafter"))
    assert chosen.policy == "margin"


def test_explorer_status_of_a_verify_run_counts_base_forwards_and_accepted_drafts(drafted):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from clover_viz.models import LoadedModel
    from clover_viz.state import ExplorerState

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    s = ExplorerState(max_new_tokens=12)
    s.use_model(LoadedModel.in_memory(drafted, tok, label="tiny drafter"))
    s.prompt = " ".join(f"t{i}" for i in PROMPTS[0])
    assert s.generate()
    assert s.wait(60)
    s.drain()
    assert s.status.startswith("done:"), s.status
    assert "base forwards" in s.status and "the base accepted" in s.status
    assert s.trace.decode_config["policy"] == "verify"
    # verify reads no threshold: the slider is off and says why, and moving it starts no decode
    from clover_viz.panel_settings import SettingsPanel

    panel = SettingsPanel(state=s)
    assert panel.threshold.disabled and panel.threshold.name == "Threshold (not read by verify)"
    assert "the base would" in panel.controls_note.object and not panel.block_size.disabled
    shown = s.trace
    s.threshold = 0.5
    assert not s.running and s.trace is shown
    s.block_size = 2  # a block size does change a verify decode
    assert s.running or s.trace is not shown
    assert s.wait(60)
    s.policy = "low_confidence"
    assert not panel.threshold.disabled and panel.threshold.name == "Threshold"
    # the notebook view too
    from clover_viz.widgets import Explorer

    ex = Explorer(drafted, tok, decode_config={"block_size": 4, "max_new_tokens": 4, "policy": "verify"})
    assert ex.threshold.disabled and not ex.block_size.disabled


def test_eval_summary_of_verify_and_commit_rows():
    from clover_engine.eval.drafter import format_table, summarise
    from clover_engine.eval.summary import slot_errors_vs_reference

    rows = [{"kind": "plain", "i": 0, "ref_len": 10, "ref_s": 1.0,
             "verify": {"exact": True, "agree": 1.0, "n": 10, "target_forwards": 4, "draft_forwards": 3,
                        "wall_s": 0.5, "accepted": [3, 1, 2], "drafted": [3, 3, 1]},
             "commit/0.95": {"exact": False, "agree": 0.5, "n": 10, "steps": 5, "n_forced": 2, "wall_s": 0.25,
                             "slot_err": [0, 1, 2, 0], "slot_n": [2, 2, 2, 0]}}]
    s = summarise(rows, 4, [0.95], None)
    v = s["verify"]
    assert v["tokens_per_target_forward"] == 2.5 and v["speed_vs_generate"] == 2.0
    assert v["mean_accepted_per_round"] == 2.0  # full-length rounds only (drafted == block - 1)
    assert v["accepted_through_slot"] == [1.0, 0.5, 0.5]  # of the two full rounds (3 and 1 accepted)
    c = s["commit/0.95"]
    assert c["tokens_per_step"] == 2.0 and c["error_by_slot"] == [0.0, 0.5, 1.0, None] and c["forced_share"] == 0.2
    report = {"model": "m", "block_size": 4, "max_new_tokens": 10, "threads": 1, "plain": s,
              "break_even": {"break_even_tokens_per_forward": 2.0, "ar_step_s": 0.1, "verify_forward_s": 0.15,
                             "draft_forward_s": 0.05, "prefix": 256}}
    assert "verify" in format_table(report) and "commit/0.95" in format_table(report)
    # slot errors: the block that starts while the answer still equals the reference is scored, the rest not
    err, n = slot_errors_vs_reference(prompt_len=2, block_size=4, gen=[1, 2, 9, 4, 5], ref=[1, 2, 3, 4, 5], eos=0,
                                      stopped_eos=False, max_new=5)
    assert n == [1, 1, 2, 1] and err == [1, 0, 0, 0]  # slots 2, 3, then a whole block from slot 0
    # the EOS that ended an answer is a token: the decode's (stopped on EOS) against a reference that ran
    # to the budget is an error in its slot; two answers that end together agree there
    assert slot_errors_vs_reference(2, 4, [1, 2, 3], [1, 2, 3, 4, 5], 0, True, 5) == ([0, 1, 0, 0], [1, 1, 1, 1])
    assert slot_errors_vs_reference(2, 4, [1, 2, 3], [1, 2, 3], 0, True, 5) == ([0, 0, 0, 0], [1, 1, 1, 1])
