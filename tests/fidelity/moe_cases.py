"""The fidelity cases of LLaDA-MoE and the tiny checkpoints they run on, shared by
``tests/fidelity/make_moe_expected.py`` (which runs the official code on them and writes
``tests/data/moe_fidelity.json``) and ``tests/clover_engine/test_moe_fidelity.py`` (which decodes them with
the project's `clover_engine.backbones.llada_moe` and LLaDA's sampler as
`clover_engine.decoding.masked_diffusion_decoder.MaskedDiffusionDecoder` runs it).

A checkpoint is a tiny random LLaDA-MoE (`clover_engine.backbones.llada_moe.tiny_config`: 2 layers,
hidden 64, RoPE on half of each head) whose every tensor is drawn from a ``torch.Generator`` seeded with
the seed (`clover_engine.backbones.llada_moe.fill_random`: the router drawn wide so that tokens disagree
on their experts, the output layer sharpened by `SHARPEN`), written in the hub layout by the project's
`clover_engine.backbones.llada_moe.save_llada_moe`. Each seed has its own variant of the architecture, so
that every option of the hub config is exercised:

* seed 0: 8 experts, top-2, a shared expert, qk-norm;
* seed 1: 16 experts, top-4, the router's expert bias, a dense first layer (``moe_layer_freq`` [0, 1]);
* seed 2: 8 experts, top-3, no shared expert, no qk-norm, RoPE on the whole head.

SDAR MoE (SDAR-30B-A3B's layout, `clover_engine.backbones.sdar_moe`): the tiny SDAR of
``block_diffusion_cases.py`` (2 layers, hidden 64) with Qwen3-MoE feed-forwards, written by
`clover_engine.backbones.sdar_moe.save_sdar_moe`, one variant per seed (`SDAR_VARIANTS`): 8 experts top-2
with the k weights renormalised; 16 experts top-4 with a dense first layer (``mlp_only_layers`` [0]); 8
experts top-3 without renormalisation. Its cases run SDAR's ``block_diffusion_generate`` greedily (``top_k``
1) with each remasking strategy.
"""

from __future__ import annotations

from pathlib import Path

import torch

try:  # imported from the tests (package ``fidelity``) or by the make script from this folder
    from .block_diffusion_cases import TINY as SDAR_TINY
except ImportError:
    from block_diffusion_cases import TINY as SDAR_TINY

SEEDS = (0, 1, 2)
VOCAB, MASK_ID, EOS_ID = 1000, 999, 2
SHARPEN = 12.0
VARIANTS = {
    0: dict(num_experts=8, num_experts_per_tok=2),
    1: dict(num_experts=16, num_experts_per_tok=4, moe_router_enable_expert_bias=True, moe_layer_freq=[0, 1]),
    2: dict(num_experts=8, num_experts_per_tok=3, shared_expert_intermediate_size=None, qk_layernorm=False,
            partial_rotary_factor=1.0),
}
"""seed -> the `tiny_config` fields that differ from the defaults."""


def config_of(seed: int) -> dict:
    """The hub ``config.json`` of the seed's checkpoint."""
    from clover_engine.backbones.llada_moe import tiny_config  # local: keeps this module import-light

    v = dict(VARIANTS[seed])
    return tiny_config(VOCAB, v.pop("num_experts"), v.pop("num_experts_per_tok"), eos_token_id=EOS_ID,
                       mask_token_id=MASK_ID, **v)


def build_checkpoint(seed: int, directory: Path) -> Path:
    """Write the tiny LLaDA-MoE checkpoint of ``seed`` into ``directory``; returns it."""
    from clover_engine.backbones.llada_moe import LLaDAMoEArch, LLaDAMoELM, fill_random, save_llada_moe  # local

    data = config_of(seed)
    lm = LLaDAMoELM(LLaDAMoEArch.from_config(data))
    fill_random(lm, 2000 + seed, SHARPEN)
    return save_llada_moe(lm.eval(), directory, data)


SDAR_VARIANTS = {
    0: dict(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True),
    1: dict(num_experts=16, num_experts_per_tok=4, norm_topk_prob=True, mlp_only_layers=[0]),
    2: dict(num_experts=8, num_experts_per_tok=3, norm_topk_prob=False),
}
"""seed -> the SDAR MoE checkpoint's MoE fields."""


def sdar_config_of(seed: int) -> dict:
    """The hub ``config.json`` fields of the seed's SDAR MoE checkpoint (before `save_sdar_moe` adds its names)."""
    return dict(SDAR_TINY, **dict(dict(moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[]),
                                  **SDAR_VARIANTS[seed]))


def build_sdar_checkpoint(seed: int, directory: Path) -> Path:
    """Write the tiny SDAR MoE checkpoint of ``seed`` into ``directory`` (MASK id in its config); returns it."""
    from clover_engine.backbones.llada_moe import fill_random  # local: keeps this module import-light
    from clover_engine.backbones.sdar_moe import build_tiny, save_sdar_moe  # local

    data = sdar_config_of(seed)
    lm = build_tiny(data)
    fill_random(lm, 4000 + seed, SHARPEN)
    return save_sdar_moe(lm, directory, dict(data, bd_size=8), MASK_ID)


def prompt_for(seed: int, length: int) -> list[int]:
    """A prompt of ``length`` ids in [3, MASK_ID) (no special id, no MASK), drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed * 100 + length + 7)
    return torch.randint(3, MASK_ID, (length,), generator=g).tolist()


def cases() -> list[dict]:
    """Every case: ``id``, ``family`` (``lladamoe`` / ``sdar_moe``), ``seed``, ``prompt`` and ``sampler``: LLaDA's
    ``generate`` keyword arguments (`clover_engine.decoding.masked_diffusion_samplers.LLaDASampler`'s; greedy:
    temperature 0, low-confidence remasking, as LLaDA-MoE's model card runs it) or SDAR's
    ``block_diffusion_generate``'s (`clover_engine.decoding.block_diffusion_samplers.SDARSampler`'s; greedy: top_k 1)."""
    out = []
    gen = 32
    for seed in SEEDS:
        for plen in (8, 13):  # a multiple of the block lengths, and not
            prompt = prompt_for(seed, plen)
            for block_length in (8, 16, 32):
                for steps in (gen, gen // 2):
                    out.append(dict(family="lladamoe", seed=seed, prompt=prompt, sampler=dict(
                        gen_length=gen, block_length=block_length, steps=steps, remasking="low_confidence")))
        for plen in (16, 13):  # SDAR MoE: on a block boundary, and not
            prompt = prompt_for(seed, plen)
            for block in (4, 8):
                for strategy, threshold in (("low_confidence_dynamic", 0.85), ("low_confidence_dynamic", 0.5),
                                            ("low_confidence_static", 0.85), ("sequential", 0.85)):
                    out.append(dict(family="sdar_moe", seed=seed, prompt=prompt, sampler=dict(
                        gen_length=gen, block_length=block, denoising_steps=block if strategy != "sequential" else block // 2,
                        remasking_strategy=strategy, confidence_threshold=threshold, top_k=1, stop_token_ids=[EOS_ID],
                        seed=seed)))
    for c in out:
        c["id"] = f"{c['family']}-seed{c['seed']}-P{len(c['prompt'])}-" + "-".join(
            f"{k}={v}" for k, v in c["sampler"].items() if k != "stop_token_ids")
    return out
