"""Training data of the causal-LM adaptation (training wing): the self-distillation file the base
writes (`distill`: its greedy answers to training prompts, JSONL, resumable) and the stream of
(token ids, answer start) examples a run draws from it and from tool-call chats (`ExampleSource`).
The recipe is described in `clover_engine.training.causal_lm`.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from clover_engine.backbones.causal_lm.adapter import base_spec, chat_prompt, load_base
from clover_engine.data.chat_prompts import eval_prompts, training_prompts
from clover_engine.data.self_instruct import self_instruct_prompts
from clover_engine.data.agent import iter_conversations
from clover_engine.data.open_tools import iter_train_texts, train_turns

DEFAULT_DISTILL = Path("runs/smollm2/distill.jsonl")


def prompt_text(prompt: str) -> str:
    """The text the base reads for a distill row's ``prompt``: a prompt that is already ChatML (a
    tool-call chat from `clover_engine.data.open_tools.train_turns`, system turn with its tools included,
    ending ``<|im_start|>assistant\n``) as it is; a plain user message in the base's chat template
    (`clover_engine.backbones.causal_lm.adapter.chat_prompt`)."""
    return prompt if prompt.startswith("<|im_start|>") else chat_prompt(prompt)


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
            self._agent = (c.text for c in iter_conversations(seed + 1))
        self._open = None
        if open_tools_share > 0:
            self._open = iter_train_texts(seed + 2)
        if not self.rows and synthetic_vocab is None and self._agent is None and self._open is None:
            raise ValueError(f"no training data: {distill_path} is missing or empty -- run "
                             "`python -m clover_engine.training.causal_lm distill --out ...` first")

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
            p = self.tok.encode(prompt_text(rec["prompt"])).ids
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


@torch.no_grad()
def sampled_answers(lm, tok, eos_id: int, max_new_tokens: int = 220, temperature: float = 0.8, top_p: float = 0.95):
    """``fn(user_turns) -> texts``: the base's sampled answers (chat template, left padding), for
    `clover_engine.data.self_instruct.self_instruct_prompts`. Sampling draws from torch's global generator."""

    def generate(turns: list[str]) -> list[str]:
        tok.padding_side = "left"
        enc = tok([chat_prompt(t) for t in turns], return_tensors="pt", padding=True,
                  add_special_tokens=False).to(lm.device)
        with torch.no_grad():
            gen = lm.generate(**enc, max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature,
                              top_p=top_p, eos_token_id=eos_id, pad_token_id=eos_id)
        return tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)

    return generate


def distill_prompts(out: Path, n: int, seed: int, source: str, lm=None, tok=None, eos_id: int | None = None,
                    batch: int = 16) -> list[str]:
    """The prompts a distill run answers: ``templates`` (`clover_engine.data.chat_prompts.training_prompts`),
    ``self-instruct`` (`clover_engine.data.self_instruct`: written by the base, never an evaluation prompt,
    kept beside ``out`` as ``<out>.prompts.txt`` so a resumed run answers the same ones) or ``tools``
    (`clover_engine.data.open_tools.train_turns`: whole ChatML tool-call chats from the training vocabulary;
    `prompt_text` passes them through as they are).

    Raises:
        ValueError: an unknown ``source``.
    """
    if source == "templates":
        return training_prompts(n, seed)
    if source == "tools":
        return [t.prompt for t in train_turns(n, seed)]
    if source != "self-instruct":
        raise ValueError(f"source must be 'templates', 'self-instruct' or 'tools', got {source!r}")
    path = out.with_suffix(".prompts.txt")
    kept = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    if len(kept) >= n:
        return kept[:n]
    from tqdm import tqdm  # local: tqdm only for a run that writes prompts

    torch.manual_seed(seed)
    with tqdm(total=n, desc="self-instruct prompts", unit="prompt") as bar:
        prompts = self_instruct_prompts(n, seed, sampled_answers(lm, tok, eos_id), batch=batch,
                                        exclude=eval_prompts(), progress=lambda k: bar.update(k - bar.n))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(prompts) + "\n", encoding="utf-8")
    return prompts


def distill(out: Path, n: int, batch: int, max_new_tokens: int, seed: int, base: str,
            device: str = "cpu", dtype: str = "fp32", source: str = "templates") -> None:
    """Append the base's greedy answers to ``n`` training prompts to ``out`` (JSONL; resumes where it stopped).
    ``source``: where the prompts come from (`distill_prompts`)."""
    from tqdm import tqdm

    lm, tok = load_base(base, torch.bfloat16 if dtype == "bf16" else torch.float32)
    lm.to(device)
    spec = base_spec(base)
    prompts = distill_prompts(out, n, seed, source, lm, tok, spec.eos_token_id, batch)
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
            enc = tok([prompt_text(p) for p in chunk], return_tensors="pt", padding=True,
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
