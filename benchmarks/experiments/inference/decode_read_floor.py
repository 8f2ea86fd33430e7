"""Probe: how fast can K and V be read at all, in the decoding kernel's order and in the plainest one?

For each of `genoflash bench decode`'s cases, timed in interleaved rounds in one process (do_bench
medians, L2 cleared between calls):
    linear        a read-and-sum kernel over K and V as flat arrays, each program one contiguous
                  slice (the best of a few grid and block settings): the device's read rate
    pattern       the same sum, but each program reads one (split, sequence, KV head) part in
                  32-key tiles, as the split kernel does: the access pattern without the math
    decode        decode_attention with its defaults
    sdpa-cudnn    SDPA's cuDNN kernel on the (batch, heads, N, dim) copy
each in flash-attn's layout (batch, N, heads, dim) and in the heads-first one where it applies.
If cuDNN's time is at `linear`'s, it reads at the device's rate; if `pattern` is slower than
`linear`, the order of the reads costs; if `decode` is slower than `pattern`, the loop's math does.

    python benchmarks/experiments/inference/decode_read_floor.py [--rounds 3]   # on a CUDA GPU
"""

import argparse
import json
import statistics
import sys

import torch
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend

from genoflash.bench.common import run_metadata
from genoflash.bench.decode import CASES, HEADDIM, _sdpa, _timed
from genoflash.ops.attention import decode


@triton.jit
def _linear_read(X, Y, Out, per_program, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * per_program
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, per_program, BLOCK):
        offs = base + i + tl.arange(0, BLOCK)
        acc += tl.load(X + offs).to(tl.float32) + tl.load(Y + offs).to(tl.float32)
    tl.store(Out + pid, tl.sum(acc, 0))


@triton.jit
def _pattern_read(K, V, Out, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
                  seqlen, nheads_k, num_splits, BLOCK_N: tl.constexpr, D: tl.constexpr):
    split = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // nheads_k).to(tl.int64)
    hk = (bh % nheads_k).to(tl.int64)
    chunk = tl.cdiv(tl.cdiv(seqlen, num_splits), BLOCK_N) * BLOCK_N
    n_start = split * chunk
    n_end = tl.minimum(n_start + chunk, seqlen)
    offs_d = tl.arange(0, D)
    acc = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    for n0 in range(n_start, n_end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        ok = (cols < n_end)[:, None]
        k = tl.load(K + b * stride_kb + cols[:, None].to(tl.int64) * stride_kn + hk * stride_kh + offs_d[None, :],
                    mask=ok, other=0.0)
        v = tl.load(V + b * stride_vb + cols[:, None].to(tl.int64) * stride_vn + hk * stride_vh + offs_d[None, :],
                    mask=ok, other=0.0)
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(Out + split * tl.num_programs(1) + bh, tl.sum(tl.sum(acc, 1), 0))


def linear(k: torch.Tensor, v: torch.Tensor, programs: int, block: int, warps: int):
    n = k.numel()
    assert n % (programs * block) == 0
    out = torch.empty(programs, device=k.device, dtype=torch.float32)
    return lambda: _linear_read[(programs,)](k, v, out, n // programs, BLOCK=block, num_warps=warps)


def pattern(k: torch.Tensor, v: torch.Tensor, splits: int, warps: int, stages: int):
    """k, v: (batch, N, heads_k, dim) views, in either memory layout."""
    batch, n, hk, d = k.shape
    out = torch.empty(splits * batch * hk, device=k.device, dtype=torch.float32)
    return lambda: _pattern_read[(splits, batch * hk)](
        k, v, out, k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), n, hk, splits,
        BLOCK_N=32, D=d, num_warps=warps, num_stages=stages)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    report = {"metadata": run_metadata(), "rows": []}
    for name in args.cases.split(","):
        batch, n, nheads, nheads_k = CASES[name]
        torch.manual_seed(0)
        q = torch.randn(batch, 1, nheads, HEADDIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, n, nheads_k, HEADDIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        splits = decode.choose_splits(batch, nheads, nheads_k, n, torch.device("cuda"))
        fns = {}
        for per_sm in (4, 8, 16):
            for block, warps in ((4096, 4), (8192, 8)):
                programs = per_sm * sms
                while k.numel() % (programs * block):
                    programs -= 1
                fns[f"linear/{per_sm}x{sms}/{block}/{warps}w"] = linear(k, v, programs, block, warps)
        for layout, (kk, vv) in {"flash": (k, v), "heads-first": (ks.transpose(1, 2), vs.transpose(1, 2))}.items():
            for stages in (1, 3):
                fns[f"pattern/{layout}/s{stages}"] = pattern(kk, vv, splits, 4, stages)
            fns[f"decode/{layout}"] = lambda kk=kk, vv=vv: decode.decode_attention(
                q, kk, vv, None, n, softmax_scale=HEADDIM ** -0.5, return_lse=False)
        fns["sdpa-cudnn"] = lambda: _sdpa(SDPBackend.CUDNN_ATTENTION)(qs, ks, vs)
        times: dict = {}
        for _ in range(args.rounds):
            for key, fn in fns.items():
                r = _timed(fn)
                times.setdefault(key, []).append(r.get("ms", float("nan")))
        cudnn = statistics.median(times["sdpa-cudnn"])
        gbytes = 2 * k.numel() * k.element_size() / 1e9
        for key, ms in times.items():
            med = statistics.median(ms)
            row = {"case": name, "provider": key, "splits": splits, "ms": med, "rounds_ms": ms,
                   "read_gbps": gbytes / med * 1e3, "speed_vs_cudnn": cudnn / med}
            report["rows"].append(row)
            print(f"{name:12s} {key:32s} {med:.4f} ms  {row['read_gbps']:7.0f} GB/s  vs cudnn {cudnn / med:.4f}",
                  flush=True)
        q = k = v = qs = ks = vs = None
        fns.clear()
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
