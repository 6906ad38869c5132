"""The trainable model of the causal-LM adaptation (training wing): a tiny random base for tests
(`tiny_lm`), the LoRA wrapping (`make_trainable`), and the adapter directory a run writes and a
new stage starts from (`save_adapter`, `load_adapter_weights`). peft and transformers are imported
inside the functions that use them (optional heavy dependencies, the ``smollm2`` extra). The recipe
is described in `clover_engine.training.causal_lm`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from clover_engine.backbones.causal_lm.adapter import ADAPTER_MODEL_TYPE, BASES, MASK_EMBEDDING
from clover_engine.backbones.causal_lm.model import HFBlockDiffusionModel

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny_lm(vocab: int = 320, seed: int = 0):
    """A tiny random LlamaForCausalLM (tests; the CPU path of the GPU script)."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   eos_token_id=2, bos_token_id=1, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg)


def make_trainable(lm, r: int, alpha: int, mask_id: int, full: bool = False):
    """Wrap ``lm`` in a peft LoRA and return (peft model, mask_embedding parameter initialised from MASK's row).

    ``full``: no LoRA -- every weight of ``lm`` trains (full fine-tuning; returned as is)."""
    from peft import LoraConfig, get_peft_model

    mask_init = lm.get_input_embeddings().weight[mask_id].detach().clone()
    if full:
        for p in lm.parameters():
            p.requires_grad_(True)
        return lm, mask_init
    for p in lm.parameters():
        p.requires_grad_(False)
    plm = get_peft_model(lm, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(LORA_TARGETS),
                                        bias="none", task_type="CAUSAL_LM"))
    return plm, mask_init


def load_adapter_weights(plm, directory: Path) -> torch.Tensor:
    """Copy a saved adapter's LoRA weights (``adapter_model.safetensors``) into the peft model
    ``plm`` and return its MASK embedding [hidden] fp32 -- a new stage starts from a shipped adapter.

    Raises:
        ValueError: the directory lacks the adapter files, or its LoRA rank / targets differ
            from ``plm``'s (pass the same ``--lora-r``).
    """
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    files = [directory / "adapter_model.safetensors", directory / MASK_EMBEDDING]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"--init-adapter {directory}: missing {missing}; give a directory written by this trainer")
    sd = {k: v.float() for k, v in load_file(str(files[0])).items()}
    own = {k: v.shape for k, v in get_peft_model_state_dict(plm).items()}
    bad = [k for k, v in sd.items() if k not in own or own[k] != v.shape]
    if bad or len(sd) != len(own):
        raise ValueError(f"--init-adapter {directory}: its LoRA tensors do not match this model's "
                         f"({len(bad)} differ, e.g. {bad[:2]}); use the adapter's own --lora-r")
    set_peft_model_state_dict(plm, sd)
    return load_file(str(files[1]))["mask_embedding"].float()


def save_adapter(model: HFBlockDiffusionModel, out: Path, base_name: str, extra: dict) -> None:
    """Write the loadable adapter directory (config.json, peft adapter in bf16, MASK embedding)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    plm = model.lm
    plm.peft_config["default"].save_pretrained(str(out))  # adapter_config.json only (no README of its own)
    sd = get_peft_model_state_dict(plm)
    save_file({k: v.detach().to(torch.bfloat16).contiguous() for k, v in sd.items()},
              str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    save_file({"mask_embedding": model.mask_embedding.detach().float().cpu().contiguous()},
              str(out / MASK_EMBEDDING), metadata={"format": "pt"})
    if base_name not in BASES:  # a base saved beside the adapter (the tiny test base): base_path
        base_dir = out / "base"
        if not (base_dir / "config.json").is_file():
            _save_base_copy(plm, base_dir)
        extra = {**extra, "base_path": "base"}
    cfg = {"model_type": ADAPTER_MODEL_TYPE, "name": out.name, "base": base_name,
           "mask_token_id": model.config.mask_token_id, "chat_format": "chatml", **extra}
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _save_base_copy(plm, base_dir: Path) -> None:
    """Save the frozen base weights of a peft model (LoRA layers unwrapped) -- tiny test bases only."""
    from safetensors.torch import save_file

    base_dir.mkdir(parents=True, exist_ok=True)
    sd = {}
    for k, v in plm.get_base_model().state_dict().items():
        if "lora_" in k:
            continue
        sd[k.replace(".base_layer.", ".")] = v.detach().contiguous()
    cfg = plm.get_base_model().config
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    cfg.save_pretrained(str(base_dir))
    save_file(sd, str(base_dir / "model.safetensors"), metadata={"format": "pt"})

