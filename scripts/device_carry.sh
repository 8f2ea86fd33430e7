#!/usr/bin/env bash
# Prepare what a device call must carry (run here, on the development machine):
#   .whl/   wheels of the test needs the GPU image lacks (pyfaidx)
#   .carry/shared-data/   a copy of ../shared/data, which does not travel with the repo
# Both are git-ignored (.git/info/exclude). Pass carry=[".whl", ".carry"] to the device call;
# scripts/device_env.sh installs and places them there.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
grep -qx '/.carry/' .git/info/exclude || echo '/.carry/' >> .git/info/exclude
mkdir -p .whl .carry
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 -d .whl "pyfaidx>=0.8" 2>&1 | grep -v "is ignored" || true
rm -rf .carry/shared-data && cp -r ../shared/data .carry/shared-data && chmod -R u+w .carry/shared-data
ls .whl .carry/shared-data
