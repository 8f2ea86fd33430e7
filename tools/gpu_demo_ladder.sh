#!/usr/bin/env bash
# Where does the demo's recipe stop learning? `genoflash demo` (full vs local attention) at
# growing lengths on one GPU. Each rung is one `genoflash demo` run; edit the rungs to probe.
# At batch 16, 2 kb and 8 kb stayed at chance (2026-11-29; see genoflash/data/synthetic.py).
# On the CPU, elements at 19% of the sequence learned at 512 bp with 16 x 2 and at 1 kb with
# 16 x 4 (benchmarks/NOTES.md), so the rungs keep elements near 19% and grow the effective
# batch (batch 16 x grad_accum) with the length. Not yet run in this form.
#
#   OUT=/some/dir bash tools/gpu_demo_ladder.sh [more genoflash demo flags]
set -euo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${OUT:-/tmp}/demo-ladder
mkdir -p "$out"
# Training ran at ~1.5M tokens/s on the H200 (2026-11-29), so a full-attention run costs about
# steps x 16 x grad_accum x seq_len / 1.5e6 s (the local run less): ~80 s, ~280 s and ~280 s for
# the three rungs below. Pick rungs per device call with RUNGS="0 1" (indices; default all).
# seq_len distance sites margin window grad_accum steps
rungs=("2048 1024 24 64 64 8 300" "8192 4096 96 256 256 8 200" "32768 16384 384 512 1024 8 100")
for i in ${RUNGS:-${!rungs[@]}}; do
    read -r n d s m w g t <<<"${rungs[$i]}"
    python3 -m genoflash.cli demo --device cuda --no-progress --seq-len "$n" --distance "$d" --sites "$s" \
        --spacer 0 --margin "$m" --window-size "$w" --steps "$t" --batch-size 16 --grad-accum "$g" --dim 128 \
        --out-dir "$out/L$n" "$@" 2>&1 | tee "$out/L$n.log"
    rm -f "$out/L$n"/*/checkpoint.pt
done
