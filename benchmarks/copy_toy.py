"""How many training steps a Clover layout needs to learn to copy: layouts side by side.

The bundled model never learned to copy argument values (models/clover-tiny card). This
script isolates the copy circuit on synthetic rows, with the real block-diffusion
objective (`CloverModel.forward_train`, state+window mode), and prints masked-slot
accuracy by step for each layout, so levers can be compared in one run:

* ``--task offset``: 64 random tokens, then the same 64 again; the second half is masked.
  A head that attends 64 positions back solves it (positional copy).
* ``--task induction``: a 24-token random segment repeated at a random distance inside a
  128-token random row; the repeat (after its first token) is masked. Only a
  content match (find the earlier occurrence of the context, copy what followed) solves it.
* ``--task recall``: multi-query associative recall (MQAR, Arora et al. 2023): 4 pairs of a
  2-token cue and a 4-token value written in the first half of a 128-token random row and
  queried in shuffled order in the second half; the queried values (all 4 tokens, the first
  one known from its cue) are masked -- the lookup of `clover_engine.training.rows.RowSource.recall_row`
  and of a tool-call argument.

Layouts: ``gdn3`` (GDN, GDN, GDN, attention: clover-test), ``alt`` (GDN, attention x 2:
clover-tiny's), ``attn`` (attention x 4), ``attn-first`` ((attention, GDN) x 2); each with or without an attention q/k/v conv
(``--conv K``, ``config.attention_conv_kernel_dim``). ``--conv-init random``: off-centre
taps drawn from N(0, 0.3); ``prev`` / ``decay``: every head an induction-head candidate
(`clover_engine.training.surgery.init_induction_heads`: q and k read the previous token, or tokens 1-3 back
with taps 1, 0.5, 0.25). All on clover-test sizes (hidden 64), batch 16, AdamW, default
block size 8, lr 2e-3.

Measured on the 2-core CPU: offset (2026-11-29, block 8) -- attn 0.97 at step 175, alt
0.77 at 275, gdn3 still at chance (0.01) at 400. Induction -- with random or identity taps
every layout stayed at chance for 500-700 steps, at block size 8 and at block size 1
(attn, conv 3, also at lr 5e-3 and with the q/k norm gain raised to 3). With
``--conv-init prev`` (2026-11-30): attn at block size 1 went 0.04 (step 100) -> 0.48
(125) -> 0.74 (150) -> 0.92 (250); at block size 8 (attn) and with the alt layout it was
still at chance at step 150 / 400 (block 8). At block size 1 the layer order decides:
``attn-first`` (attention, GDN, attention, GDN) went 0.07 (step 175) -> 0.27 (200) -> 0.57
(225) -> 0.76 (250), while ``alt`` (GDN first, clover-tiny's order) was at chance (<= 0.015)
through step 400 -- hence `clover_engine.training.surgery.with_front_attention`. Recall (2026-11-30, block
size 1, conv 4, ``--conv-init decay``): ``attn-first`` at chance through step 225, then 0.048
(250) -> 0.113 (275) -> 0.336 (300); ``alt`` at chance (<= 0.015) through step 300. The same at
clover-tiny's sizes (``--size tiny``: hidden 192, head_dim 48, vocab 4096; 2026-11-30): at chance through
step 225, then 0.034 (250) -> 0.209 (300) -> 0.750 (350) -> 0.899 (400) -- size does not slow the circuit.

Run: ``.venv/bin/python benchmarks/copy_toy.py --task induction --layouts attn --conv 3 --conv-init prev --block-size 1 --steps 300``
or ``--task recall --layouts attn-first --conv 4 --conv-init decay --block-size 1 --steps 400 --size tiny``
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clover_engine.backbones.clover.config import CloverConfig  # noqa: E402
from clover_engine.backbones.clover.model import CloverModel  # noqa: E402
from clover_engine.training.surgery import INDUCTION_TAPS, init_induction_heads, tiny_config  # noqa: E402
from clover_engine.threads import add_threads_argument, configure_threads  # noqa: E402

INDUCTION_INITS = {"prev": (1.0,), "decay": INDUCTION_TAPS}

LAYOUTS = {
    "gdn3": ["linear_attention"] * 3 + ["full_attention"],
    "alt": ["linear_attention", "full_attention"] * 2,
    "attn": ["full_attention"] * 4,
    "attn-first": ["full_attention", "linear_attention"] * 2,
}


def make_batch(task: str, g: torch.Generator, mask_id: int, B: int = 16) -> tuple[torch.Tensor, ...]:
    """[B, 128] clean ids, noisy ids and the bool mask of the copy targets (ids 10..199)."""
    T = 128
    clean = torch.randint(10, 200, (B, T), generator=g)
    target = torch.zeros(B, T, dtype=torch.bool)
    if task == "offset":
        clean[:, 64:] = clean[:, :64]
        target[:, 64:] = True
    elif task == "induction":
        S = 24
        for b in range(B):
            a = int(torch.randint(0, 16, (1,), generator=g))
            c = int(torch.randint(a + S + 8, T - S + 1, (1,), generator=g))
            clean[b, c:c + S] = clean[b, a:a + S]
            target[b, c + 1:c + S] = True  # the repeat's first token cannot be known
    elif task == "recall":
        n, C, V = 4, 2, 4
        for b in range(B):
            cues = torch.randint(10, 200, (n, C), generator=g)
            vals = torch.randint(10, 200, (n, V), generator=g)
            order = torch.randperm(n, generator=g)
            for half, idx in ((0, range(n)), (1, order.tolist())):
                for j, p in enumerate(idx):  # pair p in slot j of 16 tokens: cue at 4..5, value at 6..9
                    at = 64 * half + 16 * j + 4
                    clean[b, at:at + C] = cues[p]
                    clean[b, at + C:at + C + V] = vals[p]
                    target[b, at + C:at + C + V] = bool(half)
    else:
        raise ValueError(f"task must be 'offset', 'induction' or 'recall', got {task!r}")
    ratio = torch.rand(B, 1, generator=g).clamp(min=0.1)
    msk = target & (torch.rand(B, T, generator=g) < ratio)
    msk[:, -1] |= ~msk.any(-1)  # at least one target per row
    noisy = clean.masked_fill(msk, mask_id)
    return clean, noisy, msk


def run(task: str, layout: str, conv: int, steps: int, every: int, seed: int, block_size: int = 8,
        lr: float = 2e-3, qk_gain: float = 1.0, conv_init: str = "random", size: str = "test") -> list[tuple[int, float]]:
    """Train one layout; returns (step, masked-slot accuracy of that step's batch) every `every` steps.
    ``size``: "test" (clover-test sizes, hidden 64) or "tiny" (`clover_engine.training.surgery.tiny_config`, hidden 192, vocab 4096)."""
    base = CloverConfig.from_name("clover-test") if size == "test" else tiny_config()
    cfg = dataclasses.replace(base, layer_types=LAYOUTS[layout],
                              attention_conv_kernel_dim=conv, attention_window=256)
    torch.manual_seed(seed)
    model = CloverModel(cfg).train()
    with torch.no_grad():
        for layer in model.layers:
            if layer.layer_type == "full_attention":
                attn = layer.self_attn  # RMSNorm is x / rms(x) * (1 + w): (1 + w) = qk_gain
                attn.q_norm.weight.fill_(qk_gain - 1.0)
                attn.k_norm.weight.fill_(qk_gain - 1.0)
                if conv:
                    attn.conv1d.weight[..., :-1].normal_(0.0, 0.3)
    if conv and conv_init != "random":  # every head an induction-head candidate
        init_induction_heads(model, cfg.num_key_value_heads, INDUCTION_INITS[conv_init])
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(seed + 1)
    curve = []
    for step in tqdm(range(1, steps + 1), desc=f"{layout} conv={conv}", leave=False):
        clean, noisy, msk = make_batch(task, g, cfg.mask_token_id)
        h, aux = model.forward_train(clean, noisy, block_size, use_window=True)
        logits = model.lm_head(h[msk]).float()
        loss = F.cross_entropy(logits, clean[msk])
        opt.zero_grad(set_to_none=True)
        (loss + 0.01 * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % every == 0:
            curve.append((step, float((logits.argmax(-1) == clean[msk]).float().mean())))
            tqdm.write(f"{layout} conv={conv} step {step}: {curve[-1][1]:.3f}")
    return curve


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=("offset", "induction", "recall"), default="offset")
    ap.add_argument("--layouts", default="attn,alt,gdn3", help=f"comma list of {list(LAYOUTS)}")
    ap.add_argument("--conv", default="0", help="comma list of attention conv taps to try (0 = none)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--qk-gain", type=float, default=1.0)
    ap.add_argument("--conv-init", choices=("random", *INDUCTION_INITS), default="random")
    ap.add_argument("--size", choices=("test", "tiny"), default="test",
                    help="model sizes: clover-test (hidden 64) or clover-tiny's tiny_config (hidden 192, vocab 4096)")
    add_threads_argument(ap)
    args = ap.parse_args(argv)
    configure_threads(args.threads)
    runs = [(lay, int(k)) for lay in args.layouts.split(",") for k in args.conv.split(",")]
    bad = [lay for lay, _ in runs if lay not in LAYOUTS]
    if bad:
        raise SystemExit(f"unknown layouts {bad}; choose from {list(LAYOUTS)}")
    curves = {f"{lay} conv={k}": run(args.task, lay, k, args.steps, args.every, args.seed, args.block_size,
                                     args.lr, args.qk_gain, args.conv_init, args.size) for lay, k in runs}
    print(f"task {args.task}: masked-slot accuracy by step (chance ~0.005)")
    w = max(16, max(len(name) for name in curves) + 2)
    print(f"{'step':>6s}" + "".join(f"{name:>{w}s}" for name in curves))
    for i, (step, _) in enumerate(next(iter(curves.values()))):
        print(f"{step:>6d}" + "".join(f"{c[i][1]:>{w}.3f}" for c in curves.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
