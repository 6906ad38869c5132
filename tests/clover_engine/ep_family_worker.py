"""Decode a public MoE family's settings and record what the equality check compares (tokens, every forward's
router top-k per layer, the expert union events, each rank's experts). Run under torchrun by
``tests/clover_engine/test_expert_parallel_families.py`` (split over the ranks), and in process (one process,
unsplit) for the reference: ``python ep_family_worker.py CHECKPOINT OUT.json SETTING...``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

PROMPT = "The quick brown fox jumps over the lazy dog"


def setting_of(name: str):
    from clover_engine.decoding.config import DecodeConfig
    from clover_engine.decoding.samplers import official_setting

    if name == "block":  # threshold decoding
        return DecodeConfig(block_size=8, threshold=0.6, max_new_tokens=24)
    return official_setting(name, 24, 8, 0.6)


def decode_all(model, tokenizer, settings: list[str]) -> dict:
    """``{setting: {tokens, nfe, topk (per forward, per layer: sha1 of the [T, k] ids), unions (per step),
    rank_unions (per forward, [ranks, layers]; split models only)}}``."""
    import torch

    from clover_engine.backbones.moe import split_layers
    from clover_engine.decoding.expert_parallel import RankUnionRecorder
    from clover_engine.decoding.samplers import decoder_for
    from clover_engine.recording.events import StepEvent

    layers = [m for _, m in split_layers(model)]
    split = layers[0].split is not None
    out = {}
    for name in settings:
        topk: list[list[str]] = []

        def hook(event):
            if isinstance(event, StepEvent):
                topk.append([hashlib.sha1(m.last.selected.to(torch.int64).numpy().tobytes()).hexdigest()
                             for m in layers])

        recorder = RankUnionRecorder(model)
        r = decoder_for(model, tokenizer, setting_of(name)).generate(
            PROMPT, hooks=[hook] + ([recorder] if split else []), record_trace=True)
        out[name] = {"tokens": [int(t) for t in r.tokens], "nfe": int(r.nfe), "topk": topk,
                     "unions": [[int(u) for u in st.expert_union] for st in r.trace.steps],
                     "rank_unions": [u.tolist() for u in recorder.unions]}
    return out


def main() -> int:
    import torch.distributed as dist

    from clover_engine.checkpoint import load_tokenizer
    from clover_engine.decoding.expert_parallel import load_expert_parallel

    path, target, settings = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = load_expert_parallel(path, rank, world)
    held = sum(1 for m in model.modules() if type(m).__name__ == "RemoteExpert")
    result = {"rank": rank, "world": world, "remote_experts": held, "decodes": decode_all(model, load_tokenizer(path),
                                                                                          settings)}
    target.with_name(f"{target.stem}-rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
