"""Probe: how much of fused RoPE's cost is the cos/sin table traffic? (H200, one process.)

Fused RoPE costs +111% forward time with fp32 tables and +57% with fp16 tables at H16 N16k
hd128 (results/h200-2026-11-30-features-7f94066.json, -29-features-rope-dropout.json). A line
through those two points, cost = a + b * (bytes per table entry), gives a ~ 3% and b ~ 27% per
byte: the tables, not the rotation, would be the cost. Each program of the forward streams
all of K, all of V and both tables through L2; fp32 tables are twice K's bytes.

This probe tests that reading before anyone builds on it. Variants, forward and fwd+bwd, in
one process:
- `plain`: no RoPE;
- `fp32 tables`, `fp16 tables`: fused RoPE as shipped;
- `fp32 rows repeat`, `fp16 rows repeat`: the same kernels and tile configs, but tables whose
  row stride is 0: every position reads row 0, angle 0, so the output is plain attention's
  (checked on the CPU interpreter), with the same instructions as RoPE. Loads then hit one
  row in L1, so what remains over `plain` is the rotation and its shared-memory trip.
If the `rows repeat` variants land near `plain`, the lead is to stop streaming tables: e.g.
rotate by angle addition from a tile-invariant table of offsets and one row per tile,
cos((s + j) w) = cos(s w) cos(j w) - sin(s w) sin(j w), with the angles still made in fp64
on the host. If they land near the shipped variants, the rotation in registers is the cost.

    python benchmarks/rope_probe.py --out rope_probe.json
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.testing

from genoflash.ops.attention.args import AttentionArgs
from genoflash.ops.attention.backward import attention_backward
from genoflash.ops.attention.forward import attention_forward
from genoflash.rotary import rotary_tables

SHAPES = [(1, 16, 16384, 128), (1, 8, 65536, 128)]  # (batch, nheads, seqlen, headdim), non-causal


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                commit=os.environ.get("GENOFLASH_COMMIT", "unknown"),
                method="do_bench median; fwd+bwd = attention_forward + attention_backward; the "
                       "'rows repeat' variants read table row 0 for every position (row stride 0)")
    for b, h, n, d in SHAPES:
        torch.manual_seed(0)
        q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        flops = 4 * b * h * n * n * d
        variants = {"plain": {}}
        for dtype, name in ((torch.float32, "fp32"), (torch.float16, "fp16")):
            cos, sin = rotary_tables(n, d, device="cuda", dtype=dtype)
            variants[f"{name} tables"] = dict(rotary_cos=cos, rotary_sin=sin)
            # Row stride 0: AttentionArgs takes the tables as given (the public API would copy them).
            variants[f"{name} rows repeat"] = dict(rotary_cos=cos[:1].expand(n, -1), rotary_sin=sin[:1].expand(n, -1))
        for name, tables in variants.items():
            a = AttentionArgs(d ** -0.5, **tables)
            row = dict(batch=b, nheads=h, seqlen=n, headdim=d, variant=name, rotary_stride=a.rotary_stride)
            try:
                out, lse = attention_forward(q, k, v, a)
                fwd = triton.testing.do_bench(lambda: attention_forward(q, k, v, a), warmup=25, rep=200,
                                              return_mode="median")
                bwd = triton.testing.do_bench(lambda: attention_backward(dout, q, k, v, out, lse, a), warmup=25,
                                              rep=200, return_mode="median")
                row.update(fwd_ms=fwd, fwd_tflops=flops / fwd * 1e-9, fwd_bwd_ms=fwd + bwd,
                           fwd_bwd_tflops=3.5 * flops / (fwd + bwd) * 1e-9)
            except Exception as e:  # noqa: BLE001 - a probe reports what failed and goes on
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
            with open(args.out, "w") as f:
                json.dump(dict(meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
