"""What each layer of a short attention call costs on the GPU machine's host (a research probe).

attention_host_probe.py splits one genoflash call; this one measures the floors under it, each
alone, so that a change to the host path can be predicted before it is made:
  - torch.empty on the GPU; torch.cuda.mem_get_info;
  - a trivial Triton kernel launched through JITFunction.run, through CompiledKernel[grid] (what
    launch.py's fast path calls) and through the CudaLauncher alone; with 1, 60 and 90 scalar
    arguments; with 4 TMA TensorDescriptors;
  - a fixed piece of pure Python, on this thread and inside a custom autograd Function's backward
    (which the engine runs on its device thread);
  - a custom Function that launches nothing (autograd's own cost) beside SDPA's fwd+bwd;
  - genoflash's fwd and fwd+bwd at the papers' short shapes, and at B8 H16 N2048 (the Gluon
    backward's smallest length), deterministic False and True.
Each row: the median over rounds of host microseconds per call (enqueue, no synchronize inside).

    python benchmarks/host_floor_probe.py --out X.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import genoflash
from genoflash.bench.records import run_metadata


def host_us(fn, iters: int = 200, rounds: int = 5) -> float:
    """Median over rounds of the host time per call (no synchronize inside a round)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - start) / iters * 1e6)
        torch.cuda.synchronize()
    return round(statistics.median(samples), 2)


@triton.jit
def _k1(X):
    tl.store(X + tl.program_id(0), 1.0)


@triton.jit
def _k60(X, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, c0, c1, c2, c3, c4,
         c5, c6, c7, c8, c9, d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, f0, f1,
         f2, f3, f4, f5, f6, f7, f8):
    tl.store(X + tl.program_id(0), 1.0)


@triton.jit
def _k_desc(X, d0, d1, d2, d3, n):
    # Reads one box of each descriptor, so that all four stay in the signature.
    t = d0.load([0, 0, 0, 0]) + d1.load([0, 0, 0, 0]) + d2.load([0, 0, 0, 0]) + d3.load([0, 0, 0, 0])
    tl.store(X + tl.program_id(0), tl.sum(t.to(tl.float32)))


def python_work():
    """A fixed piece of pure Python: attribute reads, dict lookups, tuple building, ~the kind of
    work genoflash's launch code does."""
    d = {"a": 1, "b": 2, "c": 3}
    acc = 0
    for i in range(300):
        acc += d["a"] + d.get("b", 0) + len((i, i + 1, i + 2))
    return acc


class _Nothing(torch.autograd.Function):
    """Launches nothing: forward returns a view, backward passes the gradient through."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


class _TimedWork(torch.autograd.Function):
    """Runs python_work inside the backward and records its time and thread."""
    times: list = []
    on_main: set = set()

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        start = time.perf_counter()
        python_work()
        _TimedWork.times.append(time.perf_counter() - start)
        _TimedWork.on_main.add(threading.get_ident() == threading.main_thread().ident)
        return g


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows: dict[str, float] = {}

    def row(name, fn, **kw):
        try:
            rows[name] = host_us(fn, **kw)
        except Exception as e:  # one failed row must not lose the others
            rows[name] = f"failed: {type(e).__name__}: {e}"[:300]
            print(f"{name:60s} {rows[name]}", flush=True)
            return
        print(f"{name:60s} {rows[name]:9.2f} us", flush=True)

    x = torch.empty(1024, device=dev)
    row("torch.empty (32, 512, 16, 128) bf16", lambda: torch.empty((32, 512, 16, 128), device=dev,
                                                                     dtype=torch.bfloat16))
    row("torch.empty_like of that", (lambda t: (lambda: torch.empty_like(t)))(
        torch.empty((32, 512, 16, 128), device=dev, dtype=torch.bfloat16)))
    row("torch.cuda.mem_get_info", lambda: torch.cuda.mem_get_info(dev))
    row("torch.cuda.current_stream", lambda: torch.cuda.current_stream())
    from triton.runtime import driver
    row("driver get_current_device + get_current_stream",
        lambda: driver.active.get_current_stream(driver.active.get_current_device()))

    # Triton launches: JIT binding, CompiledKernel[grid], the launcher alone.
    ints = list(range(1, 60))
    for name, kern, kargs in (("1 arg", _k1, [x]), ("60 args", _k60, [x, *ints])):
        compiled = kern[(1,)](*kargs)
        row(f"JITFunction.run, {name}", lambda: kern[(1,)](*kargs))
        row(f"CompiledKernel[grid](...), {name}", lambda: compiled[(1, 1, 1)](*kargs))
        stream = driver.active.get_current_stream(driver.active.get_current_device())
        run, fn, meta = compiled.run, compiled.function, compiled.packed_metadata
        row(f"CudaLauncher alone, {name}", lambda: run(1, 1, 1, stream, fn, meta, None, None, None, *kargs))
    t = torch.randn(2, 256, 4, 64, device=dev, dtype=torch.bfloat16)

    def descs():
        return [TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 64, 1, 64]) for _ in range(4)]
    ds = descs()
    compiled = _k_desc[(1,)](x, *ds, 1)
    row("4 TensorDescriptors built (checked constructor)", descs)
    row("CompiledKernel[grid](...), 4 descriptors (reused objects)", lambda: compiled[(1, 1, 1)](x, *ds, 1))
    row("CompiledKernel[grid](...), 4 descriptors (built per call)", lambda: compiled[(1, 1, 1)](x, *descs(), 1))

    # Python on the autograd device thread against this thread.
    row("python_work on the main thread", python_work)
    xg = torch.randn(16, device=dev, requires_grad=True)
    gg = torch.ones(16, device=dev)
    _TimedWork.times.clear()
    row("autograd.grad of a Function running python_work", lambda: torch.autograd.grad(_TimedWork.apply(xg), (xg,), gg))
    rows["python_work inside that backward (median)"] = round(statistics.median(_TimedWork.times) * 1e6, 2)
    print(f"{'python_work inside that backward (median)':60s} {rows['python_work inside that backward (median)']:9.2f}"
          f" us, on the main thread: {sorted(_TimedWork.on_main)}", flush=True)
    row("autograd.grad of a Function that launches nothing", lambda: torch.autograd.grad(_Nothing.apply(xg), (xg,), gg))
    row("_Nothing.apply alone (forward)", lambda: _Nothing.apply(xg))

    # Attention calls.
    import torch.nn.functional as F
    shapes = [(32, 512, 16, 128, False), (32, 512, 16, 128, True), (32, 512, 32, 64, True), (16, 1024, 16, 128, True),
              (8, 2048, 16, 128, True), (8, 2048, 16, 128, False)]
    for b, n, h, d, causal in shapes:
        q, k, v = (torch.randn(b, n, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.randn_like(q)
        qt, kt, vt = (u.detach().transpose(1, 2).requires_grad_() for u in (q, k, v))
        tag = f"B{b} N{n} H{h} hd{d}{' causal' if causal else ''}"
        with torch.no_grad():
            row(f"genoflash fwd, {tag}", lambda: genoflash.flash_attn_func(q, k, v, causal=causal), iters=100)
        for det in (False, True):
            row(f"genoflash fwd+bwd det={det}, {tag}", lambda: torch.autograd.grad(
                genoflash.flash_attn_func(q, k, v, causal=causal, deterministic=det), (q, k, v), dout), iters=100)

        def sdpa():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                torch.autograd.grad(F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), (qt, kt, vt),
                                    dout.transpose(1, 2))
        row(f"sdpa-flash fwd+bwd, {tag}", sdpa, iters=100)
    report = dict(run_metadata(), cpu=platform.processor() or platform.machine(), cores=os.cpu_count(),
                  method="median over 5 rounds of host microseconds per call (no synchronize inside a round)",
                  rows=rows)
    try:
        with open("/proc/cpuinfo") as f:
            report["cpu_model"] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                                       None)
    except OSError:
        pass
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
