#!/usr/bin/env bash
# The GPU engine's checks on one lent GPU (~5 minutes): the CUDA-only tests (CUDA-graph decodes equal
# the eager ones, device/dtype paths, the Triton and flash-linear-attention kernels against their
# references), then benchmarks/gpu_forward.py (clover-35b-a3b, bf16 random weights: per-forward time
# against the HBM roofline, and eager vs CUDA-graph replay), then benchmarks/moe_ep_gpu.py (LLaDA2.0-mini's
# shape split over the GPUs present: bytes and time per rank per forward against the roofline). Prepared but not yet run: no GPU was lent
# when it was written.
#
#   bash benchmarks/gpu_check.sh [OUT]          # GPU: writes OUT/pytest.txt and OUT/gpu_forward.md
#   TINY=1 bash benchmarks/gpu_check.sh [OUT]   # the benchmark's CPU path on clover-test, seconds (CI)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-runs/gpu-check}
mkdir -p "$OUT"

if [ "${TINY:-0}" = 1 ]; then
    "$PY" benchmarks/gpu_forward.py --preset clover-test --device cpu --blocks 8 --position 64 --repeats 1 \
        --warmup 0 | tee "$OUT/gpu_forward.md"
    exit 0
fi

# the tests first (a failure is recorded, and the benchmark still runs: device minutes are scarce)
timeout 240 "$PY" -m pytest -q -rs tests/clover_engine/test_cuda_graphs.py tests/clover_engine/test_device.py tests/clover_kernels \
    2>&1 | tee "$OUT/pytest.txt" || echo "pytest: exit $? (see $OUT/pytest.txt)"
timeout 300 "$PY" benchmarks/gpu_forward.py --repeats 10 --warmup 3 | tee "$OUT/gpu_forward.md"
# expert parallel at LLaDA2.0-mini's dimensions over the GPUs present (one GPU: the whole model, 32.5 GB bf16)
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
timeout 240 "$(dirname "$PY")/torchrun" --standalone --nproc-per-node "${NGPU:-1}" benchmarks/moe_ep_gpu.py \
    --shape llada2-mini --repeats 5 | tee "$OUT/moe_ep_gpu.md" || echo "moe_ep_gpu: exit $?"
