"""`genoflash scale attention`: million-token attention on one GPU, checked on sampled rows.

A full reference does not fit at these lengths, so correctness is checked on `--rows`
randomly sampled query rows: their outputs, and the gradients of a loss that only those rows
feed (dq on those rows, dk and dv everywhere), against an exact float32 computation that
streams over the keys in chunks (`sampled_rows_attention`). Reports time and peak memory.

    genoflash scale attention --seqlen 1048576 --backward     # fwd+bwd at 1M, H=8, D=128
    genoflash scale attention --seqlen 4194304                # forward at 4M
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import time
from pathlib import Path

import torch

from .. import flash_attn_func


def sampled_rows_attention(q_rows: torch.Tensor, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           seqlen_q: int, causal: bool, softmax_scale: float, chunk: int = 65536) -> torch.Tensor:
    """Exact attention for a few query rows (batch, R, nheads, dim) in q_rows' dtype precision
    (fp32 or fp64), streaming over keys in chunks so no (R, seqlen_k) matrix is larger than a chunk.
    Differentiable, so sampled-loss gradients come from autograd."""
    acc = q_rows.dtype
    shift = k.shape[1] - seqlen_q

    def chunk_scores(k0: int) -> torch.Tensor:
        s = torch.einsum("brhd,bkhd->bhrk", q_rows, k[:, k0:k0 + chunk].to(acc)) * softmax_scale
        if causal:
            j = torch.arange(k0, k0 + s.shape[-1], device=k.device)
            s = s.masked_fill(j[None, :] > rows[:, None] + shift, float("-inf"))
        return s

    starts = range(0, k.shape[1], chunk)
    # Pass 1: the row max (a constant for the gradient, so no graph is kept for it).
    with torch.no_grad():
        row_max = torch.stack([chunk_scores(k0).amax(-1) for k0 in starts]).amax(0)
    row_max = row_max.masked_fill(torch.isinf(row_max), 0.0)[..., None]
    # Pass 2: normaliser and un-normalised output, one key chunk at a time.
    total, out = 0.0, 0.0
    for k0 in starts:
        p = torch.exp(chunk_scores(k0) - row_max)
        total = total + p.sum(-1)
        out = out + torch.einsum("bhrk,bkhd->brhd", p, v[:, k0:k0 + chunk].to(acc))
    return out / total.clamp_min(1e-30).transpose(1, 2)[..., None]


def check_sampled(q, k, v, causal: bool, n_rows: int, backward: bool, seed: int = 0) -> dict:
    """Run genoflash once (timed, peak memory) and compare sampled rows with the fp32 reference."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = torch.randperm(q.shape[1], generator=gen)[:n_rows].sort().values.to(q.device)
    scale = q.shape[-1] ** -0.5
    dout_rows = torch.randn(q.shape[0], n_rows, *q.shape[2:], generator=gen).to(q.device, q.dtype)
    if backward:
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    out = flash_attn_func(q, k, v, causal=causal)
    torch.cuda.synchronize()
    fwd_s = time.perf_counter() - start
    rec = {"fwd_s": fwd_s}
    if backward:
        dout = torch.zeros_like(out)
        dout[:, rows] = dout_rows
        start = time.perf_counter()
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        torch.cuda.synchronize()
        rec["bwd_s"] = time.perf_counter() - start
    rec["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30

    q32, k32, v32 = (t.detach().float().requires_grad_(backward) for t in (q, k, v))
    ref = sampled_rows_attention(q32[:, rows], rows, k32, v32, q.shape[1], causal, scale)
    errors = {"out": _rel(out[:, rows], ref)}
    if backward:
        rq, rk, rv = torch.autograd.grad(ref, (q32, k32, v32), dout_rows.float())
        errors.update(dq=_rel(dq[:, rows], rq[:, rows]), dk=_rel(dk, rk), dv=_rel(dv, rv))
    rec["rel_errors_vs_fp32"] = errors
    return rec


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="genoflash scale attention", description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["attention"])
    parser.add_argument("--seqlen", type=int, default=1 << 20)
    parser.add_argument("--nheads", type=int, default=8)
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--backward", action="store_true", help="also run and check the backward")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("genoflash scale needs a CUDA GPU", flush=True)
        return 2
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, args.seqlen, args.nheads, args.headdim, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    rec = check_sampled(q, k, v, args.causal, args.rows, args.backward)
    now = datetime.datetime.now(datetime.timezone.utc)
    import triton
    rec = {"seqlen": args.seqlen, "nheads": args.nheads, "headdim": args.headdim, "causal": args.causal,
           "backward": args.backward, "rows_checked": args.rows, **rec,
           "metadata": {"device": torch.cuda.get_device_name(), "date": now.isoformat(timespec="seconds"),
                        "git_commit": os.environ.get("GENOFLASH_COMMIT") or subprocess.run(
                            ["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
                        "torch": torch.__version__, "triton": triton.__version__, "dtype": "bf16"}}
    print(json.dumps({k: v for k, v in rec.items() if k != "metadata"}), flush=True)
    slug = torch.cuda.get_device_name().lower().replace("nvidia", "").strip().replace(" ", "-")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{slug}-{now:%Y-%m-%d}-scale-N{args.seqlen}{'-causal' if args.causal else ''}" \
                      f"{'-fwdbwd' if args.backward else '-fwd'}.json"
    path.write_text(json.dumps(rec, indent=1))
    print(f"wrote {path}", flush=True)
    return 0
