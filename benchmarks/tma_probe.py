"""Probe: genoflash's kernels with TMA descriptors against pointer loads, beside cuDNN, on the H200.

For each shape, forward and fwd+bwd, in one process:
- `cudnn`: SDPA's cuDNN backend (the issue-5 reference peer);
- `pointers`: genoflash with TMA forbidden (`use_tma(False)`), the kernels as they were;
- `tma`: genoflash as shipped (descriptors in the forward and in the dQ pass; Q by TMA in the
  dK/dV pass where the tile config says so);
- `tma+fused-bwd`: `deterministic=False` with the one-pass backward forced (dQ by atomics or
  TMA reductions; the tile table does not take it on its own: slower on the H200 so far).
(At d32239f a third mode, Q by TMA in dK/dV everywhere, gave the figures in NOTES.md.)
Every genoflash output is checked against cuDNN's (or the math backend's) before timing.
TF/s: 4*B*H*N^2*D forward (2*N^2*(D+Dv) per head when Dv != D), halved when causal;
fwd+bwd counts 3.5x the forward.

    python benchmarks/tma_probe.py --out probe.json [--quick] [--shapes 0,8] [--fused-tiles 32,128,8,3;64,128,8,2]

--fused-tiles adds one `tma+fused-bwd` row per one-pass dK/dV tiling (BM,BN,WARPS,STAGES), beside
the table's own; --no-plain leaves out the `pointers` rows.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton

import dataclasses

import genoflash
from genoflash.ops.attention import descriptors
from genoflash.ops.attention.configs import TileConfig, backward_config, override_configs

SHAPES = [  # (batch, nheads, seqlen, headdim, headdim_v, causal, extra kwargs)
    (1, 16, 16384, 128, 128, False, {}),
    (1, 16, 16384, 128, 128, True, {}),
    (1, 32, 16384, 64, 64, False, {}),
    (1, 8, 65536, 128, 128, False, {}),
    (1, 8, 262144, 128, 128, False, {}),
    (1, 8, 16384, 64, 192, False, {}),
    (1, 8, 16384, 128, 192, False, {}),
    (1, 8, 65536, 128, 128, False, {"window_size": (2048, 2048)}),
    (1, 16, 16384, 128, 128, False, {"dropout_p": 0.1}),
    (1, 16, 16384, 128, 128, False, {"softcap": 30.0}),
    # hd256, the papers' sweep's B2 H8 N8192, where the backward trails SDPA flash (2026-12-01)
    (2, 8, 8192, 256, 256, False, {}),
    (2, 8, 8192, 256, 256, True, {}),
]


def sdpa(q, k, v, causal, backend):
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)


def fwd_bwd(fn, q, k, v, dout):
    def run():
        out = fn(q, k, v)
        out.backward(dout)
    return run


def main():
    from torch.nn.attention import SDPBackend

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shapes", default=None, help="comma-separated indices into SHAPES (default: all)")
    ap.add_argument("--fused-tiles", default="", help="';'-separated BM,BN,WARPS,STAGES one-pass dK/dV tilings")
    ap.add_argument("--no-pointers", action="store_true", help="leave out the pointer-load rows")
    args = ap.parse_args()
    shapes = SHAPES[:1] if args.quick else SHAPES
    if args.shapes:
        shapes = [SHAPES[int(i)] for i in args.shapes.split(",")]
    rows = []
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                commit=os.environ.get("GENOFLASH_COMMIT", "unknown"))
    for (b, h, n, d, dv, causal, extra) in shapes:
        torch.manual_seed(0)
        q = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, n, h, dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dout = torch.randn(b, n, h, dv, device="cuda", dtype=torch.bfloat16)
        fwd_flops = 2 * b * h * n * n * (d + dv) / (2 if causal else 1)
        if "window_size" in extra:  # useful FLOPs: each query sees at most left + right + 1 keys
            left, right = extra["window_size"]
            fwd_flops = 2 * b * h * n * min(n, left + right + 1) * (d + dv)
        tag = dict(batch=b, nheads=h, seqlen=n, headdim=d, headdim_v=dv, causal=causal,
                   features=json.dumps(extra, sort_keys=True))
        ref = None
        if not extra:
            try:
                with torch.no_grad():
                    ref = sdpa(q, k, v, causal, SDPBackend.CUDNN_ATTENTION)
            except RuntimeError:
                ref = None

        def timed(impl, fn, check=True):
            row = dict(tag, impl=impl)
            try:
                with torch.no_grad():
                    out = fn(q, k, v)
                if check and ref is not None:
                    row["max_err_vs_cudnn"] = (out.float() - ref.float()).abs().max().item()
                ms = triton.testing.do_bench(lambda: fn(q, k, v), warmup=25, rep=200)
                ms_fb = triton.testing.do_bench(fwd_bwd(fn, q, k, v, dout), warmup=10, rep=200,
                                                grad_to_none=[q, k, v])
                row.update(fwd_ms=ms, fwd_tflops=fwd_flops / ms * 1e-9, fwd_bwd_ms=ms_fb,
                           fwd_bwd_tflops=3.5 * fwd_flops / ms_fb * 1e-9)
            except Exception as e:  # noqa: BLE001 - a probe reports what failed and goes on
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(row), flush=True)
            rows.append(row)

        if not extra:
            timed("cudnn", lambda a, b_, c: sdpa(a, b_, c, causal, SDPBackend.CUDNN_ATTENTION), check=False)

        def geno(a, b_, c):
            return genoflash.flash_attn_func(a, b_, c, causal=causal, **extra)

        def geno_fused(a, b_, c):
            return genoflash.flash_attn_func(a, b_, c, causal=causal, deterministic=False, **extra)

        if not args.no_pointers:
            with descriptors.use_tma(False):
                timed("pointers", geno)
        timed("tma", geno)
        with override_configs(one_pass=True):  # the table does not take the one-pass backward itself
            timed("tma+fused-bwd", geno_fused)
        table = backward_config(d, dv, causal and not extra, torch.bfloat16, q.device,
                                dropout="dropout_p" in extra, seqlen=n)
        for spec in filter(None, args.fused_tiles.split(";")):
            tile = TileConfig(*map(int, spec.split(",")))
            with override_configs(backward=dataclasses.replace(table, fused_dkdv=tile), one_pass=True):
                timed(f"tma+fused-bwd {spec}", geno_fused)
        with open(args.out, "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
