"""Adapt a pretrained transformers chat model to block diffusion (Fast-dLLM v2 style), with LoRA.

    # 1. self-distillation data: the base's own greedy answers (cached under runs/, resumable)
    python -m clover_engine.training.causal_lm distill --out runs/smollm2/distill.jsonl --n 600 --threads 1
    # 2. adaptation (also `python -m clover_engine.train causal-lm ...`, or `python -m clover_engine.train --init-from
    #    smollm2-135m-instruct --objective block-diffusion ...`; step 1 also `python -m clover_engine.train causal-lm distill`)
    python -m clover_engine.train --init-from smollm2-135m-instruct --objective block-diffusion \\
        --out runs/smollm2-bd --data runs/smollm2/distill.jsonl --minutes 70 --threads 1 [--resume]

Objective, per example (one conversation, ChatML, blocks aligned at absolute
positions k * b from the row's start, as the decoder aligns them):

* **clean stream**, causal mask: the ordinary autoregressive loss on the answer
  tokens (keeps ``block_size=1`` close to the base's greedy path);
* **a noisy copy of each block that holds answer tokens**: block k (slots
  s .. s+b-1) becomes the window ``[x_{s-1}, noisy_s .. noisy_{s+b-2}]`` at
  positions ``s-1 .. s+b-2`` -- exactly what `clover_engine.backbones.causal_lm.model` feeds the model
  at decode time (token shift) -- attending to the clean prefix ``x_0 ..
  x_{s-2}`` and bidirectionally to itself. Per block a mask ratio
  ``t ~ U(0, 1]``; each answer slot is masked with probability t (at least
  one); prompt slots inside the block stay clean, like the decoder's prefilled
  prompt head. With ``--suffix-share p``, a share p of the blocks is instead
  masked the way left-to-right threshold decoding leaves a block (slots from a
  uniformly drawn k on masked, the ones before it committed). Loss:
  cross-entropy of output j against ``x_{s+j}`` on masked slots;
* **block sizes mixed** per example (``--block-sizes``, default 4/8/16/32
  weighted 1:2:2:3), so every block size of the explorer is in distribution;
* loss = masked-slot CE + ``--ar-weight`` x clean AR CE.

Everything goes through one forward per example: ``[clean row ++ windows]``
with one 4D additive mask and explicit position ids
(`clover_engine.training.causal_lm_objective.build_example`).

Parameters: LoRA (peft; rank ``--lora-r`` on q/k/v/o/gate/up/down) plus the
MASK input embedding (`clover_engine.backbones.causal_lm.adapter`); the base stays frozen and is never
written. The output directory is a loadable model (``clover_engine.load_model(OUT)``):
``config.json``, ``adapter_config.json``, ``adapter_model.safetensors`` (bf16),
``mask_embedding.safetensors``, plus ``train_state.pt`` (optimizer, progress)
and ``train_log.jsonl``. ``--resume`` continues from them (the learning rate
follows a cosine over the total ``--minutes``).

Data: the self-distillation file (``distill``: prompts from
`clover_engine.data.chat_prompts.training_prompts`, answers = the base's greedy
``generate``) and, with ``--agent-share``, tool-call conversations from
`clover_engine.data.agent` (ChatML, loss on the assistant turns).

``--tiny`` swaps the base for a tiny random Llama (tests, and the CPU path of
``benchmarks/adapt_smollm2_gpu.sh``). ``--device cuda --dtype bf16`` is the GPU path
(autocast bf16, fused AdamW).

Training wing. This module is the recipe's training loop (`train`) and its command line
(``python -m clover_engine.train causal-lm [distill]``, the ``causal-lm`` row of `clover_engine.train.RECIPES`;
``python -m clover_engine.training.causal_lm [distill]`` is the same command); the jobs it drives are
`clover_engine.training.causal_lm_objective` (examples and losses), `clover_engine.training.causal_lm_data`
(the distill file and the example stream) and `clover_engine.training.causal_lm_lora` (LoRA and the
adapter directory).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

# parse_block_weights (--block-sizes, default clover_engine.backbones.causal_lm.adapter.DEFAULT_BLOCK_WEIGHTS) belongs to the
# adapter's recipe, which clover_engine.backbones.causal_lm.adapter.largest_trained_block reads back
from clover_engine.backbones.causal_lm.adapter import (BASES, MASK_EMBEDDING, base_spec, load_base, locate_base,
                                                parse_block_weights)
from clover_engine.backbones.causal_lm.model import HFBlockConfig, HFBlockDiffusionModel, count_parameters
from clover_engine.training.causal_lm_data import DEFAULT_DISTILL, ExampleSource, distill
from clover_engine.training.causal_lm_lora import load_adapter_weights, make_trainable, save_adapter, tiny_lm
from clover_engine.training.causal_lm_objective import batch_loss, build_example, heldout_loss
from clover_engine.tokenizer import byte_tokenizer
from clover_engine.backbones.causal_lm.adapter import load_base_tokenizer


def lr_at(frac: float, base: float, warmup_frac: float = 0.03) -> float:
    if frac < warmup_frac:
        return base * frac / warmup_frac
    return base * 0.5 * (1 + math.cos(math.pi * min(1.0, (frac - warmup_frac) / (1 - warmup_frac))))


def train(args) -> int:
    from tqdm import tqdm

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    autocast = torch.bfloat16 if args.dtype == "bf16" else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        tok = byte_tokenizer()  # bytes + the project's special tokens (< 320 ids)
        V = 320
        if tok.get_vocab_size() >= V:
            raise SystemExit(f"--tiny: the byte tokenizer has {tok.get_vocab_size()} ids, the tiny model {V}")
        lm = tiny_lm(V)
        mask_id, eos_id, base_name = V - 1, 2, "tiny-random-llama"
        out.mkdir(parents=True, exist_ok=True)
        tok.save(str(out / "tokenizer.json"))  # byte-level, so the eval can encode prompts
        src = ExampleSource(tok, args.data, 0.0, args.seed, args.max_len, eos_id, synthetic_vocab=V,
                            holdout=args.heldout_rows)
    else:
        spec = base_spec(args.init_from)
        locate_base(spec.name)
        lm, hf_tok = load_base(spec.name)

        _, tok = load_base_tokenizer(spec.name)
        mask_id, eos_id, base_name = spec.mask_token_id, spec.eos_token_id, spec.name
        src = ExampleSource(tok, args.data or DEFAULT_DISTILL, args.agent_share, args.seed, args.max_len,
                            eos_id, open_tools_share=args.open_tools_share, holdout=args.heldout_rows)
    if args.full_finetune and (args.init_adapter is not None or args.resume):
        raise SystemExit("error: --full-finetune starts from the base alone (no --init-adapter / --resume): its "
                         "weights are not written, it measures the LoRA choice")
    plm, mask_init = make_trainable(lm, args.lora_r, args.lora_alpha, mask_id, full=args.full_finetune)
    if args.init_adapter is not None and not (args.resume and (out / "train_state.pt").is_file()):
        mask_init = load_adapter_weights(plm, Path(args.init_adapter))
    hcfg = HFBlockConfig.from_hf(lm.config, out.name, mask_id, eos_id, num_parameters=count_parameters(lm))
    model = HFBlockDiffusionModel(plm, hcfg, mask_init).to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    n_train = sum(p.numel() for p in params)
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98), fused=fused)
    state_path = out / "train_state.pt"
    step, elapsed, tokens = 0, 0.0, 0
    if args.resume and state_path.is_file():
        from peft import set_peft_model_state_dict

        st = torch.load(state_path, map_location="cpu", weights_only=True)
        set_peft_model_state_dict(plm, {k: v.float() for k, v in st["lora"].items()})
        model.mask_embedding.data.copy_(st["mask_embedding"])
        opt.load_state_dict(st["optimizer"])
        step, elapsed, tokens = st["step"], st["elapsed"], st["tokens"]
        src.rng.seed(args.seed + step)
        print(f"resumed {out} at step {step} ({elapsed / 60:.1f} min, {tokens} tokens)", file=sys.stderr)
    bw = parse_block_weights(args.block_sizes)
    sizes, weights = list(bw), list(bw.values())
    gen = random.Random(args.seed * 7919 + step)
    total_s = args.minutes * 60
    stop_s = min(total_s, elapsed + args.stop_after_min * 60) if args.stop_after_min else total_s
    log = open(out / "train_log.jsonl", "a")
    extra = {"recipe": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
             "trainable_parameters": n_train}

    def score_heldout() -> dict:
        if not src.heldout:
            return {}
        d, a = heldout_loss(model, src.heldout, mask_id, eos_id, device, autocast)
        print(f"held-out ({len(src.heldout)} rows) at {elapsed / 60:.1f} min, {tokens} tokens: masked-slot CE {d:.4f}, "
              f"AR CE {a:.4f}", file=sys.stderr)
        log.write(json.dumps({"step": step, "min": round(elapsed / 60, 3), "tokens": tokens, "heldout_diff": d,
                              "heldout_ar": a}) + "\n")
        log.flush()
        return {"heldout_diff": d, "heldout_ar": a}

    def save():
        from peft import get_peft_model_state_dict

        if args.full_finetune:  # a measurement run: the shipped format is an adapter
            score_heldout()
            return
        extra.update(score_heldout())
        save_adapter(model, out, base_name, {**extra, "step": step, "tokens": tokens, "minutes": elapsed / 60})
        torch.save({"lora": {k: v.detach().cpu() for k, v in get_peft_model_state_dict(plm).items()},
                    "mask_embedding": model.mask_embedding.detach().cpu(), "optimizer": opt.state_dict(),
                    "step": step, "elapsed": elapsed, "tokens": tokens}, state_path)

    last_save = elapsed
    t_mark = time.perf_counter()
    ema = None
    bar = tqdm(total=int(total_s), initial=int(elapsed), unit="s", desc="adapt", disable=args.no_progress)
    what = "full fine-tune + MASK embedding" if args.full_finetune else f"LoRA r={args.lora_r} + MASK embedding"
    print(f"training {n_train:,} parameters ({what}); {len(src)} distilled rows"
          + (f", {len(src.heldout)} held out" if src.heldout else ""), file=sys.stderr)
    if src.heldout and step == 0:
        score_heldout()
    while elapsed < stop_s and (args.max_steps is None or step < args.max_steps):
        lr = lr_at(elapsed / total_s, args.lr)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        tot_d = tot_a = 0.0
        n_tok = 0
        for _ in range(args.accum):
            exs = []
            while len(exs) < args.batch:
                ids, a0 = src.next()
                b = gen.choices(sizes, weights)[0]
                ex = build_example(ids, a0, b, mask_id, gen, eos_id, args.suffix_share)
                if ex is not None:
                    exs.append(ex)
            loss, d, a = batch_loss(model, exs, args.ar_weight, device, autocast, pad_id=eos_id)
            (loss / args.accum).backward()
            tot_d += float(d.detach()) / args.accum
            tot_a += float(a.detach()) / args.accum
            n_tok += sum(e["n_clean"] for e in exs)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        tokens += n_tok
        now = time.perf_counter()
        dt, t_mark = now - t_mark, now
        elapsed += dt
        ema = tot_d if ema is None else 0.95 * ema + 0.05 * tot_d
        bar.update(int(elapsed) - bar.n)
        bar.set_postfix(step=step, diff=f"{ema:.3f}", ar=f"{tot_a:.3f}", tok_s=f"{n_tok / dt:.0f}")
        log.write(json.dumps({"step": step, "min": round(elapsed / 60, 3), "lr": lr, "diff_loss": tot_d,
                              "ar_loss": tot_a, "tokens": tokens, "tok_s": n_tok / dt}) + "\n")
        log.flush()
        if step % 25 == 0:
            src.reload()
        if elapsed - last_save >= args.save_every_min * 60:
            save()
            last_save = elapsed
            if args.snapshot:
                import shutil

                snap = out / "snapshots" / f"step{step:06d}"
                snap.mkdir(parents=True, exist_ok=True)
                for f in ("config.json", "adapter_config.json", "adapter_model.safetensors", MASK_EMBEDDING):
                    shutil.copy2(out / f, snap / f)
    bar.close()
    save()
    print(f"{'finished' if args.full_finetune else 'saved'} {out} at step {step}: {tokens} tokens in {elapsed / 60:.1f} min "
          f"({tokens / max(elapsed, 1e-9):.1f} clean tokens/s)", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m clover_engine.train --objective block-diffusion",
                                 description="Adapt a pretrained chat model to block diffusion (LoRA).")
    ap.add_argument("--init-from", default="smollm2-135m-instruct", help=f"pinned base: {', '.join(BASES)}")
    ap.add_argument("--objective", default="block-diffusion", choices=["block-diffusion"],
                    help="training objective (only block-diffusion: masked blocks plus an AR term)")
    ap.add_argument("--out", type=Path, required=True, help="adapter directory to write (LoRA, MASK embedding, log)")
    ap.add_argument("--data", type=Path, default=None,
                    help=f"distill JSONL (default {DEFAULT_DISTILL}; with --tiny: synthetic rows unless given)")
    ap.add_argument("--agent-share", type=float, default=0.0, help="share of tool-call chats (clover_engine.data.agent)")
    ap.add_argument("--open-tools-share", type=float, default=0.0,
                    help="share of open-vocabulary tool-call chats (clover_engine.data.open_tools, train vocabulary)")
    ap.add_argument("--init-adapter", type=Path, default=None,
                    help="start from this adapter directory's LoRA and MASK embedding (a new stage)")
    ap.add_argument("--minutes", type=float, default=70.0, help="total time budget (all resumes; lr schedule)")
    ap.add_argument("--stop-after-min", type=float, default=None, help="stop this invocation early")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="stop after this many optimizer steps (default: only --minutes limits the run)")
    ap.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (default %(default)s)")
    ap.add_argument("--lora-r", type=int, default=8, help="LoRA rank (default %(default)s)")
    ap.add_argument("--lora-alpha", type=int, default=16, help="LoRA alpha; the update is scaled by alpha / r (default %(default)s)")
    ap.add_argument("--ar-weight", type=float, default=0.5,
                    help="weight of the autoregressive next-token loss added to the masked-slot loss (default %(default)s)")
    ap.add_argument("--block-sizes", default=None, help="b:weight,... (default 4:1,8:2,16:2,32:3)")
    ap.add_argument("--suffix-share", type=float, default=0.0,
                    help="share of blocks with decode-aligned masking (clean block prefix, masked suffix)")
    ap.add_argument("--accum", type=int, default=4, help="forwards (of --batch examples) per optimizer step")
    ap.add_argument("--batch", type=int, default=1, help="examples per forward (padded; GPU: 32-128)")
    ap.add_argument("--max-len", type=int, default=256, help="tokens per training example, longer ones cut (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the data order and masking (default %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared 2-core CPU)")
    ap.add_argument("--device", default="cpu", help="torch device to train on: cpu, cuda, cuda:1 ... (default %(default)s)")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16 = autocast (GPU only)")
    ap.add_argument("--save-every-min", type=float, default=10.0, help="minutes between adapter saves to --out (default %(default)s)")
    ap.add_argument("--snapshot", action="store_true", help="keep a copy of each saved adapter under OUT/snapshots")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run in --out from its train_state.pt (adapter, optimizer, elapsed time)")
    ap.add_argument("--heldout-rows", type=int, default=0,
                    help="keep the distill file's last N rows out of training and log their masked-slot and AR "
                         "loss (same noise every time) at the start and at every save")
    ap.add_argument("--full-finetune", action="store_true",
                    help="train every weight instead of a LoRA (a measurement of the LoRA choice at equal CPU time: "
                         "logs losses, writes no weights)")
    ap.add_argument("--tiny", action="store_true", help="tiny random Llama + synthetic rows (tests)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (the log only)")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "distill":
        ap = argparse.ArgumentParser(prog="python -m clover_engine.training.causal_lm distill",
                                     description="Write the base model's greedy answers to training prompts (JSONL).")
        ap.add_argument("--out", type=Path, default=Path("runs/smollm2/distill.jsonl"),
                        help="JSONL file to append to; a re-run resumes where it stopped (default %(default)s)")
        ap.add_argument("--n", type=int, default=600, help="training prompts to answer (default %(default)s)")
        ap.add_argument("--batch", type=int, default=8, help="prompts answered per generate call (default %(default)s)")
        ap.add_argument("--max-new-tokens", type=int, default=96, help="tokens per answer at most (default %(default)s)")
        ap.add_argument("--seed", type=int, default=0, help="seed of the prompt draw (default %(default)s)")
        ap.add_argument("--source", default="templates", choices=["templates", "self-instruct", "tools"],
                        help="prompts: the templated set, questions the base writes itself "
                             "(clover_engine.data.self_instruct; kept in <out>.prompts.txt), or tool-call chats of the "
                             "training vocabulary (clover_engine.data.open_tools.train_turns) (default %(default)s)")
        ap.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s)")
        ap.add_argument("--base", default="smollm2-135m-instruct",
                        help=f"pinned base: {', '.join(BASES)} (default %(default)s)")
        ap.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1 ... (default %(default)s)")
        ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                        help="weights' dtype while generating (bf16 for --device cuda) (default %(default)s)")
        a = ap.parse_args(argv[1:])
        torch.set_num_threads(a.threads)
        distill(a.out, a.n, a.batch, a.max_new_tokens, a.seed, a.base, a.device, a.dtype, a.source)
        return 0
    args = build_parser().parse_args(argv)
    if args.dtype == "bf16" and args.device == "cpu":
        raise SystemExit("error: --dtype bf16 is for --device cuda; on this CPU bf16 is far slower than fp32")
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
