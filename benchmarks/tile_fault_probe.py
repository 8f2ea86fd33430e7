"""Run one attention fwd+bwd at forced tiles and compare its gradients with the torch backend's
(a research probe, GPU only). Each run is a separate process, since an illegal memory access
leaves the CUDA context unusable; compute-sanitizer can run it too.

Found by tune_attention.py --set qk-split (2026-11-30): at hd 96 (Q/K and V split 64 + 32) the
dK/dV candidate 32x64 w4 s3 ended the process with an illegal memory access. This probe showed
it at N >= 4,096 with H16 (N16k with H4), not causal, only with both splits; under
compute-sanitizer (memcheck, racecheck) it ran clean and correct, so the fault depends on
timing (results/h200-2026-11-30-tile-fault-probe-hd96.log).

    python benchmarks/tile_fault_probe.py --headdim 96 --dkdv 32,64,4,3 [--split on|off] [--dq ...]
"""
from __future__ import annotations

import argparse
import dataclasses

import torch

import genoflash
from genoflash.backends import use_backend
from genoflash.ops.attention.configs import TileConfig, backward_config, override_configs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--nheads", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--headdim", type=int, default=96)
    ap.add_argument("--headdim-v", type=int, default=None)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dkdv", default=None, help="BM,BN,WARPS,STAGES")
    ap.add_argument("--dq", default=None)
    ap.add_argument("--split", choices=("on", "off", "default"), default="default")
    args = ap.parse_args()
    b, h, n, d, dv = args.batch, args.nheads, args.seqlen, args.headdim, args.headdim_v or args.headdim
    torch.manual_seed(0)
    q, k = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    v = torch.randn(b, n, h, dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(b, n, h, dv, device="cuda", dtype=torch.bfloat16)
    cfg = backward_config(d, dv, args.causal, q.dtype, q.device)
    if args.dkdv:
        cfg = dataclasses.replace(cfg, dkdv=TileConfig(*map(int, args.dkdv.split(","))))
    if args.dq:
        cfg = dataclasses.replace(cfg, dq=TileConfig(*map(int, args.dq.split(","))))
    split = None if args.split == "default" else args.split == "on"
    with override_configs(backward=cfg, split_channels=split):
        out = genoflash.flash_attn_func(q, k, v, causal=args.causal)
        got = torch.autograd.grad(out, (q, k, v), dout)
        torch.cuda.synchronize()
    with use_backend("torch"):
        ref = torch.autograd.grad(genoflash.flash_attn_func(q, k, v, causal=args.causal), (q, k, v), dout)
    errs = [((g.float() - r.float()).abs().max() / r.float().abs().max()).item() for g, r in zip(got, ref)]
    print(f"d={d} dv={dv} split={args.split} {cfg.dkdv} {cfg.dq}: rel err dq {errs[0]:.1e} dk {errs[1]:.1e} "
          f"dv {errs[2]:.1e}", flush=True)


if __name__ == "__main__":
    main()
