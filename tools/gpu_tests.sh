#!/usr/bin/env bash
# The whole test suite on a CUDA GPU, in one call (on the H200 through the device tool:
# `bash tools/gpu_tests.sh`). The GPU image already has torch, triton and pytest-xdist;
# what it lacks (pyfaidx) is carried: run tools/device_carry.sh here and pass carry=[".whl"].
# Without TRITON_INTERPRET the `triton` backend runs compiled, bf16 is added to every dtype grid,
# and the GPU-only scale tests (tests/ops/attention/test_gpu_scale.py) run.
# With $OUT set, the log and a JUnit report are written there. Arguments go to pytest, e.g.
# `bash tools/gpu_tests.sh tests/ops/attention` for one area.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
source tools/device_env.sh  # carried wheels (pyfaidx), if carried
unset TRITON_INTERPRET
# NVLink multicast stays off on multi-GPU machines (the device tool's KINDS.md); the NCCL tests'
# spawned ranks inherit this.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out_dir=${OUT:-/tmp}
mkdir -p "$out_dir"  # under pipefail, tee into a missing folder would end the run before pytest
python3 - <<'PY' | tee "$out_dir/gpu_env.txt"
import datetime, os, subprocess, torch, triton
# The device machine gets a copy of the tree without .git: the caller passes GENOFLASH_COMMIT.
commit = os.environ.get("GENOFLASH_COMMIT") or subprocess.run(
    ["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
print(f"date {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}")
print(f"device {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  "
      f"cuda {torch.version.cuda}  commit {commit or 'unknown'}")
PY
# GENOFLASH_GPU_SPLIT=2 (no arguments; two GPUs): the suite in two halves side by side, ~8 min
# instead of ~14. GPU 0 takes the model, training, Hyena, benchmark and distributed tests (with
# GPU 1 visible too, so that the two-rank NCCL tests run); GPU 1 takes every other file. Logs go to
# $OUT/gpu0 and $OUT/gpu1; the exit status fails if either half fails.
if [[ "${GENOFLASH_GPU_SPLIT:-0}" == 2 && $# -eq 0 ]]; then
    mapfile -t first < <(find tests/models tests/train tests/ops/hyena tests/bench tests/distributed \
        -name 'test_*.py' | sort)
    mapfile -t second < <(find tests -name 'test_*.py' | sort | grep -v -x -F -f <(printf '%s\n' "${first[@]}"))
    self="$PWD/tools/gpu_tests.sh"
    CUDA_VISIBLE_DEVICES=0,1 OUT="$out_dir/gpu0" GENOFLASH_GPU_SPLIT=0 \
        GENOFLASH_TEST_WORKERS="${GENOFLASH_TEST_WORKERS:-6}" bash "$self" "${first[@]}" > "$out_dir/gpu0.out" 2>&1 &
    pid0=$!
    CUDA_VISIBLE_DEVICES=1 OUT="$out_dir/gpu1" GENOFLASH_GPU_SPLIT=0 \
        GENOFLASH_TEST_WORKERS="${GENOFLASH_TEST_WORKERS:-10}" bash "$self" "${second[@]}" > "$out_dir/gpu1.out" 2>&1 &
    pid1=$!
    status=0
    wait "$pid0" || status=1
    wait "$pid1" || status=1
    for half in gpu0 gpu1; do  # each half's summary line (or its output's end, if pytest never ran)
        echo "== $half"; tail -n 1 "$out_dir/$half/gpu_tests.log" 2>/dev/null || tail -n 5 "$out_dir/$half.out"
    done
    exit "$status"
fi
# No path given: pyproject's testpaths (tests/). Paths or -k given as arguments narrow the run.
# The tests marked whole_gpu (tens of GB each) run after the rest, one at a time; either run
# finding no test of its kind (pytest's status 5) is no failure.
status=0
python3 -m pytest -q -p no:cacheprovider -n "${GENOFLASH_TEST_WORKERS:-8}" -rfE --durations=10 -m "not whole_gpu" \
    --junitxml "$out_dir/gpu_tests.xml" "$@" 2>&1 | tee "$out_dir/gpu_tests.log" || status=${PIPESTATUS[0]}
[[ $status == 5 ]] && status=0
whole=0
python3 -m pytest -q -p no:cacheprovider -rfE -m whole_gpu --junitxml "$out_dir/gpu_tests_whole_gpu.xml" "$@" 2>&1 \
    | tee -a "$out_dir/gpu_tests.log" || whole=${PIPESTATUS[0]}
[[ $whole == 5 ]] && whole=0
exit $(( status || whole ))
