"""Training: a few steps on a fixed batch lower the masked-slot loss; masking rules.

Run: .venv/bin/python -m pytest tests/clover_engine/test_train.py -q
"""

import pytest
import torch
import torch.nn.functional as F

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.backbones.clover.model import CloverModel
from clover_engine.train import BLOCK_SIZE_WEIGHTS, ROW_SHAPE, lr_at, mask_blocks, tiny_config


def masked_loss(model, clean, noisy, L, window):
    h, aux = model.forward_train(clean, noisy, L, window)
    msk = noisy == model.config.mask_token_id
    return F.cross_entropy(model.lm_head(h[msk]), clean[msk]), aux


def test_a_few_steps_lower_the_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    cfg = CloverConfig.from_name("clover-test")
    model = CloverModel(cfg).train()
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 256, (2, 32), generator=g)
    noisy = mask_blocks(clean, 8, cfg.mask_token_id, g)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with torch.no_grad():
        before = float(masked_loss(model.eval(), clean, noisy, 8, True)[0])
    model.train()
    for _ in range(8):
        loss, aux = masked_loss(model, clean, noisy, 8, True)
        opt.zero_grad()
        (loss + 0.01 * aux).backward()
        opt.step()
    with torch.no_grad():
        after = float(masked_loss(model.eval(), clean, noisy, 8, True)[0])
    assert after < before - 0.5, (before, after)


def test_mask_blocks_masks_every_block_and_only_with_mask_id():
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(2, 100, (3, 64), generator=g)
    for L in (1, 4, 32):
        noisy = mask_blocks(clean, L, 1, g)
        m = (noisy == 1).view(3, 64 // L, L)
        assert m.any(-1).all()  # at least one masked slot per block
        assert torch.equal(noisy[noisy != 1], clean[noisy != 1])


def test_schedule_and_shapes():
    assert abs(sum(BLOCK_SIZE_WEIGHTS.values()) - 1) < 1e-9
    assert all(T % L == 0 for L, (T, _) in ROW_SHAPE.items())
    assert lr_at(0.0, 1.0) == 0.0 and abs(lr_at(0.02, 1.0) - 1.0) < 1e-9 and abs(lr_at(1.0, 1.0) - 0.1) < 1e-9
    cfg = tiny_config()
    assert cfg.attention_window > 0 and cfg.mask_token_id == 1 and cfg.eos_token_id == 3


def test_focus_masking_masks_only_assistant_tokens_in_their_blocks():
    g = torch.Generator().manual_seed(3)
    clean = torch.randint(2, 100, (2, 64), generator=g)
    focus = torch.zeros(2, 64, dtype=torch.bool)
    focus[:, 20:40] = True  # an assistant turn across blocks 0..1 at L = 32
    for _ in range(20):
        noisy = mask_blocks(clean, 32, 1, g, focus)
        masked = noisy == 1
        assert not (masked & ~focus).any()  # non-assistant tokens of assistant blocks stay clean
        assert masked[:, 20:40].any()
    # blocks without focus tokens are masked only sometimes (OTHER_BLOCK_RATE), never all of them
    focus2 = torch.zeros(8, 64, dtype=torch.bool)
    hits = sum(int(((mask_blocks(clean.repeat(4, 1), 32, 1, g, focus2) == 1).view(8, 2, 32).any(-1)).sum())
               for _ in range(20))
    assert 0 < hits < 8 * 2 * 20


def test_packed_rows_start_at_a_conversation_and_flag_assistant_turns():
    from clover_engine.checkpoint import load_tokenizer
    from clover_engine.data.agent import iter_conversations
    from clover_engine.train import pack_conversations

    tok = load_tokenizer("models/clover-tiny")
    ids, focus, value = pack_conversations(iter_conversations(5, None), tok, 0, 1024)
    assert len(ids) == len(focus) == len(value) == 1024
    assert tok.decode(ids[:4], skip_special_tokens=False).startswith("<|im_start|>system")
    flagged = tok.decode([t for t, f in zip(ids, focus) if f], skip_special_tokens=False)
    assert flagged.startswith("<tool_call>{\"name\": ")
    assert "<|im_start|>" not in flagged and "<tool_response>" not in flagged
    # copied values: inside assistant turns, exactly the argument values of the calls
    assert all(f for f, v in zip(focus, value) if v) and any(value)
    convs = iter_conversations(5, None)
    first = next(convs)
    n = len(tok.encode(first.text).ids)
    got = tok.decode([t for t, v in zip(ids[:n], value[:n]) if v], skip_special_tokens=False).replace(" ", "")
    want = "".join(str(f.value) for c in first.calls for f in c.fields).replace(" ", "")
    assert got == want, (got, want)


def test_with_attention_conv_keeps_the_function_and_refuses_a_resize():
    import dataclasses

    import pytest

    from clover_engine.train import with_attention_conv

    torch.manual_seed(0)
    base = CloverModel(CloverConfig.from_name("clover-test")).eval()
    conv = with_attention_conv(base, 3).eval()
    assert conv.config.attention_conv_kernel_dim == 3
    hist = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1))
    blk = torch.full((1, 8), base.config.mask_token_id)
    for mode in ("state", "state+window"):
        torch.testing.assert_close(conv.forward_reference(hist, blk, 8, mode).logits,
                                   base.forward_reference(hist, blk, 8, mode).logits)
    assert with_attention_conv(conv, 3) is conv
    with pytest.raises(ValueError, match="cannot resize"):
        with_attention_conv(conv, 4)
    with pytest.raises(ValueError, match=">= 1"):
        with_attention_conv(base, 0)
    with pytest.raises(ValueError, match="attention_conv_kernel_dim"):
        dataclasses.replace(base.config, attention_conv_kernel_dim=-1)


def test_induction_heads_key_on_the_preceding_tokens_only():
    """After `init_induction_heads`, the induction kv head's key at position i does not depend on
    token i but does on token i - 1; the other kv head's key still depends on token i."""
    import dataclasses

    import pytest

    from clover_engine.train import init_induction_heads

    torch.manual_seed(0)
    cfg = dataclasses.replace(CloverConfig.from_name("clover-test"), attention_conv_kernel_dim=4)
    model = CloverModel(cfg).eval()
    assert init_induction_heads(model, 1) == ["model.layers.3.self_attn.conv1d.weight"]
    keys = []
    hook = model.layers[3].self_attn.k_norm.register_forward_hook(lambda m, i, o: keys.append(i[0].detach()))
    hist = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1))
    other = hist.clone()
    other[0, 15] = (hist[0, 15] + 1) % 256
    blk = torch.full((1, 1), cfg.mask_token_id)
    with torch.no_grad():
        model.forward_reference(hist, blk, 1, "state")
        model.forward_reference(other, blk, 1, "state")
    hook.remove()
    a, b = keys  # [1, 17, Hkv, D]
    torch.testing.assert_close(a[0, 15, 1], b[0, 15, 1])  # induction head: blind to its own token
    assert not torch.allclose(a[0, 16, 1], b[0, 16, 1])  # ... but reads it one step later
    assert not torch.allclose(a[0, 15, 0], b[0, 15, 0])  # the other head is untouched
    with pytest.raises(ValueError, match="kv_heads"):
        init_induction_heads(model, 3)
    with pytest.raises(ValueError, match="--attention-conv 4"):
        init_induction_heads(CloverModel(CloverConfig.from_name("clover-test")), 1)


def test_block_weights_parse_and_refuse_unknown_sizes():
    import pytest

    from clover_engine.train import parse_block_weights

    assert parse_block_weights("1:0.25,32:0.75") == {1: 0.25, 32: 0.75}
    for bad in ("3:1", "1:0,32:0", "32", "1:-1,32:1"):
        with pytest.raises(SystemExit, match="block-weights"):
            parse_block_weights(bad)


def test_with_front_attention_keeps_the_function_and_adds_an_induction_layer():
    import dataclasses

    import pytest

    from clover_engine.train import INDUCTION_TAPS, with_front_attention

    torch.manual_seed(0)
    cfg = dataclasses.replace(CloverConfig.from_name("clover-test"), attention_conv_kernel_dim=4)
    base = CloverModel(cfg).eval()
    grown = with_front_attention(base).eval()
    assert grown.config.layer_types == ["full_attention", *cfg.layer_types]
    hist = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1))
    blk = torch.full((1, 8), cfg.mask_token_id)
    for mode in ("state", "state+window"):
        torch.testing.assert_close(grown.forward_reference(hist, blk, 8, mode).logits,
                                   base.forward_reference(hist, blk, 8, mode).logits)
    w = grown.layers[0].self_attn.conv1d.weight  # q|k|v channels; q and k read lags 1..3 only
    qk = (cfg.num_attention_heads + cfg.num_key_value_heads) * cfg.head_dim
    torch.testing.assert_close(w[:qk, 0], torch.tensor([*reversed(INDUCTION_TAPS), 0.0]).expand(qk, 4))
    torch.testing.assert_close(grown.layers[4].self_attn.conv1d.weight, base.layers[3].self_attn.conv1d.weight)
    with pytest.raises(ValueError, match="--attention-conv 4"):
        with_front_attention(CloverModel(CloverConfig.from_name("clover-test")))


def _queried_runs(focus: list[bool]) -> list[tuple[int, int]]:
    """[start, end) of every run of focus flags: the queried values of a recall row."""
    starts = [i for i in range(len(focus)) if focus[i] and not (i and focus[i - 1])]
    return [(a, next((j for j in range(a, len(focus)) if not focus[j]), len(focus))) for a in starts]


def test_recall_rows_query_earlier_cue_value_pairs():
    import random

    import numpy as np

    from clover_engine.train import RowSource

    def source(seed):
        src = RowSource.__new__(RowSource)  # skip tokenising the stdlib: a small code stream is enough
        src.rng = random.Random(seed)
        src.code = np.arange(1000, 3000, dtype=np.int64)
        return src

    for seed in range(20):
        ids, focus, value = source(seed).recall_row(1024, span=384)
        assert len(ids) == len(focus) == 1024 and focus == value
        runs = _queried_runs(focus)
        assert 4 <= len(runs) <= 8 and runs[-1][1] - runs[0][0] <= 192
        for a, b in runs:  # cue + value was written earlier, within the span (inside the attention window)
            pair = ids[a - 2: b]
            assert any(ids[k: k + len(pair)] == pair for k in range(a - 2 - 384, a - 2 - len(pair) + 1)), (seed, a, b)
    assert source(5).recall_row(1024) == source(5).recall_row(1024)  # deterministic from the seed


def test_recall_rows_short_and_uniform():
    """Rows shorter than the span are one recall segment whose pairs fit its halves; uniform cues and
    values come from the ordinary vocabulary, not from the code stream."""
    import random

    import numpy as np

    from clover_engine.train import FIRST_ORDINARY_ID, RowSource

    src = RowSource.__new__(RowSource)
    src.rng = random.Random(0)
    src.code = np.arange(1000, 1500, dtype=np.int64)  # background ids 1000..1499
    src.vocab = 4096
    for _ in range(20):
        ids, focus, _ = src.recall_row(128, vocab="uniform")
        assert len(ids) == 128 and any(focus) and not any(focus[:64])  # queries only in the second half
        queried = [t for t, f in zip(ids, focus) if f]
        assert all(FIRST_ORDINARY_ID <= t < 4096 for t in queried)
        for a, b in _queried_runs(focus):  # its cue + value was written in the first half
            pair = ids[a - 2: b]
            assert any(ids[k: k + len(pair)] == pair for k in range(0, 64 - len(pair) + 1))
    src.value_ids = [20, 21, 22]  # "values": ids of tool-call argument values only
    ids, focus, _ = src.recall_row(128, vocab="values")
    assert {t for t, f in zip(ids, focus) if f} <= {20, 21, 22}
    with pytest.raises(ValueError, match="vocab must be one of"):
        src.recall_row(128, vocab="bytes")


def test_call_recall_rows_shift_the_cue_format():
    """`call_recall_row`: each flagged value is written once in a request-style context
    (``key: "v"``, ``key "v"`` or ``key="v"``) and once, after it, in a call's arguments object
    (``"key": "v"``): the cue differs between the two, the value tokens are the same."""
    import random
    import re

    import numpy as np
    from tokenizers import Tokenizer

    from clover_engine.data.agent import REQUEST_SEPARATORS
    from clover_engine.train import RowSource

    tok = Tokenizer.from_file("models/clover-tiny/tokenizer.json")
    src = RowSource.__new__(RowSource)
    src.rng, src.tok = random.Random(0), tok
    src.code = np.full(2000, tok.token_to_id("<|endoftext|>"), dtype=np.int64)  # a blank background
    seps = set()
    for _ in range(20):
        ids, focus, value = src.recall_row(256, vocab="calls")
        assert len(ids) == 256 and focus == value and any(focus)
        text = tok.decode(ids, skip_special_tokens=False)
        call = re.search(r'<tool_call>\{"arguments": (\{.*?\})\}</tool_call>', text)
        assert call is not None
        request = text[:call.start()]
        pairs = re.findall(r'"(\w+)": ("[^"]*"|[\d.]+)', call.group(1))
        for key, raw in pairs:
            m = re.search(rf'\b{key}( |: |=){re.escape(raw)}', request)
            assert m is not None, (key, raw, request)
            seps.add(m.group(1))
        queried = tok.decode([t for t, f in zip(ids, focus) if f])
        values = "".join(raw.strip('"') for _, raw in pairs)
        assert queried == values
    assert seps == set(REQUEST_SEPARATORS)
    with pytest.raises(ValueError, match="use T >= 256"):  # not even one pair fits
        src.recall_row(12, vocab="calls")


def test_train_refuses_to_overwrite_a_checkpoint(tmp_path):
    """`python -m clover_engine.train` defaults to runs/ and never writes over an existing checkpoint
    (such as the bundled model) unless told to resume it or to overwrite it."""
    import shutil
    from pathlib import Path

    from clover_engine.train import main

    bundled = Path(__file__).resolve().parents[2] / "models" / "clover-tiny"
    out = tmp_path / "ckpt"
    out.mkdir()
    shutil.copy(bundled / "config.json", out / "config.json")
    (out / "model.safetensors").write_bytes(b"not really weights")
    before = (out / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit, match="already holds a checkpoint"):
        main(["--out", str(out), "--minutes", "0.01", "--tokenizer", str(bundled / "tokenizer.json")])
    assert (out / "model.safetensors").read_bytes() == before


def test_open_tool_rows_flag_assistant_turns_and_copied_values():
    """Open-vocabulary conversations pack like the fixed-tool ones: focus on assistant turns,
    value flags on the argument values a call copies (names and keys come from the system turn)."""
    from pathlib import Path

    from tokenizers import Tokenizer

    from clover_engine.training.rows import open_tool_conversations, pack_conversations

    tok = Tokenizer.from_file(str(Path(__file__).resolve().parents[2] / "models" / "clover-tiny" / "tokenizer.json"))
    ids, focus, value = pack_conversations(open_tool_conversations(5), tok, tok.token_to_id("<|endoftext|>"), 2048)
    assert len(ids) == len(focus) == len(value) == 2048
    assert 0.02 < sum(focus) / len(ids) < 0.6 and any(value)
    assert all(f for f, v in zip(focus, value) if v)  # copied values lie inside assistant turns
    text = tok.decode([i for i, f in zip(ids, focus) if f], skip_special_tokens=False)
    assert "<tool_call>" in text and "<tool_response>" not in text


def test_device_and_dtype_options_are_checked():
    from clover_engine.training.loop import parse_args

    tok = "models/clover-tiny/tokenizer.json"
    with pytest.raises(SystemExit, match="bf16 is for --device cuda"):
        parse_args(["--tokenizer", tok, "--dtype", "bf16"])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no CUDA device"):
            parse_args(["--tokenizer", tok, "--device", "cuda"])
    with pytest.raises(SystemExit, match="open_tools_share|open-tools-share"):
        parse_args(["--tokenizer", tok, "--open-tools-share", "1.5"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_training_step_on_cuda_writes_a_cpu_loadable_checkpoint(tmp_path):
    from clover_engine.checkpoint import load_model
    from clover_engine.train import main

    out = tmp_path / "gpu"
    main(["--out", str(out), "--tokenizer", "models/clover-tiny/tokenizer.json", "--device", "cuda",
          "--dtype", "bf16", "--minutes", "0.05", "--eval-tasks", "0", "--open-tools-share", "0.3"])
    model = load_model(out)  # on the CPU
    assert next(model.parameters()).device.type == "cpu"


def test_train_gpu_script_cpu_path_on_tiny_config(tmp_path):
    """benchmarks/train_gpu.sh with TINY=1: train (open-vocabulary data in the mix) and eval, CPU;
    with ISOLATE_SPACES=1 on a tokenizer it builds with the --isolate-spaces rule."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from clover_engine.checkpoint import load_model

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "clover-tiny-run"
    env = dict(os.environ, TINY="1", ISOLATE_SPACES="1", PYTHON=sys.executable, OMP_NUM_THREADS="1")
    p = subprocess.run(["bash", str(root / "benchmarks" / "train_gpu.sh"), str(out)], env=env, cwd=root,
                       capture_output=True, text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log and all(torch.isfinite(torch.tensor(r["loss"])) for r in log)
    report = json.loads((out / "eval.json").read_text())
    assert set(report["agent"]) == {"bd32-window", "ar1-window"}
    assert report["open_tools"]["bd32-window"]["n_tasks"] == 2
    assert load_model(out).config.name == "clover-tiny"
    from clover_engine.checkpoint import load_tokenizer

    tok = load_tokenizer(out)  # the model carries the tokenizer it was trained with: the rule's
    assert [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("a word")] == ["a", "Ġ", "word"]
    assert (tmp_path / "clover-tiny-run.isolate-spaces.tokenizer.json").is_file()


def test_code_rows_from_train_packages_never_heldout():
    """--code-source packages: code rows are windows of the train packages' sources (the held-out
    packages of clover_engine.eval never appear); an unknown source is refused."""
    from tokenizers import Tokenizer

    from clover_engine.data.packages import iter_package_text
    from clover_engine.train import RowSource

    tok = Tokenizer.from_file("models/clover-tiny/tokenizer.json")
    src = RowSource(tok, seed=3, code_source="packages", package_chars=150_000)
    first = next(iter_package_text("train", 3))
    head = tok.encode(first).ids[:64]
    assert src.code[:64].tolist() == head  # the stream starts with the first train file in seeded order
    heldout = next(iter_package_text("heldout", 0))
    assert tok.decode(tok.encode(heldout).ids[:64]) not in tok.decode(src.code.tolist())
    ids, focus, _ = src.code_row(128)
    assert len(ids) == 128 and all(focus)
    with pytest.raises(ValueError, match="code_source must be one of"):
        RowSource(tok, seed=0, code_source="github")


def test_train_throughput_benchmark_counts_flops(tmp_path):
    """benchmarks/train_throughput.py on clover-test: one table row per variant, FLOPs counted
    by torch's FlopCounterMode (the loop shape and the short rows have the same tokens per step,
    so the same FLOPs within the attention's share), and a measured matmul peak."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, str(root / "benchmarks" / "train_throughput.py"), "--size", "test",
                        "--steps", "1", "--peak-n", "128", "--threads", "1"], capture_output=True, text=True,
                       timeout=300, cwd=root)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [l for l in p.stdout.splitlines() if l.startswith("| ") and "GFLOP" not in l and "---" not in l]
    assert [r.split("|")[2].strip() for r in rows] == ["loop shape", "4x rows", "short rows"]
    flops = [float(r.split("|")[5]) for r in rows]
    assert flops[1] > 3.5 * flops[0] and abs(flops[2] - flops[0]) < 0.3 * flops[0]
    assert re.search(r"measured matmul peak [\d.]+ GFLOP/s", p.stdout)


def test_periodic_evaluation_logs_the_unseen_tool_probe_when_asked(monkeypatch):
    """`loop.evaluate` adds the unseen-tool name / key probe (`probes.open_name_probe`) to the
    training log's record when given turns for it, and leaves it out otherwise."""
    from clover_engine.checkpoint import load_model, load_tokenizer
    from clover_engine.training import loop
    from clover_engine.training.loop import evaluate, held_out_batches

    monkeypatch.setattr(loop, "value_probe", lambda *a, **k: {})  # tested on its own; 40 tasks cost a minute

    model, tok = load_model("models/clover-tiny"), load_tokenizer("models/clover-tiny")
    held, held_call = held_out_batches(tok, model.config.mask_token_id)
    held, held_call = held[:1], held_call[:1]
    rec = evaluate(model, tok, held, held_call, 0, open_probe_tasks=3)
    probe = rec["open_name_probe"]
    assert set(probe) == {"window", "state"}
    assert set(probe["window"]) == {"name_first", "name_rest", "keys", "name_first_listed", "name_first_chance"}
    assert all(0.0 <= v <= 1.0 for m in probe.values() for v in m.values())
    assert "open_name_probe" not in evaluate(model, tok, held, held_call, 0)
