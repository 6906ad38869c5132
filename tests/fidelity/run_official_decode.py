"""One timed decode by a family's official code (the other side of ``benchmarks/vs_official.py``; it imports
nothing of this project and runs in the official code's own virtualenv, transformers 4.53).

Usage: ``python run_official_decode.py OFFICIAL_DIR FAMILY CHECKPOINT_DIR JOB_JSON``; prints one JSON line:
``wall_s``, ``cpu_s`` (this process's CPU time over the decode), ``nfe`` (calls of the model's ``forward``,
counted by wrapping it: the official samplers call ``model(...)`` or ``self.forward(...)``) and ``tokens``
(the answer after the prompt as the official sampler returns it).

The models are built by this folder's other runners' loaders (``run_official_*.py``: the official
modeling files fetched at their pinned commits, the checkpoint's ``model.safetensors`` loaded strictly, fp32),
so what is timed here is the code those runners' data pins token for token.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

FIDELITY = Path(__file__).resolve().parent


def _load(official: Path, family: str, directory: Path):
    import run_official_block_diffusion as block
    import run_official_masked_diffusion as masked

    if family == "fast_dllm_v2":
        return block.load_fast_dllm(directory)
    if family == "sdar":
        return block.load_sdar(directory)
    if family == "llada":
        return masked.load_llada(directory)
    if family == "dream":
        return masked.load_dream(directory)
    if family == "llada_moe":
        import run_official_moe as moe

        return moe.load(official, directory, moe.RecordingTorch())
    raise SystemExit(f"unknown family {family!r}")


def _decode(model, family: str, prompt: torch.Tensor, job: dict) -> torch.Tensor:
    s, mask_id = dict(job["settings"]), job["mask_id"]
    if family == "fast_dllm_v2":
        return model.generate(prompt, mask_id=mask_id, **s)
    if family == "sdar":
        import sdar_generate  # SDAR's generate.py

        return sdar_generate.block_diffusion_generate(model, {"input_ids": prompt}, mask_id, **s)
    if family in ("llada", "llada_moe"):
        import generate as llada_generate  # LLaDA's generate.py

        return llada_generate.generate(model, prompt, mask_id=mask_id, **s)
    out = model.diffusion_generate(prompt, output_history=False, return_dict_in_generate=True, mask_token_id=mask_id,
                                   **s)
    return out.sequences


def main(official_dir: str, family: str, directory: str, job_path: str) -> None:
    official = Path(official_dir)
    sys.path[:0] = [official_dir, str(FIDELITY)]
    import run_official_block_diffusion as block

    block._write_shim(official)  # SDAR's flash_attn imports, in plain torch on a CPU
    job = json.loads(Path(job_path).read_text())
    torch.set_num_threads(job["threads"])
    model = _load(official, family, Path(directory))
    calls = [0]
    forward = model.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        return forward(*args, **kwargs)

    model.forward = counted  # both model(...) (through __call__) and self.forward(...) land here
    prompt = torch.tensor([job["prompt"]], dtype=torch.long)
    torch.manual_seed(job.get("seed", 0))
    with torch.no_grad():
        t0, c0 = time.perf_counter(), time.process_time()
        x = _decode(model, family, prompt, job)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps(dict(wall_s=wall, cpu_s=cpu, nfe=calls[0], tokens=x[0, prompt.shape[1]:].tolist())))


if __name__ == "__main__":
    main(*sys.argv[1:5])
