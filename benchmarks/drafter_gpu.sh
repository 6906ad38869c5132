#!/usr/bin/env bash
# Train the block drafter over the frozen SmolLM2-135M-Instruct on one GPU (sized for an H200: <= 10 minutes of
# wall time), at block 8 and block 16, and evaluate both against the base's greedy answers -- the GPU run of
# models/smollm2-drafter/README.md, on ~10x its 640 CPU prompts. Prepared and tested on its CPU path (TINY=1);
# not yet run on a GPU when it was written.
#
#   bash benchmarks/drafter_gpu.sh [OUT]          # GPU: distill <= 90 s, cache ~30 s, train 2 min (both blocks
#                                                 # at once), eval ~3 min (one after the other); ~8-9 min in all
#   TINY=1 bash benchmarks/drafter_gpu.sh [OUT]   # the same steps at toy sizes on the CPU (the pinned base is
#                                                 # needed either way: a drafter names the base it drafts for)
#
# Steps (OUT = runs/drafter-gpu by default):
#   1. self-distillation: the base's greedy answers (fp32, as the eval decodes it: the drafter learns the exact
#      tokens verify checks against) to a broad prompt set in one file: 4,000 questions the base writes itself
#      (--source self-instruct, clover_engine.data.self_instruct: 100 everyday categories; the templates alone drafted
#      the plain eval questions at 1.20 tokens per base forward against 1.57 on their own kind) and 2,000
#      templated prompts (clover_engine.data.chat_prompts), then 1,000 tool-call chats of the training vocabulary
#      (--source tools, clover_engine.data.open_tools.train_turns: whole ChatML, so they go in a file of their own),
#      each step cut off at its time limit (60 s, 30 s, 30 s) -- whatever was written is used; rerunning
#      continues the files;
#   2. features: the base once over every prompt + answer, hidden states 8 / 15 / 22 / 30 (the layers the drafter
#      reads; 30 = the final state its residual stream starts from) cached in fp16 (~4.6 KB a position), one
#      cache per file (train joins them: --cache A B); an existing cache is reused;
#   3. training: clover_engine.training.drafter train, bf16 autocast, block 8 and block 16 side by side on the one GPU
#      (each is a few small kernels per step: neither fills it), 2 minutes each, 96 anchors x 8 sequences a
#      step; each prints its held-out slot accuracy and the tokens per target forward greedy verification would
#      give, then exports to OUT/smollm2-drafter-b8 | -b16;
#   4. eval: python -m clover_engine.eval on the 60 fixed plain questions (64 new tokens), verify and commit at 0.95:
#      block 8 with 20 open-vocabulary tool turns beside models/smollm2-bd (--compare), then block 16 alone;
#      each writes OUT/smollm2-drafter-bN/eval.json and prints its table (tokens per base forward, tokens/s, the
#      ratio to the base's own generate, this GPU's break-even); the last lines sum the two up.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-runs/drafter-gpu}
DATA=${DATA:-$OUT/distill.jsonl}
CACHE=$OUT/features.safetensors
TOOLS=$OUT/distill_tools.jsonl
TOOLS_CACHE=$OUT/features_tools.safetensors
mkdir -p "$OUT"

summary() {  # one line per drafter: verify tokens per base forward and tokens/s against the base's generate
    "$PY" - "$@" <<'EOF'
import json, sys
for path in sys.argv[1:]:
    r = json.load(open(path))
    for kind in ("plain", "tools"):
        s = r.get(kind)
        if s:
            v = s["verify"]
            print(f"{r['model']} block {r['block_size']} {kind}: verify {v['tokens_per_target_forward']:.2f} tokens per "
                  f"base forward, exact {v['exact']:.0%}, {v['tokens_per_s']:.1f} tok/s = {v['speed_vs_generate']:.2f}x "
                  f"the base's generate ({s['reference_tokens_per_s']:.1f} tok/s); break-even "
                  f"{r['break_even']['break_even_tokens_per_forward']:.2f} on {r.get('device', 'cpu')}")
EOF
}

if [ "${TINY:-0}" = 1 ]; then
    "$PY" -m clover_engine.training.causal_lm distill --out "$DATA" --source self-instruct --n 2 --batch 1 --max-new-tokens 12
    "$PY" -m clover_engine.training.causal_lm distill --out "$DATA" --source templates --n 4 --batch 4 --max-new-tokens 12
    "$PY" -m clover_engine.training.causal_lm distill --out "$TOOLS" --source tools --n 2 --batch 2 --max-new-tokens 12
    "$PY" -m clover_engine.training.drafter cache --data "$DATA" --out "$CACHE" --layers 8 15 22 30 --batch 6
    "$PY" -m clover_engine.training.drafter cache --data "$TOOLS" --out "$TOOLS_CACHE" --layers 8 15 22 30 --batch 2
    for B in 8 16; do
        "$PY" -m clover_engine.training.drafter train --cache "$CACHE" "$TOOLS_CACHE" --out "$OUT/block$B" --block-size "$B" \
            --layers 8 15 22 30 --minutes 0.02 --anchors 8 --accum 1 --heldout 2 --draft-vocab 512
        "$PY" -m clover_engine.training.drafter export --run "$OUT/block$B" --out "$OUT/smollm2-drafter-b$B"
    done
    "$PY" -m clover_engine.eval --model "$OUT/smollm2-drafter-b8" --prompts 2 --open-tasks 1 --max-new-tokens 8 \
        --block-size 8 --thresholds 0.95 --compare models/smollm2-bd
    "$PY" -m clover_engine.eval --model "$OUT/smollm2-drafter-b16" --prompts 1 --open-tasks 0 --max-new-tokens 8 \
        --block-size 16 --thresholds 0.95
    summary "$OUT/smollm2-drafter-b8/eval.json" "$OUT/smollm2-drafter-b16/eval.json"
    exit 0
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "error: no CUDA device visible to $PY; run with TINY=1 for the CPU path" >&2
    exit 2
fi
t0=$(date +%s)
timeout 60 "$PY" -m clover_engine.training.causal_lm distill --out "$DATA" --source self-instruct --n 4000 --batch 512 \
    --max-new-tokens 96 --device cuda --dtype fp32 --threads 4 \
    || echo "self-instruct distill stopped at its time limit ($(wc -l < "$DATA" || echo 0) answers)"
timeout 30 "$PY" -m clover_engine.training.causal_lm distill --out "$DATA" --source templates --n 2000 --batch 512 \
    --max-new-tokens 96 --device cuda --dtype fp32 --threads 4 \
    || echo "templates distill stopped at its time limit ($(wc -l < "$DATA") answers in all)"
timeout 30 "$PY" -m clover_engine.training.causal_lm distill --out "$TOOLS" --source tools --n 1000 --batch 256 \
    --max-new-tokens 96 --device cuda --dtype fp32 --threads 4 \
    || echo "tools distill stopped at its time limit ($(wc -l < "$TOOLS" || echo 0) answers)"
if [ ! -f "$CACHE" ]; then
    "$PY" -m clover_engine.training.drafter cache --data "$DATA" --out "$CACHE" --layers 8 15 22 30 --batch 64 \
        --device cuda --dtype fp32 --threads 4
fi
if [ ! -f "$TOOLS_CACHE" ]; then
    "$PY" -m clover_engine.training.drafter cache --data "$TOOLS" --out "$TOOLS_CACHE" --layers 8 15 22 30 --batch 32 \
        --device cuda --dtype fp32 --threads 4
fi
echo "data and features: $(( $(date +%s) - t0 )) s"
"$PY" -m clover_engine.training.drafter train --cache "$CACHE" "$TOOLS_CACHE" --out "$OUT/block8" --block-size 8 --layers 8 15 22 30 \
    --minutes 2 --device cuda --dtype bf16 --anchors 96 --accum 8 --lr 1e-3 --reveal 0.3 --heldout 200 \
    --save-every-min 1 --threads 4 > "$OUT/train-b8.log" 2>&1 &
p8=$!
"$PY" -m clover_engine.training.drafter train --cache "$CACHE" "$TOOLS_CACHE" --out "$OUT/block16" --block-size 16 --layers 8 15 22 30 \
    --minutes 2 --device cuda --dtype bf16 --anchors 96 --accum 8 --lr 1e-3 --reveal 0.3 --heldout 200 \
    --save-every-min 1 --threads 4 > "$OUT/train-b16.log" 2>&1 &
p16=$!
status=0
wait "$p8" || status=$?
wait "$p16" || status=$?
tail -n 3 "$OUT/train-b8.log" "$OUT/train-b16.log"
if [ "$status" != 0 ]; then echo "training failed (see $OUT/train-b*.log)" >&2; exit "$status"; fi
"$PY" -m clover_engine.training.drafter export --run "$OUT/block8" --out "$OUT/smollm2-drafter-b8"
"$PY" -m clover_engine.training.drafter export --run "$OUT/block16" --out "$OUT/smollm2-drafter-b16"
echo "trained and exported: $(( $(date +%s) - t0 )) s"
# one after the other: the evals time their decodes, and two processes on one GPU would slow each other down
"$PY" -m clover_engine.eval --model "$OUT/smollm2-drafter-b8" --device cuda --prompts 60 --open-tasks 20 \
    --max-new-tokens 64 --block-size 8 --thresholds 0.95 --compare models/smollm2-bd --threads 4
"$PY" -m clover_engine.eval --model "$OUT/smollm2-drafter-b16" --device cuda --prompts 60 --open-tasks 0 \
    --max-new-tokens 64 --block-size 16 --thresholds 0.95 --threads 4
summary "$OUT/smollm2-drafter-b8/eval.json" "$OUT/smollm2-drafter-b16/eval.json"
echo "total wall time: $(( $(date +%s) - t0 )) s"
