"""The public families opened from their **published** small files, by hub id, offline.

For each model, `tests/data/hub_configs/<org>--<name>/` holds the real ``config.json`` and, where found, the
real ``generation_config.json``, ``tokenizer_config.json`` (chat template included), ``special_tokens_map.json``
and ``added_tokens.json`` -- copied byte for byte from public repositories that keep them (each file's repo,
commit and path in ``SOURCES.json``; where a model's own files were not found, a sibling's are used and the
note there says which). A test writes a hub-layout snapshot from them into a temporary huggingface_hub cache:

* ``config.json`` as published but for its size: 2 layers and a hidden size of 32 (heads, feed-forward and
  experts' widths cut to match); the vocabulary, the special ids, the model type, RoPE, the MoE routing
  (experts, groups, top-k) and every other field stay as published;
* random weights of that shape (the project's own classes build the model from the patched config);
* a **stand-in** ``tokenizer.json`` (the published one, several MB, is not shipped): byte-level BPE whose added
  tokens are the published ones at their published ids (``added_tokens_decoder``), so the MASK, end-of-text and
  chat tokens keep their ids.

Then, by hub id with ``HF_HUB_OFFLINE=1``: the MASK id and the end ids are the published ones; the project's
chat prompt equals transformers' ``apply_chat_template`` on the same folder; and the CLI decodes with the
family's own sampler.

LLaDA-MoE-7B-A1B is not here: no public copy of its small files was found (its fidelity and loading tests use a
tiny checkpoint written by the project). Run: ``.venv/bin/python -m pytest -q tests/clover_engine/test_real_hub_configs.py``
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.clover_engine.test_hub import hub_env, put_in_cache  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "hub_configs"
SOURCES = json.loads((DATA / "SOURCES.json").read_text())
REV = "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed"
QUESTION = "What is 12 * 7?"

MODELS = {
    # hub id: (folder of the config, folder of the tokenizer files, family, published MASK id, CLI sampler flags)
    "GSAI-ML/LLaDA-8B-Instruct": ("GSAI-ML--LLaDA-8B-Instruct", None, "llada", 126336,
                                  ["--sampler", "llada", "--steps", "32"]),
    "Dream-org/Dream-v0-Instruct-7B": ("Dream-org--Dream-v0-Instruct-7B", None, "dream", 151666,
                                       ["--sampler", "dream", "--steps", "32"]),
    "Efficient-Large-Model/Fast_dLLM_v2_1.5B": ("Efficient-Large-Model--Fast_dLLM_v2_1.5B",
                                                "Efficient-Large-Model--Fast_dLLM_v2_7B", "fast_dllm_v2", 151665,
                                                ["--sampler", "fast_dllm_v2"]),
    "JetLM/SDAR-1.7B-Chat": ("JetLM--SDAR-1.7B-Chat", None, "sdar", 151669, ["--sampler", "sdar", "--top-k", "1"]),
    "inclusionAI/LLaDA2.0-mini": ("inclusionAI--LLaDA2.0-mini", "inclusionAI--LLaDA2.0-mini-preview", "llada2", 156895,
                                  ["--sampler", "llada2"]),
}
"""The published MASK ids: LLaDA's ``generate(mask_id=126336)``, Dream's ``mask_token_id`` 151666, Fast-dLLM v2's
``generate(mask_id=151665)``, SDAR's ``<|MASK|>`` 151669 (``added_tokens.json``), LLaDA2.0's
``generate(mask_id=156895)`` -- each also the id of the MASK text in the published tokenizer files where present."""

LLADA2_SPECIALS = {156892: "<|endoftext|>", 156895: "<|mask|>"}
"""LLaDA2.0's special ids its config / ``generate`` publish (its tokenizer_config names no ids)."""


def _tiny(config: dict, family: str) -> dict:
    """The published config with 2 layers, hidden 32 and the widths cut to match; all else as published."""
    c = dict(config)
    if family == "llada":
        c.update(d_model=32, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=64)
        return c
    c.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=min(2, c.get("num_key_value_heads", 2)))
    if "head_dim" in c:
        c["head_dim"] = 8
    if "max_window_layers" in c:
        c["max_window_layers"] = 2
    if isinstance(c.get("layer_types"), list):
        c["layer_types"] = c["layer_types"][:2]
    if family == "llada2":
        c.update(moe_intermediate_size=16, rotary_dim=int(8 * c.get("partial_rotary_factor", 1.0)))
    return c


def _weights(d: Path, config: dict, family: str, mask_id: int) -> dict[str, bytes]:
    """Random weights of the patched config's shape, built by the project's own classes; -> {file: bytes}."""
    torch.manual_seed(0)
    if family == "llada2":
        from clover_engine.backbones.llada2_moe import LLaDA2Arch, LLaDA2LM, save_llada2_moe
        from clover_engine.backbones.llada_moe import fill_random

        lm = LLaDA2LM(LLaDA2Arch.from_config(config))
        fill_random(lm, 0, 10.0)
        save_llada2_moe(lm.eval(), d, config)
    elif family in ("llada", "dream"):
        from clover_engine.backbones.masked_diffusion import _dream_config, _llada_config, save_masked_diffusion

        if family == "llada":
            lm = transformers.LlamaForCausalLM(_llada_config(config, d))
        else:
            lm = transformers.Qwen2ForCausalLM(_dream_config(config))
        save_masked_diffusion(lm.eval(), d, family, mask_id)
    else:
        from clover_engine.backbones.block_causal import save_block_causal

        skip = {"model_type", "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype"}
        kwargs = {k: v for k, v in config.items() if k not in skip}
        cls, cfg = ((transformers.Qwen2ForCausalLM, transformers.Qwen2Config) if family == "fast_dllm_v2"
                    else (transformers.Qwen3ForCausalLM, transformers.Qwen3Config))
        lm = cls(cfg(**kwargs))
        save_block_causal(lm.eval(), d, "Fast_dLLM_Qwen" if family == "fast_dllm_v2" else "SDAR", mask_id)
    return {"model.safetensors": (d / "model.safetensors").read_bytes()}


def _stand_in_tokenizer(specials: dict[int, str]) -> bytes:
    """A byte-level BPE ``tokenizer.json`` (the 256 bytes at ids 0..255) with ``specials`` as added special
    tokens at their given ids (in the BPE vocabulary at those ids too: ``tokenizers`` renumbers an added token
    its model's vocabulary lacks)."""
    from clover_engine.tokenizer import byte_tokenizer

    data = json.loads(byte_tokenizer().to_str())
    data["model"]["vocab"].update({t: int(i) for i, t in specials.items()})  # the model's own ids for them
    data["added_tokens"] = [dict(id=int(i), content=t, single_word=False, lstrip=False, rstrip=False, normalized=False,
                                 special=True) for i, t in sorted(specials.items())]
    return json.dumps(data).encode()


def _published_specials(tok_dir: Path, family: str) -> dict[int, str]:
    specials = {}
    cfg = tok_dir / "tokenizer_config.json"
    if cfg.is_file():
        for i, t in json.loads(cfg.read_text()).get("added_tokens_decoder", {}).items():
            specials[int(i)] = t["content"]
    added = tok_dir / "added_tokens.json"
    if added.is_file():
        specials.update({int(i): t for t, i in json.loads(added.read_text()).items()})
    if family == "llada2":
        specials.update(LLADA2_SPECIALS)
    return specials


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """``HF_HOME`` with one snapshot per model; -> (hf_home, {hub id: snapshot folder})."""
    tmp = tmp_path_factory.mktemp("real-hub")
    hf_home, snapshots = tmp / "hf", {}
    for repo_id, (cfg_dir, tok_dir, family, mask_id, _) in MODELS.items():
        src, tok_src = DATA / cfg_dir, DATA / (tok_dir or cfg_dir)
        config = _tiny(json.loads((src / "config.json").read_text()), family)
        files = _weights(tmp / cfg_dir, config, family, mask_id)
        files["config.json"] = json.dumps(config, indent=2).encode()  # the published fields, 2 layers, hidden 32
        for name in ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
                     "added_tokens.json", "chat_template.jinja"):
            if (tok_src / name).is_file():
                files[name] = (tok_src / name).read_bytes()
        files["tokenizer.json"] = _stand_in_tokenizer(_published_specials(tok_src, family))
        snapshots[repo_id] = put_in_cache(hf_home, repo_id, REV, files, ("main",))
    return hf_home, snapshots


def test_every_file_has_its_source():
    for repo_id, (cfg_dir, tok_dir, *_rest) in MODELS.items():
        for folder in {cfg_dir, tok_dir or cfg_dir}:
            model = folder.replace("--", "/")
            files = sorted(p.name for p in (DATA / folder).iterdir())
            assert files and set(files) <= set(SOURCES[model]), (model, files)
            for name in files:
                src = SOURCES[model][name]
                assert src["repo"].count("/") == 1 and len(src["commit"]) == 40 and src["path"].endswith(name), src


CHILD = r"""
import json, sys
import transformers
from clover_engine.checkpoint import load_model, load_tokenizer
from clover_engine.prompting import CheckpointChatTemplate

repo_id, snapshot, mask_text, question = sys.argv[1:5]
model, tok = load_model(repo_id), load_tokenizer(repo_id)
chat = CheckpointChatTemplate.from_directory(snapshot)
hf = transformers.PreTrainedTokenizerFast.from_pretrained(snapshot)
msgs = [{"role": "user", "content": question}]
print(json.dumps(dict(family=model.config.family, vocab=model.config.vocab_size, mask=model.config.mask_token_id,
                      eos=model.config.eos_token_id, tok_mask=tok.token_to_id(mask_text),
                      ours=None if chat is None else chat.render(question),
                      theirs=hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))))
"""


@pytest.mark.parametrize("repo_id", list(MODELS))
def test_opens_by_hub_id_with_the_published_ids_and_chat_template(hub, repo_id):
    # in a child process: huggingface_hub reads HF_HOME / HF_HUB_OFFLINE when imported
    hf_home, snapshots = hub
    cfg_dir, tok_dir, family, mask_id, _ = MODELS[repo_id]
    snapshot = snapshots[repo_id]
    specials = _published_specials(DATA / (tok_dir or cfg_dir), family)
    assert "mask" in specials[mask_id].lower()  # the published tokenizer files name the MASK at the published id
    proc = subprocess.run([sys.executable, "-c", CHILD, repo_id, str(snapshot), specials[mask_id], QUESTION],
                          capture_output=True, text=True, env=hub_env(hf_home), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    published = json.loads((DATA / cfg_dir / "config.json").read_text())
    assert got["family"] == family and got["vocab"] == published["vocab_size"]
    assert got["mask"] == mask_id and got["tok_mask"] == mask_id
    # the end id: one the model publishes as an end (generation_config's eos list, else config.json's eos)
    gen = snapshot / "generation_config.json"
    ends = json.loads(gen.read_text()).get("eos_token_id") if gen.is_file() else None
    ends = ends if ends is not None else published["eos_token_id"]
    ends = ends if isinstance(ends, list) else [ends]
    assert got["eos"] in ends, (got["eos"], ends)
    # the chat prompt: the checkpoint's own template, rendered as transformers renders it
    assert got["ours"] is not None and got["ours"] == got["theirs"], (got["ours"], got["theirs"])


@pytest.mark.parametrize("repo_id", list(MODELS))
def test_the_cli_decodes_it_with_its_own_sampler(hub, repo_id, tmp_path):
    hf_home, _ = hub
    *_, flags = MODELS[repo_id]
    proc = subprocess.run([sys.executable, "-m", "clover_engine.generate", "--model", repo_id, "--prompt", QUESTION,
                           "--max-new-tokens", "32", "--threads", "1", *flags],
                          capture_output=True, text=True, env=hub_env(hf_home), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"model={repo_id}" in proc.stdout or repo_id in proc.stdout, proc.stdout[-2000:]
    assert "NFE=" in proc.stdout and "tokens=" in proc.stdout, proc.stdout[-2000:]
