#!/usr/bin/env bash
# Context-parallel ring attention across every GPU of the machine, in one call (a device kind
# with several GPUs, e.g. nvidia-h200-x2):
#
#   GENOFLASH_COMMIT=<sha> bash tools/gpu_ring.sh [genoflash bench ring options]
#
# One process per GPU under torchrun, NCCL. Results go to $OUT when set, else benchmarks/results.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
source tools/device_env.sh
unset TRITON_INTERPRET
# NVLink multicast stays off: on the shared hosts a program that uses it can take the GPUs out of
# service (the device tool's KINDS.md). The machines set these; a launcher must not drop them.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
if (( ngpu < 2 )); then
    echo "gpu_ring.sh needs at least two GPUs, found $ngpu" >&2
    exit 2
fi
torchrun --standalone --nproc-per-node "$ngpu" -m genoflash.cli bench ring --out "${OUT:-benchmarks/results}" "$@"
