#!/usr/bin/env bash
# Attention benchmark on the GPU machine: genoflash vs SDPA (flash, cuDNN, efficient),
# FlexAttention, flash-attn-4 (when importable) and standard attention.
#
#   bash scripts/gpu_bench.sh [genoflash bench attention options, e.g. --shapes all --tag x]
#
# Run from the repo root. Uses the image's torch/triton/matplotlib (installs nothing).
# Results go to $OUT when it is set (with the log in $OUT/bench.log), else benchmarks/results.
# Set GENOFLASH_COMMIT to record the commit when the checkout has no .git.
set -euo pipefail

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
source scripts/device_env.sh

if [[ -n "${OUT:-}" ]]; then
    mkdir -p "$OUT"
    python3 -m genoflash.cli bench attention --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
else
    python3 -m genoflash.cli bench attention --out benchmarks/results "$@"
fi
