"""Train a block drafter over a frozen causal LM on cached target features (training wing).

The recipe (``python -m clover_engine.training.drafter``)::

    # 1. the base's own greedy answers (resumable; shared with the adapter recipe)
    python -m clover_engine.training.causal_lm distill --out runs/drafter/distill.jsonl --n 640 --batch 32
    # 2. the target's hidden features over them, once
    python -m clover_engine.training.drafter cache --data runs/drafter/distill.jsonl --out runs/drafter/features.safetensors
    # 3. train (stages of --minutes, --resume continues); the run's model/ is its drafter directory
    python -m clover_engine.training.drafter train --cache runs/drafter/features.safetensors --out runs/drafter/run1 \
        --minutes 30 [--resume] [--arch block|medusa]
    # 4. ship a run's latest checkpoint
    python -m clover_engine.training.drafter export --run runs/drafter/run1 --out models/smollm2-drafter

On a GPU, ``cache`` and ``train`` take ``--device cuda`` (``train`` also ``--dtype bf16``: bf16 autocast of
the drafter's forward, fp32 weights and optimizer; the cache is always stored in fp16) --
`benchmarks/drafter_gpu.sh` runs the whole recipe on one GPU.

What is learned (`clover_engine.backbones.drafter.net`): the drafter drafts a block ``[anchor, MASK x B-1]``
anchored at an answer position ``a`` (the anchor is the target's greedy token there), reading the
target's features of positions ``< a``. The loss is cross-entropy of every drafted slot against the
target's greedy answer, over the draft vocabulary, slot ``j`` weighted by ``exp(-(j - 1) / decay)``
(an early slot gates every later one in verification; DFlash weights its slots the same way). Half
of the blocks reveal a random share of their slots, so the drafter also fills blocks that are
partly written (the commit mode runs it more than once per block).

The Medusa-style baseline (``--arch medusa``, `clover_engine.backbones.drafter.net.MedusaDrafter`; Cai et al.,
"Medusa", ICML 2024) trains ``B - 1`` heads ``h + SiLU(W h)`` on the target's last hidden state into the
same frozen LM head: head ``k`` predicts the token ``k + 1`` positions after the anchor. It exports and
decodes like the drafter (``arch: medusa`` in its config), so `clover_engine.eval` runs both on the same prompts. Both report, on held-out sequences, slot
accuracy and the verify-mode tokens per target forward they would give (``1 + E[accepted run]``,
exact for greedy verification because the labels are the target's own greedy tokens).
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
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from clover_engine.backbones.causal_lm.adapter import base_spec, load_base
from clover_engine.backbones.drafter.files import save_drafter
from clover_engine.backbones.drafter.net import DrafterConfig, build_drafter, default_target_layers
from clover_engine.training.drafter_data import FeatureCache, cache_features, read_distill

DEFAULT_CACHE = Path("runs/drafter/features.safetensors")
CACHE_LAYERS = (4, 8, 12, 15, 18, 22, 26, 29, 30)  # SmolLM2-135M: 30 layers; 30 = the final normed state


def draft_vocabulary(cache: FeatureCache, size: int, eos_id: int, mask_id: int) -> torch.Tensor:
    """The ``size`` most frequent ids of the cached sequences (answers counted 4x, prompts 1x), EOS
    always in, MASK never; sorted. ``size <= 0``: every id that occurs."""
    counts = torch.zeros(int(cache.ids.max()) + 1 if len(cache.ids) else 1)
    for i in range(len(cache)):
        _, ids, p = cache.sequence(i)
        counts.index_add_(0, ids[:p], torch.ones(p))
        counts.index_add_(0, ids[p:], torch.full((len(ids) - p,), 4.0))
    counts[eos_id] = counts.max() + 1
    if mask_id < len(counts):
        counts[mask_id] = 0
    order = torch.argsort(counts, descending=True)
    order = order[counts[order] > 0]
    if size > 0:
        order = order[:size]
    return torch.sort(order).values


def _blocks(ids: torch.Tensor, p: int, B: int, n_max: int, mask_id: int, reveal: float, rng: random.Random):
    """Sample up to ``n_max`` anchors in the answer and build (anchors [N], block_ids [N, B], labels [N, B])
    (labels -100 where there is no token or the slot is revealed; slot 0 is the anchor, never a label)."""
    S = len(ids)
    cands = list(range(p, S - 1))
    if len(cands) > n_max:
        cands = sorted(rng.sample(cands, n_max))
    anchors = torch.tensor(cands, dtype=torch.int64)
    pos = anchors[:, None] + torch.arange(B)[None]
    valid = pos < S
    toks = torch.where(valid, ids[pos.clamp(max=S - 1)], torch.full_like(pos, -100))
    block = torch.full_like(toks, mask_id)
    block[:, 0] = toks[:, 0]
    labels = toks.clone()
    labels[:, 0] = -100
    for n in range(len(cands)):
        if rng.random() < reveal:
            share = rng.random() * 0.8
            for j in range(1, B):
                if valid[n, j] and rng.random() < share:
                    block[n, j] = toks[n, j]
                    labels[n, j] = -100
    return anchors, block, labels


def _to_draft_index(labels: torch.Tensor, vocab: torch.Tensor, V: int) -> torch.Tensor:
    """Map token labels to indices into the draft vocabulary (-100 for ids outside it or ignored)."""
    lut = torch.full((V,), -100, dtype=torch.int64)
    lut[vocab] = torch.arange(len(vocab))
    out = torch.full_like(labels, -100)
    ok = labels >= 0
    out[ok] = lut[labels[ok]]
    return out


class _Frozen:
    """The target's frozen embedding and LM head (read from the base; never trained), on ``device``."""

    def __init__(self, lm, device: torch.device | str = "cpu"):
        self.embed = lm.get_input_embeddings().to(device)
        self.embed.weight.requires_grad_(False)
        self.lm_head = lm.get_output_embeddings().weight.detach().to(device)


def _autocast(device: torch.device, dtype: str):
    """bf16 autocast on ``device`` for ``dtype == "bf16"``, else a no-op context."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")


def _check_device(device: str, dtype: str) -> torch.device:
    """The torch device of ``--device`` (and a usable ``--dtype`` on it).

    Raises:
        ValueError: CUDA asked for but not available.
    """
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device is visible to this process; use --device cpu")
    return dev


def _layer_slots(cache_layers: tuple[int, ...], wanted: tuple[int, ...]) -> list[int]:
    missing = [l for l in wanted if l not in cache_layers]
    if missing:
        raise ValueError(f"target layers {missing} are not in the feature cache (it holds {cache_layers}); "
                         "re-run `cache` with them")
    return [cache_layers.index(l) for l in wanted]


def evaluate(model, cache: FeatureCache, seqs: list[int], frozen: _Frozen, cfg: DrafterConfig,
             slots: list[int], last_slot: int, max_anchors: int = 64, device: torch.device | str = "cpu",
             dtype: str = "fp32") -> dict:
    """Held-out metrics with all slots masked (the verify-mode draft): top-1 accuracy per slot, and
    the tokens per target forward greedy verification would give, ``1 + mean accepted run``. The
    drafter runs on ``device`` (under bf16 autocast for ``dtype == "bf16"``); the counting is on the CPU."""
    model.eval()
    device = torch.device(device)
    B, V = cfg.block_size, cfg.vocab_size
    rng = random.Random(1234)
    correct = torch.zeros(B)
    seen = torch.zeros(B)
    runs = []
    vocab = torch.tensor(cfg.draft_vocab) if cfg.draft_vocab else torch.arange(V)
    with torch.no_grad():
        for i in seqs:
            feats, ids, p = cache.sequence(i)
            anchors, block, labels = _blocks(ids, p, B, max_anchors, cfg.mask_token_id, 0.0, rng)
            if not len(anchors):
                continue
            with _autocast(device, dtype):
                logits = _forward(model, feats.to(device), anchors.to(device), block.to(device), frozen,
                                  slots, last_slot)
            pred = vocab[logits.argmax(-1).cpu()]  # [N, B]
            ok = (pred == labels) & (labels >= 0)
            has = labels >= 0
            correct += ok.float().sum(0)
            seen += has.float().sum(0)
            for n in range(len(anchors)):
                run = 0
                for j in range(1, B):
                    if not bool(has[n, j]) or not bool(ok[n, j]):
                        break
                    run += 1
                runs.append(run)
    model.train()
    acc = (correct / seen.clamp(min=1)).tolist()
    return {"slot_accuracy": [round(a, 4) for a in acc[1:]], "mean_accepted": sum(runs) / max(len(runs), 1),
            "tokens_per_target_forward": 1 + sum(runs) / max(len(runs), 1), "anchors": len(runs)}


def _forward(model, feats, anchors, block, frozen, slots, last_slot):
    """Logits [N, B, Vd] for the blocks (Medusa: from the target's final state at ``anchor - 1`` alone)."""
    if model.cfg.arch == "medusa":
        return model(None, feats[anchors - 1, last_slot].float(), block, anchors, None, frozen.lm_head)
    T = int(anchors.max())
    ctx = model.fuse_context(feats[:T, slots].float().reshape(T, -1))
    last = feats[anchors - 1, slots[-1]].float()  # the last target layer read, at each anchor's predecessor
    return model(ctx, last, block, anchors, frozen.embed, frozen.lm_head)


def train(args) -> int:
    """Train a drafter (or the Medusa baseline) on a feature cache for ``--minutes``; see the module docstring."""
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    torch.set_num_threads(args.threads)
    device = _check_device(args.device, args.dtype)
    cache = FeatureCache.concat([FeatureCache.load(c) for c in args.cache])
    lm, _tok = load_base(args.base)
    spec = base_spec(args.base)
    frozen = _Frozen(lm, device)
    hf = lm.config
    mask_id = args.mask_token_id
    layers = tuple(args.layers) if args.layers else tuple(  # the cached layers nearest an even spread
        min(cache.layers, key=lambda c: abs(c - want)) for want in default_target_layers(hf.num_hidden_layers,
                                                                                          args.n_layers_read))
    slots = _layer_slots(cache.layers, layers)
    last_slot = _layer_slots(cache.layers, (hf.num_hidden_layers,))[0]
    out = Path(args.out)
    state_path = out / "train_state.pt"
    resume = args.resume and state_path.is_file()
    if resume:
        st = torch.load(state_path, weights_only=False, map_location="cpu")  # our own file, written below
        cfg = _saved_config(st)
    else:
        vocab = draft_vocabulary(cache, args.draft_vocab, spec.eos_token_id, mask_id)
        cfg = DrafterConfig(hidden_size=hf.hidden_size, target_layers=layers, num_layers=args.depth,
                            num_heads=hf.num_attention_heads, num_kv_heads=hf.num_key_value_heads,
                            head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
                            intermediate_size=hf.intermediate_size, block_size=args.block_size,
                            rope_theta=float(getattr(hf, "rope_parameters", {}).get("rope_theta", 100000.0)),
                            rms_norm_eps=float(hf.rms_norm_eps), vocab_size=hf.vocab_size, mask_token_id=mask_id,
                            draft_vocab=tuple(vocab.tolist()), arch=args.arch)
        if args.arch == "medusa":  # the heads read the final state only
            cfg.target_layers = (hf.num_hidden_layers,)
    model = build_drafter(cfg)
    if cfg.arch == "block":  # on --resume the saved config's arch decides, whatever --arch says
        if not resume:
            top = hf.num_hidden_layers - 1
            model.init_layers_from(lm, list(range(top - cfg.num_layers + 1, top + 1)))
            if cfg.target_layers[-1] != hf.num_hidden_layers:
                print(f"note: the residual stream starts from target layer {cfg.target_layers[-1]}, not the final "
                      f"state ({hf.num_hidden_layers}) the LM head reads", flush=True)
    model.to(device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    n = len(cache)
    order = list(range(n))
    random.Random(0).shuffle(order)
    held, train_ids = order[: args.heldout], order[args.heldout:]
    step, spent = 0, 0.0
    if resume:
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, spent = st["step"], st["minutes"]
    print(f"{cfg.arch}: {sum(p.numel() for p in model.parameters() if p.requires_grad):,} trainable parameters; "
          f"{len(train_ids)} training / {len(held)} held-out sequences; target layers {list(cfg.target_layers)}; "
          f"block {cfg.block_size}; draft vocabulary {len(cfg.draft_vocab) or cfg.vocab_size}; {device}, {args.dtype}"
          + (f"; resuming at step {step}, {spent:.1f} min" if resume else ""), flush=True)
    budget = args.minutes + spent
    decay = max(args.decay, 1e-6)
    w = torch.exp(-(torch.arange(cfg.block_size) - 1).clamp(min=0).float() / decay).to(device)
    vocab_t = torch.tensor(cfg.draft_vocab) if cfg.draft_vocab else torch.arange(cfg.vocab_size)
    log = (out / "train_log.jsonl")
    out.mkdir(parents=True, exist_ok=True)
    recipe = {k: ([str(c) for c in v] if isinstance(v, list) and v and isinstance(v[0], Path) else
                  str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    t0, last_save = time.perf_counter(), time.perf_counter()
    bar = tqdm(total=round(args.minutes, 1), unit="min", desc=f"train {cfg.arch}", bar_format="{l_bar}{bar}| {n:.1f}/{total} min {postfix}")
    model.train()
    while True:
        minutes = spent + (time.perf_counter() - t0) / 60
        if minutes >= budget:
            break
        frac = minutes / budget if args.lr_schedule == "cosine" else 0.0
        for g in opt.param_groups:
            g["lr"] = args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))) if step > 30 else args.lr * step / 30
        loss_sum = 0.0
        for _ in range(args.accum):
            i = train_ids[rng.randrange(len(train_ids))]
            feats, ids, p = cache.sequence(i)
            anchors, block, labels = _blocks(ids, p, cfg.block_size, args.anchors, mask_id,
                                             args.reveal if cfg.arch == "block" else 0.0, rng)
            if not len(anchors):
                continue
            with _autocast(device, args.dtype):
                logits = _forward(model, feats.to(device, non_blocking=True), anchors.to(device),
                                  block.to(device), frozen, slots, last_slot)
            tgt = _to_draft_index(labels, vocab_t, cfg.vocab_size).to(device)
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100,
                                 reduction="none").view_as(tgt)
            wt = w[None, :].expand_as(tgt) * (tgt >= 0)
            loss = (ce * wt).sum() / wt.sum().clamp(min=1)
            (loss / args.accum).backward()
            loss_sum += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        bar.n = round((time.perf_counter() - t0) / 60, 1)
        bar.set_postfix(step=step, loss=f"{loss_sum / args.accum:.3f}")
        if step % args.log_every == 0:
            with open(log, "a") as fh:
                fh.write(json.dumps({"step": step, "minutes": round(minutes, 2), "loss": loss_sum / args.accum}) + "\n")
        if time.perf_counter() - last_save > args.save_every_min * 60:
            _save_state(state_path, model, opt, cfg, step, spent + (time.perf_counter() - t0) / 60, recipe)
            last_save = time.perf_counter()
    bar.close()
    spent += (time.perf_counter() - t0) / 60
    _save_state(state_path, model, opt, cfg, step, spent, recipe)
    metrics = evaluate(model, cache, held, frozen, cfg, slots, last_slot, device=device, dtype=args.dtype)
    metrics.update({"arch": cfg.arch, "step": step, "minutes": round(spent, 2), "target_layers": list(cfg.target_layers),
                    "block_size": cfg.block_size, "depth": cfg.num_layers, "draft_vocab": len(cfg.draft_vocab),
                    "cache_agreement": cache.agreement, "device": str(device), "dtype": args.dtype,
                    "train_sequences": len(train_ids)})
    (out / "heldout.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics), flush=True)
    export(argparse.Namespace(run=out, out=out / "model", base=args.base))
    return 0


def _saved_config(st: dict) -> DrafterConfig:
    """The `DrafterConfig` of a ``train_state.pt`` (a Medusa run saved before ``arch`` was recorded in the
    config has it in its recipe; its heads read the last of the layers it recorded)."""
    cfg = DrafterConfig.from_dict(st["config"])
    if st.get("recipe", {}).get("arch") == "medusa" and cfg.arch != "medusa":
        cfg = DrafterConfig.from_dict({**cfg.to_dict(), "arch": "medusa", "target_layers": [cfg.target_layers[-1]]})
    return cfg


def _save_state(path: Path, model, opt, cfg: DrafterConfig, step: int, minutes: float, recipe: dict | None = None) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "config": cfg.to_dict(), "step": step,
                "minutes": minutes, "recipe": recipe or {}}, tmp)
    tmp.replace(path)


def cache(args) -> int:
    """Cache the target's features over a distill file (see the module docstring), the target on
    ``--device`` in ``--dtype``, ``--batch`` sequences per forward."""
    torch.set_num_threads(args.threads)
    device = _check_device(args.device, args.dtype)
    lm, tok = load_base(args.base, torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    lm.to(device)
    rows = read_distill(args.data)
    c = cache_features(rows, lm, tok, tuple(args.layers or CACHE_LAYERS), base_spec(args.base).eos_token_id,
                       batch=args.batch)
    c.save(Path(args.out))
    print(f"{len(c)} sequences, {len(c.ids):,} positions, layers {list(c.layers)}, target argmax = next answer "
          f"token at {c.agreement:.1%} of answer positions -> {args.out}")
    return 0


def export(args) -> int:
    """Write a run's latest checkpoint (``RUN/train_state.pt``) as a drafter directory (its tokenizer is
    the pinned base's: `clover_engine.checkpoint.load_tokenizer` reads it from there)."""
    state_path = Path(args.run) / "train_state.pt"
    if not state_path.is_file():
        raise FileNotFoundError(f"no checkpoint at {state_path}: train first")
    st = torch.load(state_path, weights_only=False, map_location="cpu")  # our own file (`_save_state`)
    net = build_drafter(_saved_config(st))
    net.load_state_dict(st["model"])
    metrics = None
    heldout = Path(args.run) / "heldout.json"
    if heldout.is_file():
        metrics = json.loads(heldout.read_text())
    out = save_drafter(Path(args.out), net, base=args.base, minutes=st["minutes"], metrics=metrics,
                       recipe={**st.get("recipe", {}), "run": str(args.run), "step": st["step"]})
    print(f"drafter of {args.run} (step {st['step']}, {st['minutes']:.1f} min) written to {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``cache`` / ``train`` command line."""
    p = argparse.ArgumentParser(prog="python -m clover_engine.training.drafter",
                                description="Train a block drafter over a frozen causal LM on cached target features.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cache", help="run the target once over a distill file and cache its hidden features",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    c.add_argument("--data", type=Path, default=Path("runs/drafter/distill.jsonl"), help="distill JSONL")
    c.add_argument("--out", type=Path, default=DEFAULT_CACHE, help="feature cache (safetensors)")
    c.add_argument("--layers", type=int, nargs="*", help=f"hidden_states indices to cache (default {CACHE_LAYERS})")
    c.add_argument("--base", default="smollm2-135m-instruct", help="pinned target")
    c.add_argument("--threads", type=int, default=1, help="torch threads")
    c.add_argument("--batch", type=int, default=8, help="sequences per target forward (right-padded)")
    c.add_argument("--device", default="cpu", help="torch device of the target: cpu, cuda, cuda:1 ...")
    c.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                   help="the target's weights (fp32: the features decoding reads; the cache is fp16 either way)")
    c.set_defaults(func=cache)
    t = sub.add_parser("train", help="train a drafter (or the Medusa baseline) on a feature cache",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    t.add_argument("--cache", type=Path, nargs="+", default=[DEFAULT_CACHE],
                   help="feature cache(s) from `cache`, joined in order (same target layers)")
    t.add_argument("--out", type=Path, required=True, help="run directory (train_state.pt, heldout.json, model/)")
    t.add_argument("--arch", choices=("block", "medusa"), default="block", help="block drafter or Medusa-style heads")
    t.add_argument("--minutes", type=float, default=30.0, help="training minutes in this stage")
    t.add_argument("--resume", action="store_true", help="continue from OUT/train_state.pt")
    t.add_argument("--block-size", type=int, default=8, help="slots per draft, anchor included")
    t.add_argument("--depth", type=int, default=1, help="drafter layers (initialised from the target's last ones)")
    t.add_argument("--layers", type=int, nargs="*", help="target hidden_states indices the drafter reads, the "
                   "one its residual stream starts from last (default: 4 spread over the depth, the final state last)")
    t.add_argument("--n-layers-read", type=int, default=4, help="how many target layers by default")
    t.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary size (0: the whole vocabulary)")
    t.add_argument("--mask-token-id", type=int, default=16, help="MASK id in the block (SmolLM2: 16, as smollm2-bd)")
    t.add_argument("--anchors", type=int, default=48, help="blocks drafted per sequence per step")
    t.add_argument("--accum", type=int, default=4, help="sequences per optimizer step")
    t.add_argument("--reveal", type=float, default=0.5, help="share of blocks with randomly revealed slots")
    t.add_argument("--decay", type=float, default=4.0, help="slot loss weight exp(-(j-1)/decay)")
    t.add_argument("--lr", type=float, default=6e-4, help="peak learning rate")
    t.add_argument("--lr-schedule", choices=("cosine", "constant"), default="cosine", help="over the stage's minutes")
    t.add_argument("--heldout", type=int, default=40, help="sequences kept out of training and scored")
    t.add_argument("--save-every-min", type=float, default=5.0, help="checkpoint interval (minutes)")
    t.add_argument("--log-every", type=int, default=10, help="log interval (steps)")
    t.add_argument("--base", default="smollm2-135m-instruct", help="pinned target")
    t.add_argument("--threads", type=int, default=1, help="torch threads")
    t.add_argument("--seed", type=int, default=0, help="seed")
    t.add_argument("--device", default="cpu", help="torch device to train on: cpu, cuda, cuda:1 ...")
    t.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                   help="bf16 = autocast of the drafter's forward (fp32 weights and optimizer; GPU)")
    t.set_defaults(func=train)
    e = sub.add_parser("export", help="write a run's latest checkpoint as a drafter directory (models/...)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    e.add_argument("--run", type=Path, required=True, help="run directory of `train`")
    e.add_argument("--out", type=Path, required=True, help="drafter directory to write")
    e.add_argument("--base", default="smollm2-135m-instruct", help="pinned target")
    e.set_defaults(func=export)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
