"""Write ``tests/data/llada2_fidelity.json``: what LLaDA2.0's official ``generate`` decodes on its official modeling
code for the tiny checkpoints of ``llada2_cases.py`` -- the expected tokens and router choices of
``tests/clover_engine/test_llada2_fidelity.py``.

Steps as in ``make_moe_expected.py``: the tiny checkpoints are written with the project's own code (this script
runs under the project's virtualenv); the official files are fetched at the pinned commits of `OFFICIAL` (from
GitHub, local mirrors with ``--mirrors DIR``, or a folder that already holds them under their local names with
``--official-dir DIR``) and run by ``run_official_llada2.py`` in a SEPARATE virtualenv with transformers 4.53
(``--official-python``); the results are written as JSON. No official source file enters the repository.

The official code runs in fp32 (the runner's docstring says why and how): its answers are then the same on
every x86 CPU. Check that before committing new data by running the script twice, once with
``ATEN_CPU_CAPABILITY=default`` in the environment (PyTorch's plain kernels) and once without, and diffing the
two files: tokens and routers must be equal and logits within 1e-4.

With ``--llada21`` it writes ``tests/data/llada21_fidelity.json`` instead: LLaDA2.1's ``generate`` (token editing,
``llada2_cases.cases21``) from its modeling file as the dllm library ships it, run by ``run_official_llada21.py``
with transformers 4.57 (the file needs it).

Usage: ``.venv/bin/python tests/fidelity/make_llada2_expected.py --official-python /tmp/official-venv/bin/python``
and ``... --llada21 --official-python /tmp/official-venv-457/bin/python --mirrors /work/.mirror``
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
from llada2_cases import MASK_ID, SHARPEN, VARIANTS, build_checkpoint, cases, cases21, config_of  # noqa: E402

OUT = HERE.parent / "data" / "llada2_fidelity.json"
OUT21 = HERE.parent / "data" / "llada21_fidelity.json"

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


OFFICIAL21 = {
    # LLaDA2.1's hub modeling file ("Copyright 2025 Antgroup"; generate() with editing_threshold / max_post_steps), as
    # the dllm library ships it beside its configuration (model_type renamed llada21_moe there)
    "llada21_modeling": dict(repo="ZHZisZZ/dllm", commit="ca176752fbceec49c6b4777a2c18ae88e4eb10ed", files={
        "llada21_hub/modeling_llada21_moe.py": "dllm/pipelines/llada21/models/modeling_llada21_moe.py",
        "llada21_hub/configuration_llada21_moe.py": "dllm/pipelines/llada21/models/configuration_llada21_moe.py"}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--official-python", required=True, help="python of the virtualenv with transformers 4.53")
    ap.add_argument("--mirrors", type=Path, default=None, help="local git mirrors instead of GitHub")
    ap.add_argument("--official-dir", type=Path, default=None,
                    help="a folder already holding llada2_hub/modeling_llada2_moe.py and configuration_llada2_moe.py")
    ap.add_argument("--llada21", action="store_true", help="LLaDA2.1's cases (token editing) instead")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    all_cases = cases21() if args.llada21 else cases()
    official = OFFICIAL21 if args.llada21 else OFFICIAL
    runner = "run_official_llada21.py" if args.llada21 else "run_official_llada2.py"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        checkpoints = {str(seed): str(build_checkpoint(seed, tmp / f"llada2-{seed}")) for seed in VARIANTS}
        if args.official_dir is not None:
            shutil.copytree(args.official_dir, tmp / "official")
            for hub in (tmp / "official").iterdir():
                (hub / "__init__.py").touch()
        else:
            fetch_official(tmp / "official", args.mirrors, official)
        job = dict(cases=all_cases, checkpoints=checkpoints, mask_id=MASK_ID)
        (tmp / "job.json").write_text(json.dumps(job))
        subprocess.run([args.official_python, str(HERE / runner), str(tmp / "official"),
                        str(tmp / "job.json"), str(tmp / "out.json")], check=True)
        results = json.loads((tmp / "out.json").read_text())
        versions = subprocess.run([args.official_python, "-c", "import torch, transformers; print(torch.__version__, "
                                   "transformers.__version__, torch.backends.cpu.get_cpu_capability())"],
                                  check=True, capture_output=True, text=True).stdout.split()
    about = ("Answers of LLaDA2.1's generate (token editing; official, fp32, SDPA) on its modeling code, tiny random "
             "checkpoints" if args.llada21 else
             "Answers of LLaDA2.0's generate (official, fp32, SDPA) on its official modeling code, tiny random "
             "checkpoints, with the first forward's logits and router choices")
    data = dict(
        about=about + "; written by tests/fidelity/make_llada2_expected.py",
        official={k: dict(repo=v["repo"], commit=v["commit"], files=sorted(v["files"].values()))
                  for k, v in official.items()},
        official_env=dict(torch=versions[0], transformers=versions[1], dtype="float32", attention="sdpa",
                          made_with_cpu_capability=versions[2]),
        models={str(seed): dict(config_of(seed), sharpen=SHARPEN) for seed in VARIANTS},
        cases=[dict(c, **results[c["id"]]) for c in all_cases])
    write_data(args.out or (OUT21 if args.llada21 else OUT), data)


if __name__ == "__main__":
    main()
