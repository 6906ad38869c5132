"""Training data of the block drafter (training wing): the frozen target's hidden features over its
own greedy answers, cached once.

`cache_features` reads a self-distillation file (`clover_engine.training.causal_lm_data.distill`: one JSON
row per prompt, ``{"prompt", "answer_ids", "eos"}``), runs the target once over
``prompt text ++ answer (++ EOS)`` and stores, for every position, the hidden states of the layers
the drafter may read (`FeatureCache`). Re-running costs one target forward per answer; the
drafter then trains for many epochs on the cache without touching the target again. The
target's greedy next token at every answer position is the next answer token (the answers are
its own greedy output); `FeatureCache.agreement` says how often that holds after re-encoding
(batching and padding at distill time can flip near-ties).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from clover_engine.training.causal_lm_data import prompt_text


@dataclass
class FeatureCache:
    """Cached target features of a set of sequences.

    Attributes:
        feats: [S_total, K, H] fp16 -- hidden_states[layers[k]] at every position of every sequence.
        ids: [S_total] int64 token ids, sequences back to back.
        offsets: [n + 1] int64 start of each sequence in ``ids`` (``offsets[-1] == S_total``).
        prompt_len: [n] int64 prompt tokens of each sequence (the answer starts there).
        layers: the hidden_states indices cached, in ``feats``' order.
        agreement: share of answer positions where the target's argmax equals the next token.
    """

    feats: torch.Tensor
    ids: torch.Tensor
    offsets: torch.Tensor
    prompt_len: torch.Tensor
    layers: tuple[int, ...]
    agreement: float

    def __len__(self) -> int:
        return int(self.prompt_len.shape[0])

    def sequence(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(feats [S, K, H] fp16, ids [S], prompt length) of sequence ``i``."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.feats[a:b], self.ids[a:b], int(self.prompt_len[i])

    def save(self, path: Path) -> None:
        """Write as safetensors (tensors) with the layers and agreement in its metadata."""
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({"feats": self.feats.contiguous(), "ids": self.ids, "offsets": self.offsets,
                   "prompt_len": self.prompt_len}, str(path),
                  metadata={"layers": json.dumps(list(self.layers)), "agreement": str(self.agreement)})

    @classmethod
    def concat(cls, caches: list["FeatureCache"]) -> "FeatureCache":
        """One cache holding the sequences of ``caches`` in order (e.g. a chat cache and a tool-call cache
        built apart); ``agreement`` weighted by each cache's answer positions.

        Raises:
            ValueError: no caches, or caches of different target layers.
        """
        if not caches:
            raise ValueError("no feature caches to join")
        layers = caches[0].layers
        if any(c.layers != layers for c in caches):
            raise ValueError(f"feature caches of different target layers cannot be joined: "
                             f"{[list(c.layers) for c in caches]}; cache them with the same layers")
        if len(caches) == 1:
            return caches[0]
        offsets, shift = [torch.zeros(1, dtype=torch.int64)], 0
        for c in caches:
            offsets.append(c.offsets[1:] + shift)
            shift += int(c.offsets[-1])
        answers = [float((c.offsets[1:] - c.offsets[:-1] - c.prompt_len).sum()) for c in caches]
        agreement = sum(a * c.agreement for a, c in zip(answers, caches)) / max(sum(answers), 1.0)
        return cls(torch.cat([c.feats for c in caches]), torch.cat([c.ids for c in caches]), torch.cat(offsets),
                   torch.cat([c.prompt_len for c in caches]), layers, agreement)

    @classmethod
    def load(cls, path: Path) -> "FeatureCache":
        """Read a cache written by `save`.

        Raises:
            FileNotFoundError: no file at ``path`` (run ``python -m clover_engine.training.drafter cache``).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no feature cache at {path}: run `python -m clover_engine.training.drafter cache` first")
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata()
            t = {k: f.get_tensor(k) for k in f.keys()}
        return cls(t["feats"], t["ids"], t["offsets"], t["prompt_len"], tuple(json.loads(meta["layers"])),
                   float(meta["agreement"]))


def read_distill(path: Path) -> list[dict]:
    """The rows of a distill JSONL file (blank lines skipped).

    Raises:
        FileNotFoundError: when the file is missing (run ``python -m clover_engine.training.causal_lm distill``).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no distill file at {path}: run `python -m clover_engine.training.causal_lm distill "
                                f"--out {path}` first")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@torch.no_grad()
def cache_features(rows: list[dict], lm, tok, layers: tuple[int, ...], eos_id: int, batch: int = 8) -> FeatureCache:
    """Run the frozen target ``lm`` over every ``prompt text ++ answer (++ EOS)`` and keep the hidden
    states of ``layers`` (see the module docstring).

    Args:
        rows: distill rows (``prompt``, ``answer_ids``, ``eos``).
        lm: a transformers causal LM (eval mode), on any device (the cache is built on the CPU); tok: its
            tokenizer.
        layers: hidden_states indices to keep.
        eos_id: appended after an answer that ended with EOS (and the right padding).
        batch: sequences per target forward (right-padded).
    """
    feats, ids, offsets, plens = [], [], [0], []
    agree = total = 0
    seqs = []
    for row in rows:
        p_ids = tok(prompt_text(row["prompt"]), add_special_tokens=False)["input_ids"]
        ans = list(row["answer_ids"]) + ([eos_id] if row.get("eos") else [])
        if ans:
            seqs.append((p_ids, ans))
    with tqdm(total=len(seqs), desc="cache features", unit="seq") as bar:
        for k in range(0, len(seqs), batch):
            chunk = seqs[k: k + batch]
            S = max(len(p) + len(a) for p, a in chunk)  # right padding: positions and causal rows unchanged
            x = torch.full((len(chunk), S), eos_id, dtype=torch.int64)
            att = torch.zeros((len(chunk), S), dtype=torch.int64)
            for r, (p_ids, ans) in enumerate(chunk):
                n = len(p_ids) + len(ans)
                x[r, :n] = torch.tensor(p_ids + ans)
                att[r, :n] = 1
            out = lm(input_ids=x.to(lm.device), attention_mask=att.to(lm.device), output_hidden_states=True)
            kept = torch.stack([out.hidden_states[i] for i in layers], 2).to(torch.float16).cpu()  # [b, S, K, H]
            preds = out.logits.argmax(-1).cpu()
            for r, (p_ids, ans) in enumerate(chunk):
                n, P = len(p_ids) + len(ans), len(p_ids)
                pred = preds[r, P - 1: n - 1]
                agree += int((pred == x[r, P:n]).sum())
                total += len(ans)
                feats.append(kept[r, :n].clone())
                ids.append(x[r, :n].clone())
                plens.append(P)
                offsets.append(offsets[-1] + n)
            bar.update(len(chunk))
    return FeatureCache(torch.cat(feats), torch.cat(ids), torch.tensor(offsets), torch.tensor(plens),
                        tuple(layers), agree / max(total, 1))
