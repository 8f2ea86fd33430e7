"""Which tiles a program must visit: the one place that knows the mask bounds.

Forward and backward loop over these ranges, so the bounds are written once.
With shift = seqlen_k - seqlen_q (bottom-right alignment), query i sees key j iff
    j >= i + shift - window_left    (when the window has a left bound)
    j <= i + shift + window_right   (when it has a right bound; causal is window_right = 0)
and j < seqlen_k.

Each range comes in three parts: [lo, mid_lo) and [mid_hi, hi) hold tiles that straddle
a boundary and must be masked; [mid_lo, mid_hi) holds whole tiles where every pair is
visible, which skip the mask. Tiles outside [lo, hi) are invisible to every row and are
never touched, so a window costs O(N * window), not O(N^2).
"""

import triton
import triton.language as tl


@triton.jit
def _kv_block_range(start_m, seqlen_q, seqlen_k, window_left, window_right, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """For query rows [start_m, start_m + BLOCK_M): key positions (lo, mid_lo, mid_hi, hi).

    lo, mid_lo and mid_hi are multiples of BLOCK_N; hi need not be (the last masked tile
    is cut by the j < seqlen_k mask). Rows past seqlen_q are ignored: nothing stores them.
    """
    shift = seqlen_k - seqlen_q
    first_row = start_m
    last_row = tl.minimum(start_m + BLOCK_M, seqlen_q) - 1
    if HAS_LEFT:
        lo = (tl.maximum(first_row + shift - window_left, 0) // BLOCK_N) * BLOCK_N
        # Every row of the tile sees keys from last_row + shift - window_left on.
        mid_lo = tl.cdiv(tl.maximum(last_row + shift - window_left, 0), BLOCK_N) * BLOCK_N
    else:
        lo = 0
        mid_lo = 0
    if HAS_RIGHT:
        hi = tl.minimum(tl.maximum(last_row + shift + window_right + 1, 0), seqlen_k)
        # Every row of the tile sees keys up to first_row + shift + window_right.
        mid_hi = tl.minimum(tl.maximum(first_row + shift + window_right + 1, 0), seqlen_k)
    else:
        hi = seqlen_k
        mid_hi = seqlen_k
    # Only whole tiles inside seqlen_k can skip the mask.
    mid_hi = (mid_hi // BLOCK_N) * BLOCK_N
    hi = tl.maximum(hi, lo)
    # No whole visible tile: everything in [lo, hi) goes through the masked path.
    empty_middle = mid_hi <= mid_lo
    mid_lo = tl.where(empty_middle, lo, mid_lo)
    mid_hi = tl.where(empty_middle, lo, mid_hi)
    return lo, mid_lo, mid_hi, hi


@triton.jit
def _q_block_range(start_n, seqlen_q, seqlen_k, window_left, window_right, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """For key rows [start_n, start_n + BLOCK_N): query positions (lo, mid_lo, mid_hi, hi).

    Query i sees key j iff j - shift - window_right <= i <= j - shift + window_left.
    Rows past seqlen_q read as q = dO = 0 with lse = +inf, so their P is exactly 0 and the
    unmasked middle may end in a partial tile; keys past seqlen_k are never stored.
    """
    shift = seqlen_k - seqlen_q
    first_key = start_n
    last_key = tl.minimum(start_n + BLOCK_N, seqlen_k) - 1
    if HAS_RIGHT:
        lo = (tl.maximum(first_key - shift - window_right, 0) // BLOCK_M) * BLOCK_M
        # Rows from last_key - shift - window_right on see every key of the tile (right side).
        mid_lo = tl.cdiv(tl.maximum(last_key - shift - window_right, 0), BLOCK_M) * BLOCK_M
    else:
        lo = 0
        mid_lo = 0
    if HAS_LEFT:
        hi = tl.minimum(tl.maximum(last_key - shift + window_left + 1, 0), seqlen_q)
        # Rows up to first_key - shift + window_left see every key of the tile (left side).
        mid_hi = (tl.maximum(first_key - shift + window_left + 1, 0) // BLOCK_M) * BLOCK_M
        mid_hi = tl.minimum(mid_hi, hi)
    else:
        hi = seqlen_q
        mid_hi = seqlen_q
    if HAS_LEFT or HAS_RIGHT:
        # An empty range is lo == hi (hi raised to lo, as in _kv_block_range), so that lo stays a
        # multiple of BLOCK_M the compiler can see: query tiles then load as aligned vectors.
        hi = tl.maximum(hi, lo)
    else:
        lo = tl.minimum(lo, hi)  # lo = 0; kept as it was for the sm_90 compile the tile table measured
    empty_middle = mid_hi <= mid_lo
    mid_lo = tl.where(empty_middle, lo, mid_lo)
    mid_hi = tl.where(empty_middle, lo, mid_hi)
    return lo, mid_lo, mid_hi, hi
