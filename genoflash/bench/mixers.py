"""`genoflash bench mixers`: attention, Hyena and Mamba side by side, one layer at a time.

For each mixer (genoflash MultiHeadAttention, causal, RoPE off so only the mixing is timed;
the Hyena operator, order 2; the Mamba block, d_state 16) at d_model 256 and 1024, and
N = 1k, 2k, ... up to --max-seqlen: one layer's forward+backward in bf16 at batch 1, median
time (`triton.testing.do_bench`; a call over a second is timed once, after its warm-up call)
and peak memory (inputs included). A mixer stops at its first out-of-memory, or once one
call passes --max-seconds. Then, per d_model, where the curves cross: the N from which
Hyena / Mamba are faster than attention, and the time ratio at the longest N all three ran.

Writes <out>/<gpu>-<date>-mixers.json (saved after every point) and a plot of time and
memory against N. `--cpu` runs tiny sizes on the CPU (timed with perf_counter) to check the
code paths.

On the GPU it first times the Mamba scan core alone (genoflash's selective scan, Mamba-1's S6)
and, beside it at the same N, its peer: Mamba-2's SSD kernels (`mamba_chunk_scan_combined`
from mamba_ssm's Triton source, 8 heads x 64, d_state 128, chunk 256: Mamba-2's defaults at
d_model 256). They are for measurement only, never part of genoflash: `tools/device_carry.sh`
unpacks the source into `.peers/` (git-ignored) and `tools/device_env.sh` puts it on the path.
Without it the report says why the peer is missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from .common import (RESULTS_DIR, free_cached_memory, median_ms, pyplot, results_stem, run_metadata, save_figure,
                     synchronize, time_and_peak, timed_call, title_stamp, write_json)

MIXERS = ("attention", "hyena", "mamba")
# A shorter do_bench window than the kernel benches' (5 ms of warm-up, 50 ms of repeats): the
# sweep has many points, each a whole layer's forward+backward. A call of over a second is timed
# once: repeats would add nothing but minutes.
WARMUP_MS, REP_MS, TIME_ONCE_ABOVE_MS = 5, 50, 1000


def build(mixer: str, d_model: int, l_max: int, device, dtype) -> torch.nn.Module:
    from ..layers import HyenaOperator, Mamba, MultiHeadAttention
    if mixer == "attention":
        layer = MultiHeadAttention(d_model, max(1, d_model // 128), causal=True, rotary=False)
    elif mixer == "hyena":
        layer = HyenaOperator(d_model, l_max, order=2, causal=True)
    else:
        layer = Mamba(d_model, d_state=16)
    return layer.to(device, dtype)


def _median_ms(fn, device) -> float:
    return median_ms(fn, device, warmup_ms=WARMUP_MS, rep_ms=REP_MS)


def _time_and_peak(step, device) -> dict:
    """{"ms", "peak_gib"} of step() (one forward+backward), as common.time_and_peak measures it."""
    return time_and_peak(step, device, warmup_ms=WARMUP_MS, rep_ms=REP_MS, time_once_above_ms=TIME_ONCE_ABOVE_MS)


class LayerStep(NamedTuple):
    """One layer's forward+backward as timed here: `step()` runs it at batch 1 on the random input
    x with the upstream gradient dy, taking gradients of `params` (x and every parameter)."""
    layer: torch.nn.Module
    x: torch.Tensor
    dy: torch.Tensor
    params: list
    step: Callable[[], None]


def layer_step(mixer: str, d_model: int, seqlen: int, device, dtype) -> LayerStep:
    layer = build(mixer, d_model, seqlen, device, dtype)
    x = torch.randn(1, seqlen, d_model, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn_like(x)
    params = [x, *layer.parameters()]

    def step():
        torch.autograd.grad(layer(x), params, dy)

    return LayerStep(layer, x, dy, params, step)


def measure(mixer: str, d_model: int, seqlen: int, device, dtype) -> dict:
    """{"ms", "peak_gib"} of one layer's forward+backward, or {"error"}."""
    try:
        return _time_and_peak(layer_step(mixer, d_model, seqlen, device, dtype).step, device)
    except torch.cuda.OutOfMemoryError:
        return {"error": "out of memory"}
    finally:
        free_cached_memory(device)


def copy_bandwidth_gbps(device, gib: float = 2.0) -> float:
    """HBM bandwidth as a device-to-device copy sees it (bytes read + written per second)."""
    x = torch.empty(int(gib * 2**30) // 4, device=device, dtype=torch.float32)
    y = torch.empty_like(x)
    ms = _median_ms(lambda: y.copy_(x), device)
    return 2 * x.numel() * 4 / (ms * 1e-3) / 1e9


def scan_bandwidth(seqlen: int, d_inner: int, dstate: int, device, dtype=torch.bfloat16,
                   channels_first: bool = False) -> dict:
    """The Mamba scan's kernels alone, forward and backward, at batch 1, as the Mamba layer calls
    them: u, delta, z, B, C in `dtype`, A, D and delta_bias float32, with the softplus, the skip
    and the gate (all inside the kernels). GB/s count the bytes the scan must move: forward reads
    u, delta, z, B, C and writes out; backward reads dout, u, delta, z, B, C and writes du,
    ddelta, dz (in `dtype`) and dB, dC (float32). The kernels' real traffic is larger (they read
    their inputs twice or three times, and pass chunk states through HBM).

    fwd_ms is the forward as training runs it (with the chunk states for the backward;
    `fwd_inference_ms` without them). The backward is timed both ways: deterministic (the
    default) and with atomic dB/dC (`deterministic=False`). channels_first: u, delta, z and dout
    as (batch, dim, seqlen) memory and the backward's state-loop kernels
    (backward_channels_first.py); else (token, channel) rows and backward.py's 3-D tiles."""
    from ..ops.mamba import backward, backward_channels_first, forward
    kernels = backward_channels_first if channels_first else backward
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (1, d_inner, seqlen) if channels_first else (1, seqlen, d_inner)

    def act(scale: float = 1.0) -> torch.Tensor:  # a (1, seqlen, d_inner) activation in the chosen layout
        t = (torch.randn(shape, device=device, generator=gen) * scale).to(dtype)
        return t.transpose(1, 2) if channels_first else t

    u, z, delta = act(), act(), act(0.5)
    A = -torch.rand(d_inner, dstate, device=device, generator=gen) - 0.5
    B, C = (torch.randn(1, seqlen, dstate, device=device, generator=gen).to(dtype) for _ in range(2))
    D = torch.ones(d_inner, device=device)
    bias = torch.rand(d_inner, device=device, generator=gen) - 4.0
    extras = dict(D=D, z=z, delta_bias=bias, softplus=True)

    def scan_forward(**kw):
        return forward.scan_forward(u, delta, A, B, C, **extras, **kw)
    out, h0, decay = scan_forward()
    dout = act()
    fwd_ms = _median_ms(scan_forward, device)
    fwd_inference_ms = _median_ms(lambda: scan_forward(save_chunks=False), device)
    bwd_ms = _median_ms(lambda: kernels.scan_backward(dout, u, delta, A, B, C, h0, decay, **extras), device)
    bwd_atomic_ms = _median_ms(lambda: kernels.scan_backward(dout, u, delta, A, B, C, h0, decay,
                                                             deterministic=False, **extras), device)
    ld, ln, e = seqlen * d_inner, seqlen * dstate, u.element_size()
    fwd_bytes = e * (4 * ld + 2 * ln)
    bwd_bytes = e * (7 * ld + 2 * ln) + 2 * 4 * ln
    return {"seqlen": seqlen, "d_inner": d_inner, "dstate": dstate, "dtype": str(dtype),
            "kernels": "channels-first state loop" if channels_first else "3-D tiles", "fwd_ms": fwd_ms,
            "fwd_inference_ms": fwd_inference_ms, "bwd_ms": bwd_ms, "fwd_gbps": fwd_bytes / (fwd_ms * 1e-3) / 1e9,
            "fwd_inference_gbps": fwd_bytes / (fwd_inference_ms * 1e-3) / 1e9,
            "bwd_gbps": bwd_bytes / (bwd_ms * 1e-3) / 1e9,
            "bwd_atomic_ms": bwd_atomic_ms, "bwd_atomic_gbps": bwd_bytes / (bwd_atomic_ms * 1e-3) / 1e9,
            "fwd_bytes": fwd_bytes, "bwd_bytes": bwd_bytes}


def ssd_peer_core(seqlen: int, device, nheads: int = 8, headdim: int = 64, dstate: int = 128,
                  chunk: int = 256) -> dict:
    """Mamba-2's SSD scan (mamba_ssm's Triton kernels), forward+backward at batch 1: x bf16
    (1, N, nheads, headdim), dt and A float32, B and C bf16 (1, N, 1, dstate), D float32. The
    default sizes are Mamba-2's at d_model 256. {"unavailable": why} without mamba_ssm."""
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as e:  # noqa: BLE001 - not installed, or its import fails on this machine
        return {"unavailable": f"{type(e).__name__}: {e}"[:200]}
    gen = torch.Generator(device=device).manual_seed(0)
    bf16 = torch.bfloat16 if device.type == "cuda" else torch.float32
    x = torch.randn(1, seqlen, nheads, headdim, device=device, generator=gen).to(bf16).requires_grad_()
    dt = (torch.rand(1, seqlen, nheads, device=device, generator=gen) * 0.1 + 0.001).requires_grad_()
    A = (-torch.rand(nheads, device=device, generator=gen) - 0.5).requires_grad_()
    B, C = (torch.randn(1, seqlen, 1, dstate, device=device, generator=gen).to(bf16).requires_grad_()
            for _ in range(2))
    D = torch.randn(nheads, device=device, generator=gen).requires_grad_()
    dy = torch.randn(1, seqlen, nheads, headdim, device=device, generator=gen).to(bf16)

    def step():
        y = mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=chunk, D=D)
        torch.autograd.grad(y, [x, dt, A, B, C, D], dy)

    try:
        timed = _time_and_peak(step, device)
    except torch.cuda.OutOfMemoryError:
        return {"error": "out of memory"}
    return {"seqlen": seqlen, "nheads": nheads, "headdim": headdim, "dstate": dstate, "chunk": chunk,
            "fwd_bwd_ms": timed.pop("ms"), **timed}


def genoflash_scan_core(seqlen: int, d_inner: int, dstate: int, device) -> dict:
    """genoflash's selective scan (`selective_scan_fn`, with the skip D) forward+backward through
    autograd, at the dtypes the Mamba layer hands it (u, delta, B, C bf16 on the GPU; A and D
    float32) and in its layout: u and delta channels-first ((batch, dim, seqlen) memory, the
    backward's state-loop kernels of backward_channels_first.py). Time and peak memory, to stand
    beside ssd_peer_core (no gate z there either)."""
    from ..ops.mamba import selective_scan_fn
    gen = torch.Generator(device=device).manual_seed(0)
    bf16 = torch.bfloat16 if device.type == "cuda" else torch.float32
    channels_first = True

    def act(draw=torch.randn, scale: float = 1.0) -> torch.Tensor:  # (1, seqlen, d_inner), the block's layout
        shape = (1, d_inner, seqlen) if channels_first else (1, seqlen, d_inner)
        t = (draw(shape, device=device, generator=gen) * scale).to(bf16)
        return (t.transpose(1, 2) if channels_first else t).requires_grad_()

    u, delta = act(), act(torch.rand, 0.1)
    A = (-torch.rand(d_inner, dstate, device=device, generator=gen) - 0.5).requires_grad_()
    B, C = (torch.randn(1, seqlen, dstate, device=device, generator=gen).to(bf16).requires_grad_()
            for _ in range(2))
    D = torch.randn(d_inner, device=device, generator=gen).requires_grad_()
    dy = act().detach()

    def step():
        y = selective_scan_fn(u, delta, A, B, C, D)
        torch.autograd.grad(y, [u, delta, A, B, C, D], dy)

    timed = _time_and_peak(step, device)
    return {"seqlen": seqlen, "d_inner": d_inner, "dstate": dstate, "fwd_bwd_ms": timed.pop("ms"), **timed}


def kernel_breakdown(mixer: str, d_model: int, seqlen: int, device, dtype, top: int = 12) -> dict:
    """Where one layer's forward+backward spends its GPU time: torch.profiler's CUDA kernel
    times for one call (after a warm-up call), largest first, in ms; and beside their total the
    call's wall time outside the profiler (median of 5, synchronised). A wall time well above the
    kernels' total means the GPU waits on the host (launches, Python), as Hyena's flat 1k-32k
    times suggest; kernels adding up to it mean the kernels themselves are the cost."""
    from torch.profiler import ProfilerActivity, profile
    step = layer_step(mixer, d_model, seqlen, device, dtype).step
    cuda = device.type == "cuda"
    step()
    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        step()
        synchronize(device)
    rows = []
    for event in prof.key_averages():
        ms = (event.self_device_time_total if cuda else event.self_cpu_time_total) / 1e3
        if ms > 0:
            rows.append({"kernel": event.key[:120], "calls": event.count, "ms": ms})
    rows.sort(key=lambda r: -r["ms"])
    wall_ms = statistics.median(timed_call(step, device)[1] * 1e3 for _ in range(5))
    return {"mixer": mixer, "d_model": d_model, "seqlen": seqlen, "wall_ms": wall_ms,
            "total_kernel_ms": sum(r["ms"] for r in rows), "top": rows[:top]}


def crossovers(results: dict) -> dict:
    """Per d_model: the smallest N from which each other mixer beats attention (and stays
    ahead), and the time ratios attention / mixer at the longest N that every mixer ran."""
    summary = {}
    for d_model, by_mixer in results.items():
        attention = {int(n): r["ms"] for n, r in by_mixer.get("attention", {}).items() if "ms" in r}
        entry = {}
        for mixer in MIXERS[1:]:
            times = {int(n): r["ms"] for n, r in by_mixer.get(mixer, {}).items() if "ms" in r}
            common = sorted(set(times) & set(attention))
            faster = [n for n in common if times[n] < attention[n]]
            from_n = next((n for n in common if all(times[m] < attention[m] for m in common if m >= n)), None)
            entry[mixer] = {"faster_than_attention_from_n": from_n, "faster_at": faster,
                            "attention_over_mixer_at_longest_common_n":
                                (common[-1], attention[common[-1]] / times[common[-1]]) if common else None}
        summary[d_model] = entry
    return summary


def plot(report: dict, path: Path) -> None:
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.5))
    styles = {"256": "-", "1024": "--"}
    for i, mixer in enumerate(MIXERS):
        for d_model, by_mixer in report["results"].items():
            points = sorted((int(n), r) for n, r in by_mixer.get(mixer, {}).items() if "ms" in r)
            if not points:
                continue
            n = [p[0] for p in points]
            label = f"{mixer} d={d_model}"
            axes[0].plot(n, [p[1]["ms"] for p in points], styles.get(d_model, ":"), marker="o", color=f"C{i}",
                         label=label)
            if points[0][1]["peak_gib"] is not None:
                axes[1].plot(n, [p[1]["peak_gib"] for p in points], styles.get(d_model, ":"), marker="o",
                             color=f"C{i}", label=label)
    for ax, ylabel in zip(axes, ("fwd+bwd time (ms)", "peak memory (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N (batch 1)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"one layer, attention vs Hyena vs Mamba on {title_stamp(report['metadata'])}", fontsize=10)
    save_figure(fig, path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="genoflash bench mixers", description=__doc__.splitlines()[0])
    parser.add_argument("--d-models", default="256,1024")
    parser.add_argument("--mixers", default=",".join(MIXERS))
    parser.add_argument("--max-seqlen", type=int, default=1 << 20)
    parser.add_argument("--max-seconds", type=float, default=20.0, help="stop a mixer once one call takes longer")
    parser.add_argument("--scan-seqlens", default="65536,262144,1048576",
                        help="GPU: also time the Mamba scan core alone at these N (d_inner 512 and 2048), "
                             "in GB/s against a copy's; '' to skip")
    parser.add_argument("--ssd-seqlens", default=None,
                        help="also time the scan core beside Mamba-2's SSD kernels (mamba_ssm, if importable) "
                             "at these N; default: the --scan-seqlens on a GPU, none with --cpu; '' to skip")
    parser.add_argument("--profile-seqlen", type=int, default=0,
                        help="GPU: also record each Hyena and Mamba layer's kernel times at this N (torch.profiler)")
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU, to check the code paths")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("genoflash bench mixers needs a CUDA GPU (or --cpu for a tiny run)", flush=True)
        return 2
    return _run(args, torch.device("cpu" if args.cpu else "cuda"))


def _run(args, device: torch.device) -> int:
    if args.ssd_seqlens is None:
        args.ssd_seqlens = "" if args.cpu else args.scan_seqlens
    dtype = torch.float32 if args.cpu else torch.bfloat16
    mixers = [m.strip() for m in args.mixers.split(",") if m.strip()]  # '' skips the sweep
    unknown = set(mixers) - set(MIXERS)
    if unknown:
        raise SystemExit(f"unknown mixer(s): {', '.join(sorted(unknown))}")
    seqlens = [1 << p for p in range(10, args.max_seqlen.bit_length()) if (1 << p) <= args.max_seqlen]
    if args.cpu:
        seqlens = [n for n in (64, 128) if n <= args.max_seqlen] or [args.max_seqlen]
    metadata = run_metadata(device, dtype=str(dtype),
                            method="one layer fwd+bwd at batch 1; median of do_bench (GPU) or of 3 perf_counter "
                                   "runs (CPU); peak = max_memory_allocated",
                            mamba_scan="channels-first state loop")
    stem = results_stem(args.out, metadata, "mixers")
    report = {"metadata": metadata, "results": {}}

    def save():
        report["crossovers"] = crossovers(report["results"])
        write_json(Path(f"{stem}.json"), report)

    from ..backends import use_backend
    backend = "torch" if args.cpu else "triton"
    if not args.cpu and args.scan_seqlens:
        copy = copy_bandwidth_gbps(device)
        report["scan"] = {"copy_gbps": copy, "points": []}
        for d_inner in (512, 2048):
            for n in (int(x) for x in args.scan_seqlens.split(",")):
                point = scan_bandwidth(n, d_inner, 16, device, channels_first=True)
                point.update(fwd_of_copy=point["fwd_gbps"] / copy, bwd_of_copy=point["bwd_gbps"] / copy)
                report["scan"]["points"].append(point)
                point.update(fwd_inference_of_copy=point["fwd_inference_gbps"] / copy)
                print(f"scan d_inner={d_inner} N={n:>9,}  fwd {point['fwd_ms']:.3f} ms {point['fwd_gbps']:.0f} GB/s "
                      f"({point['fwd_of_copy']:.0%} of copy; without chunk states {point['fwd_inference_ms']:.3f} ms "
                      f"{point['fwd_inference_of_copy']:.0%})  "
                      f"bwd {point['bwd_ms']:.3f} ms {point['bwd_gbps']:.0f} GB/s ({point['bwd_of_copy']:.0%}); "
                      f"atomic bwd {point['bwd_atomic_ms']:.3f} ms", flush=True)
                save()
    if args.ssd_seqlens:
        # Side by side with Mamba-2's SSD kernels, the scan's peer (measurement only).
        report["scan_vs_ssd"] = []
        for n in (int(x) for x in args.ssd_seqlens.split(",")):
            with use_backend(backend):
                ours = genoflash_scan_core(n, 512, 16, device)
            peer = ssd_peer_core(n, device)
            report["scan_vs_ssd"].append({"seqlen": n, "genoflash_selective_scan": ours, "mamba2_ssd": peer})
            theirs = (f"{peer['fwd_bwd_ms']:.2f} ms" + (f" {peer['peak_gib']:.2f} GiB" if peer["peak_gib"] else "")
                      if "fwd_bwd_ms" in peer else peer.get("unavailable") or peer.get("error"))
            print(f"scan core fwd+bwd N={n:>9,}: genoflash S6 (d_inner 512, d_state 16) {ours['fwd_bwd_ms']:.2f} ms"
                  + (f" {ours['peak_gib']:.2f} GiB" if ours["peak_gib"] else "")
                  + f"; Mamba-2 SSD (8 x 64, d_state 128) {theirs}", flush=True)
            save()
    if not args.cpu and args.profile_seqlen:
        report["kernel_breakdown"] = []
        for mixer in ("hyena", "mamba"):
            for d_model in (int(d) for d in args.d_models.split(",")):
                with use_backend(backend):
                    entry = kernel_breakdown(mixer, d_model, args.profile_seqlen, device, dtype)
                report["kernel_breakdown"].append(entry)
                print(f"{mixer} d={d_model} N={args.profile_seqlen:,}: {entry['wall_ms']:.1f} ms wall, "
                      f"{entry['total_kernel_ms']:.1f} ms in kernels; "
                      + "; ".join(f"{r['kernel'][:60]} {r['ms']:.1f} ms x{r['calls']}" for r in entry["top"][:6]),
                      flush=True)
                save()
    with use_backend(backend):
        for d_model in (int(d) for d in args.d_models.split(",")):
            for mixer in mixers:
                for n in seqlens:
                    rec = measure(mixer, d_model, n, device, dtype)
                    report["results"].setdefault(str(d_model), {}).setdefault(mixer, {})[str(n)] = rec
                    shown = f"{rec['ms']:10.2f} ms" + (f" {rec['peak_gib']:8.2f} GiB" if rec.get("peak_gib") else "") \
                        if "ms" in rec else rec["error"]
                    print(f"d={d_model:<5} {mixer:<10} N={n:>9,}  {shown}", flush=True)
                    save()
                    if "ms" not in rec or rec["ms"] > 1e3 * args.max_seconds:
                        break
    if report["results"]:
        plot(report, Path(f"{stem}.png"))
    print(json.dumps(report["crossovers"], indent=1), flush=True)
    print(f"wrote {stem}.json and .png", flush=True)
    return 0
