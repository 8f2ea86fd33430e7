"""Sweep tile configs for the attention kernels on the GPU; prints the best per pass.

A developer tool for filling genoflash/ops/attention/configs.py, not part of the package.
Each pass (forward, dK/dV, dQ) is timed alone through its launcher, so the best config
of each can be picked independently. Stops starting new candidates after --budget seconds.

    python3 benchmarks/tune_attention.py --budget 200 --json $OUT/tune.json
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import time

import torch
import triton.testing

from genoflash.ops.attention.backward import attention_backward
from genoflash.ops.attention.configs import (BackwardConfig, TileConfig, backward_config, forward_config,
                                             override_configs)
from genoflash.ops.attention.forward import attention_forward

# (batch, nheads, seqlen, headdim, causal): the genomic shapes of the benchmark.
SHAPES = [(1, 32, 16384, 64, False), (1, 16, 16384, 128, False), (1, 16, 16384, 128, True),
          (2, 8, 8192, 256, False)]
FWD = [TileConfig(m, n, w, s) for m, n, w, s in
       [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3),
        (64, 128, 4, 2)]]
DKDV = [TileConfig(m, n, w, s) for m, n, w, s in
        [(32, 128, 4, 3), (64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 3), (64, 128, 8, 2)]]
DQ = [TileConfig(m, n, w, s) for m, n, w, s in
      [(128, 32, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3), (128, 64, 8, 2)]]


def flops(b, h, n, d, causal):
    return 4 * b * h * n * n * d / (2 if causal else 1)


def time_ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=240.0, help="seconds before no new candidate starts")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    start = time.time()
    results = []
    for b, h, n, d, causal in SHAPES:
        q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        scale = d ** -0.5
        out, lse = attention_forward(q, k, v, scale, causal)
        f = flops(b, h, n, d, causal)
        default_bwd = backward_config(d, causal, q.dtype, q.device)
        passes = [("fwd", FWD, lambda c: (c, None), lambda: attention_forward(q, k, v, scale, causal), 1.0),
                  ("dkdv", DKDV, lambda c: (None, BackwardConfig(c, default_bwd.dq)),
                   lambda: attention_backward(dout, q, k, v, out, lse, scale, causal), 2.5),
                  ("dq", DQ, lambda c: (None, BackwardConfig(default_bwd.dkdv, c)),
                   lambda: attention_backward(dout, q, k, v, out, lse, scale, causal), 2.5)]
        for name, candidates, as_override, fn, flop_factor in passes:
            for cfg in candidates:
                if time.time() - start > args.budget:
                    break
                fwd_cfg, bwd_cfg = as_override(cfg)
                try:
                    with override_configs(fwd_cfg, bwd_cfg):
                        ms = time_ms(fn)
                except Exception as exc:  # out of shared memory or registers: not a candidate
                    results.append(dict(shape=[b, h, n, d, causal], pass_=name, cfg=vars(cfg), error=str(exc)[:120]))
                    continue
                tflops = flop_factor * f / ms * 1e-9
                results.append(dict(shape=[b, h, n, d, causal], pass_=name, cfg=vars(cfg), ms=ms, tflops=tflops))
                print(f"{(b, h, n, d, causal)} {name:5s} {cfg.block_m:3d}x{cfg.block_n:<3d} w{cfg.num_warps} "
                      f"s{cfg.num_stages}: {ms:7.3f} ms {tflops:6.1f} TF/s", flush=True)
        print(f"default fwd {forward_config(d, causal, q.dtype, q.device)}  bwd {default_bwd}", flush=True)
        del q, k, v, dout, out, lse
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now(
                datetime.timezone.utc).isoformat(timespec="seconds"), git_commit=os.environ.get("GENOFLASH_COMMIT"),
                torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda, results=results),
                fh, indent=1)
    # Best per (shape, pass), last, for the output tail.
    for key, group in itertools.groupby(sorted((r for r in results if "ms" in r),
                                               key=lambda r: (str(r["shape"]), r["pass_"], r["ms"])),
                                        key=lambda r: (str(r["shape"]), r["pass_"])):
        best = next(group)
        print("BEST", key, best["cfg"], f"{best['ms']:.3f} ms")


if __name__ == "__main__":
    main()
