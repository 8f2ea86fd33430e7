"""`genoflash bench memory`: peak GPU memory against sequence length, O(N) shown by measurement.

For each provider (genoflash, standard attention = the `reference` backend, SDPA's flash and
cuDNN backends) and each N = 1k, 2k, ... up to --max-seqlen, one forward and one
forward+backward run at B=1, H=8, D=128 in bf16; the peak is torch.cuda.max_memory_allocated
with the inputs (q, k, v and the upstream gradient) already allocated, so it counts them.
A provider stops at its first out-of-memory. Alongside, the floor: the bytes that the inputs,
the output, the three gradients and the LSE must occupy. genoflash's fwd+bwd peak is compared
with it (the bar: within 5%).

Writes <out>/<gpu>-<date>-memory.json and a log-log plot <same>.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import flash_attn_func, use_backend
from .common import (RESULTS_DIR, first_line, free_cached_memory, measure_once, pyplot, results_stem, run_metadata,
                     save_figure, title_stamp, write_json)

NHEADS, HEADDIM = 8, 128
CUDA = torch.device("cuda")


def floor_bytes(seqlen: int, mode: str) -> int:
    """What any exact attention must hold: q, k, v, dout (inputs), out, and for fwd+bwd dq, dk, dv;
    plus the fp32 LSE (one float per query row and head)."""
    tensor = seqlen * NHEADS * HEADDIM * 2
    tensors = 5 if mode == "fwd" else 8
    return tensors * tensor + seqlen * NHEADS * 4


def _providers():
    def genoflash(q, k, v):
        return flash_attn_func(q, k, v)

    def standard(q, k, v):
        with use_backend("reference"):
            return flash_attn_func(q, k, v)

    def sdpa(backend):
        def fn(q, k, v):
            from torch.nn.attention import sdpa_kernel
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
        return fn

    from torch.nn.attention import SDPBackend
    return {"genoflash": genoflash, "standard": standard, "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
            "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}


def peak_gib(fn, seqlen: int, mode: str) -> float | str:
    """Peak allocated GiB of one call (inputs included), or the reason it could not run."""
    free_cached_memory(CUDA)
    try:
        q, k, v, dout = (torch.randn(1, seqlen, NHEADS, HEADDIM, device=CUDA, dtype=torch.bfloat16,
                                     requires_grad=i < 3) for i in range(4))

        def call():
            out = fn(q, k, v)
            if mode == "fwd_bwd":
                torch.autograd.grad(out, (q, k, v), dout)
        return measure_once(call, CUDA).peak_gib
    except torch.cuda.OutOfMemoryError:
        return "out of memory"
    except RuntimeError as e:  # e.g. a backend with no kernel for this size
        return f"error: {first_line(e)[:120]}"
    finally:
        free_cached_memory(CUDA)


def _line(name: str, mode: str, n: int, peak) -> str:
    shown = f"{peak:10.4f} GiB" if isinstance(peak, float) else peak
    return f"{name:<12} {mode:<8} N={n:>9,}  {shown}"


def summarize(seqlens: list[int], results: dict) -> dict:
    floor = {mode: {n: floor_bytes(n, mode) / 2**30 for n in seqlens} for mode in ("fwd", "fwd_bwd")}
    ratios = {n: p / floor["fwd_bwd"][n] for n, p in results.get("genoflash", {}).get("fwd_bwd", {}).items()
              if isinstance(p, float)}
    return {"seqlens": seqlens, "results": results, "floor_gib": floor, "genoflash_fwd_bwd_over_floor": ratios}


def run(max_seqlen: int, providers: list[str], on_progress=None) -> dict:
    """Measure every provider; on_progress(report so far) after each point, so a run cut short
    by a time limit still leaves what it measured."""
    fns = _providers()
    seqlens = [1 << p for p in range(10, max_seqlen.bit_length()) if (1 << p) <= max_seqlen]
    results = {name: {"fwd": {}, "fwd_bwd": {}} for name in providers}
    for name in providers:
        for mode in ("fwd", "fwd_bwd"):
            for n in seqlens:
                peak = peak_gib(fns[name], n, mode)
                results[name][mode][n] = peak
                print(_line(name, mode, n, peak), flush=True)
                if on_progress is not None:
                    on_progress(summarize(seqlens, results))
                if not isinstance(peak, float):
                    break  # longer sequences will not fit either
    return summarize(seqlens, results)


def parse_log(text: str) -> dict:
    """The report of a run, rebuilt from the lines it printed (for a run stopped by a time limit
    before it wrote its JSON): points it did not reach are absent."""
    import re
    results: dict = {}
    seqlens: set[int] = set()
    pattern = re.compile(r"^(\S+)\s+(fwd_bwd|fwd)\s+N=\s*([\d,]+)\s+(.+?)\s*$")
    for line in text.splitlines():
        m = pattern.match(line)
        if not m:
            continue
        name, mode, n, value = m.group(1), m.group(2), int(m.group(3).replace(",", "")), m.group(4)
        peak = float(value.split()[0]) if value.endswith("GiB") else value
        results.setdefault(name, {"fwd": {}, "fwd_bwd": {}})[mode][n] = peak
        seqlens.add(n)
    report = summarize(sorted(seqlens), results)
    # A printed value is rounded to its last digit; a ratio to the floor means something only
    # where that rounding is under 0.5% of the floor.
    digits = {len(v.split()[0].split(".")[1]) for v in re.findall(r"\d+\.\d+ GiB", text)} or {4}
    resolution = 0.5 * 10.0 ** -min(digits)
    report["genoflash_fwd_bwd_over_floor"] = {n: r for n, r in report["genoflash_fwd_bwd_over_floor"].items()
                                              if resolution <= 0.005 * report["floor_gib"]["fwd_bwd"][n]}
    return report


def plot(report: dict, path: Path) -> None:
    fig, ax = pyplot().subplots(figsize=(7, 5))
    for i, (name, modes) in enumerate(report["results"].items()):
        for mode, style in (("fwd_bwd", "-"), ("fwd", "--")):
            points = [(int(n), p) for n, p in modes[mode].items() if isinstance(p, float)]
            if points:
                ax.plot(*zip(*points), style, marker="o", color=f"C{i}", label=f"{name} {mode.replace('_', '+')}")
    floor = report["floor_gib"]["fwd_bwd"]
    ax.plot([int(n) for n in floor], list(floor.values()), ":", color="black", label="floor fwd+bwd (I/O + LSE)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N (B=1, H=8, D=128, bf16)")
    ax.set_ylabel("peak GPU memory (GiB)")
    ax.set_title(f"peak memory on {title_stamp(report['metadata'])}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    save_figure(fig, path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="genoflash bench memory", description=__doc__.splitlines()[0])
    parser.add_argument("--max-seqlen", type=int, default=1 << 20)
    parser.add_argument("--providers", default="genoflash,standard,sdpa-flash,sdpa-cudnn")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("genoflash bench memory measures GPU memory and needs a CUDA GPU", flush=True)
        return 2
    providers = [p.strip() for p in args.providers.split(",")]
    unknown = set(providers) - set(_providers())
    if unknown:
        raise SystemExit(f"unknown provider(s): {', '.join(sorted(unknown))}")
    metadata = run_metadata(
        CUDA, method="torch.cuda.max_memory_allocated over one call, inputs (q, k, v, dout) included; bf16, B1 H8 D128")
    stem = results_stem(args.out, metadata, "memory")

    def save(report: dict) -> None:
        write_json(Path(f"{stem}.json"), {**report, "metadata": metadata})

    report = run(args.max_seqlen, providers, on_progress=save)
    report["metadata"] = metadata
    save(report)
    plot(report, Path(f"{stem}.png"))
    worst = max(report["genoflash_fwd_bwd_over_floor"].values(), default=float("nan"))
    print(f"genoflash fwd+bwd peak / floor: worst {worst:.3f} (bar: <= 1.05); wrote {stem}.json and .png", flush=True)
    return 0
