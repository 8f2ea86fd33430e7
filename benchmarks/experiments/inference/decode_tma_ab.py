"""Probe: the decoding split kernel with TMA loads of K and V against its pointer loads and SDPA
cuDNN, in one process.

Cases are `genoflash bench decode`'s (one new token, head dim 128, bf16). Providers go round in
turn (ROUNDS rounds, each a do_bench median with L2 cleared), so drift between them shows up as
spread, not as a difference; each provider's figure is the median of its rounds:
    pointers            the default DecodeConfig (pointer loads)
    tma-b{N}-s{S}-p{P}  TMA loads, block_n N, num_stages S, programs_per_sm P
    *-hf                the same on a heads-first cache (transformers' layout, read in place)
    sdpa-cudnn          F.scaled_dot_product_attention, cuDNN backend, enable_gqa
Every genoflash output is compared with the pointer path's (max abs difference).

    python benchmarks/experiments/inference/decode_tma_ab.py OUT.json [--cases a,b] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from genoflash.bench.common import run_metadata
from genoflash.bench.decode import CASES, HEADDIM
from genoflash.bench.mixers import copy_bandwidth_gbps
from genoflash.ops.attention import decode

CUDA = torch.device("cuda")
ROUNDS = 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--quick", action="store_true", help="a smaller grid of TMA settings")
    args = parser.parse_args()
    floor_gbps = copy_bandwidth_gbps(CUDA)
    grid = ([(32, 2, 4), (64, 3, 4), (128, 2, 4)] if args.quick else
            list(itertools.product((32, 64, 128), (2, 3, 4), (2, 4))))
    report = {"metadata": run_metadata(CUDA, dtype="bf16", copy_rate_gbps=floor_gbps, rounds=ROUNDS,
                                       method="do_bench median (L2 cleared), median of rounds"),
              "grid": grid, "cases": []}
    for name in args.cases.split(","):
        batch, n, h, hk = CASES[name]
        torch.manual_seed(0)
        q = torch.randn(batch, 1, h, HEADDIM, device=CUDA, dtype=torch.bfloat16)
        k = torch.randn(batch, n, hk, HEADDIM, device=CUDA, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        kh, vh = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()  # (batch, hk, n, d)
        qh = q.transpose(1, 2)
        scale = HEADDIM ** -0.5
        floor_ms = 2 * k.numel() * k.element_size() / (floor_gbps * 1e9) * 1e3

        def ours(cfg, heads_first=False):
            def call():
                with decode.use_config(**cfg):
                    if heads_first:
                        return decode.decode_attention(qh, kh, vh, None, n, softmax_scale=scale, heads_first=True,
                                                       return_lse=False)[0]
                    return decode.decode_attention(q, k, v, None, n, softmax_scale=scale, return_lse=False)[0]
            return call

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qh, kh, vh, scale=scale, enable_gqa=True)

        providers = {"pointers": ours({}), "pointers-hf": ours({}, True)}
        for bn, st, p in grid:
            cfg = dict(tma=True, block_n=bn, num_stages=st, programs_per_sm=p)
            providers[f"tma-b{bn}-s{st}-p{p}"] = ours(cfg)
            providers[f"tma-b{bn}-s{st}-p{p}-hf"] = ours(cfg, True)
        providers["sdpa-cudnn"] = cudnn
        base = providers["pointers"]().float()
        rec = {"case": name, "batch": batch, "seqlen_k": n, "nheads": h, "nheads_k": hk, "floor_ms": floor_ms,
               "providers": {}}
        times: dict[str, list[float]] = {p: [] for p in providers}
        for p, fn in providers.items():
            out = fn()
            if p == "sdpa-cudnn":
                out = out.transpose(1, 2)
            rec["providers"][p] = {"max_abs_diff": (out.float() - base).abs().max().item()}
        for _ in range(ROUNDS):
            for p, fn in providers.items():
                times[p].append(triton.testing.do_bench(fn, warmup=25, rep=100))
        for p, ts in times.items():
            ms = statistics.median(ts)
            rec["providers"][p].update(ms=ms, rounds_ms=ts, pct_of_floor=100 * floor_ms / ms)
        cudnn_ms = rec["providers"]["sdpa-cudnn"]["ms"]
        for p, r in rec["providers"].items():
            r["speed_vs_cudnn"] = cudnn_ms / r["ms"]
        best = max((p for p in rec["providers"] if p.startswith("tma") and not p.endswith("-hf")),
                   key=lambda p: rec["providers"][p]["speed_vs_cudnn"])
        print(f"{name}: pointers {rec['providers']['pointers']['speed_vs_cudnn']:.3f}x cuDNN, best tma {best} "
              f"{rec['providers'][best]['speed_vs_cudnn']:.3f}x, cudnn {cudnn_ms:.4f} ms", flush=True)
        for p, r in sorted(rec["providers"].items(), key=lambda kv: kv[1]["ms"]):
            print(f"   {p:24s} {r['ms']:.4f} ms {r['pct_of_floor']:6.1f}% floor {r['speed_vs_cudnn']:.3f}x "
                  f"diff {r['max_abs_diff']:.2e}", flush=True)
        report["cases"].append(rec)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        q = k = v = kh = vh = qh = None
        providers.clear()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
