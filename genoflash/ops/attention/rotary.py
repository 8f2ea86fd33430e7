"""Rotary position embedding applied to Q and K tiles on chip, right after they are loaded.

No rotated copy of Q or K is ever written to memory. A tile's channel d is rotated with
its partner channel (d +- rotary_dim/2 in the NeoX layout, d ^ 1 interleaved) by the
angle of pair col(d) at the row's position:
    x'[d] = x[d] * cos + sign(d) * x[partner(d)] * sin,   sign = -1 for a pair's first channel.
The transposed rotation (sign flipped) maps gradients w.r.t. rotated q/k back to q/k.

The partner values come from a second load of the same tile with permuted columns (an
L1/L2 hit), not a register gather: on the H200, tl.gather across a 128-wide tile inside the
pipelined key loop asked for 480 KB of shared memory (triton 3.6) and did not compile.
"""

import triton
import triton.language as tl

from .tiles import _load_tile, _store_tile


@triton.jit
def _rotary_layout(offs_d, ROTARY_DIM: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Per channel: (partner channel, table column, sign, rotates?). Channels >= ROTARY_DIM pass."""
    HALF: tl.constexpr = ROTARY_DIM // 2
    if INTERLEAVED:
        partner = offs_d ^ 1
        col = offs_d // 2
        first = (offs_d % 2) == 0
    else:
        first = offs_d < HALF
        partner = tl.where(first, offs_d + HALF, offs_d - HALF)
        col = tl.where(first, offs_d, offs_d - HALF)
    rotates = offs_d < ROTARY_DIM
    return tl.where(rotates, partner, offs_d), tl.where(rotates, col, 0), tl.where(first, -1.0, 1.0), rotates


@triton.jit
def _rotary_partner(offs_d, ROTARY_DIM: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Column each channel pairs with (itself past ROTARY_DIM): load the tile again at these."""
    partner, _, _, _ = _rotary_layout(offs_d, ROTARY_DIM, INTERLEAVED)
    return partner


@triton.jit
def _apply_rotary(x, x_partner, positions, in_rows, COS, SIN, stride_rot, offs_d, ROTARY_DIM: tl.constexpr,
                  INTERLEAVED: tl.constexpr, INVERSE: tl.constexpr):
    """Rotate a (rows, BLOCK_D) tile whose rows sit at `positions`; returns float32.

    x_partner is the same tile read at the _rotary_partner columns. in_rows masks rows past
    the sequence end (their table rows may not exist)."""
    _, col, sign, rotates = _rotary_layout(offs_d, ROTARY_DIM, INTERLEAVED)
    if INVERSE:
        sign = -sign
    xf = x.to(tl.float32)
    x_partner = x_partner.to(tl.float32)
    table = positions[:, None].to(tl.int64) * stride_rot + col[None, :]
    mask = in_rows[:, None] & rotates[None, :]
    cos = tl.load(COS + table, mask=mask, other=1.0).to(tl.float32)
    sin = tl.load(SIN + table, mask=mask, other=0.0).to(tl.float32)
    return xf * cos + sign[None, :] * x_partner * sin


@triton.jit
def _store_unrotated(base, grad, positions, offs_row, n_rows, stride_row, offs_d, COS, SIN, stride_rot,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, ROTARY_DIM: tl.constexpr,
                     INTERLEAVED: tl.constexpr):
    """Store a gradient w.r.t. rotated q or k as the gradient w.r.t. q or k.

    The partner columns of a register tile are not addressable, so the tile goes through its
    own output rows: store, barrier, read both column orders back, rotate by the transpose,
    barrier (every thread has read before any overwrites), store. Only this program touches
    these rows, and a CTA barrier orders its global memory accesses."""
    _store_tile(base, grad, offs_row, n_rows, stride_row, offs_d, HEAD_DIM, BLOCK_D)
    tl.debug_barrier()
    in_rows = offs_row < n_rows
    g = _load_tile(base, offs_row, n_rows, stride_row, offs_d, HEAD_DIM, BLOCK_D, True)
    g_partner = _load_tile(base, offs_row, n_rows, stride_row, _rotary_partner(offs_d, ROTARY_DIM, INTERLEAVED),
                           HEAD_DIM, BLOCK_D, True)
    unrotated = _apply_rotary(g, g_partner, positions, in_rows, COS, SIN, stride_rot, offs_d, ROTARY_DIM,
                              INTERLEAVED, True)
    tl.debug_barrier()
    _store_tile(base, unrotated, offs_row, n_rows, stride_row, offs_d, HEAD_DIM, BLOCK_D)
