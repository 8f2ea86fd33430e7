#!/usr/bin/env bash
# Where does the demo's recipe stop learning? `genoflash demo` (full vs local attention) at
# growing lengths on one GPU, elements scaled to keep (motif bases)^2 / seq_len near the CPU
# demo's 18. That held at 224 bp only (2026-11-29: 2 kb and 8 kb stayed at chance; see
# genoflash/data/synthetic.py). Each rung is one `genoflash demo` run; edit the rungs to probe.
#
#   OUT=/some/dir bash scripts/gpu_demo_ladder.sh [more genoflash demo flags]
set -euo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${OUT:-/tmp}/demo-ladder
mkdir -p "$out"
# seq_len distance sites margin window
rungs=("224 112 4 16 8" "2048 1024 12 64 64" "8192 4096 24 256 256")
for rung in "${rungs[@]}"; do
    read -r n d s m w <<<"$rung"
    python3 -m genoflash.cli demo --device cuda --no-progress --seq-len "$n" --distance "$d" --sites "$s" \
        --spacer 0 --margin "$m" --window-size "$w" --steps 300 --batch-size 16 --dim 128 \
        --out-dir "$out/L$n" "$@" 2>&1 | tee "$out/L$n.log"
    rm -f "$out/L$n"/*/checkpoint.pt
done
