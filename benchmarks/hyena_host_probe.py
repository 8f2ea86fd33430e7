"""Where the Hyena layer's forward+backward spends its host time (a research probe, GPU only).

At 16k (d_model 256, bf16) the layer's kernels add up to ~1.9 ms while one call takes 5.5-6.2 ms
of wall time (NOTES.md, eleventh session): the GPU waits on the host. This probe separates
the two questions that decide the fix:
  1. Does the host ever wait for the GPU inside one call (a synchronising op)? Then wall time
     is host + device, not max(host, device). Measured as the time step() takes to *return*
     without a final synchronize, against the synchronised wall time, and as the CUDA runtime
     calls that block (cudaStreamSynchronize, cudaMemcpy*, cudaMemGetInfo ...) in the profile.
  2. Which ops cost the host most: torch.profiler's self CPU time per op, top rows, and the
     op count per call.
Writes --out (JSON), with the run's metadata; prints a summary.

    python benchmarks/hyena_host_probe.py --out /tmp/hyena-host.json [--seqlens 16384,65536]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from genoflash.bench.mixers import layer_step
from genoflash.bench.records import run_metadata


def probe(seqlen: int, d_model: int, dtype: torch.dtype, top: int) -> dict:
    from torch.profiler import ProfilerActivity, profile
    from triton.testing import do_bench
    device = torch.device("cuda")
    layer, x, dy, params, step = layer_step("hyena", d_model, seqlen, device, dtype)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    returned, walls, fwd_returned = [], [], []
    for _ in range(20):
        torch.cuda.synchronize()
        start = time.perf_counter()
        y = layer(x)
        mid = time.perf_counter()
        torch.autograd.grad(y, params, dy)
        end = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        fwd_returned.append((mid - start) * 1e3)
        returned.append((end - start) * 1e3)
        walls.append((done - start) * 1e3)
    bench_ms = do_bench(step, warmup=5, rep=50, return_mode="median")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    ops = [e for e in events if e.key.startswith("aten::")]
    cpu_rows = sorted(({"op": e.key[:100], "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3}
                       for e in events if e.self_cpu_time_total > 0), key=lambda r: -r["self_cpu_ms"])
    runtime = sorted(({"call": e.key[:100], "calls": e.count, "cpu_ms": e.cpu_time_total / 1e3}
                      for e in events if e.key.startswith(("cuda", "cu")) and e.cpu_time_total > 0),
                     key=lambda r: -r["cpu_ms"])
    kernels_ms = sum(e.self_device_time_total for e in events) / 1e3
    rec = {"seqlen": seqlen, "d_model": d_model, "dtype": str(dtype),
           "wall_ms_median": statistics.median(walls), "returned_ms_median": statistics.median(returned),
           "forward_returned_ms_median": statistics.median(fwd_returned), "do_bench_ms": bench_ms,
           "kernels_ms": kernels_ms, "aten_op_calls": sum(e.count for e in ops),
           "top_self_cpu": cpu_rows[:top], "runtime_calls": runtime[:top]}
    print(f"N={seqlen:,}: wall {rec['wall_ms_median']:.2f} ms (do_bench {bench_ms:.2f}), step returns after "
          f"{rec['returned_ms_median']:.2f} ms (forward {rec['forward_returned_ms_median']:.2f}), kernels "
          f"{kernels_ms:.2f} ms, {rec['aten_op_calls']} aten calls", flush=True)
    for r in cpu_rows[:top]:
        print(f"   {r['self_cpu_ms']:7.3f} ms  x{r['calls']:<4} {r['op']}")
    print("  runtime API:")
    for r in runtime[:top]:
        print(f"   {r['cpu_ms']:7.3f} ms  x{r['calls']:<4} {r['call']}")
    return rec


def host_costs() -> dict:
    """Host microseconds per call, without synchronising: a small elementwise op, a small mm, and
    one Triton launch (the short convolution's kernel) - the unit costs of the layer's ops."""
    from genoflash.ops.hyena.short_conv import short_conv
    a = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 256, 1024, device="cuda", dtype=torch.bfloat16)
    cw, cb = torch.randn(256, 3, device="cuda", dtype=torch.bfloat16), torch.randn(256, device="cuda",
                                                                                 dtype=torch.bfloat16)
    costs = {}
    for name, fn in (("mul", lambda: a * 2.0), ("mm", lambda: a @ w),
                     ("triton short_conv", lambda: short_conv(x, cw, cb, 2, None, False))):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(200):
            fn()
        costs[name] = (time.perf_counter() - start) / 200 * 1e6
        torch.cuda.synchronize()
    print("host us per call: " + ", ".join(f"{k} {v:.1f}" for k, v in costs.items()), flush=True)
    return costs


def python_profile(seqlen: int, d_model: int, path: str, calls: int = 50, top: int = 45) -> None:
    """cProfile of `calls` fwd+bwd steps (no synchronisation inside): which Python functions, ours
    or torch's, hold the host. Written as pstats text, sorted by own time, then by cumulative."""
    import cProfile
    import io
    import pstats
    step = layer_step("hyena", d_model, seqlen, torch.device("cuda"), torch.bfloat16).step
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    start = time.perf_counter()
    # cProfile sees only its own thread, and autograd runs a CUDA backward on a device thread of
    # its own: with multithreading off the backward runs here, where the profile can see it.
    with torch.autograd.set_multithreading_enabled(False):
        prof.enable()
        for _ in range(calls):
            step()
        prof.disable()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / calls * 1e3
    text = io.StringIO()
    text.write(f"N={seqlen:,} d_model={d_model}: {calls} fwd+bwd steps under cProfile, {wall:.2f} ms each "
               f"(profiling slows Python)\n")
    for key in ("tottime", "cumulative"):
        pstats.Stats(prof, stream=text).sort_stats(key).print_stats(top)
    with open(path, "w") as f:
        f.write(text.getvalue())
    print(text.getvalue()[:4000], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--pyprofile", default=None,
                        help="also write a cProfile of 50 steps at the first seqlen to this text file")
    parser.add_argument("--seqlens", default="16384,65536")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--label", default="", help="recorded with the results, e.g. the tree's commit")
    args = parser.parse_args()
    import genoflash
    print(f"genoflash from {genoflash.__file__}", flush=True)
    results = [probe(int(n), args.d_model, torch.bfloat16, args.top) for n in args.seqlens.split(",")]
    if args.pyprofile:
        python_profile(int(args.seqlens.split(",")[0]), args.d_model, args.pyprofile)
    with open(args.out, "w") as f:
        json.dump({"metadata": run_metadata(method="hyena layer fwd+bwd, B1, bf16; wall = synchronised "
                                            "perf_counter median of 20", label=args.label,
                                            genoflash_path=genoflash.__file__),
                   "host_us_per_call": host_costs(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
