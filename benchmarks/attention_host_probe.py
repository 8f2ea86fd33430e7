"""Where genoflash's attention spends host time at short sequences (a research probe, GPU only).

The papers' sweep (2026-11-30) has genoflash behind FA2 at N = 512 in fwd+bwd while its kernels,
added up from torch.profiler, would put it ahead (B32 H16 N512 hd128: 0.84 ms of kernels, 1.25 ms
measured). This probe tells host-bound from device-bound:
  1. per call, the time the host takes to *enqueue* fwd, and fwd+bwd (no synchronize inside the
     loop), against the synchronised wall time per call, for genoflash and SDPA's flash backend;
  2. the same enqueue time for parts of the call: attention_forward / attention_backward called
     directly (no autograd), and torch.autograd.grad alone on a retained graph;
  3. cProfile of genoflash's fwd+bwd calls: the Python functions with the most own time;
  4. genoflash's fwd and fwd+bwd with launch.py's fast path off and on, alternating;
  5. without the profiler, the host time of one fwd+bwd split by layer, with timers around
     triton's layers: JITFunction.run (argument binding, specialisation, cache lookup), inside it
     the launcher's Python wrapper (argument list, TMA descriptors encoded per launch), inside
     that the descriptor encoding itself; the rest is genoflash's Python and autograd.

    python benchmarks/attention_host_probe.py --out /tmp/host.json [--batch 32 --nheads 16 --seqlen 512]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import time

import torch
import torch.nn.functional as F

import genoflash
from genoflash.bench.records import run_metadata


def per_call(fn, iters: int) -> dict:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    enqueued = time.perf_counter() - start
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return dict(enqueue_ms=enqueued / iters * 1e3, wall_ms=wall / iters * 1e3)


def host_split(fn, iters: int) -> dict:
    """Per call of fn, the host microseconds spent in triton's launch layers (nested: each
    includes the next), and the whole call."""
    from triton.backends.nvidia import driver as nv_driver
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    spent = {"JITFunction.run": 0.0, "launcher (wrapper + C)": 0.0, "TMA descriptor encoding": 0.0}
    calls = {key: 0 for key in spent}

    def timed(key, inner):
        def wrapper(*a, **kw):
            start = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                spent[key] += time.perf_counter() - start
                calls[key] += 1
        return wrapper

    utils = driver.active.utils
    saved = (JITFunction.run, nv_driver.CudaLauncher.__call__, utils.fill_tma_descriptor)
    JITFunction.run = timed("JITFunction.run", saved[0])
    nv_driver.CudaLauncher.__call__ = timed("launcher (wrapper + C)", saved[1])
    utils.fill_tma_descriptor = timed("TMA descriptor encoding", saved[2])
    try:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        for key in spent:
            spent[key], calls[key] = 0.0, 0
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        total = time.perf_counter() - start
        torch.cuda.synchronize()
    finally:
        JITFunction.run, nv_driver.CudaLauncher.__call__, utils.fill_tma_descriptor = saved
    split = {key: round(value / iters * 1e6, 1) for key, value in spent.items()}
    split.update({f"{key} calls": count / iters for key, count in calls.items()})
    split["whole call (timers on)"] = round(total / iters * 1e6, 1)
    return split


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--nheads", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args()
    b, h, n, d = args.batch, args.nheads, args.seqlen, args.headdim
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    doutt = dout.transpose(1, 2)

    def gf_fwd():
        with torch.no_grad():
            genoflash.flash_attn_func(q, k, v, causal=args.causal)

    def gf_fwd_bwd():
        torch.autograd.grad(genoflash.flash_attn_func(q, k, v, causal=args.causal), (q, k, v), dout)

    def sdpa(bwd):
        def run():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
                if bwd:
                    torch.autograd.grad(out, (qt, kt, vt), doutt)
        return run

    report = dict(run_metadata(), shape=dict(batch=b, nheads=h, seqlen=n, headdim=d, causal=args.causal), calls={})
    for name, fn in (("genoflash fwd", gf_fwd), ("genoflash fwd+bwd", gf_fwd_bwd),
                     ("sdpa-flash fwd", sdpa(False)), ("sdpa-flash fwd+bwd", sdpa(True))):
        report["calls"][name] = per_call(fn, args.iters)
        print(f"{name:20s} enqueue {report['calls'][name]['enqueue_ms']:.3f} ms/call, "
              f"wall {report['calls'][name]['wall_ms']:.3f} ms/call", flush=True)
    # launch.py's fast path (cached compiled kernels called directly) off and on, alternating
    # twice in this process, so that the host's drift shows beside the difference.
    for round_ in (1, 2):
        for fast in ("0", "1"):
            os.environ["GENOFLASH_FAST_LAUNCH"] = fast
            for name, fn in (("genoflash fwd", gf_fwd), ("genoflash fwd+bwd", gf_fwd_bwd)):
                label = f"{name}, fast launch {'on' if fast == '1' else 'off'} ({round_})"
                report["calls"][label] = per_call(fn, args.iters)
                print(f"{label:36s} enqueue {report['calls'][label]['enqueue_ms']:.3f} ms/call, "
                      f"wall {report['calls'][label]['wall_ms']:.3f} ms/call", flush=True)
    os.environ.pop("GENOFLASH_FAST_LAUNCH")
    from genoflash.ops.attention.args import AttentionArgs
    from genoflash.ops.attention.backward import attention_backward
    from genoflash.ops.attention.forward import attention_forward
    a = AttentionArgs(d ** -0.5, -1, 0 if args.causal else -1)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out, lse = attention_forward(qd, kd, vd, a)
    retained = genoflash.flash_attn_func(q, k, v, causal=args.causal)
    for name, fn in (("attention_forward", lambda: attention_forward(qd, kd, vd, a)),
                     ("attention_backward", lambda: attention_backward(dout, qd, kd, vd, out, lse, a)),
                     ("autograd.grad alone", lambda: torch.autograd.grad(retained, (q, k, v), dout, retain_graph=True)),
                     ("empty backward graph", lambda: torch.autograd.grad((q * 1.0).sum(), (q,)))):
        report["calls"][name] = per_call(fn, args.iters)
        print(f"{name:20s} enqueue {report['calls'][name]['enqueue_ms']:.3f} ms/call, "
              f"wall {report['calls'][name]['wall_ms']:.3f} ms/call", flush=True)
    # The backward under autograd runs on the engine's device thread: time attention_backward
    # there (wrapped), against the same call on this thread above.
    import threading
    from genoflash.ops.attention import interface
    inner, threads, original = [], set(), interface._backward

    def timed_backward(*a_, **kw):
        start = time.perf_counter()
        result = original(*a_, **kw)
        inner.append(time.perf_counter() - start)
        threads.add(threading.get_ident() == threading.main_thread().ident)
        return result
    interface._backward = timed_backward
    try:
        report["calls"]["autograd.grad, timed inside"] = per_call(
            lambda: torch.autograd.grad(retained, (q, k, v), dout, retain_graph=True), args.iters)
    finally:
        interface._backward = original
    report["calls"]["autograd.grad, timed inside"].update(
        inner_backward_ms=sorted(inner)[len(inner) // 2] * 1e3, on_main_thread=sorted(threads))
    print("autograd.grad, timed inside", report["calls"]["autograd.grad, timed inside"], flush=True)
    report["split"] = host_split(gf_fwd_bwd, args.iters)
    print("host split per fwd+bwd (us):", report["split"], flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.iters):
        gf_fwd_bwd()
    prof.disable()
    torch.cuda.synchronize()
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(args.top)
        report[f"cprofile_{key}"] = s.getvalue()
        print(s.getvalue())
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
