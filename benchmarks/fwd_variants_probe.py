"""Probe: which Hopper mechanisms lift a Triton attention forward toward the issue-5 bar.

A minimal forward (no masks but causal, no biases), written three ways and timed side by side
with genoflash's production kernel and cuDNN SDPA on the genomic shapes:
- "ptr": pointer loads, as genoflash's kernels load today;
- "tma": host-side TMA tensor descriptors over the (batch, seqlen, heads, dim) tensors, one
  4-D descriptor each, so a tile past a sequence's end reads zeros (no masks, no row checks);
- "tma+ws": the same with the key loop warp-specialised (Triton 3.6 `tl.range(...,
  warp_specialize=True)`): a producer warp issues the TMA loads, the rest compute;
- "tma+lazy": "tma" whose running max is only updated (and acc rescaled) when some row's max
  grew by more than 8 in log2 units (flash-attn 4's trick); the loop is issue-bound, and the
  rescale is 64 of its 490 instructions per thread (offline SASS count).

Each variant is checked against SDPA before it is timed. A variant or tile that fails to
compile is reported and skipped. Writes one JSON with every (shape, variant, tile) time.

    python benchmarks/fwd_variants_probe.py --out results.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _desc_load(desc, off_b, start, off_h, seqlen, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DESC_2D: tl.constexpr):
    if DESC_2D:  # (batch * seqlen, heads * dim): the probe's seqlen is a multiple of every tile
        tile = desc.load([off_b * seqlen + start, off_h * HEAD_DIM])
    else:
        tile = desc.load([off_b, start, off_h, 0]).reshape(ROWS, HEAD_DIM)
    return tile


@triton.jit
def _probe_fwd_kernel(Q, K, V, O, q_desc, k_desc, v_desc, o_desc, qk_scale_log2, nheads, seqlen,
                      stride_b, stride_n, stride_h,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
                      DESC_2D: tl.constexpr, LAZY_RESCALE: tl.constexpr = False):
    pid = tl.program_id(0)
    n_m = tl.cdiv(seqlen, BLOCK_M)
    if CAUSAL:  # heavy (late) query tiles first
        m_blk = n_m - 1 - pid % n_m
    else:
        m_blk = pid % n_m
    bh = pid // n_m
    off_b = bh // nheads
    off_h = bh % nheads
    start_m = m_blk * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    base = off_b.to(tl.int64) * stride_b + off_h.to(tl.int64) * stride_h
    if USE_TMA:
        q = _desc_load(q_desc, off_b, start_m, off_h, seqlen, BLOCK_M, HEAD_DIM, DESC_2D)
    else:
        q = tl.load(Q + base + offs_m[:, None].to(tl.int64) * stride_n + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        hi_full = start_m  # tiles wholly below the diagonal (BLOCK_M % BLOCK_N == 0)
    else:
        hi_full = seqlen
    # Unmasked tiles.
    for start_n in tl.range(0, hi_full, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        if USE_TMA:
            k = _desc_load(k_desc, off_b, start_n, off_h, seqlen, BLOCK_N, HEAD_DIM, DESC_2D)
            v = _desc_load(v_desc, off_b, start_n, off_h, seqlen, BLOCK_N, HEAD_DIM, DESC_2D)
        else:
            kv_off = base + (start_n + offs_n)[:, None].to(tl.int64) * stride_n + offs_d[None, :]
            k = tl.load(K + kv_off)
            v = tl.load(V + kv_off)
        s = tl.dot(q, tl.trans(k))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale_log2)
        if LAZY_RESCALE:
            # Keep the running max stale unless some row's max grew by more than 8 (log2), as
            # flash-attn 4 does: p then stays <= 2^8, exact in fp32 and in bf16's range, and the
            # 64 multiplies per thread that rescale acc are skipped in most tiles. The test is
            # over the whole tile, so the branch is uniform.
            if tl.max(m_new - m_i, 0) > 8.0:
                alpha = tl.math.exp2(m_i - m_new)
                acc = acc * alpha[:, None]
                l_i = l_i * alpha
                m_i = m_new
            p = tl.math.exp2(s * qk_scale_log2 - m_i[:, None])
            l_i = l_i + tl.sum(p, 1)
            acc = tl.dot(p.to(v.dtype), v, acc)
        else:
            p = tl.math.exp2(s * qk_scale_log2 - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
    if CAUSAL:  # the diagonal tiles, masked
        for start_n in tl.range(start_m, start_m + BLOCK_M, BLOCK_N):
            if USE_TMA:
                k = _desc_load(k_desc, off_b, start_n, off_h, seqlen, BLOCK_N, HEAD_DIM, DESC_2D)
                v = _desc_load(v_desc, off_b, start_n, off_h, seqlen, BLOCK_N, HEAD_DIM, DESC_2D)
            else:
                kv_off = base + (start_n + offs_n)[:, None].to(tl.int64) * stride_n + offs_d[None, :]
                k = tl.load(K + kv_off)
                v = tl.load(V + kv_off)
            s = tl.dot(q, tl.trans(k))
            s = tl.where(offs_m[:, None] >= (start_n + offs_n)[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale_log2)
            p = tl.math.exp2(s * qk_scale_log2 - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
    out = (acc / l_i[:, None]).to(O.dtype.element_ty)
    if USE_TMA:
        if DESC_2D:
            o_desc.store([off_b * seqlen + start_m, off_h * HEAD_DIM], out)
        else:
            o_desc.store([off_b, start_m, off_h, 0], out.reshape(1, BLOCK_M, 1, HEAD_DIM))
    else:
        tl.store(O + base + offs_m[:, None].to(tl.int64) * stride_n + offs_d[None, :], out)


def probe_forward(q, k, v, causal, variant, bm, bn, warps, stages, maxnreg=None):
    from triton.tools.tensor_descriptor import TensorDescriptor

    b, n, h, d = q.shape
    o = torch.full_like(q, float("nan"))
    use_tma = variant != "ptr"
    desc_2d = "2d" in variant
    descs = []
    for t, rows in ((q, bm), (k, bn), (v, bn), (o, bm)):
        if desc_2d:
            descs.append(TensorDescriptor(t, [b * n, h * d], [h * d, 1], [rows, d]))
        elif use_tma:
            descs.append(TensorDescriptor(t, list(t.shape), list(t.stride()), [1, rows, 1, d]))
        else:
            descs.append(None)
    grid = (triton.cdiv(n, bm) * b * h,)
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    _probe_fwd_kernel[grid](q, k, v, o, *descs, d ** -0.5 * 1.4426950408889634, h, n,
                            q.stride(0), q.stride(1), q.stride(2),
                            HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, USE_TMA=use_tma,
                            WARP_SPECIALIZE=variant.endswith("+ws"), DESC_2D=desc_2d,
                            LAZY_RESCALE=variant.endswith("+lazy"), num_warps=warps, num_stages=stages, **extra)
    return o


def sdpa(q, k, v, causal, backend):
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)


def main():
    from torch.nn.attention import SDPBackend

    import genoflash

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    shapes = [(1, 16, 16384, 128, False), (1, 16, 16384, 128, True), (1, 32, 16384, 64, False),
              (1, 8, 65536, 128, False)]
    # Tiles per variant. Triton 3.6's Hopper warp specialisation partitions the loop only with
    # one consumer warpgroup (4 warps) and BLOCK_M 64; otherwise it leaves the loop as it is or
    # fails to compile (benchmarks/offline_compile.py showed which).
    plan = {
        "ptr": [(128, 128, 8, 3)],
        "tma": [(128, 128, 8, 3), (128, 128, 8, 2)],
        "tma+lazy": [(128, 128, 8, 3)],  # the acc rescale skipped unless a row max grew by > 2^8
        "tma2d": [(128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3)],
        "tma2d+ws": [(64, 64, 4, 2), (64, 128, 4, 2), (64, 64, 4, 3), (64, 128, 4, 1)],
    }
    if args.quick:
        shapes = shapes[:1]
        plan = {name: tiles[:1] for name, tiles in plan.items()}
    rows = []
    for (b, h, n, d, causal) in shapes:
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        ref = sdpa(q, k, v, causal, SDPBackend.CUDNN_ATTENTION)
        tag = dict(batch=b, nheads=h, seqlen=n, headdim=d, causal=causal)

        def timed(name, fn, **extra):
            try:
                out = fn()
                torch.cuda.synchronize()
                err = (out.float() - ref.float()).abs().max().item()
                ms = triton.testing.do_bench(fn, warmup=50, rep=300)
                row = dict(tag, impl=name, ms=ms, tflops=flops / ms * 1e-9, max_err=err, **extra)
            except Exception as e:  # noqa: BLE001 - a probe reports what did not compile
                row = dict(tag, impl=name, error=f"{type(e).__name__}: {str(e)[:200]}", **extra)
            print(json.dumps(row), flush=True)
            rows.append(row)

        timed("cudnn", lambda: sdpa(q, k, v, causal, SDPBackend.CUDNN_ATTENTION))
        timed("genoflash", lambda: genoflash.flash_attn_func(q, k, v, causal=causal))
        for variant, (bm, bn, w, s) in ((name, t) for name, tiles in plan.items() for t in tiles):
            if causal and bm % bn:
                continue
            t0 = time.time()
            timed(variant, lambda: probe_forward(q, k, v, causal, variant, bm, bn, w, s),
                  block_m=bm, block_n=bn, num_warps=w, num_stages=s)
            rows[-1]["wall_s"] = round(time.time() - t0, 1)
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           triton=triton.__version__, commit=os.environ.get("GENOFLASH_COMMIT", "unknown"),
                           date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
