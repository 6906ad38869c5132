"""Adapt a pretrained transformers chat model to block diffusion (Fast-dLLM v2 style), with LoRA.

    # 1. self-distillation data: the base's own greedy answers (cached under runs/, resumable)
    python -m engine.training.causal_lm distill --out runs/smollm2/distill.jsonl --n 600 --threads 1
    # 2. adaptation (also reachable as `python -m engine.train --init-from smollm2-135m-instruct ...`)
    python -m engine.train --init-from smollm2-135m-instruct --objective block-diffusion \\
        --out runs/smollm2-bd --data runs/smollm2/distill.jsonl --minutes 70 --threads 1 [--resume]

Objective, per example (one conversation, ChatML, blocks aligned at absolute
positions k * b from the row's start, as the decoder aligns them):

* **clean stream**, causal mask: the ordinary autoregressive loss on the answer
  tokens (keeps ``block_size=1`` close to the base's greedy path);
* **a noisy copy of each block that holds answer tokens**: block k (slots
  s .. s+b-1) becomes the window ``[x_{s-1}, noisy_s .. noisy_{s+b-2}]`` at
  positions ``s-1 .. s+b-2`` -- exactly what `engine.backbones.causal_lm.model` feeds the model
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
with one 4D additive mask and explicit position ids (`build_example`).

Parameters: LoRA (peft; rank ``--lora-r`` on q/k/v/o/gate/up/down) plus the
MASK input embedding (`engine.backbones.causal_lm.adapter`); the base stays frozen and is never
written. The output directory is a loadable model (``engine.load_model(OUT)``):
``config.json``, ``adapter_config.json``, ``adapter_model.safetensors`` (bf16),
``mask_embedding.safetensors``, plus ``train_state.pt`` (optimizer, progress)
and ``train_log.jsonl``. ``--resume`` continues from them (the learning rate
follows a cosine over the total ``--minutes``).

Data: the self-distillation file (``distill``: prompts from
`engine.data.chat_prompts.training_prompts`, answers = the base's greedy
``generate``) and, with ``--agent-share``, tool-call conversations from
`engine.data.agent` (ChatML, loss on the assistant turns).

``--tiny`` swaps the base for a tiny random Llama (tests, and the CPU path of
``benchmarks/adapt_smollm2_gpu.sh``). ``--device cuda --dtype bf16`` is the GPU path
(autocast bf16, fused AdamW).
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

# parse_block_weights (--block-sizes, default engine.backbones.causal_lm.adapter.DEFAULT_BLOCK_WEIGHTS) belongs to the
# adapter's recipe, which engine.backbones.causal_lm.adapter.largest_trained_block reads back
from engine.backbones.causal_lm.adapter import (ADAPTER_MODEL_TYPE, BASES, MASK_EMBEDDING, base_spec, chat_prompt, load_base,
                               locate_base, parse_block_weights)
from engine.backbones.causal_lm.model import HFBlockConfig, HFBlockDiffusionModel, count_parameters

DEFAULT_DISTILL = Path("runs/smollm2/distill.jsonl")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ----------------------------------------------------------------------------- data
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


class ExampleSource:
    """Yields (token ids, answer_start) examples: self-distillation answers and, optionally, tool-call chats."""

    def __init__(self, tokenizer, distill_path: Path | None, agent_share: float, seed: int, max_len: int,
                 eos_id: int, synthetic_vocab: int | None = None, open_tools_share: float = 0.0,
                 holdout: int = 0):
        self.tok, self.agent_share, self.max_len, self.eos = tokenizer, agent_share, max_len, eos_id
        self.heldout: list[tuple[list[int], int]] = []
        self.open_tools_share = open_tools_share
        self.rng = random.Random(seed)
        self.rows: list[tuple[list[int], int]] = []
        self.synthetic_vocab = synthetic_vocab
        self.path, self._read_lines = (Path(distill_path) if distill_path else None), 0
        self.reload()
        if holdout:  # the last rows of the file as first read: never trained on, scored by `heldout_loss`
            if len(self.rows) < holdout + 1:
                raise ValueError(f"--heldout-rows {holdout}: the distill file has only {len(self.rows)} rows")
            self.rows, self.heldout = self.rows[:-holdout], self.rows[-holdout:]
        self._agent = None
        if agent_share > 0:
            from engine.data.agent import iter_conversations

            self._agent = (c.text for c in iter_conversations(seed + 1))
        self._open = None
        if open_tools_share > 0:
            from engine.data.open_tools import iter_train_texts

            self._open = iter_train_texts(seed + 2)
        if not self.rows and synthetic_vocab is None and self._agent is None and self._open is None:
            raise ValueError(f"no training data: {distill_path} is missing or empty -- run "
                             "`python -m engine.training.causal_lm distill --out ...` first")

    def reload(self) -> int:
        """Read rows appended to the distill file since the last call (a distill run may still be writing it)."""
        if self.path is None or not self.path.is_file():
            return 0
        lines = self.path.read_text().splitlines()
        new = 0
        for line in lines[self._read_lines:]:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line being written
                break
            self._read_lines += 1
            p = self.tok.encode(chat_prompt(rec["prompt"])).ids
            a = rec["answer_ids"] + ([self.eos] if rec.get("eos", True) else [])
            row = (p + a)[: self.max_len]
            if len(p) < len(row):
                self.rows.append((row, len(p)))
                new += 1
        return new

    def __len__(self) -> int:
        return len(self.rows)

    def next(self) -> tuple[list[int], int]:
        u = self.rng.random()
        if self._open is not None and (u < self.open_tools_share or (not self.rows and self._agent is None)):
            return self._chat_row(next(self._open))
        if self._agent is not None and (not self.rows or u < self.open_tools_share + self.agent_share):
            return self._chat_row(next(self._agent))
        if self.synthetic_vocab is not None and not self.rows:
            n = self.rng.randint(12, self.max_len)
            ids = [self.rng.randrange(3, self.synthetic_vocab - 2) for _ in range(n)]
            return ids, self.rng.randint(2, n // 2)
        return self.rows[self.rng.randrange(len(self.rows))]

    def _chat_row(self, text: str) -> tuple[list[int], int]:
        """One assistant turn of a ChatML conversation as (ids, answer_start): the prompt is
        everything before the turn (system, tools, user, earlier calls and tool responses), the
        answer is the turn through its ``<|im_end|>``; the turn is drawn uniformly among those
        whose prompt fits in ``max_len`` with room for an answer. Tool responses are never targets."""
        marker, end = "<|im_start|>assistant\n", "<|im_end|>"
        starts, i = [], text.find(marker)
        while i >= 0:
            starts.append(i + len(marker))
            i = text.find(marker, i + 1)
        if not starts:
            raise ValueError("a training conversation without an assistant turn")
        for k in self.rng.sample(range(len(starts)), len(starts)):
            p = self.tok.encode(text[: starts[k]]).ids
            if len(p) <= self.max_len - 8:
                stop = text.find(end, starts[k])
                a = self.tok.encode(text[starts[k]: stop + len(end) if stop >= 0 else len(text)]).ids
                ids = (p + a)[: self.max_len]
                return ids, len(p)
        p = self.tok.encode(text[: starts[0]]).ids  # every prompt too long: keep the tail of the first
        a = self.tok.encode(text[starts[0]:]).ids
        ids = (p + a)[-self.max_len:]
        return ids, max(1, len(ids) - len(a))


# ----------------------------------------------------------------------------- model
def tiny_lm(vocab: int = 320, seed: int = 0):
    """A tiny random LlamaForCausalLM (tests; the CPU path of the GPU script)."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   eos_token_id=2, bos_token_id=1, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg)


def make_trainable(lm, r: int, alpha: int, mask_id: int, full: bool = False):
    """Wrap ``lm`` in a peft LoRA and return (peft model, mask_embedding parameter initialised from MASK's row).

    ``full``: no LoRA -- every weight of ``lm`` trains (full fine-tuning; returned as is)."""
    from peft import LoraConfig, get_peft_model

    mask_init = lm.get_input_embeddings().weight[mask_id].detach().clone()
    if full:
        for p in lm.parameters():
            p.requires_grad_(True)
        return lm, mask_init
    for p in lm.parameters():
        p.requires_grad_(False)
    plm = get_peft_model(lm, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(LORA_TARGETS),
                                        bias="none", task_type="CAUSAL_LM"))
    return plm, mask_init


def load_adapter_weights(plm, directory: Path) -> torch.Tensor:
    """Copy a saved adapter's LoRA weights (``adapter_model.safetensors``) into the peft model
    ``plm`` and return its MASK embedding [hidden] fp32 -- a new stage starts from a shipped adapter.

    Raises:
        ValueError: the directory lacks the adapter files, or its LoRA rank / targets differ
            from ``plm``'s (pass the same ``--lora-r``).
    """
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    files = [directory / "adapter_model.safetensors", directory / MASK_EMBEDDING]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"--init-adapter {directory}: missing {missing}; give a directory written by this trainer")
    sd = {k: v.float() for k, v in load_file(str(files[0])).items()}
    own = {k: v.shape for k, v in get_peft_model_state_dict(plm).items()}
    bad = [k for k, v in sd.items() if k not in own or own[k] != v.shape]
    if bad or len(sd) != len(own):
        raise ValueError(f"--init-adapter {directory}: its LoRA tensors do not match this model's "
                         f"({len(bad)} differ, e.g. {bad[:2]}); use the adapter's own --lora-r")
    set_peft_model_state_dict(plm, sd)
    return load_file(str(files[1]))["mask_embedding"].float()


def save_adapter(model: HFBlockDiffusionModel, out: Path, base_name: str, extra: dict) -> None:
    """Write the loadable adapter directory (config.json, peft adapter in bf16, MASK embedding)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    plm = model.lm
    plm.peft_config["default"].save_pretrained(str(out))  # adapter_config.json only (no README of its own)
    sd = get_peft_model_state_dict(plm)
    save_file({k: v.detach().to(torch.bfloat16).contiguous() for k, v in sd.items()},
              str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    save_file({"mask_embedding": model.mask_embedding.detach().float().cpu().contiguous()},
              str(out / MASK_EMBEDDING), metadata={"format": "pt"})
    if base_name not in BASES:  # a base saved beside the adapter (the tiny test base): base_path
        base_dir = out / "base"
        if not (base_dir / "config.json").is_file():
            _save_base_copy(plm, base_dir)
        extra = {**extra, "base_path": "base"}
    cfg = {"model_type": ADAPTER_MODEL_TYPE, "name": out.name, "base": base_name,
           "mask_token_id": model.config.mask_token_id, "chat_format": "chatml", **extra}
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _save_base_copy(plm, base_dir: Path) -> None:
    """Save the frozen base weights of a peft model (LoRA layers unwrapped) -- tiny test bases only."""
    from safetensors.torch import save_file

    base_dir.mkdir(parents=True, exist_ok=True)
    sd = {}
    for k, v in plm.get_base_model().state_dict().items():
        if "lora_" in k:
            continue
        sd[k.replace(".base_layer.", ".")] = v.detach().contiguous()
    cfg = plm.get_base_model().config
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    cfg.save_pretrained(str(base_dir))
    save_file(sd, str(base_dir / "model.safetensors"), metadata={"format": "pt"})


# ----------------------------------------------------------------------------- distill
@torch.no_grad()
def distill(out: Path, n: int, batch: int, max_new_tokens: int, seed: int, base: str,
            device: str = "cpu", dtype: str = "fp32") -> None:
    """Append the base's greedy answers to ``n`` training prompts to ``out`` (JSONL; resumes where it stopped)."""
    from tqdm import tqdm

    from engine.data.chat_prompts import training_prompts

    lm, tok = load_base(base, torch.bfloat16 if dtype == "bf16" else torch.float32)
    lm.to(device)
    spec = base_spec(base)
    prompts = training_prompts(n, seed)
    done = set()
    if out.is_file():
        done = {json.loads(l)["prompt"] for l in out.read_text().splitlines() if l.strip()}
    todo = [p for p in prompts if p not in done]
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.padding_side = "left"
    t0, n_tok = time.perf_counter(), 0
    with open(out, "a") as fh, tqdm(total=len(todo), desc="distill", unit="prompt") as bar:
        for i in range(0, len(todo), batch):
            chunk = todo[i: i + batch]
            enc = tok([chat_prompt(p) for p in chunk], return_tensors="pt", padding=True,
                      add_special_tokens=False).to(device)
            gen = lm.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                              eos_token_id=spec.eos_token_id, pad_token_id=spec.eos_token_id)
            for p, row in zip(chunk, gen[:, enc["input_ids"].shape[1]:].tolist()):
                eos = spec.eos_token_id in row
                ans = row[: row.index(spec.eos_token_id)] if eos else row
                n_tok += len(ans)
                fh.write(json.dumps({"prompt": p, "answer_ids": ans, "eos": eos}) + "\n")
            fh.flush()
            bar.update(len(chunk))
            bar.set_postfix(tok_s=f"{n_tok / (time.perf_counter() - t0):.1f}")


# ----------------------------------------------------------------------------- train
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
        from engine.tokenizer import byte_tokenizer

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
        from engine.backbones.causal_lm.adapter import load_base_tokenizer

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
    ap = argparse.ArgumentParser(prog="python -m engine.train --objective block-diffusion",
                                 description="Adapt a pretrained chat model to block diffusion (LoRA).")
    ap.add_argument("--init-from", default="smollm2-135m-instruct", help=f"pinned base: {', '.join(BASES)}")
    ap.add_argument("--objective", default="block-diffusion", choices=["block-diffusion"],
                    help="training objective (only block-diffusion: masked blocks plus an AR term)")
    ap.add_argument("--out", type=Path, required=True, help="adapter directory to write (LoRA, MASK embedding, log)")
    ap.add_argument("--data", type=Path, default=None,
                    help=f"distill JSONL (default {DEFAULT_DISTILL}; with --tiny: synthetic rows unless given)")
    ap.add_argument("--agent-share", type=float, default=0.0, help="share of tool-call chats (engine.data.agent)")
    ap.add_argument("--open-tools-share", type=float, default=0.0,
                    help="share of open-vocabulary tool-call chats (engine.data.open_tools, train vocabulary)")
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
        ap = argparse.ArgumentParser(prog="python -m engine.training.causal_lm distill",
                                     description="Write the base model's greedy answers to training prompts (JSONL).")
        ap.add_argument("--out", type=Path, default=Path("runs/smollm2/distill.jsonl"),
                        help="JSONL file to append to; a re-run resumes where it stopped (default %(default)s)")
        ap.add_argument("--n", type=int, default=600, help="training prompts to answer (default %(default)s)")
        ap.add_argument("--batch", type=int, default=8, help="prompts answered per generate call (default %(default)s)")
        ap.add_argument("--max-new-tokens", type=int, default=96, help="tokens per answer at most (default %(default)s)")
        ap.add_argument("--seed", type=int, default=0, help="seed of the prompt draw (default %(default)s)")
        ap.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s)")
        ap.add_argument("--base", default="smollm2-135m-instruct",
                        help=f"pinned base: {', '.join(BASES)} (default %(default)s)")
        ap.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1 ... (default %(default)s)")
        ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                        help="weights' dtype while generating (bf16 for --device cuda) (default %(default)s)")
        a = ap.parse_args(argv[1:])
        torch.set_num_threads(a.threads)
        distill(a.out, a.n, a.batch, a.max_new_tokens, a.seed, a.base, a.device, a.dtype)
        return 0
    args = build_parser().parse_args(argv)
    if args.dtype == "bf16" and args.device == "cpu":
        raise SystemExit("error: --dtype bf16 is for --device cuda; on this CPU bf16 is far slower than fp32")
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
