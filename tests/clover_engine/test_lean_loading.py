"""Lean loading of Dream / LLaDA checkpoints (clover_engine.backbones.safetensors_shards).

Tiny random Qwen2 (Dream) and Llama (LLaDA) models are written by `save_masked_diffusion` and split
into several shards, with and without the hub's ``model.safetensors.index.json``. Loaded through
``load_model`` (meta-device build, shard by shard, straight to dtype), they give exactly the logits
of the previous path (a normally built fp32 model, all weights loaded at once), with the same rotary
buffers and no tensor left on meta; a bf16 checkpoint stays bf16 (logits fp32); truncated shards,
missing tensors and absent shards raise a clear ``ValueError``.

Run: ``.venv/bin/python -m pytest -q tests/clover_engine/test_lean_loading.py``
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

from clover_engine.backbones.masked_diffusion import (  # noqa: E402
    LLADA_KEYS, _dream_config, _llada_config, _rename, load_masked_diffusion, save_masked_diffusion,
)
from clover_engine.backbones.safetensors_shards import meta_tensors, read_header, shard_files  # noqa: E402
from clover_engine.checkpoint import load_model  # noqa: E402
from tests.helpers import split_into_shards  # noqa: E402

V, MASK = 128, 126
IDS = [5, 9, 33, 17, 60, 4, 8, 21, 70, 11, 40, MASK, 41, MASK]


def _tiny(kind: str, tie: bool = False):
    torch.manual_seed(5 if kind == "qwen2" else 6)
    common = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=1,
                  initializer_range=0.2, tie_word_embeddings=tie)
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()


def _write(tmp_path, family: str, shards: int = 3, index: bool = True, tie: bool = False, dtype=None):
    src = _tiny("qwen2" if family == "dream" else "llama", tie=tie)
    if dtype is not None:
        src = src.to(dtype)
    d = tmp_path / f"{family}-{shards}-{index}-{tie}"
    save_masked_diffusion(src, d, family, MASK)
    if dtype is not None:  # the hub's config says what the weights are stored in
        cfg = json.loads((d / "config.json").read_text())
        cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
        (d / "config.json").write_text(json.dumps(cfg))
    if shards > 1:
        split_into_shards(d, shards, index)
    return src, d


def _previous_path(d):
    """The loader before lean loading: a normally built fp32 model, every shard in one dict, one strict load."""
    data = json.loads((d / "config.json").read_text())
    family = data["model_type"].lower()
    hf_cfg = _dream_config(data) if family == "dream" else _llada_config(data, d)
    weights = {}
    for f in sorted(d.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    if family == "llada":
        weights = _rename(weights, LLADA_KEYS)
    lm = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
    lm.load_state_dict(weights, strict=not hf_cfg.tie_word_embeddings)
    if hf_cfg.tie_word_embeddings:
        lm.tie_weights()
    return lm.eval()


def _logits(lm, ids=IDS) -> torch.Tensor:
    T = len(ids)
    with torch.no_grad():
        return lm(input_ids=torch.tensor([ids]), attention_mask=torch.zeros(1, 1, T, T, dtype=lm.dtype),
                  position_ids=torch.arange(T)[None], use_cache=False).logits[0].float()


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("family", ["dream", "llada"])
@pytest.mark.parametrize("index", [True, False])
def test_sharded_checkpoint_loads_to_the_previous_paths_logits(tmp_path, family, index):
    src, d = _write(tmp_path, family, shards=3, index=index)
    assert len(shard_files(d)) == 3 and (d / "model.safetensors.index.json").exists() is index
    model = load_model(d)
    assert meta_tensors(model) == []
    ref = _previous_path(d)
    assert model.lm.dtype == torch.float32  # an fp32 checkpoint stays fp32
    assert torch.equal(_logits(model.lm), _logits(ref))
    torch.testing.assert_close(_logits(model.lm), _logits(src), rtol=0, atol=0)
    # rotary buffers (not in the checkpoint) recomputed exactly as a normal build has them
    ours, theirs = dict(model.lm.named_buffers()), dict(ref.named_buffers())
    assert ours.keys() == theirs.keys() and ours
    for k in ours:
        assert ours[k].device.type == "cpu" and ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]), k
    # the engine's forward gives the same fp32 logits through the model wrapper
    state = model.setup_state(1, "state")
    out = model(torch.tensor([IDS[10:]]), state, commit_ids=torch.tensor([IDS[:10]]), block_size=4)
    assert out.logits.dtype == torch.float32


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_bf16_checkpoint_loads_as_bf16_with_fp32_logits(tmp_path, family):
    src, d = _write(tmp_path, family, shards=2, dtype=torch.bfloat16)
    assert {t.dtype for s in shard_files(d) for t in read_header(s).tensors} == {torch.bfloat16}
    model = load_model(d)
    assert meta_tensors(model) == []
    assert {p.dtype for p in model.lm.parameters()} == {torch.bfloat16}
    assert model.lm.model.rotary_emb.inv_freq.dtype == torch.float32  # as a normal bf16 build keeps it
    state = model.setup_state(1, "state")
    out = model(torch.tensor([IDS[10:]]), state, commit_ids=torch.tensor([IDS[:10]]), block_size=4)
    assert out.logits.dtype == torch.float32 and torch.isfinite(out.logits).all()
    for (name, p), q in zip(model.lm.named_parameters(), src.parameters()):
        assert torch.equal(p, q), name
    # the caller's dtype wins: fp32 on request, values exactly the bf16 ones upcast
    up = load_model(d, dtype="float32")
    assert {p.dtype for p in up.lm.parameters()} == {torch.float32}
    assert torch.equal(up.lm.model.embed_tokens.weight, src.model.embed_tokens.weight.float())


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_tied_embeddings_load_tied(tmp_path, family):
    src, d = _write(tmp_path, family, shards=2, tie=True)
    model = load_masked_diffusion(d)
    assert meta_tensors(model) == []
    assert model.lm.lm_head.weight is model.lm.model.embed_tokens.weight
    assert torch.equal(_logits(model.lm), _logits(src))


def test_truncated_shard_names_the_file(tmp_path):
    _, d = _write(tmp_path, "llada", shards=3)
    victim = d / "model-00002-of-00003.safetensors"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match=r"model-00002-of-00003\.safetensors.*truncated or corrupt"):
        load_model(d)
    victim.write_bytes(data[:5])  # not even the header length
    with pytest.raises(ValueError, match=r"model-00002-of-00003\.safetensors.*truncated or corrupt"):
        load_model(d)


def test_missing_tensor_gives_the_clear_error(tmp_path):
    _, d = _write(tmp_path, "dream", shards=2, index=False)
    f = d / "model-00001-of-00002.safetensors"
    weights = load_file(str(f))
    gone = sorted(weights)[0]
    weights.pop(gone)
    weights["model.extra.weight"] = torch.zeros(2)
    save_file(weights, str(f))
    with pytest.raises(ValueError, match=r"do not match a dream model of this config: missing \[.*"
                                         + gone.replace(".", r"\.") + r".*unexpected \['model\.extra\.weight'\]"):
        load_model(d)


def test_index_naming_an_absent_shard_and_duplicates(tmp_path):
    _, d = _write(tmp_path, "dream", shards=3)
    (d / "model-00003-of-00003.safetensors").rename(d / "elsewhere.bin")
    with pytest.raises(ValueError, match=r"names shard\(s\) the directory lacks: model-00003-of-00003"):
        load_model(d)
    (d / "elsewhere.bin").rename(d / "model-00003-of-00003.safetensors")
    (d / "model.safetensors.index.json").unlink()
    save_file(load_file(str(d / "model-00001-of-00003.safetensors")), str(d / "copy.safetensors"))
    with pytest.raises(ValueError, match=r"is stored in both copy\.safetensors and model-00001"):
        load_model(d)


def test_wrong_shape_is_refused(tmp_path):
    _, d = _write(tmp_path, "llada", shards=1)
    data = json.loads((d / "config.json").read_text())
    data["mlp_hidden_size"] = 96
    (d / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"model\.transformer\.blocks\.\d\.(ff_proj|up_proj|ff_out)\.weight'? has shape"):
        load_model(d)
