"""Run LLaDA2.1's official ``generate`` (token editing) on its modeling file for the LLaDA2.1 fidelity cases (a
helper of ``make_llada2_expected.py --llada21``, run by it in a separate virtualenv with transformers 4.57, which
that file needs; it imports nothing of this project).

Usage: ``python run_official_llada21.py OFFICIAL_DIR JOB_JSON OUT_JSON``. ``OFFICIAL_DIR`` holds ``llada21_hub/``
(``modeling_llada21_moe.py`` and ``configuration_llada21_moe.py``). Each checkpoint -- the LLaDA2.0 layout, the
same architecture -- is opened with the file's ``LLaDA2MoeModelLM.from_pretrained`` in **fp32** with SDPA attention;
sampled cases call ``torch.manual_seed(seed)`` first. The one patch of the harness, and why fp32 (bf16 answers of
these tiny routers depend on the CPU's kernel set): ``run_official_llada2.fp32_masks`` casts ``generate``'s bf16
0 / -inf block mask to fp32 before each forward, which is exact; the official file runs as written. For every case the answer ``generate`` returns (the tokens
after the prompt through the first end-of-text) is written to ``OUT_JSON``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from run_official_llada2 import fp32_masks  # the same harness patch (this folder is on sys.path as the script's)


def main(official_dir: str, job_path: str, out_path: str) -> None:
    sys.path.insert(0, official_dir)
    from llada21_hub.modeling_llada21_moe import LLaDA2MoeModelLM

    torch.set_num_threads(1)
    job = json.loads(Path(job_path).read_text())
    models, results = {}, {}
    for case in job["cases"]:
        key = str(case["seed"])
        if key not in models:
            models[key] = fp32_masks(LLaDA2MoeModelLM.from_pretrained(
                job["checkpoints"][key], torch_dtype=torch.float32, attn_implementation="sdpa").eval())
        s = dict(case["sampler"])
        (eos_id,) = s.pop("stop_token_ids")
        seed = s.pop("seed", None)
        if seed is not None:
            torch.manual_seed(seed)
        with torch.no_grad():
            x = models[key].generate(torch.tensor([case["prompt"]], dtype=torch.long), eos_id=eos_id,
                                     mask_id=job["mask_id"], **s)
        results[case["id"]] = dict(canvas=x[0].tolist())
        print(case["id"], "done", flush=True)
    Path(out_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:4])
