"""The fidelity cases of Fast-dLLM v2's and SDAR's samplers and the tiny checkpoints they run on, shared by
``tests/fidelity/make_block_diffusion_expected.py`` (which runs the official code on them and writes
``tests/data/block_diffusion_fidelity.json``) and ``tests/clover_engine/test_block_diffusion_fidelity.py``
(which decodes them with `clover_engine.decoding.block_diffusion_decoder.BlockDiffusionDecoder`).

A checkpoint is a tiny random transformers Qwen2 (Fast-dLLM v2) / Qwen3 (SDAR) whose every weight is drawn
here from a ``torch.Generator`` seeded with the case's seed, the output layer multiplied by `SHARPEN` so
that confidences spread over (0, 1), written in the family's hub layout by the project's own
`clover_engine.backbones.block_causal.save_block_causal`.
"""

from __future__ import annotations

from pathlib import Path

import torch

try:  # imported from the tests (package ``fidelity``) or by the make script from this folder
    from .masked_diffusion_cases import fill_random
except ImportError:
    from masked_diffusion_cases import fill_random

SEEDS = (0, 1, 2)
VOCAB, MASK_ID, EOS_ID, BOS_ID, PAD_ID = 1000, 999, 2, 1, 0
SHARPEN = 12.0
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, eos_token_id=EOS_ID,
            bos_token_id=BOS_ID, pad_token_id=PAD_ID, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
"""The tiny architecture (2 layers, hidden 64, vocabulary 1000, grouped-query attention 4 / 2)."""

MODEL_TYPES = {"fast_dllm_v2": "Fast_dLLM_Qwen", "sdar": "sdar"}


def build_checkpoint(family: str, seed: int, directory: Path) -> Path:
    """Write the tiny ``family`` (``fast_dllm_v2`` / ``sdar``) checkpoint of ``seed`` into ``directory``."""
    # local: transformers is heavy and the test skips without it
    import transformers

    from clover_engine.backbones.block_causal import save_block_causal

    if family == "fast_dllm_v2":
        lm = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**TINY))
    else:
        lm = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**TINY))
    fill_random(lm, 2000 + seed, SHARPEN)
    return save_block_causal(lm.eval(), directory, MODEL_TYPES[family], MASK_ID, block_size=8)


def prompt_for(seed: int, length: int) -> list[int]:
    """A prompt of ``length`` ids in [3, MASK_ID) (no special id, no MASK), drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed * 100 + length)
    return torch.randint(3, MASK_ID, (length,), generator=g).tolist()


def cases() -> list[dict]:
    """Every case: ``id``, ``family``, ``seed``, ``prompt`` and ``sampler`` (the keyword arguments of
    `clover_engine.decoding.block_diffusion_samplers.FastDLLMv2Sampler` / ``SDARSampler``, which are the
    originals' own names)."""
    out = []
    gen = 32
    for seed in SEEDS:
        for plen in (16, 13):  # on a block boundary (4 and 8), and not
            prompt = prompt_for(seed, plen)
            for block in (4, 8):
                for threshold in (0.9, 0.5):
                    out.append(dict(family="fast_dllm_v2", seed=seed, prompt=prompt, sampler=dict(
                        max_new_tokens=gen, block_size=block, small_block_size=block // 2, threshold=threshold,
                        stop_token=EOS_ID)))
                for strategy, threshold in (("low_confidence_dynamic", 0.85), ("low_confidence_dynamic", 0.5),
                                            ("low_confidence_static", 0.85), ("sequential", 0.85)):
                    out.append(dict(family="sdar", seed=seed, prompt=prompt, sampler=dict(
                        gen_length=gen, block_length=block, denoising_steps=block if strategy != "sequential" else block // 2,
                        remasking_strategy=strategy, confidence_threshold=threshold, stop_token_ids=[EOS_ID], seed=seed)))
        short = prompt_for(seed, 5)  # shorter than a block: no prefill, the prompt is the first block's head
        out.append(dict(family="fast_dllm_v2", seed=seed, prompt=short, sampler=dict(
            max_new_tokens=gen, block_size=8, small_block_size=8, threshold=0.9, stop_token=EOS_ID)))
        out.append(dict(family="fast_dllm_v2", seed=seed, prompt=prompt_for(seed, 13), sampler=dict(
            max_new_tokens=gen, block_size=8, small_block_size=4, threshold=0.9, temperature=0.7, top_p=0.95,
            stop_token=EOS_ID, seed=seed)))
        out.append(dict(family="sdar", seed=seed, prompt=short, sampler=dict(
            gen_length=gen, block_length=4, denoising_steps=2, top_k=1, stop_token_ids=[EOS_ID], seed=seed)))
        out.append(dict(family="sdar", seed=seed, prompt=prompt_for(seed, 13), sampler=dict(
            gen_length=gen, block_length=8, denoising_steps=4, temperature=0.7, top_p=0.9, top_k=50,
            stop_token_ids=[EOS_ID], seed=seed)))
    for c in out:
        s = c["sampler"]
        c["id"] = f"{c['family']}-seed{c['seed']}-P{len(c['prompt'])}-" + "-".join(
            f"{k}={v}" for k, v in s.items() if k not in ("stop_token", "stop_token_ids"))
    return out
