"""Command line: decode one prompt and print the text and a one-line summary.

    python -m clover_engine.generate --model models/clover-tiny --prompt "..." \\
        --block-size 32 --threshold 0.95 --max-new-tokens 128 [--trace out.parquet] [--threads N] \\
        [--device cuda] [--dtype bfloat16]

(run it with the venv's interpreter, ``.venv/bin/python -m clover_engine.generate ...``,
or with the venv activated). ``--threads`` defaults to ``OMP_NUM_THREADS`` if
set, else half the CPUs (1-4): see `clover_engine.threads`.

Experts split across processes (`clover_engine.decoding.parallel`; one process per GPU, gloo on the CPU):

    torchrun --nproc-per-node 2 -m clover_engine.generate --model models/clover-tiny --prompt "..." --parallel ep=2

Heads split across processes (tensor parallel, `clover_engine.decoding.parallel.shard_heads`), alone or with the experts
split over the same ranks: ``--parallel tp=2`` or ``--parallel ep=2,tp=2``.

Rank 0 prints the text, the summary and the bytes each rank read, and saves the trace.

A LLaDA or Dream checkpoint decodes with its own official sampler instead of the block decoder
(`clover_engine.decoding.masked_diffusion_samplers`): ``--sampler llada`` (``--max-new-tokens`` is its
``gen_length``, ``--block-size`` its ``block_length``, ``--steps``, ``--remasking``) or ``--sampler dream``
(``--steps``, ``--alg``, ``--alg-temp``), with ``--temperature`` and ``--seed``. A Fast-dLLM v2 or SDAR
checkpoint likewise (`clover_engine.decoding.block_diffusion_samplers`): ``--sampler fast_dllm_v2``
(``--block-size``, ``--small-block-size``, ``--threshold`` compared with ``>``) or ``--sampler sdar``
(``--block-size`` its ``block_length``, ``--steps`` its ``denoising_steps``, ``--remasking-strategy``,
``--threshold`` its ``confidence_threshold``, ``--temperature`` (default 1.0 there), ``--top-k``); a LLaDA2.0
checkpoint with ``--sampler llada2`` (``--block-size`` its ``block_length``, ``--steps`` per block, ``--threshold``,
``--temperature`` (0: greedy), ``--top-k``, ``--kv-cache``), and LLaDA2.1's token editing with ``--sampler llada21``
(``--threshold``, ``--editing-threshold``, ``--max-post-steps``).

Wing: ``entry points``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from clover_engine.backbones.base import capabilities_of
from clover_engine.backbones.clover.cuda_graphs import enable_cuda_graphs
from clover_engine.backbones.hub import model_source
from clover_engine.checkpoint import DEFAULT_MODEL_DIR as DEFAULT_MODEL  # noqa: E402
from clover_engine.checkpoint import best_memory_mode, file_as_model_dir, find_model_dir, load_model, load_tokenizer
from clover_engine.decoding import decoder_for
from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
from clover_engine.decoding.careful import agreement, careful_setting, is_careful
from clover_engine.decoding.block_diffusion_samplers import SDAR_REMASKING, FastDLLMv2Sampler, SDARSampler
from clover_engine.decoding.llada2_samplers import LLaDA21Sampler, LLaDA2Sampler
from clover_engine.decoding.masked_diffusion_samplers import DREAM_ALGS, LLADA_REMASKING, DreamSampler, LLaDASampler
from clover_engine.examples import DEFAULT_EXAMPLE, EXAMPLE_PROMPTS, example_names, example_prompt
from clover_engine.prompting import model_input, trained_context_note
from clover_engine.trust import budget_note, forced_share_note
from clover_engine.recording.trace_files import trace_format
from clover_engine.threads import add_threads_argument, configure_threads


FAMILY_NAMES = {"diffusion_gemma": "DiffusionGemma"}
"""``Capabilities.family`` -> how the summary line names it, where that differs from the family."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m clover_engine.generate", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL, type=find_model_dir, help=f"checkpoint directory, or a Hugging Face hub id org/name[@revision] "
                                                                    f"(fetched into the huggingface_hub cache; default {DEFAULT_MODEL})")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text (a chat model's plain question is wrapped in its chat template; "
                                         "see --raw-prompt)")
    prompt.add_argument("--example", action=_ExampleAction, choices=example_names(), metavar="NAME",
                        help="decode one of the explorer's example prompts instead of --prompt (clover_engine.examples): "
                             f"{', '.join(repr(n) for n in example_names())}; clover-tiny's are the first "
                             f"{len(EXAMPLE_PROMPTS)}, e.g. --example {DEFAULT_EXAMPLE!r}")
    p.add_argument("--raw-prompt", action="store_true",
                   help="chat models: pass --prompt as is instead of wrapping it in the model's chat template")
    p.add_argument("--block-size", type=int, default=32,
                   help="tokens filled in parallel per block, in slots (1 = autoregressive; default %(default)s)")
    p.add_argument("--threshold", type=float, default=0.95,
                   help="confidence (0-1) a slot's top token needs to be accepted in a forward; the most confident "
                        "slot is filled anyway (a forced fill) when none reaches it (default %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=128,
                   help="tokens to write at most; decoding stops earlier at end-of-text (default %(default)s)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="forwards allowed per block; the last writes every slot still masked (forced fills); "
                        "default: until the block is full")
    p.add_argument("--policy", default="low_confidence",
                   choices=["low_confidence", "top_k", "margin", "entropy", "factor", "verify"],
                   help="which slots a forward accepts: low_confidence (confidence >= --threshold), top_k "
                        "(--tokens-per-step slots), margin (top-1 minus top-2 >= --threshold), entropy "
                        "(<= --max-entropy), factor (Fast-dLLM, --factor); verify: a block drafter proposes "
                        "--block-size - 1 tokens and its frozen base keeps the longest prefix it would write "
                        "itself (models/smollm2-drafter; lossless); default %(default)s")
    p.add_argument("--tokens-per-step", type=int, default=2, help="slots written per step by --policy top_k")
    p.add_argument("--max-entropy", type=float, default=0.5, help="entropy bound (nats) of --policy entropy")
    p.add_argument("--factor", type=float, default=1.0, help="Fast-dLLM factor of --policy factor")
    p.add_argument("--sampler", default="block", choices=["block", "llada", "dream", "fast_dllm_v2", "sdar", "llada2", "llada21"],
                   help="block: the block decoder with --policy (default); llada / dream: a masked diffusion "
                        "checkpoint's own official sampler over a canvas of --max-new-tokens slots right after the "
                        "prompt -- llada in blocks of --block-size, --steps forwards in all, --remasking; dream with "
                        "--steps, --alg, --alg-temp (clover_engine.decoding.masked_diffusion_samplers); fast_dllm_v2 / "
                        "sdar / llada2: a block-causal checkpoint's own sampler in blocks of --block-size, llada2 with "
                        "--steps per block (default --block-size), > --threshold, --temperature, --kv-cache; llada21: "
                        "LLaDA2.1's token editing, --editing-threshold, --max-post-steps "
                        "(clover_engine.decoding.block_diffusion_samplers)")
    p.add_argument("--editing-threshold", type=float, default=0.9,
                   help="--sampler llada21: a written slot is rewritten when another token's probability is above "
                        "this (default %(default)s, the original's; 1.0 = no editing)")
    p.add_argument("--max-post-steps", type=int, default=16,
                   help="--sampler llada21: editing-only forwards per block at most (default %(default)s)")
    p.add_argument("--kv-cache", action="store_true",
                   help="--sampler llada2: keep the finished blocks in a KV cache (the original recomputes them "
                        "every step, the default; the cache saves FLOPs, and bf16 rounding then differs)")
    p.add_argument("--small-block-size", type=int, default=8,
                   help="--sampler fast_dllm_v2: slots per sub-block (default %(default)s, the original's)")
    p.add_argument("--remasking-strategy", default="low_confidence_dynamic", choices=list(SDAR_REMASKING),
                   help="--sampler sdar: which slots a step writes (default %(default)s)")
    p.add_argument("--top-k", type=int, default=0, help="--sampler sdar: keep the k likeliest tokens per draw "
                   "(0 = all; 1 = greedy)")
    p.add_argument("--steps", type=int, default=None,
                   help="--sampler llada / dream: forwards over the whole canvas (default: --max-new-tokens, one "
                        "slot per forward)")
    p.add_argument("--remasking", default="low_confidence", choices=list(LLADA_REMASKING),
                   help="--sampler llada: which masked slots a step writes (default %(default)s)")
    p.add_argument("--alg", default="maskgit_plus", choices=list(DREAM_ALGS),
                   help="--sampler dream: how slots are ranked (default %(default)s, greedy; Dream's own default "
                        "is origin, which draws)")
    p.add_argument("--alg-temp", type=float, default=None, help="--sampler dream: draw slots at this temperature "
                                                                "(default: the most confident)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="--sampler llada / dream: token sampling temperature (0 = argmax; default %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="--sampler llada / dream: seeds every draw")
    p.add_argument("--memory-mode", default=None, choices=["state", "state+window"],
                   help="default: the model's best measured mode (clover_engine.checkpoint.best_memory_mode: its "
                        "eval.json, else state+window when it has an attention window); state is Clover's own")
    p.add_argument("--repetition-penalty", type=float, default=0.0, metavar="LOGITS",
                   help="repetition control: lower by this many logits every token that would repeat a 3-gram "
                        "seen in the last 64 positions (2.0 divides its odds by e^2, about 7.4); 0 = off "
                        "(default %(default)s)")
    p.add_argument("--eos-bias-soft-limit", type=int, default=None, metavar="TOKENS",
                   help="progressive EOS bias: past this many generated tokens, add 0.1 logit per further token to "
                        "end-of-text, so answers tend to end near that length; unset = off (default)")
    p.add_argument("--trace", type=Path, default=None, help="save the trace (.parquet or .arrow)")
    p.add_argument("--careful", action="store_true",
                   help="also decode the careful decode -- the same settings, one slot per forward "
                        "(clover_engine.decoding.careful) -- and print how far the answer agrees with it (recorded in "
                        "the trace's metadata as 'careful')")
    p.add_argument("--device", default="cpu", help="torch device to decode on: cpu, cuda, cuda:1 ... (default cpu)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16", "float64"],
                   help="cast the weights to this dtype (default: as stored); state and confidences stay fp32")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="replay the denoising forward from CUDA graphs (clover_engine.backbones.clover.cuda_graphs; needs --device cuda)")
    p.add_argument("--parallel", default=None, metavar="ep=N[,tp=N]",
                   help="expert (ep) and/or tensor (tp) parallel over the N processes started by "
                        "torchrun --nproc-per-node N (clover_engine.decoding.parallel)")
    p.add_argument("--parallel-timeout", type=float, default=None, metavar="S",
                   help="seconds a collective waits for the other ranks before failing (default 60)")

    add_threads_argument(p)
    return p


class _ExampleAction(argparse.Action):
    """``--example NAME``: sets ``prompt`` to the example's text (and ``example`` to its name)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.prompt = example_prompt(values)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    try:
        threads = configure_threads(args.threads)
        _check_inputs(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.parallel is not None:
        return _main_parallel(args, threads)

    try:
        _resolve_model(args)
        dc = _decode_config(args)
        _check_model_dir(args.model_dir)
        import torch

        if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {args.device}: CUDA is not available on this machine; use --device cpu")
        model = load_model(args.model_dir, device=args.device, dtype=args.dtype)
        if args.model_id is not None:  # a hub model: traces record its hub id (as load_model does for one)
            model.model_id = args.model_id
        caps = capabilities_of(model)
        if args.cuda_graphs:
            if not caps.cuda_graphs:
                raise ValueError(f"--cuda-graphs covers Clover checkpoints; {args.model} is another format")
            enable_cuda_graphs(model)  # ValueError off CUDA
        if args.sampler != "block":
            dc = _official_sampler(args, caps)
        decoder = decoder_for(model, config=dc)  # the block decoder, or the sampler the model runs itself
        if decoder.tokenizer is None:  # the model brought no tokenizer of its own: the folder's tokenizer.json
            decoder.tokenizer = load_tokenizer(args.model_dir)
        given = model_input(args.prompt, model, raw=args.raw_prompt)  # the one rule (chat template or as given)
        if caps.chat_template is not None and not given.wrapped:
            print(f"note: {given.note}", file=sys.stderr)
        args.prompt = given.text
        trained = caps.largest_trained_block
        block = getattr(dc, "block_size", None) or getattr(dc, "block_length", None)
        if trained is not None and block is not None and caps.sampler == "block" and block > trained:
            print(f"note: block_size {block} is larger than any block {_model_name(args)} was trained "
                  f"on (at most {trained}): expect worse text; --block-size {trained} or less stays in "
                  "distribution", file=sys.stderr)
        long_prompt = trained_context_note(len(decoder.encode_prompt(args.prompt)), caps)
        if long_prompt:  # decoded whole all the same: said, never cut
            print(f"note: {long_prompt}", file=sys.stderr)
        # the trace's events carry the cost model's bytes and FLOPs printed below (saved only with --trace)
        result = decoder.generate(args.prompt, record_trace=True)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result.text)
    if args.careful:
        try:
            print(_careful_line(model, decoder.tokenizer, dc, args.prompt, result))
        except (ValueError, TypeError) as e:
            print(f"error: the careful decode did not run: {e}", file=sys.stderr)
            return 2
    name = _model_name(args)
    own_line = None  # the summary of a sampler other than the block decoder's (its settings, not block/threshold)
    # forced fills that wrote slots past the kept answer (end-of-text, anything after the first EOS): forwards, not
    # tokens -- the forced count and the trust note read the kept answer only
    verify = getattr(dc, "policy", None) == "verify"  # a verify run's tokens are its base's own: no forced fill
    past = 0 if verify else forced_past_answer(result.trace, len(result.prompt_ids) + len(result.tokens))
    if args.sampler != "block":
        settings = " ".join(f"{k}={v}" for k, v in dc.to_dict().items() if k not in ("sampler", "top_candidates"))
        own_line = (f"[{name}] {args.sampler} sampler {settings} | tokens={len(result.tokens)} "
                    f"NFE={result.nfe} tokens/forward={len(result.tokens) / max(result.nfe, 1):.2f} "
                    f"forced={result.n_forced - past}" + (f" (+{past} past the answer)" if past else "")
                    + (f" edits={result.n_edits}" if args.sampler == "llada21" else "")
                    + f" stop={result.stop_reason} | threads={threads}")
    elif caps.sampler != "block":  # a sampler of its own (DiffusionGemma): the block settings do not apply
        family, revisable = FAMILY_NAMES.get(caps.family, caps.family), "revisable; " if caps.revises_commits else ""
        own_line = (f"[{name}] {family}, canvas {trained} ({revisable}block_size, threshold and "
                    f"policy do not apply) | tokens={len(result.tokens)} denoising steps={result.nfe} "
                    f"stop={result.stop_reason} | threads={threads}")
    if own_line is not None:
        print(own_line)
        guessed = forced_share_note(len(result.tokens), result.n_forced - past, Path(args.model_dir).name)
        if guessed:  # how much to trust the text above (the family samplers' quota fills are forced fills too)
            print(f"note: {guessed}", file=sys.stderr)
        budget = budget_note(dc.to_dict(), len(result.tokens), result.stop_reason) if args.sampler != "block" else ""
        if budget:  # the samplers' own block rules, not ours: say why the count is not the budget
            print(f"note: {budget}", file=sys.stderr)
        if args.trace is not None:
            print(f"trace saved to {result.trace.save(args.trace)}")
        return 0
    if dc.policy == "verify":  # NFE counts the base's forwards; every token the base wrote itself is no forced fill
        acc = result.accepted_lengths
        counts = (f"base forwards={result.nfe} drafter forwards={result.draft_forwards} "
                  f"tokens/base forward={result.tokens_per_forward:.2f} accepted drafts per round="
                  f"{sum(acc) / max(len(acc), 1):.2f} of {dc.block_size - 1}")
    else:
        counts = (f"NFE={result.nfe} tokens/forward={result.tokens_per_forward:.2f} forced={result.n_forced}")
    print(
        f"[{name}] block_size={dc.block_size} {_policy_label(dc)} "
        f"memory_mode={dc.memory_mode}{_mode_note(args)} | "
        f"tokens={len(result.tokens)} {counts} tokens/s={result.tokens_per_s:.1f} stop={result.stop_reason} | "
        f"read {result.bytes_read / 1e6:.1f} MB, {result.flops / 1e9:.2f} GFLOP (cost model) | "
        f"device={result.trace.meta.get('device', args.device)} threads={threads}"
    )
    if past:  # forced fills that wrote end-of-text slots after the kept answer: not tokens, but forwards
        print(f"note: {past} of the {result.n_forced} forced fills wrote end-of-text slots at or after the answer's "
              "end; they cost forwards but are not tokens", file=sys.stderr)
    guessed = "" if dc.policy == "verify" else forced_share_note(len(result.tokens), result.n_forced - past,
                                                                 Path(args.model_dir).name)
    if guessed:  # how much to trust the text above
        print(f"note: {guessed}", file=sys.stderr)
    if result.stop_reason == "context":  # the budget was cut: say by what, not only stop=context
        print(f"note: --max-new-tokens {dc.max_new_tokens} did not fit: the model's context is "
              f"{model.config.max_position_embeddings} positions and the prompt took "
              f"{model.config.max_position_embeddings - len(result.tokens)}, so it stopped after "
              f"{len(result.tokens)} new tokens", file=sys.stderr)
    if args.trace is not None:
        path = result.trace.save(args.trace)
        print(f"trace saved to {path}")
    return 0


def _careful_line(model, tokenizer, dc, prompt: str, result) -> str:
    """``careful: agrees with the careful decode: 87 % (first difference at slot 12) ...``: ``result``'s answer
    against the careful decode of ``dc`` (`clover_engine.decoding.careful`), decoded here unless ``dc`` is its
    own; the agreement is recorded in ``result.trace.meta["careful"]`` so that a saved trace keeps it."""
    if is_careful(dc):
        a = agreement(result.tokens, result.tokens, own=True)
        care_nfe = result.nfe
    else:
        care = decoder_for(model, tokenizer, config=careful_setting(dc)).generate(prompt, record_trace=False)
        a, care_nfe = agreement(result.tokens, care.tokens), care.nfe
    result.trace.meta["careful"] = {**a.to_dict(), "reference_nfe": int(care_nfe)}
    return (f"careful: {a.describe()}; common prefix {a.common_prefix} of {a.n_answer} tokens; the careful decode "
            f"took {care_nfe} forwards, this run {result.nfe} ({care_nfe / max(result.nfe, 1):.2f}x fewer forwards)")


def _check_inputs(args) -> None:
    """Refuse what would fail only after the decode has spent its time, or decode nothing useful:
    a blank prompt, a ``--trace`` path whose suffix names no trace format or whose folder does not
    exist (a typo there would otherwise create folders).

    Raises:
        ValueError: with what was expected.
    """
    if isinstance(args.prompt, str) and args.prompt and not args.prompt.strip():
        raise ValueError("the prompt is only whitespace; give some text to continue")
    if args.trace is not None:
        try:
            trace_format(args.trace)
        except ValueError:
            raise ValueError(f"--trace {str(args.trace)!r}: the suffix names no trace format; end the path "
                             "in .parquet (or .pq) or .arrow (or .feather, .ipc)") from None
        folder = Path(args.trace).parent
        if not folder.is_dir():
            raise ValueError(f"--trace {str(args.trace)!r}: there is no folder {str(folder)!r}; "
                             "create it first or save the trace elsewhere")


def _resolve_model(args) -> None:
    """Set ``args.model_dir``, the checkpoint directory ``--model`` names -- itself, or a hub id's snapshot in
    the huggingface_hub cache, fetched now (`clover_engine.backbones.hub.model_source`) -- and
    ``args.model_id``, the hub id traces record (None for a local directory).

    Raises:
        ValueError: a hub id that cannot be had (unknown, gated, no such revision, offline with nothing
            cached, no safetensors), with what to do.
    """
    model_dir, args.model_id = model_source(args.model)
    args.model_dir = str(model_dir)


def _check_model_dir(model: str) -> None:
    """Raise ValueError unless ``model`` is a directory (saying so for a file or a missing path)."""

    if Path(model).is_file():
        raise ValueError(file_as_model_dir(model))  # the same message as the explorer's model field
    if not Path(model).is_dir():
        raise ValueError(f"no model directory at {model!r}; pass --model DIR, or make a random test model "
                         "with: python -m clover_engine.checkpoint --init clover-test --out runs/clover-test")


def _decode_config(args):
    """The `DecodeConfig` of the command line (raises ValueError / TypeError for bad values)."""

    if args.memory_mode is None:  # the model's best measured mode, labelled in the summary line
        model_dir = getattr(args, "model_dir", args.model)  # a hub id's snapshot (`_resolve_model`)
        args.memory_mode, args.memory_mode_why = (
            best_memory_mode(model_dir, name=getattr(args, "model_id", None)) if Path(model_dir).is_dir()
            else ("state", None))
    return DecodeConfig(block_size=args.block_size, threshold=args.threshold, max_new_tokens=args.max_new_tokens,
                        max_steps=args.max_steps, policy=args.policy, tokens_per_step=args.tokens_per_step,
                        max_entropy=args.max_entropy, factor=args.factor, memory_mode=args.memory_mode,
                        repetition_penalty=args.repetition_penalty, eos_bias_soft_limit=args.eos_bias_soft_limit)


def _official_sampler(args, caps) -> (LLaDASampler | DreamSampler | FastDLLMv2Sampler | SDARSampler | LLaDA2Sampler
                                      | LLaDA21Sampler):
    """The official sampler that ``--sampler`` names, from the command line's settings.

    Raises:
        ValueError: a model of another family, or values the sampler refuses (LLaDA: ``--max-new-tokens`` a
            multiple of ``--block-size``, ``--steps`` of the block count; Fast-dLLM v2: ``--block-size`` a
            multiple of ``--small-block-size``; SDAR: a temperature of 0).
    """
    if args.sampler in ("fast_dllm_v2", "sdar", "llada2", "llada21"):
        if caps.family != "block_causal":
            raise ValueError(f"--sampler {args.sampler} runs on a Fast-dLLM v2, SDAR or LLaDA2.0 checkpoint; {args.model} "
                             f"is a {caps.family} model -- leave --sampler out to use the block decoder")
        if args.sampler == "llada21":
            return LLaDA21Sampler(gen_length=args.max_new_tokens, block_length=args.block_size, threshold=args.threshold,
                                  editing_threshold=args.editing_threshold, max_post_steps=args.max_post_steps,
                                  temperature=args.temperature, top_k=args.top_k or None, seed=args.seed)
        if args.sampler == "llada2":
            return LLaDA2Sampler(gen_length=args.max_new_tokens, block_length=args.block_size,
                                 steps=args.steps or args.block_size, threshold=args.threshold,
                                 temperature=args.temperature, top_k=args.top_k or None, seed=args.seed,
                                 kv_cache=args.kv_cache)
        if args.sampler == "fast_dllm_v2":
            return FastDLLMv2Sampler(max_new_tokens=args.max_new_tokens, block_size=args.block_size,
                                     small_block_size=min(args.small_block_size, args.block_size),
                                     threshold=args.threshold, temperature=args.temperature, seed=args.seed)
        temperature = args.temperature if args.temperature > 0 else 1.0  # SDAR divides by it: 0 means its default
        return SDARSampler(gen_length=args.max_new_tokens, block_length=args.block_size,
                           denoising_steps=args.steps or args.block_size, temperature=temperature, top_k=args.top_k,
                           remasking_strategy=args.remasking_strategy, confidence_threshold=args.threshold,
                           seed=args.seed)
    if caps.family != "masked_diffusion":
        raise ValueError(f"--sampler {args.sampler} runs on a LLaDA or Dream checkpoint; {args.model} is a "
                         f"{caps.family} model -- leave --sampler out to use the block decoder")
    steps = args.steps if args.steps is not None else args.max_new_tokens
    if args.sampler == "llada":
        return LLaDASampler(gen_length=args.max_new_tokens, block_length=args.block_size, steps=steps,
                            temperature=args.temperature, remasking=args.remasking, seed=args.seed)
    return DreamSampler(max_new_tokens=args.max_new_tokens, steps=steps, alg=args.alg, alg_temp=args.alg_temp,
                        temperature=args.temperature, seed=args.seed)


def forced_past_answer(trace, end_position: int) -> int:
    """Forced slots written at absolute positions >= ``end_position`` (the kept answer's end:
    prompt length + kept tokens) -- end-of-text slots and anything after the first EOS.

    Args:
        trace: the decode's `clover_engine.recording.trace.Trace` (None: 0).
        end_position: the first position after the kept answer.
    """
    if trace is None:
        return 0
    n = 0
    for ev in trace.steps:
        slots = np.flatnonzero(ev.forced)
        n += int(np.sum(ev.position_start + slots >= end_position))
    return n


def _model_name(args) -> str:
    """The model's name in the summary line: its hub id when ``--model`` named one, else the folder's name."""
    return getattr(args, "model_id", None) or Path(args.model).name


def _mode_note(args) -> str:
    """`` (default: <why>)`` when the memory mode was chosen by `best_memory_mode`, else ``""``."""
    why = getattr(args, "memory_mode_why", None)
    return f" (default: {why})" if why else ""


def _policy_label(dc) -> str:
    """The policy and the one setting it reads (``threshold`` only for the policies that use it)."""
    setting = {"low_confidence": f"threshold={dc.threshold}", "margin": f"threshold={dc.threshold}",
               "top_k": f"tokens_per_step={dc.tokens_per_step}", "entropy": f"max_entropy={dc.max_entropy}",
               "factor": f"factor={dc.factor}", "verify": "(the target verifies each drafted block)"}[dc.policy]
    return f"policy={dc.policy} {setting}"


def _main_parallel(args, threads: int) -> int:
    """``--parallel ep=N`` / ``tp=N`` / ``ep=N,tp=N`` under torchrun: every rank decodes with its share of the
    experts and / or heads; rank 0 reports."""
    import torch.distributed as dist  # local: torch.distributed and the parallel decode load only under torchrun

    from clover_engine.decoding import parallel  # local: it imports torch.distributed at module level

    rank = int(os.environ.get("RANK", "0"))
    try:
        split = parallel.parse_parallel(args.parallel)
        label = ",".join(f"{k}={v}" for k, v in split.items())
        timeout = parallel.DEFAULT_TIMEOUT_S if args.parallel_timeout is None else args.parallel_timeout
        rank, world, device = parallel.init_distributed(timeout)
        for key, n in split.items():
            if n != world:
                raise ValueError(f"--parallel {key}={n} needs {n} processes, torchrun started {world} "
                                 f"(torchrun --nproc-per-node {n} ...; ep and tp split over the same ranks)")
        _resolve_model(args)
        dc = _decode_config(args)
        _check_model_dir(args.model_dir)
        if _model_type(args.model_dir) not in (None, "clover"):  # a public MoE family: its own expert split
            return _main_family_parallel(args, split, rank, world, device, threads)
        if args.sampler != "block":
            raise ValueError(f"--sampler {args.sampler} runs on its family's checkpoints; {args.model} is a Clover one")
        model = load_model(args.model_dir, device=device)
        if args.model_id is not None:  # a hub model: traces record its hub id
            model.model_id = args.model_id
        if split.get("ep", 1) > 1:
            parallel.shard_experts(model)
        if split.get("tp", 1) > 1:
            parallel.shard_heads(model)
        tokenizer = load_tokenizer(args.model_dir)
        parallel.reset_shards(model)
        result = BlockDecoder(model, tokenizer, dc).generate(args.prompt, record_trace=True)
        per_rank = parallel.rank_bytes_read(model, result) if max(split.values()) > 1 else None
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        print(f"rank {rank}: error: {e}", file=sys.stderr)
        return 2
    if rank == 0:
        print(result.text)
        if per_rank is not None:
            experts = per_rank["routed_expert_bytes_per_rank"]
            read = (f"read per rank (MB): {', '.join(f'{b / 1e6:.1f}' for b in per_rank['bytes_read_per_rank'])} "
                    f"({'routed experts ' + ', '.join(f'{b / 1e6:.2f}' for b in experts) + '; ' if experts else ''}"
                    f"one process: {per_rank['bytes_read'] / 1e6:.1f})")
        else:  # one process: nothing split
            read = f"read {result.bytes_read / 1e6:.1f} MB (cost model)"
        print(
            f"[{_model_name(args)}] {label} block_size={dc.block_size} threshold={dc.threshold} "
            f"memory_mode={dc.memory_mode}{_mode_note(args)} | "
            f"tokens={len(result.tokens)} NFE={result.nfe} tokens/forward={result.tokens_per_forward:.2f} "
            f"forced={result.n_forced} tokens/s={result.tokens_per_s:.1f} stop={result.stop_reason} | "
            f"{read} | threads={threads}"
        )
        if args.trace is not None:
            print(f"trace saved to {result.trace.save(args.trace)}")
    # every rank past its last collective before any tears down (a rank that exits first closes its
    # gloo pairs under the others), and the split model (DTensor meshes hold the group) dropped first
    dist.barrier()
    del model
    dist.destroy_process_group()
    return 0


def _model_type(model_dir: str) -> str | None:
    """``config.json``'s ``model_type`` of a checkpoint directory, or None (none given: a Clover config's default)."""
    import json  # local: one read, only here

    try:
        return json.loads((Path(model_dir) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def _main_family_parallel(args, split: dict, rank: int, world: int, device: str, threads: int) -> int:
    """``--parallel ep=N`` on a public MoE family (LLaDA-MoE, LLaDA2.0 / 2.1, SDAR-MoE): each rank loads only its
    share of the routed experts and decodes with the family's sampler (``--sampler``) or threshold decoding; rank 0
    prints the answer and each rank's experts per forward (`clover_engine.decoding.expert_parallel`)."""
    import torch.distributed as dist  # local: only under torchrun

    from clover_engine.decoding import expert_parallel as ep  # local: only under torchrun

    if split.get("tp", 1) > 1:
        print(f"rank {rank}: error: --parallel tp= covers Clover checkpoints; {args.model} splits its experts "
              f"only (--parallel ep={world})", file=sys.stderr)
        return 2
    try:
        model = ep.load_expert_parallel(args.model_dir, rank, world, device=device, dtype=args.dtype)
        if args.model_id is not None:
            model.model_id = args.model_id
        caps = capabilities_of(model)
        dc = _official_sampler(args, caps) if args.sampler != "block" else _decode_config(args)
        tokenizer = load_tokenizer(args.model_dir)
        decoder = decoder_for(model, tokenizer, dc)
        prompt = model_input(args.prompt, model, raw=args.raw_prompt).text
        unions = ep.RankUnionRecorder(model)
        result = decoder.generate(prompt, hooks=[unions], record_trace=True)
        summary = unions.summary(ep.expert_weight_bytes(model))
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        print(f"rank {rank}: error: {e}", file=sys.stderr)
        return 2
    if rank == 0:
        print(result.text)
        mean = ", ".join(f"{u:.1f}" for u in summary["rank_union_mean"])
        peak = max(summary["imbalance"], default=1.0)
        print(f"[{_model_name(args)}] ep={world} {args.sampler} | tokens={len(result.tokens)} NFE={result.nfe} "
              f"stop={result.stop_reason} | experts run per forward, per rank (summed over layers): {mean}; "
              f"busiest rank / mean at most {peak:.2f} | threads={threads}")
        if args.trace is not None:
            result.trace.meta["expert_parallel"] = summary
            print(f"trace saved to {result.trace.save(args.trace)}")
    dist.barrier()
    del model
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
