"""Open any checkpoint directory the engine decodes: the format dispatch, the tokenizer, the
default memory mode, and the ``python -m clover_engine.checkpoint`` command line.

Wing ``backbones`` (checkpoint dispatch). `load_model` opens every format the engine decodes, chosen
by ``config.json``'s ``model_type`` (`model_format`, `supported_formats`) through the backbone
registry (`clover_engine.backbones.registry`: one ``"module:loader"`` row per model type, imported when
used): Clover checkpoints (`clover_engine.backbones.clover.weights.load_clover`, which documents the
directory layout), ``hf-block-diffusion`` adapter directories, plain transformers Llama / Qwen2 /
Qwen3 directories, Dream / LLaDA and DiffusionGemma. A transformers
Qwen3.5-MoE directory is refused with the ``python -m clover_engine.convert`` command that turns it
into a Clover checkpoint. A model may also be named by its hub id, ``org/name[@revision]``
(`clover_engine.backbones.hub`): `load_model` and `load_tokenizer` then read its snapshot in the
huggingface_hub cache, downloading it first; a local path of the same shape wins.

Re-exported here as the public API: `save_model`, `load_weights` (from
`clover_engine.backbones.clover.weights`), `DEFAULT_MODEL_DIR`, `bundled_models_dir`, `find_model_dir` (a
``--model`` that names a bundled model, from any directory), `file_as_model_dir` and the file names
`CONFIG_NAME`, `TOKENIZER_NAME` (from `clover_engine.backbones.checkpoint_dir`).

Command line (a random model of a preset, e.g. for tests and the README)::

    python -m clover_engine.checkpoint --init clover-test --out runs/clover-test [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer

from clover_engine.backbones.checkpoint_dir import (
    CONFIG_NAME,
    DEFAULT_MODEL_DIR,
    TOKENIZER_NAME,
    _checkpoint_dir,
    bundled_models_dir,
    file_as_model_dir,
    find_model_dir,
)
from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.backbones.clover.model import CloverModel
from clover_engine.backbones.clover.weights import load_weights, save_model
from clover_engine.backbones.hub import model_source
from clover_engine.backbones.registry import BUILD_LOCK, DESCRIPTIONS, MODEL_TYPES, loader_for
from clover_engine.threads import add_threads_argument, configure_threads
from clover_engine.tokenizer import byte_tokenizer

__all__ = [
    "CONFIG_NAME", "CONVERT_FIRST", "DEFAULT_MODEL_DIR", "MODEL_DTYPES", "TOKENIZER_NAME", "best_memory_mode",
    "bundled_models_dir", "file_as_model_dir", "find_model_dir", "load_model", "load_tokenizer", "load_weights", "main", "model_format", "save_model",
    "supported_formats",
]


def load_model(
    path_or_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
) -> torch.nn.Module:
    """Load any model format this engine decodes from a checkpoint directory.

    The format is read from ``config.json``'s ``model_type`` (`model_format`, `FORMATS`):

    * ``clover`` (or no ``model_type``): a Clover checkpoint. ``config.json`` is read into a
      `CloverConfig`, the model is built on the CPU, the weights are loaded with `load_weights`
      (strict; older names through `clover_engine.backbones.clover.weights.LEGACY_KEYS`), then moved
      to `device` / `dtype`.
    * ``hf-block-diffusion``: an adapter directory over a pinned transformers base
      (`clover_engine.backbones.causal_lm.adapter.load_adapter_model`).
    * ``llama`` / ``qwen2`` / ``qwen3``: a transformers ``save_pretrained`` directory, decoded as
      a block-diffusion model with token shift (`clover_engine.backbones.causal_lm.model.wrap_pretrained`).
    * ``Dream`` / ``llada``: a masked diffusion checkpoint, bidirectional with a full recompute
      per forward (`clover_engine.backbones.masked_diffusion.load_masked_diffusion`).
    * ``diffusion_gemma``: transformers' DiffusionGemma, an
      `clover_engine.backbones.diffusion_gemma.model.DiffusionGemmaModel` that runs its own revisable sampler
      (``capabilities.sampler == "diffusion_gemma"``).

    Whatever the format, the return value is a model; `clover_engine.decoding.decoder_for(model, tokenizer,
    config)` gives the decoder that drives it (`BlockDecoder`, or the model's own sampler's decoder),
    chosen by its declared `Capabilities`.

    A transformers Qwen3.5-MoE directory (``qwen3_5_moe``, ``qwen3_5_moe_text``) is refused with
    the command that converts it (`clover_engine.convert`). Weights are read from safetensors only.
    The model is returned in ``eval()`` mode with ``model.model_id`` set to the directory's name, or to
    the hub id for a hub model (traces record it).

    Args:
        path_or_dir: the checkpoint directory, or any file inside it
            (e.g. its ``config.json``); or a hub id ``org/name`` / ``org/name@revision``
            (`clover_engine.backbones.hub`: fetched into the huggingface_hub cache, ``HF_HOME`` and
            ``HF_HUB_OFFLINE`` honoured) when no local path of that name exists.
        device: where the model ends up (``"cpu"``, ``"cuda"``, ...).
        dtype: None keeps the dtypes the model is built with (stored weights are
            cast into them, as ``load_state_dict`` does); a floating dtype
            (``torch.bfloat16`` or ``"bfloat16"``) casts every floating-point
            parameter and buffer afterwards, as ``nn.Module.to(dtype)`` does.
            One of `MODEL_DTYPES` (float32, bfloat16, float16, float64); every
            one decodes, with the recurrent state, the logits and the
            confidences kept in fp32.

    Thread-safe: any number of threads may call it at once; models are built one at a time per
    process (`clover_engine.backbones.registry.BUILD_LOCK`), and a failed build leaves nothing behind
    that breaks the next.

    Returns:
        The loaded model.

    Raises:
        ValueError: the directory or its ``config.json`` is missing or invalid, its
            ``model_type`` is not a supported format (the message lists `FORMATS`, or gives the
            convert command), `dtype` is not one of `MODEL_DTYPES`, or any weights problem
            listed in `load_weights`; for a hub id, every case of
            `clover_engine.backbones.hub.hub_snapshot` (unknown or gated repo, missing revision,
            offline with nothing cached, no safetensors).
    """
    source, hub_id = model_source(path_or_dir)  # a hub id: its snapshot in the huggingface_hub cache
    directory = _checkpoint_dir(source)
    config_path = directory / CONFIG_NAME
    if not config_path.is_file():
        raise ValueError(
            f"{directory} has no {CONFIG_NAME}; a checkpoint directory holds config.json and "
            f"model.safetensors (write one with clover_engine.checkpoint.save_model or "
            f"`python -m clover_engine.checkpoint --init clover-test --out DIR`); {_supported()}"
        )
    fmt = model_format(directory)
    with BUILD_LOCK:  # one build at a time per process (thread-safe: see BUILD_LOCK)
        # the family's loader, imported only now (clover_engine.backbones.registry: one row per model_type)
        model = loader_for(fmt)(directory, device=device, dtype=_as_float_dtype(dtype))
    if hub_id is not None:  # traces name the hub model, not its snapshot's commit folder
        model.model_id = hub_id
    return model


ADAPTER_FORMAT = "hf-block-diffusion"
CONVERT_FIRST: dict[str, str] = {"qwen3_5_moe": "qwen3_5_moe", "qwen3_5_moe_text": "qwen3_5_moe"}
"""``model_type`` -> ``clover_engine.convert --from`` value, for formats that load after conversion to Clover."""


def best_memory_mode(model_dir: str | Path, name: str | None = None) -> tuple[str, str]:
    """The memory mode to decode `model_dir` in by default, and why.

    The mode whose ``bd32`` row of the checkpoint's ``eval.json`` (written by ``python -m
    clover_engine.eval``) has the higher agent exact match; without that table, ``state+window`` when
    ``config.json`` sets an ``attention_window`` (the mode the bundled models were trained for),
    else ``state``. A model format without memory modes (adapters, transformers bases) reads as
    ``state``, the only mode its decoder runs.

    Args:
        model_dir: the checkpoint directory.
        name: the model's name in the reason (default the directory's name; a hub id for a hub snapshot, whose
            directory is named by a commit hash).

    Returns:
        (``"state"`` or ``"state+window"``, a one-line reason for labels).
    """
    d = Path(model_dir)
    label = name or d.name
    try:
        agent = json.loads((d / "eval.json").read_text(encoding="utf-8"))["agent"]
        win, st = agent["bd32-window"]["exact_match"], agent["bd32-state"]["exact_match"]
        mode = "state+window" if win >= st else "state"
        return mode, (f"best measured mode of {label} (eval.json: exact tool calls at block 32 "
                      f"{win:.0%} with the window, {st:.0%} in state)")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
        window, model_type = cfg.get("attention_window", 0), cfg.get("model_type")
    except (OSError, ValueError, AttributeError):
        window, model_type = 0, None
    if window:
        return "state+window", f"{label} has an attention window (W={window}) and no eval.json"
    if "masked-diffusion" in DESCRIPTIONS.get(str(model_type).lower(), ""):  # LLaDA, Dream, LLaDA-MoE
        return "state", (f"{label} keeps no history between forwards (each one re-reads the whole sequence, "
                         "bidirectionally); Clover's memory modes do not apply")
    if str(model_type).lower() == "llada2_moe":
        return "state", (f"{label} keeps its history in a KV cache under the block decoder; LLaDA2.0's own sampler "
                         "re-reads the prompt and finished blocks every forward, as the original; Clover's memory "
                         "modes do not apply")
    if model_type not in (None, "clover"):  # a transformers or block-causal backbone: its decoder runs `state` only
        return "state", f"{label} keeps its history in a KV cache; Clover's memory modes do not apply"
    return "state", f"{label} has no attention window"


def supported_formats() -> dict[str, str]:
    """Every ``model_type`` `load_model` opens -> a description (the rows of `clover_engine.backbones.registry`)."""
    return {mt: DESCRIPTIONS.get(mt, MODEL_TYPES[mt]) for mt in MODEL_TYPES}


def _supported() -> str:
    return ("supported formats (config.json model_type): "
            + "; ".join(f"{k!r}: {v}" for k, v in supported_formats().items())
            + f"; convert first: {', '.join(repr(k) for k in CONVERT_FIRST)} (python -m clover_engine.convert)")


def model_format(path_or_dir: str | Path) -> str:
    """The format of a checkpoint directory: a key of `supported_formats`, from ``config.json``'s
    ``model_type`` (a config without one is a Clover checkpoint, as older saves were).

    Raises:
        ValueError: no directory, no or unreadable ``config.json``, a format to convert first
            (`CONVERT_FIRST`: the message gives the ``python -m clover_engine.convert`` command), or an
            unknown ``model_type`` (the message lists the supported formats).
    """
    directory = _checkpoint_dir(path_or_dir)
    config_path = directory / CONFIG_NAME
    try:
        data = json.loads(config_path.read_text())
    except OSError as e:
        raise ValueError(f"cannot read {config_path}: {e}; {_supported()}") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_path} is not valid JSON ({e}); re-save the model") from e
    if not isinstance(data, dict):
        raise ValueError(f"{config_path} holds a JSON {type(data).__name__}, not an object; re-save the model")
    mt = data.get("model_type", "clover")
    if isinstance(mt, str) and mt.lower() in MODEL_TYPES:  # Dream ships model_type "Dream"
        return mt.lower()
    if mt in CONVERT_FIRST:
        return _refuse_convert_first(directory, mt)
    raise ValueError(f"{config_path} has model_type={mt!r}, which this engine cannot load; {_supported()}")


def _refuse_convert_first(directory: Path, model_type: str):
    out = directory.with_name(directory.name + "-clover")
    raise ValueError(
        f"{directory} is a transformers checkpoint of model_type {model_type!r}, which the engine runs as a "
        f"Clover model after conversion: python -m clover_engine.convert --from {CONVERT_FIRST[model_type]} "
        f"{directory} --out {out} ; then load {out}"
    )


def load_tokenizer(path_or_dir: str | Path) -> Tokenizer:
    """Read ``tokenizer.json`` from a checkpoint directory (a Dream checkpoint without one: its
    ``vocab.json`` + ``merges.txt``, built by transformers' ``Qwen2Tokenizer``).

    Args:
        path_or_dir: the checkpoint directory, or the ``tokenizer.json`` file; or a hub id
            (``org/name[@revision]``, as in `load_model`).

    Returns:
        A ``tokenizers.Tokenizer``.

    Thread-safe: tokenizers are read one at a time per process (`BUILD_LOCK`), as models are built.

    Raises:
        ValueError: if the directory or file is missing or the file cannot be parsed; for a hub id,
            every case of `clover_engine.backbones.hub.hub_snapshot`.
    """
    source, _ = model_source(path_or_dir)  # a hub id: its snapshot (fetched outside the lock)
    with BUILD_LOCK:  # an adapter's or drafter's tokenizer comes through transformers (see BUILD_LOCK)
        return _load_tokenizer(Path(source))


def _load_tokenizer(path: Path) -> Tokenizer:
    if path.is_dir() and _hf_kind(path / CONFIG_NAME) == "adapter":
        # local: a family's module is imported only for its own checkpoints (clover_engine.backbones.registry's rule)
        from clover_engine.backbones.causal_lm.adapter import load_adapter_tokenizer

        return load_adapter_tokenizer(path)
    if path.is_dir() and not (path / TOKENIZER_NAME).is_file() and _model_type(path) == "block-drafter":
        # local: a family's module is imported only for its own checkpoints (clover_engine.backbones.registry's rule)
        from clover_engine.backbones.drafter.model import load_drafter_tokenizer

        return load_drafter_tokenizer(path)
    if path.is_dir() and not (path / TOKENIZER_NAME).is_file() and _model_type(path) == "dream":
        return _qwen2_bpe_tokenizer(path)
    if path.is_dir():
        path = path / TOKENIZER_NAME
    if not path.is_file():
        raise ValueError(
            f"no tokenizer at {path}; save one with save_model(..., tokenizer=tok) or use "
            f"clover_engine.tokenizer.byte_tokenizer() for byte-level presets such as clover-test"
        )
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises a bare Exception on bad JSON
        raise ValueError(f"{path} is not a valid tokenizers file: {e}") from e


def _qwen2_bpe_tokenizer(directory: Path) -> Tokenizer:
    """The tokenizer of a Dream checkpoint that ships ``vocab.json`` + ``merges.txt`` and no
    ``tokenizer.json`` (Dream-v0-*-7B: its ``DreamTokenizer`` is remote code over Qwen2's byte-level BPE).
    transformers' own ``Qwen2Tokenizer`` builds it from those files (its pre-tokenizer regex, byte-level
    decoder, the added tokens of ``tokenizer_config.json`` / ``added_tokens.json``), and its backend is
    the ``tokenizers.Tokenizer`` returned -- the remote code is never run.

    Raises:
        ValueError: ``vocab.json`` or ``merges.txt`` absent, or files transformers cannot read.
    """
    missing = [n for n in ("vocab.json", "merges.txt") if not (directory / n).is_file()]
    if missing:
        raise ValueError(f"no tokenizer in {directory}: a Dream checkpoint needs tokenizer.json, or vocab.json and "
                         f"merges.txt (missing: {', '.join(missing)}); copy them from the model's hub page")
    from transformers import Qwen2Tokenizer

    try:
        return Qwen2Tokenizer.from_pretrained(str(directory)).backend_tokenizer
    except Exception as exc:  # noqa: BLE001  transformers raises OSError / ValueError / json errors
        raise ValueError(f"{directory}: its vocab.json / merges.txt do not make a Qwen2 tokenizer: {exc}") from None


# --------------------------------------------------------------------------- helpers
def _model_type(directory: Path) -> str | None:
    """``config.json``'s model type, or None when it cannot be read."""
    try:
        return model_format(directory)
    except ValueError:
        return None


def _hf_kind(config_path: Path) -> str | None:
    """``"adapter"`` (clover_engine.backbones.causal_lm.adapter), ``"transformers"`` (a plain Llama / Qwen2 / Qwen3
    ``save_pretrained`` directory) or None (a Clover checkpoint, or no readable / known config)."""
    try:
        fmt = model_format(config_path.parent)
    except ValueError:
        return None
    return None if fmt == "clover" else "adapter" if fmt == ADAPTER_FORMAT else "transformers"


MODEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
"""Weight dtypes a loaded model computes in (recurrent state and confidences stay fp32 in all)."""


def _as_float_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None:
        return dtype
    resolved = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype, None) if isinstance(dtype, str) \
        else None
    if isinstance(resolved, torch.dtype) and resolved in MODEL_DTYPES:
        return resolved
    names = ", ".join(str(d).replace("torch.", "") for d in MODEL_DTYPES)
    raise ValueError(f"dtype must be a floating torch dtype the model computes in -- {names} (a torch.dtype "
                     f"or its name, e.g. torch.bfloat16 or 'bfloat16') -- got {dtype!r}")


# ------------------------------------------------------------------------------- CLI
def _min_param_bytes(config: CloverConfig) -> int:
    """A lower bound on float32 weight bytes: routed + shared experts and the embeddings.

    Counted from the config alone (building on the meta device costs a second
    on first use); the mixers add a few percent on top.
    """
    h = config.hidden_size
    experts = config.num_experts * 3 * h * config.moe_intermediate_size  # gate, up, down
    shared = 3 * h * config.shared_expert_intermediate_size
    embeddings = config.vocab_size * h * (1 if config.tie_word_embeddings else 2)
    return 4 * (config.num_hidden_layers * (experts + shared) + embeddings)


def main(argv: list[str] | None = None) -> int:
    """``python -m clover_engine.checkpoint --init PRESET --out DIR``: save a random model of a preset."""
    parser = argparse.ArgumentParser(
        prog="python -m clover_engine.checkpoint",
        description="Save a randomly initialised Clover model of a preset as a checkpoint directory.",
    )
    parser.add_argument("--init", required=True, metavar="PRESET",
                        help="preset name, e.g. clover-test (see clover_engine.backbones.clover.config.PRESETS)")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for the initialisation")
    parser.add_argument("--max-shard-bytes", type=int, default=None,
                        help="shard the weights into files of at most this many bytes")
    parser.add_argument("--max-gib", type=float, default=4.0,
                        help="refuse presets whose float32 weights exceed this (default 4 GiB)")
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    configure_threads(args.threads)

    try:
        config = CloverConfig.from_name(args.init)
    except ValueError as e:
        parser.error(str(e))

    estimate = _min_param_bytes(config)
    if estimate > args.max_gib * 2**30:
        parser.error(
            f"preset {args.init} needs at least {estimate / 2**30:.1f} GiB of float32 weights, over "
            f"--max-gib {args.max_gib}; a random model this size is rarely useful (the preset "
            f"drives the cost model without weights) -- raise --max-gib if you mean it"
        )
    torch.manual_seed(args.seed)
    model = CloverModel(config)
    tokenizer = byte_tokenizer()
    # The byte tokenizer fits a preset only if its ids fit the vocabulary and its
    # EOS / MASK ids are the ones the config uses.
    fits = (
        tokenizer.get_vocab_size() <= config.vocab_size
        and tokenizer.token_to_id("<|endoftext|>") == config.eos_token_id
        and tokenizer.token_to_id("<|mask|>") == config.mask_token_id
    )
    out = save_model(model, args.out, tokenizer=tokenizer if fits else None,
                     max_shard_bytes=args.max_shard_bytes)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"saved random {args.init} (seed {args.seed}, {n_params:,} parameters) to {out}")
    if not fits:
        print(f"no tokenizer.json written: preset {args.init} has no bundled tokenizer "
              f"(the byte tokenizer's EOS/MASK ids do not match its config)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
