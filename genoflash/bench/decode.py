"""`genoflash bench decode`: one decoding step against a long KV cache, beside SDPA and the HBM floor.

A step is q (batch, 1, nheads, 128) against N cached keys and values (nheads_k heads), bf16. Each
provider runs on the same values in one process; times are medians of `triton.testing.do_bench`
(which clears L2 between calls, so every call reads the cache from HBM):
    genoflash          flash_attn_with_kvcache on a contiguous cache, settings(check_indices=False)
    genoflash-checked  the same call with its index values read and checked (the default)
    genoflash-paged    the keys in pages of 256 slots shuffled through a pool (block_table)
    genoflash-heads-first
                       the cache in SDPA's (batch, heads, N, dim) memory, read in place through a
                       transposed view (transformers keeps its cache so)
    sdpa-flash, sdpa-cudnn, sdpa-efficient
                       F.scaled_dot_product_attention on (batch, heads, N, dim) tensors, enable_gqa
    floor              the bytes of K and V read once, at the device-to-device copy rate
                       (bytes read + written per second: mixers.copy_bandwidth_gbps)
Every output is compared with sdpa-flash's, or the first SDPA that ran (max abs difference).

--sweep times the split kernel over tile shapes and split targets instead (decode.py's module
constants), on the same cases: what decode.py's constants were chosen from. Each round times every
combination and then SDPA's cuDNN kernel (layout "sdpa-cudnn") on the same keys, so that close
settings are compared inside one round and against the peer.
Results: <out>/<gpu>-<date>-decode.json (or -decode-sweep.json) and a plot.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from pathlib import Path

import torch

from .. import settings
from ..ops.attention import flash_attn_with_kvcache
from .common import (RESULTS_DIR, error_text, median_ms, pyplot, results_stem, run_metadata, save_figure, title_stamp,
                     write_json)
from .mixers import copy_bandwidth_gbps

CUDA = torch.device("cuda")
PAGE = 256
# name: (batch, seqlen_k, nheads, nheads_k); head dim 128
CASES = {
    "gqa-128k": (1, 131072, 32, 8),
    "gqa-1m": (1, 1048576, 32, 8),
    "gqa-b16-32k": (16, 32768, 32, 8),
    "mha-128k": (1, 131072, 32, 32),
    "mha-1m": (1, 1048576, 32, 32),
}
HEADDIM = 128


def _paged(k: torch.Tensor, v: torch.Tensor):
    """The caches (batch, N, h, d) as pages of PAGE slots, shuffled through a pool with spare pages."""
    batch, n = k.shape[:2]
    pages = -(-n // PAGE)
    pool = batch * pages + 7
    order = torch.randperm(pool, device=k.device)[:batch * pages]
    k_pages = torch.empty(pool, PAGE, *k.shape[2:], dtype=k.dtype, device=k.device)
    v_pages = torch.empty(pool, PAGE, *v.shape[2:], dtype=v.dtype, device=v.device)
    pad = pages * PAGE - n
    k_pages[order] = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).reshape(-1, PAGE, *k.shape[2:])
    v_pages[order] = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).reshape(-1, PAGE, *v.shape[2:])
    return k_pages, v_pages, order.view(batch, pages).to(torch.int32)


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def call(q, k, v):  # (batch, heads, n, d)
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] != q.shape[1])
    return call


def _timed(fn) -> dict:
    try:
        out = fn()
        torch.cuda.synchronize()
        return {"ms": median_ms(fn, CUDA), "out": out}
    except Exception as e:  # a provider that cannot run this case says why; the others go on
        return {"error": error_text(e)}


def run_case(name: str, batch: int, seqlen_k: int, nheads: int, nheads_k: int, floor_gbps: float) -> dict:
    torch.manual_seed(0)
    q = torch.randn(batch, 1, nheads, HEADDIM, device=CUDA, dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen_k, nheads_k, HEADDIM, device=CUDA, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lengths = torch.full((batch,), seqlen_k, dtype=torch.int32, device=CUDA)
    cache_bytes = 2 * k.numel() * k.element_size()
    rec = {"case": name, "batch": batch, "seqlen_k": seqlen_k, "nheads": nheads, "nheads_k": nheads_k,
           "headdim": HEADDIM, "cache_gib": cache_bytes / 2**30,
           "floor_ms": cache_bytes / (floor_gbps * 1e9) * 1e3, "providers": {}}
    outs = {}

    def add(provider, fn):
        r = _timed(fn)
        if "out" in r:
            outs[provider] = r.pop("out")
            r["pct_of_floor"] = 100 * rec["floor_ms"] / r["ms"]
        rec["providers"][provider] = r
        print(f"{name:12s} {provider:18s} " + (f"{r['ms']:.4f} ms  {r['pct_of_floor']:.0f}% of floor"
                                                if "ms" in r else r["error"]), flush=True)

    with settings(check_indices=False):
        add("genoflash", lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths))
    add("genoflash-checked", lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths))
    k_pages, v_pages, table = _paged(k, v)
    with settings(check_indices=False):
        add("genoflash-paged", lambda: flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=lengths,
                                                               block_table=table))
    k_pages = v_pages = None  # freed before SDPA's copies are made
    qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # SDPA's own layout
    k = v = None
    from torch.nn.attention import SDPBackend
    for provider, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION)):
        add(provider, lambda b=backend: _sdpa(b)(qs, ks, vs).transpose(1, 2))
    with settings(check_indices=False):  # SDPA's tensors read in place: the same memory layout as SDPA's
        add("genoflash-heads-first", lambda: flash_attn_with_kvcache(q, ks.transpose(1, 2), vs.transpose(1, 2),
                                                                     cache_seqlens=lengths))
    ref_name = next((p for p in ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient") if p in outs), None)
    if ref_name:
        rec["compared_with"] = ref_name
        for provider, out in outs.items():
            rec["providers"][provider]["max_abs_diff"] = (out.float() - outs[ref_name].float()).abs().max().item()
    qs = ks = vs = None
    outs.clear()
    torch.cuda.empty_cache()
    return rec


def sweep_case(name: str, batch: int, seqlen_k: int, nheads: int, nheads_k: int, floor_gbps: float,
               grid: dict, rounds: int = 1) -> list[dict]:
    """The split kernel's time for every combination of DecodeConfig's fields in `grid`, on a
    contiguous cache and on the same keys in shuffled pages, then SDPA cuDNN's, `rounds` times over."""
    from torch.nn.attention import SDPBackend

    from ..ops.attention import decode

    torch.manual_seed(0)
    q = torch.randn(batch, 1, nheads, HEADDIM, device=CUDA, dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen_k, nheads_k, HEADDIM, device=CUDA, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    floor_ms = 2 * k.numel() * k.element_size() / (floor_gbps * 1e9) * 1e3
    k_pages, v_pages, table = _paged(k, v)
    layouts = {"contiguous": (k, v, None), "paged": (k_pages, v_pages, table)}
    qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # SDPA's own layout
    rows = []

    def add(row: dict, r: dict) -> None:
        r.pop("out", None)
        row.update(r)
        if "ms" in r:
            row["pct_of_floor"] = 100 * floor_ms / r["ms"]
        rows.append(row)
        print(" ".join(f"{key}={value}" for key, value in row.items()), flush=True)

    for round_ in range(rounds):
        for values in itertools.product(*grid.values()):
            config = dict(zip(grid, values))
            with decode.use_config(**config):
                for layout, (kc, vc, bt) in layouts.items():
                    add({"case": name, "round": round_, "layout": layout, **config,
                         "splits": decode.choose_splits(batch, nheads, nheads_k, seqlen_k, CUDA)},
                        _timed(lambda: decode.decode_attention(q, kc, vc, None, seqlen_k,
                                                               softmax_scale=HEADDIM ** -0.5, block_table=bt)))
        add({"case": name, "round": round_, "layout": "sdpa-cudnn"},
            _timed(lambda: _sdpa(SDPBackend.CUDNN_ATTENTION)(qs, ks, vs)))
    q = k = v = k_pages = v_pages = qs = ks = vs = None
    layouts.clear()
    torch.cuda.empty_cache()
    return rows


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    cases = report["cases"]
    providers = [p for p in ("genoflash", "genoflash-heads-first", "genoflash-paged", "genoflash-checked",
                             "sdpa-flash", "sdpa-cudnn", "sdpa-efficient") if any(p in c["providers"] for c in cases)]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(providers)
    for i, p in enumerate(providers):
        ys = [c["providers"].get(p, {}).get("pct_of_floor", 0.0) for c in cases]
        ax.bar([j + i * width for j in range(len(cases))], ys, width, label=p)
    ax.axhline(100, color="black", lw=0.8)
    ax.axhline(85, color="gray", lw=0.8, ls="--")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], [c["case"] for c in cases])
    ax.set_ylabel("% of the HBM floor (higher is faster)")
    ax.set_title(f"one decoding step, bf16, head dim 128 | {title_stamp(report['metadata'])}", fontsize=9)
    ax.legend(fontsize=8, ncol=3)
    save_figure(fig, path)


def check_grid(parser: argparse.ArgumentParser, grid) -> None:
    """--grid must map DecodeConfig's field names to non-empty lists of values DecodeConfig takes
    (checked before any GPU work)."""
    from ..ops.attention.decode import DecodeConfig

    fields = {f.name for f in dataclasses.fields(DecodeConfig)}
    if not isinstance(grid, dict) or not grid:
        parser.error("--grid: give a JSON object of DecodeConfig fields, e.g. '{\"block_n\": [32, 64]}'")
    for name, values in grid.items():
        if name not in fields:
            parser.error(f"--grid: {name!r} is not a DecodeConfig field; choose from {', '.join(sorted(fields))}")
        if not isinstance(values, list) or not values:
            parser.error(f"--grid: {name!r} needs a non-empty list of values, got {values!r}")
        for value in values:
            try:
                DecodeConfig(**{name: value})
            except (ValueError, TypeError) as e:
                parser.error(f"--grid: {e}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="genoflash bench decode", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--sweep", action="store_true", help="time decode.py's constants instead of the providers")
    parser.add_argument("--grid", type=json.loads, default=None, help="--sweep: DecodeConfig fields and the "
                        "values to time, as JSON (default: the tile, warps, stages and programs per SM)")
    parser.add_argument("--rounds", type=int, default=1, help="--sweep: times each combination is timed, "
                        "the combinations interleaved")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.grid is not None:
        check_grid(parser, args.grid)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if not torch.cuda.is_available():
        print("genoflash bench decode needs a CUDA GPU", flush=True)
        return 2
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    floor_gbps = copy_bandwidth_gbps(CUDA)
    from ..ops.attention import decode

    index = torch.cuda.current_device()
    metadata = run_metadata(CUDA, dtype="bf16", copy_rate_gbps=floor_gbps,
                            method="do_bench median (L2 cleared between calls); floor = K+V bytes / copy rate",
                            decode_config={layout: dataclasses.asdict(decode.config_for(index, paged))
                                           for layout, paged in (("contiguous", False), ("paged", True))})
    if args.sweep:
        grid = args.grid or {"block_n": [32, 64], "num_warps": [2, 4], "num_stages": [2, 3, 4],
                             "programs_per_sm": [2, 3, 4, 6]}
        rows = [row for c in args.cases.split(",") for row in sweep_case(c, *CASES[c], floor_gbps, grid, args.rounds)]
        path = Path(f"{results_stem(args.out, metadata, 'decode-sweep')}.json")
        write_json(path, {"metadata": metadata, "grid": grid, "rounds": args.rounds, "rows": rows})
        print(f"wrote {path}", flush=True)
        return 0
    report = {"metadata": metadata, "cases": []}
    path = Path(f"{results_stem(args.out, metadata, 'decode')}.json")
    for c in args.cases.split(","):
        report["cases"].append(run_case(c, *CASES[c], floor_gbps))
        write_json(path, report)  # each case saved as it finishes
    plot(report, path.with_suffix(".png"))
    print(f"wrote {path}", flush=True)
    return 0
