#!/usr/bin/env bash
# Attention, Hyena or Mamba for DNA? Held-out accuracy against distance on the synthetic
# long-range task: `genoflash demo --mixers` at growing lengths, then `genoflash bench quality`
# over every rung written so far. Same model size (2 layers, dim 128), same steps and effective
# batch per rung for every mixer. The rungs are gpu_demo_ladder.sh's: elements near 19% of the
# sequence, 16 x 8 sequences per step. At 32 kb full attention learned by step 60 (2026-11-30).
#
#   OUT=/some/dir RUNGS="0 1" MIXERS=G,L,H,M bash tools/gpu_quality_ladder.sh [more demo flags]
# (DEVICE=cpu with small --steps, --dim and --batch-size overrides smoke-tests it on a CPU.)
#
# Full attention at 32 kb took 352 s and local attention 70 s on an H200 (2026-11-30); at ~1.4M
# tokens/s the 2 kb and 8 kb rungs take at most about 60 s and 150 s per model. Hyena's and Mamba's times
# are not known yet. A device call lasts at most 600 s, so split the work over calls and GPUs
# with RUNGS and MIXERS (e.g. GPU0: RUNGS=2 MIXERS=H, GPU1: RUNGS=2 MIXERS=M). Each (rung,
# mixers) pair writes its own folder; the table merges them per rung.
set -euo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${OUT:-/tmp}/quality-ladder
mkdir -p "$out"
mixers=${MIXERS:-G,L,H,M}
# seq_len distance sites margin window grad_accum steps
rungs=("2048 1024 24 64 64 8 300" "8192 4096 96 256 256 8 200" "32768 16384 384 512 1024 8 100")
for i in ${RUNGS:-${!rungs[@]}}; do
    read -r n d s m w g t <<<"${rungs[$i]}"
    dir="$out/L$n-${mixers//,/}"
    python3 -m genoflash.cli demo --device "${DEVICE:-cuda}" --no-progress --mixers "$mixers" --seq-len "$n" \
        --distance "$d" --sites "$s" --spacer 0 --margin "$m" --window-size "$w" --steps "$t" --batch-size 16 \
        --grad-accum "$g" --dim 128 --out-dir "$dir" "$@" 2>&1 | tee "$dir.log"
    rm -f "$dir"/*/checkpoint.pt
done
# Every rung finished so far (here and in earlier calls whose folders were copied back in).
mapfile -t done_runs < <(find "$out" -mindepth 2 -maxdepth 2 -name summary.json -printf '%h\n' | sort)
if [ "${#done_runs[@]}" -gt 0 ]; then
    python3 -m genoflash.cli bench quality "${done_runs[@]}" --out "$out"
fi
