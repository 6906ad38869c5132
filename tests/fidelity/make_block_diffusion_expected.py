"""Write ``tests/data/block_diffusion_fidelity.json``: what Fast-dLLM v2's and SDAR's official code decodes on
the tiny checkpoints of ``block_diffusion_cases.py`` -- the expected tokens of
``tests/clover_engine/test_block_diffusion_fidelity.py``.

Steps: (a) the tiny checkpoints are written in each family's hub layout by the project's own code (this
script runs under the project's virtualenv); (b) the official files are read at the pinned commits of
`OFFICIAL` from local git mirrors (``--mirrors DIR``: ``DIR/<owner>+<name>/repo``) or from GitHub, into a
temporary folder, and run by ``run_official_block_diffusion.py`` in a SEPARATE virtualenv
(``--official-python``: ``python -m venv /tmp/official-venv && /tmp/official-venv/bin/pip install
--find-links /opt/wheels torch==2.13.0 'transformers==4.53.*' safetensors numpy einops triton``); (c) the
answers are written as JSON, one line per case. No official source file enters the repository.

Usage: ``.venv/bin/python tests/fidelity/make_block_diffusion_expected.py --official-python /tmp/official-venv/bin/python --mirrors /work/.mirror``
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
from block_diffusion_cases import MASK_ID, SHARPEN, TINY, build_checkpoint, cases  # noqa: E402
from make_masked_diffusion_expected import fetch_official, write_data  # noqa: E402

OUT = HERE.parent / "data" / "block_diffusion_fidelity.json"

OFFICIAL = {
    # SDAR: the sampler (generate.py) and the hub model files of SDAR-4B-Chat, as the JetAstra/SDAR repository keeps them
    "sdar": dict(repo="JetAstra/SDAR", commit="c2041a8333333d685f6e15122c84f60f51f85ebd", files={
        "sdar_generate.py": "generate.py",
        "sdar_hub/modeling_sdar.py": "training/model/SDAR-4B-Chat/modeling_sdar.py",
        "sdar_hub/configuration_sdar.py": "training/model/SDAR-4B-Chat/configuration_sdar.py",
        "sdar_hub/fused_linear_diffusion_cross_entropy.py":
            "training/model/SDAR-4B-Chat/fused_linear_diffusion_cross_entropy.py",
    }),
    # Fast-dLLM v2: the hub files of Efficient-Large-Model/Fast_dLLM_v2_7B (modeling.py, configuration.py) are not on
    # GitHub in NVlabs' repository; this copy (committed 2025-10-16) differs from the hub's modeling.py only in
    # its import line of the config module (which the path below satisfies); two more copies (Satgoy152/
    # DualDiffusion 189fa7a, PunchlineAAAA/Fast-dLLM 54b8ad4) agree with it but for their own one-line edits
    "fast_dllm_v2": dict(repo="Gertlek/Fast-dLLM", commit="a8a787864e7aa2f80c984c616970c2eab072eece", files={
        "transformers_modelling/qwen_2_5_modelling.py": "blockfast/transformers_modelling/qwen_2_5_modelling.py",
        "transformers_modelling/fast_dllm_qwen_2_5_config.py":
            "blockfast/transformers_modelling/fast_dllm_qwen_2_5_config.py",
    }),
}
FAMILIES = {"fast_dllm_v2": "fast_dllm_v2", "sdar": "sdar"}
"""The families whose official code this script runs (the key of `OFFICIAL` that holds it)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--official-python", required=True, help="python of the virtualenv with transformers 4.53")
    ap.add_argument("--mirrors", type=Path, default=None, help="local git mirrors instead of GitHub")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    all_cases = [c for c in cases() if c["family"] in FAMILIES]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        checkpoints = {}
        for family in FAMILIES:
            for seed in sorted({c["seed"] for c in all_cases}):
                checkpoints[f"{family}-{seed}"] = str(build_checkpoint(family, seed, tmp / f"{family}-{seed}"))
        fetch_official(tmp / "official", args.mirrors, {k: OFFICIAL[v] for k, v in FAMILIES.items()})
        job = dict(cases=all_cases, checkpoints=checkpoints, mask_id=MASK_ID, families=sorted(FAMILIES))
        (tmp / "job.json").write_text(json.dumps(job))
        subprocess.run([args.official_python, str(HERE / "run_official_block_diffusion.py"), str(tmp / "official"),
                        str(tmp / "job.json"), str(tmp / "out.json")], check=True)
        results = json.loads((tmp / "out.json").read_text())
        versions = subprocess.run([args.official_python, "-c", "import torch, transformers; "
                                   "print(torch.__version__, transformers.__version__)"],
                                  check=True, capture_output=True, text=True).stdout.split()
    data = dict(
        about="Answers of Fast-dLLM v2's and SDAR's official code on tiny random checkpoints in their hub layouts; "
              "written by tests/fidelity/make_block_diffusion_expected.py. SDAR ran on CPU with flash_attn's "
              "rms_norm_fn and flash_attn_func replaced by the same operations in plain torch "
              "(tests/fidelity/run_official_block_diffusion.py CPU_FLASH_ATTN). Fast-dLLM v2 ran its hub model's own "
              "generate (greedy, temperature 0, or seeded top-p draws).",
        official={k: dict(repo=OFFICIAL[v]["repo"], commit=OFFICIAL[v]["commit"],
                          files=sorted(OFFICIAL[v]["files"].values())) for k, v in FAMILIES.items()},
        official_env=dict(torch=versions[0], transformers=versions[1]),
        model=dict(TINY, mask_token_id=MASK_ID, sharpen=SHARPEN),
        cases=[dict(c, **results[c["id"]]) for c in all_cases])
    write_data(args.out, data)


if __name__ == "__main__":
    main()
