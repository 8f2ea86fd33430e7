"""Probe: where the attention backward's time goes, kernel by kernel, on the GPU.

Runs one fwd+bwd of genoflash at one shape (bf16) with the two-pass backward (the default) and
with the one-pass backward forced (deterministic=False, override_configs(one_pass=True)), and
prints each kernel's median time from torch.profiler with the matmul TF/s it *executes*
(forward 2 matmuls, dK/dV 4, dQ 3, one-pass dK/dV 5; halved when causal), next to the useful
TF/s of the whole backward (2.5x the forward's FLOPs).

    python benchmarks/bwd_profile.py [--nheads 16 --seqlen 16384 --headdim 128 --causal] [--out X.json]

Under Nsight Compute, `--ncu` profiles only one fwd+bwd of each mode, after the compiles:
    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \
        python benchmarks/bwd_profile.py --ncu
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics

import torch
import triton

import genoflash
from genoflash.ops.attention.configs import override_configs

# Matmuls of 2*N^2*D FLOPs per head that each kernel executes (Dv = D).
MATMULS = {"_attn_fwd_kernel": 2, "_attn_bwd_dkdv_kernel": 4, "_attn_bwd_dq_kernel": 3}


def run_once(q, k, v, dout, causal, fused):
    out = genoflash.flash_attn_func(q, k, v, causal=causal, deterministic=not fused)
    out.backward(dout)


def kernel_times(q, k, v, dout, causal, fused, reps=10):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):  # compile and warm up outside the profile
        run_once(q, k, v, dout, causal, fused)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run_once(q, k, v, dout, causal, fused)
        torch.cuda.synchronize()
    times = collections.defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            times[ev.name].append(ev.device_time_total / 1e3 if hasattr(ev, "device_time_total")
                                  else ev.cuda_time_total / 1e3)
    return {name: statistics.median(ms) for name, ms in times.items() if len(ms) >= reps}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--nheads", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--ncu", action="store_true", help="profile one fwd+bwd per mode (cudaProfilerStart/Stop)")
    ap.add_argument("--out")
    args = ap.parse_args()
    b, h, n, d, causal = args.batch, args.nheads, args.seqlen, args.headdim, args.causal
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
    matmul_flops = 2 * b * h * n * n * d / (2 if causal else 1)

    if args.ncu:
        for fused in (False, True):
            with override_configs(one_pass=fused):
                run_once(q, k, v, dout, causal, fused)  # compile outside the profiled range
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for fused in (False, True):
            with override_configs(one_pass=fused):
                run_once(q, k, v, dout, causal, fused)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        return

    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  commit=os.environ.get("GENOFLASH_COMMIT", "unknown"), batch=b, nheads=h, seqlen=n, headdim=d,
                  causal=causal, modes={})
    for fused in (False, True):
        mode = "one-pass" if fused else "two-pass"
        with override_configs(one_pass=fused):
            times = kernel_times(q, k, v, dout, causal, fused)
        rows = {}
        bwd_ms = 0.0
        for name, ms in sorted(times.items(), key=lambda kv: -kv[1]):
            mm = MATMULS.get(name)
            if fused and name == "_attn_bwd_dkdv_kernel":
                mm = 5
            rows[name] = dict(ms=ms, executed_tflops=mm * matmul_flops / ms * 1e-9 if mm else None)
            if name != "_attn_fwd_kernel":
                bwd_ms += ms
        useful = 2.5 * 2 * matmul_flops / bwd_ms * 1e-9
        report["modes"][mode] = dict(kernels=rows, backward_ms=bwd_ms, backward_useful_tflops=useful)
        print(f"{mode}: backward {bwd_ms:.2f} ms, {useful:.0f} useful TF/s")
        for name, row in rows.items():
            tf = f"{row['executed_tflops']:.0f} TF/s executed" if row["executed_tflops"] else ""
            print(f"  {name:40s} {row['ms']:8.3f} ms  {tf}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
