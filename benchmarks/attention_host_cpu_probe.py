"""genoflash's host time per attention call on a machine without a GPU (a research probe).

Compiles the kernels for sm_90 (benchmarks/offline_compile.py's stand-in driver), then runs
flash_attn_func with every launch replaced by triton's compile-only path (warmup=True: the
arguments are bound and specialised, the compiled kernel is looked up, nothing launches). What it
times is genoflash's Python plus triton's JITFunction.run, without the launcher, the TMA
descriptor encoding and the CUDA calls that a GPU host adds (attention_host_probe.py measures the
whole on the GPU). Prints per-call times, the share spent in JITFunction.run, without and with
launch.py's fast path (its calls stubbed), and cProfile tables of attention_forward and
attention_backward called directly.

    python benchmarks/attention_host_cpu_probe.py [--batch 4 --nheads 16 --seqlen 512 --headdim 128]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import offline_compile as oc  # noqa: E402  (sets the offline-compile environment first)

import torch  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


def per_call_us(fn, iters: int, run_time: dict) -> tuple[float, float]:
    run_time["s"] = 0.0
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters * 1e6, run_time["s"] / iters * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--nheads", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--profile", default="attention_forward,attention_backward",
                    help="comma-separated calls to profile with cProfile (names as printed)")
    ap.add_argument("--profile-fast", action="store_true", help="profile with the fast launch on")
    ap.add_argument("--sort", default="tottime", help="cProfile sort key (tottime, cumulative)")
    args = ap.parse_args()

    run_time = {"s": 0.0}

    def timed_compile_only(self, *a, **kw):
        start = time.perf_counter()
        kernel = oc._compile_only(self, *a, **kw)
        run_time["s"] += time.perf_counter() - start
        return kernel

    driver.set_active(oc._Sm90Driver())
    JITFunction.run = timed_compile_only
    import genoflash
    from genoflash.backends import use_backend
    from genoflash.ops.attention import backward as bwd_mod, forward as fwd_mod
    from genoflash.ops.attention.args import AttentionArgs

    oc.stand_in_for_sm90()  # CPU tensors with the GPU's tile configs and TMA eligibility

    b, h, n, d = args.batch, args.nheads, args.seqlen, args.headdim
    q, k, v = (torch.randn(b, n, h, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, n, h, d, dtype=torch.bfloat16)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    a = AttentionArgs(d ** -0.5)
    with use_backend("triton"):
        out, lse = fwd_mod.attention_forward(qd, kd, vd, a)
        calls = {
            "attention_forward": lambda: fwd_mod.attention_forward(qd, kd, vd, a),
            "attention_backward": lambda: bwd_mod.attention_backward(dout, qd, kd, vd, out, lse, a),
            "flash_attn_func, no grad": lambda: genoflash.flash_attn_func(qd, kd, vd),
            "fwd+bwd (autograd)": lambda: torch.autograd.grad(genoflash.flash_attn_func(q, k, v), (q, k, v), dout),
        }
        for fn in calls.values():  # compile outside the timing
            fn()
        # Without and with launch.py's fast path (a cached compiled kernel called directly). Its
        # launches would run the kernel: here they are stubbed out, so that the second block
        # times genoflash's host work with the fast path, minus the launcher's own.
        from triton.compiler.compiler import CompiledKernel
        CompiledKernel.__getitem__ = lambda self, grid: (lambda *a, **kw: None)
        for fast in ("0", "1"):
            os.environ["GENOFLASH_FAST_LAUNCH"] = fast
            for fn in calls.values():
                fn()  # with the fast path: fills its cache
            print(f"-- fast launch {'on' if fast == '1' else 'off'}")
            for name, fn in calls.items():
                total, in_run = per_call_us(fn, args.iters, run_time)
                print(f"{name:26s} {total:7.1f} us per call, of which JITFunction.run {in_run:6.1f} us")
        # The profiles below: triton's usual path unless --profile-fast.
        os.environ["GENOFLASH_FAST_LAUNCH"] = "1" if args.profile_fast else "0"
        for name in args.profile.split(","):
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(200):
                calls[name]()
            prof.disable()
            print(f"===== {name} (cProfile, 200 calls)")
            pstats.Stats(prof).sort_stats(args.sort).print_stats(30)


if __name__ == "__main__":
    main()
