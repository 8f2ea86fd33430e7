"""`genoflash bench attention`: genoflash against the peer attention kernels, side by side.

Every provider runs in this one process on the same inputs. Before a provider is timed on
a shape, its output is checked against genoflash's; then forward and forward+backward are
timed with `triton.testing.do_bench` (median) and their peak memory is recorded. Results go
to `<out>/<gpu>-<date>[-tag].json` plus a TF/s-vs-seqlen plot `<same>.png`, and a compact
table is printed at the end.

`--dry-run` runs tiny shapes on the CPU with genoflash's `torch` backend (timed with
`time.perf_counter`), to check the code paths and the output files without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import signal
import sys
import warnings
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .. import flash_attn_func, use_backend
from .common import (RESULTS_DIR, attention_flops, dist_version, free_cached_memory, pyplot, relative_error,
                     results_stem, run_stamp, save_figure, time_and_peak, timed_call, title_stamp, tflops,
                     versions, write_json)

AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

REL_TOL = 2e-2  # ||out - genoflash|| / ||genoflash||, bf16/fp16
STANDARD_MAX_SCORE_BYTES = 40 * 2**30  # skip standard attention above this N x N fp32 matrix
MODES = ("fwd", "fwd_bwd")
METHOD = (
    "triton.testing.do_bench(warmup=25, rep=200, return_mode='median') after one warm-up call; "
    "fwd = forward with requires_grad inputs; fwd_bwd = forward + torch.autograd.grad(out, (q, k, v), dout); "
    "TF/s: fwd flops = 4*B*H*N*N*D (halved when causal), fwd_bwd = 3.5 x fwd; "
    "peak = torch.cuda.max_memory_allocated over one call (inputs included), GiB; "
    f"checked first: ||out - genoflash|| / ||genoflash|| < {REL_TOL}"
)


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int
    nheads: int
    seqlen: int
    headdim: int
    causal: bool

    @property
    def label(self) -> str:
        return (f"B{self.batch} H{self.nheads} N{self.seqlen} D{self.headdim} "
                f"{'causal' if self.causal else 'noncausal'}")

    def flops(self, mode: str) -> float:
        return attention_flops(self.batch, self.nheads, self.seqlen, self.headdim, self.causal,
                               backward=mode == "fwd_bwd")


def _both_causal(shapes: list[tuple[int, int, int, int]]) -> list[Shape]:
    return [Shape(*s, causal) for s in shapes for causal in (False, True)]


# 16k tokens per batch (B = 16384 // N), as in the FlashAttention papers' benchmarks.
ANCHORS = (
    _both_causal([(16384 // n, h, n, d) for h, d in [(32, 64), (16, 128)] for n in (1024, 4096, 16384)])
    + _both_causal([(1, 8, 65536, 128)])
    + [Shape(1, 8, 262144, 128, False)]
)
SWEEP = _both_causal([(16384 // n, 2048 // d, n, d) for d in (64, 128, 256)
                      for n in (512, 1024, 2048, 4096, 8192, 16384)])
GENOMIC = [Shape(1, 8, 65536, 128, False), Shape(1, 8, 262144, 128, False),
           *_both_causal([(1, 16, 16384, 128)]), Shape(1, 32, 16384, 64, False)]
SHAPE_SETS = {"anchors": ANCHORS, "sweep": SWEEP, "genomic": GENOMIC,
              "all": list(dict.fromkeys(ANCHORS + SWEEP + GENOMIC))}
DRY_RUN_SHAPES = _both_causal([(512 // n, 2, n, d) for d in (32, 64) for n in (64, 128)])


# ---------------------------------------------------------------- providers

@dataclasses.dataclass(frozen=True)
class Provider:
    name: str
    # Per-shape setup (e.g. flex's block mask) happens here, outside the timed call.
    build: Callable[[Shape, torch.device], AttnFn]
    skip: Callable[[Shape], str | None] = lambda shape: None
    # Run when --providers is not given. Variants of genoflash itself are opt-in.
    default: bool = True


def _genoflash(backend: str, deterministic: bool = False) -> Callable[[Shape, torch.device], AttnFn]:
    def build(shape: Shape, device: torch.device) -> AttnFn:
        def fn(q, k, v):
            with use_backend(backend):
                return flash_attn_func(q, k, v, causal=shape.causal, deterministic=deterministic)
        return fn
    return build


def _bhnd(*ts: torch.Tensor) -> list[torch.Tensor]:
    """(B, N, H, D) -> (B, H, N, D) views, the layout SDPA and FlexAttention take."""
    return [t.transpose(1, 2) for t in ts]


def _sdpa(backend: SDPBackend) -> Callable[[Shape, torch.device], AttnFn]:
    def build(shape: Shape, device: torch.device) -> AttnFn:
        def fn(q, k, v):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(*_bhnd(q, k, v), is_causal=shape.causal).transpose(1, 2)
        return fn
    return build


@functools.cache
def compiled_flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    # Each shape compiles its own graph; the default limit (8) would silently fall back to eager.
    torch._dynamo.config.recompile_limit = 256
    return torch.compile(flex_attention, dynamic=False), torch.compile(create_block_mask, dynamic=False)


def _causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _flex(shape: Shape, device: torch.device) -> AttnFn:
    flex, block_mask = compiled_flex()
    n = shape.seqlen
    mask = block_mask(_causal_mask, None, None, n, n, device=device) if shape.causal else None

    def fn(q, k, v):
        return flex(*_bhnd(q, k, v), block_mask=mask).transpose(1, 2)
    return fn


def _fa4(shape: Shape, device: torch.device) -> AttnFn:
    from flash_attn.cute import flash_attn_func as fa4

    def fn(q, k, v):
        out = fa4(q, k, v, causal=shape.causal)
        return out[0] if isinstance(out, tuple) else out  # some versions return (out, lse)
    return fn


def _standard_too_big(shape: Shape) -> str | None:
    scores = shape.batch * shape.nheads * shape.seqlen**2 * 4
    return "skipped: memory" if scores > STANDARD_MAX_SCORE_BYTES else None


def make_providers(genoflash_backend: str) -> list[Provider]:
    return [
        Provider("genoflash", _genoflash(genoflash_backend)),
        # deterministic=True: the two bitwise-reproducible backward passes instead of the default
        # one-pass backward (where that applies), timed side by side with it.
        Provider("genoflash-deterministic", _genoflash(genoflash_backend, deterministic=True), default=False),
        Provider("fa4", _fa4),
        Provider("sdpa-flash", _sdpa(SDPBackend.FLASH_ATTENTION)),
        Provider("sdpa-cudnn", _sdpa(SDPBackend.CUDNN_ATTENTION)),
        Provider("sdpa-efficient", _sdpa(SDPBackend.EFFICIENT_ATTENTION)),
        Provider("flex", _flex),
        Provider("standard", _genoflash("reference"), skip=_standard_too_big),
    ]


# ---------------------------------------------------------------- measurement

def _describe(e: BaseException, notes: Sequence[str] = ()) -> str:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "OOM"
    if "No viable backend for scaled_dot_product_attention" in str(e):
        # A forced SDPA backend that does not take this shape, dtype or device; the notes say why.
        return " | ".join(["no kernel", *notes])[:300]
    # Compiler errors put the useful part on the second line, so keep two.
    lines = [line.strip() for line in str(e).splitlines() if line.strip()][:2]
    return f"{type(e).__name__}: {' | '.join(lines)}"[:300]


def _first_call(fn: AttnFn, q, k, v, dout, device) -> tuple[torch.Tensor | None, dict]:
    """genoflash's first forward and backward on this shape, JIT compilation included."""
    try:
        out, fwd_s = timed_call(lambda: fn(q, k, v), device)
        _, bwd_s = timed_call(lambda: torch.autograd.grad(out, (q, k, v), dout), device)
        return out.detach(), {"fwd_s": fwd_s, "bwd_s": bwd_s}
    except Exception as e:
        return None, {"error": _describe(e)}


def _check(provider: Provider, shape: Shape, q, k, v, ref) -> tuple[AttnFn | None, dict]:
    """Build the provider and compare its output with genoflash's; the fn is None if it is not to be timed."""
    if reason := provider.skip(shape):
        return None, {"status": reason}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn = provider.build(shape, q.device)
            out = fn(q, k, v)
        except Exception as e:
            # SDPA explains in warnings why a forced backend has no kernel for this shape.
            notes = list(dict.fromkeys(str(w.message).strip() for w in caught))
            return None, {"status": "error", "error": _describe(e, notes)}
    if ref is None:
        return fn, {"rel_err": None, "error": "unchecked: genoflash failed"}
    err = relative_error(out, ref)
    if not err < REL_TOL:  # also catches NaN
        return None, {"status": "failed check", "rel_err": err}
    return fn, {"rel_err": err}


def _measure(fn: AttnFn, shape: Shape, q, k, v, dout) -> dict:
    calls = {"fwd": lambda: fn(q, k, v),
             "fwd_bwd": lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), dout)}
    rec: dict = {"status": "ok"}
    for mode, call in calls.items():
        try:
            timed = time_and_peak(call, q.device)
            rec[f"{mode}_peak_gib"] = timed["peak_gib"]
            rec[f"{mode}_ms"] = timed["ms"]
            rec[f"{mode}_tflops"] = tflops(shape.flops(mode), timed["ms"])
        except Exception as e:
            rec["status"] = "error" if mode == "fwd" else "fwd only"
            rec["error"] = _describe(e)
            break
        finally:
            free_cached_memory(q.device)
    return rec


def run_shape(shape: Shape, providers: list[Provider], genoflash_backend: str,
              dtype: torch.dtype, device: torch.device) -> dict:
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(shape.batch, shape.seqlen, shape.nheads, shape.headdim, device=device,
                                 dtype=dtype, requires_grad=i < 3) for i in range(4))
    ref, first_call = _first_call(_genoflash(genoflash_backend)(shape, device), q, k, v, dout, device)
    results, timed = {}, {}
    for p in providers:
        fn, results[p.name] = _check(p, shape, q, k, v, ref)
        if fn is not None:
            timed[p.name] = fn
        free_cached_memory(device)
    del ref  # keep genoflash's output out of everyone's peak memory
    free_cached_memory(device)
    for name, fn in timed.items():
        results[name].update(_measure(fn, shape, q, k, v, dout))
    return {**dataclasses.asdict(shape), "genoflash_first_call": first_call, "results": results}


# ---------------------------------------------------------------- metadata and output

def metadata(device: torch.device, args: argparse.Namespace) -> dict:
    cuda = device.type == "cuda"
    return {
        **run_stamp(device),
        "versions": {**versions(device),
                     "flash_attn_4": dist_version("flash-attn-4", "flash-attn-cute", "flash-attn")},
        "method": METHOD if cuda else "dry run: time.perf_counter median of 3 calls on the CPU",
        "dtype": args.dtype,
        "shapes": "dry-run" if args.dry_run else args.shapes + (" (quick)" if args.quick else "") + "".join(
            f" ({name} {','.join(map(str, sorted(values)))})" for name in ("seqlen", "headdim")
            if (values := getattr(args, name, None))),
        "genoflash_backend": "triton" if cuda else "torch",
    }


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    shapes = report["shapes"]
    panels = sorted({(s["headdim"], s["causal"]) for s in shapes})
    fig, axes = plt.subplots(2, len(panels), figsize=(4 * len(panels), 7), squeeze=False)
    for col, (headdim, causal) in enumerate(panels):
        for row, mode in enumerate(MODES):
            ax = axes[row][col]
            for i, name in enumerate(report["providers"]):
                points = sorted((s["seqlen"], s["results"][name][f"{mode}_tflops"]) for s in shapes
                                if (s["headdim"], s["causal"]) == (headdim, causal)
                                and s["results"].get(name, {}).get(f"{mode}_tflops") is not None)
                if points:
                    ax.plot(*zip(*points), marker="o", color=f"C{i}", label=name,
                            linewidth=2.5 if name == "genoflash" else 1.5)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1024:g}k" if x >= 1024 else f"{x:g}")
            ax.set_ylim(bottom=0)
            ax.set_title(f"{'fwd' if mode == 'fwd' else 'fwd+bwd'}, d={headdim}, "
                         f"{'causal' if causal else 'non-causal'}", fontsize=10)
            ax.set_xlabel("sequence length" if row == 1 else "")
            ax.set_ylabel("TF/s" if col == 0 else "")
            ax.grid(alpha=0.3)
    # One legend for the figure: every provider that has a point in some panel.
    handles = {h.get_label(): h for ax in axes.flat for h in ax.get_lines()}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles),
               bbox_to_anchor=(0.5, -0.03), frameon=False)
    meta = report["metadata"]
    fig.suptitle(f"attention {meta['dtype']} on {title_stamp(meta)}")
    save_figure(fig, path)


def _fmt(x: float | None, width: int, spec: str) -> str:
    return (format(x, spec) if x is not None else "-").rjust(width)


def print_table(report: dict) -> None:
    print(f"{'provider':<17}{'fwd TF/s':>10}{'f+b TF/s':>10}{'fwd GiB':>8}{'f+b GiB':>8}{'rel err':>9}")
    for s in report["shapes"]:
        first = s["genoflash_first_call"]
        jit = f"  [genoflash 1st call: fwd {first['fwd_s']:.1f}s, bwd {first['bwd_s']:.1f}s]" if "fwd_s" in first \
            else f"  [genoflash: {first['error']}]"
        print((Shape(s["batch"], s["nheads"], s["seqlen"], s["headdim"], s["causal"]).label + jit)[:120])
        for name, r in s["results"].items():
            cells = r["status"] if r.get("fwd_ms") is None else (
                _fmt(r["fwd_tflops"], 10, ".4g") + _fmt(r.get("fwd_bwd_tflops"), 10, ".4g")
                + _fmt(r["fwd_peak_gib"], 8, ".2f") + _fmt(r.get("fwd_bwd_peak_gib"), 8, ".2f")
                + _fmt(r["rel_err"], 9, ".1e"))
            error = f"  {r['error']}" if "error" in r else ""
            print(f"  {name:<15}{cells}{error}"[:120])
    print(flush=True)


# ---------------------------------------------------------------- command line

def _int_set(text: str) -> set[int]:
    try:
        return {int(n) for n in text.split(",")}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="genoflash bench attention", description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=sorted(SHAPE_SETS), default="anchors")
    parser.add_argument("--providers", help="comma-separated subset of: " + ", ".join(
        p.name for p in make_providers("triton")))
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--tag", help="appended to the output file name")
    parser.add_argument("--quick", action="store_true", help="only head dim 128 and seqlen <= 65536")
    parser.add_argument("--seqlen", type=_int_set, help="only the shapes of the set with these sequence lengths "
                        "(comma-separated), e.g. to finish a set in two device calls")
    parser.add_argument("--headdim", type=_int_set, help="only the shapes of the set with these head dims "
                        "(comma-separated)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny shapes on the CPU with the torch backend (no GPU needed)")
    return parser.parse_args(argv)


def select_shapes(args: argparse.Namespace) -> list[Shape]:
    if args.dry_run:
        return DRY_RUN_SHAPES
    shapes = SHAPE_SETS[args.shapes]
    if args.quick:
        shapes = [s for s in shapes if s.headdim == 128 and s.seqlen <= 65536]
    if args.seqlen:
        shapes = [s for s in shapes if s.seqlen in args.seqlen]
        if not shapes:
            raise SystemExit(f"no shape of the set {args.shapes!r} has seqlen in {sorted(args.seqlen)}")
    if args.headdim:
        shapes = [s for s in shapes if s.headdim in args.headdim]
        if not shapes:
            raise SystemExit(f"no shape of the set {args.shapes!r} has headdim in {sorted(args.headdim)}")
    return shapes


def select_providers(args: argparse.Namespace, genoflash_backend: str) -> tuple[list[Provider], dict]:
    providers = make_providers(genoflash_backend)
    if args.providers:
        wanted = [name.strip() for name in args.providers.split(",") if name.strip()]
        unknown = set(wanted) - {p.name for p in providers}
        if unknown:
            raise SystemExit(f"unknown provider(s): {', '.join(sorted(unknown))}")
        providers = [p for p in providers if p.name in wanted]
    else:
        providers = [p for p in providers if p.default]
    unavailable = {}
    if any(p.name == "fa4" for p in providers):
        try:
            from flash_attn.cute import flash_attn_func  # noqa: F401
        except Exception as e:  # ImportError, or a broken install failing at import time
            unavailable["fa4"] = _describe(e)
    return [p for p in providers if p.name not in unavailable], unavailable


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not (args.dry_run or torch.cuda.is_available()):
        print("no CUDA device: run with --dry-run to check the harness on the CPU", flush=True)
        return 2
    device = torch.device("cpu" if args.dry_run else "cuda")
    genoflash_backend = "torch" if args.dry_run else "triton"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    providers, unavailable = select_providers(args, genoflash_backend)
    shapes = select_shapes(args)

    report = {"metadata": metadata(device, args), "providers": [p.name for p in providers],
              "unavailable": unavailable, "shapes": []}
    stem = results_stem(args.out, report["metadata"], args.tag)
    # A run killed by a time limit (SIGTERM) still plots and prints what it has measured.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        for i, shape in enumerate(shapes, 1):
            print(f"[{i}/{len(shapes)}] {shape.label}", flush=True)
            report["shapes"].append(run_shape(shape, providers, genoflash_backend, dtype, device))
            free_cached_memory(device)
            write_json(Path(f"{stem}.json"), report)  # after every shape
    finally:
        for name, reason in unavailable.items():
            print(f"{name} unavailable: {reason}"[:200])
        if report["shapes"]:
            print_table(report)
            if not args.no_plot:
                plot(report, Path(f"{stem}.png"))
            print(f"wrote {stem}.json" + ("" if args.no_plot else f" and {stem}.png"), flush=True)
    return 0
