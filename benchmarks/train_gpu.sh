#!/usr/bin/env bash
# Train a Clover-architecture model from scratch on one GPU (sized for an H200: <= 10 minutes of wall time),
# then evaluate it on what it never saw -- the GPU run prepared for models/clover-small.
# Prepared but not yet run on a GPU: no device was lent when it was written; the CPU path below is tested in CI.
#
#   bash benchmarks/train_gpu.sh [OUT]           # GPU: ~70M parameters (small_config), bf16 autocast, ~6.5 min, eval ~3 min
#   TINY=1 bash benchmarks/train_gpu.sh [OUT]    # the same two steps on tiny_config, CPU, seconds
#   ISOLATE_SPACES=1 ...                         # first build a tokenizer with --isolate-spaces (a space
#                                                # before a word is its own token: a request's word and
#                                                # the call's name share their first token; ~25 % more
#                                                # tokens per text) and train on it -- untested at scale
#
# Data: the synthetic tool-call corpus (clover_engine.data.agent), the open-vocabulary tool-call corpus (clover_engine.data.open_tools,
# 30 % of agent rows: tool names and keys must be copied from the system turn), and code -- the stdlib and the
# train packages of clover_engine.data.packages (--code-source both; the held-out packages are scored, never trained); the tokenizer is
# models/clover-tiny's (vocab 4096). Eval (clover_engine.eval): fixed-tool held-out tasks, open-vocabulary tasks with names
# and keys never in training, held-out stdlib files, the value-copy probe -- block 32 / 0.95 and block_size 1, both
# memory modes. Rerunning resumes the training run (--resume) until its time budget is spent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-runs/clover-small-gpu}
TOK=models/clover-tiny/tokenizer.json
resume=()
if [ -f "$OUT/train_state.pt" ]; then resume=(--resume); fi
if [ "${ISOLATE_SPACES:-0}" = 1 ]; then
    TOK=${OUT%/}.isolate-spaces.tokenizer.json  # beside OUT (clover_engine.train wants OUT new or resumable)
    if [ ! -f "$TOK" ]; then "$PY" -m clover_engine.data.tokenizer --out "$TOK" --isolate-spaces; fi
fi

if [ "${TINY:-0}" = 1 ]; then
    "$PY" -m clover_engine.train --out "$OUT" --tokenizer "$TOK" --size tiny --minutes 0.05 --open-tools-share 0.3 \
        --eval-tasks 0 --eval-every-min 1000 --threads 1 "${resume[@]}"
    "$PY" -m clover_engine.eval --model "$OUT" --tasks 2 --open-tasks 2 --stdlib-files 1 --probe-tasks 2 \
        --settings bd32-window,ar1-window --max-new-tokens 8 --workers 1 --threads 1
    exit 0
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "error: no CUDA device visible to $PY; run with TINY=1 for the CPU path" >&2
    exit 2
fi
t0=$(date +%s)
"$PY" -m clover_engine.train --out "$OUT" --tokenizer "$TOK" --size small --device cuda --dtype bf16 --batch-mult 32 \
    --minutes 6.5 --lr 1e-3 --open-tools-share 0.3 --code-source both --eval-tasks 16 --eval-every-min 3 \
    --save-every-min 2 --threads 4 "${resume[@]}"
"$PY" -m clover_engine.eval --model "$OUT" --tasks 60 --open-tasks 60 --stdlib-files 10 --package-files 8 --probe-tasks 40 \
    --workers 8 --threads 2
echo "total wall time: $(( $(date +%s) - t0 )) s"
