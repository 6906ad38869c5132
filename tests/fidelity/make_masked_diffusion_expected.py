"""Write ``tests/data/masked_diffusion_fidelity.json``: what LLaDA's and Dream's official samplers decode
on the tiny checkpoints of ``masked_diffusion_cases.py`` -- the expected tokens of
``tests/clover_engine/test_masked_diffusion_fidelity.py``.

Steps: (a) the tiny checkpoints are written with the project's own code in the hub layout (this
script runs under the project's virtualenv); (b) the official code is fetched at the pinned commits of
`OFFICIAL` -- from GitHub, or from local git mirrors with ``--mirrors DIR`` (``DIR/<owner>+<name>/repo``)
-- into a temporary folder and run by ``run_official_masked_diffusion.py`` in a SEPARATE virtualenv
(``--official-python``; it needs transformers 4.53: ``python -m venv /tmp/official-venv &&
/tmp/official-venv/bin/pip install --find-links /opt/wheels torch==2.13.0 'transformers==4.53.*' safetensors numpy``);
(c) the answer canvases are written as JSON. No official source file enters the repository.

Usage: ``.venv/bin/python tests/fidelity/make_masked_diffusion_expected.py --official-python /tmp/official-venv/bin/python``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from masked_diffusion_cases import MASK_ID, SHARPEN, TINY, build_checkpoint, cases  # noqa: E402

OUT = HERE.parent / "data" / "masked_diffusion_fidelity.json"

OFFICIAL = {
    "llada_sampler": dict(repo="ML-GSAI/LLaDA", commit="b7e6c3565f194352da44b38dd12b6970597309f3",
                          files={"generate.py": "generate.py"}),
    # the hub files of GSAI-ML/LLaDA-8B-Instruct and Dream-org/Dream-v0-Instruct-7B are not on GitHub
    # unmodified; the dllm library vendors them (its Dream _sample / sample_tokens read as the hub's; its
    # edits of the model files touch padding masks and attention-class selection, not the unmasked
    # bidirectional forward these cases run)
    "hub_files": dict(repo="ZHZisZZ/dllm-trainer", commit="25bfd3c1223f42dfea1245f45d247923cd756cb0", files={
        "llada_hub/modeling_llada.py": "dllm/pipelines/llada/models/modeling_llada.py",
        "llada_hub/configuration_llada.py": "dllm/pipelines/llada/models/configuration_llada.py",
        "dream_hub/modeling_dream.py": "dllm/pipelines/dream/models/modeling_dream.py",
        "dream_hub/configuration_dream.py": "dllm/pipelines/dream/models/configuration_dream.py",
        "dream_hub/generation_utils.py": "dllm/pipelines/dream/models/generation_utils.py",
    }),
}


def fetch_official(dest: Path, mirrors: Path | None, official: dict | None = None) -> None:
    """Put every file of ``official`` (default `OFFICIAL`) under ``dest`` (packages get an ``__init__.py``)."""
    for spec in (official or OFFICIAL).values():
        for local, remote in spec["files"].items():
            target = dest / local
            target.parent.mkdir(parents=True, exist_ok=True)
            if mirrors is not None:
                git_dir = mirrors / spec["repo"].replace("/", "+") / "repo"
                text = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{spec['commit']}:{remote}"],
                                      check=True, capture_output=True, text=True).stdout
            else:
                url = f"https://raw.githubusercontent.com/{spec['repo']}/{spec['commit']}/{remote}"
                with urllib.request.urlopen(url, timeout=60) as r:
                    text = r.read().decode()
            target.write_text(text)
            if target.parent != dest:
                (target.parent / "__init__.py").touch()


def write_data(path: Path, data: dict) -> None:
    """Write ``data`` as JSON with one line per entry of its ``cases`` (diffs stay readable)."""
    n = len(data["cases"])
    cases_text = ",\n  ".join(json.dumps(c) for c in data.pop("cases"))
    head = json.dumps(data, indent=1)[:-2]
    path.write_text(f'{head},\n "cases": [\n  {cases_text}\n ]\n}}\n')
    print(f"wrote {n} cases to {path}")


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
        for family in ("llada", "dream"):
            for seed in sorted({c["seed"] for c in all_cases}):
                checkpoints[f"{family}-{seed}"] = str(build_checkpoint(family, seed, tmp / f"{family}-{seed}"))
        fetch_official(tmp / "official", args.mirrors)
        job = dict(cases=all_cases, checkpoints=checkpoints, mask_id=MASK_ID)
        (tmp / "job.json").write_text(json.dumps(job))
        subprocess.run([args.official_python, str(HERE / "run_official_masked_diffusion.py"), str(tmp / "official"),
                        str(tmp / "job.json"), str(tmp / "out.json")], check=True)
        results = json.loads((tmp / "out.json").read_text())
        versions = subprocess.run([args.official_python, "-c", "import torch, transformers; "
                                   "print(torch.__version__, transformers.__version__)"],
                                  check=True, capture_output=True, text=True).stdout.split()
    data = dict(
        about="Answer canvases of LLaDA's generate and Dream's diffusion_generate (official code) on tiny random "
              "checkpoints; written by tests/fidelity/make_masked_diffusion_expected.py",
        official={k: dict(repo=v["repo"], commit=v["commit"], files=sorted(v["files"].values()))
                  for k, v in OFFICIAL.items()},
        official_env=dict(torch=versions[0], transformers=versions[1]),
        model=dict(TINY, mask_token_id=MASK_ID, sharpen=SHARPEN),
        cases=[dict(c, **results[c["id"]]) for c in all_cases])
    write_data(args.out, data)


if __name__ == "__main__":
    main()
