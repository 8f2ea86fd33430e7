"""Score masking for the tiles that straddle a boundary (see block_info.py), and dropout's keep mask.

Masked scores become -inf, so their probabilities are exactly 0 after exp2.
Row and column indices come in already broadcast ((M, 1) and (1, N), or transposed),
so one helper serves the forward, dQ and the transposed dK/dV frames alike.
"""

import triton
import triton.language as tl

from .dropout import PHILOX_ROUNDS

_PHILOX_ROUNDS = tl.constexpr(PHILOX_ROUNDS)


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


@triton.jit
def _mask_tile_scores(s, rows, cols, tile_start, mid_lo, mid_hi, seqlen_q, seqlen_k, window_left, window_right,
                      HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, EDGES_ONLY: tl.constexpr):
    """_mask_scores for a tile of a loop that runs over masked and whole tiles alike: with
    EDGES_ONLY only a tile starting outside [mid_lo, mid_hi) (block_info.py's whole tiles)
    is masked, behind a branch the whole tiles skip; otherwise every tile is."""
    if EDGES_ONLY:
        if (tile_start < mid_lo) | (tile_start >= mid_hi):
            s = _mask_scores(s, rows, cols, seqlen_q, seqlen_k, window_left, window_right, HAS_LEFT, HAS_RIGHT)
    else:
        s = _mask_scores(s, rows, cols, seqlen_q, seqlen_k, window_left, window_right, HAS_LEFT, HAS_RIGHT)
    return s


@triton.jit
def _dropout_keep(seed, offset, bh, rows, start_n, threshold, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Dropout keep mask (BLOCK_M, BLOCK_N) for query rows `rows` (BLOCK_M,) and keys start_n ..
    start_n + BLOCK_N (start_n a multiple of 16). The bits are defined in dropout.py, whose
    PyTorch Philox matches these: one call per 16 keys, one byte per key."""
    groups = (start_n // 16 + tl.arange(0, BLOCK_N // 16))[None, :]
    c0 = (groups + 0 * rows[:, None]).to(tl.uint32)
    c1 = (rows[:, None] + 0 * groups).to(tl.uint32)
    zero = tl.zeros_like(c0)
    seed = seed.to(tl.uint64) & 0x7FFFFFFFFFFFFFFF  # clear dropout.KERNEL_SEED_TAG: the key is seed < 2^63
    w0, w1, w2, w3 = tl.philox(seed, c0, c1, zero + bh.to(tl.uint32), zero + offset, n_rounds=_PHILOX_ROUNDS)
    # tl.join(x, y) stacks along a new last axis, so join(join(w0, w2), join(w1, w3)) holds w(2a + b)
    # at [..., a, b], and the row-major reshape puts the words side by side: word k of group g
    # serves keys 16g + 4k .. 16g + 4k + 3 (word q = 4g + k of the row).
    words = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), (BLOCK_M, BLOCK_N // 4))
    # Byte b of word q serves key 4q + b. Spreading each word over a new last axis of 4 (a
    # broadcast) and flattening keeps a word's bytes in the thread that holds the word. A second
    # join tree here took 18% more instructions per key tile on sm_90, most of them shuffles
    # through shared memory (tools/offline_compile.py --sass; docs/design/fused-rope-dropout.md).
    # byte >= threshold is tested as (word << (24 - 8b)) >= threshold << 24, unsigned: byte b
    # moves to the top, the bytes below it cannot lift a smaller byte over the threshold, and
    # the mask that would isolate the byte is not needed.
    shift = (24 - 8 * tl.arange(0, 4)).to(tl.uint32)[None, None, :]
    keep = (words[:, :, None] << shift) >= (threshold.to(tl.uint32) << 24)
    return tl.reshape(keep, (BLOCK_M, BLOCK_N))
