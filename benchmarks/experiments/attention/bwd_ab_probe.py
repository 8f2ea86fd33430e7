"""Experiment: the attention backward of the working tree against a baseline copy, same process, same inputs.
(docs/design/attention-backward.md cites its results.)

The baseline is genoflash/ops/attention as of another commit, copied beside the package as
genoflash/ops/_attention_baseline (not committed; make it with
`git archive REV genoflash/ops/attention | tar x -C /tmp/bl && mv /tmp/bl/genoflash/ops/attention
genoflash/ops/_attention_baseline`, listed in .git/info/exclude, and carry it to the device). Each shape runs the working tree's forward once, then times both backwards with
triton.testing.do_bench (median), alternating twice so drift shows, and checks that they return the
same gradients (the largest difference relative to the largest gradient). TF/s is useful FLOPs:
the backward 2.5x the forward's 4·B·H·N²·D (2·(D+Dv) for Dv != D, visible pairs only with a
window, halved when causal).

    python benchmarks/experiments/attention/bwd_ab_probe.py --out X.json [--baseline-commit REV]
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os

import torch
import triton
import triton.testing

from genoflash.bench.features import visible_pairs
from genoflash.ops.attention.args import AttentionArgs
from genoflash.ops.attention.backward import attention_backward
from genoflash.ops.attention.dropout import DropoutArgs
from genoflash.ops.attention.forward import attention_forward

# (name, batch, nheads, seqlen, d, dv, causal, window, extra)
SHAPES = [
    ("H16 N16k hd128", 1, 16, 16384, 128, 128, False, None, None),
    ("H16 N16k hd128 causal", 1, 16, 16384, 128, 128, True, None, None),
    ("H32 N16k hd64 causal", 1, 32, 16384, 64, 64, True, None, None),
    ("H8 N16k window 2048", 1, 8, 16384, 128, 128, False, 2048, None),
    ("H8 N64k window 2048", 1, 8, 65536, 128, 128, False, 2048, None),
    ("H8 N16k (128,192) causal", 1, 8, 16384, 128, 192, True, None, None),
    ("H16 N16k hd128 causal alibi", 1, 16, 16384, 128, 128, True, None, "alibi"),
    ("H16 N16k hd128 dropout 0.1", 1, 16, 16384, 128, 128, False, None, "dropout"),
    ("H16 N16k hd128 causal dropout 0.1", 1, 16, 16384, 128, 128, True, None, "dropout"),
    # hd256 at the papers' sweep's N8192 and N1024 (B x N = 16k, H8), and windowed
    ("B2 H8 N8k hd256", 2, 8, 8192, 256, 256, False, None, None),
    ("B2 H8 N8k hd256 causal", 2, 8, 8192, 256, 256, True, None, None),
    ("B16 H8 N1k hd256 causal", 16, 8, 1024, 256, 256, True, None, None),
    ("H8 N16k hd256 window 2048", 1, 8, 16384, 256, 256, False, 2048, None),
    # The papers' sweep at N = 512 (B x N = 16k, hidden 2048)
    ("B32 H32 N512 hd64 causal", 32, 32, 512, 64, 64, True, None, None),
    ("B32 H16 N512 hd128", 32, 16, 512, 128, 128, False, None, None),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--baseline-commit", default="unknown")
    ap.add_argument("--only", help="run the shapes whose name contains one of these (comma-separated)")
    args = ap.parse_args()
    variants = {"working tree": attention_backward}
    try:
        base = importlib.import_module("genoflash.ops._attention_baseline.backward")
        variants[f"baseline {args.baseline_commit}"] = base.attention_backward
    except ImportError as exc:
        print(f"no baseline ({exc}): timing the working tree alone")
    rows = []
    for name, b, h, n, d, dv, causal, window, extra in SHAPES:
        if args.only and not any(part in name for part in args.only.split(",")):
            continue
        torch.manual_seed(0)
        q, k = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v, dout = (torch.randn(b, n, h, dv, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        left, right = (window, window) if window is not None else (-1, 0 if causal else -1)
        kw = {}
        if extra == "alibi":
            kw["alibi_slopes"] = torch.rand(h, device="cuda", dtype=torch.float32) * 0.1
        if extra == "dropout":
            kw["dropout"] = DropoutArgs(0.1, 1234, 0)
        a = AttentionArgs(d ** -0.5, left, right, **kw)
        out, lse = attention_forward(q, k, v, a)
        fwd_ms = triton.testing.do_bench(lambda: attention_forward(q, k, v, a), warmup=25, rep=100,
                                         return_mode="median")
        useful = 2 * b * h * visible_pairs(n, n, causal, (left, right)) * (d + dv)
        results = {}
        for _ in range(2):
            for vname, fn in variants.items():
                ms = triton.testing.do_bench(lambda: fn(dout, q, k, v, out, lse, a), warmup=25, rep=100,
                                             return_mode="median")
                results.setdefault(vname, []).append(ms)
        grads = {vname: fn(dout, q, k, v, out, lse, a) for vname, fn in variants.items()}
        ref = grads["working tree"]
        diff = {vname: max(((g.float() - r.float()).abs().max() / r.float().abs().max()).item()
                           for g, r in zip(gs, ref)) for vname, gs in grads.items()}
        for vname, times in results.items():
            bwd_ms = min(times)
            row = dict(shape=name, variant=vname, fwd_ms=fwd_ms, bwd_ms_runs=times, bwd_ms=bwd_ms,
                       bwd_useful_tflops=2.5 * useful / bwd_ms * 1e-9,
                       fwd_bwd_useful_tflops=3.5 * useful / (fwd_ms + bwd_ms) * 1e-9,
                       max_rel_diff_vs_working_tree=diff[vname])
            rows.append(row)
            print(json.dumps(row), flush=True)
        grads = ref = None
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                       timespec="seconds"), torch=torch.__version__, triton=triton.__version__,
                       commit=os.environ.get("GENOFLASH_COMMIT", "unknown"), baseline=args.baseline_commit,
                       method="do_bench median (warmup 25, rep 100), two alternating runs per variant; bwd_ms is "
                              "the lower", rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
