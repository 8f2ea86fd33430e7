#!/usr/bin/env bash
# The whole test suite on a CUDA GPU, in one call (on the H200 through the device tool:
# `bash scripts/gpu_tests.sh`). The GPU image already has torch, triton and pytest-xdist;
# what it lacks (pyfaidx) and ../shared/data are carried: run scripts/device_carry.sh here and pass
# carry=[".whl", ".carry"]. Without TRITON_INTERPRET the `triton` backend runs compiled, bf16 is
# added to every dtype grid, and the GPU-only scale tests (tests/test_gpu_scale.py) run.
# With $OUT set, the log and a JUnit report are written there. Arguments go to pytest, e.g.
# `bash scripts/gpu_tests.sh tests/test_attention.py` for one file.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
source scripts/device_env.sh  # carried wheels (pyfaidx) and ../shared/data, if carried
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
# No path given: pyproject's testpaths (tests/). Paths or -k given as arguments narrow the run.
python3 -m pytest -q -p no:cacheprovider -n "${GENOFLASH_TEST_WORKERS:-8}" -rfE --durations=10 \
    --junitxml "$out_dir/gpu_tests.xml" "$@" 2>&1 | tee "$out_dir/gpu_tests.log"
