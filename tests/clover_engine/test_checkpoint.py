"""Checkpoint save/load: exact round trips and clear refusals of damaged directories.

Run: .venv/bin/python -m pytest tests/clover_engine/test_checkpoint.py -q

Every case runs on two models: a small stand-in module (tied weights, int and
non-persistent buffers) loaded with `load_weights`, and the real
`CloverModel` of the ``clover-test`` preset loaded with `load_model` (skipped
only while ``clover_engine/backbones/clover/model.py`` does not exist).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from clover_engine.backbones.clover.weights import INDEX_NAME, WEIGHTS_NAME
from clover_engine.checkpoint import (
    load_model,
    load_tokenizer,
    load_weights,
    main,
    save_model,
)
from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.tokenizer import byte_tokenizer



class StandIn(nn.Module):
    """Tiny module with what checkpoints must cope with: tied weights and buffers of each kind."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.config = CloverConfig.from_name("clover-test")
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 6)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("scale", torch.rand(3, generator=g))
        self.register_buffer("counts", torch.randint(0, 100, (5,), generator=g))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))


def _clover(seed: int) -> nn.Module:
    from clover_engine.backbones.clover.model import CloverModel

    torch.manual_seed(seed)
    return CloverModel(CloverConfig.from_name("clover-test"))


@pytest.fixture(params=["standin", "clover"])
def kind(request) -> str:
    return request.param


def _make(kind: str, seed: int = 0) -> nn.Module:
    return StandIn(seed) if kind == "standin" else _clover(seed)


def _load(kind: str, directory: Path) -> nn.Module:
    """Load into a model whose own init differs (seed 1), so a no-op load would show."""
    if kind == "standin":
        return load_weights(StandIn(seed=1), directory)
    return load_model(directory)


def _assert_same(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert sa[name].dtype == sb[name].dtype, name
        assert torch.equal(sa[name], sb[name]), name


def _total_bytes(model: nn.Module) -> int:
    return sum(t.nbytes for t in model.state_dict().values())


def _shards(directory: Path) -> list[Path]:
    return sorted(directory.glob("model-*-of-*.safetensors"))


# ------------------------------------------------------------------ round trips
def test_round_trip_single_file(kind, tmp_path):
    model = _make(kind)
    save_model(model, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / WEIGHTS_NAME).is_file()
    assert not (tmp_path / "ckpt" / INDEX_NAME).exists()
    assert CloverConfig.from_json(tmp_path / "ckpt" / "config.json") == model.config
    loaded = _load(kind, tmp_path / "ckpt")
    _assert_same(model, loaded)
    if kind == "clover":
        assert not loaded.training
        assert loaded.model_id == "ckpt"


def test_round_trip_sharded(kind, tmp_path):
    model = _make(kind)
    total = _total_bytes(model)
    save_model(model, tmp_path, max_shard_bytes=total // 3)
    shards = _shards(tmp_path)
    assert len(shards) >= 3
    assert shards[0].name == f"model-00001-of-{len(shards):05d}.safetensors"
    assert not (tmp_path / WEIGHTS_NAME).exists()
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    assert index["metadata"]["total_size"] == total
    _assert_same(model, _load(kind, tmp_path))


def test_resave_replaces_stale_weight_files(kind, tmp_path):
    model = _make(kind)
    save_model(model, tmp_path, max_shard_bytes=_total_bytes(model) // 2)
    assert _shards(tmp_path)
    save_model(model, tmp_path)
    assert not _shards(tmp_path) and not (tmp_path / INDEX_NAME).exists()
    _assert_same(model, _load(kind, tmp_path))


def test_tied_weights_saved_once_each_and_stay_tied(tmp_path):
    model = StandIn()
    save_model(model, tmp_path)
    assert set(load_file(tmp_path / WEIGHTS_NAME)) == {
        "embed.weight", "proj.weight", "proj.bias", "head.weight", "scale", "counts"
    }
    loaded = load_weights(StandIn(seed=1), tmp_path)
    assert loaded.head.weight is loaded.embed.weight
    assert torch.equal(loaded.embed.weight, model.embed.weight)


def test_tokenizer_round_trip(tmp_path):
    tok = byte_tokenizer()
    save_model(StandIn(), tmp_path, tokenizer=tok)
    loaded = load_tokenizer(tmp_path)
    assert loaded.encode("héllo <|mask|>").ids == tok.encode("héllo <|mask|>").ids
    with pytest.raises(ValueError, match="no tokenizer"):
        load_tokenizer(tmp_path / "elsewhere")


def test_load_model_dtype(tmp_path):
    save_model(_clover(0), tmp_path)
    model = load_model(tmp_path / "config.json", dtype="bfloat16")  # a file inside the dir works
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    with pytest.raises(ValueError, match="floating torch dtype"):
        load_model(tmp_path, dtype="int8")


def test_cli_init_writes_a_loadable_checkpoint(tmp_path, capsys):
    assert main(["--init", "clover-test", "--out", str(tmp_path / "m"), "--seed", "3"]) == 0
    assert "saved random clover-test" in capsys.readouterr().out
    model = load_model(tmp_path / "m")
    tok = load_tokenizer(tmp_path / "m")
    assert tok.token_to_id("<|mask|>") == model.config.mask_token_id
    _assert_same(_clover(3), model)


# ------------------------------------------------------------------ refusals
def test_missing_directory_config_and_weights(kind, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        _load(kind, tmp_path / "nope")
    with pytest.raises(ValueError, match="no config.json"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(CloverConfig.from_name("clover-test").to_json())
    with pytest.raises(ValueError, match="has no weights.*model.safetensors"):
        _load(kind, tmp_path)


def test_truncated_file(kind, tmp_path):
    save_model(_make(kind), tmp_path)
    path = tmp_path / WEIGHTS_NAME
    path.write_bytes(path.read_bytes()[:-13])
    with pytest.raises(ValueError, match=rf"{WEIGHTS_NAME} is truncated"):
        _load(kind, tmp_path)


@pytest.mark.parametrize("where", ["length_field", "json"])
def test_corrupt_header(kind, tmp_path, where):
    save_model(_make(kind), tmp_path)
    path = tmp_path / WEIGHTS_NAME
    data = bytearray(path.read_bytes())
    offset = 0 if where == "length_field" else 8  # 8 = the JSON's opening brace
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=WEIGHTS_NAME):
        _load(kind, tmp_path)


def test_overwritten_values_are_refused(tmp_path):
    """Bytes overwritten in place (size and header intact) that make weights NaN are refused by
    name before anything is copied, in the last shard too."""
    save_model(StandIn(seed=0), tmp_path, max_shard_bytes=64)
    last = _shards(tmp_path)[-1]
    data = bytearray(last.read_bytes())
    data[-4:] = b"\xff\xff\xff\xff"  # the last fp32 value: a NaN
    last.write_bytes(bytes(data))
    target = StandIn(seed=1)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ValueError, match=rf"in {last.name} holds NaN or infinite values"):
        load_weights(target, tmp_path)
    for name, t in target.state_dict().items():
        assert torch.equal(t, before[name]), name


def test_missing_tensor(kind, tmp_path):
    save_model(_make(kind), tmp_path)
    path = tmp_path / WEIGHTS_NAME
    tensors = load_file(path)
    victim = sorted(tensors)[1]
    del tensors[victim]
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"missing 1 tensor.*'{victim}'"):
        _load(kind, tmp_path)


def test_unexpected_tensor(kind, tmp_path):
    save_model(_make(kind), tmp_path)
    path = tmp_path / WEIGHTS_NAME
    tensors = load_file(path)
    tensors["extra.weight"] = torch.zeros(2)
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"does not have: 'extra.weight'"):
        _load(kind, tmp_path)


def test_shape_mismatch(kind, tmp_path):
    model = _make(kind)
    save_model(model, tmp_path)
    path = tmp_path / WEIGHTS_NAME
    tensors = load_file(path)
    victim = next(n for n, t in tensors.items() if t.dim() == 2)
    rows, cols = tensors[victim].shape
    tensors[victim] = torch.zeros(rows, cols + 1)
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"'{victim}'.*shape \[{rows}, {cols + 1}\].*expects \[{rows}, {cols}\]"):
        _load(kind, tmp_path)


def test_missing_shard(kind, tmp_path):
    model = _make(kind)
    save_model(model, tmp_path, max_shard_bytes=_total_bytes(model) // 3)
    victim = _shards(tmp_path)[1]
    victim.unlink()
    with pytest.raises(ValueError, match=rf"shard {victim.name} listed in .* is missing"):
        _load(kind, tmp_path)


def test_single_file_and_index_together_is_ambiguous(tmp_path):
    model = StandIn()
    save_model(model, tmp_path, max_shard_bytes=64)
    save_file(load_file(_shards(tmp_path)[0]), tmp_path / WEIGHTS_NAME)
    with pytest.raises(ValueError, match="both model.safetensors and model.safetensors.index.json"):
        load_weights(StandIn(), tmp_path)


def test_refused_load_leaves_model_untouched(tmp_path):
    save_model(StandIn(seed=0), tmp_path, max_shard_bytes=64)
    last = _shards(tmp_path)[-1]
    last.write_bytes(last.read_bytes()[:-1])
    target = StandIn(seed=1)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ValueError, match=last.name):
        load_weights(target, tmp_path)
    for name, t in target.state_dict().items():
        assert torch.equal(t, before[name]), name


def test_cli_refuses_a_full_size_random_model(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--init", "clover-35b-a3b", "--out", str(tmp_path)])
    assert "GiB of float32 weights" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_checkpoint_with_renamed_parameter_loads_under_the_new_name(tmp_path):
    """A checkpoint written before GDN's ``mem_b`` became ``mem_logit_bias`` still loads, exactly."""
    src = _clover(0)
    save_model(src, tmp_path)
    path = tmp_path / WEIGHTS_NAME
    tensors = load_file(path)
    renamed = [n for n in tensors if n.endswith(".mem_logit_bias")]
    assert renamed, "the Clover test preset has GDN layers with a memory-unit logit bias"
    old = {(n[: -len("mem_logit_bias")] + "mem_b" if n in renamed else n): t for n, t in tensors.items()}
    assert any(n.endswith(".mem_b.weight") for n in old)  # attention's beta projection keeps its name
    save_file(old, path)
    dst = load_weights(_clover(1), tmp_path)
    for (name, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert torch.equal(a, b), name


def _pre_hf_layout(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A current state dict as checkpoints stored it before the weights took transformers'
    Qwen3.5-MoE names: top-level embed_tokens/layers/norm, experts and shared expert on the MoE
    itself (shared gate and up fused), GDN ``mem_b``."""
    old = {}
    for name, t in tensors.items():
        n = name.removeprefix("model.")
        n = n.replace(".mlp.experts.", ".mlp.").replace(".shared_expert.down_proj.", ".shared_down.")
        n = n[: -len("mem_logit_bias")] + "mem_b" if n.endswith(".mem_logit_bias") else n
        if n.endswith(".shared_expert.up_proj.weight"):
            continue
        if n.endswith(".shared_expert.gate_proj.weight"):
            t = torch.cat([t, tensors[name.replace("gate_proj", "up_proj")]])
            n = n.replace(".shared_expert.gate_proj.", ".shared_gate_up.")
        old[n] = t
    return old


def test_every_current_name_maps_to_itself():
    from clover_engine.backbones.clover.weights import current_names

    for name in _clover(0).state_dict():
        assert current_names(name) == [(name, 0, 1)], name


def test_checkpoint_in_the_pre_hf_layout_loads_exactly(tmp_path):
    """Old project names (the shipped clover-tiny's) load through LEGACY_KEYS; the fused shared
    [gate; up] projection is split into gate_proj and up_proj."""
    src = _clover(0)
    save_model(src, tmp_path)
    path = tmp_path / WEIGHTS_NAME
    old = _pre_hf_layout(load_file(path))
    assert "embed_tokens.weight" in old and any(n.endswith(".mlp.shared_gate_up.weight") for n in old)
    save_file(old, path)
    dst = load_model(tmp_path)
    for (name, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert torch.equal(a, b), name


def test_the_shipped_model_is_stored_under_the_old_names():
    """models/clover-tiny is never rewritten: it keeps exercising the legacy key map."""
    from safetensors import safe_open

    shipped = Path(__file__).resolve().parents[2] / "models" / "clover-tiny" / WEIGHTS_NAME
    with safe_open(str(shipped), framework="pt") as f:
        names = set(f.keys())
    assert "embed_tokens.weight" in names and "layers.0.mlp.shared_gate_up.weight" in names


def test_a_legacy_fused_tensor_of_odd_length_is_refused(tmp_path):
    src = _clover(0)
    save_model(src, tmp_path)
    path = tmp_path / WEIGHTS_NAME
    old = _pre_hf_layout(load_file(path))
    name = next(n for n in old if n.endswith(".shared_gate_up.weight"))
    old[name] = old[name][:-1]
    save_file(old, path)
    with pytest.raises(ValueError, match="equal parts"):
        load_model(tmp_path)


@pytest.mark.parametrize("model_type", ["qwen3_5_moe", "qwen3_5_moe_text"])
def test_a_raw_qwen3_5_moe_directory_is_refused_with_the_convert_command(tmp_path, model_type):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(ValueError, match=rf"python -m clover_engine.convert --from qwen3_5_moe {tmp_path} --out"):
        load_model(tmp_path)


def test_an_unknown_model_type_is_refused_listing_the_supported_formats(tmp_path):
    from clover_engine.checkpoint import model_format, supported_formats

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type='gpt2'") as e:
        load_model(tmp_path)
    for fmt in ("clover", "hf-block-diffusion", "llama", "qwen3", "qwen3_5_moe"):
        assert repr(fmt) in str(e.value)
    assert {"clover", "hf-block-diffusion", "llama", "qwen2", "qwen3"} <= set(supported_formats())
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))  # older saves had no model_type
    assert model_format(tmp_path) == "clover"


def test_path_errors_name_what_was_typed(tmp_path):
    """A mistyped directory lists its siblings; a file that is not inside a checkpoint is named as a file."""
    (tmp_path / "models" / "clover-tiny").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"models/clovr-tiny does not exist \(.*holds: clover-tiny\)"):
        load_model(tmp_path / "models" / "clovr-tiny")
    f = tmp_path / "notes.txt"
    f.write_text("x")
    with pytest.raises(ValueError, match="notes.txt' is a file; pass the model's directory"):
        load_model(f)
