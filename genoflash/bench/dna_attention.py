"""`genoflash example`: exact attention over a DNA-length sequence, genoflash vs standard.

Each nucleotide is one token (A, C, G, T, N -> 0..4); a seeded random embedding and three
random projections turn the tokens into q, k, v of shape (1, N, nheads, headdim), so nothing
is downloaded. Forward + backward then runs with genoflash (the device's default backend:
Triton kernels on CUDA, the tiled `torch` backend on the CPU) and with standard attention
(the `reference` backend, which materialises the N x N score matrix).

Peak memory is the growth caused by one forward + backward (inputs not counted):
* CUDA: torch.cuda.max_memory_allocated() after reset_peak_memory_stats(), minus the memory
  allocated just before the call.
* CPU: torch's allocations are invisible to tracemalloc, so each (method, length) runs in a
  fresh 'spawn' child process that reports its peak RSS minus its RSS just before the call
  (/proc/self/statm). The peak is /proc's VmHWM, reset just before the call, not getrusage's
  ru_maxrss (Linux carries that over from the parent across exec; it remains the fallback
  without /proc). The child fixes glibc's mmap threshold so freed tensors leave RSS at once.
Times are the median of --repeats runs in this process, with the default allocator.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import random
import resource
import statistics
import sys
from concurrent.futures.process import BrokenProcessPool

import torch

from ..backends import select_backend, use_backend
from ..ops.attention import flash_attn_func
from .common import measure_once, synchronize, timed_call

VOCAB = "ACGTN"
MiB, GiB = 2**20, 2**30
# Lengths run by both methods, and by genoflash only. The CPU ones keep the whole run well
# under 2 minutes on 2 cores; on a GPU, standard attention is skipped where it cannot fit.
DEFAULT_LENGTHS = {"cpu": ([1024, 2048, 4096], [8192]), "cuda": ([16384, 32768, 65536, 131072], [])}
# Standard attention's peak holds about this many fp32 N x N matrices (scores, probabilities
# and their gradients; measured on the CPU and an H200): used to skip runs that cannot fit.
STANDARD_NXN_COPIES = 5


def read_fasta(path: str) -> tuple[str, str]:
    """(header, sequence) of the first record, upper-cased; other IUPAC letters become N."""
    header, chunks = None, []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith(">"):
                if header is not None:
                    break  # only the first record
                header = line[1:]
            elif line:
                chunks.append(line.upper())
    seq = "".join(c if c in VOCAB else "N" for c in "".join(chunks) if c.isalpha())
    if not seq:
        raise ValueError(f"{path}: no sequence found")
    return header or os.path.basename(path), seq


def make_qkv(seq: str, nheads: int, headdim: int, device: torch.device, dtype: torch.dtype):
    """Tokens -> seeded random embedding -> three random projections -> q, k, v."""
    tokens = torch.tensor([VOCAB.index(c) for c in seq])
    torch.manual_seed(0)  # same weights in every process, so every run sees the same q, k, v
    dim = nheads * headdim
    embed = torch.nn.Embedding(len(VOCAB), dim)
    projections = [torch.nn.Linear(dim, dim, bias=False) for _ in range(3)]
    with torch.no_grad():
        x = embed(tokens)
        qkv = [p(x).view(1, len(seq), nheads, headdim) for p in projections]
    return [t.to(device, dtype).requires_grad_() for t in qkv]


def forward_backward(q, k, v, backend: str | None) -> torch.Tensor:
    with use_backend(backend) if backend else contextlib.nullcontext():
        out = flash_attn_func(q, k, v)
        # mean(out^2): a cheap scalar whose gradient reaches every output element.
        torch.autograd.grad(out.float().square().mean(), (q, k, v))
    return out.detach()


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # no /proc (macOS): count only the growth above the peak so far
        return _peak_rss_bytes()


def _peak_rss_bytes() -> int:
    with contextlib.suppress(OSError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def peak_memory_mib(task: dict) -> float:
    """Peak memory growth of one forward + backward; on the CPU, run it in a fresh process."""
    device = torch.device(task["device"])
    q, k, v = make_qkv(task["seq"], task["nheads"], task["headdim"], device, task["dtype"])
    if device.type == "cuda":
        synchronize(device)
        base = torch.cuda.memory_allocated(device)
        peak_gib = measure_once(lambda: forward_backward(q, k, v, task["backend"]), device).peak_gib
        return (peak_gib * GiB - base) / MiB
    # Linux >= 4.0: "5" resets VmHWM to the current RSS, so start-up does not count.
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _rss_bytes()
    forward_backward(q, k, v, task["backend"])
    return (_peak_rss_bytes() - base) / MiB


def peak_memory_in_child(task: dict) -> float:
    # A fixed mmap threshold sends every large freed tensor straight back to the OS, so RSS
    # follows live tensors rather than glibc's caches (whose size varies from run to run).
    # glibc reads it at process start-up, so it is set only around the child's launch.
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    try:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            return pool.submit(peak_memory_mib, task).result()
    finally:
        if saved is None:
            del os.environ["MALLOC_MMAP_THRESHOLD_"]
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved


def time_forward_backward(task: dict, repeats: int) -> tuple[float, torch.Tensor]:
    """Median wall time of forward + backward, and the output (for the equality check)."""
    device = torch.device(task["device"])
    q, k, v = make_qkv(task["seq"], task["nheads"], task["headdim"], device, task["dtype"])
    if device.type == "cuda":
        forward_backward(q, k, v, task["backend"])  # warm-up: Triton compiles on first call
    times, out = [], None
    for _ in range(repeats):
        out = None  # free the previous output before the next run
        out, seconds = timed_call(lambda: forward_backward(q, k, v, task["backend"]), device)
        times.append(seconds)
    return statistics.median(times), out


def run_point(task: dict, repeats: int) -> tuple[dict, torch.Tensor | None]:
    """Peak memory, then time, of one (method, length)."""
    on_gpu = task["device"].startswith("cuda")
    try:
        peak = peak_memory_mib(task) if on_gpu else peak_memory_in_child(task)
        seconds, out = time_forward_backward(task, repeats)
    except (torch.cuda.OutOfMemoryError, BrokenProcessPool) as e:
        if on_gpu:
            torch.cuda.empty_cache()
        return {"skipped": f"failed ({type(e).__name__}; out of memory?)"}, None
    return {"time_s": seconds, "peak_mib": peak}, out


def standard_bytes(n: int, nheads: int) -> int:
    return STANDARD_NXN_COPIES * nheads * n * n * 4


def available_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="genoflash example", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", "--length", type=int, nargs="+",
                   help="lengths run by both methods (default: see DEFAULT_LENGTHS)")
    p.add_argument("--long", type=int, nargs="*", help="lengths run by genoflash only")
    p.add_argument("--nheads", type=int, default=4)
    p.add_argument("--headdim", type=int, default=64)
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    p.add_argument("--fasta", help="use the first record of this FASTA file instead of random DNA")
    p.add_argument("--repeats", type=int, help="timed runs per point; the median is shown (CPU 1, GPU 3)")
    p.add_argument("--json", help="also write the results to this JSON file")
    return p.parse_args(argv)


def summarize(rows: list[dict], diffs: dict[int, float], nheads: int) -> None:
    if diffs:
        pairs = ", ".join(f"N={n:,}: {d:.2e}" for n, d in diffs.items())
        print(f"\nmax |genoflash - standard| of outputs: {pairs}")
    peaks = {(r["method"], r["n"]): r["peak_mib"] for r in rows if "peak_mib" in r}
    both = [n for _, n in peaks if ("genoflash", n) in peaks and ("standard", n) in peaks]
    if both:
        n = max(both)
        std, gf = peaks[("standard", n)], peaks[("genoflash", n)]
        # At small N genoflash's fixed-size score tiles are about as big as the whole N x N matrix.
        ratio = f"{std / gf:.1f}x less" if std > 1.1 * gf else "about the same at this small N"
        print(f"at N={n:,} standard attention used {std:,.0f} MiB, genoflash {gf:,.0f} MiB ({ratio})")
    alone = [n for m, n in peaks if m == "genoflash" and ("standard", n) not in peaks]
    if alone:
        n = max(alone)
        print(f"genoflash also ran N={n:,} in {peaks[('genoflash', n)]:,.0f} MiB, where standard attention "
              f"would need ~{standard_bytes(n, nheads) / GiB:.1f} GiB")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    shared, long = DEFAULT_LENGTHS["cuda" if device.type == "cuda" else "cpu"]
    if args.lengths:
        shared, long = args.lengths, []
    long = long if args.long is None else args.long
    repeats = args.repeats or (3 if device.type == "cuda" else 1)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.fasta:
        name, seq = read_fasta(args.fasta)
        source = f"{name[:60]} ({len(seq):,} bp)"
    else:
        seq = "".join(random.Random(0).choices("ACGT", k=max(shared + long)))
        source = "random ACGT, seed 0"
    shared = sorted({min(n, len(seq)) for n in shared})  # lengths past the sequence's end shrink
    long = sorted({min(n, len(seq)) for n in long} - set(shared))
    free = available_bytes(device)

    print(f"sequence: {source}; device: {device}, {str(dtype)[6:]}, "
          f"nheads={args.nheads}, headdim={args.headdim}")
    print(f"genoflash = flash_attn_func, '{select_backend(device)}' backend; standard = 'reference' backend "
          f"(materialises N x N); forward + backward, time = median of {repeats}")
    if device.type == "cpu":
        print("peak memory = peak RSS growth of a fresh child process during one forward + backward")
    print(f"\n{'method':<10} {'N':>9} {'time (s)':>10} {'peak memory (MiB)':>18}")
    rows, outs = [], {}
    for n in sorted(shared + long):
        for method in ("genoflash", "standard"):
            row, need = {"method": method, "n": n}, standard_bytes(n, args.nheads)
            if method == "standard" and n in long:
                row["skipped"] = f"skipped (genoflash-only length; needs ~{need / GiB:.1f} GiB)"
            elif method == "standard" and free is not None and need > 0.9 * free:
                row["skipped"] = f"skipped (would need {need / GiB:.1f} GiB, {free / GiB:.1f} free)"
            else:
                task = {"backend": "reference" if method == "standard" else None, "seq": seq[:n],
                        "nheads": args.nheads, "headdim": args.headdim, "device": str(device), "dtype": dtype}
                result, out = run_point(task, repeats)
                row.update(result)
                if n in shared and out is not None:
                    outs[(method, n)] = out
            rows.append(row)
            if "skipped" in row:
                print(f"{method:<10} {n:>9,}   {row['skipped']}")
            else:
                print(f"{method:<10} {n:>9,} {row['time_s']:>10.3f} {row['peak_mib']:>18,.1f}", flush=True)

    # Both methods see the same q, k, v, so their outputs must agree up to rounding.
    diffs = {n: (outs[("genoflash", n)].float() - outs[("standard", n)].float()).abs().max().item()
             for n in shared if ("genoflash", n) in outs and ("standard", n) in outs}
    summarize(rows, diffs, args.nheads)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sequence": source, "device": str(device), "dtype": str(dtype), "nheads": args.nheads,
                       "headdim": args.headdim, "repeats": repeats, "results": rows,
                       "max_abs_diff": {str(n): d for n, d in diffs.items()}}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
