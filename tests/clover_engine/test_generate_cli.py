"""The CLI and the cost fields end to end on a saved clover-test checkpoint.

Run: .venv/bin/python -m pytest tests/clover_engine/test_generate_cli.py -q
"""

import subprocess
import sys

import numpy as np
import torch

import clover_engine
from clover_engine.checkpoint import save_model
from clover_engine.tokenizer import byte_tokenizer


def test_cli_prints_text_and_summary_and_saves_trace(tmp_path):
    torch.manual_seed(0)
    model = clover_engine.CloverModel(clover_engine.CloverConfig.from_name("clover-test"))
    save_model(model, tmp_path / "m", tokenizer=byte_tokenizer())
    out = subprocess.run(
        [sys.executable, "-m", "clover_engine.generate", "--model", str(tmp_path / "m"), "--prompt", "def f(x):",
         "--block-size", "8", "--threshold", "0.5", "--max-new-tokens", "20", "--trace", str(tmp_path / "t.parquet")],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    summary = [l for l in out.stdout.splitlines() if l.startswith("[m]")]
    assert summary and "NFE=" in summary[0] and "tokens/forward=" in summary[0] and "forced=" in summary[0]
    tr = clover_engine.Trace.load(tmp_path / "t.parquet")
    assert tr.nfe == int(summary[0].split("NFE=")[1].split()[0])
    assert tr.decode_config["block_size"] == 8


def test_cli_says_when_the_context_cut_max_new_tokens(tmp_path):
    import dataclasses

    torch.manual_seed(0)
    cfg = dataclasses.replace(clover_engine.CloverConfig.from_name("clover-test"), max_position_embeddings=40)
    save_model(clover_engine.CloverModel(cfg), tmp_path / "m", tokenizer=byte_tokenizer())
    out = subprocess.run(
        [sys.executable, "-m", "clover_engine.generate", "--model", str(tmp_path / "m"), "--prompt", "def f(x):",
         "--block-size", "8", "--max-new-tokens", "100"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "stop=context" in out.stdout
    assert ("note: --max-new-tokens 100 did not fit: the model's context is 40 positions and the prompt took 9, "
            "so it stopped after 31 new tokens") in out.stderr


def test_cli_bad_input_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", str(tmp_path / "none"),
                          "--prompt", "x"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no model directory" in out.stderr


def test_cli_refuses_a_bad_trace_path_or_a_blank_prompt_before_decoding(tmp_path):
    """Checked before the model loads: a --trace suffix that names no format, a --trace folder that
    does not exist (nothing is created), a prompt of only whitespace. One line each, exit code 2."""
    bundled = "models/clover-tiny"
    cases = [(["--prompt", "x", "--trace", str(tmp_path / "t.txt")], "suffix names no trace format"),
             (["--prompt", "x", "--trace", str(tmp_path / "no" / "t.parquet")], "there is no folder"),
             (["--prompt", "  \n "], "only whitespace")]
    for extra, expected in cases:
        out = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", bundled, *extra],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and expected in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert out.stdout == ""  # nothing decoded
    assert not (tmp_path / "no").exists()


def test_cost_fields_and_union_cross_check():
    """StepEvent.expert_union equals the distinct expert ids in the router outputs of that forward."""
    torch.manual_seed(1)
    model = clover_engine.CloverModel(clover_engine.CloverConfig.from_name("clover-test")).eval()
    seen = []
    handles = [layer.mlp.register_forward_hook(
        lambda mod, inp, out, i=i: seen.append((i, torch.unique(mod.last_topk).numel())))
        for i, layer in enumerate(model.layers)]
    steps = []
    res = clover_engine.BlockDecoder(model, None, clover_engine.DecodeConfig(block_size=8, threshold=0.5, max_new_tokens=16)) \
        .generate(list(range(1, 12)), hooks=[lambda e: steps.append(e) if isinstance(e, clover_engine.StepEvent) else None])
    for h in handles:
        h.remove()
    n = model.config.num_hidden_layers
    per_forward = [[u for _, u in seen[k * n:(k + 1) * n]] for k in range(len(steps))]
    assert [s.expert_union.tolist() for s in steps] == per_forward
    assert all(s.bytes_read > 0 and s.flops > 0 for s in steps)
    assert np.isclose(sum(s.bytes_read for s in steps), res.bytes_read)
    assert all(np.isclose(s.arithmetic_intensity, s.flops / s.bytes_read) for s in steps)
    # the first forward carries the prompt's full block (8 tokens) as a fused commit
    assert steps[0].n_tokens_forward == 8 + 8


def test_default_memory_mode_is_the_models_best_measured_one(tmp_path):
    """No --memory-mode: the mode whose block-32 row of eval.json has the higher exact match
    (labelled in the summary line); without eval.json, state+window when the model has a window."""
    import json

    from clover_engine.checkpoint import best_memory_mode

    torch.manual_seed(0)
    cfg = clover_engine.CloverConfig.from_name("clover-test")
    save_model(clover_engine.CloverModel(cfg), tmp_path / "m", tokenizer=byte_tokenizer())
    has_window = bool(cfg.attention_window)
    assert best_memory_mode(tmp_path / "m")[0] == ("state+window" if has_window else "state")
    row = lambda x: {"exact_match": x}  # noqa: E731
    (tmp_path / "m" / "eval.json").write_text(json.dumps({"agent": {"bd32-window": row(0.1), "bd32-state": row(0.3)}}))
    mode, why = best_memory_mode(tmp_path / "m")
    assert mode == "state" and "30%" in why and "10%" in why
    out = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", str(tmp_path / "m"), "--prompt", "x",
                          "--max-new-tokens", "4"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "memory_mode=state (default: best measured mode of m" in out.stdout
    out = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", str(tmp_path / "m"), "--prompt", "x",
                          "--max-new-tokens", "4", "--memory-mode", "state"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "memory_mode=state |" in out.stdout
    assert best_memory_mode("models/clover-tiny")[0] == "state+window"  # 29 % vs 4 % exact on its card
    assert best_memory_mode("models/smollm2-bd")[0] == "state"  # an adapter: no window, one mode


def test_memory_mode_reason_says_how_each_kind_keeps_its_history(tmp_path):
    """A masked diffusion model keeps no history between forwards (it re-reads the whole sequence); a
    block-causal one keeps a KV cache; neither runs Clover's memory modes."""
    from clover_engine.backbones.block_causal import write_tiny_block_causal
    from clover_engine.backbones.llada_moe import write_tiny_llada_moe
    from clover_engine.checkpoint import best_memory_mode

    mode, why = best_memory_mode(write_tiny_llada_moe(tmp_path / "llada-moe"))
    assert mode == "state" and "keeps no history between forwards" in why and "KV cache" not in why
    mode, why = best_memory_mode(write_tiny_block_causal(tmp_path / "sdar", "sdar"))
    assert mode == "state" and "keeps its history in a KV cache" in why


def test_cli_refuses_a_file_as_model_and_counts_forced_fills_past_the_answer(tmp_path):
    """``--model README.md`` says it is a file, not that no directory exists; `forced_past_answer`
    counts forced slots at or after the kept answer's end (the end-of-text fills the summary's
    forced count includes), none before it."""
    from types import SimpleNamespace

    from clover_engine.generate import forced_past_answer

    out = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", "README.md", "--prompt", "x"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "'README.md' is a file; pass the model's directory" in out.stderr
    step = lambda start, forced: SimpleNamespace(position_start=start, forced=np.array(forced, bool))  # noqa: E731
    # prompt 10 + answer 5 = position 15: forced slots at 12 (kept) and 15, 17 (past it)
    trace = SimpleNamespace(steps=[step(10, [0, 0, 1, 0]), step(14, [0, 1, 0, 0]), step(14, [0, 0, 0, 1])])
    assert forced_past_answer(trace, 15) == 2
    assert forced_past_answer(trace, 100) == 0 and forced_past_answer(None, 0) == 0


def test_example_flag_decodes_the_explorers_example_prompts():
    """``--example NAME`` sets the prompt to the explorer's example of that name (`clover_engine.examples`,
    re-exported by `clover_viz.examples`); it excludes ``--prompt``, and a wrong name lists the names."""
    import pytest

    from clover_viz import examples as viz_examples
    from clover_engine.examples import EXAMPLE_PROMPTS, example_names, example_prompt
    from clover_engine.generate import build_parser

    assert viz_examples.EXAMPLE_PROMPTS is EXAMPLE_PROMPTS  # one set of examples for the CLI and the explorer
    args = build_parser().parse_args(["--example", "agent tool call"])
    assert args.prompt == EXAMPLE_PROMPTS["agent tool call"] and args.example == "agent tool call"
    assert build_parser().parse_args(["--example", "question"]).prompt == example_prompt("question")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--example", "agent tool call", "--prompt", "x"])
    with pytest.raises(SystemExit):
        build_parser().parse_args([])  # one of --prompt / --example is needed
    with pytest.raises(ValueError, match="no example prompt called 'nope'; the examples are: 'agent tool call'"):
        example_prompt("nope")
    assert example_names()[0] == "agent tool call"


def test_cli_careful_measures_the_answer_against_the_careful_decode(tmp_path):
    """--careful decodes the same settings one slot per forward and prints the answer's agreement with it, and
    the saved trace keeps that agreement (what the explorer shows on a replay); a run that is its own careful
    decode (block size 1) says so instead of a trivial 100 %."""
    import re

    from clover_engine.decoding.careful import Agreement

    from pathlib import Path

    model_dir = str(Path(__file__).resolve().parents[2] / "models" / "clover-tiny")
    args = [sys.executable, "-m", "clover_engine.generate", "--model", model_dir, "--prompt", "def add(a, b):\n    return",
            "--max-new-tokens", "24", "--memory-mode", "state", "--careful"]
    out = subprocess.run([*args, "--threshold", "0.6", "--trace", str(tmp_path / "t.parquet")], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("careful: "))
    assert re.search(r"agrees with the careful decode: \d+ %", line), line
    saved = clover_engine.Trace.load(tmp_path / "t.parquet").meta["careful"]
    a = Agreement.from_dict(saved)
    assert not a.own and a.n_answer == 24 and saved["reference_nfe"] >= a.n_reference
    assert f"common prefix {a.common_prefix} of {a.n_answer} tokens" in line
    own = subprocess.run([*args, "--block-size", "1"], capture_output=True, text=True, timeout=300)
    assert own.returncode == 0, own.stderr
    assert "careful: this run is its own careful decode" in own.stdout
