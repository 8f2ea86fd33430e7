"""FlashAttention backward in Triton: recompute P tile by tile, never store it.

Three launches, none of which holds a seqlen_q x seqlen_k tensor:
1. preprocess: delta_i = rowsum(dO_i * O_i), one fp32 per query row;
2. dK/dV: each program owns one key tile and streams the query tiles that see it;
3. dQ: each program owns one query tile and streams the key tiles it sees.

Every output element is written by exactly one program, with no atomics, so the
backward is bit-for-bit deterministic. The price is recomputing P once more in pass 3.

With s = q.k, P = exp(scale*s - lse), dP = dO.V^T, the gradients are
dV = P^T dO,  dS = P * (dP - delta),  dQ = scale * dS K,  dK = scale * dS^T Q.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .block_info import _kv_block_range, _q_block_range
from .configs import backward_config
from .forward import head_block, input_precision
from .mask import _mask_scores, _mask_scores_transposed
from .softmax import LOG2E_HOST, _lse_for_recompute
from .tile_scheduler import _tile_of_program
from .tiles import _head_base, _load_tile, _row_ptr, _store_tile


@triton.jit
def _attn_bwd_preprocess_kernel(
    O, DO, DELTA,
    stride_ob, stride_om, stride_oh,
    stride_dob, stride_dom, stride_doh,
    nheads, seqlen_q, num_m_blocks,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    start_m, off_b, off_h = _tile_of_program(tl.program_id(0), num_m_blocks, nheads, BLOCK_M, False)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = _load_tile(_row_ptr(_head_base(O, off_b, off_h, stride_ob, stride_oh), start_m, stride_om), offs_m,
                   seqlen_q - start_m, stride_om, offs_d, HEAD_DIM, BLOCK_D, True)
    do = _load_tile(_row_ptr(_head_base(DO, off_b, off_h, stride_dob, stride_doh), start_m, stride_dom), offs_m,
                    seqlen_q - start_m, stride_dom, offs_d, HEAD_DIM, BLOCK_D, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    row = (off_b.to(tl.int64) * nheads + off_h) * seqlen_q + start_m
    tl.store(DELTA + row + offs_m, delta, mask=offs_m < seqlen_q - start_m)


@triton.jit
def _attn_bwd_dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_ptr, delta_ptr, stride_qm, stride_dom,
                         start_n, lo, hi, seqlen_q, seqlen_k, qk_scale_log2,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                         INPUT_PRECISION: tl.constexpr):
    """Accumulate one key tile's dK (unscaled) and dV over query rows [lo, hi).

    Works in the transposed frame (keys down, queries across) so that dK and dV come out
    of the dots in the layout they are stored in. Rows past seqlen_q read as q = dO = 0
    with lse = +inf, so their P is exactly 0 and they need no score mask.
    """
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    for start_m in range(lo, hi, BLOCK_M):
        q = _load_tile(_row_ptr(q_base, start_m, stride_qm), offs_m, seqlen_q - start_m, stride_qm,
                       offs_d, HEAD_DIM, BLOCK_D, True)
        do = _load_tile(_row_ptr(do_base, start_m, stride_dom), offs_m, seqlen_q - start_m, stride_dom,
                        offs_d, HEAD_DIM, BLOCK_D, True)
        in_rows = offs_m < seqlen_q - start_m
        lse2 = _lse_for_recompute(tl.load(lse_ptr + start_m + offs_m, mask=in_rows, other=float("-inf")))
        delta = tl.load(delta_ptr + start_m + offs_m, mask=in_rows, other=0.0)
        sT = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION)
        if MASKED:
            sT = _mask_scores_transposed(sT, start_m + offs_m, offs_n, seqlen_q, seqlen_k, IS_CAUSAL)
        pT = tl.math.exp2(sT * qk_scale_log2 - lse2[None, :])
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)
        dpT = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
        dsT = pT * (dpT - delta[None, :])
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=INPUT_PRECISION)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dkb, stride_dkn, stride_dkh,
    stride_dvb, stride_dvn, stride_dvh,
    nheads, seqlen_q, seqlen_k, num_n_blocks, softmax_scale, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    # Key tiles near the start are seen by the most causal queries; they go first as is.
    start_n, off_b, off_h = _tile_of_program(tl.program_id(0), num_n_blocks, nheads, BLOCK_N, False)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    # K and V tiles stay on chip; dK and dV accumulate in registers over all query tiles.
    k = _load_tile(_row_ptr(_head_base(K, off_b, off_h, stride_kb, stride_kh), start_n, stride_kn), offs_n,
                   seqlen_k - start_n, stride_kn, offs_d, HEAD_DIM, BLOCK_D, True)
    v = _load_tile(_row_ptr(_head_base(V, off_b, off_h, stride_vb, stride_vh), start_n, stride_vn), offs_n,
                   seqlen_k - start_n, stride_vn, offs_d, HEAD_DIM, BLOCK_D, True)
    q_base = _head_base(Q, off_b, off_h, stride_qb, stride_qh)
    do_base = _head_base(DO, off_b, off_h, stride_dob, stride_doh)
    row = (off_b.to(tl.int64) * nheads + off_h) * seqlen_q
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    lo, mid, hi = _q_block_range(start_n, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
    # Query tiles crossing the causal diagonal of this key tile.
    dk, dv = _attn_bwd_dkdv_tiles(dk, dv, k, v, q_base, do_base, LSE + row, DELTA + row, stride_qm, stride_dom,
                                  start_n, lo, mid, seqlen_q, seqlen_k, qk_scale_log2, HEAD_DIM, BLOCK_D,
                                  BLOCK_M, BLOCK_N, IS_CAUSAL, True, INPUT_PRECISION)
    # Query tiles that see the whole key tile.
    dk, dv = _attn_bwd_dkdv_tiles(dk, dv, k, v, q_base, do_base, LSE + row, DELTA + row, stride_qm, stride_dom,
                                  start_n, mid, hi, seqlen_q, seqlen_k, qk_scale_log2, HEAD_DIM, BLOCK_D,
                                  BLOCK_M, BLOCK_N, IS_CAUSAL, False, INPUT_PRECISION)

    _store_tile(_row_ptr(_head_base(DK, off_b, off_h, stride_dkb, stride_dkh), start_n, stride_dkn),
                dk * softmax_scale, offs_n, seqlen_k - start_n, stride_dkn, offs_d, HEAD_DIM, BLOCK_D)
    _store_tile(_row_ptr(_head_base(DV, off_b, off_h, stride_dvb, stride_dvh), start_n, stride_dvn),
                dv, offs_n, seqlen_k - start_n, stride_dvn, offs_d, HEAD_DIM, BLOCK_D)


@triton.jit
def _attn_bwd_dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, start_m, lo, hi,
                       seqlen_q, seqlen_k, qk_scale_log2,
                       HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                       INPUT_PRECISION: tl.constexpr):
    """Accumulate one query tile's dQ (unscaled) over key tiles [lo, hi)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(lo, hi, BLOCK_N):
        k = _load_tile(_row_ptr(k_base, start_n, stride_kn), offs_n, seqlen_k - start_n, stride_kn,
                       offs_d, HEAD_DIM, BLOCK_D, MASKED)
        v = _load_tile(_row_ptr(v_base, start_n, stride_vn), offs_n, seqlen_k - start_n, stride_vn,
                       offs_d, HEAD_DIM, BLOCK_D, MASKED)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
        if MASKED:
            s = _mask_scores(s, offs_m, start_n + offs_n, seqlen_q, seqlen_k, IS_CAUSAL)
        p = tl.math.exp2(s * qk_scale_log2 - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=INPUT_PRECISION)
    return dq


@triton.jit
def _attn_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dqb, stride_dqm, stride_dqh,
    nheads, seqlen_q, seqlen_k, num_m_blocks, softmax_scale, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    start_m, off_b, off_h = _tile_of_program(tl.program_id(0), num_m_blocks, nheads, BLOCK_M, IS_CAUSAL)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    # Q, dO, lse and delta for this tile stay on chip for the whole key loop.
    q = _load_tile(_row_ptr(_head_base(Q, off_b, off_h, stride_qb, stride_qh), start_m, stride_qm), offs_m,
                   seqlen_q - start_m, stride_qm, offs_d, HEAD_DIM, BLOCK_D, True)
    do = _load_tile(_row_ptr(_head_base(DO, off_b, off_h, stride_dob, stride_doh), start_m, stride_dom), offs_m,
                    seqlen_q - start_m, stride_dom, offs_d, HEAD_DIM, BLOCK_D, True)
    row = (off_b.to(tl.int64) * nheads + off_h) * seqlen_q + start_m
    in_rows = offs_m < seqlen_q - start_m
    lse2 = _lse_for_recompute(tl.load(LSE + row + offs_m, mask=in_rows, other=float("-inf")))
    delta = tl.load(DELTA + row + offs_m, mask=in_rows, other=0.0)
    k_base = _head_base(K, off_b, off_h, stride_kb, stride_kh)
    v_base = _head_base(V, off_b, off_h, stride_vb, stride_vh)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    lo, mid, hi = _kv_block_range(start_m, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dq = _attn_bwd_dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, start_m, lo, mid,
                            seqlen_q, seqlen_k, qk_scale_log2, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N,
                            IS_CAUSAL, False, INPUT_PRECISION)
    dq = _attn_bwd_dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, start_m, mid, hi,
                            seqlen_q, seqlen_k, qk_scale_log2, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N,
                            IS_CAUSAL, True, INPUT_PRECISION)
    _store_tile(_row_ptr(_head_base(DQ, off_b, off_h, stride_dqb, stride_dqh), start_m, stride_dqm),
                dq * softmax_scale, offs_m, seqlen_q - start_m, stride_dqm, offs_d, HEAD_DIM, BLOCK_D)


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, seq, head) strides of a (batch, seq, head, dim) tensor with a contiguous last dim."""
    return t.stride(0), t.stride(1), t.stride(2)


def attention_backward(dout, q, k, v, out, lse, softmax_scale: float, causal: bool):
    """Returns (dq, dk, dv) in the dtypes of q, k, v. All inputs have a contiguous last dim."""
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k = k.shape[1]
    cfg = backward_config(head_dim, causal, q.dtype, q.device)
    block_d = head_block(head_dim)
    precision = input_precision(q.dtype)
    qk_scale_log2 = softmax_scale * LOG2E_HOST

    delta = torch.empty_like(lse)
    num_m_pre = triton.cdiv(seqlen_q, cfg.preprocess_block)
    _attn_bwd_preprocess_kernel[(num_m_pre * batch * nheads,)](
        out, dout, delta, *_strides(out), *_strides(dout), nheads, seqlen_q, num_m_pre,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=cfg.preprocess_block,
    )

    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)

    num_n_blocks = triton.cdiv(seqlen_k, cfg.dkdv.block_n)
    _attn_bwd_dkdv_kernel[(num_n_blocks * batch * nheads,)](
        q, k, v, dout, lse, delta, dk, dv,
        *_strides(q), *_strides(k), *_strides(v), *_strides(dout), *_strides(dk), *_strides(dv),
        nheads, seqlen_q, seqlen_k, num_n_blocks, softmax_scale, qk_scale_log2,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=cfg.dkdv.block_m, BLOCK_N=cfg.dkdv.block_n,
        IS_CAUSAL=causal, INPUT_PRECISION=precision,
        num_warps=cfg.dkdv.num_warps, num_stages=cfg.dkdv.num_stages,
    )

    num_m_blocks = triton.cdiv(seqlen_q, cfg.dq.block_m)
    _attn_bwd_dq_kernel[(num_m_blocks * batch * nheads,)](
        q, k, v, dout, lse, delta, dq,
        *_strides(q), *_strides(k), *_strides(v), *_strides(dout), *_strides(dq),
        nheads, seqlen_q, seqlen_k, num_m_blocks, softmax_scale, qk_scale_log2,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=cfg.dq.block_m, BLOCK_N=cfg.dq.block_n,
        IS_CAUSAL=causal, INPUT_PRECISION=precision,
        num_warps=cfg.dq.num_warps, num_stages=cfg.dq.num_stages,
    )
    return dq, dk, dv
