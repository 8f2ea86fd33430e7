"""Probe: the Mamba scan's sequential forward (genoflash/ops/mamba/forward.py) beside the chunked
forward kernels it replaces, on the H200.

Prediction (offline sm_90 SASS, dstate 16): the chunked forward issued ~28 instructions per state
and step, the sequential one 6.1 (pass 1) + 10.0 (pass 3). Both passes take one MUFU.EX2 per
state and step; at 16 per clock and SM (132 SMs, ~1.98 GHz) that bounds the forward at ~4.1 ms
for a million tokens x 512 channels x 16 states, whose bytes take ~1.0 ms at 4.2 TB/s: the
forward should land near 25% of copy bandwidth at best, against 6% before. Outcome
(benchmarks/NOTES.md, twenty-second session): 17.0 ms at first, no faster than the chunked
forward (ncu: stalled on loads); 9.4 ms (10.9%) once the loads ran ahead of their use.

Times `genoflash.bench.mixers.scan_bandwidth` (sequential forward with and without the chunk
states, the chunked forward, the backward) over N and d_inner, both layouts, and the segments'
count (forward.PROGRAMS_PER_SM). `--ncu`: one sequential forward and one backward at 262k x 512
between cudaProfilerStart/Stop, for Nsight Compute's pipe utilisation and each kernel's time.

`--variants`: the forward alone (with and without the chunk states), channels-first, under
settings of forward.ROWS_AHEAD, OUT_MAXNREG, PAD_ROWS, PREFETCH_ROWS and TILES_AHEAD, in one process
(twenty-second session: B's and C's rows and the next tile loaded ahead of their use).

    python benchmarks/scan_forward_probe.py --out X.json [--ncu | --variants]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os

import torch
import triton

from genoflash.bench.mixers import _time, copy_bandwidth_gbps, scan_bandwidth
from genoflash.ops.mamba import forward, scan_channels_first


def _ncu_once() -> None:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    n, d, s = 262144, 512, 16
    u, delta, z = (torch.randn(1, d, n, device=device, generator=gen, dtype=torch.bfloat16).transpose(1, 2)
                   for _ in range(3))
    A = -torch.rand(d, s, device=device, generator=gen) - 0.5
    B, C = (torch.randn(1, n, s, device=device, generator=gen, dtype=torch.bfloat16) for _ in range(2))
    extras = dict(D=torch.ones(d, device=device), z=z, delta_bias=torch.rand(d, device=device) - 4.0, softplus=True)
    dout = torch.randn(1, d, n, device=device, generator=gen, dtype=torch.bfloat16).transpose(1, 2)

    def once():
        _, h0, decay = forward.scan_forward(u, delta, A, B, C, **extras)
        scan_channels_first.scan_backward(dout, u, delta, A, B, C, h0, decay, **extras)

    once()  # compile outside the profiled range
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    once()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def _variants(copy: float, path: str) -> list[dict]:
    """forward.scan_forward alone per setting, bf16, dstate 16, with the Mamba
    block's extras; GB/s over the bytes the forward must move (as scan_bandwidth counts them).
    The chunked forward (scan_channels_first.py) is timed once per shape beside them. Saved
    after every row."""
    device = torch.device("cuda")
    rows = []
    shapes = ((True, 512, 262144), (True, 512, 1048576), (True, 2048, 262144))
    # twenty-second session timed (1, None, True, True, 0), (1, 128, True, True, 0), (1, None, True,
    # False, 0) and (2, 128, True, True, 0), the default since; next: the L2 prefetch of the tiles
    settings = ((2, 128, True, True, 0), (2, 128, True, True, 1), (2, 128, True, True, 2), (1, 128, True, True, 1))
    keys = ("ROWS_AHEAD", "OUT_MAXNREG", "PAD_ROWS", "PREFETCH_ROWS", "TILES_AHEAD")
    defaults = tuple(getattr(forward, k) for k in keys)
    for channels_first, d_inner, n in shapes:
        gen = torch.Generator(device=device).manual_seed(0)
        shape = (1, d_inner, n) if channels_first else (1, n, d_inner)

        def act(scale=1.0):
            t = (torch.randn(shape, device=device, generator=gen) * scale).to(torch.bfloat16)
            return t.transpose(1, 2) if channels_first else t

        u, z, delta = act(), act(), act(0.5)
        A = -torch.rand(d_inner, 16, device=device, generator=gen) - 0.5
        B, C = (torch.randn(1, n, 16, device=device, generator=gen).to(torch.bfloat16) for _ in range(2))
        extras = dict(D=torch.ones(d_inner, device=device), z=z, delta_bias=torch.rand(d_inner, device=device) - 4.0,
                      softplus=True)
        reference = None
        fwd_bytes = 2 * (4 * n * d_inner + 2 * n * 16)
        chunked_ms = _time(lambda: scan_channels_first.scan_forward(u, delta, A, B, C, **extras), device)
        rows.append(dict(channels_first=channels_first, d_inner=d_inner, seqlen=n, forward="chunked",
                         fwd_ms=chunked_ms, fwd_of_copy=fwd_bytes / (chunked_ms * 1e-3) / 1e9 / copy))
        print(json.dumps(rows[-1]), flush=True)
        for setting in settings:
            for k, v in zip(keys, setting):
                setattr(forward, k, v)
            ahead, maxnreg, pad, prefetch, tiles_ahead = setting
            out = forward.scan_forward(u, delta, A, B, C, **extras)[0].float()
            if reference is None:
                reference = out
            diff = ((out - reference).abs().max() / reference.abs().max()).item()
            ms = _time(lambda: forward.scan_forward(u, delta, A, B, C, **extras), device)
            inf_ms = _time(lambda: forward.scan_forward(u, delta, A, B, C, **extras, save_chunks=False), device)
            row = dict(channels_first=channels_first, d_inner=d_inner, seqlen=n, rows_ahead=ahead, out_maxnreg=maxnreg,
                       pad_rows=pad, prefetch_rows=prefetch, tiles_ahead=tiles_ahead,
                       fwd_ms=ms, fwd_inference_ms=inf_ms, fwd_of_copy=fwd_bytes / (ms * 1e-3) / 1e9 / copy,
                       fwd_inference_of_copy=fwd_bytes / (inf_ms * 1e-3) / 1e9 / copy, rel_diff_vs_first=diff)
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
            rows.append(row)
            _save(path, copy, rows)
        for k, v in zip(keys, defaults):
            setattr(forward, k, v)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--variants", action="store_true")
    args = ap.parse_args()
    if args.ncu:
        _ncu_once()
        return
    device = torch.device("cuda")
    copy = copy_bandwidth_gbps(device)
    rows = []
    if args.variants:
        _variants(copy, args.out)
        return

    def point(**kw):
        p = scan_bandwidth(device=device, **kw)
        p.update(programs_per_sm=forward.PROGRAMS_PER_SM, copy_gbps=copy, fwd_of_copy=p["fwd_gbps"] / copy,
                 fwd_inference_of_copy=p["fwd_inference_gbps"] / copy, bwd_of_copy=p["bwd_gbps"] / copy)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in p.items()}), flush=True)
        rows.append(p)

    for channels_first in (True, False):
        for d_inner in (512, 2048):
            for seqlen in (65536, 262144, 1048576):
                point(seqlen=seqlen, d_inner=d_inner, dstate=16, channels_first=channels_first)
    default = forward.PROGRAMS_PER_SM
    try:
        for per_sm in (4, 16, 32):
            forward.PROGRAMS_PER_SM = per_sm
            for seqlen in (65536, 1048576):
                point(seqlen=seqlen, d_inner=512, dstate=16, channels_first=True)
    finally:
        forward.PROGRAMS_PER_SM = default
    _save(args.out, copy, rows)


def _save(path: str, copy: float, rows: list[dict]) -> None:
    with open(path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                       timespec="seconds"), torch=torch.__version__, triton=triton.__version__,
                       commit=os.environ.get("GENOFLASH_COMMIT", "unknown"), copy_gbps=copy, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
