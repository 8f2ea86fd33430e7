"""FlashAttention forward in Triton: one fused kernel, O and the LSE are its only writes.

Each program owns one BLOCK_M tile of queries of one (batch, head) (FlashAttention-2's
sequence-parallel split). Its Q tile stays on chip while it streams K/V tiles through
an online softmax; the N x N score matrix never exists outside registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .block_info import _kv_block_range
from .configs import forward_config
from .mask import _mask_scores
from .softmax import LOG2E_HOST, _finalize_softmax, _online_softmax_update
from .tile_scheduler import _tile_of_program
from .tiles import _head_base, _load_tile, _row_ptr, _store_tile


@triton.jit
def _attn_fwd_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, start_m, lo, hi,
                    seqlen_q, seqlen_k, qk_scale_log2,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                    INPUT_PRECISION: tl.constexpr):
    """Stream key tiles [lo, hi) into the running state of one query tile.

    Invariant after each tile: acc is un-normalised (acc / l_i is the output over the keys
    seen so far), m_i is the running row max of scale*log2(e)*s, and l_i = sum exp2(. - m_i).
    """
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(lo, hi, BLOCK_N):
        # Only masked tiles can hold the seqlen_k tail, so only they check rows.
        k = _load_tile(_row_ptr(k_base, start_n, stride_kn), offs_n, seqlen_k - start_n, stride_kn,
                       offs_d, HEAD_DIM, BLOCK_D, MASKED)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
        if MASKED:
            s = _mask_scores(s, offs_m, start_n + offs_n, seqlen_q, seqlen_k, IS_CAUSAL)
        p, alpha, m_i, l_i = _online_softmax_update(s, m_i, l_i, qk_scale_log2, MASKED)
        v = _load_tile(_row_ptr(v_base, start_n, stride_vn), offs_n, seqlen_k - start_n, stride_vn,
                       offs_d, HEAD_DIM, BLOCK_D, MASKED)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=INPUT_PRECISION)
    return acc, m_i, l_i


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_om, stride_oh,
    nheads, seqlen_q, seqlen_k, num_m_blocks, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    start_m, off_b, off_h = _tile_of_program(tl.program_id(0), num_m_blocks, nheads, BLOCK_M, IS_CAUSAL)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    # The Q tile is loaded once and stays on chip for the whole key loop.
    q = _load_tile(_row_ptr(_head_base(Q, off_b, off_h, stride_qb, stride_qh), start_m, stride_qm), offs_m,
                   seqlen_q - start_m, stride_qm, offs_d, HEAD_DIM, BLOCK_D, True)
    k_base = _head_base(K, off_b, off_h, stride_kb, stride_kh)
    v_base = _head_base(V, off_b, off_h, stride_vb, stride_vh)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    lo, mid, hi = _kv_block_range(start_m, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
    # Off-band tiles: every score visible, no mask work.
    acc, m_i, l_i = _attn_fwd_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, start_m, lo, mid,
                                    seqlen_q, seqlen_k, qk_scale_log2, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N,
                                    IS_CAUSAL, False, INPUT_PRECISION)
    # On-band tiles: the causal diagonal and the seqlen_k tail pay for the mask.
    acc, m_i, l_i = _attn_fwd_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, start_m, mid, hi,
                                    seqlen_q, seqlen_k, qk_scale_log2, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N,
                                    IS_CAUSAL, True, INPUT_PRECISION)

    out, lse = _finalize_softmax(acc, m_i, l_i)
    _store_tile(_row_ptr(_head_base(O, off_b, off_h, stride_ob, stride_oh), start_m, stride_om), out, offs_m,
                seqlen_q - start_m, stride_om, offs_d, HEAD_DIM, BLOCK_D)
    # LSE is (batch, nheads, seqlen_q), contiguous; the row offset can pass 2^31, so int64.
    lse_row = (off_b.to(tl.int64) * nheads + off_h) * seqlen_q + start_m
    tl.store(LSE + lse_row + offs_m, lse, mask=offs_m < seqlen_q - start_m)


def input_precision(dtype: torch.dtype) -> str:
    # fp32 inputs must not silently drop to tf32: genoflash promises fp32 accuracy for fp32.
    return "ieee" if dtype == torch.float32 else "tf32"


def head_block(head_dim: int) -> int:
    # tl.dot needs every dimension >= 16; smaller or non-power-of-two head dims are padded by masks.
    return max(16, triton.next_power_of_2(head_dim))


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float,
                      causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, Nq, H, D), k/v (B, Nk, H, D), last dim contiguous -> out (B, Nq, H, D), lse (B, H, Nq) fp32."""
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k = k.shape[1]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((batch, nheads, seqlen_q), device=q.device, dtype=torch.float32)
    cfg = forward_config(head_dim, causal, q.dtype, q.device)
    num_m_blocks = triton.cdiv(seqlen_q, cfg.block_m)
    grid = (num_m_blocks * batch * nheads,)
    _attn_fwd_kernel[grid](
        q, k, v, out, lse,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        nheads, seqlen_q, seqlen_k, num_m_blocks, softmax_scale * LOG2E_HOST,
        HEAD_DIM=head_dim, BLOCK_D=head_block(head_dim), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        IS_CAUSAL=causal, INPUT_PRECISION=input_precision(q.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out, lse
