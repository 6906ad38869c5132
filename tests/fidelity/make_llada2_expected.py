"""Write ``tests/data/llada2_fidelity.json``: what LLaDA2.0's official ``generate`` decodes on its official modeling
code for the tiny checkpoints of ``llada2_cases.py`` -- the expected tokens and router choices of
``tests/clover_engine/test_llada2_fidelity.py``.

Steps as in ``make_moe_expected.py``: the tiny checkpoints are written with the project's own code (this script
runs under the project's virtualenv); the official files are fetched at the pinned commits of `OFFICIAL` (from
GitHub, local mirrors with ``--mirrors DIR``, or a folder that already holds them under their local names with
``--official-dir DIR``) and run by ``run_official_llada2.py`` in a SEPARATE virtualenv with transformers 4.53
(``--official-python``); the results are written as JSON. No official source file enters the repository.

Usage: ``.venv/bin/python tests/fidelity/make_llada2_expected.py --official-python /tmp/official-venv/bin/python``
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_masked_diffusion_expected import fetch_official, write_data  # noqa: E402
from llada2_cases import MASK_ID, SHARPEN, VARIANTS, build_checkpoint, cases, config_of  # noqa: E402

OUT = HERE.parent / "data" / "llada2_fidelity.json"

OFFICIAL = {
    # the hub's modeling_llada2_moe.py (inclusionAI/LLaDA2.0-mini; "Copyright 2025 Antgroup"), as a public GitHub
    # repository holds it: LLaDA2MoeModelLM and its generate()
    "llada2_modeling": dict(repo="sajadn/Megatron-Bridge", commit="4fde5488eecca7d672000cf0b49d67a6d17f074b",
                            files={"llada2_hub/modeling_llada2_moe.py": "modeling_llada2_moe.py"}),
    # the hub's configuration_llada2_moe.py (a plain PretrainedConfig of the fields), as the dllm library ships it
    "llada2_config": dict(repo="ZHZisZZ/dllm", commit="d8cc1190ddbe47a7c38fd0eb5d29d3a0b12043c5",
                          files={"llada2_hub/configuration_llada2_moe.py":
                                 "dllm/pipelines/llada2/models/configuration_llada2_moe.py"}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--official-python", required=True, help="python of the virtualenv with transformers 4.53")
    ap.add_argument("--mirrors", type=Path, default=None, help="local git mirrors instead of GitHub")
    ap.add_argument("--official-dir", type=Path, default=None,
                    help="a folder already holding llada2_hub/modeling_llada2_moe.py and configuration_llada2_moe.py")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    all_cases = cases()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        checkpoints = {str(seed): str(build_checkpoint(seed, tmp / f"llada2-{seed}")) for seed in VARIANTS}
        if args.official_dir is not None:
            shutil.copytree(args.official_dir, tmp / "official")
            (tmp / "official" / "llada2_hub" / "__init__.py").touch()
        else:
            fetch_official(tmp / "official", args.mirrors, OFFICIAL)
        job = dict(cases=all_cases, checkpoints=checkpoints, mask_id=MASK_ID)
        (tmp / "job.json").write_text(json.dumps(job))
        subprocess.run([args.official_python, str(HERE / "run_official_llada2.py"), str(tmp / "official"),
                        str(tmp / "job.json"), str(tmp / "out.json")], check=True)
        results = json.loads((tmp / "out.json").read_text())
        versions = subprocess.run([args.official_python, "-c", "import torch, transformers; "
                                   "print(torch.__version__, transformers.__version__)"],
                                  check=True, capture_output=True, text=True).stdout.split()
    data = dict(
        about="Answers of LLaDA2.0's generate (official, bf16, SDPA) on its official modeling code, tiny random "
              "checkpoints, with the first forward's logits and router choices; written by "
              "tests/fidelity/make_llada2_expected.py",
        official={k: dict(repo=v["repo"], commit=v["commit"], files=sorted(v["files"].values()))
                  for k, v in OFFICIAL.items()},
        official_env=dict(torch=versions[0], transformers=versions[1], dtype="bfloat16", attention="sdpa"),
        models={str(seed): dict(config_of(seed), sharpen=SHARPEN) for seed in VARIANTS},
        cases=[dict(c, **results[c["id"]]) for c in all_cases])
    write_data(args.out, data)


if __name__ == "__main__":
    main()
