"""Run LLaDA's official sampler on the official LLaDA-MoE modeling code for the MoE fidelity cases (a helper
of ``make_moe_expected.py``, run by it in a separate virtualenv with the official code's transformers 4.53;
it imports nothing of this project).

Usage: ``python run_official_moe.py OFFICIAL_DIR JOB_JSON OUT_JSON``. ``OFFICIAL_DIR`` holds ``generate.py``
(LLaDA's sampler) and ``lladamoe_hub/`` (the LLaDA-MoE modeling and configuration files). The modeling file
is inclusionAI's (dInfer ``tools/``): its decoder layer builds the vLLM-fused expert block, whose kernel
module is replaced here by a stub that is never called, and each MoE layer gets the file's own per-expert
``LLaDAMoESparseMoeBlock`` -- the hub checkpoint's weight layout (``mlp.experts.{e}.gate_proj``), the same
router code. For every case the answer canvas is written to ``OUT_JSON``, with the first forward's argmax
and max logit per canvas slot and the experts each MoE layer's router chose for every token of it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


class RecordingTorch:
    """``torch`` as the official modeling module sees it, recording what ``torch.topk`` returns while on."""

    def __init__(self):
        self.on, self.calls = False, []

    def topk(self, *args, **kwargs):
        out = torch.topk(*args, **kwargs)
        if self.on:
            self.calls.append(out.indices.tolist())
        return out

    def __getattr__(self, name):
        return getattr(torch, name)


def load(official_dir: Path, directory: Path, recorder: RecordingTorch):
    stub = official_dir / "lladamoe_hub" / "fuse_moe.py"
    stub.write_text("def fused_moe(*args, **kwargs):\n    raise RuntimeError('the fused kernel is not used')\n")
    from lladamoe_hub import modeling_fused_lladamoe as modeling
    from lladamoe_hub.configuration_lladamoe import LLaDAConfig
    from safetensors.torch import load_file

    modeling.torch = recorder
    data = json.loads((directory / "config.json").read_text())
    for key in ("architectures", "model_type"):
        data.pop(key, None)
    cfg = LLaDAConfig(**data)
    cfg._attn_implementation = "sdpa"
    model = modeling.FusedLLaDAMoEModelLM(cfg)
    for layer in model.model.layers:
        if layer.mlp_type == "moe":
            layer.mlp = modeling.LLaDAMoESparseMoeBlock(cfg)
    missing, unexpected = model.load_state_dict(load_file(str(directory / "model.safetensors")), strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    return model.float().eval()


def main(official_dir: str, job_path: str, out_path: str) -> None:
    sys.path.insert(0, official_dir)
    import generate as llada_generate  # LLaDA's generate.py

    torch.set_num_threads(1)
    job = json.loads(Path(job_path).read_text())
    recorder = RecordingTorch()
    models, results = {}, {}
    for case in job["cases"]:
        seed = case["seed"]
        if seed not in models:
            models[seed] = load(Path(official_dir), Path(job["checkpoints"][str(seed)]), recorder)
        model = models[seed]
        prompt = torch.tensor([case["prompt"]], dtype=torch.long)
        s = dict(case["sampler"])
        with torch.no_grad():
            x = llada_generate.generate(model, prompt, mask_id=job["mask_id"], **s)
            recorder.calls, recorder.on = [], True
            full = torch.cat([prompt, torch.full((1, s["gen_length"]), job["mask_id"])], 1)
            first = model(full).logits[0, prompt.shape[1]:]
            recorder.on = False
        results[case["id"]] = dict(canvas=x[0, prompt.shape[1]:].tolist(), first_argmax=first.argmax(-1).tolist(),
                                   first_max=[round(float(v), 5) for v in first.max(-1).values],
                                   first_router=recorder.calls)
        print(case["id"], "done", flush=True)
    Path(out_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:4])
