"""Run LLaDA's official sampler on the official LLaDA-MoE modeling code for the MoE fidelity cases (a helper
of ``make_moe_expected.py``, run by it in a separate virtualenv with the official code's transformers 4.53;
it imports nothing of this project).

Usage: ``python run_official_moe.py OFFICIAL_DIR JOB_JSON OUT_JSON``. ``OFFICIAL_DIR`` holds ``generate.py``
(LLaDA's sampler), ``lladamoe_hub/`` (the LLaDA-MoE modeling and configuration files), ``sdar_generate.py`` and
``sdar_hub/`` (SDAR's sampler and model files). The modeling file
is inclusionAI's (dInfer ``tools/``): its decoder layer builds the vLLM-fused expert block, whose kernel
module is replaced here by a stub that is never called, and each MoE layer gets the file's own per-expert
``LLaDAMoESparseMoeBlock`` -- the hub checkpoint's weight layout (``mlp.experts.{e}.gate_proj``), the same
router code. For every case the answer canvas is written to ``OUT_JSON``, with the first forward's argmax
and max logit per canvas slot and the experts each MoE layer's router chose for every token of it.

SDAR MoE: SDAR-30B-A3B's own modeling file is not published on GitHub; its layers are Qwen3-MoE's. The
official model here is SDAR's modeling file (SDAR-4B-Chat's, as for the dense SDAR cases, flash_attn replaced
by the plain-torch shim of ``run_official_block_diffusion.py``) with transformers 4.53's ``Qwen3MoeSparseMoeBlock``
in its MoE layers -- whose routing (softmax, top-k, renormalised when ``norm_topk_prob``) is the one SDAR's
inference engine JetEngine runs for SDAR MoE (``jetengine/models/sdar_moe.py``) -- decoded by SDAR's
``block_diffusion_generate``. Its router record is the first denoising forward's (after the prefill).
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


def load_sdar_moe(directory: Path, recorder: RecordingTorch):
    """SDAR's official model (SDAR-4B-Chat's modeling file) with transformers' Qwen3-MoE block in its MoE layers."""
    import transformers.models.qwen3_moe.modeling_qwen3_moe as qwen3_moe
    from run_official_block_diffusion import hub_config_data
    from safetensors.torch import load_file
    from sdar_hub.configuration_sdar import SDARConfig
    from sdar_hub.modeling_sdar import SDARForCausalLM

    class TensorMoe(qwen3_moe.Qwen3MoeSparseMoeBlock):
        """The block returns (hidden, router logits); SDAR's decoder layer takes the hidden states."""

        def forward(self, hidden_states):
            return super().forward(hidden_states)[0]

    qwen3_moe.torch = recorder
    data = hub_config_data(directory)
    cfg = SDARConfig(**data)
    cfg._attn_implementation = "sdpa"
    model = SDARForCausalLM(cfg)
    dense = set(data.get("mlp_only_layers") or [])
    for i, layer in enumerate(model.model.layers):
        if (i + 1) % data.get("decoder_sparse_step", 1) == 0 and i not in dense:
            layer.mlp = TensorMoe(cfg)
    missing, unexpected = model.load_state_dict(load_file(str(directory / "model.safetensors")), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return model.float().eval()


def run_sdar_moe(model, case: dict, mask_id: int, recorder: RecordingTorch) -> dict:
    import sdar_generate  # SDAR's generate.py
    from run_official_block_diffusion import _first_block_logits_sdar

    prompt = torch.tensor([case["prompt"]], dtype=torch.long)
    s = dict(case["sampler"])
    torch.manual_seed(s.pop("seed"))
    stop = s.pop("stop_token_ids")
    with torch.no_grad():
        x = sdar_generate.block_diffusion_generate(model, {"input_ids": prompt}, mask_id, stopping_criteria_idx=stop, **s)
        recorder.calls, recorder.on = [], True
        logits = _first_block_logits_sdar(model, prompt, s["block_length"], mask_id)
        recorder.on = False
    # the first denoising forward's routing: the last len(block) rows of the last call per MoE layer
    n_moe = sum(1 for layer in model.model.layers if not hasattr(layer.mlp, "up_proj"))
    return dict(canvas=x[0, prompt.shape[1]:].tolist(), first_argmax=logits.argmax(-1).tolist(),
                first_max=[round(float(v), 5) for v in logits.max(-1).values], first_router=recorder.calls[-n_moe:])


def main(official_dir: str, job_path: str, out_path: str) -> None:
    sys.path.insert(0, official_dir)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the block-diffusion runner's helpers
    import generate as llada_generate  # LLaDA's generate.py
    from run_official_block_diffusion import _write_shim

    _write_shim(Path(official_dir))  # SDAR's flash_attn imports, in plain torch on this CPU run
    torch.set_num_threads(1)
    job = json.loads(Path(job_path).read_text())
    recorder = RecordingTorch()
    models, results = {}, {}
    for case in job["cases"]:
        key = f"{case['family']}-{case['seed']}"
        if case["family"] == "sdar_moe":
            if key not in models:
                models[key] = load_sdar_moe(Path(job["checkpoints"][key]), recorder)
            results[case["id"]] = run_sdar_moe(models[key], case, job["mask_id"], recorder)
            print(case["id"], "done", flush=True)
            continue
        if key not in models:
            models[key] = load(Path(official_dir), Path(job["checkpoints"][key]), recorder)
        model = models[key]
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
