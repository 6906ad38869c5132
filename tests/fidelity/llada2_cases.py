"""The fidelity cases of LLaDA2.0 and the tiny checkpoints they run on, shared by
``tests/fidelity/make_llada2_expected.py`` (which runs the official code on them and writes
``tests/data/llada2_fidelity.json``) and ``tests/clover_engine/test_llada2_fidelity.py`` (which decodes them with
the project's `clover_engine.backbones.llada2_moe` and `clover_engine.decoding.llada2_samplers.LLaDA2Sampler`
as `clover_engine.decoding.block_diffusion_decoder.BlockDiffusionDecoder` runs it).

A checkpoint is a tiny random LLaDA2.0 (`clover_engine.backbones.llada2_moe.tiny_config`: 3 layers, hidden 64,
4 / 2 heads of 16) whose every tensor -- the router's expert bias included -- is drawn from a
``torch.Generator`` seeded with the seed (`clover_engine.backbones.llada_moe.fill_random`: the router wide so
that tokens disagree on their experts, the output layer sharpened by `SHARPEN`), written in the hub layout by
`clover_engine.backbones.llada2_moe.save_llada2_moe`. Each seed has its own variant of the architecture, so
that the options of the hub config are exercised:

* seed 0: 8 experts in 4 groups (2 kept), top-2, one shared expert, the first layer dense, RoPE on half of
  each head;
* seed 1: 16 experts in 4 groups (2 kept), top-4, two shared experts, biases on ``query_key_value`` and
  ``dense``, ``routed_scaling_factor`` 1, no dense layer;
* seed 2: 8 experts in one group, top-3, no shared expert, RoPE on the whole head, two dense layers.

Every case runs in fp32 with SDPA attention (the official runner casts ``generate``'s bf16 0 / -inf block mask to
fp32, exactly): in bf16 the tiny routers' choices, and so the answers, depend on the CPU's kernel set.
"""

from __future__ import annotations

from pathlib import Path

import torch

SEEDS = (0, 1, 2)
VOCAB, MASK_ID, EOS_ID = 1000, 999, 2
SHARPEN = 12.0
VARIANTS = {
    0: dict(num_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2, num_shared_experts=1,
            first_k_dense_replace=1, partial_rotary_factor=0.5),
    1: dict(num_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4, num_shared_experts=2,
            use_qkv_bias=True, use_bias=True, routed_scaling_factor=1.0, first_k_dense_replace=0),
    2: dict(num_experts=8, n_group=1, topk_group=1, num_experts_per_tok=3, num_shared_experts=None,
            partial_rotary_factor=1.0, first_k_dense_replace=2, num_hidden_layers=4),
}
"""seed -> the `tiny_config` fields that differ from the defaults."""
STOP_IDS = {(0, 16): 0, (0, 13): 573, (1, 16): 5, (1, 13): 12, (2, 16): 328, (2, 13): 158}
"""(seed, prompt length) -> an id that model writes in the middle of its answer, taken as the end of text in two
cases (so the stop rules are exercised: the block holding it finished, or the early stop), read off the fp32
answers; (2, 16)'s is written after every slot before it, so there the early stop saves forwards."""


def config_of(seed: int) -> dict:
    """The hub ``config.json`` fields of the seed's checkpoint."""
    from clover_engine.backbones.llada2_moe import tiny_config  # local: keeps this module import-light

    return tiny_config(VOCAB, eos_token_id=EOS_ID, mask_token_id=MASK_ID, **VARIANTS[seed])


def build_checkpoint(seed: int, directory: Path) -> Path:
    """Write the tiny LLaDA2.0 checkpoint of ``seed`` into ``directory``; returns it."""
    from clover_engine.backbones.llada2_moe import LLaDA2Arch, LLaDA2LM, save_llada2_moe  # local
    from clover_engine.backbones.llada_moe import fill_random  # local

    data = config_of(seed)
    lm = LLaDA2LM(LLaDA2Arch.from_config(data))
    fill_random(lm, 6000 + seed, SHARPEN)
    return save_llada2_moe(lm.eval(), directory, data)


def prompt_for(seed: int, length: int) -> list[int]:
    """A prompt of ``length`` ids in [3, MASK_ID) (no special id, no MASK), drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed * 100 + length + 11)
    return torch.randint(3, MASK_ID, (length,), generator=g).tolist()


def cases() -> list[dict]:
    """Every case: ``id``, ``seed``, ``prompt`` and ``sampler``: the keyword arguments of LLaDA2.0's ``generate``
    under `clover_engine.decoding.llada2_samplers.LLaDA2Sampler`'s names (``stop_token_ids``: the
    original's one ``eos_id``; ``seed``: ``torch.manual_seed`` before a sampled case)."""
    out = []
    gen = 32
    for seed in SEEDS:
        for plen in (16, 13):  # on a block boundary, and not
            prompt = prompt_for(seed, plen)
            settings = [
                dict(block_length=8, steps=8, threshold=0.95),  # one slot per step unless confident
                dict(block_length=8, steps=4, threshold=0.95),  # a quota of 2
                dict(block_length=16, steps=16, threshold=0.5),
                dict(block_length=8, steps=8, threshold=0.95, stop_token_ids=[STOP_IDS[seed, plen]]),
                dict(block_length=8, steps=8, threshold=0.95, stop_token_ids=[STOP_IDS[seed, plen]], eos_early_stop=True),
                dict(block_length=8, steps=8, threshold=0.9, temperature=0.8, top_p=0.9, seed=seed),
            ]
            for s in settings:
                sampler = dict(dict(gen_length=gen, stop_token_ids=[EOS_ID]), **s)
                key = "-".join(f"{k}={v}" for k, v in sampler.items())
                out.append(dict(family="llada2_moe", seed=seed, prompt=prompt, sampler=sampler,
                                id=f"llada2-seed{seed}-P{plen}-{key}"))
    return out




def cases21() -> list[dict]:
    """LLaDA2.1's cases, on the same checkpoints: ``sampler`` holds the keyword arguments of its ``generate`` under
    `clover_engine.decoding.llada2_samplers.LLaDA21Sampler`'s names -- the defaults (``threshold`` 0.95,
    ``editing_threshold`` 0.9), the Speedy mode's low thresholds (many edits), editing off with two slots per
    forward, a short editing budget, the early stop, and a sampled draw."""
    out = []
    gen = 32
    for seed in SEEDS:
        for plen in (16, 13):
            prompt = prompt_for(seed, plen)
            settings = [
                dict(block_length=8, threshold=0.95, editing_threshold=0.9),
                dict(block_length=8, threshold=0.5, editing_threshold=0.3),
                dict(block_length=16, threshold=0.95, editing_threshold=1.0, num_to_transfer=2),
                dict(block_length=8, threshold=0.7, editing_threshold=0.5, max_post_steps=2),
                dict(block_length=8, threshold=0.7, editing_threshold=0.5, stop_token_ids=[STOP_IDS[seed, plen]],
                     eos_early_stop=True),
                dict(block_length=8, threshold=0.7, editing_threshold=0.5, temperature=0.8, top_p=0.9, seed=seed),
            ]
            for s in settings:
                sampler = dict(dict(gen_length=gen, stop_token_ids=[EOS_ID]), **s)
                key = "-".join(f"{k}={v}" for k, v in sampler.items())
                out.append(dict(family="llada21", seed=seed, prompt=prompt, sampler=sampler,
                                id=f"llada21-seed{seed}-P{plen}-{key}"))
    return out


__all__ = ["EOS_ID", "MASK_ID", "SEEDS", "SHARPEN", "STOP_IDS", "VARIANTS", "VOCAB", "build_checkpoint", "cases",
           "cases21", "config_of", "prompt_for"]
