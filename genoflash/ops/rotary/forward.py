"""The rotary pass in Triton: one program per (block of tokens, sequence), looping over heads so
that each token's cos/sin row is loaded once for all of them.

The same kernel is the backward: rotation by an angle is orthogonal, so the gradient with respect
to x is the gradient with respect to the output rotated by minus that angle (INVERSE: sin -> -sin).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.host import cdiv, next_power_of_2

_BLOCK_T = 64  # tokens per program


@triton.jit
def _rotary_kernel(X, OUT, COS, SIN, CU_SEQLENS, OFFSETS,
                   stride_xb, stride_xn, stride_xh, stride_ob, stride_on, stride_oh, stride_rot,
                   seqlen, nheads, position_offset,
                   HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr,
                   BLOCK_P: tl.constexpr, INTERLEAVED: tl.constexpr, INVERSE: tl.constexpr,
                   IS_VARLEN: tl.constexpr, OFFSETS_PER_SEQUENCE: tl.constexpr):
    start_t = tl.program_id(0) * BLOCK_T
    off_b = tl.program_id(1)
    if IS_VARLEN:  # sequence b is rows [cu[b], cu[b + 1]) of the packed tensors
        first_row = tl.load(CU_SEQLENS + off_b)
        seqlen = tl.load(CU_SEQLENS + off_b + 1) - first_row
        x_base = X + first_row.to(tl.int64) * stride_xn
        o_base = OUT + first_row.to(tl.int64) * stride_on
    else:
        x_base = X + off_b.to(tl.int64) * stride_xb
        o_base = OUT + off_b.to(tl.int64) * stride_ob
    if start_t >= seqlen:  # the grid covers the longest sequence
        return
    offs_t = start_t + tl.arange(0, BLOCK_T)
    rows = offs_t < seqlen
    if OFFSETS_PER_SEQUENCE:
        position_offset = tl.load(OFFSETS + off_b)
    positions = (offs_t + position_offset).to(tl.int64)  # the host checked they lie inside the tables
    HALF: tl.constexpr = ROTARY_DIM // 2
    offs_r = tl.arange(0, BLOCK_R)
    pairs = rows[:, None] & (offs_r < HALF)[None, :]  # BLOCK_R is HALF rounded up to a power of two
    table = positions[:, None] * stride_rot + offs_r[None, :]
    cos = tl.load(COS + table, mask=pairs, other=0.0).to(tl.float32)
    sin = tl.load(SIN + table, mask=pairs, other=0.0).to(tl.float32)
    if INVERSE:
        sin = -sin
    if INTERLEAVED:  # GPT-J: pair m is channels (2m, 2m + 1)
        first = 2 * offs_r
        second = first + 1
    else:  # NeoX: pair m is channels (m, m + ROTARY_DIM / 2)
        first = offs_r
        second = offs_r + HALF
    offs_p = ROTARY_DIM + tl.arange(0, BLOCK_P)  # the channels that pass through unrotated
    passing = rows[:, None] & (offs_p < HEAD_DIM)[None, :]
    x_rows = x_base + offs_t.to(tl.int64)[:, None] * stride_xn
    o_rows = o_base + offs_t.to(tl.int64)[:, None] * stride_on
    for h in range(nheads):
        xh = x_rows + h * stride_xh
        oh = o_rows + h * stride_oh
        a = tl.load(xh + first[None, :], mask=pairs, other=0.0).to(tl.float32)
        b = tl.load(xh + second[None, :], mask=pairs, other=0.0).to(tl.float32)
        # In float32, rounded once to the output's dtype, as reference.rotate does.
        tl.store(oh + first[None, :], (a * cos - b * sin).to(OUT.dtype.element_ty), mask=pairs)
        tl.store(oh + second[None, :], (b * cos + a * sin).to(OUT.dtype.element_ty), mask=pairs)
        if ROTARY_DIM < HEAD_DIM:
            tl.store(oh + offs_p[None, :], tl.load(xh + offs_p[None, :], mask=passing), mask=passing)


def rotary_forward(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                   seqlen_offsets: int | torch.Tensor, cu_seqlens: torch.Tensor | None, max_seqlen: int,
                   inverse: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """x rotated into `out`: a new contiguous tensor of x's shape and dtype, or x itself (in place:
    each program loads a pair's two channels before it stores either, and no two programs share a
    token). Inputs are validated by interface.py: x's last dim is contiguous, cos/sin are contiguous
    (positions, rotary_dim / 2), every position lies inside them; seqlen_offsets is an int or an
    int32 (batch,) tensor."""
    varlen = cu_seqlens is not None
    if out is None:
        out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    head_dim, rotary_dim = x.shape[-1], 2 * cos.shape[1]
    batch = cu_seqlens.numel() - 1 if varlen else x.shape[0]
    per_sequence = isinstance(seqlen_offsets, torch.Tensor)
    if varlen:  # (total, nheads, headdim): no batch stride
        strides_x, strides_o = (0, x.stride(0), x.stride(1)), (0, out.stride(0), out.stride(1))
    else:
        strides_x, strides_o = (x.stride(0), x.stride(1), x.stride(2)), (out.stride(0), out.stride(1), out.stride(2))
    grid = (cdiv(max_seqlen, _BLOCK_T), batch)
    _rotary_kernel[grid](
        x, out, cos, sin, cu_seqlens, seqlen_offsets if per_sequence else None,
        *strides_x, *strides_o, cos.stride(0), max_seqlen, x.shape[-2], 0 if per_sequence else seqlen_offsets,
        HEAD_DIM=head_dim, ROTARY_DIM=rotary_dim, BLOCK_T=_BLOCK_T, BLOCK_R=next_power_of_2(rotary_dim // 2),
        BLOCK_P=next_power_of_2(max(head_dim - rotary_dim, 1)), INTERLEAVED=interleaved, INVERSE=inverse,
        IS_VARLEN=varlen, OFFSETS_PER_SEQUENCE=per_sequence,
    )
    return out
