"""Block-diffusion training of a small Clover model on the CPU (docs/architecture.md §9).

    python -m clover_engine.train --out runs/clover-train --minutes 100            # fresh run
    python -m clover_engine.train --out runs/clover-train --minutes 100 --resume   # continue

Objective, per row of T tokens: sample a block size L (mixed, weighted toward 32, so every
block_size of the explorer -- 1 included -- is in distribution); split the row into blocks of
L; per block sample a mask ratio t ~ U(0.05, 1) and mask each slot with probability t (with
probability 0.25 the block keeps a clean prefix, like a prompt-prefilled first block); one
pass over the clean row gives every block-boundary state and the noisy blocks read them
(`CloverModel.forward_train`); loss = cross-entropy on masked slots + 0.01 x MoE load
balancing. The attention window (``state+window`` mode) is dropped on a share of batches
(``--window-drop``) so that the model decodes in both memory modes.

Focus: in agent rows only assistant turns are masked in the blocks that hold them, the other
blocks only with probability `OTHER_BLOCK_RATE`; ``--copy-weight`` up-weights the masked
tokens that are copied argument values.

Later stages: ``--init-from DIR`` starts from a checkpoint's weights with a fresh optimizer
and schedule; ``--attention-conv K`` (with ``--conv-lr-mult``), ``--induction-heads N``,
``--front-attention`` and ``--attention-first`` change the model (`clover_engine.training.surgery`);
``--block-weights`` changes the block-size mix. Copy curriculum: ``--recall-share S`` makes a
share S of batches associative-recall rows (``--recall-block-size``, ``--recall-shape T,B``,
``--recall-vocab``; `clover_engine.training.rows`). The stages that made the bundled model are in
models/clover-tiny/README.md.

One command for every training recipe (`RECIPES`): ``python -m clover_engine.train [clover] ...`` trains
Clover (this docstring); ``python -m clover_engine.train causal-lm ...`` adapts a pretrained transformers
model (`clover_engine.training.causal_lm`; ``python -m clover_engine.train causal-lm distill ...`` writes its data).
``--init-from`` naming a pinned pretrained base with ``--objective block-diffusion`` still picks the
causal-LM recipe without its name.

Writes ``train_log.jsonl`` (loss, tokens/s, held-out metrics) and, every
``--save-every-min`` minutes and at the end, the checkpoint (``config.json``,
``model.safetensors``, ``tokenizer.json``) plus ``train_state.pt`` (optimizer and progress;
loaded with ``weights_only=True``).

Modules: `clover_engine.training.surgery` (presets, growing a model), `clover_engine.training.rows` (data
rows), `clover_engine.training.masking` (noise), `clover_engine.training.probes` (held-out metrics),
`clover_engine.training.loop` (the loop). Their public names are re-exported here.

Wing: ``entry points``.
"""

from __future__ import annotations

import importlib
import sys

from clover_engine.backbones.causal_lm.adapter import BASES
from clover_engine.training.loop import (AUX_WEIGHT, BLOCK_SIZE_WEIGHTS, ROW_SHAPE, WINDOW_DROP, Batch, Progress, build_parser,
                                  draw_batch, evaluate, held_out_batches, lr_at, make_optimizer, parse_args,
                                  parse_block_weights, setup_model, train_step)
from clover_engine.training.masking import EPS, OTHER_BLOCK_RATE, mask_blocks
from clover_engine.training.probes import heldout_loss, quick_agent_eval, value_probe
from clover_engine.training.rows import (AGENT_SHARE, FIRST_ORDINARY_ID, RECALL_VOCABS, RowSource, easy_conversations,
                                  pack_conversations)
from clover_engine.training.surgery import (ATTENTION_CONV_WEIGHT, INDUCTION_TAPS, init_induction_heads, tiny_config,
                                     with_attention_conv, with_front_attention)

__all__ = [  # re-exported: `from clover_engine.train import X` keeps working
    "AGENT_SHARE", "ATTENTION_CONV_WEIGHT", "AUX_WEIGHT", "BLOCK_SIZE_WEIGHTS", "EPS", "FIRST_ORDINARY_ID", "INDUCTION_TAPS",
    "OTHER_BLOCK_RATE", "RECALL_VOCABS", "RECIPES", "ROW_SHAPE", "WINDOW_DROP", "Batch", "Progress", "RowSource",
    "build_parser", "draw_batch", "easy_conversations", "evaluate", "held_out_batches", "heldout_loss", "init_induction_heads",
    "lr_at", "main", "make_optimizer", "mask_blocks", "pack_conversations", "parse_args", "parse_block_weights",
    "quick_agent_eval", "setup_model", "tiny_config", "train_step", "value_probe", "with_attention_conv",
    "with_front_attention",
]

RECIPES: dict[str, str] = {
    "clover": "clover_engine.training.loop:main",
    "causal-lm": "clover_engine.training.causal_lm:main",
}
"""``python -m clover_engine.train RECIPE ...`` -> the ``"module:main"`` that runs it (imported only when run):
``clover`` trains a Clover model (the default); ``causal-lm`` adapts a pretrained transformers model
(`clover_engine.training.causal_lm`, also ``python -m clover_engine.training.causal_lm``), ``causal-lm distill``
writes its self-distillation data."""


def _hf_objective(argv: list[str]) -> bool:
    """``--objective block-diffusion`` with ``--init-from`` naming a pinned pretrained base
    (`clover_engine.backbones.causal_lm.adapter.BASES`, e.g. ``smollm2-135m-instruct``): the causal-LM recipe
    without its name, as this command line took it before it had recipes."""
    if "--objective" not in argv and not any(a.startswith("--objective=") for a in argv):
        return False
    return any(a in BASES or a.split("=", 1)[-1] in BASES for a in argv)


def main(argv: list[str] | None = None) -> int:
    """``python -m clover_engine.train [RECIPE] ...``: run the recipe its first word names (`RECIPES`); without
    one, ``causal-lm`` for an adaptation run (`_hf_objective`), else ``clover``. The recipe parses the
    rest (``python -m clover_engine.train causal-lm --help`` shows its flags)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in RECIPES:
        recipe, args = args[0], args[1:]
    else:
        recipe = "causal-lm" if _hf_objective(args) else "clover"
    module, _, func = RECIPES[recipe].partition(":")
    return getattr(importlib.import_module(module), func)(args)


if __name__ == "__main__":
    raise SystemExit(main())
