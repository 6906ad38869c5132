"""Run Fast-dLLM v2's and SDAR's official code on the fidelity cases (a helper of
``make_block_diffusion_expected.py``, run by it in a separate virtualenv with the official code's
transformers 4.53; it imports nothing of this project).

Usage: ``python run_official_block_diffusion.py OFFICIAL_DIR JOB_JSON OUT_JSON``. ``OFFICIAL_DIR`` holds the
fetched official files: ``sdar_hub/`` (SDAR's modeling / configuration files), ``sdar_generate.py`` (SDAR's
``generate.py``), ``transformers_modelling/`` (the Fast-dLLM v2 hub modeling / configuration files). Every case's
answer (the tokens after the prompt, as the original returns them) is written to ``OUT_JSON``, with the
logits of one cached block step (the first denoising forward after the prompt's prefill) for the logits check.

SDAR's modeling file imports ``flash_attn`` kernels (CUDA only) for two operations; on this CPU run they are
replaced by ``CPU_FLASH_ATTN``, the same two operations in plain torch (an RMSNorm and non-causal attention
with grouped-query heads) -- the only change to the official code's path, stated in the data file.
"""

from __future__ import annotations

import json
import math
import signal
import sys
from pathlib import Path

import torch
from run_official_masked_diffusion import hub_config_data  # this folder's other runner (no project import)

CPU_FLASH_ATTN = {
    "flash_attn/__init__.py": '''
import torch
import torch.nn.functional as F


def flash_attn_func(q, k, v, causal=False, softmax_scale=None, **kwargs):
    """q [B, L, H, D], k / v [B, S, Hk, D] -> [B, L, H, D]: softmax(q k^T * scale) v, Hk heads shared."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=softmax_scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(1, 2)
''',
    "flash_attn/ops/__init__.py": "",
    "flash_attn/ops/triton/__init__.py": "",
    "flash_attn/ops/triton/layer_norm.py": '''
import torch


def rms_norm_fn(x, weight, bias=None, residual=None, eps=1e-6, **kwargs):
    """weight * x / sqrt(mean(x^2) + eps), computed in fp32, returned in x's dtype."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = weight.float() * h
    if bias is not None:
        out = out + bias.float()
    return out.to(dtype)
''',
}


def _write_shim(official_dir: Path) -> None:
    for rel, text in CPU_FLASH_ATTN.items():
        path = official_dir / "cpu_shims" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    sys.path.insert(0, str(official_dir / "cpu_shims"))


def load_sdar(directory: Path):
    from safetensors.torch import load_file
    from sdar_hub.configuration_sdar import SDARConfig
    from sdar_hub.modeling_sdar import SDARForCausalLM

    cfg = SDARConfig(**hub_config_data(directory))
    cfg._attn_implementation = "sdpa"
    model = SDARForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(load_file(str(directory / "model.safetensors")), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return model.float().eval()


def load_fast_dllm(directory: Path):
    from transformers_modelling.fast_dllm_qwen_2_5_config import Fast_dLLM_QwenConfig
    from transformers_modelling.qwen_2_5_modelling import Fast_dLLM_QwenForCausalLM
    from safetensors.torch import load_file

    data = hub_config_data(directory)
    cfg = Fast_dLLM_QwenConfig(**data)
    cfg._attn_implementation = "sdpa"
    model = Fast_dLLM_QwenForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(load_file(str(directory / "model.safetensors")), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return model.float().eval()


def _first_block_logits_sdar(model, prompt: torch.Tensor, block: int, mask_id: int) -> torch.Tensor:
    """The logits of the first denoising forward of SDAR's loop (prefill, then the first block)."""
    from transformers.cache_utils import DynamicCache

    P = prompt.shape[1]
    cache = DynamicCache()
    pre = P // block * block
    nb = (P + block - 1) // block * block if P % block else P + block
    total = torch.full((1, nb), mask_id)
    total[:, :P] = prompt
    if pre:
        blocks = torch.tril(torch.ones(pre // block, pre // block))
        mask = blocks.repeat_interleave(block, 0).repeat_interleave(block, 1).unsqueeze(0)
        model(total[:, :pre], attention_mask=mask, position_ids=torch.arange(pre)[None], past_key_values=cache,
              use_cache=True, store_kv=True)
    cur = total[:, pre:pre + block]
    mask = torch.ones(1, block, pre + block)
    return model(cur, attention_mask=mask, position_ids=torch.arange(pre, pre + block)[None], past_key_values=cache,
                 use_cache=True, store_kv=False).logits[0]


def _first_block_logits_fast_dllm(model, prompt: torch.Tensor, block: int, mask_id: int) -> torch.Tensor:
    """The raw logits (before generate's shift) of a denoising forward of the block after the prompt's prefill."""
    P = prompt.shape[1]
    pre = P // block * block
    cache = None
    if pre:
        cache = model(input_ids=prompt[:, :pre], use_cache=True, update_past_key_values=True,
                      block_size=block).past_key_values
    cur = torch.full((1, block), mask_id)
    cur[0, : P - pre] = prompt[0, pre:]
    return model(input_ids=cur, use_cache=True, past_key_values=cache, update_past_key_values=False,
                 block_size=block).logits[0]


HANG_S = 60
"""A case the official code has not finished after this many seconds is recorded as ``hangs`` (Fast-dLLM v2's
generate repeats a forward for ever when every slot it writes takes the MASK id)."""


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def main(official_dir: str, job_path: str, out_path: str) -> None:
    official = Path(official_dir)
    _write_shim(official)
    sys.path.insert(0, official_dir)
    torch.set_num_threads(1)
    job = json.loads(Path(job_path).read_text())
    models, results = {}, {}
    for case in job["cases"]:
        family = case["family"]
        if family not in job["families"]:
            continue
        key = f"{family}-{case['seed']}"
        if key not in models:
            d = Path(job["checkpoints"][key])
            models[key] = load_sdar(d) if family == "sdar" else load_fast_dllm(d)
        model = models[key]
        prompt = torch.tensor([case["prompt"]], dtype=torch.long)
        s = dict(case["sampler"])
        seed = s.pop("seed", None)
        if seed is not None:
            torch.manual_seed(seed)
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(HANG_S)
        try:
            rec = _run_case(model, family, prompt, s, job["mask_id"])
        except _Hang:
            rec = dict(canvas=None, hangs=True)
        finally:
            signal.alarm(0)
        results[case["id"]] = rec
        print(case["id"], "hangs" if rec.get("hangs") else "done", flush=True)
    Path(out_path).write_text(json.dumps(results))


def _run_case(model, family: str, prompt: torch.Tensor, s: dict, mask_id: int) -> dict:
    """One case through the official sampler: its answer and the logits of a cached block step."""
    with torch.no_grad():
        if family == "sdar":
            import sdar_generate

            stop = s.pop("stop_token_ids")
            x = sdar_generate.block_diffusion_generate(model, {"input_ids": prompt}, mask_id,
                                                       stopping_criteria_idx=stop, **s)
            logits = _first_block_logits_sdar(model, prompt, s["block_length"], mask_id)
        else:
            stop = s.pop("stop_token")
            x = model.generate(prompt, mask_id=mask_id, stop_token=stop, **s)
            logits = _first_block_logits_fast_dllm(model, prompt, s["block_size"], mask_id)
    rec = dict(canvas=x[0, prompt.shape[1]:].tolist())
    rec["step_logits"] = [[round(float(v), 6) for v in row] for row in logits[:, :64]]
    rec["step_logits_max_abs"] = round(float(logits.abs().max()), 6)
    assert math.isfinite(rec["step_logits_max_abs"])
    return rec


if __name__ == "__main__":
    main(*sys.argv[1:4])
