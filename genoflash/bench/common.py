"""What every benchmark command shares: how it times, what it records, how it plots.

Timing. A time on a GPU is the median of `triton.testing.do_bench`, taken after one warm-up
call so that compilation and autotuning stay out of it; on the CPU (the commands' tiny
`--cpu` / `--dry-run` checks) it is the median of three `time.perf_counter` calls. Peak
memory is `torch.cuda.max_memory_allocated` over one call, counted from what is allocated
when the call starts, so the inputs count; the CPU has no such count (None). Triton is
imported only when a GPU is timed.

Records. A results file carries the run's device, date (UTC) and git commit and the library
versions beside its numbers, and is named <out>/<device>-<date>-<kind>.json (its plot: .png).

Plots. matplotlib is imported only when a plot is drawn, on the Agg backend (files, no
display); a plot of one run's numbers ends its title with the run's device, date and commit.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import platform
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch

RESULTS_DIR = Path("benchmarks/results")  # every command's default --out

# ---------------------------------------------------------------- timing and memory

CPU_REPEATS = 3  # timed calls per median on the CPU


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on the device (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_cached_memory(device: torch.device) -> None:
    """Hand the CUDA caching allocator's free blocks back, so one measurement's leftovers do
    not crowd the next."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_peak_memory(device: torch.device) -> None:
    """Restart the peak from what is allocated now."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    """The most allocated since the last reset_peak_memory, in GiB; None on the CPU."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def timed_call(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """fn()'s result and its wall time in seconds, the device's queued work waited for on both
    sides (so nothing queued before counts, and everything fn queued does)."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - start


class Once(NamedTuple):
    """One measured call: its result, wall seconds and peak memory (GiB; None on the CPU)."""
    result: Any
    seconds: float
    peak_gib: float | None


def measure_once(fn: Callable[[], Any], device: torch.device) -> Once:
    """One call of fn: its result, time and peak memory, the peak counted from what is
    allocated when it starts (the inputs included)."""
    reset_peak_memory(device)
    result, seconds = timed_call(fn, device)
    return Once(result, seconds, peak_memory_gib(device))


def median_ms(fn: Callable[[], Any], device: torch.device, *, warmup_ms: float = 25, rep_ms: float = 200) -> float:
    """Median milliseconds of fn(): on a GPU, triton.testing.do_bench's, which runs fn for about
    warmup_ms, then repeats it for about rep_ms; on the CPU, of CPU_REPEATS calls. Call fn once
    before, so that its compilation is not timed."""
    if device.type == "cuda":
        from triton.testing import do_bench
        return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    return statistics.median(timed_call(fn, device)[1] * 1e3 for _ in range(CPU_REPEATS))


def time_and_peak(fn: Callable[[], Any], device: torch.device, *, warmup_ms: float = 25, rep_ms: float = 200,
                  time_once_above_ms: float = math.inf, warmup: Callable[[], Any] | None = None) -> dict:
    """{"ms", "peak_gib"} of fn(), after one warm-up call (so compilation and autotuning stay
    out of both): the peak memory of one call, then the median time (median_ms). A call slower
    than time_once_above_ms is not repeated; its one call's time stands ("timed_calls": 1).
    `warmup` replaces the warm-up call where fn is minutes long: it must compile what fn runs
    (the same kernels and specialisations), at a fraction of the cost."""
    (warmup or fn)()  # compiles what fn runs, so neither the peak nor the time includes it
    once = measure_once(fn, device)
    if once.seconds * 1e3 > time_once_above_ms:
        return {"ms": once.seconds * 1e3, "peak_gib": once.peak_gib, "timed_calls": 1}
    return {"ms": median_ms(fn, device, warmup_ms=warmup_ms, rep_ms=rep_ms), "peak_gib": once.peak_gib}


# The FlashAttention papers' count: the backward does five N x N matmuls to the forward's two,
# so forward+backward counts as 3.5 forwards.
FWD_BWD_OVER_FWD = 3.5


def attention_flops(batch: int, nheads: int, seqlen: int, headdim: int, causal: bool, backward: bool) -> float:
    """FLOPs of attention over seqlen queries and keys: 4 * B * H * N^2 * D forward (two
    matmuls), halved when causal; x FWD_BWD_OVER_FWD with the backward."""
    forward = 4 * batch * nheads * seqlen**2 * headdim / (2 if causal else 1)
    return forward * (FWD_BWD_OVER_FWD if backward else 1.0)


def tflops(flops: float, ms: float) -> float:
    """TF/s of `flops` done in `ms` milliseconds."""
    return flops / (ms * 1e-3) / 1e12


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float32 (NaN if out holds a NaN)."""
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# ---------------------------------------------------------------- records

def git_commit() -> str:
    """GENOFLASH_COMMIT when set (a copy of the tree on a GPU machine can hold a stale .git,
    whose HEAD is not the commit that runs), else HEAD of the checkout, else "unknown"."""
    if os.environ.get("GENOFLASH_COMMIT"):
        return os.environ["GENOFLASH_COMMIT"]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = ""
    return commit or "unknown"


def dist_version(*names: str) -> str | None:
    """The installed version of the first of these distributions that is installed (read from
    its metadata: nothing is imported)."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


def _this_machine() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_name(device: torch.device | None = None) -> str:
    """"NVIDIA H200" for a GPU, "cpu" for the CPU; by default this machine's GPU, if it has one."""
    device = device if device is not None else _this_machine()
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def run_stamp(device: torch.device | None = None) -> dict:
    """{"device", "date", "git_commit"}: what names a results file and ends its plot's title."""
    return {"device": device_name(device),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git_commit()}


def versions(device: torch.device | None = None) -> dict:
    """The versions a measurement depends on (cuDNN's only for a GPU run)."""
    device = device if device is not None else _this_machine()
    return {"python": platform.python_version(), "torch": torch.__version__,
            "triton": dist_version("triton", "pytorch-triton"), "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None}


def run_metadata(device: torch.device | None = None, **fields) -> dict:
    """A results file's "metadata": the run stamp and the versions for a run on `device` (by
    default this machine's GPU, if it has one), then the command's own fields (method, dtype, ...)."""
    return {**run_stamp(device), **versions(device), **fields}


def results_stem(out: Path, metadata: dict, kind: str | None) -> Path:
    """<out>/<device>-<date>[-<kind>], e.g. benchmarks/results/h200-YYYY-MM-DD-memory (out is
    created); the caller adds .json or .png."""
    device = re.sub(r"[^a-z0-9]+", "-", metadata["device"].lower().replace("nvidia", "")).strip("-")
    out.mkdir(parents=True, exist_ok=True)
    return out / "-".join(part for part in (device, metadata["date"][:10], kind) if part)


def error_text(e: BaseException, limit: int = 200) -> str:
    """What a results file records of a case that failed: the exception's type and the first line of
    its message, cut to `limit` characters (an empty message gives the type alone)."""
    return f"{type(e).__name__}: {first_line(e)[:limit]}"


def first_line(e: BaseException) -> str:
    """The first line of an exception's message ('' for an empty one)."""
    return (str(e).splitlines() or [""])[0]


def write_json(path: Path, report: Any) -> None:
    path.write_text(json.dumps(report, indent=1) + "\n")


# ---------------------------------------------------------------- plots

def pyplot():
    """matplotlib.pyplot, drawing to files only (the Agg backend)."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("the benchmark plots need matplotlib (pip install matplotlib)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def title_stamp(metadata: dict) -> str:
    """'<device> (<date>, <commit>)', the end of the title of a plot of one run's numbers."""
    return f"{metadata['device']} ({metadata['date'][:10]}, {metadata['git_commit'][:8]})"


def save_figure(fig, path: Path) -> None:
    """Lay the figure out, write it (legends placed outside the axes included) and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    pyplot().close(fig)
