"""Exact threshold comparisons, input validation, undecodable ids, thread setup (issue 15, items 3-6).

Run: .venv/bin/python -m pytest tests/clover_engine/test_validation.py -q
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.recording.events import StepEvent
from clover_engine.backbones.clover.model import CloverModel
from clover_engine.decoding.policies import Entropy, Factor, LowConfidence, Margin, make_policy
from clover_engine.tokenizer import byte_tokenizer
from clover_engine.recording.trace import Trace

ROOT = Path(__file__).resolve().parents[2]
CFG = CloverConfig.from_name("clover-test")
F32_095 = float(np.float32(0.95))  # 0.949999988079071: the fp32 value nearest 0.95, below it


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return CloverModel(CFG).eval()


# ---------------------------------------------------------------- item 3: exact comparisons
def test_low_confidence_compares_exactly():
    conf = torch.tensor([F32_095, 0.95, float(np.nextafter(np.float32(0.95), np.float32(1)))],
                        dtype=torch.float32)
    masked = torch.ones(3, dtype=torch.bool)
    assert conf[0] == conf[1]  # 0.95 has no fp32 value: both are 0.949999988
    # 0.949999988 < 0.95: not accepted; the next fp32 value above 0.95 is
    assert LowConfidence(0.95).select(conf, masked, None).tolist() == [False, False, True]
    # equality passes: the threshold as given is the fp32 value itself
    assert LowConfidence(np.float32(0.95)).select(conf, masked, None).tolist() == [True, True, True]
    # fp64 confidences compare exactly too, bf16 ones are upcast exactly
    assert LowConfidence(0.95).select(conf.double(), masked, None).tolist() == [False, False, True]
    assert LowConfidence(0.5).select(torch.tensor([0.5, 0.498], dtype=torch.bfloat16), masked[:2],
                                     None).tolist() == [True, False]


def test_margin_compares_exactly():
    probs = torch.zeros(2, 5)
    probs[0, 0] = F32_095  # margin 0.949999988 - 0
    probs[1, :2] = torch.tensor([0.975, 0.025])  # margin 0.95000000298 in fp64 (fp32 values)
    masked = torch.ones(2, dtype=torch.bool)
    exact = (probs[1, 0].double() - probs[1, 1].double()).item()
    assert exact >= 0.95
    assert Margin(0.95).select(probs.max(-1).values, masked, probs).tolist() == [False, True]
    assert Margin(np.float32(0.95)).select(probs.max(-1).values, masked, probs).tolist() == [True, True]


def test_entropy_compares_exactly():
    probs = torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float32)
    ent = float(-(probs * probs.clamp_min(1e-30).log()).sum(-1))  # the policy's fp32 entropy, exactly
    masked = torch.ones(1, dtype=torch.bool)
    just_below = float(np.nextafter(ent, -math.inf))  # rounds to `ent` in fp32
    assert float(np.float32(just_below)) == ent
    assert Entropy(just_below).select(None, masked, probs).tolist() == [False]
    assert Entropy(ent).select(None, masked, probs).tolist() == [True]  # equality passes (<=)


def test_factor_compares_exactly():
    conf = torch.tensor([0.5], dtype=torch.float32)  # (0 + 1) * (1 - 0.5) = 0.5
    masked = torch.ones(1, dtype=torch.bool)
    assert float(np.float32(0.5 + 1e-12)) == 0.5
    assert Factor(0.5 + 1e-12).select(conf, masked, None).tolist() == [True]  # 0.5 < 0.500000000001
    assert Factor(0.5).select(conf, masked, None).tolist() == [False]  # strict rule


def test_numpy_numbers_are_accepted_and_stored_exactly():
    dc = DecodeConfig(threshold=np.float32(0.95), block_size=np.int64(8), max_new_tokens=np.int32(16),
                      factor=np.float64(1.5), max_entropy=np.float16(0.5), repetition_penalty=np.float32(2),
                      eos_bias_rate=np.float32(0.25), eos_bias_soft_limit=np.int64(4), max_steps=np.int16(3))
    assert dc.threshold == F32_095 and type(dc.threshold) is float
    assert dc.block_size == 8 and type(dc.block_size) is int and type(dc.max_steps) is int
    json.dumps(dc.to_dict())  # what traces store
    pol = make_policy(dc.policy, threshold=dc.threshold, tokens_per_step=2, max_entropy=0.5, factor=1.0)
    assert pol.select(torch.tensor([F32_095]), torch.tensor([True]), None).tolist() == [True]
    with pytest.raises(TypeError, match="threshold"):
        DecodeConfig(threshold=np.bool_(True))


def test_event_threshold_round_trips_into_a_config(model):
    """The confidence an event gives back (np.float32) is a valid threshold, and a decode at that
    threshold accepts that slot (equality passes)."""
    steps = []
    BlockDecoder(model, None, DecodeConfig(block_size=4, threshold=1.0, max_new_tokens=4)).generate(
        [5, 6, 7], hooks=[lambda e: steps.append(e) if isinstance(e, StepEvent) else None])
    first = steps[0]
    slot = int(np.nanargmax(first.confidence))
    thr = first.confidence[slot]
    assert isinstance(thr, np.float32)
    steps2 = []
    BlockDecoder(model, None, DecodeConfig(block_size=4, threshold=thr, max_new_tokens=4)).generate(
        [5, 6, 7], hooks=[lambda e: steps2.append(e) if isinstance(e, StepEvent) else None])
    assert steps2[0].accepted[slot] and not steps2[0].forced.any()
    assert np.array_equal(steps2[0].accepted, first.masked_before & (first.confidence >= thr))


# ---------------------------------------------------------------- item 4: validation
@pytest.mark.parametrize("field", ["eos_bias_rate", "repetition_penalty", "factor", "max_entropy", "threshold"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_numbers_are_refused(field, bad):
    with pytest.raises(ValueError, match=rf"{field} must be a finite number in [\[(]"):
        DecodeConfig(**{field: bad})


@pytest.mark.parametrize("kw, words", [
    (dict(repetition_ngram=1), r"repetition_ngram must be an int >= 2, got 1; e.g. 3"),
    (dict(repetition_ngram=0), r"repetition_ngram must be an int >= 2"),
    (dict(eos_bias_rate=0), r"eos_bias_rate must be a finite number in \(0, inf\), got 0"),
    (dict(eos_bias_rate=-0.1), r"eos_bias_rate must be a finite number in \(0, inf\)"),
    (dict(repetition_window=2, repetition_ngram=3), r"repetition_window must be >= repetition_ngram \(3\)"),
    (dict(eos_bias_soft_limit=-1), r"eos_bias_soft_limit must be an int >= 0"),
    (dict(max_steps=0), r"max_steps must be an int >= 1"),
])
def test_processor_settings_refused_at_construction(kw, words):
    with pytest.raises(ValueError, match=words):
        DecodeConfig(**kw)


def test_block_size_above_the_context_is_refused(model):
    small = CloverModel(CloverConfig(**{**CFG.to_dict(), "max_position_embeddings": 16})).eval()
    with pytest.raises(ValueError, match=r"block_size 32 is larger than the model's context of 16 positions "
                                         r"\(max_position_embeddings\); use a block_size of at most 16"):
        BlockDecoder(small, None, DecodeConfig(block_size=32)).generate([5, 6, 7])
    # at the limit it decodes (and stops at the context)
    res = BlockDecoder(small, None, DecodeConfig(block_size=16, threshold=0.5)).generate([5, 6, 7])
    assert res.stop_reason in ("context", "eos")


def test_prompt_with_lone_surrogates_is_a_clear_error(model):
    text = b"print('caf\xe9')".decode("utf-8", errors="surrogateescape")
    with pytest.raises(ValueError, match=r"the prompt is not valid text: character 10 \('\\udce9'\) is a lone "
                                         r"surrogate.*surrogateescape.*errors='replace'"):
        BlockDecoder(model, byte_tokenizer()).generate(text)


@pytest.fixture(scope="module")
def trace_table():
    return pq.read_table(ROOT / "tests" / "data" / "small_trace.parquet")


@pytest.mark.parametrize("column", ["confidence", "top_tokens_shape", "memory_share_shape", "firings", "wall_s"])
def test_trace_missing_column(tmp_path, trace_table, column):
    path = tmp_path / "t.parquet"
    pq.write_table(trace_table.drop_columns([column]), path)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: column '{column}' is missing"):
        Trace.load(path)


@pytest.mark.parametrize("column, values, expected", [
    ("confidence", lambda n: pa.array([str(i) for i in range(n)]), "a list of a floating type"),
    ("tokens", lambda n: pa.array([[1.5]] * n), "a list of an integer type"),
    ("masked_before", lambda n: pa.array([[1]] * n), "a list of bool"),
    ("block_index", lambda n: pa.array(["0"] * n), "int64"),
    ("top_probs_shape", lambda n: pa.array([[1.0, 2.0]] * n), "list<int64>"),
    ("firings", lambda n: pa.array([[1]] * n), "list<struct<name: string"),
])
def test_trace_column_of_the_wrong_type(tmp_path, trace_table, column, values, expected):
    path = tmp_path / "t.arrow"
    table = trace_table.set_column(trace_table.column_names.index(column), column, values(trace_table.num_rows))
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: column '{column}' has type .*, expected "
                                         rf"{re.escape(expected)}"):
        Trace.load(path)


# ---------------------------------------------------------------- item 5: undecodable ids
def test_ids_the_tokenizer_cannot_decode_are_never_candidates(model):
    """clover-test's LM head has 320 outputs, the byte tokenizer 264 tokens: ids 264..319 decode to
    nothing. Even when the model favours them they are never candidates (MASK neither); EOS stays one."""
    tok = byte_tokenizer()
    n_tok = tok.get_vocab_size()
    assert (n_tok, CFG.vocab_size) == (264, 320)
    bias = torch.zeros(CFG.vocab_size)
    bias[n_tok:] = 8.0  # the model now prefers undecodable ids
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias.to(out.dtype))
    try:
        steps = []
        res = BlockDecoder(model, tok, DecodeConfig(block_size=8, threshold=0.5, max_new_tokens=64)).generate(
            "Hello", hooks=[lambda e: steps.append(e) if isinstance(e, StepEvent) else None])
    finally:
        handle.remove()
    assert res.tokens and max(res.tokens) < n_tok
    cands = np.concatenate([s.candidate[s.masked_before] for s in steps])
    assert cands.max() < n_tok and CFG.mask_token_id not in cands
    live = np.concatenate([s.top_tokens[s.masked_before][s.top_probs[s.masked_before] > 0] for s in steps])
    assert live.max() < n_tok
    assert res.text == tok.decode(res.tokens)


# ---------------------------------------------------------------- item 6: threads and the README
def test_thread_count_rules(monkeypatch):
    from clover_engine import threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    assert threads.default_threads() == 1
    monkeypatch.setattr(threads, "usable_cpus", lambda: 64)
    assert threads.default_threads() == threads.MAX_DEFAULT_THREADS
    assert threads.resolve_threads(None, environ={}) == threads.MAX_DEFAULT_THREADS
    assert threads.resolve_threads(None, environ={"OMP_NUM_THREADS": "3"}) == 3
    assert threads.resolve_threads(2, environ={"OMP_NUM_THREADS": "3"}) == 2  # --threads wins
    with pytest.raises(ValueError, match="OMP_NUM_THREADS='lots' is not an int >= 1"):
        threads.resolve_threads(None, environ={"OMP_NUM_THREADS": "lots"})
    with pytest.raises(ValueError, match="--threads must be an int >= 1"):
        threads.resolve_threads(0)


ENTRY_POINTS = [
    ["-m", "clover_engine.generate"], ["-m", "clover_engine.eval"], ["-m", "clover_engine.train"], ["-m", "clover_engine.checkpoint"],
] + [[str(p.relative_to(ROOT))] for p in sorted(ROOT.glob("benchmarks/*.py"))]  # every benchmark script


@pytest.mark.parametrize("cmd", ENTRY_POINTS, ids=lambda c: c[-1])
def test_every_cli_has_threads(cmd):
    out = subprocess.run([sys.executable, *cmd, "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "--threads N" in out.stdout and "OMP_NUM_THREADS" in out.stdout


def test_generate_cli_sets_threads(tmp_path):
    from clover_engine.checkpoint import save_model

    torch.manual_seed(0)
    save_model(CloverModel(CFG), tmp_path / "m", tokenizer=byte_tokenizer())
    base = [sys.executable, "-m", "clover_engine.generate", "--model", str(tmp_path / "m"), "--prompt", "def",
            "--block-size", "4", "--max-new-tokens", "4"]
    env = {k: v for k, v in __import__("os").environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run(base + ["--threads", "2"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    assert "threads=2" in out.stdout
    out = subprocess.run(base, capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**env, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0 and "threads=1" in out.stdout, out.stderr
    out = subprocess.run(base + ["--threads", "0"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert out.returncode == 2 and "--threads" in out.stderr


def test_readme_commands_use_the_venv():
    """A command the README shows runs with the venv's interpreter: `python -m x` alone only works
    with the venv activated, which the README never asks for."""
    text = (ROOT / "README.md").read_text()
    bare = [m.group(0) for m in re.finditer(r"(?<![\w/.])(python3?|panel|pytest) (-m \S+|serve|\S+\.py)", text)]
    assert not bare, f"README commands without .venv/bin/: {bare}"
    assert ".venv/bin/python -m clover_engine.generate" in text
