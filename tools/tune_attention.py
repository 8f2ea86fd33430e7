"""Sweep tile configs for the attention kernels on the GPU; prints the best per pass.

A developer tool for filling genoflash/ops/attention/configs.py, not part of the package.
The forward is timed alone. For the backward, the dK/dV candidates are timed first (whole
backward, dQ at its current default), then the dQ candidates with the best dK/dV, so the
two passes are chosen one after the other. Stops starting new candidates after --budget s.

    python3 tools/tune_attention.py --set dv --budget 200 --json $OUT/tune.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import time

import torch
import triton
import triton.testing

from genoflash.ops.attention.args import AttentionArgs
from genoflash.ops.attention.backward import attention_backward
from genoflash.ops.attention.configs import (TileConfig, backward_config, forward_config,
                                             override_configs)
from genoflash.ops.attention.forward import attention_forward

# (batch, nheads, seqlen, d, dv, causal, window[, rotary table dtype or "dropout"])
SETS = {
    "core": [(1, 32, 16384, 64, 64, False, None), (1, 16, 16384, 128, 128, False, None),
             (1, 16, 16384, 128, 128, True, None), (2, 8, 8192, 256, 256, False, None)],
    "dv": [(1, 8, 16384, 64, 192, False, None), (1, 8, 16384, 128, 192, False, None),
           (1, 8, 16384, 192, 128, False, None)],
    "window": [(1, 8, 16384, 128, 128, False, (2048, 2048))],
    "rope": [(1, 16, 16384, 128, 128, False, None, torch.float32), (1, 16, 16384, 128, 128, False, None, torch.float16)],
    "dropout": [(1, 16, 16384, 128, 128, False, None, "dropout")],
    # The dK/dV pass alone at hd128 (it executes 533 / 465 TF/s non-causal / causal against the dQ
    # pass's 646 / 704; docs/design/attention-backward.md).
    "dkdv128": [(1, 16, 16384, 128, 128, False, None), (1, 16, 16384, 128, 128, True, None)],
    # RoPE's backward without register spills: at the tile table's 64x128 dK/dV and 128x64 s3 dQ
    # the sm_90 compile spills (104 / 34 stores with 16-bit tables, 264 / 48 with fp32;
    # offline_compile.py rope-bf16 128); these candidates compile without.
    # The masked dK/dV pass after it became one loop (ptxas no longer serialises its wgmma):
    # are the causal tiles (s2, chosen while it was serialised) still the best?
    "masked-dkdv": [(1, 16, 16384, 128, 128, True, None), (1, 8, 16384, 128, 128, False, (2048, 2048)),
                    (1, 32, 16384, 64, 64, True, None)],
    # (128, 192), whose fwd+bwd (347 TF/s) is the furthest below a bar of 425: the table's
    # dK/dV tile 32x128 w8 s2 spills 52 bytes at sm_90; these compile without spills (
    # offline_compile.py plain 128 192 --dkdv ...), untimed.
    "dv192": [(1, 8, 16384, 128, 192, False, None), (1, 8, 16384, 192, 128, False, None)],
    # (64, 192), Enformer's: fwd+bwd 372 TF/s against a bar of 380.
    "dv64": [(1, 8, 16384, 64, 192, False, None)],
    # V held as two channel groups (configs.value_blocks: 192 = 128 + 64, no padded channels):
    # the tiles chosen for the padded 256-wide V no longer bind. Candidates that compile at
    # sm_90 without spills and within shared memory (offline_compile.py).
    "dv-split": [(1, 8, 16384, 64, 192, False, None), (1, 8, 16384, 128, 192, False, None)],
    # hd256's backward, at half of SDPA flash's fwd+bwd in the papers' sweep: the
    # table's dK/dV tile (32x64, 4 warps) holds 2 x 64 x 256 float32 accumulators over 128 threads
    # and spills 1.5 KB at sm_90; with 8 warps 32x64 compiles without spills (offline_compile.py).
    "hd256": [(2, 8, 8192, 256, 256, False, None)],
    # Q/K's pass-through channels split in two groups too (922cd65: 192 = 128 + 64, 96 = 64 + 32);
    # the table's tiles for these were chosen with Q/K padded. Run at 8a2b967: its default dK/dV
    # list holds 32x64 w4 s3, which faults at hd 96 with both splits (tile_fault_probe.py) and
    # ended the run; qk-split-2 below is the set to use.
    "qk-split": [(1, 8, 16384, 192, 128, False, None), (2, 8, 8192, 192, 192, False, None),
                 (1, 16, 16384, 96, 96, False, None)],
    # The papers' sweep at N <= 1,024, where genoflash trails FA2: the long-N tiles
    # (3 stages, ~196 KB shared at hd128) fit one CTA per SM, so nothing hides a short program's
    # prologue and epilogue. Candidates with 2 stages or narrower tiles fit two.
    "small-n": [(32, 16, 512, 128, 128, False, None), (32, 16, 512, 128, 128, True, None),
                (32, 32, 512, 64, 64, True, None), (16, 8, 1024, 256, 256, False, None)],
    # hd256's backward, 8-14% behind SDPA flash in the sweep at 8a2b967: a wider search than
    # "hd256" above, over the tiles that compile at sm_90 without spills (offline_compile.py plain
    # 256: dK/dV 16x64 w8 s3/s4 229/238 regs, 32x64 w8 s4 197 KB shared; 16-warp and
    # 128-key tiles spill; dQ 128x32 w8 s3/s4, 64x32 w4 s4, 32x64 w4 s3, 64x64 w8 s3), at the
    # sweep's N8192 (both masks) and N1024.
    # hd256's forward over the papers' sweep lengths (16k tokens per batch, H8), where it trailed FA2
    # at N = 512 (260 against 285 TF/s) and level at 1,024 with the table's 64x64 w4 s3 (196 KB of
    # shared memory: one 4-warp CTA per SM).
    "hd256-fwd": [(b, 8, n, 256, 256, c, None) for n, b in ((512, 32), (1024, 16), (8192, 2)) for c in (False, True)],
    "hd256-2": [(2, 8, 8192, 256, 256, False, None), (2, 8, 8192, 256, 256, True, None),
                (16, 8, 1024, 256, 256, False, None)],
    # hd128's dK/dV pass is latency-bound in its one 8-warp CTA per SM (255 registers, 161 KB
    # shared; ncu). One-warpgroup tiles with 64 keys fit two CTAs per SM (registers
    # 205-255, shared 49-83 KB at sm_90, offline_compile.py plain 128 --dkdv ...), whose
    # independent instruction streams the schedulers can interleave.
    "dkdv-2cta": [(1, 16, 16384, 128, 128, False, None), (1, 16, 16384, 128, 128, True, None),
                  (1, 8, 65536, 128, 128, False, None)],
    # The forward at the papers' sweep's short N (16k tokens per batch, hidden 2048). At N = 512 the
    # hd64 causal point is GPU-bound, not host-bound (attention_host_probe.py and bwd_profile.py,
    # forward 0.261 ms, 132 TF/s executed), and small-n's run (8a2b967) had hd64 causal
    # 64x64 w4 s3 at 0.159 ms against the table's 128x64 w8 s3 at 0.261. Where does that stop?
    "short-fwd": [(b, h, n, d, d, c, None) for d, h in ((64, 32), (128, 16)) for n, b in ((512, 32), (1024, 16),
                  (2048, 8), (4096, 4)) for c in (False, True)],
    "short-bwd64": [(32, 32, 512, 64, 64, c, None) for c in (False, True)]
    + [(16, 32, 1024, 64, 64, c, None) for c in (False, True)],
    # Where the short-sequence tiles at head dims <= 64 (configs.SHORT_FORWARD_SEQLEN_64 and
    # SHORT_BACKWARD_SEQLEN_64) should stop: the hd64 backward's tiles at N 2k and 4k, the causal
    # forward's at 8k and 16k.
    "short-limits": [(b, 32, n, 64, 64, c, None) for n, b in ((2048, 8), (4096, 4)) for c in (False, True)]
    + [(2, 32, 8192, 64, 64, True, None), (1, 32, 16384, 64, 64, True, None)],
    # The same shapes, each default beside the candidates that won (or were cut off by a fault)
    # in the qk-split run at 8a2b967, whose lists lacked the defaults.
    "qk-split-2": [(1, 8, 16384, 192, 128, False, None), (2, 8, 8192, 192, 192, False, None),
                   (1, 16, 16384, 96, 96, False, None)],
    "rope-spills": [(1, 16, 16384, 128, 128, False, None, torch.float16),
                    (1, 16, 16384, 128, 128, False, None, torch.float32)],
}
FWD = [TileConfig(*c) for c in [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (64, 128, 8, 3),
                                (128, 32, 8, 3)]]
DKDV = [TileConfig(*c) for c in [(32, 128, 4, 3), (64, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3), (64, 64, 8, 3),
                                 (32, 128, 8, 2)]]
DQ = [TileConfig(*c) for c in [(128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 8, 3), (64, 32, 4, 3), (64, 64, 8, 2)]]
# RoPE streams cos/sin tiles beside K (or Q): fewer stages or narrower tiles to fit shared memory.
CANDIDATES = {
    "rope-spills": ([], [TileConfig(*c) for c in [(64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 8, 3)]],
                    [TileConfig(*c) for c in [(128, 64, 8, 3), (128, 64, 8, 2), (128, 32, 8, 3)]]),
    "dkdv128": ([], [TileConfig(*c) for c in [(64, 128, 8, 3), (64, 128, 8, 2), (32, 128, 8, 3), (32, 128, 8, 2)]],
                []),
    "dkdv-2cta": ([], [TileConfig(*c) for c in [(64, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 2), (32, 64, 4, 3),
                                                (16, 64, 4, 3), (16, 64, 4, 2)]], []),
    "short-fwd": ([TileConfig(*c) for c in [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (64, 64, 4, 2),
                                            (64, 128, 4, 3)]], [], []),
    "short-limits": ([TileConfig(*c) for c in [(128, 64, 8, 3), (64, 64, 4, 3)]],
                     [TileConfig(*c) for c in [(32, 128, 4, 3), (32, 64, 4, 3)]],
                     [TileConfig(*c) for c in [(128, 64, 8, 3), (64, 64, 4, 3)]]),
    "short-bwd64": ([], [TileConfig(*c) for c in [(32, 128, 4, 3), (32, 64, 4, 2), (32, 64, 4, 3), (64, 64, 4, 2)]],
                    [TileConfig(*c) for c in [(128, 64, 8, 3), (128, 32, 4, 2), (64, 64, 4, 3), (64, 32, 4, 3)]]),
    "dv192": ([], [TileConfig(*c) for c in [(16, 128, 8, 3), (32, 128, 8, 2), (16, 128, 8, 4), (16, 128, 8, 2)]],
              [TileConfig(*c) for c in [(64, 64, 4, 3), (128, 32, 8, 3), (64, 64, 4, 4), (64, 32, 4, 3),
                                        (64, 128, 8, 3)]]),
    "dv64": ([TileConfig(*c) for c in [(128, 64, 8, 3), (128, 64, 8, 4), (128, 32, 8, 4)]],
             [TileConfig(*c) for c in [(32, 64, 4, 3), (32, 64, 4, 4), (32, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 2),
                                       (16, 64, 4, 3), (16, 128, 8, 3)]],
             [TileConfig(*c) for c in [(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (64, 64, 4, 4),
                                       (128, 32, 8, 4)]]),
    "dv-split": ([TileConfig(*c) for c in [(128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (64, 128, 8, 3)]],
                 [TileConfig(*c) for c in [(16, 128, 8, 3), (32, 128, 8, 3), (32, 128, 8, 2), (64, 128, 8, 3),
                                           (32, 64, 4, 3)]],
                 [TileConfig(*c) for c in [(64, 64, 4, 3), (128, 64, 8, 3), (128, 32, 8, 3), (128, 128, 8, 2),
                                           (128, 64, 8, 2)]]),
    "hd256": ([], [TileConfig(*c) for c in [(32, 64, 8, 3), (32, 64, 8, 2), (32, 64, 4, 3)]],
              [TileConfig(*c) for c in [(64, 32, 8, 3), (64, 64, 8, 2), (64, 32, 4, 3)]]),
    "hd256-fwd": ([TileConfig(*c) for c in [(64, 64, 4, 3), (64, 64, 4, 2), (64, 32, 4, 3), (64, 32, 4, 2),
                                            (128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 8, 3)]], [], []),
    "hd256-2": ([], [TileConfig(*c) for c in [(32, 64, 8, 3), (32, 64, 8, 4), (16, 64, 8, 3), (16, 64, 8, 4)]],
                [TileConfig(*c) for c in [(64, 32, 4, 3), (64, 32, 4, 4), (128, 32, 8, 3), (128, 32, 8, 4),
                                          (32, 64, 4, 3), (64, 64, 8, 3)]]),
    "small-n": ([TileConfig(*c) for c in [(128, 64, 8, 3), (128, 64, 8, 2), (128, 64, 4, 2), (64, 64, 4, 2),
                                          (64, 64, 4, 3), (128, 128, 8, 2), (128, 32, 4, 2)]],
                [TileConfig(*c) for c in [(64, 128, 8, 3), (64, 128, 8, 2), (64, 64, 4, 2), (32, 64, 4, 2),
                                          (32, 128, 4, 2), (64, 64, 8, 2)]],
                [TileConfig(*c) for c in [(128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 2), (64, 32, 4, 2),
                                          (128, 32, 4, 2)]]),
    # 32x64 w4 s3 is left out of dK/dV: at hd 96 with both channel splits it faulted (an illegal
    # memory access at N >= 4,096, not under compute-sanitizer; docs/design/tile-configs.md).
    "qk-split-2": ([TileConfig(*c) for c in [(128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 3)]],
                   [TileConfig(*c) for c in [(16, 128, 8, 3), (32, 64, 8, 3), (32, 128, 8, 2), (64, 128, 8, 3),
                                             (64, 64, 8, 3)]],
                   [TileConfig(*c) for c in [(64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3), (128, 32, 8, 3)]]),
    "masked-dkdv": ([], [TileConfig(*c) for c in [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 3), (32, 128, 4, 3),
                                                  (32, 64, 4, 3)]], []),
    "dropout": ([TileConfig(*c) for c in [(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (64, 128, 8, 3)]],
                [TileConfig(*c) for c in [(64, 128, 8, 3), (64, 128, 8, 2), (32, 128, 8, 3), (64, 64, 8, 3)]],
                [TileConfig(*c) for c in [(128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3)]]),
    "rope": ([TileConfig(*c) for c in [(128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3)]],
             [TileConfig(*c) for c in [(64, 128, 8, 2), (32, 128, 8, 3), (64, 64, 8, 3), (64, 128, 8, 3),
                                       (32, 64, 4, 3)]],
             [TileConfig(*c) for c in [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 8, 3)]]),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", default="core", help="comma-separated: " + ", ".join(SETS))
    parser.add_argument("--budget", type=float, default=240.0, help="seconds before no new candidate starts")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    start = time.time()
    results = []

    def bench(shape, pass_name, cfg, fn, fwd_cfg=None, bwd_cfg=None, reference=None):
        """Time fn under the forced tiles. With reference (the default tiles' outputs), also the
        largest difference from it relative to its largest magnitude, so that a candidate whose
        compiled kernel computes something else shows before it is chosen."""
        if time.time() - start > args.budget:
            return None
        try:
            with override_configs(fwd_cfg, bwd_cfg):
                ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                got = fn() if reference is not None else None
        except Exception as exc:  # out of shared memory or registers: not a candidate
            results.append(dict(shape=shape, pass_=pass_name, cfg=vars(cfg), error=str(exc)[:120]))
            return None
        row = dict(shape=shape, pass_=pass_name, cfg=vars(cfg), ms=ms)
        if got is not None:
            row["max_rel_diff_vs_default"] = max(((g.float() - r.float()).abs().max() / r.float().abs().max()).item()
                                                 for g, r in zip(got, reference))
        results.append(row)
        print(f"{shape} {pass_name:5s} {cfg.block_m:3d}x{cfg.block_n:<3d} w{cfg.num_warps} s{cfg.num_stages}: "
              f"{ms:8.3f} ms" + (f"  diff {row['max_rel_diff_vs_default']:.1e}" if got is not None else ""),
              flush=True)
        return ms

    for set_name in args.set.split(","):
        fwd_candidates, dkdv_candidates, dq_candidates = CANDIDATES.get(set_name, (FWD, DKDV, DQ))
        for shape in SETS[set_name]:
            b, h, n, d, dv, causal, window = shape[:7]
            tables = {}
            if len(shape) > 7 and shape[7] == "dropout":
                from genoflash.ops.attention.dropout import DropoutArgs
                tables = dict(dropout=DropoutArgs(0.1, 1234, 0))
            elif len(shape) > 7:
                from genoflash.ops.rotary import rotary_tables
                cos, sin = rotary_tables(n, d, device="cuda", dtype=shape[7])
                tables = dict(rotary_cos=cos, rotary_sin=sin)
                shape = (*shape[:7], str(shape[7]))
            q, k = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            v, dout = (torch.randn(b, n, h, dv, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            left, right = window or (-1, -1)
            a = AttentionArgs(d ** -0.5, left, 0 if causal else right, **tables)
            out, lse = attention_forward(q, k, v, a)
            has_dropout = a.dropout is not None
            default_bwd = backward_config(d, dv, a.causal_only, q.dtype, q.device, a.rotary_table_bytes, has_dropout, n)
            default_fwd = forward_config(d, dv, a.causal_only, q.dtype, q.device, a.rotary_table_bytes, has_dropout, n)
            print(f"{shape} defaults: fwd {default_fwd} bwd {default_bwd}")
            for cfg in fwd_candidates:
                bench(shape, "fwd", cfg, lambda: attention_forward(q, k, v, a), fwd_cfg=cfg)
            backward = lambda: attention_backward(dout, q, k, v, out, lse, a)  # noqa: E731
            reference = backward()
            timed = [(bench(shape, "dkdv", c, backward, bwd_cfg=dataclasses.replace(default_bwd, dkdv=c),
                            reference=reference), c)
                     for c in dkdv_candidates]
            timed = [t for t in timed if t[0] is not None]
            best_dkdv = min(timed, key=lambda t: t[0])[1] if timed else default_bwd.dkdv
            for cfg in dq_candidates:
                bench(shape, "dq", cfg, backward, bwd_cfg=dataclasses.replace(default_bwd, dkdv=best_dkdv, dq=cfg),
                      reference=reference)
            # Dropped before the next shape's tensors exist (the lambdas above are done with them).
            q = k = v = dout = out = lse = reference = None
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now(
                datetime.timezone.utc).isoformat(timespec="seconds"), git_commit=os.environ.get("GENOFLASH_COMMIT"),
                torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
                method="do_bench median (warmup 25, rep 100); dkdv and dq rows time the whole backward",
                results=results), fh, indent=1)
    best = {}
    for r in results:
        key = (str(r["shape"]), r["pass_"])
        if "ms" in r and (key not in best or r["ms"] < best[key]["ms"]):
            best[key] = r
    for key, r in sorted(best.items()):
        print("BEST", key, r["cfg"], f"{r['ms']:.3f} ms")


if __name__ == "__main__":
    main()
