"""The block-diffusion objective on a causal LM (training wing): one conversation as one training
forward -- the clean row plus a noisy window per answer block, one 4D mask, explicit position ids
(`build_example`) -- and its losses, masked-slot CE plus the AR term (`batch_loss`), on a batch or
on fixed held-out rows (`heldout_loss`). The recipe is described in `clover_engine.training.causal_lm`.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from clover_engine.backbones.causal_lm.model import HFBlockDiffusionModel


def build_example(ids: list[int], answer_start: int, b: int, mask_id: int, gen: random.Random,
                  pad_id: int, suffix_share: float = 0.0) -> dict | None:
    """One training forward for a conversation: clean row + one noisy window per answer block.

    Args:
        ids: the conversation's token ids (prompt ++ answer ++ EOS).
        answer_start: index of the first loss-bearing token (the answer).
        b: block size.
        mask_id: MASK id.
        gen: randomness (mask ratio and slots).
        pad_id: id used to pad the row to a multiple of b (EOS: what the decoder writes after an EOS).
        suffix_share: share of blocks masked the way threshold decoding leaves them: the answer
            slots from a uniformly drawn slot k to the end of the block are masked, those before k
            are clean (decode-aligned masking). The other blocks draw a mask ratio t ~ U(0, 1]
            and mask each answer slot with probability t.

    Returns:
        dict with ``input_ids`` [Q], ``position_ids`` [Q], ``mask`` [Q, Q] bool (True = attend),
        ``labels`` [Q] (-100 = no loss) for the window rows, ``ar_labels`` [T] for the clean rows,
        ``n_clean`` T, ``n_masked``; None if no block holds an answer token.
    """
    n_ans_end = len(ids)
    T = ((len(ids) + b - 1) // b) * b
    x = ids + [pad_id] * (T - len(ids))
    # Loss-bearing positions: the answer, the EOS, and the EOS padding of the last block.
    eligible = [answer_start <= i for i in range(T)]
    blocks = [k for k in range(1, T // b) if any(eligible[k * b: (k + 1) * b])]
    if not blocks:
        return None
    inp, pos, labels = list(x), list(range(T)), [-100] * T
    ar_labels = [-100] * T
    for i in range(T - 1):
        if eligible[i + 1] and i + 1 <= n_ans_end:  # AR loss through the first EOS pad
            ar_labels[i] = x[i + 1]
    spans = []
    n_masked = 0
    for k in blocks:
        s = k * b
        slots = [j for j in range(b) if eligible[s + j]]
        if suffix_share > 0 and gen.random() < suffix_share:
            masked = slots[gen.randrange(len(slots)):]  # clean prefix of the block, masked suffix
        else:
            t = 1.0 - gen.random()  # (0, 1]
            masked = [j for j in slots if gen.random() < t] or [gen.choice(slots)]
        mset = set(masked)
        n_masked += len(mset)
        window = [x[s - 1]] + [mask_id if j in mset else x[s + j] for j in range(b - 1)]
        spans.append((len(inp), s, b))
        inp += window
        pos += list(range(s - 1, s + b - 1))
        labels += [x[s + j] if j in mset else -100 for j in range(b)]
    Q = len(inp)
    allowed = torch.zeros(Q, Q, dtype=torch.bool)
    allowed[:T, :T] = torch.ones(T, T, dtype=torch.bool).tril()
    for off, s, bb in spans:
        allowed[off: off + bb, : s - 1] = True  # clean x_0 .. x_{s-2}
        allowed[off: off + bb, off: off + bb] = True  # the window, bidirectional
    return {"input_ids": torch.tensor(inp), "position_ids": torch.tensor(pos), "mask": allowed,
            "labels": torch.tensor(labels), "ar_labels": torch.tensor(ar_labels), "n_clean": T,
            "n_masked": n_masked}


def example_loss(model: HFBlockDiffusionModel, ex: dict, ar_weight: float, device, autocast_dtype=None):
    """(total loss, masked-slot CE, AR CE) of one `build_example` on ``model``."""
    return batch_loss(model, [ex], ar_weight, device, autocast_dtype)


def batch_loss(model: HFBlockDiffusionModel, exs: list[dict], ar_weight: float, device, autocast_dtype=None,
               pad_id: int = 0):
    """(total loss, masked-slot CE, AR CE) of several `build_example` rows in one padded forward.

    Rows are padded to the longest; a padding position attends only to itself and
    carries no loss. Logits are computed only where a loss is taken (the LM head is
    49k wide on SmolLM2).
    """
    n, Q = len(exs), max(int(e["input_ids"].shape[0]) for e in exs)
    ids = torch.full((n, Q), pad_id, dtype=torch.long)
    pos = torch.zeros((n, Q), dtype=torch.long)
    allowed = torch.eye(Q, dtype=torch.bool).repeat(n, 1, 1)
    labels = torch.full((n, Q), -100, dtype=torch.long)
    is_ar = torch.zeros((n, Q), dtype=torch.bool)
    for b, e in enumerate(exs):
        q, T = int(e["input_ids"].shape[0]), e["n_clean"]
        ids[b, :q], pos[b, :q], allowed[b, :q, :q] = e["input_ids"], e["position_ids"], e["mask"]
        labels[b, :T], labels[b, T:q], is_ar[b, :T] = e["ar_labels"][:T], e["labels"][T:], True
    ids, pos, allowed, labels, is_ar = (t.to(device) for t in (ids, pos, allowed, labels, is_ar))
    x = model.embed(ids)
    add = torch.zeros(allowed.shape, dtype=x.dtype if autocast_dtype is None else autocast_dtype, device=device)
    add.masked_fill_(~allowed, torch.finfo(add.dtype).min)
    ctx = (torch.autocast(device_type=device.type, dtype=autocast_dtype) if autocast_dtype is not None
           else torch.autocast(device_type="cpu", enabled=False))
    base = model.lm.get_base_model() if hasattr(model.lm, "get_base_model") else model.lm
    sel = labels != -100
    with ctx:
        h = base.model(inputs_embeds=x, attention_mask=add[:, None], position_ids=pos, use_cache=False).last_hidden_state
        logits = base.lm_head(h[sel]).float()
    ce = F.cross_entropy(logits, labels[sel], reduction="none")
    a = is_ar[sel]
    diff = ce[~a].mean() if bool((~a).any()) else ce.new_zeros(())
    ar = ce[a].mean() if bool(a.any()) else ce.new_zeros(())
    return diff + ar_weight * ar, diff, ar


@torch.no_grad()
def heldout_loss(model: HFBlockDiffusionModel, rows: list[tuple[list[int], int]], mask_id: int, pad_id: int,
                 device, autocast_dtype=None, block_sizes: tuple[int, ...] = (4, 8, 16, 32)) -> tuple[float, float]:
    """(masked-slot CE, AR CE) over held-out rows, the same noise for every call (row i: block size
    ``block_sizes[i % len]``, mask ratio and slots from ``random.Random(i)``), so runs compare exactly.
    Means over rows; nats per token."""
    was = model.training
    model.eval()
    d_sum = a_sum = 0.0
    n = 0
    for i, (ids, a0) in enumerate(rows):
        ex = build_example(ids, a0, block_sizes[i % len(block_sizes)], mask_id, random.Random(i), pad_id)
        if ex is None:
            continue
        _, d, a = batch_loss(model, [ex], 1.0, device, autocast_dtype, pad_id=pad_id)
        d_sum, a_sum, n = d_sum + float(d), a_sum + float(a), n + 1
    model.train(was)
    return d_sum / max(n, 1), a_sum / max(n, 1)
