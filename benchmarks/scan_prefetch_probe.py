"""Probe: does requesting the next state's columns a state ahead (scan_channels_first.py's
`_next_state`) make the channels-first scan faster on the H200?

The loop over states reads A, B, C and the chunk states of state n at its top and then waits on
them: the loads do not feed a dot, so Triton does not pipeline them. The prefetching kernels
request state n+1's while state n is scanned. Same instructions otherwise (sm_90 SASS: loop
bodies 96/127/116/504 -> 103/128/118/525, the extra ones register moves). This times both with
`genoflash.bench.mixers.scan_bandwidth`, the same process, the same inputs: the kernels of
commit 26230d2 (copied beside the package as genoflash/ops/mamba/_cf_prev.py for the run, not
committed) and the working tree's.

    python benchmarks/scan_prefetch_probe.py --out X.json
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os

import torch
import triton

import genoflash.ops.mamba as mamba_ops
import genoflash.ops.mamba.scan_channels_first  # noqa: F401 - the attribute the probe swaps
from genoflash.bench.mixers import scan_bandwidth


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    current = mamba_ops.scan_channels_first
    variants = {"prefetch (working tree)": current}
    try:
        variants["no prefetch (26230d2)"] = importlib.import_module("genoflash.ops.mamba._cf_prev")
    except ImportError:
        pass
    rows = []
    device = torch.device("cuda")
    for seqlen, d_inner in ((262144, 512), (1048576, 512), (262144, 2048)):
        for _ in range(2):  # twice, alternating, so drift shows
            for name, module in variants.items():
                mamba_ops.scan_channels_first = module
                try:
                    point = scan_bandwidth(seqlen, d_inner, 16, device, channels_first=True)
                finally:
                    mamba_ops.scan_channels_first = current
                row = dict(variant=name, seqlen=seqlen, d_inner=d_inner, fwd_ms=point["fwd_ms"], bwd_ms=point["bwd_ms"],
                           bwd_atomic_ms=point["bwd_atomic_ms"])
                print(json.dumps(row), flush=True)
                rows.append(row)
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                       timespec="seconds"), torch=torch.__version__, triton=triton.__version__,
                       commit=os.environ.get("GENOFLASH_COMMIT", "unknown"), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
