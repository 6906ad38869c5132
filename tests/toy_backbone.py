"""A toy backbone in one file: what a new model family has to write (and nothing else).

A tiny bidirectional transformer that recomputes ``[history ++ block]`` every forward (the
``recompute`` cost family), over the byte tokenizer. It implements `clover_engine.backbones.base.Backbone`,
declares its `Capabilities`, and opens from a directory through one registry row
(``register(MODEL_TYPE, "toy_backbone:load_toy")``). `tests/clover_engine/test_toy_backbone.py` drives it
through the decoder, traces, the cost meter and both front ends with no edit anywhere else.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from clover_engine.backbones.base import BlockOutput, Capabilities

MODEL_TYPE = "toy-recompute"


@dataclass
class ToyConfig:
    """The fields the decoder and the dense cost formulas read (byte-tokenizer ids)."""

    name: str = "toy"
    vocab_size: int = 320
    mask_token_id: int = 1
    eos_token_id: int = 3
    max_position_embeddings: int = 1024
    hidden_size: int = 32
    intermediate_size: int = 64
    num_hidden_layers: int = 1
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    head_dim: int = 16
    tie_word_embeddings: bool = False
    num_parameters: int = 0
    model_type: str = MODEL_TYPE

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class ToyState:
    committed: list[int] = field(default_factory=list)
    memory_mode: str = "state"
    window: int = 0


class ToyBackbone(nn.Module):
    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layer = nn.TransformerEncoderLayer(config.hidden_size, config.num_attention_heads,
                                                config.intermediate_size, dropout=0.0, batch_first=True)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        config.num_parameters = sum(p.numel() for p in self.parameters())

    capabilities = Capabilities(family="toy", memory_modes=("state",), cost_family="recompute")

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def setup_state(self, batch_size: int = 1, memory_mode: str = "state") -> ToyState:
        if batch_size != 1 or memory_mode != "state":
            raise ValueError("the toy backbone decodes one sequence in memory_mode 'state'")
        return ToyState()

    def forward(self, block_ids, state, commit_ids=None, block_size=None, observe=False) -> BlockOutput:
        if commit_ids is not None:
            state.committed += commit_ids[0].tolist()
        hist = torch.tensor([state.committed], dtype=torch.long, device=self.device)
        x = self.layer(self.embed(torch.cat([hist, block_ids], dim=1)))
        logits = self.head(x[:, hist.shape[1]:]).float()
        return BlockOutput(logits=logits, expert_union=torch.zeros(0, dtype=torch.long))


def save_toy(directory: Path, seed: int = 0) -> Path:
    """A random toy checkpoint directory (config.json, model.safetensors, the byte tokenizer)."""
    from clover_engine.tokenizer import byte_tokenizer

    torch.manual_seed(seed)
    model = ToyBackbone(ToyConfig(name=Path(directory).name))
    with torch.no_grad():
        model.head.weight.mul_(40.0)  # peaked predictions: a decode accepts as well as forces
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(model.config.to_dict()))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    byte_tokenizer().save(str(directory / "tokenizer.json"))
    return directory


def load_toy(directory, device="cpu", dtype=None) -> ToyBackbone:
    """The registry row's loader."""
    data = json.loads((Path(directory) / "config.json").read_text())
    model = ToyBackbone(ToyConfig(**data))
    model.load_state_dict(load_file(str(Path(directory) / "model.safetensors")))
    model.model_id = Path(directory).name
    return model.to(device=device, dtype=dtype).eval()
