"""`genoflash example`: exact attention over a DNA-length sequence, genoflash vs standard.

Each nucleotide is one token (A, C, G, T, N -> 0..4). The tokens go through a seeded random
embedding and three random projections to give q, k, v of shape (1, N, nheads, headdim); no
weights are downloaded. For each length, forward + backward runs with genoflash (the device's
default backend: Triton kernels on CUDA, the tiled `torch` backend on the CPU) and with
standard attention (the `reference` backend, which materialises the N x N score matrix).

How peak memory is measured (always the growth caused by attention, inputs not counted):
* CUDA: torch.cuda.max_memory_allocated() after reset_peak_memory_stats(), minus the memory
  allocated just before the attention call.
* CPU: torch's allocations are invisible to tracemalloc, so every (method, length) runs in a
  fresh 'spawn' child process, which reports its peak resident set size (getrusage ru_maxrss)
  minus its resident set size just before the attention call (/proc/self/statm).
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
import time

import numpy as np
import torch

from ..backends import select_backend, use_backend
from ..ops.attention import flash_attn_func

VOCAB = "ACGTN"
MiB, GiB = 2**20, 2**30
# Chosen so the CPU run ends in well under 2 minutes on 2 cores; a GPU takes far more.
CPU_LENGTHS, CPU_LONG = [1024, 2048, 4096], [8192]
GPU_LENGTHS, GPU_LONG = [16384, 32768, 65536, 131072], []
# Standard attention keeps about this many fp32 N x N matrices alive at its peak (scores,
# probabilities and their gradients); measured on the CPU, used to skip what cannot fit.
STANDARD_NXN_COPIES = 5


def read_fasta(path: str) -> tuple[str, str]:
    """(header, sequence) of the first record; other IUPAC letters become N."""
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


def random_dna(length: int, seed: int = 0) -> str:
    return "".join(random.Random(seed).choices("ACGT", k=length))


def make_qkv(seq: str, nheads: int, headdim: int, device: torch.device, dtype: torch.dtype):
    """Token -> seeded random embedding -> three random projections -> q, k, v."""
    tokens = torch.tensor([VOCAB.index(c) for c in seq])
    torch.manual_seed(0)  # same weights in every process, so all runs see the same q, k, v
    dim = nheads * headdim
    embed = torch.nn.Embedding(len(VOCAB), dim)
    projections = [torch.nn.Linear(dim, dim, bias=False) for _ in range(3)]
    with torch.no_grad():
        x = embed(tokens)
        qkv = [p(x).view(1, len(seq), nheads, headdim) for p in projections]
    return [t.to(device, dtype).requires_grad_() for t in qkv]


def forward_backward(q, k, v, backend: str | None) -> torch.Tensor:
    ctx = use_backend(backend) if backend else contextlib.nullcontext()
    with ctx:
        out = flash_attn_func(q, k, v)
        # mean(out^2): a cheap scalar whose gradient reaches every output element.
        torch.autograd.grad(out.float().square().mean(), (q, k, v))
    return out.detach()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def measure(task: dict) -> dict:
    """Time and peak memory of forward + backward; runs in a child process on the CPU."""
    device = torch.device(task["device"])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = make_qkv(task["seq"], task["nheads"], task["headdim"], device, dtype)
    backend = "reference" if task["method"] == "standard" else None
    if device.type == "cuda":
        forward_backward(q, k, v, backend)  # warm-up: Triton compiles its kernels on first call
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = _rss_bytes()
    times, out = [], None
    for _ in range(task["repeats"]):
        out = None  # free the previous output so it does not count towards this peak
        t0 = time.perf_counter()
        out = forward_backward(q, k, v, backend)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() - base if device.type == "cuda" else _peak_rss_bytes() - base
    return {"time_s": statistics.median(times), "peak_mib": peak / MiB,
            "out": out.float().cpu().numpy() if task["keep_out"] else None}


def measure_in_child(task: dict) -> dict:
    # A fresh process per run: ru_maxrss only ever grows, so runs must not share a process.
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(measure, task).result()


def standard_bytes(n: int, nheads: int) -> int:
    return STANDARD_NXN_COPIES * nheads * n * n * 4


def available_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with contextlib.suppress(OSError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    return None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="genoflash example", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", "--length", type=int, nargs="+",
                   help=f"lengths run by both methods (CPU {CPU_LENGTHS}, GPU {GPU_LENGTHS})")
    p.add_argument("--long", type=int, nargs="*", help=f"lengths for genoflash only (CPU {CPU_LONG})")
    p.add_argument("--nheads", type=int, default=4)
    p.add_argument("--headdim", type=int, default=64)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--fasta", help="read the first record of this FASTA file instead of random DNA")
    p.add_argument("--repeats", type=int, help="timed runs per point, median reported (CPU 1, GPU 3)")
    p.add_argument("--json", help="also write the results to this JSON file")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else "cpu" if args.device == "auto" else args.device)
    on_gpu = device.type == "cuda"
    shared = args.lengths or (GPU_LENGTHS if on_gpu else CPU_LENGTHS)
    long = args.long if args.long is not None else ([] if args.lengths else GPU_LONG if on_gpu else CPU_LONG)
    repeats = args.repeats or (3 if on_gpu else 1)
    if args.fasta:
        name, seq = read_fasta(args.fasta)
        source = f"{name[:60]} ({len(seq):,} bp)"
    else:
        seq = random_dna(max(shared + long))
        source = "random ACGT, seed 0"
    # Lengths beyond the sequence shrink to the whole sequence.
    shared = sorted({min(n, len(seq)) for n in shared})
    long = sorted({min(n, len(seq)) for n in long} - set(shared))
    free = available_bytes(device)

    print(f"sequence: {source}; device: {device}, "
          f"{'bfloat16' if on_gpu else 'float32'}, nheads={args.nheads}, headdim={args.headdim}")
    print(f"genoflash = flash_attn_func, '{select_backend(device)}' backend; standard = 'reference' "
          f"backend (materialises N x N); forward + backward, median of {repeats}")
    if not on_gpu:
        print("CPU peak memory = peak RSS growth of a fresh child process during attention")
    print(f"\n{'method':<10} {'N':>9} {'time (s)':>10} {'peak memory (MiB)':>18}")

    rows, outs = [], {}
    for n in sorted(shared + long):
        for method in ("genoflash", "standard"):
            row = {"method": method, "n": n}
            need = standard_bytes(n, args.nheads)
            if method == "standard" and n in long:
                row["skipped"] = f"skipped (genoflash-only length; needs ~{need / GiB:.1f} GiB)"
            elif method == "standard" and free is not None and need > 0.9 * free:
                row["skipped"] = f"skipped (would need {need / GiB:.1f} GiB, {free / GiB:.1f} free)"
            else:
                task = {"method": method, "seq": seq[:n], "nheads": args.nheads, "headdim": args.headdim,
                        "device": str(device), "repeats": repeats, "keep_out": n in shared}
                try:
                    result = measure(task) if on_gpu else measure_in_child(task)
                except (torch.cuda.OutOfMemoryError, concurrent.futures.process.BrokenProcessPool) as e:
                    result = {"skipped": f"failed ({type(e).__name__}: out of memory?)"}
                    torch.cuda.empty_cache() if on_gpu else None
                if result.get("out") is not None:
                    outs[(method, n)] = result["out"]
                row.update({key: val for key, val in result.items() if key != "out"})
            rows.append(row)
            if "skipped" in row:
                print(f"{method:<10} {n:>9,} {row['skipped']:>29}")
            else:
                print(f"{method:<10} {n:>9,} {row['time_s']:>10.3f} {row['peak_mib']:>18,.1f}", flush=True)

    # Same q, k, v for both methods, so outputs must agree up to floating-point rounding.
    diffs = {n: float(np.abs(outs[("genoflash", n)] - outs[("standard", n)]).max())
             for n in shared if ("genoflash", n) in outs and ("standard", n) in outs}
    if diffs:
        print("\nmax |genoflash - standard| of outputs: "
              + ", ".join(f"N={n:,}: {d:.2e}" for n, d in diffs.items()))
    peaks = {(r["method"], r["n"]): r["peak_mib"] for r in rows if "peak_mib" in r}
    both = [n for n in diffs if ("genoflash", n) in peaks and ("standard", n) in peaks]
    if both:
        n = max(both)
        std, gf = peaks[("standard", n)], peaks[("genoflash", n)]
        print(f"at N={n:,} standard attention used {std:,.0f} MiB, genoflash {gf:,.0f} MiB "
              f"({std / max(gf, 1e-9):.1f}x less)")
    only = [n for n in shared + long if ("genoflash", n) in peaks and ("standard", n) not in peaks]
    if only:
        n = max(only)
        print(f"genoflash also ran N={n:,} in {peaks[('genoflash', n)]:,.0f} MiB; standard attention "
              f"would need ~{standard_bytes(n, args.nheads) / GiB:.1f} GiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sequence": source, "device": str(device), "nheads": args.nheads,
                       "headdim": args.headdim, "repeats": repeats, "results": rows,
                       "max_abs_diff": {str(n): d for n, d in diffs.items()}}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
