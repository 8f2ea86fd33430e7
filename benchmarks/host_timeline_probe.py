"""Host-bound or device-bound? The timeline of short attention calls on the GPU machine (a probe).

The host probes time the host per call in a loop of 100-200 calls without synchronising. If the
GPU is slower than the host, that loop fills the launch queue after some calls, every launch then
waits for a free slot, and the "host time" reads the GPU's time instead. This probe separates the
two for genoflash (deterministic False and True) and SDPA's flash backend:
  - burst: after a synchronise, the host time of 3 calls (the queue cannot fill), median of 30;
  - loop: the host time per call over 100 calls without synchronising, and the wall time per call;
  - a torch.profiler timeline of 5 calls: the GPU's busy time (union of kernel intervals) and idle
    time per call, the kernels by name, the CUDA API calls by name (launches, memsets, syncs,
    allocations) with their host durations.

    python benchmarks/host_timeline_probe.py --out X.json [--trace-dir DIR]
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import time

import torch
import torch.nn.functional as F

import genoflash
from genoflash.bench.records import run_metadata

from attention_host_probe import per_call  # (benchmarks/, this script's folder)


def burst_us(fn, calls: int = 3, bursts: int = 30) -> float:
    for _ in range(5):
        fn()
    samples = []
    for _ in range(bursts):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return round(statistics.median(samples), 1)


def loop_us(fn, iters: int = 100) -> tuple[float, float]:
    """(host, wall) microseconds per call over a loop without synchronising (attention_host_probe's)."""
    r = per_call(fn, iters)
    return round(r["enqueue_ms"] * 1e3, 1), round(r["wall_ms"] * 1e3, 1)


def timeline(fn, calls: int = 5, trace: str | None = None) -> dict:
    """From a torch.profiler chrome trace (its event categories are stable across versions):
    kernels ("kernel") and CUDA runtime / driver calls ("cuda_runtime", "cuda_driver")."""
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    path = trace or tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    kernels, api = [], collections.defaultdict(list)
    for e in events:
        cat = e.get("cat", "")
        if e.get("ph") != "X":
            continue
        if cat == "kernel":
            kernels.append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"]))
        elif cat in ("cuda_runtime", "cuda_driver"):
            api[e["name"]].append(float(e["dur"]))
    kernels.sort()
    busy, cur_s, cur_e = 0.0, None, None
    for s, e, _ in kernels:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    span = (kernels[-1][1] - kernels[0][0]) if kernels else 0.0
    by_kernel = collections.defaultdict(lambda: [0, 0.0])
    for s, e, name in kernels:
        by_kernel[name[:80]][0] += 1
        by_kernel[name[:80]][1] += e - s
    return dict(
        gpu_busy_us_per_call=round(busy / calls, 1), gpu_span_us_per_call=round(span / calls, 1),
        kernels={k: dict(count_per_call=c / calls, us_per_call=round(t / calls, 1)) for k, (c, t) in by_kernel.items()},
        api={k: dict(count_per_call=len(v) / calls, us_per_call=round(sum(v) / calls, 1), max_us=round(max(v), 1))
             for k, v in api.items()})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--trace-dir")
    args = ap.parse_args()
    dev = torch.device("cuda")
    shapes = [(32, 512, 16, 128, True), (32, 512, 16, 128, False), (32, 512, 32, 64, True), (16, 1024, 16, 128, True),
              (8, 2048, 16, 128, False)]
    report = dict(run_metadata(), method=__doc__.split("\n\n")[1], shapes=[])
    for b, n, h, d, causal in shapes:
        q, k, v = (torch.randn(b, n, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.randn_like(q)
        qt, kt, vt = (u.detach().transpose(1, 2).requires_grad_() for u in (q, k, v))
        doutt = dout.transpose(1, 2)
        tag = f"B{b} N{n} H{h} hd{d}{' causal' if causal else ''}"

        def gf(det):
            return lambda: torch.autograd.grad(genoflash.flash_attn_func(q, k, v, causal=causal, deterministic=det),
                                               (q, k, v), dout)

        def gf_fwd():
            with torch.no_grad():
                genoflash.flash_attn_func(q, k, v, causal=causal)

        def sdpa():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                torch.autograd.grad(F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), (qt, kt, vt), doutt)

        entry = dict(shape=tag, calls={})
        for name, fn in (("genoflash fwd", gf_fwd), ("genoflash fwd+bwd det=False", gf(False)),
                         ("genoflash fwd+bwd det=True", gf(True)), ("sdpa-flash fwd+bwd", sdpa)):
            enq, wall = loop_us(fn)
            trace = None
            if args.trace_dir and name != "genoflash fwd" and n == 512 and causal and d == 128:
                trace = f"{args.trace_dir}/trace-{name.split()[0]}-{name.split()[-1]}.json"
            c = dict(burst_us=burst_us(fn), loop_enqueue_us=enq, loop_wall_us=wall, timeline=timeline(fn, trace=trace))
            entry["calls"][name] = c
            t = c["timeline"]
            launches = sum(v["us_per_call"] for kk, v in t["api"].items() if "aunch" in kk)
            print(f"{tag:28s} {name:28s} burst {c['burst_us']:7.1f}  loop {enq:7.1f} / wall {wall:7.1f} us;"
                  f" GPU busy {t['gpu_busy_us_per_call']:7.1f} of span {t['gpu_span_us_per_call']:7.1f};"
                  f" launch API {launches:6.1f} us", flush=True)
        report["shapes"].append(entry)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
