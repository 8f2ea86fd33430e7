"""Which tiles a program must visit: the one place that knows the causal bounds.

Forward and backward both loop over these ranges, so the bounds are written once.
Causal masking is bottom-right aligned: query i sees key j iff j <= i + (seqlen_k - seqlen_q).

Each range is split in two: tiles that need no mask at all (every (i, j) pair is visible
and in bounds) and tiles that straddle a boundary (the causal diagonal or a sequence end),
so only the boundary tiles pay for masking.
"""

import triton
import triton.language as tl


@triton.jit
def _kv_block_range(start_m, seqlen_q, seqlen_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    IS_CAUSAL: tl.constexpr):
    """For the query rows [start_m, start_m + BLOCK_M): key positions (lo, mid, hi).

    Keys [lo, mid) come in whole BLOCK_N tiles that need no mask; keys [mid, hi) need one.
    Keys at or past hi are invisible to every row of the block and are skipped.
    """
    # Full key tiles end here; the last partial tile (if any) must be masked for j < seqlen_k.
    full_end = (seqlen_k // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        shift = seqlen_k - seqlen_q
        # The block's last row sees keys up to start_m + BLOCK_M - 1 + shift.
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + shift, 0), seqlen_k)
        # The block's first row sees keys up to start_m + shift: whole tiles below that are unmasked.
        mid = (tl.maximum(start_m + shift + 1, 0) // BLOCK_N) * BLOCK_N
        # mid stays a multiple of BLOCK_N and never passes hi: start_m + shift + 1 <= the
        # unclamped hi, and full_end <= seqlen_k.
        mid = tl.minimum(mid, full_end)
    else:
        hi = seqlen_k
        mid = full_end
    return 0, mid, hi


@triton.jit
def _q_block_range(start_n, seqlen_q, seqlen_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   IS_CAUSAL: tl.constexpr):
    """For the key rows [start_n, start_n + BLOCK_N): query positions (lo, mid, hi).

    Queries [lo, mid) need the causal mask; queries [mid, hi) see every key of the tile.
    (Rows past seqlen_q and keys past seqlen_k are zero-filled by the loads and carry an
    lse of +inf, so they contribute exactly zero; no score mask is needed for them here.)
    """
    if IS_CAUSAL:
        shift = seqlen_k - seqlen_q
        # Query i sees key j iff i >= j - shift. The tile's first key is seen from row start_n - shift.
        lo = (tl.maximum(start_n - shift, 0) // BLOCK_M) * BLOCK_M
        # Every key of the tile (up to start_n + BLOCK_N - 1) is seen from row start_n + BLOCK_N - 1 - shift.
        first_full = tl.maximum(start_n + BLOCK_N - 1 - shift, 0)
        # lo < seqlen_q for any key tile that exists (start_n < seqlen_k), so lo <= mid.
        mid = tl.minimum(((first_full + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, seqlen_q)
    else:
        lo = 0
        mid = 0
    return lo, mid, seqlen_q
