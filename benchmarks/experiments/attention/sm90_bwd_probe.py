"""Experiment: the Gluon one-pass backward for Hopper (ops/attention/backward_sm90.py) against the Triton
two-pass backward, on one GPU, same inputs.

1. Correctness at small, odd sizes: each backward's gradients against a float64 reference, beside
   the error of standard attention computed in the same dtype (the project's rule: genoflash's
   error <= 2x that + eps).
2. Time: the backward alone (do_bench median, two alternating runs) on the genomic shapes and
   hd256 points of the papers' sweep, with fwd+bwd TF/s by the standard formula (3.5x the
   forward's 4·B·H·N²·D, halved when causal), and cuDNN's and FA2's (SDPA's flash backend) fwd+bwd
   in the same process.

    python benchmarks/experiments/attention/sm90_bwd_probe.py --out X.json [--skip-time] [--only NAMES] [--head-dim 64]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os

import torch
import triton
import triton.testing

from genoflash.ops.attention.args import AttentionArgs
from genoflash.ops.attention.backward import attention_backward
from genoflash.ops.attention import backward_sm90
from genoflash.ops.attention.configs import override_configs
from genoflash.ops.attention.forward import attention_forward
from genoflash.ops.attention.reference import attention_reference

# (batch, seqlen_q, seqlen_k, nheads, nheads_k, d, causal)
CHECKS = [
    (2, 17, 17, 4, 4, 128, False), (1, 1, 1, 2, 2, 128, False), (1, 129, 129, 2, 2, 128, True),
    (2, 1000, 1000, 2, 2, 128, True), (1, 1000, 777, 4, 2, 128, True), (1, 300, 1200, 2, 2, 128, True),
    (1, 300, 1200, 2, 2, 128, False), (1, 1200, 300, 2, 2, 128, True), (1, 1000, 1000, 4, 1, 128, False),
    (3, 257, 513, 2, 2, 128, False), (1, 2048, 2048, 2, 2, 128, True),
]
# (name, batch, nheads, seqlen, d, causal)
TIMED = [
    ("H16 N16k hd128", 1, 16, 16384, 128, False),
    ("H16 N16k hd128 causal", 1, 16, 16384, 128, True),
    ("H8 N64k hd128", 1, 8, 65536, 128, False),
    ("H32 N16k hd64", 1, 32, 16384, 64, False),
    ("B8 H16 N2k hd128", 8, 16, 2048, 128, False),
    ("B8 H16 N2k hd128 causal", 8, 16, 2048, 128, True),
    # hd256: the papers' sweep (16k tokens per batch, hidden 2048), where FA2 led the two passes
    ("B2 H8 N8k hd256", 2, 8, 8192, 256, False),
    ("B2 H8 N8k hd256 causal", 2, 8, 8192, 256, True),
    ("B1 H8 N16k hd256", 1, 8, 16384, 256, False),
    ("B8 H8 N2k hd256", 8, 8, 2048, 256, False),
    ("B8 H8 N2k hd256 causal", 8, 8, 2048, 256, True),
    ("B32 H8 N512 hd256", 32, 8, 512, 256, False),
    ("B32 H8 N512 hd256 causal", 32, 8, 512, 256, True),
]


def _sm90(dout, q, k, v, out, lse, a):
    assert backward_sm90.applies(q, k, v, dout, out, a)
    return backward_sm90.attention_backward_sm90(dout, q, k, v, out, lse, a)


def _err(x, ref):
    return (x.double() - ref).abs().max().item()


def check(rows, head_dim=128):
    for b, sq, sk, h, hk, _, causal in CHECKS:
        d = head_dim
        torch.manual_seed(sq * 7 + sk)
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        dout = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        a = AttentionArgs(d ** -0.5, -1, 0 if causal else -1, deterministic=False)
        out, lse = attention_forward(q, k, v, a)
        q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
        kx, vx = (t.repeat_interleave(h // hk, dim=2) for t in (k64, v64))
        ref_out, _ = attention_reference(q64, kx, vx, d ** -0.5, causal=causal)
        ref = torch.autograd.grad(ref_out, (q64, k64, v64), dout.double())
        qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
        std_out, _ = attention_reference(qs, ks.repeat_interleave(h // hk, dim=2),
                                         vs.repeat_interleave(h // hk, dim=2), d ** -0.5, causal=causal)
        std = torch.autograd.grad(std_out, (qs, ks, vs), dout)
        two = attention_backward(dout, q, k, v, out, lse, dataclasses.replace(a, deterministic=True))
        one = _sm90(dout, q, k, v, out, lse, a)
        row = dict(check=[b, sq, sk, h, hk, d, causal])
        for name, g, r, s, t in zip("qkv", one, ref, std, two):
            row[f"d{name}"] = dict(sm90=_err(g, r), two_pass=_err(t, r), standard_bf16=_err(s, r),
                                   nan=bool(torch.isnan(g).any()))
        row["ok"] = all(row[f"d{n}"]["sm90"] <= 2 * row[f"d{n}"]["standard_bf16"] + 1e-3 and not row[f"d{n}"]["nan"]
                        for n in "qkv")
        rows.append(row)
        print(json.dumps(row), flush=True)


def time(rows, only=None):
    for name, b, h, n, d, causal in TIMED:
        if only and not any(part == name for part in only.split(",")):
            continue
        if d not in backward_sm90.TILES:
            continue
        torch.manual_seed(0)
        q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        a = AttentionArgs(d ** -0.5, -1, 0 if causal else -1, deterministic=False)
        out, lse = attention_forward(q, k, v, a)
        fwd = triton.testing.do_bench(lambda: attention_forward(q, k, v, a), warmup=25, rep=100,
                                      return_mode="median")
        a_det = dataclasses.replace(a, deterministic=True)
        fns = {"two-pass": lambda: attention_backward(dout, q, k, v, out, lse, a_det)}
        fns["sm90"] = lambda: _sm90(dout, q, k, v, out, lse, a)
        times = {}
        for _ in range(2):
            for vname, fn in fns.items():
                times.setdefault(vname, []).append(triton.testing.do_bench(fn, warmup=25, rep=100,
                                                                           return_mode="median"))
        g1 = fns["two-pass"]()
        diffs = {vname: max(((x.float() - y.float()).abs().max() / y.float().abs().max()).item()
                            for x, y in zip(fn(), g1)) for vname, fn in fns.items()}
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
        dt = dout.transpose(1, 2)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                torch.autograd.grad(o, (qt, kt, vt), dt)
        cudnn_ms = triton.testing.do_bench(cudnn, warmup=25, rep=100, return_mode="median")

        def fa2():  # SDPA's flash backend: the papers' sweep's peer
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                torch.autograd.grad(o, (qt, kt, vt), dt)
        fa2_ms = triton.testing.do_bench(fa2, warmup=25, rep=100, return_mode="median")
        for vname, ts in times.items():
            bwd = min(ts)
            row = dict(shape=name, variant=vname, fwd_ms=fwd, bwd_ms_runs=ts, bwd_ms=bwd,
                       fwd_bwd_tflops=3.5 * flops / (fwd + bwd) * 1e-9, max_rel_diff_vs_two_pass=diffs[vname],
                       cudnn_fwd_bwd_tflops=3.5 * flops / cudnn_ms * 1e-9,
                       sdpa_flash_fwd_bwd_tflops=3.5 * flops / fa2_ms * 1e-9)
            rows.append(row)
            print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-time", action="store_true")
    ap.add_argument("--only", help="time only these shapes (names, comma-separated)")
    ap.add_argument("--head-dim", type=int, default=128, choices=sorted(backward_sm90.TILES),
                    help="the checks' head dim")
    args = ap.parse_args()
    rows = []
    # The checks run the kernel at small sizes, which the dispatch keeps from it.
    with override_configs(sm90_min_seqlen=0):
        check(rows, args.head_dim)
        if not args.skip_time:
            time(rows, args.only)
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                       timespec="seconds"), torch=torch.__version__, triton=triton.__version__,
                       commit=os.environ.get("GENOFLASH_COMMIT", "unknown"), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
