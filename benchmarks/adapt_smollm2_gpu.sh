#!/usr/bin/env bash
# Adapt SmolLM2-135M-Instruct to block diffusion on one GPU (sized for an H200: <= 10 minutes of wall time,
# bf16 autocast, LoRA), then evaluate the adapter against the base's greedy answers -- the GPU run of
# models/smollm2-bd/README.md ("Recipe"). Prepared but not yet run: no GPU was lent when it was written.
#
#   bash benchmarks/adapt_smollm2_gpu.sh [OUT]           # GPU: distill ~2.5 min, adapt ~5.5 min, eval ~2 min
#   TINY=1 bash benchmarks/adapt_smollm2_gpu.sh [OUT]    # the same three steps on a tiny random Llama, CPU, seconds
#
# Steps (all resumable; rerunning continues where a step stopped):
#   1. self-distillation data: the base's own greedy answers (bf16 on the GPU) to up to 30,000 training prompts
#      (clover_engine.data.chat_prompts), cut off at 150 s -- whatever was written is used;
#   2. adaptation: clover_engine.train --objective block-diffusion, 64 examples per forward (each a clean row plus a
#      noisy window per answer block, ~2x the clean tokens), LoRA r=32 + the MASK embedding, lr 1e-3 cosine over
#      5.5 minutes, 20 % open-vocabulary tool-call chats (clover_engine.data.open_tools, one assistant turn per row). Aim: on the order of 100M clean tokens (the issue's estimate at 30-40 %
#      of bf16 peak); the trainer prints the real count and tokens/s at the end and in OUT/train_log.jsonl;
#   3. eval: clover_engine.eval on the 60 fixed prompts (48 new tokens), block 1 / 8 / 32 x 0.90 / 0.95 / 0.99, with the
#      unadapted base at 32/0.95 beside it, and 60 open-vocabulary tool-call turns (tools never in training) at
#      block_size 1 and 32 / 0.95; writes OUT/eval.json and prints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-runs/smollm2-bd-gpu}

if [ "${TINY:-0}" = 1 ]; then
    "$PY" -m clover_engine.training.causal_lm --tiny --out "$OUT" --max-steps 4 --batch 4 --accum 1 --minutes 1 --no-progress
    "$PY" -m clover_engine.eval --model "$OUT" --prompts 2 --max-new-tokens 8 --settings 1,8/0.95 --compare-base \
        --base-settings 8/0.95 --speed-prompts 1 --speed-block-sizes 4,8
    exit 0
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "error: no CUDA device visible to $PY; run with TINY=1 for the CPU path" >&2
    exit 2
fi
DATA=${DATA:-runs/smollm2/distill-gpu.jsonl}
t0=$(date +%s)
timeout 150 "$PY" -m clover_engine.training.causal_lm distill --out "$DATA" --n 30000 --batch 1024 --max-new-tokens 96 \
    --device cuda --dtype bf16 --threads 4 || echo "distill stopped at its time limit ($(wc -l < "$DATA") answers)"
"$PY" -m clover_engine.train --init-from smollm2-135m-instruct --objective block-diffusion --out "$OUT" --data "$DATA" \
    --device cuda --dtype bf16 --minutes 5.5 --batch 64 --accum 1 --lr 1e-3 --lora-r 32 --lora-alpha 64 \
    --open-tools-share 0.2 --max-len 384 --threads 4 --save-every-min 2 --snapshot --resume
"$PY" -m clover_engine.eval --model "$OUT" --device cuda --prompts 60 --max-new-tokens 48 --compare-base \
    --base-settings 32/0.95 --open-tasks 60 --speed-prompts 4 --workers 1 --threads 4
echo "total wall time: $(( $(date +%s) - t0 )) s"
