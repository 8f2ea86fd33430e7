"""Rotary position embedding applied to Q and K tiles on chip, right after they are loaded.

No rotated copy of Q or K is ever written to memory. A tile's channel d is rotated with
its partner channel (d +- rotary_dim/2 in the NeoX layout, d ^ 1 interleaved) by the
angle of pair col(d) at the row's position:
    x'[d] = x[d] * cos + sign(d) * x[partner(d)] * sin,   sign = -1 for a pair's first channel.
The transposed rotation (sign flipped) maps gradients w.r.t. rotated q/k back to q/k.
The partner values come from a register gather, not a second load.
"""

import triton
import triton.language as tl


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
def _apply_rotary(x, positions, in_rows, COS, SIN, stride_rot, offs_d, ROTARY_DIM: tl.constexpr,
                  INTERLEAVED: tl.constexpr, INVERSE: tl.constexpr):
    """Rotate a (rows, BLOCK_D) tile whose rows sit at `positions`; returns float32.

    in_rows masks rows past the sequence end (their table rows may not exist)."""
    partner, col, sign, rotates = _rotary_layout(offs_d, ROTARY_DIM, INTERLEAVED)
    if INVERSE:
        sign = -sign
    xf = x.to(tl.float32)
    x_partner = tl.gather(xf, partner[None, :] + 0 * positions[:, None], 1)
    table = positions[:, None].to(tl.int64) * stride_rot + col[None, :]
    mask = in_rows[:, None] & rotates[None, :]
    cos = tl.load(COS + table, mask=mask, other=1.0).to(tl.float32)
    sin = tl.load(SIN + table, mask=mask, other=0.0).to(tl.float32)
    return xf * cos + sign[None, :] * x_partner * sin
