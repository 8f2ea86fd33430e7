#!/usr/bin/env bash
# The benchmarks on the GPU machine, in one call.
#
#   bash tools/gpu_bench.sh                     # attention (genomic shapes), features and mixers
#   bash tools/gpu_bench.sh attention [options] # one benchmark (attention, features, mixers,
#                                                 # memory), with its `genoflash bench` options
#   bash tools/gpu_bench.sh --shapes all        # options only: `bench attention` with them
#
# With no benchmark named it runs `bench attention --shapes genomic`, `bench features` and
# `bench mixers`. On a machine with two or more GPUs, attention runs on GPU 0 while features and
# then mixers run on GPU 1; on one GPU they run one after the other. Each gets BENCH_TIMEOUT
# seconds (default 540, under the device tool's 600 s per call), and what it finished is kept:
# the benchmarks save their JSON after every point. Run the GPU test suite in another call: a
# benchmark beside it on the same host reads slower (benchmarks/NOTES.md).
#
# Run from the repo root. Uses the image's torch/triton/matplotlib (installs nothing but the
# carried wheels, tools/device_carry.sh). flash-attn-4 and Mamba-2's SSD kernels are timed when
# they are importable (carry .peers for the latter). Results and one log per benchmark go to $OUT
# when it is set, else benchmarks/results. Set GENOFLASH_COMMIT to record the commit when the
# checkout has no .git.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
source tools/device_env.sh
unset TRITON_INTERPRET
out=${OUT:-benchmarks/results}
mkdir -p "$out"
limit=${BENCH_TIMEOUT:-540}

bench() {  # bench NAME [options]: one `genoflash bench NAME`, logged to $out/bench-NAME.log
    local name=$1
    shift
    timeout "$limit" python3 -m genoflash.cli bench "$name" --out "$out" "$@" 2>&1 | tee "$out/bench-$name.log" \
        || echo "bench $name stopped (exit ${PIPESTATUS[0]}); its JSON holds the points it finished" \
        | tee -a "$out/bench-$name.log"
}

case "${1:-}" in
    attention|features|mixers|memory)
        name=$1
        shift
        bench "$name" "$@"
        ;;
    "")
        ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
        if [[ "$ngpu" -ge 2 ]]; then
            (CUDA_VISIBLE_DEVICES=0 bench attention --shapes genomic) > /dev/null &
            (export CUDA_VISIBLE_DEVICES=1; bench features; bench mixers) > /dev/null &
            wait
        else
            bench attention --shapes genomic
            bench features
            bench mixers
        fi
        ;;
    *)  # the old form: options for bench attention
        bench attention "$@"
        ;;
esac
