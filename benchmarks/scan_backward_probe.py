"""Probe: the Mamba scan's sequential backward (genoflash/ops/mamba/backward.py) beside the chunked
backward kernels (scan_channels_first.py), on the H200, in one process.

Prediction (twenty-third session, before the first GPU run): the chunked backward issues ~63 sm_90
instructions per state and step (twenty-second session) and is 88% of the scan's time. The
sequential one's gradient kernel (offline sm_90, 4 warps): ~5,600-5,800 instructions per kernel,
~5,000 of them in the loop over 8-step tiles of 16 states, ~39 per state and step (the tile's
forward again, the reverse walk, the lane reductions of dB and dC), at 255 registers, spilling
628 B per thread with GS 2 and 44 B with GS 1. If issue-bound, ~1.5x faster than the chunked
backward. Outcome (`09363e9`, GS 1, the state-major row loads that cut its compile time, spilling
1.2 kB; results/h200-2026-12-03-scan-backward-probe-09363e9.json): 4% slower (70.8 against 68.2
ms at 1M x 512) with 40% less peak memory: not issue-bound (benchmarks/NOTES.md, twenty-third
session).

Each row: one shape (channels-first bf16 u, delta, z; D, delta_bias, softplus: the Mamba block's
call), the forward with the states each backward takes, and the backward alone (median ms,
do_bench), its peak memory above the inputs, and the largest difference of each gradient from
the chunked backward's relative to its largest value. Saved after every row.

    python benchmarks/scan_backward_probe.py --out X.json
"""

from __future__ import annotations

import argparse
import json

import torch

from genoflash.bench.mixers import _time
from genoflash.bench.records import run_metadata
from genoflash.ops.mamba import backward, forward, scan_channels_first

NAMES = ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias")


def _save(path, rows):
    with open(path, "w") as f:
        json.dump(dict(meta=run_metadata(), rows=rows), f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="262144x512,1048576x512,262144x2048")
    ap.add_argument("--variants", default="chunked,sequential-16-gs1,sequential-16-gs2,sequential-8-gs1")
    args = ap.parse_args()
    device = torch.device("cuda")
    rows = []
    for shape in args.shapes.split(","):
        n, d_inner = (int(x) for x in shape.split("x"))
        gen = torch.Generator(device=device).manual_seed(0)

        def act(scale=1.0):
            return (torch.randn(1, d_inner, n, device=device, generator=gen) * scale).to(torch.bfloat16).transpose(1, 2)

        u, z, delta, dout = act(), act(), act(0.5), act()
        A = -torch.rand(d_inner, 16, device=device, generator=gen) - 0.5
        B, C = (torch.randn(1, n, 16, device=device, generator=gen).to(torch.bfloat16) for _ in range(2))
        extras = dict(D=torch.ones(d_inner, device=device), z=z, delta_bias=torch.rand(d_inner, device=device) - 4.0,
                      softplus=True)
        reference = None
        for variant in args.variants.split(","):
            every = None if variant == "chunked" else int(variant.split("-")[1])
            if every:
                backward.GS = int(variant.split("gs")[1])
            fwd = lambda: forward.scan_forward(u, delta, A, B, C, **extras, state_every=every)  # noqa: E731
            fwd_ms = _time(fwd, device)
            _, h, p = fwd()
            if every is None:
                bwd = lambda: scan_channels_first.scan_backward(dout, u, delta, A, B, C, h, p, **extras)  # noqa: E731
            else:
                bwd = lambda: backward.scan_backward(dout, u, delta, A, B, C, h, **extras,  # noqa: E731
                                                     state_every=every)
            grads = bwd()  # compiles
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            grads = bwd()
            torch.cuda.synchronize()
            peak_gib = (torch.cuda.max_memory_allocated() - base) / 2**30
            bwd_ms = _time(bwd, device)
            grads = [g.float() for g in grads]
            if reference is None:
                reference = grads
            diffs = {name: ((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
                     for name, g, r in zip(NAMES, grads, reference)}
            nan = any(torch.isnan(g).any().item() for g in grads)
            row = dict(seqlen=n, d_inner=d_inner, dstate=16, variant=variant, fwd_ms=fwd_ms, bwd_ms=bwd_ms,
                       bwd_peak_gib_above_inputs=peak_gib,
                       saved_states_gib=(h.numel() + (0 if p is None else p.numel())) * 4 / 2**30,
                       rel_diff_vs_chunked=diffs, nan=nan)
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
            rows.append(row)
            _save(args.out, rows)
            del grads, h, p


if __name__ == "__main__":
    main()
