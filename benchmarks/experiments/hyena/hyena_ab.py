"""Experiment: same-process A/B of the Hyena layer between two genoflash trees (GPU only).
(docs/design/hyena.md cites its results.)

At 16k tokens the layer is bound by host time, and that time moves by +-20% from one process to
the next on the device machine: runs of `bench mixers`
on the same code read 3.6 to 5.3 ms. Two trees timed in separate processes therefore compare
nothing. This probe imports both in one process and alternates them round by round, so that a
process's luck falls on both alike.

The baseline tree is a copy of the package under another name, e.g. from the repo root:
    mkdir -p .carry/ab && git archive REV genoflash | tar -x -C .carry/ab --transform 's/^genoflash/genoflash_base/'
    python benchmarks/experiments/hyena/hyena_ab.py --baseline-path .carry/ab --out ab.json
(genoflash imports itself relatively throughout, so the renamed copy is self-contained.)

Per round and tree, two figures at each N: `do_bench` (the median of 50 L2-flushed calls, as
`bench mixers` reports) and `back_to_back` (30 calls issued without a synchronisation in
between, divided by 30: the rate when the host is the bottleneck).
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time

import torch


def timed(step, calls: int = 30) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline-path", required=True, help="folder that holds the renamed package")
    parser.add_argument("--baseline-package", default="genoflash_base")
    parser.add_argument("--seqlens", default="16384,65536")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--labels", default="new,baseline", help="names for (genoflash, the baseline) in the output")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from triton.testing import do_bench

    sys.path.insert(0, args.baseline_path)
    from genoflash.bench.common import run_metadata
    # Each tree's `bench.mixers.build`, the layer `bench mixers` times.
    trees = dict(zip(args.labels.split(","), (importlib.import_module(pkg + ".bench.mixers")
                                              for pkg in ("genoflash", args.baseline_package))))
    device = torch.device("cuda")
    results = []
    for n in (int(s) for s in args.seqlens.split(",")):
        steps = {}
        for label, mixers in trees.items():
            torch.manual_seed(0)
            # `build`, not `mixers.layer_step`: trees older than 835859d have only the former.
            layer = mixers.build("hyena", args.d_model, n, device, torch.bfloat16)
            x = torch.randn(1, n, args.d_model, device=device, dtype=torch.bfloat16, requires_grad=True)
            dy = torch.randn_like(x)
            params = [x, *layer.parameters()]

            def step(layer=layer, x=x, dy=dy, params=params):
                torch.autograd.grad(layer(x), params, dy)

            for _ in range(3):
                step()
            steps[label] = step
        rounds = []
        for r in range(args.rounds):
            order = list(steps) if r % 2 == 0 else list(reversed(steps))  # neither tree always goes first
            row = {}
            for label in order:
                row[label] = {"do_bench_ms": do_bench(steps[label], warmup=5, rep=50, return_mode="median"),
                              "back_to_back_ms": timed(steps[label])}
            rounds.append(row)
            print(f"N={n:,} round {r}: " + "  ".join(f"{k} {v['do_bench_ms']:.2f} / {v['back_to_back_ms']:.2f}"
                                                       for k, v in row.items()), flush=True)
        summary = {label: {key: statistics.median(row[label][key] for row in rounds)
                           for key in ("do_bench_ms", "back_to_back_ms")} for label in steps}
        print(f"N={n:,} medians (do_bench / back-to-back ms): " +
              "  ".join(f"{k} {v['do_bench_ms']:.2f} / {v['back_to_back_ms']:.2f}" for k, v in summary.items()),
              flush=True)
        results.append({"seqlen": n, "d_model": args.d_model, "rounds": rounds, "medians": summary})
    with open(args.out, "w") as f:
        json.dump({"metadata": run_metadata(method="hyena layer fwd+bwd, B1, bf16, both trees in one process, "
                                            "alternating rounds", trees={k: v.__file__ for k, v in trees.items()}),
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
