"""SDAR on Qwen3-MoE layers (SDAR-30B-A3B): block diffusion with a KV cache, and the expert union of every forward.

Wing: ``backbones``. SDAR-30B-A3B (JetAstra, hub ``JetLM/SDAR-30B-A3B-Chat``: 128 experts, top-8) is SDAR's
block diffusion -- blocks aligned to absolute positions, attention full within a block and causal across
blocks, each finished block's K/V committed once (`clover_engine.backbones.block_causal`) -- on Qwen3-MoE
decoder layers. Of the public models it is the closest to the seed's Clover-35B-A3B. Everything but the
feed-forward is the dense SDAR's: the MoE layers (``num_experts`` > 0, ``(i + 1) % decoder_sparse_step
== 0`` and ``i`` not in ``mlp_only_layers``, Qwen3-MoE's rule) get the project's
`clover_engine.backbones.moe.MoEFeedForward` (softmax router, top-k, the k weights renormalised when
``norm_topk_prob``, as transformers' ``Qwen3MoeSparseMoeBlock`` and SDAR's inference engine JetEngine
``jetengine/models/sdar_moe.py`` route), whose weights carry the hub names (``mlp.gate.weight``,
``mlp.experts.{e}.gate_proj.weight``). The others keep the dense SwiGLU of ``intermediate_size``.

Its forwards report the union of the experts their tokens chose (`SDARMoeModel.forward`): a denoising
forward routes only the block's L slots (the history is in the KV cache), a commit forward the committed
tokens; `SDARMoeModel.last_routing` has the per-expert token counts and the router's entropy. The SDAR
sampler's events carry them (`clover_engine.decoding.block_diffusion_decoder`), and the cost model prices
the expert weights by the measured union (`clover_engine.cost.dense`).

Loading is the dense SDAR's lean load, with the MoE layers swapped in on the meta device before the
weights are read (`load_sdar_moe`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clover_engine.backbones.base import BlockOutput, Capabilities
from clover_engine.backbones.block_causal import BlockCausalConfig, BlockCausalModel, BlockCausalState, load_block_causal
from clover_engine.backbones.moe import MoEDims, MoEFeedForward, PerThread, RoutingStats, routing_stats
from clover_engine.backbones.safetensors_shards import save_weights


def moe_layer_flags(data: dict) -> list[bool]:
    """Per layer, True for a MoE feed-forward (Qwen3-MoE's rule, module docstring).

    Raises:
        ValueError: a config without ``num_hidden_layers``, or MoE fields that are not numbers.
    """
    try:
        N, E = int(data["num_hidden_layers"]), int(data.get("num_experts") or 0)
        step = int(data.get("decoder_sparse_step") or 1)
        dense = {int(i) for i in data.get("mlp_only_layers") or []}
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"a Qwen3-MoE config needs num_hidden_layers and numeric num_experts, "
                         f"decoder_sparse_step, mlp_only_layers ({e})") from e
    return [E > 0 and (i + 1) % step == 0 and i not in dense for i in range(N)]


@dataclass
class SDARMoeConfig(BlockCausalConfig, MoEDims):
    """`BlockCausalConfig` plus the MoE dimensions (`clover_engine.backbones.moe.MoEDims`; no shared expert)."""


class SDARMoeModel(BlockCausalModel):
    """An SDAR MoE model (module docstring): `BlockCausalModel` whose forwards report their routing.

    Attributes:
        last_routing: `RoutingStats` of the last forward that routed tokens (all its tokens are the block's
            rows), or None before the first.
    """

    config_cls = SDARMoeConfig
    last_routing = PerThread()  # each thread's own last forward (a served model decodes for several sessions)

    def __init__(self, lm: nn.Module, config: SDARMoeConfig):
        super().__init__(lm, config)
        self.last_routing: RoutingStats | None = None
        for m in self.moe_layers():
            m.record = True

    def moe_layers(self) -> list[MoEFeedForward]:
        """The MoE feed-forwards, in layer order."""
        return [layer.mlp for layer in self.lm.model.layers if isinstance(layer.mlp, MoEFeedForward)]

    @property
    def capabilities(self) -> Capabilities:
        """Block-causal diffusion with the ``expert_union`` observable."""
        return super().capabilities.replace(observables=frozenset({"expert_union"}))

    def _run(self, state: BlockCausalState, ids, mask: torch.Tensor, keep: bool,
             rows: torch.Tensor | int | None = None) -> torch.Tensor:
        logits = super()._run(state, ids, mask, keep, rows)
        n = torch.as_tensor(ids).numel()  # every token of the forward routed, whatever rows were kept
        self.last_routing = routing_stats([m.last for m in self.moe_layers()], slice(0, n))
        return logits

    def forward(self, block_ids: torch.Tensor, state: BlockCausalState, commit_ids: torch.Tensor | None = None,
                block_size: int | None = None, observe: bool = False) -> BlockOutput:
        """`BlockCausalModel.forward`, with ``expert_union`` [N MoE layers] int64: the distinct experts the
        block's slots chose in the denoising forward (the commit forward's routing is not reported here)."""
        out = super().forward(block_ids, state, commit_ids, block_size, observe)
        return BlockOutput(logits=out.logits, expert_union=self.last_routing.union)


def _swap_in_moe(lm: nn.Module, data: dict) -> dict[str, Any]:
    """Replace the MoE layers' dense MLPs of the meta-device Qwen3 LM by `MoEFeedForward`; the config fields."""
    flags = moe_layer_flags(data)
    H, E, k = int(data["hidden_size"]), int(data["num_experts"]), int(data["num_experts_per_tok"])
    I_ = int(data["moe_intermediate_size"])
    dtype = lm.get_input_embeddings().weight.dtype
    for layer, moe in zip(lm.model.layers, flags):
        if moe:
            layer.mlp = MoEFeedForward(H, I_, E, k, norm_topk_prob=bool(data.get("norm_topk_prob", False))).to(dtype)
    return dict(num_experts=E, num_experts_per_tok=k, moe_intermediate_size=I_, shared_expert_intermediate_size=0,
                moe_layer_flags=[int(f) for f in flags])


def load_sdar_moe(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> SDARMoeModel:
    """Load an SDAR MoE checkpoint directory (``model_type`` ``sdar_moe``, hub layout) as an `SDARMoeModel`, leanly.

    Arguments, return and errors as `clover_engine.backbones.block_causal.load_block_causal`'s, plus a
    ValueError for a config without ``num_experts`` / ``num_experts_per_tok`` / ``moe_intermediate_size``.
    """
    directory = Path(path)
    directory = directory.parent if directory.is_file() else directory
    config_path = directory / "config.json"
    if config_path.is_file():
        data = json.loads(config_path.read_text(encoding="utf-8"))
        missing = [k for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size") if not data.get(k)]
        if missing:
            raise ValueError(f"{config_path}: an SDAR MoE config needs {', '.join(missing)} (Qwen3-MoE's fields)")
    return load_block_causal(directory, device, dtype, prepare=_swap_in_moe, model_cls=SDARMoeModel)


def write_tiny_sdar_moe(directory: str | Path, seed: int = 0, sharpen: float = 100.0, block_size: int = 8,
                        **changes: Any) -> Path:
    """Write a tiny random SDAR MoE checkpoint in the hub layout (``model_type`` ``sdar_moe``), tokenizer and
    chat template included: the tiny SDAR of `clover_engine.backbones.block_causal.write_tiny_block_causal`
    with 8 experts of 32, top-2 (``changes`` override the MoE fields and any other), every tensor drawn
    from a generator seeded with ``seed`` (router wide, output layer times ``sharpen``)."""
    from clover_engine.backbones.block_causal import write_tiny_block_causal  # local: the dense writer
    from clover_engine.backbones.llada_moe import fill_random  # local: the shared random fill

    out = write_tiny_block_causal(directory, "sdar", seed=seed, sharpen=sharpen, block_size=block_size)
    data = json.loads((out / "config.json").read_text())
    data.update(dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1,
                     mlp_only_layers=[], norm_topk_prob=True), **changes)
    lm = build_tiny(data)
    fill_random(lm, 3000 + seed, sharpen)
    return save_sdar_moe(lm, out, data)


def build_tiny(data: dict) -> nn.Module:
    """A Qwen3 LM of ``data``'s dimensions (fp32, on the CPU) with its MoE layers swapped in."""
    from clover_engine.backbones.block_causal import FAMILIES, _hf_config  # local: the family's config mapping
    import transformers  # local: transformers is heavy

    lm = transformers.Qwen3ForCausalLM(_hf_config(data, FAMILIES["sdar_moe"])).eval()
    _swap_in_moe(lm, data)
    return lm


def save_sdar_moe(lm: nn.Module, path: str | Path, data: dict, mask_token_id: int | None = None) -> Path:
    """Write ``lm`` (from `build_tiny` / a loaded model's ``lm``) as an SDAR MoE hub checkpoint: its weights
    under the hub names and ``data`` (the ``config.json`` fields, MoE fields included) as ``config.json`` with
    ``model_type`` ``sdar_moe``; ``mask_token_id`` is written when given (the hub config names none: the
    tokenizer's ``<MASK>`` is found instead)."""

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in lm.state_dict().items()}
    if data.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_weights(state, out / "model.safetensors")
    from clover_engine.backbones.block_causal import FAMILIES  # local: the family's hub fields

    family = FAMILIES["sdar_moe"]
    data = dict(dict(family.hub_fields), **data)
    data.update(model_type=family.model_type, architectures=list(family.architectures))
    if mask_token_id is not None:
        data["mask_token_id"] = int(mask_token_id)
    (out / "config.json").write_text(json.dumps(data, indent=2, default=str))
    return out


__all__ = ["SDARMoeConfig", "SDARMoeModel", "build_tiny", "load_sdar_moe", "moe_layer_flags", "save_sdar_moe",
           "write_tiny_sdar_moe"]
