"""Q and K tiles as channel groups, so RoPE can rotate them on chip (and padding stays out of the dots).

RoPE rotates channel pairs: pair m is (first(m), second(m)) = (m, m + R/2) in the NeoX
layout and (2m, 2m + 1) interleaved, for R = rotary_dim; channels R..D-1 pass through.
A Q or K tile is therefore carried as three register tiles:
    a = the first channels of the pairs, rotated    (rows, BLOCK_R)
    b = the second channels of the pairs, rotated   (rows, BLOCK_R)
    p = the pass-through channels R..D-1            (rows, BLOCK_P)
and a score is the sum of three dots, q.k = qa.ka + qb.kb + qp.kp: a dot product does
not care in which order its channels come. Rotating a pair needs both of its channels,
and here they sit at the same index of a and b, so no register shuffle, partner reload or
round trip through memory is needed, and the tables are read at half width (one cos and
one sin per pair):
    a' = a cos - b sin,   b' = b cos + a sin.
Without RoPE (R = 0) the tile is just p, and the kernels compile to exactly one dot.
Tiles are powers of two wide, so where the pass-through width D - R is not one (96, 192, ...),
p is itself held as two groups (configs.channel_blocks),
    p = channels R .. R+BLOCK_P-1,   t = the rest, R+BLOCK_P .. D-1     (rows, BLOCK_T)
with a fourth dot qt.kt, so that no padded channel reaches a matmul. With BLOCK_T = 0 there is
no t: the helpers take and return a placeholder in its place and never touch it.
No rotated copy of Q or K is ever written to memory. Gradients come out of the dots in the
rotated frame, also as halves, and the transposed rotation maps them back before the store:
    dL/da = ga cos + gb sin,   dL/db = gb cos - ga sin.
"""

import triton
import triton.language as tl

from .tiles import _load_tile, _load_tile_tma_at, _store_tile


@triton.jit
def _pair_columns(offs_r, ROTARY_DIM: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Channels (first, second) of rotating pair m = offs_r."""
    if INTERLEAVED:
        return 2 * offs_r, 2 * offs_r + 1
    return offs_r, offs_r + ROTARY_DIM // 2


@triton.jit
def _rotary_angles(COS, SIN, stride_rot, positions, in_rows, offs_r, ROTARY_DIM: tl.constexpr):
    """cos and sin (rows, BLOCK_R) in float32 of pair m = offs_r at each row's position.
    Rows past the sequence end (in_rows false) and padded pairs read cos 1, sin 0."""
    table = positions[:, None].to(tl.int64) * stride_rot + offs_r[None, :]
    mask = in_rows[:, None] & (offs_r < ROTARY_DIM // 2)[None, :]
    cos = tl.load(COS + table, mask=mask, other=1.0).to(tl.float32)
    sin = tl.load(SIN + table, mask=mask, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def _rotate_pairs(a, b, cos, sin, DTYPE: tl.constexpr):
    """(a cos - b sin, b cos + a sin) in float32, rounded once to DTYPE: the forward rotation of
    each pair, whichever way its halves and angles were loaded."""
    a32 = a.to(tl.float32)
    b32 = b.to(tl.float32)
    return (a32 * cos - b32 * sin).to(DTYPE), (b32 * cos + a32 * sin).to(DTYPE)


@triton.jit
def _pair_ptrs_mask(base, offs_row, n_rows, stride_row, columns, offs_r, ROTARY_DIM: tl.constexpr,
                    CHECK_ROWS: tl.constexpr):
    ptrs = base + offs_row[:, None] * stride_row + columns[None, :]
    mask = (offs_r < ROTARY_DIM // 2)[None, :]
    if CHECK_ROWS:
        mask = mask & (offs_row[:, None] < n_rows)
    return ptrs, mask


@triton.jit
def _load_qk(base, offs_row, n_rows, stride_row, positions, COS, SIN, stride_rot,
             HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
             BLOCK_T: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_ROWS: tl.constexpr, CHECK_ROWS: tl.constexpr):
    """Load a Q or K tile as (a, b, p, t) in its own dtype, the pairs rotated to `positions`.

    Rows past n_rows (when CHECK_ROWS) and padded channels read as 0, so they add nothing
    to a dot. Groups that do not exist (a and b without RoPE, p when R = D) are zeros that
    the kernels never use; without a t (BLOCK_T = 0) t is p, as a placeholder."""
    # One past group p's last channel: where t starts when there is a t (p is then whole).
    P_END: tl.constexpr = ROTARY_DIM + BLOCK_P if BLOCK_T > 0 else HEAD_DIM
    offs_p = ROTARY_DIM + tl.arange(0, BLOCK_P)
    if ROTARY_DIM < HEAD_DIM:
        p = _load_tile(base, offs_row, n_rows, stride_row, offs_p, P_END,
                       ROTARY_DIM + BLOCK_P, CHECK_ROWS)
    else:
        p = tl.zeros([BLOCK_ROWS, BLOCK_P], dtype=base.dtype.element_ty)
    t = p
    if BLOCK_T > 0:
        offs_t = ROTARY_DIM + BLOCK_P + tl.arange(0, BLOCK_T)
        t = _load_tile(base, offs_row, n_rows, stride_row, offs_t, HEAD_DIM, ROTARY_DIM + BLOCK_P + BLOCK_T,
                       CHECK_ROWS)
    if ROTARY_DIM > 0:
        offs_r = tl.arange(0, BLOCK_R)
        first, second = _pair_columns(offs_r, ROTARY_DIM, INTERLEAVED)
        ptrs_a, mask = _pair_ptrs_mask(base, offs_row, n_rows, stride_row, first, offs_r, ROTARY_DIM, CHECK_ROWS)
        ptrs_b, _ = _pair_ptrs_mask(base, offs_row, n_rows, stride_row, second, offs_r, ROTARY_DIM, CHECK_ROWS)
        a = tl.load(ptrs_a, mask=mask, other=0.0)
        b = tl.load(ptrs_b, mask=mask, other=0.0)
        cos, sin = _rotary_angles(COS, SIN, stride_rot, positions, offs_row < n_rows, offs_r, ROTARY_DIM)
        a, b = _rotate_pairs(a, b, cos, sin, p.dtype)
    else:
        a = tl.zeros([BLOCK_ROWS, BLOCK_R], dtype=p.dtype)
        b = tl.zeros([BLOCK_ROWS, BLOCK_R], dtype=p.dtype)
    return a, b, p, t


@triton.jit
def _load_pt_tma(desc_p, desc_t, off_b, row, off_h, ROTARY_DIM: tl.constexpr, BLOCK_P: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """Groups p and t of rows [row, row + BLOCK_ROWS) by TMA, one box each (t is p without a t)."""
    p = _load_tile_tma_at(desc_p, off_b, row, off_h, ROTARY_DIM, BLOCK_ROWS, BLOCK_P)
    t = p
    if BLOCK_T > 0:
        t = _load_tile_tma_at(desc_t, off_b, row, off_h, ROTARY_DIM + BLOCK_P, BLOCK_ROWS, BLOCK_T)
    return p, t


@triton.jit
def _load_qk_tma(desc_r, desc_p, desc_t, cos_desc, sin_desc, off_b, row, off_h, HEAD_DIM: tl.constexpr,
                 ROTARY_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr,
                 BLOCK_ROWS: tl.constexpr, DTYPE: tl.constexpr):
    """_load_qk for NeoX halves through TMA descriptors (descriptors.py: `rope_tma_applies` says
    when; `tile_descriptor` and `table_descriptor` make them):
    rows [row, row + BLOCK_ROWS) as (a, b, p, t), the pairs rotated to positions row + i.

    The halves are boxes of BLOCK_R channels at channel 0 and at R/2, the pass-through a box of
    BLOCK_P at R; the tables are (BLOCK_ROWS, BLOCK_R) boxes of the (seqlen, R/2) tables. When
    BLOCK_R > R/2 the halves' boxes reach into the next group's channels, but the tables' boxes
    read past their R/2 columns as 0, so cos = sin = 0 there and those lanes come out 0, as the
    pointer path's masks leave them. Rows past the sequence end read as 0 (zero rotated is 0)."""
    a = _load_tile_tma_at(desc_r, off_b, row, off_h, 0, BLOCK_ROWS, BLOCK_R)
    b = _load_tile_tma_at(desc_r, off_b, row, off_h, ROTARY_DIM // 2, BLOCK_ROWS, BLOCK_R)
    if ROTARY_DIM < HEAD_DIM:
        p, t = _load_pt_tma(desc_p, desc_t, off_b, row, off_h, ROTARY_DIM, BLOCK_P, BLOCK_T, BLOCK_ROWS)
    else:
        p = tl.zeros([BLOCK_ROWS, BLOCK_P], dtype=DTYPE)
        t = p
    cos = cos_desc.load([row, 0]).to(tl.float32)
    sin = sin_desc.load([row, 0]).to(tl.float32)
    a, b = _rotate_pairs(a, b, cos, sin, DTYPE)
    return a, b, p, t


@triton.jit
def _qk_dot(xa, xb, xp, xt, ya, yb, yp, yt, HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr,
            BLOCK_T: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """x . y^T over all channels, for tiles held as (a, b, p, t): (rows of x, rows of y) float32."""
    if ROTARY_DIM > 0:
        s = tl.dot(xa, tl.trans(ya), input_precision=INPUT_PRECISION)
        s = tl.dot(xb, tl.trans(yb), s, input_precision=INPUT_PRECISION)
        if ROTARY_DIM < HEAD_DIM:
            s = tl.dot(xp, tl.trans(yp), s, input_precision=INPUT_PRECISION)
    else:
        s = tl.dot(xp, tl.trans(yp), input_precision=INPUT_PRECISION)
    if BLOCK_T > 0:
        s = tl.dot(xt, tl.trans(yt), s, input_precision=INPUT_PRECISION)
    return s


@triton.jit
def _qk_grad_update(ga, gb, gp, gt, ds, ya, yb, yp, yt, HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr,
                    BLOCK_T: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """g += ds @ y, group by group: the gradient w.r.t. the rotated x of s = x . y^T."""
    if ROTARY_DIM > 0:
        ga = tl.dot(ds, ya, ga, input_precision=INPUT_PRECISION)
        gb = tl.dot(ds, yb, gb, input_precision=INPUT_PRECISION)
    if ROTARY_DIM < HEAD_DIM:
        gp = tl.dot(ds, yp, gp, input_precision=INPUT_PRECISION)
    if BLOCK_T > 0:
        gt = tl.dot(ds, yt, gt, input_precision=INPUT_PRECISION)
    return ga, gb, gp, gt


@triton.jit
def _store_qk_grad(base, ga, gb, gp, gt, positions, offs_row, n_rows, stride_row, COS, SIN, stride_rot,
                   HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
                   BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Store a gradient held as rotated-frame groups (float32) as the gradient w.r.t. the
    unrotated q or k: the pairs go through the transposed rotation, p and t are stored as is."""
    # One past group p's last channel: where t starts when there is a t (p is then whole).
    P_END: tl.constexpr = ROTARY_DIM + BLOCK_P if BLOCK_T > 0 else HEAD_DIM
    if ROTARY_DIM < HEAD_DIM:
        offs_p = ROTARY_DIM + tl.arange(0, BLOCK_P)
        _store_tile(base, gp, offs_row, n_rows, stride_row, offs_p, P_END,
                    ROTARY_DIM + BLOCK_P)
    if BLOCK_T > 0:
        offs_t = ROTARY_DIM + BLOCK_P + tl.arange(0, BLOCK_T)
        _store_tile(base, gt, offs_row, n_rows, stride_row, offs_t, HEAD_DIM, ROTARY_DIM + BLOCK_P + BLOCK_T)
    if ROTARY_DIM > 0:
        offs_r = tl.arange(0, BLOCK_R)
        first, second = _pair_columns(offs_r, ROTARY_DIM, INTERLEAVED)
        cos, sin = _rotary_angles(COS, SIN, stride_rot, positions, offs_row < n_rows, offs_r, ROTARY_DIM)
        ptrs_a, mask = _pair_ptrs_mask(base, offs_row, n_rows, stride_row, first, offs_r, ROTARY_DIM, True)
        ptrs_b, _ = _pair_ptrs_mask(base, offs_row, n_rows, stride_row, second, offs_r, ROTARY_DIM, True)
        tl.store(ptrs_a, (ga * cos + gb * sin).to(base.dtype.element_ty), mask=mask)
        tl.store(ptrs_b, (gb * cos - ga * sin).to(base.dtype.element_ty), mask=mask)
