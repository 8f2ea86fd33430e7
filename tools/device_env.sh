# Sourced by the GPU scripts on the device machine: installs the carried wheels (.whl) into
# /tmp/genoflash-site and puts the carried ../shared/data in place (see tools/device_carry.sh).
# Does nothing where these were not carried (or are already there).
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/genoflash-site .whl/*.whl
    export PYTHONPATH="/tmp/genoflash-site${PYTHONPATH:+:$PYTHONPATH}"
fi
# Peers carried for measurement only (tools/device_carry.sh): importable by the benchmarks.
if [[ -d .peers ]]; then
    export PYTHONPATH="$PWD/.peers${PYTHONPATH:+:$PYTHONPATH}"
fi
if [[ -d .carry/shared-data && ! -d ../shared/data ]]; then
    mkdir -p ../shared && cp -r .carry/shared-data ../shared/data && chmod -R a-w ../shared/data
fi
