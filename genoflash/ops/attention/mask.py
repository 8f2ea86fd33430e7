"""Score masking for the tiles that straddle a boundary (see block_info.py).

Masked scores become -inf, so their probabilities are exactly 0 after exp2.
Row and column indices come in already broadcast ((M, 1) and (1, N), or transposed),
so one helper serves the forward, dQ and the transposed dK/dV frames alike.
"""

import triton
import triton.language as tl


@triton.jit
def _visible(rows, cols, seqlen_q, seqlen_k, window_left, window_right, HAS_LEFT: tl.constexpr,
             HAS_RIGHT: tl.constexpr):
    """True where query `rows` may attend to key `cols` (bottom-right aligned window)."""
    shift = seqlen_k - seqlen_q
    visible = cols < seqlen_k
    if HAS_LEFT:
        visible = visible & (cols >= rows + shift - window_left)
    if HAS_RIGHT:
        visible = visible & (cols <= rows + shift + window_right)
    return visible


@triton.jit
def _mask_scores(s, rows, cols, seqlen_q, seqlen_k, window_left, window_right, HAS_LEFT: tl.constexpr,
                 HAS_RIGHT: tl.constexpr):
    return tl.where(_visible(rows, cols, seqlen_q, seqlen_k, window_left, window_right, HAS_LEFT, HAS_RIGHT),
                    s, float("-inf"))
