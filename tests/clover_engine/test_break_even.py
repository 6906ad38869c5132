"""Measured break-even of block decoding (clover_engine.cost.break_even): the formula, what is timed, errors."""

from __future__ import annotations

import math

import pytest
import torch

from clover_engine.cost.break_even import BreakEven, format_break_even, measure_break_even
from clover_engine.backbones.clover.model import random_model


def test_formula_and_speedup_agree():
    p = BreakEven(8, 256, t_ar_s=1.0, t_block_s=2.0, t_commit_s=0.0, repeats=1, device="cpu", threads=1)
    assert p.tokens_per_forward == pytest.approx(2.0) and p.speedup(2.0) == pytest.approx(1.0)
    assert p.speedup(4.0) == pytest.approx(2.0)
    q = BreakEven(8, 256, t_ar_s=1.0, t_block_s=2.0, t_commit_s=4.0, repeats=1, device="cpu", threads=1)
    assert q.tokens_per_forward == pytest.approx(16 / 4)  # L t_block / (L t_ar - t_commit)
    assert q.speedup(q.tokens_per_forward) == pytest.approx(1.0)
    r = BreakEven(4, 256, t_ar_s=1.0, t_block_s=2.0, t_commit_s=5.0, repeats=1, device="cpu", threads=1)
    assert math.isinf(r.tokens_per_forward)  # the commit alone costs more than 4 AR steps
    with pytest.raises(ValueError, match="tokens_per_forward must be > 0"):
        q.speedup(0)


def test_verify_formula_is_a_round_of_drafter_plus_base_over_base_steps():
    # a round = drafter forward (t_block) + the base over the block (t_commit); AR = one base step
    p = BreakEven(8, 256, t_ar_s=2.0, t_block_s=1.0, t_commit_s=4.0, repeats=1, device="cpu", threads=1)
    assert p.verify_tokens_per_forward == pytest.approx(2.5)
    assert p.verify_speedup(2.5) == pytest.approx(1.0) and p.verify_speedup(5.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="tokens_per_forward must be > 0"):
        p.verify_speedup(0)


class _Counting(torch.nn.Module):
    """Wraps a protocol model and records (block slots, commit tokens, block_size) per forward."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.calls = model, []
        self.config, self.device = model.config, model.device
        self.capabilities = model.capabilities

    def setup_state(self, *a, **k):
        return self.inner.setup_state(*a, **k)

    def forward(self, block_ids, state, commit_ids=None, block_size=None, observe=False):
        self.calls.append((block_ids.shape[1], 0 if commit_ids is None else commit_ids.shape[1], block_size))
        assert not (block_ids[0] != self.config.mask_token_id).any()  # timed blocks are all MASK
        return self.inner(block_ids, state, commit_ids=commit_ids, block_size=block_size, observe=observe)


def test_times_what_it_says_on_clover():
    m = _Counting(random_model("clover-test"))
    pts = measure_break_even(m, (2, 4), prefix_len=16, repeats=3, warmup=1)
    assert list(pts) == [2, 4]
    # prefix commit, then 1 warm-up + 3 timed rounds, each: an AR step (1 slot + 1-token commit), then per L
    # a plain block forward and a block forward with its commit
    assert m.calls[0] == (1, 16, 16)
    assert m.calls[1:] == [(1, 1, 1), (2, 0, 2), (2, 2, 2), (4, 0, 4), (4, 4, 4)] * 4
    for p in pts.values():
        assert p.t_ar_s > 0 and p.t_block_s > 0 and p.t_commit_s >= 0 and p.prefix_len == 16
        assert p.tokens_per_forward > 0
    assert "tokens per forward to match AR" in format_break_even(pts, "clover-test")


def test_transformers_backbone_and_position_limit(tmp_path):
    transformers = pytest.importorskip("transformers")
    from clover_engine.checkpoint import load_model

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                   eos_token_id=2, bos_token_id=1)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    model = load_model(tmp_path)
    pts = measure_break_even(model, (4,), prefix_len=500, repeats=2, warmup=0)
    # 2 x (1 + 4) timed positions + 5: the 500-token prefix is clamped to fit 128 positions
    assert pts[4].prefix_len == 128 - (2 * 5 + 5) and pts[4].t_block_s > 0
    with pytest.raises(ValueError, match="positions"):
        measure_break_even(model, (32, 64), repeats=5)


def test_long_prefix_is_committed_in_chunks():
    from clover_engine.cost.break_even import PREFIX_CHUNK

    m = _Counting(random_model("clover-test"))
    pts = measure_break_even(m, (2,), prefix_len=2 * PREFIX_CHUNK + 5, repeats=1, warmup=0)
    assert [c[1] for c in m.calls[:3]] == [PREFIX_CHUNK, PREFIX_CHUNK, 5]  # bounded attention memory per forward
    assert pts[2].prefix_len == 2 * PREFIX_CHUNK + 5


def test_errors():
    m = random_model("clover-test")
    with pytest.raises(TypeError, match="decoder protocol"):
        measure_break_even(object())
    with pytest.raises(ValueError, match="block_sizes"):
        measure_break_even(m, ())
    with pytest.raises(ValueError, match="block_sizes"):
        measure_break_even(m, (0, 4))
    with pytest.raises(ValueError, match="repeats"):
        measure_break_even(m, (4,), repeats=0)


def test_cli(capsys, tmp_path):
    from clover_engine.checkpoint import save_model
    from clover_engine.cost import main

    save_model(random_model("clover-test"), tmp_path / "m")
    assert main(["--break-even", "--model", str(tmp_path / "m"), "--block-sizes", "2,4", "--prefix", "8",
                 "--repeats", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "tokens per forward to match AR" in out and len(out.strip().splitlines()) == 5  # header x2, L = 2, 4, note
    assert main(["--break-even", "--model", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--break-even", "--model", str(tmp_path / "m"), "--threads", "0"]) == 2  # no traceback
    assert "--threads" in capsys.readouterr().err
    for bad in ("0", "abc", ""):  # refused before any model is loaded, naming the flag
        with pytest.raises(SystemExit):
            main(["--break-even", "--model", str(tmp_path / "missing"), "--block-sizes", bad])
        assert "--block-sizes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--break-even"])  # no --model: argparse's usage error
