#!/usr/bin/env bash
# The synthetic long-range task's 1 kb rung (tools/gpu_quality_ladder.sh's first: distance 1,024 in
# sequences of 2,048, 300 steps of 16 x 8 sequences, held-out accuracy on 256 every 60 steps) with
# each long-range mixer trained by its paper's recipe instead of the demo's shared one:
#   Hyena    HyenaDNA's tiny model: 2 layers of dim 128, peak lr 6e-4, weight decay 0.1, cosine decay;
#   BiMamba  Caduceus's layout: 4 BiMamba blocks without feed-forward, peak lr 8e-3, cosine to 3e-4.
# Every (recipe, seed) is its own `genoflash train --task synthetic` run, side by side on the GPU;
# then `genoflash bench quality` tables them with the demo ladder's runs given in LADDER_RUNS.
#
#   OUT=/some/dir SEEDS="0 1 2" RECIPES="hyenadna caduceus" LADDER_RUNS="dir1 dir2" \
#       bash tools/gpu_quality_recipes.sh [more train flags]
# (DEVICE=cpu with small --steps, --seq-len, --distance ... overrides smoke-tests it on a CPU.)
set -euo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${OUT:-/tmp}/quality-recipes
mkdir -p "$out"
task=(--task synthetic --seq-len 2048 --distance 1024 --sites 24 --spacer 0 --margin 64 --window-size 64
      --steps 300 --batch-size 16 --grad-accum 8 --dim 128 --nheads 4 --eval-every 60 --eval-samples 256
      --device "${DEVICE:-cuda}" --no-progress)
declare -A recipes=(
    [hyenadna]="--layer-pattern H --depth 2 --lr 6e-4 --min-lr 6e-5 --weight-decay 0.1"
    [caduceus]="--layer-pattern M --depth 4 --ffn-mult 0 --lr 8e-3 --min-lr 3e-4"
)
pids=()
for name in ${RECIPES:-${!recipes[@]}}; do
    for seed in ${SEEDS:-0 1 2}; do
        dir="$out/$name-seed$seed"
        # shellcheck disable=SC2086  # a recipe is a list of flags
        python3 -m genoflash.cli train "${task[@]}" ${recipes[$name]} --seed "$seed" --out-dir "$dir" --no-resume \
            "$@" > "$dir.log" 2>&1 &
        pids+=($!)
    done
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
find "$out" -path '*/checkpoints/*' -delete 2>/dev/null || true
mapfile -t done_runs < <(find "$out" -mindepth 1 -maxdepth 1 -type d | sort)
# shellcheck disable=SC2086  # LADDER_RUNS is a list of directories
python3 -m genoflash.cli bench quality ${LADDER_RUNS:-} "${done_runs[@]}" --out "$out"
exit $status
