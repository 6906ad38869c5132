"""The block-diffusion adaptation recipe (clover_engine.training.causal_lm) on a tiny random Llama, CPU, seconds."""

from __future__ import annotations

import json
import random

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from clover_engine.training.causal_lm import main  # noqa: E402
from clover_engine.training.causal_lm_objective import build_example  # noqa: E402

MASK = 99


def test_example_layout_token_shift_and_mask():
    ids = list(range(10, 30))  # 20 tokens; answer from index 6
    ex = build_example(ids, 6, 4, MASK, random.Random(0), pad_id=2)
    T = ex["n_clean"]
    assert T == 20
    # blocks holding answer tokens: 1 (slots 4..7) .. 4 -> 4 windows of 4
    assert ex["input_ids"].shape[0] == T + 4 * 4
    for w, s in enumerate((4, 8, 12, 16)):
        off = T + 4 * w
        win = ex["input_ids"][off: off + 4].tolist()
        assert win[0] == ids[s - 1]  # the window opens with the last clean token before the block
        assert ex["position_ids"][off: off + 4].tolist() == list(range(s - 1, s + 3))
        for j in range(4):
            lab = int(ex["labels"][off + j])
            if lab != -100:
                assert lab == ids[s + j]  # output j predicts slot j
                assert s + j >= 6  # prompt slots are never masked
                if j < 3:
                    assert win[j + 1] == MASK  # a masked slot's input is MASK (slot b-1 is not an input)
        m = ex["mask"][off: off + 4]
        assert m[:, : s - 1].all() and not m[:, s - 1: T].any()  # clean prefix x_0..x_{s-2} only
        assert m[:, off: off + 4].all()  # bidirectional in the window
        assert not m[:, T:off].any() and not m[:, off + 4:].any()  # no other window
    assert torch.equal(ex["mask"][:T, :T], torch.ones(T, T, dtype=torch.bool).tril())


def test_tiny_training_runs_saves_loads_and_resumes(tmp_path):
    from clover_engine.checkpoint import load_model
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig

    out = tmp_path / "bd"
    args = ["--tiny", "--out", str(out), "--max-steps", "6", "--minutes", "5", "--no-progress", "--accum", "1"]
    assert main(args) == 0
    log = [json.loads(l) for l in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 6 and all(torch.isfinite(torch.tensor(r["diff_loss"])) for r in log)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "hf-block-diffusion" and cfg["step"] == 6
    model = load_model(out)
    r = BlockDecoder(model, None, DecodeConfig(block_size=8, max_new_tokens=16)).generate([5, 6, 7, 8, 9, 10])
    assert len(r.tokens) == 16 or r.stop_reason == "eos"
    args[args.index("--max-steps") + 1] = "8"
    assert main(args + ["--resume"]) == 0  # resume to step 8
    assert json.loads((out / "config.json").read_text())["step"] == 8


def test_train_cli_dispatches_to_adaptation(monkeypatch):
    import clover_engine.training.causal_lm as hf
    from clover_engine import train

    seen = {}
    monkeypatch.setattr(hf, "train", lambda args: seen.setdefault("args", args) and 0)
    train.main(["--init-from", "smollm2-135m-instruct", "--objective", "block-diffusion", "--out", "x",
                "--max-steps", "1"])
    assert seen["args"].init_from == "smollm2-135m-instruct" and seen["args"].max_steps == 1


def test_eval_prompts_fixed_and_disjoint_from_training():
    from clover_engine.data.chat_prompts import eval_prompts, training_prompts

    ev = eval_prompts()
    assert len(ev) >= 50 and len(set(ev)) == len(ev)
    assert not set(ev) & set(training_prompts(5000, 0))
    assert training_prompts(50, 0) == training_prompts(50, 0)


def test_gpu_script_cpu_path_on_tiny_config(tmp_path):
    """benchmarks/adapt_smollm2_gpu.sh with TINY=1: train + eval steps on a tiny random Llama, on the CPU."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "gpu-tiny"
    env = dict(os.environ, TINY="1", PYTHON=sys.executable, OMP_NUM_THREADS="1")
    p = subprocess.run(["bash", str(root / "benchmarks" / "adapt_smollm2_gpu.sh"), str(out)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads((out / "eval.json").read_text())
    assert set(report["adapted"]) == {"1/0.95", "8/0.95"} and "8/0.95" in report["base"]
    assert "tok/fwd" in p.stdout
    speed = report["speed"]["by_block_size"]  # back to back vs the base's generate, with the measured break-even
    assert set(speed) == {"4", "8"} and all(v["break_even"]["tokens_per_forward"] > 0 for v in speed.values())
    assert "break-even here" in p.stdout


def test_chat_rows_target_exactly_one_assistant_turn():
    """Open-vocabulary tool-call chats become (prompt, one assistant turn) rows: the answer is a
    whole assistant turn through its <|im_end|>, never a tool response or a user turn."""
    from clover_engine.training.causal_lm_data import ExampleSource
    from clover_engine.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    src = ExampleSource(tok, None, 0.0, seed=3, max_len=4096, eos_id=2, open_tools_share=1.0)
    seen_later_turn = False
    for _ in range(30):
        ids, a0 = src.next()
        prompt = tok.decode(ids[:a0], skip_special_tokens=False)
        answer = tok.decode(ids[a0:], skip_special_tokens=False)
        assert prompt.endswith("<|im_start|>assistant\n")
        assert answer.endswith("<|im_end|>") and answer.count("<|im_end|>") == 1
        assert "<tool_response>" not in answer and "<|im_start|>" not in answer
        seen_later_turn |= "<tool_response>" in prompt
    assert seen_later_turn  # chains: later turns see the tool's response in their prompt


def test_init_adapter_starts_a_new_stage_from_saved_weights(tmp_path):
    from safetensors.torch import load_file

    first = tmp_path / "stage1"
    common = ["--tiny", "--minutes", "5", "--no-progress", "--accum", "1"]
    assert main(common + ["--out", str(first), "--max-steps", "3"]) == 0
    second = tmp_path / "stage2"
    assert main(common + ["--out", str(second), "--max-steps", "0", "--init-adapter", str(first)]) == 0
    for name in ("adapter_model.safetensors", "mask_embedding.safetensors"):
        a, b = load_file(str(first / name)), load_file(str(second / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    with pytest.raises(ValueError, match="missing"):
        main(common + ["--out", str(tmp_path / "x"), "--max-steps", "0", "--init-adapter", str(tmp_path)])


def test_suffix_masking_masks_a_block_suffix_of_answer_slots():
    """--suffix-share 1: every window masks the answer slots from some k to the block's end, nothing before k."""
    ids = list(range(10, 42))  # 32 tokens; answer from index 5
    gen = random.Random(1)
    ks = set()
    for _ in range(20):
        ex = build_example(ids, 5, 8, MASK, gen, pad_id=2, suffix_share=1.0)
        T = ex["n_clean"]
        for w, s in enumerate(range(8, 32, 8)):
            lab = ex["labels"][T + 8 * w: T + 8 * w + 8].tolist()
            masked = [j for j in range(8) if lab[j] != -100]
            assert masked and masked == list(range(masked[0], 8))  # a non-empty suffix
            ks.add(masked[0])
    assert len(ks) >= 5  # the clean prefix length varies
    # answer from 10: the first window (slots 8..15) never masks the prompt slots 8, 9
    for seed in range(10):
        ex = build_example(ids, 10, 8, MASK, random.Random(seed), pad_id=2, suffix_share=1.0)
        lab = ex["labels"][ex["n_clean"]: ex["n_clean"] + 8].tolist()
        assert lab[0] == lab[1] == -100 and lab[7] == ids[15]


def _tiny_distill(path, n=12):
    with open(path, "w") as fh:  # one learnable answer pattern, so a held-out row's loss can fall
        for i in range(n):
            fh.write(json.dumps({"prompt": f"question {i}", "answer_ids": [40 + (i + j) % 7 for j in range(20)],
                                 "eos": True}) + "\n")
    return path


def test_heldout_rows_are_scored_never_trained_and_full_finetune_compares(tmp_path, capsys):
    """--heldout-rows N keeps the file's last N rows out of training and logs their losses with the same
    noise each time; --full-finetune trains every weight (the LoRA comparison) and writes no weights."""
    from clover_engine.training.causal_lm_data import ExampleSource
    from clover_engine.tokenizer import byte_tokenizer

    data = _tiny_distill(tmp_path / "d.jsonl")
    src = ExampleSource(byte_tokenizer(), data, 0.0, 0, 256, 2, synthetic_vocab=320, holdout=3)
    assert len(src.rows) == 9 and len(src.heldout) == 3
    drawn = {tuple(src.next()[0]) for _ in range(200)}
    assert not drawn & {tuple(r[0]) for r in src.heldout}  # never a training row
    logs = {}
    for kind, extra in (("lora", []), ("full", ["--full-finetune"])):
        out = tmp_path / kind
        # a 3-second cosine (time-based, like every run): warm-up, then the full rate
        assert main(["--tiny", "--data", str(data), "--heldout-rows", "3", "--out", str(out), "--max-steps", "12",
                     "--minutes", "0.05", "--no-progress", "--accum", "1", "--lr", "1e-2", *extra]) == 0
        rows = [json.loads(l) for l in (out / "train_log.jsonl").read_text().splitlines()]
        logs[kind] = [r for r in rows if "heldout_diff" in r]
        assert [r["step"] for r in logs[kind]][0] == 0 and len(logs[kind]) == 2  # at the start and the final save
        assert logs[kind][1]["step"] > 0 and logs[kind][1]["heldout_diff"] != logs[kind][0]["heldout_diff"]
        # (whether a few steps of a 3-second, wall-clock schedule lower the loss depends on the machine's load)
    assert logs["lora"][0]["heldout_diff"] == pytest.approx(logs["full"][0]["heldout_diff"])  # same start, same noise
    assert (tmp_path / "lora" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "full" / "adapter_model.safetensors").exists()  # a measurement run writes no weights
    # the score is a fixed-noise measurement: the same model scores the same twice
    from clover_engine.training.causal_lm_lora import make_trainable, tiny_lm
    from clover_engine.training.causal_lm_objective import heldout_loss
    from clover_engine.backbones.causal_lm.model import HFBlockConfig, HFBlockDiffusionModel

    lm = tiny_lm()
    plm, mask_init = make_trainable(lm, 8, 16, 319)
    m = HFBlockDiffusionModel(plm, HFBlockConfig.from_hf(lm.config, "t", 319, 2), mask_init)
    assert heldout_loss(m, src.heldout, 319, 2, torch.device("cpu")) == heldout_loss(m, src.heldout, 319, 2,
                                                                                        torch.device("cpu"))
    with pytest.raises(SystemExit, match="starts from the base alone"):
        main(["--tiny", "--out", str(tmp_path / "x"), "--full-finetune", "--resume", "--max-steps", "1"])
