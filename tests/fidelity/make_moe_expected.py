"""Write ``tests/data/moe_fidelity.json``: what LLaDA's official sampler decodes on the official LLaDA-MoE
modeling code for the tiny checkpoints of ``moe_cases.py`` -- the expected tokens and router choices of
``tests/clover_engine/test_moe_fidelity.py``.

Steps as in ``make_masked_diffusion_expected.py``: the tiny checkpoints are written with the project's own
code (this script runs under the project's virtualenv); the official files are fetched at the pinned
commits of `OFFICIAL` (from GitHub, or local mirrors with ``--mirrors DIR``) into a temporary folder and run
by ``run_official_moe.py`` in a SEPARATE virtualenv with transformers 4.53 (``--official-python``); the
results are written as JSON. No official source file enters the repository.

Usage: ``.venv/bin/python tests/fidelity/make_moe_expected.py --official-python /tmp/official-venv/bin/python``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_masked_diffusion_expected import fetch_official, write_data  # noqa: E402
from make_block_diffusion_expected import OFFICIAL as BLOCK_DIFFUSION_OFFICIAL  # noqa: E402
from moe_cases import (  # noqa: E402
    MASK_ID, SDAR_VARIANTS, SHARPEN, VARIANTS, build_checkpoint, build_sdar_checkpoint, cases, config_of, sdar_config_of,
)

OUT = HERE.parent / "data" / "moe_fidelity.json"

OFFICIAL = {
    "llada_sampler": dict(repo="ML-GSAI/LLaDA", commit="b7e6c3565f194352da44b38dd12b6970597309f3",
                          files={"generate.py": "generate.py"}),
    # LLaDA-MoE's hub modeling file is not on GitHub as published; inclusionAI's own inference engine
    # (dInfer) ships it with a vLLM-fused expert block beside the hub's per-expert one (run_official_moe.py)
    "lladamoe_modeling": dict(repo="inclusionAI/dInfer", commit="fce4e32804103baa5d55230dff0352da0cdd6ceb", files={
        "lladamoe_hub/modeling_fused_lladamoe.py": "tools/modeling_fused_lladamoe.py",
        "lladamoe_hub/configuration_lladamoe.py": "tools/configuration_lladamoe.py",
    }),
    # SDAR's sampler and model files, as for the dense SDAR cases (the MoE block: transformers' Qwen3-MoE)
    "sdar": BLOCK_DIFFUSION_OFFICIAL["sdar"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--official-python", required=True, help="python of the virtualenv with transformers 4.53")
    ap.add_argument("--mirrors", type=Path, default=None, help="local git mirrors instead of GitHub")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    all_cases = cases()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        checkpoints = {}
        for seed in sorted({c["seed"] for c in all_cases}):
            checkpoints[f"lladamoe-{seed}"] = str(build_checkpoint(seed, tmp / f"lladamoe-{seed}"))
            checkpoints[f"sdar_moe-{seed}"] = str(build_sdar_checkpoint(seed, tmp / f"sdar_moe-{seed}"))
        fetch_official(tmp / "official", args.mirrors, OFFICIAL)
        job = dict(cases=all_cases, checkpoints=checkpoints, mask_id=MASK_ID)
        (tmp / "job.json").write_text(json.dumps(job))
        subprocess.run([args.official_python, str(HERE / "run_official_moe.py"), str(tmp / "official"),
                        str(tmp / "job.json"), str(tmp / "out.json")], check=True)
        results = json.loads((tmp / "out.json").read_text())
        versions = subprocess.run([args.official_python, "-c", "import torch, transformers; "
                                   "print(torch.__version__, transformers.__version__)"],
                                  check=True, capture_output=True, text=True).stdout.split()
    data = dict(
        about="Answer canvases of LLaDA's generate (official) on LLaDA-MoE's official modeling code, and of SDAR's "
              "block_diffusion_generate on SDAR's modeling with Qwen3-MoE layers, tiny random checkpoints, with the "
              "first forward's router choices; written by tests/fidelity/make_moe_expected.py",
        official={k: dict(repo=v["repo"], commit=v["commit"], files=sorted(v["files"].values()))
                  for k, v in OFFICIAL.items()},
        official_env=dict(torch=versions[0], transformers=versions[1]),
        models={str(seed): dict(config_of(seed), sharpen=SHARPEN) for seed in VARIANTS},
        sdar_moe_models={str(seed): dict(sdar_config_of(seed), sharpen=SHARPEN) for seed in SDAR_VARIANTS},
        cases=[dict(c, **results[c["id"]]) for c in all_cases])
    write_data(args.out, data)


if __name__ == "__main__":
    main()
