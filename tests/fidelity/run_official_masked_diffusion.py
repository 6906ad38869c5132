"""Run LLaDA's and Dream's official samplers on the fidelity cases (a helper of
``make_masked_diffusion_expected.py``, run by it in a separate virtualenv with the official code's
transformers 4.53; it imports nothing of this project).

Usage: ``python run_official_masked_diffusion.py OFFICIAL_DIR JOB_JSON OUT_JSON``. ``OFFICIAL_DIR``
holds the fetched official files: ``generate.py`` (LLaDA's sampler), ``llada_hub/`` (the LLaDA hub
model files) and ``dream_hub/`` (the Dream hub model and generation files). ``JOB_JSON`` lists the
cases and the checkpoint directory of each (family, seed). Every case's answer canvas (the tokens after
the prompt) is written to ``OUT_JSON``, with the first forward's argmax and max logit per canvas slot.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

# LLaDA-8B's config.json values of the fields the project's checkpoint writer leaves to their defaults
# (the official ModelConfig's defaults differ: rope off, dropout 0.1, ...)
LLADA_8B_FIELDS = dict(rope=True, rope_full_precision=True, alibi=False, flash_attention=False, attention_dropout=0.0,
                       residual_dropout=0.0, embedding_dropout=0.0, input_emb_norm=False, attention_layer_norm=False,
                       layer_norm_with_affine=True, bias_for_layer_norm=False, scale_logits=False,
                       block_group_size=1, multi_query_attention=None, init_device="cpu", mlp_ratio=4)


def load_llada(directory: Path):
    from llada_hub.configuration_llada import LLaDAConfig
    from llada_hub.modeling_llada import LLaDAModelLM
    from safetensors.torch import load_file

    data = json.loads((directory / "config.json").read_text())
    for key in ("architectures", "model_type"):
        data.pop(key, None)
    data.update(LLADA_8B_FIELDS)
    model = LLaDAModelLM(LLaDAConfig(**data), init_params=False)
    model.load_state_dict(load_file(str(directory / "model.safetensors")), strict=True)
    return model.float().eval()


def hub_config_data(directory: Path) -> dict:
    """``directory/config.json`` as a 4.x-era config class takes it: ``rope_theta`` at the top level (transformers
    5 writes ``rope_parameters``), without the keys that name the class or the library."""
    data = json.loads((directory / "config.json").read_text())
    rope = data.pop("rope_parameters", None) or {}
    data.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    for key in ("architectures", "model_type", "auto_map", "transformers_version", "torch_dtype", "dtype",
                "layer_types"):
        data.pop(key, None)
    return data


def load_dream(directory: Path):
    from dream_hub.configuration_dream import DreamConfig
    from dream_hub.modeling_dream import DreamModel
    from safetensors.torch import load_file

    cfg = DreamConfig(**hub_config_data(directory))
    cfg._attn_implementation = "sdpa"
    model = DreamModel(cfg)
    missing, unexpected = model.load_state_dict(load_file(str(directory / "model.safetensors")), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return model.float().eval()


def main(official_dir: str, job_path: str, out_path: str) -> None:
    sys.path.insert(0, official_dir)
    import generate as llada_generate  # LLaDA's generate.py

    torch.set_num_threads(1)
    job = json.loads(Path(job_path).read_text())
    models = {}
    results = {}
    for case in job["cases"]:
        key = f"{case['family']}-{case['seed']}"
        if key not in models:
            d = Path(job["checkpoints"][key])
            models[key] = load_llada(d) if case["family"] == "llada" else load_dream(d)
        model = models[key]
        prompt = torch.tensor([case["prompt"]], dtype=torch.long)
        s = dict(case["sampler"])
        seed = s.pop("seed", None)
        if seed is not None:
            torch.manual_seed(seed)
        with torch.no_grad():
            if case["family"] == "llada":
                x = llada_generate.generate(model, prompt, mask_id=job["mask_id"], **s)
                first = model(torch.cat([prompt, torch.full((1, s["gen_length"]), job["mask_id"])], 1)).logits
                first = first[0, prompt.shape[1]:]
            else:
                # Dream's diffusion_generate builds its settings from the MODEL config when given none, whose
                # transformers 4.x defaults are temperature 1.0 / top_k 50 / top_p 1.0 (it would sample): the
                # DreamGenerationConfig defaults (greedy) are passed explicitly
                for key, default in (("temperature", 0.0), ("top_p", None), ("top_k", None)):
                    s.setdefault(key, default)
                out = model.diffusion_generate(prompt, output_history=False, return_dict_in_generate=True,
                                               mask_token_id=job["mask_id"], **s)
                x = out.sequences
                full = torch.cat([prompt, torch.full((1, s["max_new_tokens"]), job["mask_id"])], 1)
                logits = model(full, "full", None).logits
                first = torch.cat([logits[:, :1], logits[:, :-1]], 1)[0, prompt.shape[1]:]
        results[case["id"]] = dict(canvas=x[0, prompt.shape[1]:].tolist(), first_argmax=first.argmax(-1).tolist(),
                                   first_max=[round(float(v), 5) for v in first.max(-1).values])
        print(case["id"], "done", flush=True)
    Path(out_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:4])
