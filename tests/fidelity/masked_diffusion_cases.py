"""The fidelity cases of LLaDA's and Dream's samplers and the tiny checkpoints they run on, shared by
``tests/fidelity/make_masked_diffusion_expected.py`` (which runs the official code on them and writes
``tests/data/masked_diffusion_fidelity.json``) and ``tests/clover_engine/test_masked_diffusion_fidelity.py``
(which decodes them with `clover_engine.decoding.masked_diffusion_decoder.MaskedDiffusionDecoder`).

A checkpoint is a tiny random transformers Llama (LLaDA) / Qwen2 (Dream) whose every weight is drawn
here from a ``torch.Generator`` seeded with the case's seed (not from transformers' initialisers, so a
transformers upgrade does not change it), with the output layer multiplied by `SHARPEN` so that the
confidences spread over (0, 1) and the ranking of slots matters; it is written in the hub layout by the
project's own `clover_engine.backbones.masked_diffusion.save_masked_diffusion`.
"""

from __future__ import annotations

from pathlib import Path

import torch

SEEDS = (0, 1, 2)
VOCAB, MASK_ID, EOS_ID, BOS_ID, PAD_ID = 1000, 999, 2, 1, 0
SHARPEN = 12.0
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
            pad_token_id=PAD_ID, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
"""The tiny architecture (2 layers, hidden 64, vocabulary 1000, grouped-query attention 4 / 2)."""


def build_checkpoint(family: str, seed: int, directory: Path) -> Path:
    """Write the tiny ``family`` (``llada`` / ``dream``) checkpoint of ``seed`` into ``directory``; returns it."""
    # local: transformers is heavy and the test skips without it
    import transformers

    from clover_engine.backbones.masked_diffusion import save_masked_diffusion

    if family == "llada":
        lm = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))
    else:
        lm = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**TINY))
    fill_random(lm, 1000 + seed, SHARPEN)
    return save_masked_diffusion(lm.eval(), directory, family, MASK_ID)


def fill_random(lm, seed: int, sharpen: float) -> None:
    """Every weight of ``lm`` drawn from a ``torch.Generator`` seeded with ``seed``, in name order: norms
    1 + 0.1 N, biases 0.02 N, the output layer ``sharpen`` * 0.05 N, the rest 0.05 N (fp32)."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, t in sorted(lm.state_dict().items()):
        noise = torch.randn(t.shape, generator=g, dtype=torch.float32)
        if "norm" in name:
            state[name] = 1.0 + 0.1 * noise
        elif name.endswith(".bias"):
            state[name] = 0.02 * noise
        elif name == "lm_head.weight":
            state[name] = sharpen * 0.05 * noise
        else:
            state[name] = 0.05 * noise
    lm.load_state_dict(state, strict=True)


def prompt_for(seed: int, length: int) -> list[int]:
    """A prompt of ``length`` ids in [3, MASK_ID) (no special id, no MASK), drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed * 100 + length)
    return torch.randint(3, MASK_ID, (length,), generator=g).tolist()


def cases() -> list[dict]:
    """Every case: ``id``, ``family``, ``seed``, ``prompt`` and ``sampler`` (the sampler's keyword arguments:
    `clover_engine.decoding.masked_diffusion_samplers.LLaDASampler` / ``DreamSampler``)."""
    out = []
    gen = 32
    for seed in SEEDS:
        for plen in (8, 13):  # a multiple of the block lengths, and not
            prompt = prompt_for(seed, plen)
            for block_length in (8, 16, 32):
                for steps in (gen, gen // 2):
                    out.append(dict(family="llada", seed=seed, prompt=prompt, sampler=dict(
                        gen_length=gen, block_length=block_length, steps=steps, remasking="low_confidence")))
            for alg in ("maskgit_plus", "topk_margin", "entropy"):
                for steps in (gen, gen // 2):
                    out.append(dict(family="dream", seed=seed, prompt=prompt, sampler=dict(
                        max_new_tokens=gen, steps=steps, alg=alg)))
        prompt = prompt_for(seed, 13)  # the seeded draws: LLaDA's random remasking and Gumbel noise, Dream's origin
        out.append(dict(family="llada", seed=seed, prompt=prompt, sampler=dict(
            gen_length=gen, block_length=8, steps=gen, remasking="random", seed=seed)))
        out.append(dict(family="llada", seed=seed, prompt=prompt, sampler=dict(
            gen_length=gen, block_length=16, steps=gen // 2, temperature=1.0, seed=seed)))
        out.append(dict(family="dream", seed=seed, prompt=prompt, sampler=dict(
            max_new_tokens=gen, steps=gen, alg="origin", seed=seed)))
        out.append(dict(family="dream", seed=seed, prompt=prompt, sampler=dict(
            max_new_tokens=gen, steps=gen // 2, alg="maskgit_plus", alg_temp=0.5, seed=seed)))
        out.append(dict(family="dream", seed=seed, prompt=prompt, sampler=dict(
            max_new_tokens=gen, steps=gen // 2, alg="topk_margin", temperature=0.7, top_p=0.95, seed=seed)))
    for c in out:
        s = c["sampler"]
        c["id"] = f"{c['family']}-seed{c['seed']}-P{len(c['prompt'])}-" + "-".join(f"{k}={v}" for k, v in s.items())
    return out
