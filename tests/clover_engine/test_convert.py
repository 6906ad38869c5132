"""Qwen3.5-MoE -> Clover conversion (`clover_engine.convert`), on tiny random checkpoints that transformers
builds and saves itself (`save_pretrained(..., safe_serialization=True)`; experts are written one
module per expert, as on the Hub).

Run: .venv/bin/python -m pytest tests/clover_engine/test_convert.py -q
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

from clover_engine.backbones.clover.convert_mapping import CLOVER_ONLY, MEMORY_OFF_LOGIT, mask_token
from clover_engine.checkpoint import load_model
from clover_engine.convert import build_model, convert, main
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig

ROOT = Path(__file__).resolve().parents[2]
TINY_TOKENIZER = ROOT / "models" / "clover-tiny" / "tokenizer.json"


def _source(directory: Path, layer_types: list[str] | None = None, vocab_size: int = 320, eos: int = 256,
            seed: int = 0) -> Qwen3_5MoeForCausalLM:
    """A tiny random Qwen3_5MoeForCausalLM saved to `directory`; default layers: 3 x GDN then attention."""
    torch.manual_seed(seed)
    cfg = Qwen3_5MoeTextConfig(
        vocab_size=vocab_size, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, max_position_embeddings=1024, eos_token_id=eos, layer_types=layer_types,
    )
    model = Qwen3_5MoeForCausalLM(cfg).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen35-hybrid")
    return d, _source(d)


@pytest.fixture(scope="module")
def attention_only(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen35-attn")
    return d, _source(d, layer_types=["full_attention"] * 4)


def test_every_source_weight_lands_under_its_transformers_name(hybrid):
    """The Clover state dict uses transformers' in-memory names, so the source maps by key (the MASK row
    added to the vocabulary aside); the Clover-only parameters are the memory unit and GDN temperature."""
    src, hf = hybrid
    model, _, conv = build_model(src, window=64)
    ours = model.state_dict()
    for name, t in hf.state_dict().items():
        mine = ours[name][: t.shape[0]] if name in ("model.embed_tokens.weight", "lm_head.weight") else ours[name]
        assert torch.equal(mine, t), name
    extra = set(ours) - set(hf.state_dict())
    assert extra and all(CLOVER_ONLY.fullmatch(n) for n in extra), sorted(extra)
    assert conv.grown_rows == 1 and model.config.mask_token_id == 320 and model.config.vocab_size == 321
    attn = next(layer.self_attn for layer in model.layers if layer.layer_type == "full_attention")
    assert float(attn.mem_b_logit.detach().max()) == MEMORY_OFF_LOGIT


def test_attention_layers_compute_the_source_exactly_when_fed_the_token(attention_only):
    """An all-attention source, fed each token at its own position in state+window mode (memory off,
    window covering the context): the logits are the source's. What remains at block_size 1 is the
    missing token shift."""
    src, hf = attention_only
    model, _, _ = build_model(src, window=64)
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        h, _ = model.forward_train(ids, ids, 1, use_window=True)
        ours = model.lm_head(h)[..., :320]
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-4)


# Measured block_size-1 agreement on the tiny hybrid source (seed 0), 4 prompts x 16 tokens; see the
# module docstring of clover_engine.convert for why greedy / teacher-forced sit at chance level (no token shift)
# while same-position agreement shows how much of the source's function the copied weights keep.
PINNED_AGREEMENT = {
    "state+window": {"greedy": 0.0, "teacher_forced": 0.0, "same_position": 0.844},
    "state": {"greedy": 0.0, "teacher_forced": 0.0, "same_position": 0.359},
}


def test_convert_writes_a_checkpoint_that_loads_decodes_and_pins_its_agreement(hybrid, tmp_path):
    src, _ = hybrid
    out = tmp_path / "clover"
    conv = convert(src, out, window=64, prompts=4, max_new_tokens=16)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    model = load_model(out)
    events = []
    res = BlockDecoder(model, None, DecodeConfig(block_size=4, max_new_tokens=12, threshold=0.5)).generate(
        [5, 6, 7, 8, 9], hooks=[events.append])
    assert len(res.tokens) <= 12 and any(type(e).__name__ == "StepEvent" for e in events)
    got = conv.agreement["modes"]
    for mode, metrics in PINNED_AGREEMENT.items():
        for metric, value in metrics.items():
            assert got[mode][metric] == pytest.approx(value, abs=0.07), (mode, metric, got[mode][metric])
    card = (out / "README.md").read_text()
    assert "## Agreement with the source at block_size 1" in card and "No token shift" in card
    assert f"{got['state+window']['same_position']:.3f}" in card
    with pytest.raises(ValueError, match="already holds a checkpoint"):
        convert(src, out, agreement=False)


def test_a_multimodal_checkpoint_converts_its_text_model_and_skips_the_rest(hybrid, tmp_path):
    """Qwen3_5MoeForConditionalGeneration's layout: model.language_model.*, a vision tower, an MTP head."""
    src, hf = hybrid
    text = json.loads((src / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": text,
                                                      "vision_config": {}}))
    tensors = {(k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
               for k, v in load_file(src / "model.safetensors").items()}
    tensors["model.visual.patch_embed.proj.weight"] = torch.zeros(2, 2)
    tensors["mtp.fc.weight"] = torch.zeros(2, 2)
    save_file(tensors, tmp_path / "model.safetensors")
    model, _, conv = build_model(tmp_path)
    assert sorted(conv.skipped) == ["model.visual.patch_embed.proj.weight", "mtp.fc.weight"]
    for name, t in hf.state_dict().items():
        if name not in ("model.embed_tokens.weight", "lm_head.weight"):
            assert torch.equal(model.state_dict()[name], t), name


def test_mask_token_is_found_added_in_a_free_row_or_given_a_new_row():
    from tokenizers import Tokenizer, models

    from clover_engine.tokenizer import byte_tokenizer

    assert mask_token(byte_tokenizer(), 320) == (257, False)  # has <|mask|>
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(300)}, unk_token="w0"))
    assert mask_token(tok, 320) == (300, True)  # added, in an unused (padding) row
    assert tok.token_to_id("<|mask|>") == 300
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(320)}, unk_token="w0"))
    assert mask_token(tok, 320) == (320, True)  # added, the vocabulary grows
    assert mask_token(None, 320) == (320, True)


def test_cli_refuses_pickles_and_other_model_types(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe_text", "vocab_size": 8}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    assert main(["--from", "qwen3_5_moe", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "pickle" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert main(["--from", "qwen3_5_moe", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "model_type='llama'" in capsys.readouterr().err


def test_continued_training_runs_on_a_converted_model_and_refuses_a_foreign_tokenizer(tmp_path):
    """clover_engine.train --init-from DST takes a couple of steps; a tokenizer larger than the converted
    vocabulary is refused with the fix, before any step."""
    from clover_engine.train import main as train

    src = tmp_path / "src"
    _source(src, vocab_size=4096, eos=3)
    shutil.copy(TINY_TOKENIZER, src / "tokenizer.json")  # has <|mask|>: no row is added
    dst = tmp_path / "clover"
    conv = convert(src, dst, window=256, agreement=False)
    assert conv.config.mask_token_id == 1 and conv.config.vocab_size == 4096
    run = tmp_path / "run"
    train(["--init-from", str(dst), "--tokenizer", str(dst / "tokenizer.json"), "--out", str(run),
           "--minutes", "0.02", "--eval-tasks", "0"])
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert log and all(torch.isfinite(torch.tensor(r["loss"])) for r in log)
    assert load_model(run).config.name == conv.config.name

    small = tmp_path / "small"
    _source(tmp_path / "src320")
    convert(tmp_path / "src320", small, agreement=False)
    with pytest.raises(SystemExit, match="has 4096 tokens but the model has a vocabulary of 321"):
        train(["--init-from", str(small), "--tokenizer", str(TINY_TOKENIZER), "--out", str(tmp_path / "run2"),
               "--minutes", "0.02", "--eval-tasks", "0"])


def test_a_tokenizer_whose_mask_id_is_an_ordinary_token_is_refused(tmp_path):
    from clover_engine.backbones.clover.config import CloverConfig
    from clover_engine.tokenizer import byte_tokenizer
    from clover_engine.training.loop import check_tokenizer_fits

    cfg = CloverConfig.from_name("clover-test")  # MASK 257 = <|mask|> of the byte tokenizer
    check_tokenizer_fits(cfg, byte_tokenizer(), Path("tok.json"), tmp_path)
    cfg.mask_token_id = 65  # "A"
    with pytest.raises(SystemExit, match="MASK id 65 is the token 'A'"):
        check_tokenizer_fits(cfg, byte_tokenizer(), Path("tok.json"), tmp_path)
