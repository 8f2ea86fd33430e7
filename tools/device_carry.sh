#!/usr/bin/env bash
# Prepare what a device call must carry (run here, on the development machine):
#   .whl/   wheels the GPU image lacks: pyfaidx (tests), einops (the Mamba-2 peer below)
#   .carry/shared-data/   a copy of ../shared/data, which does not travel with the repo
#   .peers/mamba_ssm/   mamba_ssm's Triton source, for `genoflash bench mixers` to time Mamba-2's
#       SSD kernels beside genoflash's scan: measurement only, never imported by genoflash
#       (../shared/tools/peers-mixers.md)
# All are git-ignored (.git/info/exclude, .gitignore). Pass carry=[".whl", ".carry"] to the device
# call, and ".peers" too for the mixers benchmark; tools/device_env.sh installs and places them.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
grep -qx '/.carry/' .git/info/exclude || echo '/.carry/' >> .git/info/exclude
mkdir -p .whl .carry
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 -d .whl "pyfaidx>=0.8" einops 2>&1 | grep -v "is ignored" || true
if [[ ! -f .peers/mamba_ssm/ops/triton/ssd_combined.py ]]; then
    tmp=$(mktemp -d)
    # Preparing mamba-ssm's metadata imports torch and needs wheel: the dev venv has both (the
    # system python3 may not, and then nothing is downloaded).
    py=python3
    [[ -x .venv/bin/python ]] && py=.venv/bin/python
    MAMBA_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE $py -m pip download -q --no-deps \
        --no-binary=:all: --no-build-isolation mamba-ssm==2.3.2.post1 -d "$tmp" 2>&1 | grep -v "is ignored" || true
    if compgen -G "$tmp/mamba_ssm-*.tar.gz" > /dev/null; then
        tar xzf "$tmp"/mamba_ssm-*.tar.gz -C "$tmp"
        mkdir -p .peers && rm -rf .peers/mamba_ssm && cp -r "$tmp"/mamba_ssm-*/mamba_ssm .peers/
        : > .peers/mamba_ssm/__init__.py  # keeps it from importing the CUDA extension
    else
        echo "mamba_ssm source not downloaded: bench mixers will report the Mamba-2 peer as unavailable"
    fi
    rm -rf "$tmp"
fi
rm -rf .carry/shared-data && cp -r ../shared/data .carry/shared-data && chmod -R u+w .carry/shared-data
ls .whl .carry/shared-data .peers 2>/dev/null || true
