"""Where the host time of one genoflash fwd+bwd goes, layer by layer, on the GPU machine (a probe).

host_timeline_probe.py showed the calls host-bound at N <= 1,024 (the host takes 0.8-1.0 ms per
fwd+bwd, the GPU is busy 0.6 ms) and host_floor_probe.py that each mechanical part (allocation,
a launch, a descriptor) costs microseconds. This probe wraps every layer of the call in a
perf_counter timer (inclusive: a layer's time holds its callees') and runs fwd+bwd in a loop, so
that the host time per call splits into genoflash's validation, its autograd Function, the
forward and backward launch code, triton's launch layers, allocations and autograd's own work
(the rest of torch.autograd.grad). Each timer costs ~0.3 us per call, counted in the layer.

    python benchmarks/host_layers_probe.py --out X.json
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import threading
import time

import torch

import genoflash
from genoflash.bench.records import run_metadata
from genoflash.ops.attention import backward as bwd, backward_sm90 as sm90, forward as fwd, interface

spent = collections.defaultdict(float)
counts = collections.Counter()
threads = collections.defaultdict(set)
order: list[str] = []  # labels in the order they were installed: callers before callees


def timed(label, fn):
    if label not in order:
        order.append(label)
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        start = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            spent[label] += time.perf_counter() - start
            counts[label] += 1
            threads[label].add("main" if threading.current_thread() is threading.main_thread() else "other")
    return wrapper


def patch(obj, name, label, static=False):
    fn = getattr(obj, name)
    new = timed(label, fn)
    setattr(obj, name, staticmethod(new) if static else new)


def install(outer_only: bool = False) -> None:
    """Timers on every layer; with outer_only, only on those that leave launch plans usable
    (plans.py makes no plan while a function of the launch code is replaced)."""
    from triton.backends.nvidia import driver as nv_driver
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction
    from genoflash.ops.attention import plans
    patch(genoflash, "flash_attn_func", "flash_attn_func")
    patch(interface, "_check_qkv", "  _check_qkv")
    patch(interface, "_attention_args", "  _attention_args")
    patch(interface, "select_backend", "  select_backend")
    forward_fn, backward_fn = interface.FlashAttnFunc.forward, interface.FlashAttnFunc.backward
    interface.FlashAttnFunc.forward = staticmethod(timed("  FlashAttnFunc.forward", forward_fn))
    interface.FlashAttnFunc.backward = staticmethod(timed("FlashAttnFunc.backward (autograd's thread)", backward_fn))
    patch(plans._Plan, "run", "      plan replay")
    patch(nv_driver.CudaLauncher, "__call__", "          CudaLauncher.__call__")
    if torch.cuda.is_available():  # (the CPU dry run of this probe has no driver)
        patch(driver.active.utils, "fill_tma_descriptor", "            fill_tma_descriptor")
    patch(torch, "empty", "  torch.empty (Python callers)")
    patch(torch, "empty_like", "  torch.empty_like (Python callers)")
    if outer_only:
        return
    patch(fwd, "attention_forward", "    attention_forward")
    patch(bwd, "attention_backward", "  attention_backward")
    for mod, tag in ((fwd, "fwd"), (bwd, "bwd")):
        patch(mod, "launch", f"      launch() [{tag}]")
        patch(mod, "tile_descriptor", f"      tile_descriptor [{tag}]")
        patch(mod, "key_descriptors", f"      key_descriptors [{tag}]")
        patch(mod, "tma_applies", f"      tma_applies [{tag}]")
        patch(mod, "feature_args", f"      feature_args [{tag}]")
    patch(fwd, "forward_config", "      forward_config")
    patch(fwd, "forward_key_chunk", "      forward_key_chunk")
    patch(bwd, "backward_config", "      backward_config")
    patch(sm90, "applies", "    backward_sm90.applies")
    patch(sm90, "attention_backward_sm90", "    attention_backward_sm90")
    patch(sm90, "free_memory_bytes", "      free_memory_bytes (sm90)")
    patch(sm90, "_tile_descriptor", "      gluon _tile_descriptor")
    patch(JITFunction, "run", "        JITFunction.run (binding; gluon too)")
    original_getitem = CompiledKernel.__getitem__

    def getitem(self, grid):
        return timed("        CompiledKernel runner (fast launch)", original_getitem(self, grid))
    CompiledKernel.__getitem__ = getitem
    patch(torch, "zeros", "  torch.zeros (Python callers)")


def run(label, fn, iters) -> dict:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    spent.clear()
    counts.clear()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    total = time.perf_counter() - start
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    rows = {k: dict(us=round(v / iters * 1e6, 1), calls=counts[k] / iters, threads=sorted(threads[k]))
            for k, v in sorted(spent.items(), key=lambda kv: order.index(kv[0]))}
    print(f"== {label}: host {total / iters * 1e6:.1f} us per call, wall {wall / iters * 1e6:.1f}", flush=True)
    for k, r in rows.items():
        print(f"   {k:58s} {r['us']:8.1f} us  x{r['calls']:.0f}  {','.join(r['threads'])}", flush=True)
    return dict(host_us=round(total / iters * 1e6, 1), wall_us=round(wall / iters * 1e6, 1), layers=rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--outer-only", action="store_true",
                    help="timers only where launch plans stay usable (the calls as users make them)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    report = dict(run_metadata(), method=__doc__.split("\n\n")[1], outer_only=args.outer_only, runs={})
    install(args.outer_only)
    for b, n, h, d, causal, det in ((32, 512, 16, 128, True, True), (32, 512, 32, 64, True, True),
                                    (8, 2048, 16, 128, False, False), (8, 2048, 16, 128, False, True)):
        q, k, v = (torch.randn(b, n, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.randn_like(q)
        tag = f"B{b} N{n} H{h} hd{d}{' causal' if causal else ''} det={det}"

        def fwd_bwd():
            torch.autograd.grad(genoflash.flash_attn_func(q, k, v, causal=causal, deterministic=det), (q, k, v), dout)

        def fwd_only():
            with torch.no_grad():
                genoflash.flash_attn_func(q, k, v, causal=causal, deterministic=det)
        report["runs"][f"fwd+bwd {tag}"] = run(f"fwd+bwd {tag}", fwd_bwd, args.iters)
        report["runs"][f"fwd {tag}"] = run(f"fwd {tag}", fwd_only, args.iters)
        a = interface._attention_args(q, [n], [n], 0.0, None, causal, (-1, -1), 0.0, None, None, None, False, None,
                                      0, det)
        qd, kd, vd = (t.detach() for t in (q, k, v))
        out, lse = fwd.attention_forward(qd, kd, vd, a)
        report["runs"][f"attention_backward direct (main thread) {tag}"] = run(
            f"attention_backward direct (main thread) {tag}",
            lambda: bwd.attention_backward(dout, qd, kd, vd, out, lse, a), args.iters)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
