"""Every family's own sampler answers honestly on the command line: a budget it cannot split into whole blocks is
refused before any forward with the flags and values that work, the same way for every family; its forced fills
count only the kept answer; the "mostly guessed" note is printed for it as for threshold decoding.

Run: ``.venv/bin/python -m pytest tests/clover_engine/test_sampler_messages.py -q``
"""

from __future__ import annotations

import re

import pytest

from clover_engine.decoding.block_diffusion_samplers import FastDLLMv2Sampler
from clover_engine.decoding.masked_diffusion_samplers import LLaDASampler, check_whole_blocks
from clover_engine.generate import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from clover_engine.backbones.block_causal import write_tiny_block_causal
    from clover_engine.backbones.llada2_moe import write_tiny_llada2_moe
    from clover_engine.backbones.llada_moe import write_tiny_llada_moe

    root = tmp_path_factory.mktemp("sampler-messages")
    return {"fast_dllm_v2": write_tiny_block_causal(root / "fd", "Fast_dLLM_Qwen"),
            "sdar": write_tiny_block_causal(root / "sdar", "SDAR"),
            "llada2": write_tiny_llada2_moe(root / "llada2"),
            "llada": write_tiny_llada_moe(root / "llada-moe")}


def _run(capsys, model, *flags) -> tuple[int, str, str]:
    rc = main(["--model", str(model), "--prompt", "Hi there", "--threads", "1", *flags])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("family,sampler", [("fast_dllm_v2", "fast_dllm_v2"), ("llada", "llada")])
def test_a_budget_that_does_not_split_into_blocks_is_refused_with_what_works(tiny, capsys, family, sampler):
    # 16 new tokens in blocks of 32 (the default): Fast-dLLM v2's original would decode no block, silently;
    # LLaDA's asserts. Both are refused the same way, before any forward, naming the flags and working values.
    rc, out, err = _run(capsys, tiny[family], "--sampler", sampler, "--max-new-tokens", "16")
    assert rc == 2 and out == ""
    assert "decodes the answer in whole blocks" in err and "use --max-new-tokens 32 or --block-size 16" in err, err
    # the suggested block size works
    steps = ["--steps", "16"] if sampler == "llada" else []
    rc, out, err = _run(capsys, tiny[family], "--sampler", sampler, "--max-new-tokens", "16", "--block-size", "16",
                        *steps)
    assert rc == 0, err
    tokens = int(re.search(r"tokens=(\d+)", out).group(1))
    assert 0 < tokens <= 16, out


def test_the_refusal_is_one_rule_for_every_family():
    msgs = []
    for make in (lambda: FastDLLMv2Sampler(max_new_tokens=40, block_size=32, small_block_size=8),
                 lambda: LLaDASampler(gen_length=40, block_length=32, steps=40)):
        with pytest.raises(ValueError) as e:
            make()
        msgs.append(str(e.value))
    # the same sentence, with each sampler's own field names: the budget rounded up to whole blocks, or the largest
    # block size that divides it -- 20 for LLaDA, 8 for Fast-dLLM v2, whose block holds whole sub-blocks of 8
    assert all("decodes the answer in whole blocks" in m and "must be a multiple of" in m for m in msgs), msgs
    assert "max_new_tokens 40 must be a multiple of block_size 32 -- use --max-new-tokens 64 or --block-size 8" in msgs[0]
    assert "gen_length 40 must be a multiple of block_length 32 -- use --max-new-tokens 64 or --block-size 20" in msgs[1]
    with pytest.raises(ValueError, match="use --max-new-tokens 64 \\(in the explorer: max new tokens 64\\)"):
        FastDLLMv2Sampler(max_new_tokens=40, block_size=32, small_block_size=16)  # no divisor of 40 holds sub-blocks of 16
    check_whole_blocks("any", 64, "budget", 32, "block")  # whole blocks: nothing to say
    with pytest.raises(ValueError, match="use --steps 4"):
        LLaDASampler(gen_length=16, block_length=8, steps=3)


@pytest.mark.parametrize("family,flags", [
    ("sdar", ["--sampler", "sdar", "--block-size", "8", "--max-new-tokens", "16", "--threshold", "1.0"]),
    ("llada2", ["--sampler", "llada2", "--block-size", "8", "--max-new-tokens", "16", "--threshold", "1.0"]),
])
def test_a_family_sampler_run_says_when_it_was_mostly_guessed_counting_the_kept_answer(tiny, capsys, family, flags):
    # at threshold 1.0 no slot passes: every token is the step quota's forced fill
    rc, out, err = _run(capsys, tiny[family], *flags)
    assert rc == 0, err
    summary = out.strip().splitlines()[-1]
    tokens = int(re.search(r"tokens=(\d+)", summary).group(1))
    forced = int(re.search(r"forced=(\d+)", summary).group(1))
    assert 0 < forced <= tokens, summary  # slots forced past the kept answer are not counted as its tokens
    note = re.search(r"note: mostly guessed: (\d+) of (\d+) tokens were forced fills", err)
    assert note is not None, err
    assert (int(note.group(1)), int(note.group(2))) == (forced, tokens)


def test_a_confident_family_run_prints_no_trust_note(tiny, capsys):
    rc, out, err = _run(capsys, tiny["llada2"], "--sampler", "llada2", "--block-size", "8", "--max-new-tokens", "16",
                        "--threshold", "0.01")
    assert rc == 0 and "forced=0" in out and "mostly guessed" not in err, (out, err)


def test_a_budget_the_sampler_passes_or_falls_short_of_is_explained():
    from clover_engine.trust import budget_note

    sdar = {"sampler": "sdar", "gen_length": 32, "block_length": 32}
    assert budget_note(sdar, 47, "max_new_tokens") == ("SDAR decodes whole blocks aligned to the prompt's start: "
                                                      "47 tokens for a budget of 32 (blocks of 32)")
    fd = {"sampler": "fast_dllm_v2", "max_new_tokens": 32, "block_size": 32}
    assert budget_note(fd, 16, "max_new_tokens").startswith("Fast-dLLM v2 decodes max_new_tokens // block_size = 1 "
                                                            "block(s), the first finishing the prompt's last block")
    assert budget_note(sdar, 32, "max_new_tokens") == ""  # the budget kept: nothing to say
    assert budget_note(sdar, 47, "eos") == ""  # it stopped on its own end
    assert budget_note({"policy": "low_confidence", "max_new_tokens": 32}, 40, "max_new_tokens") == ""


def test_the_cli_says_why_sdar_wrote_more_than_its_budget(tiny, capsys):
    # the prompt (ChatML) does not end on a block of 8: SDAR runs to the block holding prompt + 10, past 10 tokens
    rc, out, err = _run(capsys, tiny["sdar"], "--sampler", "sdar", "--block-size", "8", "--max-new-tokens", "10",
                        "--top-k", "1", "--threshold", "0.01")
    assert rc == 0, err
    tokens = int(re.search(r"tokens=(\d+)", out).group(1))
    assert "stop=max_new_tokens" in out and tokens > 10, out  # greedy (top-k 1): the same run every time
    assert f"SDAR decodes whole blocks aligned to the prompt's start: {tokens} tokens for a budget of 10" in err, err
