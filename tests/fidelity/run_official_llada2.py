"""Run LLaDA2.0's official ``generate`` on its official modeling code for the LLaDA2.0 fidelity cases (a helper of
``make_llada2_expected.py``, run by it in a separate virtualenv with transformers 4.53; it imports nothing of
this project).

Usage: ``python run_official_llada2.py OFFICIAL_DIR JOB_JSON OUT_JSON``. ``OFFICIAL_DIR`` holds ``llada2_hub/``
(``modeling_llada2_moe.py`` and ``configuration_llada2_moe.py``). Each checkpoint is opened with the modeling
file's ``LLaDA2MoeModelLM.from_pretrained`` in **fp32** with SDPA attention. Sampled cases call
``torch.manual_seed(seed)`` first.

Why fp32, and the one patch of the harness (the official files are run unmodified): the model card runs bf16,
but on these tiny random checkpoints the routers' score gaps (1.9e-4 to 1.2e-2) are the size of one bf16
rounding, so a bf16 answer depends on the CPU's kernel set -- the official code disagreed with itself between
``ATEN_CPU_CAPABILITY=default`` and AVX2/AVX-512 in most cases. In fp32 it agrees with itself on every kernel set.
``generate`` builds its block-diffusion mask as a bf16 0 / -inf tensor, which SDPA accepts only with bf16
queries; `fp32_masks` wraps the model's ``forward`` (``generate`` calls ``self.forward``) so that a floating
mask is cast to the model's dtype first. The cast is exact (0 and -inf are exact in every float dtype), so
the official ``generate`` and forward run as written. (With the eager attention of transformers 4.53,
``_prepare_4d_causal_attention_mask`` turns that 0 / -inf mask into the dtype's minimum everywhere, so every
key would be seen: SDPA it is.)

For every case the answer after the prompt is written to ``OUT_JSON``, with the first denoising forward --
the prompt's whole blocks and the first block, all MASK after the prompt, under ``generate``'s block mask --
its argmax and max logit per slot of that block, and the experts each MoE layer's router chose for every
token of it (``output_router_logits``: the modeling file returns the top-k indices beside the logits).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def fp32_masks(model):
    """``model`` with its ``forward`` casting a floating ``attention_mask`` to the model's dtype (an exact cast of
    ``generate``'s bf16 0 / -inf block mask, which SDPA refuses beside fp32 queries); returns ``model``."""
    forward = model.forward

    def cast(*args, attention_mask=None, **kwargs):
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.to(model.dtype)
        return forward(*args, attention_mask=attention_mask, **kwargs)

    model.forward = cast
    return model


def first_forward(model, prompt: torch.Tensor, block_length: int, mask_id: int) -> tuple[torch.Tensor, list]:
    """The logits of the first block's slots and the routers' top-k over the whole window, as ``generate``'s
    first forward computes them."""
    P = prompt.shape[1]
    end = (P // block_length + 1) * block_length
    x = torch.full((1, end), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    blocks = end // block_length
    mask = torch.tril(torch.ones(blocks, blocks)).repeat_interleave(block_length, 0).repeat_interleave(block_length, 1)
    mask = torch.where(mask[None, None].bool(), 0.0, float("-inf")).to(model.dtype)
    out = model(x, attention_mask=mask, position_ids=torch.arange(end)[None], output_router_logits=True)
    return out.logits[0, -block_length:].float(), [topk[0].tolist() for _, topk in out.router_logits]


def main(official_dir: str, job_path: str, out_path: str) -> None:
    sys.path.insert(0, official_dir)
    from llada2_hub.modeling_llada2_moe import LLaDA2MoeModelLM

    torch.set_num_threads(1)
    job = json.loads(Path(job_path).read_text())
    models, results = {}, {}
    for case in job["cases"]:
        key = str(case["seed"])
        if key not in models:
            models[key] = fp32_masks(LLaDA2MoeModelLM.from_pretrained(
                job["checkpoints"][key], torch_dtype=torch.float32, attn_implementation="sdpa").eval())
        model = models[key]
        prompt = torch.tensor([case["prompt"]], dtype=torch.long)
        s = dict(case["sampler"])
        (eos_id,) = s.pop("stop_token_ids")
        seed = s.pop("seed", None)
        if seed is not None:
            torch.manual_seed(seed)
        with torch.no_grad():
            x = model.generate(prompt, eos_id=eos_id, mask_id=job["mask_id"], **s)
            logits, router = first_forward(model, prompt, s["block_length"], job["mask_id"])
        results[case["id"]] = dict(canvas=x[0, prompt.shape[1]:].tolist(), first_argmax=logits.argmax(-1).tolist(),
                                   first_max=[float(v) for v in logits.max(-1).values], first_router=router)
        print(case["id"], "done", flush=True)
    Path(out_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:4])
