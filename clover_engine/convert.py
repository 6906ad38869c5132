"""Convert a transformers Qwen3.5-MoE checkpoint into a Clover checkpoint (docs/architecture.md §3).

Command line::

    python -m clover_engine.convert --from qwen3_5_moe SRC --out DST [--window 4096] [--no-agreement]

SRC is a directory as transformers' ``save_pretrained`` writes it (or as the Hub serves
``Qwen/Qwen3.5-35B-A3B``): ``config.json`` with ``model_type`` ``qwen3_5_moe_text``
(``Qwen3_5MoeForCausalLM``) or ``qwen3_5_moe`` (``Qwen3_5MoeForConditionalGeneration``, whose
``text_config`` is used and whose vision tower is left out), and ``model.safetensors`` or
``model.safetensors.index.json`` with its shards. Weights are read with ``safetensors`` only; a
directory that holds only pickle files (``pytorch_model.bin``) is refused.

What is done (the autoregressive-to-block-diffusion initialisation):

* the config is translated into a `CloverConfig` (same field names; RoPE theta and partial
  factor from ``rope_parameters``; no attention conv; ``attention_window`` from ``--window``);
* every weight the two models share is copied under its own name (Clover's parameters carry
  transformers' names, `clover_engine.checkpoint`); experts stored one per module
  (``mlp.experts.{e}.gate_proj.weight`` ...), as ``save_pretrained`` and the Hub write them,
  are stacked into ``mlp.experts.gate_up_proj`` [E, 2F, D] and ``mlp.experts.down_proj`` [E, D, F];
* Clover's own parameters are initialised so that ``block_size = 1`` stays as close to the
  source's greedy decoding as the architecture allows (`CloverInit`): the attention layers'
  memory unit is off (logit bias `MEMORY_OFF_LOGIT`, ``mem_w = 0``), so in ``state+window`` mode
  with a window covering the context an attention layer computes exactly the source's causal
  softmax attention; GDN layers read their recurrent state -- the same gated delta rule state
  the source keeps -- through the memory unit (``mem_w = 0``, bias `CloverInit.gdn_memory_logit`);
* a MASK token is found in the tokenizer (`MASK_TOKEN_NAMES`) or added: ``<|mask|>`` takes the
  next tokenizer id, an unused (padding) row of the embedding if there is one, else the
  vocabulary grows by one row; its input embedding is the mean of the tokenizer's embeddings;
* ``config.json``, ``model.safetensors``, ``tokenizer.json`` (with the MASK token) and a model card
  ``README.md`` are written; the card reports the measured agreement (`measure_agreement`).

Where the architectures cannot agree (written into the card with the measured numbers):

* **No token shift.** Clover predicts slot j from its own output with a MASK input at j; the
  source predicts token t+1 from its output at t, whose input is token t. At ``block_size = 1``
  the converted model therefore sees MASK where the source saw the last token, and token t
  only through history (state / window). The source's next-token head is not used as trained
  until continued training (``clover_engine.train --init-from DST``) adapts it.
* **GDN read-out.** The source's output for token t is ``S_t^T q_t`` with ``S_t`` already holding
  token t (decayed ``S_{t-1}`` read plus token t's own delta-rule write); Clover mixes ``S_{t-1}^T q_t``
  and ``v_t`` in one softmax (a convex combination). The state recurrence itself is identical.
* **Attention history.** Exact only in ``state+window`` mode and only while the context fits the
  window; in ``state`` mode (Clover's design) attention layers see history only through their
  delta-rule memory, which starts off.
* Multimodal RoPE (``mrope_section``) reduces to plain RoPE for text, which is all Clover reads.

The mapping itself -- the config translation, the weight names and expert stacking, `CloverInit`,
`MEMORY_OFF_LOGIT`, `MASK_TOKEN_NAMES` and the Clover-only parameters -- is
`clover_engine.backbones.clover.convert_mapping` (backbones wing); this module (an entry point) builds the
model with it, saves the checkpoint, measures the agreement and writes the card.

Shape letters as in `clover_engine`: E experts, D hidden, F expert FFN width.

Wing: ``entry points``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clover_engine.backbones.clover.config import CloverConfig
from clover_engine.backbones.clover.convert_mapping import (
    CloverInit,
    SourceWeights,
    _eos_id,
    clover_config,
    copy_shared_weights,
    init_clover_parameters,
    mask_token,
    read_source_config,
)
from clover_engine.checkpoint import CONFIG_NAME, TOKENIZER_NAME, load_tokenizer, save_model
from clover_engine.backbones.clover.model import CloverModel
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.threads import add_threads_argument, configure_threads

SOURCE_FORMATS = ("qwen3_5_moe",)
"""Values of ``--from``."""
DEFAULT_WINDOW = 4096
"""``attention_window`` of a converted model: the ``state+window`` mode's exact-attention span."""


# ---------------------------------------------------------------------------- conversion
@dataclass
class Conversion:
    """What `convert` did (also written into the model card).

    Attributes:
        out: the Clover checkpoint directory.
        config: the converted model's `CloverConfig`.
        copied: Clover parameter names filled from the source.
        initialised: Clover-only parameter names (`init_clover_parameters`).
        skipped: source tensor names without a Clover counterpart (`SKIPPED_PREFIXES`).
        mask_added: the MASK token (``config.mask_token_id``) was added rather than found.
        grown_rows: embedding rows added to the source vocabulary (0 or 1).
        init: the `CloverInit` used.
        source: the source directory, as given.
        dtype: the weights' dtype name (``float32``, ``bfloat16`` ...).
        agreement: `measure_agreement`'s result, or None when not measured (``note`` says why).
    """

    out: Path
    config: CloverConfig
    copied: list[str]
    initialised: list[str]
    skipped: list[str]
    mask_added: bool
    grown_rows: int
    init: CloverInit
    source: str = ""
    dtype: str = "float32"
    agreement: dict | None = None
    note: str = ""


def build_model(src: str | Path, *, name: str | None = None, window: int = DEFAULT_WINDOW,
                init: CloverInit = CloverInit(), dtype: torch.dtype | None = None,
                eos_token_id: int | None = None):
    """Build the converted `CloverModel` in memory (nothing written).

    Args:
        src: the Qwen3.5-MoE checkpoint directory.
        name: the model's name (default: the directory's name + ``-clover``).
        window: ``attention_window`` (>= 0).
        init: values of Clover's own parameters.
        dtype: weight dtype (default: the source's ``dtype`` / ``torch_dtype``, else float32).
        eos_token_id: overrides the source config's EOS id.

    Returns:
        (model in eval mode, tokenizer with MASK or None, `Conversion` without ``out`` / agreement).

    Raises:
        ValueError: an unsupported or damaged source (`read_source_config`, `clover_config`,
            `SourceWeights`, `copy_shared_weights`), or a Clover parameter left unfilled.
    """

    src = Path(src)
    scfg = read_source_config(src)
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    window = min(window, int(scfg.get("max_position_embeddings") or window))  # no use beyond the context
    weights = SourceWeights(src)
    tokenizer = None
    if (src / TOKENIZER_NAME).is_file():
        tokenizer = load_tokenizer(src / TOKENIZER_NAME)
    src_vocab = int(scfg["vocab_size"])
    mask_id, mask_added = mask_token(tokenizer, src_vocab)
    vocab = max(src_vocab, mask_id + 1)
    eos = _eos_id(src, scfg) if eos_token_id is None else int(eos_token_id)
    cfg = clover_config(scfg, name=name or f"{src.resolve().name}-clover", eos_token_id=eos,
                        mask_token_id=mask_id, vocab_size=vocab, window=window, init=init)
    if dtype is None:
        dtype = getattr(torch, str(scfg.get("dtype") or scfg.get("torch_dtype") or "float32"), torch.float32)

    with torch.device("meta"):
        model = CloverModel(cfg)
    model.to(dtype=dtype).to_empty(device="cpu")
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    info = copy_shared_weights(model, weights)
    initialised = init_clover_parameters(model, init)
    with torch.no_grad():
        emb = model.embed_tokens.weight
        if mask_added:  # MASK's input embedding: the mean of the known tokens' embeddings
            known = src_vocab if tokenizer is None else min(src_vocab, tokenizer.get_vocab_size(with_added_tokens=False))
            emb[mask_id].copy_(emb[:known].float().mean(0).to(emb.dtype))
            initialised.append(f"model.embed_tokens.weight[{mask_id}]")
        if vocab > src_vocab and not cfg.tie_word_embeddings:
            model.lm_head.weight[src_vocab:].zero_()  # MASK is never a candidate; a zero logit row
            initialised.append(f"lm_head.weight[{src_vocab}:]")
    filled = set(info["copied"]) | {n.split("[")[0] for n in initialised}
    if cfg.tie_word_embeddings:
        filled.add("lm_head.weight")
    unfilled = [n for n in model.state_dict() if n not in filled]
    if unfilled:
        raise ValueError(f"the source checkpoint lacks {len(unfilled)} tensor(s) the Clover model needs, e.g. "
                         f"{unfilled[:3]}; is it a complete Qwen3.5-MoE checkpoint (all shards present)?")
    model.eval()
    conv = Conversion(out=Path(), config=cfg, copied=info["copied"], initialised=initialised,
                      skipped=info["skipped"], mask_added=mask_added, grown_rows=vocab - src_vocab, init=init,
                      source=str(src), dtype=str(dtype).replace("torch.", ""))
    return model, tokenizer, conv


def convert(src: str | Path, out: str | Path, *, name: str | None = None, window: int = DEFAULT_WINDOW,
            init: CloverInit = CloverInit(), dtype: torch.dtype | None = None, eos_token_id: int | None = None,
            agreement: bool = True, prompts: int = 8, max_new_tokens: int = 32, overwrite: bool = False) -> Conversion:
    """Convert a Qwen3.5-MoE checkpoint directory `src` into a Clover checkpoint `out`.

    Writes ``config.json``, ``model.safetensors``, ``tokenizer.json`` (when `src` has one; with the
    MASK token) and ``README.md`` (the model card, with the agreement `measure_agreement` found).

    Args:
        src, out: directories; `out` is created.
        name, window, init, dtype, eos_token_id: see `build_model`.
        agreement: measure block_size-1 agreement with the source (loads the source with
            transformers: memory for both models).
        prompts, max_new_tokens: the measurement's size.
        overwrite: replace a checkpoint already in `out`.

    Returns:
        The `Conversion`.

    Raises:
        ValueError: `out` already holds a checkpoint (without `overwrite`), or any error of `build_model`.
    """
    out = Path(out)
    if (out / CONFIG_NAME).is_file() and not overwrite:
        raise ValueError(f"{out} already holds a checkpoint; pass another --out or --overwrite")
    model, tokenizer, conv = build_model(src, name=name, window=window, init=init, dtype=dtype,
                                         eos_token_id=eos_token_id)
    conv.out = out
    save_model(model, out, tokenizer=tokenizer)
    if tokenizer is None:  # an overwritten checkpoint's tokenizer.json would not be this model's
        (out / TOKENIZER_NAME).unlink(missing_ok=True)
    if agreement:
        try:
            conv.agreement = measure_agreement(src, model, tokenizer, prompts=prompts, max_new_tokens=max_new_tokens)
        except (ImportError, OSError, ValueError, RuntimeError) as e:
            conv.note = f"agreement not measured: {type(e).__name__}: {e}"
    else:
        conv.note = "agreement not measured (--no-agreement)"
    (out / "README.md").write_text(model_card(conv))
    return conv


# ---------------------------------------------------------------------------- agreement
PROMPT_TEXTS = (
    "The capital of France is", "def fibonacci(n):\n", "Once upon a time, there was", "import numpy as np\n",
    "The quick brown fox", "In 1969, the first humans", "Water boils at", "for i in range(10):\n",
)
"""Prompts of the agreement measurement when the source has a tokenizer (cycled)."""


def _prompt_ids(tokenizer, cfg: CloverConfig, n: int, seed: int) -> list[list[int]]:
    if tokenizer is not None:
        return [tokenizer.encode(PROMPT_TEXTS[i % len(PROMPT_TEXTS)]).ids for i in range(n)]
    g = torch.Generator().manual_seed(seed)
    banned = {cfg.mask_token_id, cfg.eos_token_id}
    out = []
    for _ in range(n):
        ids = [int(t) for t in torch.randint(0, cfg.vocab_size, (8,), generator=g)]
        out.append([t for t in ids if t not in banned] or [0])
    return out


@torch.no_grad()
def measure_agreement(src: str | Path, model, tokenizer=None, *, prompts: int = 8, max_new_tokens: int = 32,
                      seed: int = 0) -> dict[str, Any]:
    """Greedy-token agreement of the converted `model` at ``block_size = 1`` with the source's ``generate``.

    The source is loaded with transformers (``AutoModelForCausalLM``, safetensors) in the model's
    dtype. Per prompt, the source's greedy continuation (``max_new_tokens``, stopping at EOS) is the
    reference. Per memory mode (``state+window`` when the model has a window, and ``state``):

    * ``greedy``: share of the ``max_new_tokens`` positions where `clover_engine.decoding.decoder.BlockDecoder`
      (``block_size=1``, no tokenizer, so only MASK is banned) writes the reference's token (both
      sequences padded with EOS after they stop); ``greedy_prefix``: mean common-prefix length / max_new_tokens;
    * ``teacher_forced``: share of reference tokens the MASK slot's argmax gives when the history is
      the reference itself (one block per token, as the decoder commits them);
    * ``same_position``: share of reference tokens predicted when Clover is fed each token at its own
      position (`CloverModel.forward_train` with clean = noisy, block 1): how far the copied weights
      compute the source's function, leaving out the missing token shift.

    Args:
        src: the source checkpoint directory.
        model: the converted `CloverModel`.
        tokenizer: encodes `PROMPT_TEXTS`; None = seeded random prompts of 8 ids.
        prompts, max_new_tokens, seed: the measurement's size and random prompts' seed.

    Returns:
        ``{"prompts", "max_new_tokens", "positions", "modes": {mode: {metric: share in [0, 1]}}}``.

    Raises:
        ImportError / OSError / ValueError: transformers cannot load the source.
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    cfg = model.config
    hf_logging.disable_progress_bar()
    hf = AutoModelForCausalLM.from_pretrained(str(src), dtype=model.dtype, use_safetensors=True).eval()
    eos, mask = cfg.eos_token_id, cfg.mask_token_id
    modes = (["state+window"] if cfg.attention_window else []) + ["state"]
    sums = {m: {"greedy": 0, "greedy_prefix": 0.0, "teacher_forced": 0, "same_position": 0} for m in modes}
    positions = n_prompts = 0
    for p in _prompt_ids(tokenizer, cfg, prompts, seed):
        x = torch.tensor([p])
        gen = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                          eos_token_id=eos, pad_token_id=eos)[0, len(p):].tolist()
        targets = gen[: gen.index(eos) + 1] if eos in gen else gen  # the reference, EOS included
        ref = (targets + [eos] * max_new_tokens)[:max_new_tokens]
        positions += len(targets)
        n_prompts += 1
        seq = torch.tensor([p + targets])
        for mode in modes:
            s = sums[mode]
            dc = DecodeConfig(block_size=1, max_new_tokens=max_new_tokens, memory_mode=mode)
            ours = BlockDecoder(model, None, dc).generate(p, record_trace=False).tokens
            ours = (ours + [eos] * max_new_tokens)[:max_new_tokens]
            s["greedy"] += sum(a == b for a, b in zip(ours, ref))
            s["greedy_prefix"] += next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), max_new_tokens)
            state = model.setup_state(1, mode)
            for i, tok in enumerate(targets):
                commit = x if i == 0 else torch.tensor([[targets[i - 1]]])
                logits = model(torch.tensor([[mask]]), state, commit_ids=commit, block_size=1).logits[0, 0]
                logits[mask] = float("-inf")
                s["teacher_forced"] += int(logits.argmax()) == tok
            h, _ = model.forward_train(seq, seq, 1, use_window=mode == "state+window")
            logits = model.lm_head(h[0, len(p) - 1: len(p) - 1 + len(targets)]).float()
            logits[:, mask] = float("-inf")
            s["same_position"] += int((logits.argmax(-1) == torch.tensor(targets)).sum())
    out = {}
    for mode, s in sums.items():
        out[mode] = {
            "greedy": s["greedy"] / (n_prompts * max_new_tokens),
            "greedy_prefix": s["greedy_prefix"] / (n_prompts * max_new_tokens),
            "teacher_forced": s["teacher_forced"] / positions,
            "same_position": s["same_position"] / positions,
        }
    return {"prompts": n_prompts, "max_new_tokens": max_new_tokens, "positions": positions, "modes": out}


# ---------------------------------------------------------------------------- model card
def model_card(conv: Conversion) -> str:
    """The converted checkpoint's ``README.md``: source, what was copied and initialised, the
    measured agreement and where the architectures differ."""
    c, init = conv.config, conv.init
    pattern = ", ".join(t.split("_")[0] for t in c.layer_types[:8]) + (" ..." if c.num_hidden_layers > 8 else "")
    if conv.mask_added:
        where = "in a row added to the vocabulary" if conv.grown_rows else "in an unused row"
        mask = f"`<|mask|>` added; its input embedding is the mean of the known tokens' embeddings, {where}"
    else:
        mask = "found in the source tokenizer; its embedding kept"
    skipped = (f" (multi-token-prediction head / vision tower, e.g. `{conv.skipped[0]}`)" if conv.skipped else "")
    lines = [
        f"# {c.name}",
        "",
        f"A Clover block-diffusion checkpoint converted from the Qwen3.5-MoE checkpoint `{conv.source}` by",
        f"`python -m clover_engine.convert --from qwen3_5_moe` (weights in {conv.dtype}, safetensors). It is an",
        f"*initialisation* for block-diffusion training (`python -m clover_engine.train --init-from {conv.out}`),",
        "not a trained model.",
        "",
        "## What was converted",
        "",
        (f"* Config: {c.num_hidden_layers} layers ({pattern}), hidden {c.hidden_size}, {c.num_experts} experts "
         f"top-{c.num_experts_per_tok}, vocabulary {c.vocab_size}, context {c.max_position_embeddings}; "
         f"RoPE theta {c.rope_theta:g} on {c.partial_rotary_factor:g} of each head."),
        (f"* Copied from the source under their transformers names: {len(conv.copied)} parameters "
         "(every embedding, mixer, norm, router, expert and LM-head weight)."),
        f"* Not converted: {len(conv.skipped)} source tensors{skipped}.",
        (f"* Clover's own parameters ({len(conv.initialised)} tensors): attention memory unit off "
         f"(`mem_b_logit` = {init.attention_memory_logit:g}, `mem_w` = 0; its delta-rule gates as a fresh "
         f"Clover model's, seed {init.seed}); GDN memory read-out `mem_logit_bias` = {init.gdn_memory_logit:g}, "
         f"`mem_w` = 0, `block_temperature` = {init.gdn_block_temperature:g}."),
        f"* MASK: id {c.mask_token_id} ({mask}); EOS id {c.eos_token_id}.",
        (f"* `state+window` mode keeps the last {c.attention_window} committed tokens' keys and values "
         "in attention layers (`attention_window`)."),
        "",
        "## Agreement with the source at block_size 1",
        "",
    ]
    if conv.agreement:
        a = conv.agreement
        lines += [
            (f"{a['prompts']} prompts, {a['max_new_tokens']} greedy tokens each ({a['positions']} reference "
             "tokens); the reference is the source's `generate(do_sample=False)`."),
            "",
            ("| memory mode | greedy (same token, same position) | greedy common prefix | teacher-forced MASK slot "
             "| same position (token fed) |"),
            "|---|---|---|---|---|",
        ]
        lines += [f"| {mode} | {m['greedy']:.3f} | {m['greedy_prefix']:.3f} | {m['teacher_forced']:.3f} "
                  f"| {m['same_position']:.3f} |" for mode, m in a["modes"].items()]
        lines += ["", "Metrics: `clover_engine.convert.measure_agreement`."]
    else:
        lines.append(conv.note or "Not measured.")
    lines += ["", "## Where the architectures differ", "", *ARCHITECTURE_DIFFERENCES, ""]
    return "\n".join(lines)


ARCHITECTURE_DIFFERENCES = (
    ("* **No token shift.** Clover predicts slot j from its own output, whose input is MASK; the source "
     "predicts token t+1 from its output at token t. At block_size 1 the converted model sees MASK where the "
     "source saw the last token (which it reads only through history), so the source's next-token head is "
     "not used as trained: the greedy and teacher-forced columns. The same-position column feeds each token "
     "at its own position instead, which is what the copied weights compute."),
    ("* **GDN read-out.** The source reads `S_t^T q_t` with token t already written into the gated-delta-rule "
     "state; Clover mixes `S_{t-1}^T q_t` (the same state, one token earlier) and `v_t` in one softmax. The "
     "state recurrence is the same."),
    ("* **Attention history.** Exact in `state+window` mode while the context fits the window; in `state` mode "
     "(Clover's design) attention layers see history only through their delta-rule memory, which starts off."),
    ("* Exact: embeddings, norms (1 + w), the attention's q/k norms, sigmoid output gate, partial RoPE and "
     "GQA, the GDN projections, conv and gated norm, the router (softmax, top-k, renormalised), the experts, "
     "the shared expert and its gate, the LM head. Text-only multimodal RoPE is plain RoPE."),
)
"""The model card's list of where Clover cannot compute what the source computes, and what it copies exactly."""


# ------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    """``python -m clover_engine.convert --from qwen3_5_moe SRC --out DST``; prints what was done and the agreement."""
    ap = argparse.ArgumentParser(prog="python -m clover_engine.convert",
                                 description="Convert a transformers checkpoint into a Clover block-diffusion checkpoint.")
    ap.add_argument("--from", dest="fmt", required=True, choices=SOURCE_FORMATS, help="source format")
    ap.add_argument("src", type=Path, help="source directory (config.json + safetensors, as save_pretrained writes it)")
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--name", default=None, help="model name (default: SRC's name + '-clover')")
    ap.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                    help=f"attention_window of the state+window mode (default {DEFAULT_WINDOW})")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="weight dtype (default: the source's)")
    ap.add_argument("--eos-token-id", type=int, default=None, help="override the source's EOS id")
    ap.add_argument("--no-agreement", action="store_true",
                    help="skip the block_size-1 agreement measurement (it loads the source with transformers too)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts of the agreement measurement")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="greedy tokens per prompt in the measurement")
    ap.add_argument("--overwrite", action="store_true", help="replace a checkpoint already in --out")

    add_threads_argument(ap)
    args = ap.parse_args(argv)
    configure_threads(args.threads)
    try:
        conv = convert(args.src, args.out, name=args.name, window=args.window,
                       dtype=getattr(torch, args.dtype) if args.dtype else None, eos_token_id=args.eos_token_id,
                       agreement=not args.no_agreement, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                       overwrite=args.overwrite)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"converted {args.src} -> {conv.out}: {len(conv.copied)} parameters copied, {len(conv.initialised)} "
          f"initialised, {len(conv.skipped)} source tensors skipped; MASK id {conv.config.mask_token_id}")
    if conv.agreement:
        for mode, m in conv.agreement["modes"].items():
            print(f"block_size-1 agreement ({mode}): " + ", ".join(f"{k} {v:.3f}" for k, v in m.items()))
    else:
        print(conv.note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
