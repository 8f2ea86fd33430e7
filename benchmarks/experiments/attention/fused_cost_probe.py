"""Experiment: the floor of the two fused features (RoPE, dropout) in Triton on the H200, and a
peer's cost. docs/design/fused-rope-dropout.md cites its results.

1. RoPE's floor. A minimal Triton forward (non-causal, no masks, K and V by TMA over 2-D
   descriptors) in five forms, timed side by side with
   genoflash's plain and fused-RoPE forwards:
   - `plain`: q.k as one dot over the head dim;
   - `halves`: the same split into two dots over the NeoX halves (K's halves by TMA), no rotation:
     what splitting the dot costs by itself;
   - `rotate, tables once`: `halves` plus the rotation of each K tile in registers, with one
     cos/sin tile loaded before the loop and used for every key tile (key j rotates by the
     angle of position j mod BLOCK_N). The table traffic is gone; what is left is the rotation
     itself and the rotated tile's trip to shared memory before the wgmma that reads it. No RoPE
     kernel that rotates K inside the loop can do less work than this;
   - `rotate, tables per tile`: real RoPE, each key tile's table rows by TMA;
   - `rotate in bf16, tables per tile`: the same with the rotation done in bf16 arithmetic.
   Each form is checked against SDPA on q and k rotated the same way (in PyTorch) before it is
   timed. If `rotate, tables once` already costs far more than 5% over `plain`, a 5% bar is out
   of reach for any kernel that rotates K in the loop in Triton.
2. Dropout's cost in a peer: SDPA's flash backend (flash-attn 2) with dropout_p = 0.1 against 0,
   forward and fwd+bwd, beside genoflash's own, in one process; and the floor: the minimal
   forward with genoflash's own keep mask (mask._dropout_keep) against without.
3. `--parts rope-pass`: fused RoPE against RoPE as a pass of its own (genoflash.apply_rotary_emb)
   followed by attention without RoPE, and the attention layer both ways.

    python benchmarks/experiments/attention/fused_cost_probe.py --out fused_cost.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os

import torch
import triton
import triton.language as tl
import triton.testing

from genoflash.ops.attention.configs import override_configs
from genoflash.ops.attention.mask import _dropout_keep

SHAPES = [(1, 16, 16384, 128), (1, 8, 65536, 128)]  # (batch, nheads, seqlen, headdim), non-causal
FORMS = ("plain", "halves", "rotate, tables once", "rotate, tables per tile", "rotate in bf16, tables per tile")


@triton.jit
def _rotate(x1, x2, c, s, BF16_MATH: tl.constexpr):
    """One NeoX rotation of a tile held as its two halves; returns the halves in x's dtype."""
    if BF16_MATH:
        c = c.to(x1.dtype)
        s = s.to(x1.dtype)
        r1 = x1 * c - x2 * s
        r2 = x2 * c + x1 * s
    else:
        a = x1.to(tl.float32)
        b = x2.to(tl.float32)
        c = c.to(tl.float32)
        s = s.to(tl.float32)
        r1 = a * c - b * s
        r2 = b * c + a * s
    return r1.to(x1.dtype), r2.to(x1.dtype)


@triton.jit
def _minimal_fwd_kernel(q_desc, qh_desc, k_desc, kh_desc, v_desc, o_desc, cq_desc, sq_desc, ck_desc, sk_desc,
                        qk_scale_log2, nheads, seqlen, dropout_seed, dropout_offset, dropout_threshold, dropout_rescale,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        SPLIT: tl.constexpr, ROTATE: tl.constexpr, TABLES_PER_TILE: tl.constexpr,
                        BF16_MATH: tl.constexpr, DROPOUT: tl.constexpr):
    HALF: tl.constexpr = HEAD_DIM // 2
    pid = tl.program_id(0)
    n_m = tl.cdiv(seqlen, BLOCK_M)
    m_blk = pid % n_m
    bh = pid // n_m
    off_b = bh // nheads
    off_h = bh % nheads  # bh = off_b * nheads + off_h: the dropout stream's (sequence, head), as in genoflash
    start_m = m_blk * BLOCK_M
    row_q = off_b * seqlen + start_m
    col = off_h * HEAD_DIM
    if SPLIT:
        q1 = qh_desc.load([row_q, col])
        q2 = qh_desc.load([row_q, col + HALF])
        if ROTATE:  # Q is rotated once per program, at its true positions
            q1, q2 = _rotate(q1, q2, cq_desc.load([start_m, 0]), sq_desc.load([start_m, 0]), BF16_MATH)
        if not TABLES_PER_TILE:  # the floor: one table tile, loaded before the loop
            c0 = ck_desc.load([0, 0])
            s0 = sk_desc.load([0, 0])
    else:
        q = q_desc.load([row_q, col])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, seqlen, BLOCK_N):
        row_k = off_b * seqlen + start_n
        if SPLIT:
            k1 = kh_desc.load([row_k, col])
            k2 = kh_desc.load([row_k, col + HALF])
            if ROTATE:
                if TABLES_PER_TILE:
                    k1, k2 = _rotate(k1, k2, ck_desc.load([start_n, 0]), sk_desc.load([start_n, 0]), BF16_MATH)
                else:
                    k1, k2 = _rotate(k1, k2, c0, s0, BF16_MATH)
            s = tl.dot(q1, tl.trans(k1))
            s = tl.dot(q2, tl.trans(k2), s)
        else:
            s = tl.dot(q, tl.trans(k_desc.load([row_k, col])))
        v = v_desc.load([row_k, col])
        if DROPOUT:  # genoflash's own keep mask (mask._dropout_keep), drawn where its forward draws it
            keep = _dropout_keep(dropout_seed, dropout_offset, bh, start_m + tl.arange(0, BLOCK_M), start_n,
                                 dropout_threshold, BLOCK_M, BLOCK_N)
        # The same online softmax as genoflash's (exp2 with the scale folded in).
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale_log2)
        p = tl.math.exp2(s * qk_scale_log2 - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:  # after the sum: l_i is the undropped softmax's, as in genoflash
            p = tl.where(keep, p, 0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    if DROPOUT:
        acc = acc * dropout_rescale
    o_desc.store([row_q, col], (acc / l_i[:, None]).to(o_desc.dtype))


def minimal_forward(q, k, v, form, cos, sin, bm, bn, warps, stages, dropout=None):
    """The minimal forward in one of FORMS; `dropout` (a DropoutArgs) adds genoflash's keep mask."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from genoflash.ops.attention.dropout import kernel_seed

    b, n, h, d = q.shape
    o = torch.full_like(q, float("nan"))  # every unwritten element shows up in the check

    def desc(t, rows, cols):
        return TensorDescriptor(t, [b * n, h * d], [h * d, 1], [rows, cols])

    def table(t, rows):
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [rows, d // 2])

    if cos is None:  # no RoPE: the table descriptors are not read, any (seqlen, d/2) tensor serves
        cos = sin = torch.zeros(n, d // 2, device=q.device, dtype=q.dtype)
    _minimal_fwd_kernel[(triton.cdiv(n, bm) * b * h,)](
        desc(q, bm, d), desc(q, bm, d // 2), desc(k, bn, d), desc(k, bn, d // 2), desc(v, bn, d), desc(o, bm, d),
        table(cos, bm), table(sin, bm), table(cos, bn), table(sin, bn),
        d ** -0.5 * 1.4426950408889634, h, n, kernel_seed(dropout), dropout.offset if dropout else 0,
        dropout.threshold if dropout else 0, dropout.rescale if dropout else 1.0,
        HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, SPLIT=form != "plain", ROTATE=form.startswith("rotate"),
        TABLES_PER_TILE=form != "rotate, tables once", BF16_MATH="bf16" in form, DROPOUT=dropout is not None,
        num_warps=warps, num_stages=stages)
    return o


def time_fwd_and_fwd_bwd(row, call, inputs, dout, flops, overrides=None, check=None):
    """Median forward (without autograd) and forward + backward times of call() into row, with
    TF/s; check() (optional, run first without autograd) returns more fields. A failure is
    recorded in the row. Prints and returns the row."""
    try:
        with override_configs(**(overrides or {})):
            with torch.no_grad():
                if check is not None:
                    row.update(check())
                fwd = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
            both = triton.testing.do_bench(lambda: torch.autograd.grad(call(), inputs, dout), warmup=25, rep=200,
                                           return_mode="median")
        row.update(fwd_ms=fwd, fwd_tflops=flops / fwd * 1e-9, fwd_bwd_ms=both, fwd_bwd_tflops=3.5 * flops / both * 1e-9)
    except Exception as e:  # noqa: BLE001 - a probe reports what failed and goes on
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    print(json.dumps(row), flush=True)
    return row


def sdpa(q, k, v, backend, dropout_p=0.0):
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=dropout_p).transpose(1, 2)


def rope_rows(b, h, n, d, meta):
    from torch.nn.attention import SDPBackend

    import genoflash
    from genoflash.ops.rotary import rotary_tables, rotate

    torch.manual_seed(0)
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cos, sin = rotary_tables(n, d, device="cuda", dtype=torch.bfloat16)
    flops = 4 * b * h * n * n * d
    rows = []

    def timed(name, fn, ref=None, **extra):
        row = dict(batch=b, nheads=h, seqlen=n, headdim=d, part="rope", form=name, **extra)
        try:
            out = fn()
            torch.cuda.synchronize()
            if ref is not None:
                row["max_err_vs_sdpa"] = (out.float() - ref.float()).abs().max().item()
                row["nan"] = bool(out.isnan().any())
            ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
            row.update(ms=ms, tflops=flops / ms * 1e-9)
        except Exception as e:  # noqa: BLE001 - a probe reports what failed and goes on
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(json.dumps(row), flush=True)
        rows.append(row)

    timed("genoflash plain", lambda: genoflash.flash_attn_func(q, k, v))
    timed("genoflash RoPE (bf16 tables)", lambda: genoflash.flash_attn_func(q, k, v, rotary_cos=cos, rotary_sin=sin))
    refs = {"plain": sdpa(q, k, v, SDPBackend.CUDNN_ATTENTION)}
    refs["halves"] = refs["plain"]
    qr = rotate(q, cos, sin)
    refs["rotate, tables per tile"] = sdpa(qr, rotate(k, cos, sin), v, SDPBackend.CUDNN_ATTENTION)
    refs["rotate in bf16, tables per tile"] = refs["rotate, tables per tile"]
    # tables once: key j at position j mod BLOCK_N (one table tile reused for every key tile)
    for bm, bn, w, s in ((128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3)):
        pos = torch.arange(n, device="cuda") % bn
        refs["rotate, tables once"] = sdpa(qr, rotate(k, cos[pos], sin[pos]), v, SDPBackend.CUDNN_ATTENTION)
        for form in FORMS:
            timed(form, lambda: minimal_forward(q, k, v, form, cos, sin, bm, bn, w, s), refs[form],
                  block_m=bm, block_n=bn, num_warps=w, num_stages=s)
    return rows


def dropout_rows(b, h, n, d):
    from torch.nn.attention import SDPBackend

    import genoflash

    torch.manual_seed(0)
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    flops = 4 * b * h * n * n * d
    rows = []
    impls = {
        "sdpa-flash (flash-attn 2)": lambda p: sdpa(q, k, v, SDPBackend.FLASH_ATTENTION, p),
        "genoflash": lambda p: genoflash.flash_attn_func(q, k, v, dropout_p=p),
    }
    # The floor: the minimal forward with and without genoflash's keep mask (the same bits as
    # genoflash's forward with this seed and offset, which the output check shows).
    from genoflash.ops.attention.dropout import DropoutArgs

    qd, kd, vd = (t.detach() for t in (q, k, v))
    drop = DropoutArgs(0.1, seed=1234, offset=5)
    with torch.no_grad():
        ref = genoflash.flash_attn_func(qd, kd, vd, dropout_p=0.1, dropout_seed=drop.seed, dropout_offset=drop.offset)
    for bm, bn, w, st in ((128, 128, 8, 3), (128, 128, 8, 2)):
        for dropout in (None, drop):
            row = dict(batch=b, nheads=h, seqlen=n, headdim=d, part="dropout floor", impl="minimal forward",
                       dropout_p=dropout.p if dropout else 0.0, block_m=bm, block_n=bn, num_warps=w, num_stages=st)
            try:
                out = minimal_forward(qd, kd, vd, "plain", None, None, bm, bn, w, st, dropout)
                if dropout:
                    row["max_diff_vs_genoflash"] = (out.float() - ref.float()).abs().max().item()
                fwd = triton.testing.do_bench(lambda: minimal_forward(qd, kd, vd, "plain", None, None, bm, bn, w, st,
                                                                      dropout), warmup=25, rep=200,
                                              return_mode="median")
                row.update(fwd_ms=fwd, fwd_tflops=flops / fwd * 1e-9)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
    for name, fn in impls.items():
        for p in (0.0, 0.1):
            row = dict(batch=b, nheads=h, seqlen=n, headdim=d, part="dropout", impl=name, dropout_p=p)
            rows.append(time_fwd_and_fwd_bwd(row, lambda: fn(p), (q, k, v), dout, flops, {}))
    return rows


def rope_pass_rows(b, h, n, d):
    """Fused RoPE against RoPE as a pass of its own (genoflash.apply_rotary_emb on q and k, then
    attention without RoPE), forward and fwd+bwd, with plain attention beside; and the attention
    layer both ways (dim = h * d). float16 tables, as the layer passes them for bf16 inputs."""
    import genoflash
    from genoflash.layers import MultiHeadAttention
    from genoflash.ops.rotary import rotary_tables

    torch.manual_seed(0)
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    cos, sin = rotary_tables(n, d, device="cuda", dtype=torch.float16)
    flops = 4 * b * h * n * n * d
    rows = []

    def separate(a, c, w):
        rotated = [genoflash.apply_rotary_emb(t, cos, sin) for t in (a, c)]
        return genoflash.flash_attn_func(*rotated, w)
    impls = {
        "plain": lambda a, c, w: genoflash.flash_attn_func(a, c, w),
        "fused RoPE": lambda a, c, w: genoflash.flash_attn_func(a, c, w, rotary_cos=cos, rotary_sin=sin),
        "RoPE pass, then attention": separate,
    }
    with torch.no_grad():
        ref = impls["fused RoPE"](q, k, v).float()
    for name, fn in impls.items():
        row = dict(batch=b, nheads=h, seqlen=n, headdim=d, part="rope pass", impl=name)
        check = None if name == "plain" else (
            lambda: {"max_diff_vs_fused": (fn(q, k, v).float() - ref).abs().max().item()})
        rows.append(time_fwd_and_fwd_bwd(row, lambda: fn(q, k, v), (q, k, v), dout, flops, check=check))
    with torch.no_grad():  # the pass alone: bytes moved = x read + out written
        ms = triton.testing.do_bench(lambda: genoflash.apply_rotary_emb(q, cos, sin), warmup=25, rep=200,
                                     return_mode="median")
    row = dict(batch=b, nheads=h, seqlen=n, headdim=d, part="rope pass", impl="apply_rotary_emb alone (q)", ms=ms,
               tb_per_s=2 * q.numel() * q.element_size() / ms * 1e-9)
    print(json.dumps(row), flush=True)
    rows.append(row)
    x = torch.randn(b, n, h * d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for fused in (True, False):
        layer = MultiHeadAttention(h * d, h, rotary_fused=fused).to("cuda", torch.bfloat16)
        row = dict(batch=b, nheads=h, seqlen=n, headdim=d, part="rope pass", impl=f"layer, rotary_fused={fused}")
        torch.cuda.reset_peak_memory_stats()
        try:
            both = triton.testing.do_bench(lambda: torch.autograd.grad(layer(x).sum(), [x, *layer.parameters()]),
                                           warmup=10, rep=200, return_mode="median")
            row.update(fwd_bwd_ms=both, peak_gib=torch.cuda.max_memory_allocated() / 2**30)
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="rope,dropout")
    args = ap.parse_args()
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, commit=os.environ.get("GENOFLASH_COMMIT", "unknown"),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                method="triton.testing.do_bench median; TF/s = 4*B*H*N^2*D (x3.5 fwd+bwd)")
    rows = []
    parts = set(args.parts.split(","))
    for b, h, n, d in SHAPES:
        if "rope" in parts:
            rows += rope_rows(b, h, n, d, meta)
        if "dropout" in parts:
            rows += dropout_rows(b, h, n, d)
        if "rope-pass" in parts:
            rows += rope_pass_rows(b, h, n, d)
        with open(args.out, "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
