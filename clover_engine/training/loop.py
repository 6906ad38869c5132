"""Block-diffusion training of a small Clover model on the CPU (docs/architecture.md §9).

`main` = `parse_args` -> `setup_model` -> `make_optimizer` -> repeat `draw_batch` /
`train_step` / `evaluate` / `save` until the time budget is spent. The learning rate follows
`lr_at` over the *time* budget (``--minutes``), so a resumed run continues the same schedule.
The command line and its stages are described in `clover_engine.train`.

Wing: ``training``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from clover_engine.checkpoint import load_model, save_model
from clover_engine.backbones.clover.model import CloverModel
from clover_engine.training.masking import mask_blocks
from clover_engine.training.probes import heldout_loss, open_name_probe, quick_agent_eval, value_probe
from clover_engine.training.rows import RECALL_VOCABS, RowSource, pack_conversations
from clover_engine.training.surgery import (
    ATTENTION_CONV_WEIGHT,
    SIZES,
    init_induction_heads,
    with_attention_conv,
    with_front_attention,
)
from clover_engine.data.agent import EVAL_SEED_START, iter_conversations
from clover_engine.threads import add_threads_argument, configure_threads

# Block sizes and their sampling weights, and the row length / batch used for each.
BLOCK_SIZE_WEIGHTS = {1: 0.04, 2: 0.04, 4: 0.08, 8: 0.1, 16: 0.14, 32: 0.4, 64: 0.2}
# (row length, rows per batch) per block size: rows long enough to hold a system turn, a request
# and its calls; two rows per step (more, smaller steps learn copying faster per CPU-minute).
ROW_SHAPE = {1: (640, 1), 2: (640, 1), 4: (1024, 1), 8: (1024, 2), 16: (1024, 2), 32: (1024, 2), 64: (1024, 2)}
WINDOW_DROP = 0.35  # share of batches trained in `state` mode (window W = 0)
AUX_WEIGHT = 0.01  # weight of the MoE load-balancing loss


@dataclass
class Progress:
    """What a resumed run continues from (saved in ``train_state.pt``)."""

    step: int = 0
    elapsed_s: float = 0.0  # training time so far, evaluation excluded
    tokens: int = 0


def lr_at(frac: float, base: float, warmup_frac: float = 0.02) -> float:
    """Linear warm-up then cosine to 10 % of `base`, over the fraction of the time budget."""
    if frac < warmup_frac:
        return base * frac / warmup_frac
    p = min(1.0, (frac - warmup_frac) / (1 - warmup_frac))
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def parse_block_weights(spec: str) -> dict[int, float]:
    """``"1:0.25,32:0.5"`` -> {1: 0.25, 32: 0.5}: block sizes (keys of `ROW_SHAPE`) and their sampling weights.

    Raises:
        SystemExit: a malformed entry, a block size without a row shape, or no positive weight.
    """
    out = {}
    for item in spec.split(","):
        try:
            L, w = item.split(":")
            out[int(L)] = float(w)
        except ValueError:
            raise SystemExit(f"--block-weights: expected 'L:weight,...' like '1:0.25,32:0.75', got {item!r}") from None
    bad = [L for L in out if L not in ROW_SHAPE]
    if bad or not any(w > 0 for w in out.values()) or any(w < 0 for w in out.values()):
        raise SystemExit(f"--block-weights: block sizes must be among {sorted(ROW_SHAPE)} with weights >= 0, "
                         f"not all 0; got {spec!r}")
    return out


# ----------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m clover_engine.train", description=__doc__.splitlines()[0],
                                 epilog="This is the clover recipe, the default (python -m clover_engine.train [clover] ...); "
                                        "python -m clover_engine.train causal-lm --help shows the recipe that adapts a "
                                        "pretrained transformers model (clover_engine.train.RECIPES).")
    ap.add_argument("--out", type=Path, default=Path("runs/clover-train"),
                    help="output checkpoint directory (default runs/clover-train, never the bundled model; "
                         "an existing checkpoint there is refused unless --resume or --overwrite)")
    ap.add_argument("--overwrite", action="store_true",
                    help="allow --out to be a directory that already holds a checkpoint (it is replaced)")
    ap.add_argument("--tokenizer", type=Path, default=Path("models/clover-tiny/tokenizer.json"),
                    help="tokenizer.json to train with (default %(default)s; build one with "
                         "python -m clover_engine.data.tokenizer --out PATH)")
    ap.add_argument("--minutes", type=float, default=100.0, help="total training time budget (all resumes)")
    ap.add_argument("--stop-after-min", type=float, default=None, help="stop this invocation early (resume later)")
    ap.add_argument("--lr", type=float, default=1.5e-3, help="peak learning rate (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the data (default %(default)s)")
    add_threads_argument(ap)  # default 1 on a 2-core machine: fastest when other processes share the cores
    ap.add_argument("--save-every-min", type=float, default=10.0,
                    help="minutes between checkpoints written to --out (default %(default)s)")
    ap.add_argument("--eval-every-min", type=float, default=15.0,
                    help="minutes between held-out evaluations in the log (default %(default)s)")
    ap.add_argument("--eval-tasks", type=int, default=24,
                    help="held-out tool-call tasks decoded at each evaluation (0 = skip; default %(default)s)")
    ap.add_argument("--easy-share", type=float, default=0.0,
                    help="share of agent rows drawn from the short curriculum conversations (0..1)")
    ap.add_argument("--recall-share", type=float, default=0.0,
                    help="share of batches of associative-recall rows (RowSource.recall_row: cue -> value pairs "
                         "in stdlib code, queried later; the loss is on the copied values only)")
    ap.add_argument("--window-drop", type=float, default=WINDOW_DROP,
                    help="share of batches trained in `state` mode (window W = 0)")
    ap.add_argument("--recall-vocab", choices=RECALL_VOCABS, default="code",
                    help="where recall cues and values come from (RowSource.recall_row): the code unigram, "
                         "the whole vocabulary uniformly, the ids of tool-call argument values, or 'calls': "
                         "request-style key/value clauses queried by a call's arguments object (call_recall_row)")
    ap.add_argument("--recall-block-size", type=int, default=None,
                    help="block size of every recall batch (e.g. 1: the copy head forms at block size 1 in copy_toy; "
                         "default: drawn like any batch)")
    ap.add_argument("--recall-shape", type=str, default=None,
                    help="'T,B': row length and rows per recall batch (default: ROW_SHAPE of the block size); "
                         "e.g. 128,16 = copy_toy's recall batches")
    ap.add_argument("--attention-conv", type=int, default=0,
                    help="with --init-from: add a causal conv of this many taps on the attention "
                         "layers' q/k/v (identity-initialised; 0 = keep the checkpoint's layout)")
    ap.add_argument("--induction-heads", type=int, default=0,
                    help="fresh run or --init-from: re-initialise the q/k conv taps of this many kv heads per attention "
                         "layer to read the preceding tokens (init_induction_heads)")
    ap.add_argument("--attention-first", action="store_true",
                    help="fresh run: layer order (attention, GDN) x 2 and a 4-tap attention conv instead of "
                         "tiny_config()'s GDN-first order (the order that learned content copying in copy_toy)")
    ap.add_argument("--front-attention", action="store_true",
                    help="with --init-from: put an induction-initialised attention layer in front (with_front_attention)")
    ap.add_argument("--conv-lr-mult", type=float, default=1.0,
                    help="learning-rate multiplier of the attention conv taps (e.g. 10 when they were just "
                         "added identity-initialised by --attention-conv and must move fast)")
    ap.add_argument("--copy-weight", type=float, default=1.0,
                    help="loss weight of masked tokens that are copied argument values of tool calls "
                         "(1 = plain mean over masked slots)")
    ap.add_argument("--block-weights", type=str, default=None,
                    help="sampling weights of the block sizes as 'L:w,...' over " + ",".join(map(str, BLOCK_SIZE_WEIGHTS))
                         + " (default: BLOCK_SIZE_WEIGHTS, weighted toward 32)")
    ap.add_argument("--open-tools-share", type=float, default=0.0,
                    help="share of agent rows from the open-vocabulary tool-call corpus (clover_engine.data.open_tools, "
                         "train vocabulary: names and keys must be copied from the system turn)")
    ap.add_argument("--open-easy-share", type=float, default=0.0,
                    help="share of those open-vocabulary conversations that list only 1 or 2 tools and make one "
                         "call (a curriculum: first copy the listed name, then pick among several)")
    ap.add_argument("--code-source", default="stdlib", choices=["stdlib", "packages", "both"],
                    help="code rows from the standard library, the train packages of clover_engine.data.packages "
                         "(held-out packages never), or both")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (checkpoints are written from the CPU either way)")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                    help="bf16 = autocast on CUDA (weights, optimizer and loss stay fp32); fp32 on the CPU")
    ap.add_argument("--batch-mult", type=int, default=1,
                    help="rows per batch = ROW_SHAPE's rows x this (a GPU takes 32-64x the CPU batches)")
    ap.add_argument("--size", default="tiny", choices=["tiny", "small"],
                    help="fresh run: tiny_config (~6M parameters, CPU) or small_config (~70M, GPU)")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run in --out from its train_state.pt (weights, optimizer, elapsed time)")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="start from this checkpoint's weights with a fresh optimizer and schedule "
                         "(a second stage of training)")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate the command line; sets the torch thread count. Adds ``recall_shape_tb``
    ((T, B) or None) and ``block_weights_map`` ({L: weight}).

    Raises:
        SystemExit: an out-of-range option, a missing tokenizer, or options that do not combine.
    """

    args = build_parser().parse_args(argv)
    try:
        args.threads = configure_threads(args.threads)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: no CUDA device here; use --device cpu")
    if args.dtype == "bf16" and not args.device.startswith("cuda"):
        raise SystemExit("--dtype bf16 is for --device cuda; on the CPU train in fp32 (bf16 autocast is far slower "
                         "on CPUs without native bf16)")
    for name in ("easy_share", "window_drop", "recall_share", "open_tools_share", "open_easy_share"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise SystemExit(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(args, name)}")
    if not args.tokenizer.is_file():
        raise SystemExit(f"no tokenizer at {args.tokenizer}; build it: python -m clover_engine.data.tokenizer --out {args.tokenizer}")
    if args.attention_first and (args.resume or args.init_from is not None):
        raise SystemExit("--attention-first sets the layer order of a fresh run; drop it with --resume / --init-from")
    args.recall_shape_tb = None
    if args.recall_shape:
        parts = args.recall_shape.split(",")
        shape = tuple(int(x) for x in parts) if all(x.strip().isdigit() for x in parts) else ()
        if len(shape) != 2 or shape[0] < 32 or shape[1] < 1:
            raise SystemExit(f"--recall-shape must be 'T,B' with T >= 32 and B >= 1, e.g. 128,16; got {args.recall_shape!r}")
        args.recall_shape_tb = shape
    if args.recall_block_size is not None and args.recall_block_size not in ROW_SHAPE:
        raise SystemExit(f"--recall-block-size must be one of {list(ROW_SHAPE)}, got {args.recall_block_size}")
    return args


# ---------------------------------------------------------------------------- setup
def setup_model(args: argparse.Namespace, vocab_size: int) -> tuple[CloverModel, Progress, dict | None]:
    """The model to train: resumed from ``args.out``, grown from ``--init-from``, or fresh
    (`tiny_config`). Returns it (in train mode), the progress so far and, on resume, the saved
    ``train_state.pt`` (optimizer and progress).

    Raises:
        SystemExit: ``--resume`` without a ``train_state.pt`` in ``args.out``.
    """
    state_path = args.out / "train_state.pt"
    prog, saved = Progress(), None
    if args.resume:
        if not state_path.is_file():
            raise SystemExit(f"--resume: no {state_path}; start without --resume")
        model = load_model(args.out)
        saved = torch.load(state_path, weights_only=True)
        prog = Progress(**saved["progress"])
    elif args.init_from is not None:
        torch.manual_seed(args.seed)
        model = load_model(args.init_from)
        if args.attention_conv:
            model = with_attention_conv(model, args.attention_conv)
        if args.front_attention:
            model = with_front_attention(model)
    else:
        torch.manual_seed(args.seed)
        cfg = SIZES[args.size](vocab_size)
        if args.attention_first:
            cfg = dataclasses.replace(cfg, layer_types=["full_attention", "linear_attention"] * 2,
                                      attention_conv_kernel_dim=max(4, cfg.attention_conv_kernel_dim))
        model = CloverModel(cfg)
    if args.induction_heads and not args.resume:
        init_induction_heads(model, args.induction_heads)
    model.train()
    return model, prog, saved


def check_tokenizer_fits(cfg, tokenizer, tokenizer_path: Path, model_dir: Path) -> None:
    """Refuse a tokenizer that does not belong to the model: ids past the model's vocabulary (they
    would index past its embedding), or a MASK id that is an ordinary token of the tokenizer.

    Raises:
        SystemExit: naming both sizes / the token and the ``--tokenizer`` that fits.
    """
    own = Path(model_dir) / "tokenizer.json"
    fix = (f"pass the model's own tokenizer: --tokenizer {own}" if own.is_file() else
           f"{model_dir} has no tokenizer.json; pass the tokenizer its {cfg.vocab_size}-id vocabulary was built with")
    n = tokenizer.get_vocab_size(with_added_tokens=True)
    if n > cfg.vocab_size:
        raise SystemExit(f"error: --tokenizer {tokenizer_path} has {n} tokens but the model has a vocabulary of "
                         f"{cfg.vocab_size}; its ids would index past the model's embedding -- {fix}")
    tok = tokenizer.id_to_token(cfg.mask_token_id)
    if tok is not None and "mask" not in tok.lower():
        raise SystemExit(f"error: the model's MASK id {cfg.mask_token_id} is the token {tok!r} in --tokenizer "
                         f"{tokenizer_path}, so the tokenizer is not the model's -- {fix}")


def make_optimizer(model: CloverModel, lr: float, conv_lr_mult: float) -> torch.optim.AdamW:
    """AdamW (betas 0.9 / 0.95) in groups: matrices with weight decay 0.01, vectors without, and
    the attention conv taps (if any) without decay at ``lr * conv_lr_mult``. Each group's
    ``lr_mult`` scales the scheduled learning rate."""
    decay, no_decay, conv = [], [], []
    for n, p in model.named_parameters():
        (conv if n.endswith(ATTENTION_CONV_WEIGHT) else decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": 0.01, "lr_mult": 1.0},
              {"params": no_decay, "weight_decay": 0.0, "lr_mult": 1.0}]
    if conv:  # a few taps per channel: no decay, their own learning-rate multiplier
        groups.append({"params": conv, "weight_decay": 0.0, "lr_mult": conv_lr_mult})
    fused = next(model.parameters()).device.type == "cuda"  # one kernel per step on the GPU
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=fused)


def held_out_batches(tokenizer, mask_id: int) -> tuple[list, list]:
    """Fixed held-out batches as (clean [B, T], noisy [B, T], L) tuples: held-out conversations
    (seeds >= 10M) at block 32 and 4 with random masks, and held-out assistant turns with every
    call slot masked (the copy task itself)."""

    hgen = torch.Generator().manual_seed(123)
    convs = [tokenizer.encode(c.text).ids for c in iter_conversations(EVAL_SEED_START + 50_000, 12)]
    stream = [t for ids in convs for t in ids + [0]]
    agent = torch.tensor([stream[i * 512:(i + 1) * 512] for i in range(4)])
    held = [(agent, mask_blocks(agent, 32, mask_id, hgen), 32),
            (agent[:, :256], mask_blocks(agent[:, :256], 4, mask_id, hgen), 4)]
    hconvs = iter_conversations(EVAL_SEED_START + 60_000, None)
    rows = [pack_conversations(hconvs, tokenizer, 0, 1024) for _ in range(4)]
    call_clean = torch.tensor([r[0] for r in rows])
    call_focus = torch.tensor([r[1] for r in rows])  # r[2]: value flags, unused here
    held_call = [(call_clean, call_clean.masked_fill(call_focus, mask_id), 32)]
    return held, held_call


# ------------------------------------------------------------------------------ step
@dataclass
class Batch:
    clean: torch.Tensor  # [B, T] int64
    noisy: torch.Tensor  # [B, T] int64, MASK where the loss is
    value: torch.Tensor  # [B, T] bool, copied argument values (up-weighted by --copy-weight)
    L: int  # block size
    recall: bool  # an associative-recall batch


def draw_batch(src: RowSource, rng: random.Random, gen: torch.Generator, args: argparse.Namespace,
               block_weights: dict[int, float], mask_id: int) -> Batch | None:
    """Sample a block size, a batch of rows and its noise; None when nothing is masked (rare:
    short rows without assistant turns)."""
    L = rng.choices(list(block_weights), weights=list(block_weights.values()))[0]
    recall = args.recall_share > 0 and rng.random() < args.recall_share
    if recall and args.recall_block_size is not None:
        L = args.recall_block_size
    T, B = args.recall_shape_tb if recall and args.recall_shape_tb else ROW_SHAPE[L]
    B *= args.batch_mult
    T -= T % L
    clean, focus, value = src.batch(B, T, recall, args.recall_vocab)
    noisy = mask_blocks(clean, L, mask_id, gen, focus)
    if not bool((noisy == mask_id).any()):
        return None
    return Batch(clean, noisy, value, L, recall)


def train_step(model: CloverModel, opt: torch.optim.Optimizer, batch: Batch, use_window: bool,
               lr: float, copy_weight: float, step: int = 0,
               autocast_dtype: torch.dtype | None = None) -> tuple[float, float]:
    """One optimizer step (number ``step``, for the log) on ``batch``: loss = masked-slot cross-entropy (copied values weighted
    by ``copy_weight``) + `AUX_WEIGHT` x MoE load balancing, gradients clipped to norm 1. A
    non-finite loss or gradient skips the update. The batch moves to the model's device;
    ``autocast_dtype`` (``torch.bfloat16`` on CUDA) runs the forward under autocast, the loss in
    fp32. Returns (plain masked-slot loss in nats, gradient norm)."""
    mask_id = model.config.mask_token_id
    for group in opt.param_groups:
        group["lr"] = lr * group.get("lr_mult", 1.0)
    dev = next(model.parameters()).device
    clean, noisy, value = batch.clean.to(dev), batch.noisy.to(dev), batch.value.to(dev)
    with torch.autocast(dev.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        h, aux = model.forward_train(clean, noisy, batch.L, use_window)
        msk = noisy == mask_id
        logits = model.lm_head(h[msk])
    ce = F.cross_entropy(logits.float(), clean[msk], reduction="none")  # the loss in fp32
    loss = ce.mean()  # logged: the plain masked-slot loss
    w = 1.0 + (copy_weight - 1.0) * value[msk].float()  # up-weight copied argument values
    opt.zero_grad(set_to_none=True)
    ((ce * w).sum() / w.sum() + AUX_WEIGHT * aux).backward()
    gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    if math.isfinite(gnorm) and math.isfinite(float(loss.detach())):
        opt.step()
    else:  # never let one bad batch poison the weights
        tqdm.write(f"step {step}: non-finite loss/gradient (L={batch.L}); update skipped")
    return float(loss.detach()), gnorm


OPEN_PROBE_TASKS = 40
"""Eval turns of the unseen-tool name / key probe in the training log (runs with open-vocabulary
rows and ``--eval-tasks`` > 0)."""


def evaluate(model: CloverModel, tokenizer, held: list, held_call: list, eval_tasks: int,
             open_probe_tasks: int = 0) -> dict:
    """Held-out metrics for the log: masked-slot loss in both memory modes, call-slot loss and
    accuracy, the value-copy probe, (``eval_tasks`` > 0) a quick tool-call decode and
    (``open_probe_tasks`` > 0) the unseen-tool name / key probe (`probes.open_name_probe`)."""
    rec = {"heldout_loss_window": round(heldout_loss(model, held, True), 4),
           "heldout_loss_state": round(heldout_loss(model, held, False), 4)}
    for mode, win in (("window", True), ("state", False)):
        loss_c, acc_c = heldout_loss(model, held_call, win, with_accuracy=True)
        rec[f"heldout_call_loss_{mode}"], rec[f"heldout_call_acc_{mode}"] = round(loss_c, 4), round(acc_c, 4)
    rec["value_probe"] = value_probe(model, tokenizer, n_tasks=40)
    if eval_tasks:
        rec["agent_window"] = quick_agent_eval(model, tokenizer, eval_tasks, "state+window")
        rec["agent_state"] = quick_agent_eval(model, tokenizer, max(1, eval_tasks // 2), "state")
    if open_probe_tasks:
        rec["open_name_probe"] = open_name_probe(model, tokenizer, n_tasks=open_probe_tasks)
    return rec


# ------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    """Train until the time budget (or ``--stop-after-min``) is spent; writes ``train_log.jsonl``,
    the checkpoint and ``train_state.pt`` to ``--out``. Returns 0.

    Raises:
        SystemExit: invalid options, or ``--out`` holds a checkpoint without --resume / --overwrite.
    """
    from tokenizers import Tokenizer

    args = parse_args(argv)
    tokenizer = Tokenizer.from_file(str(args.tokenizer))
    block_weights = parse_block_weights(args.block_weights) if args.block_weights else dict(BLOCK_SIZE_WEIGHTS)
    if (args.out / "model.safetensors").is_file() and not (args.resume or args.overwrite):
        raise SystemExit(f"error: {args.out} already holds a checkpoint; training would overwrite it. Pass another "
                         f"--out, --resume to continue that run, or --overwrite to replace it")
    args.out.mkdir(parents=True, exist_ok=True)
    model, prog, saved = setup_model(args, tokenizer.get_vocab_size())
    if args.resume or args.init_from is not None:  # a fresh model is built for the tokenizer
        check_tokenizer_fits(model.config, tokenizer, args.tokenizer, args.out if args.resume else args.init_from)
    mask_id = model.config.mask_token_id
    model.to(args.device)
    opt = make_optimizer(model, args.lr, args.conv_lr_mult)
    if saved is not None:
        opt.load_state_dict(saved["optimizer"])
    print(f"clover-tiny: {sum(p.numel() for p in model.parameters()):,} parameters; step {prog.step}, "
          f"{prog.elapsed_s / 60:.1f} of {args.minutes} min done", flush=True)

    src = RowSource(tokenizer, args.seed + prog.step, args.easy_share, args.open_tools_share, args.code_source,
                    open_easy_share=args.open_easy_share)
    autocast_dtype = torch.bfloat16 if args.dtype == "bf16" else None
    gen = torch.Generator().manual_seed(args.seed * 7919 + prog.step)
    rng = random.Random(args.seed * 31 + prog.step)
    held, held_call = held_out_batches(tokenizer, mask_id)

    def save():
        save_model(model, args.out, tokenizer=tokenizer)
        torch.save({"optimizer": opt.state_dict(), "progress": prog.__dict__}, args.out / "train_state.pt")

    log = (args.out / "train_log.jsonl").open("a")
    budget_s = args.minutes * 60
    stop_s = budget_s if args.stop_after_min is None else min(budget_s, prog.elapsed_s + args.stop_after_min * 60)
    t_start = time.perf_counter() - prog.elapsed_s
    last_save = last_eval = time.perf_counter()
    ema = None
    bar = tqdm(total=int(budget_s), initial=int(prog.elapsed_s), unit="s", desc="train", mininterval=5)
    while prog.elapsed_s < stop_s:
        batch = draw_batch(src, rng, gen, args, block_weights, mask_id)
        if batch is None:
            continue
        use_window = rng.random() >= args.window_drop
        loss_f, gnorm = train_step(model, opt, batch, use_window, lr_at(prog.elapsed_s / budget_s, args.lr),
                                   args.copy_weight, step=prog.step + 1, autocast_dtype=autocast_dtype)
        prog.step += 1
        prog.tokens += batch.clean.numel()
        now = time.perf_counter()
        prog.elapsed_s = now - t_start
        ema = loss_f if ema is None else 0.95 * ema + 0.05 * loss_f
        bar.n = int(prog.elapsed_s)
        bar.set_postfix(step=prog.step, loss=f"{ema:.3f}", L=batch.L, tok_s=f"{prog.tokens / prog.elapsed_s:.0f}")
        rec = {"step": prog.step, "elapsed_s": round(prog.elapsed_s, 1), "loss": round(loss_f, 4),
               "block_size": batch.L, "window": use_window, "grad_norm": round(gnorm, 3),
               "lr": opt.param_groups[0]["lr"], "tokens": prog.tokens}
        if batch.recall:
            rec["recall"] = True  # this step's loss is the associative-recall copy loss
        if now - last_eval > args.eval_every_min * 60 or prog.elapsed_s >= stop_s:
            t_eval = time.perf_counter()
            rec.update(evaluate(model, tokenizer, held, held_call, args.eval_tasks,
                                OPEN_PROBE_TASKS if args.open_tools_share > 0 and args.eval_tasks else 0))
            tqdm.write(json.dumps({k: rec[k] for k in rec if k.startswith(("step", "heldout", "agent", "open"))}))
            last_eval = time.perf_counter()
            t_start += last_eval - t_eval  # evaluation time does not count toward the training budget
        log.write(json.dumps(rec) + "\n")
        log.flush()
        if now - last_save > args.save_every_min * 60:
            save()
            last_save = time.perf_counter()
    save()
    bar.close()
    print(f"saved {args.out} at step {prog.step} ({prog.elapsed_s / 60:.1f} min, {prog.tokens:,} tokens)")
    return 0
