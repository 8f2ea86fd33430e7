"""The selective scan's forward as sequential recurrences: one thread per channel, its states in
registers, stepping through time.

The chunked forward this replaced scanned 32-step chunks across the lanes of a warp with
`tl.associative_scan` (as the backwards, backward.py and backward_channels_first.py, still do):
per state and step that is the decay, the scan's compose-and-shuffle tree (twice, once per pass)
and, around it, chunk states of (chunk, channel, state) in HBM (1 GiB each at a million tokens and
512 channels). It issued 28 sm_90 instructions per state and step. What the recurrence itself
needs is five:

    decay = 2^(dt A log2(e))          FMUL, MUFU.EX2
    h     = decay h + (dt u) B         FMUL, FFMA
    y    += C h                        FFMA

Here each thread owns one channel of one batch row over a segment of the sequence and holds its
dstate states as a tuple of registers (a tuple of (BLOCK_D,) vectors: Triton tiles cannot be
indexed, but a tuple is unrolled at compile time, so state n is always the same register). It
steps through its segment T = 8 steps at a time: u, delta and z come in as (BLOCK_D, 8) tiles,
one vector load per thread when time is contiguous (channels-first memory), and are split into
their 8 steps in registers (`_steps`); B[t] and C[t] are the same for every channel and come in
as broadcast loads of 4 states (`_state_row`). The per-(time, channel) work (softplus, dt u, the
skip and the gate) is done once on the tiles, not once per state.

Segments depend on each other only through their states, so the forward runs in three passes,
over segments of thousands of steps (a few per SM's worth of threads):
  1. each segment from a zero state: its final state S_k and decay P_k = 2^(A log2(e) sum dt);
  2. the carry walk over the segments (chunk_states.py): the state H_k entering each;
  3. each segment from H_k: out = (y + u D) silu(z) in out's dtype, and, when a backward will
     run, the state entering every CHUNK-step chunk and the chunk's decay, which the backward
     kernels (backward.py, backward_channels_first.py) take as their chunk states.
Pass 1's decays are computed again in pass 3: two MUFU.EX2 per state and step (16 per clock and
SM: 4.1 ms at a million tokens, 512 channels, 16 states on the H200, whose inputs and output
take 1.0 ms to move at 4.2 TB/s). Issue is about the same bound: the hot loops take 6.1 (pass 1)
and 9.6 (pass 3) sm_90 instructions per state and step, ~4.1 ms at that size if every scheduler
issued every cycle.

What the H200 measured (docs/design/mamba-scan.md): at first 17 ms at that size, no faster than
the chunked forward, with ncu putting 78% of pass 3's stall samples on loads (B and C per step,
u, delta and z per tile). Hence the loads ahead of their use below: the tiles one loop iteration
early, B's and C's rows ROWS_AHEAD steps early from a zero-padded float32 copy, and the next
tile's rows requested into L1 (_prefetch_rows); then 9.4 ms (16.2 for the chunked forward in the
same process).

Steps past the sequence end get dt = 0 and u = 0: decay 1, nothing added, the state unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.host import cdiv, next_power_of_2, sm_count
from .chunk_states import carry_walk
from .recurrence import _decay, _sigmoid, _softplus, chunk_blocks, kernel_flags, strides3

LOG2E = tl.constexpr(1.4426950408889634)
T = 8  # steps per tile: 16 bytes of a 16-bit input per thread when time is contiguous
# Programs per SM the sequence is cut into (with `config`'s 4 warps): two even waves of 4-warp
# programs at ~130 registers.
PROGRAMS_PER_SM = 8
# Steps ahead of their use at which B's and C's rows are loaded (_rows_ahead). 2 with OUT_MAXNREG
# 128 was the fastest setting timed on the H200: 1M x 512 forward 9.40 ms, against 10.27 at 1
# step without the cap (docs/design/mamba-scan.md).
ROWS_AHEAD = 2
# A register cap for pass 3 (ptxas's .maxnreg): uncapped it takes ~140 registers and 3 of its
# 4-warp programs fit an SM; at 128 four do, with 24 spilled registers outside the hot loop
# (offline sm_90) and 4-9% less time.
OUT_MAXNREG = 128


@triton.jit
def _steps(x):
    """The 8 columns (time steps) of a (BLOCK_D, 8) tile, each (BLOCK_D,), in order. Each thread
    holds its channel's 8 steps, so the reshapes and splits only rename registers."""
    R: tl.constexpr = x.shape[0]
    even, odd = tl.split(tl.reshape(x, (R, 4, 2)))       # steps 0 2 4 6 | 1 3 5 7
    s04, s26 = tl.split(tl.reshape(even, (R, 2, 2)))     # 0 4 | 2 6
    s15, s37 = tl.split(tl.reshape(odd, (R, 2, 2)))      # 1 5 | 3 7
    s0, s4 = tl.split(s04)
    s2, s6 = tl.split(s26)
    s1, s5 = tl.split(s15)
    s3, s7 = tl.split(s37)
    return s0, s1, s2, s3, s4, s5, s6, s7


@triton.jit
def _tile_of_steps(s):
    """_steps' inverse: 8 (BLOCK_D,) steps back into a (BLOCK_D, 8) tile."""
    R: tl.constexpr = s[0].shape[0]
    even = tl.reshape(tl.join(tl.join(s[0], s[4]), tl.join(s[2], s[6])), (R, 4))
    odd = tl.reshape(tl.join(tl.join(s[1], s[5]), tl.join(s[3], s[7])), (R, 4))
    return tl.reshape(tl.join(even, odd), (R, 8))


@triton.jit
def _state_row(X, stride_xn, BLOCK_D: tl.constexpr, DSTATE: tl.constexpr, GROUP: tl.constexpr):
    """B[t] (or C[t]) as a tuple of DSTATE (BLOCK_D,) vectors, state n's value in every channel:
    GROUP states per broadcast load (every lane of a warp reads the same bytes: one transaction),
    split into single states in registers. X is the launcher's float32 copy (_float_rows: a
    16-bit row would cost one unpacking instruction per state and step, in both passes), zero
    past dstate and past the sequence, so every row read is in bounds and an unmasked load needs
    no zeroing instructions."""
    row = ()
    offs_g = tl.arange(0, GROUP)
    for g in tl.static_range(DSTATE // GROUP):
        n = g * GROUP + offs_g
        ptrs = X + (n * stride_xn)[None, :] + tl.zeros([BLOCK_D, 1], tl.int32)
        tile = tl.load(ptrs)
        if GROUP == 1:
            row = row + (tl.reshape(tile, (BLOCK_D,)),)
        elif GROUP == 2:
            row = row + tl.split(tile)
        else:  # GROUP == 4
            even, odd = tl.split(tl.reshape(tile, (BLOCK_D, 2, 2)))  # states 0 2 | 1 3
            n0, n2 = tl.split(even)
            n1, n3 = tl.split(odd)
            row = row + (n0, n1, n2, n3)
    return row


@triton.jit
def _first_rows(X_SEG, stride_xn, BLOCK_D: tl.constexpr, DSTATE: tl.constexpr, GROUP: tl.constexpr,
                AHEAD: tl.constexpr):
    """The rows of a segment's first AHEAD steps (B's or C's): _rows_ahead's ring at the start.
    Rows are DSTATE floats apart (_float_rows)."""
    ring = ()
    for k in tl.static_range(AHEAD):
        ring = ring + (_state_row(X_SEG + k * DSTATE, stride_xn, BLOCK_D, DSTATE, GROUP),)
    return ring


@triton.jit
def _rows_ahead(ring, X_SEG, t, t_start, stride_xn, BLOCK_D: tl.constexpr, DSTATE: tl.constexpr,
                GROUP: tl.constexpr, AHEAD: tl.constexpr):
    """Step t's row, loaded AHEAD steps ago, and the ring with step t + AHEAD's row issued now.

    B[t] and C[t] are read by every thread of the SM's programs in step t; without this the
    state-steps of step t waited on their load (L2 latency: ncu at 262k x 512 put 60% of the
    forward's stall samples on FFMAs waiting for these rows). A load issued AHEAD steps early
    passes under AHEAD x dstate state-steps of the other work. Past the segment's end the ring
    reads rows nobody uses, and the state-steps past the sequence's end take dt = 0 (any finite
    row leaves the states as they are): the launcher's row buffer has zero rows past the sequence
    for them (_float_rows: no bounds arithmetic per step, and constant row offsets)."""
    row = ring[0]
    rest = ()
    for k in tl.static_range(1, AHEAD):
        rest = rest + (ring[k],)
    ahead = t + AHEAD - t_start
    rest = rest + (_state_row(X_SEG + ahead * DSTATE, stride_xn, BLOCK_D, DSTATE, GROUP),)
    return row, rest


@triton.jit
def _channel_states(X, d_ptr_offs, d_mask, stride_n, n_valid, scale, DSTATE: tl.constexpr):
    """A per-channel array over the states (A's row, a state) as a tuple of DSTATE (BLOCK_D,)
    vectors, times scale; 0 for the padding states past n_valid."""
    out = ()
    for n in tl.static_range(DSTATE):
        out = out + (tl.load(X + d_ptr_offs + n * stride_n, mask=d_mask & (n < n_valid), other=0.0).to(tl.float32)
                     * scale,)
    return out


@triton.jit
def _zero_states(BLOCK_D: tl.constexpr, DSTATE: tl.constexpr):
    h = ()
    for n in tl.static_range(DSTATE):
        h = h + (tl.zeros([BLOCK_D], tl.float32),)
    return h


@triton.jit
def _store_states(X, d_ptr_offs, d_mask, h, n_valid, DSTATE: tl.constexpr, GROUP: tl.constexpr,
                  EXACT: tl.constexpr):
    """_channel_states' inverse: the first n_valid states of the tuple h, to a (.., dim, dstate)
    array whose states are adjacent. GROUP states at a time are joined into a (BLOCK_D, GROUP)
    tile held inside each thread (as _state_row's loads are), so each thread writes its
    channel's GROUP states as one 16-byte vector: a warp instruction fills half of each of its
    32 sectors, where a store per state wrote 4 bytes into each (ncu: the chunk states then cost
    the forward ~1 ms of 3.5 at 262k x 512). A wider tile would be
    re-laid out through shared memory for the store, behind barriers. EXACT (no padding
    states) drops the mask over the states, which would keep the store from being vectorised."""
    BLOCK_D: tl.constexpr = h[0].shape[0]
    offs_g = tl.arange(0, GROUP)
    for g in tl.static_range(DSTATE // GROUP):
        if GROUP == 1:
            tile = tl.reshape(h[g], (BLOCK_D, 1))
        elif GROUP == 2:
            tile = tl.join(h[2 * g], h[2 * g + 1])
        else:  # GROUP == 4: the (BLOCK_D, 2, 2) axes read as the state's two bits, high first
            tile = tl.reshape(tl.join(tl.join(h[4 * g], h[4 * g + 2]), tl.join(h[4 * g + 1], h[4 * g + 3])),
                              (BLOCK_D, 4))
        n = g * GROUP + offs_g
        ptrs = X + d_ptr_offs[:, None] + n[None, :]
        if EXACT:
            tl.store(ptrs, tile, mask=d_mask[:, None])
        else:
            tl.store(ptrs, tile, mask=d_mask[:, None] & (n < n_valid)[None, :])


@triton.jit
def _prefetch_rows(X_ROW, row_stride, BLOCK_D: tl.constexpr, ROWS: tl.constexpr, PREFETCH: tl.constexpr):
    """Ask L1 for ROWS rows of B or C from X_ROW on (prefetch.global.L1: no register waits on
    it). B[t] and C[t] are read by every warp of a program in step t, at nearly the same time:
    without this, the first load of a line missed L1 and every warp waited for L2 (ncu:
    long-scoreboard stalls on those rows were most of pass 3's stall samples even with the rows
    loaded a step ahead). One tile ahead is microseconds of lead. Off in the interpreter
    (inline PTX)."""
    if PREFETCH:
        for j in tl.static_range(ROWS):
            ptrs = X_ROW + j * row_stride + tl.zeros([BLOCK_D], tl.int32)
            tl.inline_asm_elementwise("prefetch.global.L1 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                      is_pure=False, pack=1)


@triton.jit
def _chunk_decays(a, dt_sum, DSTATE: tl.constexpr, FAST_EXP: tl.constexpr):
    """prod_t exp(dt[t] A) over a stretch of steps = 2^(A log2(e) sum_t dt[t]), per state."""
    p = ()
    for n in tl.static_range(DSTATE):
        p = p + (_decay(dt_sum, a[n], FAST_EXP),)
    return p


@triton.jit
def _time_tile(X, base, t0, offs_t, stride_l, mask_d, t_limit):
    """(BLOCK_D, T) tile of steps t0 .. t0 + T - 1 in X's dtype (0 from t_limit on, and outside
    the channels). The kernels load a tile one loop iteration before its use, so that its HBM
    latency passes under the previous tile's 8 x dstate state-steps, and convert it there."""
    t = t0 + offs_t
    return tl.load(X + base[:, None] + t[None, :].to(tl.int64) * stride_l, mask=mask_d[:, None] & (t < t_limit)[None, :],
                   other=0.0)


@triton.jit
def _step_sizes(x, t0, offs_t, seqlen, bias, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """dt = softplus(delta + delta_bias) over a (BLOCK_D, T) tile of delta (x), 0 past the sequence
    end (a bias would otherwise make softplus(0 + bias) > 0 there)."""
    x = x.to(tl.float32)
    if HAS_BIAS:
        x += bias[:, None]
    if SOFTPLUS:
        x = _softplus(x)
    return tl.where((t0 + offs_t < seqlen)[None, :], x, 0.0)


@triton.jit
def _advance(h, a, dt, dtu, b, DSTATE: tl.constexpr, FAST_EXP: tl.constexpr):
    """One step of every state: h <- exp(dt A) h + dt u B."""
    out = ()
    for n in tl.static_range(DSTATE):
        # Two products: the compiler fuses one of them into an FFMA, and two builds of a kernel
        # need not fuse the same one (seen on the GPU: pass 3 with and without the chunk states
        # differed by float32 rounding). Writing the fma out (tl.fma) fixes the choice but
        # changed ptxas's allocation under OUT_MAXNREG: 24 -> 116-144 spilled registers, with
        # spills inside the hot loop (offline sm_90), so it is left to the compiler.
        out = out + (_decay(dt, a[n], FAST_EXP) * h[n] + dtu * b[n],)
    return out


@triton.jit
def _advance_and_read(h, a, dt, dtu, b, c, DSTATE: tl.constexpr, FAST_EXP: tl.constexpr):
    """One step of every state, and y = sum_n C h after it."""
    out = ()
    y = tl.zeros_like(dt)
    for n in tl.static_range(DSTATE):
        hn = _decay(dt, a[n], FAST_EXP) * h[n] + dtu * b[n]  # see _advance
        y += c[n] * hn
        out = out + (hn,)
    return out, y


@triton.jit
def _segment_setup(A, DELTA_BIAS, dim, dstate, stride_ad, stride_an, BLOCK_D: tl.constexpr,
                   DSTATE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The program's channels, A log2(e) per state and the delta bias, (BLOCK_D,) each."""
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < dim
    a = _channel_states(A, offs_d * stride_ad, mask_d, stride_an, dstate, LOG2E, DSTATE)
    bias = tl.zeros([BLOCK_D], tl.float32)
    if HAS_BIAS:
        bias = tl.load(DELTA_BIAS + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    return offs_d, mask_d, a, bias


@triton.jit
def _seq_local_kernel(U, DELTA, DELTA_BIAS, A, B, S_LOC, P, seqlen, seg_len, dim, dstate,
                      stride_ub, stride_ul, stride_ud, stride_db, stride_dl, stride_dd, stride_ad, stride_an,
                      stride_bb, stride_bl, stride_bn, stride_sb, stride_sc, stride_sd,
                      BLOCK_D: tl.constexpr, DSTATE: tl.constexpr, GROUP: tl.constexpr, FAST_EXP: tl.constexpr,
                      HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, ROWS_AHEAD: tl.constexpr,
                      PREFETCH: tl.constexpr, EXACT: tl.constexpr):
    """Pass 1: each segment from a zero state; its final state S_k and decay P_k."""
    off_b, seg = tl.program_id(0), tl.program_id(2)
    offs_d, mask_d, a, bias = _segment_setup(A, DELTA_BIAS, dim, dstate, stride_ad, stride_an, BLOCK_D, DSTATE,
                                             HAS_BIAS)
    offs_t = tl.arange(0, 8)
    u_base = off_b.to(tl.int64) * stride_ub + offs_d.to(tl.int64) * stride_ud
    d_base = off_b.to(tl.int64) * stride_db + offs_d.to(tl.int64) * stride_dd
    t_start = seg * seg_len
    t_end = tl.minimum(t_start + seg_len, seqlen)
    # B's rows from the segment start (offsets within a segment stay small in 32 bits)
    b_seg = B + off_b.to(tl.int64) * stride_bb + t_start.to(tl.int64) * stride_bl
    h = _zero_states(BLOCK_D, DSTATE)
    dt_sum = tl.zeros([BLOCK_D], tl.float32)
    # Loads run ahead of their use: the next tile of delta and u one iteration ahead, B's rows
    # ROWS_AHEAD steps ahead (see _rows_ahead).
    nxt_delta = _time_tile(DELTA, d_base, t_start, offs_t, stride_dl, mask_d, t_end)
    nxt_u = _time_tile(U, u_base, t_start, offs_t, stride_ul, mask_d, t_end)
    # B's rows are DSTATE floats apart (a constant: the row loads take immediate offsets)
    b_ring = _first_rows(b_seg, stride_bn, BLOCK_D, DSTATE, GROUP, ROWS_AHEAD)
    for t0 in range(t_start, t_end, 8):
        cur_delta, cur_u = nxt_delta, nxt_u
        nxt_delta = _time_tile(DELTA, d_base, t0 + 8, offs_t, stride_dl, mask_d, t_end)
        nxt_u = _time_tile(U, u_base, t0 + 8, offs_t, stride_ul, mask_d, t_end)
        _prefetch_rows(b_seg + (t0 + 8 - t_start) * DSTATE, DSTATE, BLOCK_D, 8, PREFETCH)
        dt = _step_sizes(cur_delta, t0, offs_t, seqlen, bias, HAS_BIAS, SOFTPLUS)
        dtu = dt * cur_u.to(tl.float32)
        dt_sum += tl.sum(dt, 1)
        dts, dtus = _steps(dt), _steps(dtu)
        for j in tl.static_range(8):
            b, b_ring = _rows_ahead(b_ring, b_seg, t0 + j, t_start, stride_bn, BLOCK_D, DSTATE, GROUP, ROWS_AHEAD)
            h = _advance(h, a, dts[j], dtus[j], b, DSTATE, FAST_EXP)
    s_offs = off_b.to(tl.int64) * stride_sb + seg.to(tl.int64) * stride_sc + offs_d * stride_sd
    _store_states(S_LOC, s_offs, mask_d, h, dstate, DSTATE, GROUP, EXACT)
    _store_states(P, s_offs, mask_d, _chunk_decays(a, dt_sum, DSTATE, FAST_EXP), dstate, DSTATE, GROUP, EXACT)


@triton.jit
def _seq_out_kernel(U, DELTA, DELTA_BIAS, A, B, C, D, Z, H_SEG, OUT, H_CHUNK, P_CHUNK, seqlen, seg_len, dim, dstate,
                    stride_ub, stride_ul, stride_ud, stride_db, stride_dl, stride_dd, stride_ad, stride_an,
                    stride_bb, stride_bl, stride_bn, stride_cb, stride_cl, stride_cn, stride_zb, stride_zl, stride_zd,
                    stride_ob, stride_ol, stride_od, stride_sb, stride_sc, stride_sd, stride_hb, stride_hc,
                    stride_hd, BLOCK_D: tl.constexpr, DSTATE: tl.constexpr, GROUP: tl.constexpr,
                    CHUNK: tl.constexpr, FAST_EXP: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
                    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, SAVE_CHUNKS: tl.constexpr, ROWS_AHEAD: tl.constexpr,
                    PREFETCH: tl.constexpr, EXACT: tl.constexpr):
    """Pass 3: each segment from its true initial state H_k: out = (sum_n C h + u D) silu(z),
    rounded once to OUT's dtype; with SAVE_CHUNKS, each CHUNK-step chunk's initial state and
    decay for the backward (segments hold whole chunks: seg_len is a multiple of CHUNK)."""
    off_b, seg = tl.program_id(0), tl.program_id(2)
    offs_d, mask_d, a, bias = _segment_setup(A, DELTA_BIAS, dim, dstate, stride_ad, stride_an, BLOCK_D, DSTATE,
                                             HAS_BIAS)
    offs_t = tl.arange(0, 8)
    skip = tl.zeros([BLOCK_D], tl.float32)
    if HAS_D:
        skip = tl.load(D + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    b64 = off_b.to(tl.int64)
    u_base = b64 * stride_ub + offs_d.to(tl.int64) * stride_ud
    d_base = b64 * stride_db + offs_d.to(tl.int64) * stride_dd
    z_base = b64 * stride_zb + offs_d.to(tl.int64) * stride_zd
    o_base = b64 * stride_ob + offs_d.to(tl.int64) * stride_od
    h = _channel_states(H_SEG, b64 * stride_sb + seg.to(tl.int64) * stride_sc + offs_d * stride_sd,
                        mask_d, 1, dstate, 1.0, DSTATE)
    # chunk-state offsets from the segment's first chunk (a chunk index times the chunk stride
    # passes 2^31 at genome scale)
    t_start = seg * seg_len
    h_offs = b64 * stride_hb + (t_start // CHUNK).to(tl.int64) * stride_hc + offs_d * stride_hd
    t_end = tl.minimum(t_start + seg_len, seqlen)
    b_seg = B + b64 * stride_bb + t_start.to(tl.int64) * stride_bl
    c_seg = C + b64 * stride_cb + t_start.to(tl.int64) * stride_cl
    dt_sum = tl.zeros([BLOCK_D], tl.float32)
    # Loads run ahead of their use, as in _seq_local_kernel.
    nxt_delta = _time_tile(DELTA, d_base, t_start, offs_t, stride_dl, mask_d, t_end)
    nxt_u = _time_tile(U, u_base, t_start, offs_t, stride_ul, mask_d, t_end)
    if HAS_Z:
        nxt_z = _time_tile(Z, z_base, t_start, offs_t, stride_zl, mask_d, t_end)
    b_ring = _first_rows(b_seg, stride_bn, BLOCK_D, DSTATE, GROUP, ROWS_AHEAD)
    c_ring = _first_rows(c_seg, stride_cn, BLOCK_D, DSTATE, GROUP, ROWS_AHEAD)
    for t0 in range(t_start, t_end, 8):
        if SAVE_CHUNKS:
            if t0 % CHUNK == 0:  # the state entering chunk t0 // CHUNK
                _store_states(H_CHUNK, h_offs + ((t0 - t_start) // CHUNK) * stride_hc, mask_d, h, dstate, DSTATE,
                              GROUP, EXACT)
        cur_delta, cur_u = nxt_delta, nxt_u
        nxt_delta = _time_tile(DELTA, d_base, t0 + 8, offs_t, stride_dl, mask_d, t_end)
        nxt_u = _time_tile(U, u_base, t0 + 8, offs_t, stride_ul, mask_d, t_end)
        if HAS_Z:
            cur_z = nxt_z
            nxt_z = _time_tile(Z, z_base, t0 + 8, offs_t, stride_zl, mask_d, t_end)
        _prefetch_rows(b_seg + (t0 + 8 - t_start) * DSTATE, DSTATE, BLOCK_D, 8, PREFETCH)
        _prefetch_rows(c_seg + (t0 + 8 - t_start) * DSTATE, DSTATE, BLOCK_D, 8, PREFETCH)
        dt = _step_sizes(cur_delta, t0, offs_t, seqlen, bias, HAS_BIAS, SOFTPLUS)
        u = cur_u.to(tl.float32)
        dts, dtus = _steps(dt), _steps(dt * u)
        ys = ()
        for j in tl.static_range(8):
            b, b_ring = _rows_ahead(b_ring, b_seg, t0 + j, t_start, stride_bn, BLOCK_D, DSTATE, GROUP, ROWS_AHEAD)
            c, c_ring = _rows_ahead(c_ring, c_seg, t0 + j, t_start, stride_cn, BLOCK_D, DSTATE, GROUP, ROWS_AHEAD)
            h, y = _advance_and_read(h, a, dts[j], dtus[j], b, c, DSTATE, FAST_EXP)
            ys = ys + (y,)
        y = _tile_of_steps(ys)
        if HAS_D:
            y += u * skip[:, None]
        if HAS_Z:
            z = cur_z.to(tl.float32)
            y *= z * _sigmoid(z)
        t = t0 + offs_t
        tl.store(OUT + o_base[:, None] + t[None, :].to(tl.int64) * stride_ol, y.to(OUT.dtype.element_ty),
                 mask=mask_d[:, None] & (t < seqlen)[None, :])
        if SAVE_CHUNKS:
            dt_sum += tl.sum(dt, 1)
            if ((t0 + 8) % CHUNK == 0) | (t0 + 8 >= t_end):  # the chunk's last tile: its decay
                _store_states(P_CHUNK, h_offs + ((t0 - t_start) // CHUNK) * stride_hc, mask_d,
                              _chunk_decays(a, dt_sum, DSTATE, FAST_EXP), dstate, DSTATE, GROUP, EXACT)
                dt_sum = tl.zeros([BLOCK_D], tl.float32)


# ---------------------------------------------------------------- launch


def config(batch: int, seqlen: int, dim: int, dstate: int, chunk: int, device: torch.device,
           interpreted: bool, chunks_per_segment: int | None = None) -> dict:
    """Tile sizes and the segment length.

    BLOCK_D = 32 channels per warp, 4 warps; DSTATE the states rounded up to GROUP (4, or the
    next power of two below 4). The sequence splits into segments so that the launch has
    PROGRAMS_PER_SM programs per SM (each program's work is the same, so the waves are even), each
    a whole number of CHUNK-step chunks (the backward's chunk states) and at least one chunk. In
    the interpreter, one chunk per segment, so that small tests cross segment boundaries;
    chunks_per_segment forces the split (tests run several chunks inside one segment with it)."""
    warps = 1 if interpreted else 4
    block_d = 32 * warps
    group = 4 if dstate >= 4 else next_power_of_2(dstate)
    n_chunks = cdiv(seqlen, chunk)
    if chunks_per_segment is not None:
        chunks_per_seg = chunks_per_segment
    elif interpreted or device.type != "cuda":
        chunks_per_seg = 1
    else:
        rows = batch * cdiv(dim, block_d)
        segments = max(1, cdiv(PROGRAMS_PER_SM * sm_count(device), rows))
        chunks_per_seg = cdiv(n_chunks, segments)
    padded = cdiv(dstate, group) * group
    return dict(BLOCK_D=block_d, DSTATE=padded, GROUP=group, ROWS_AHEAD=ROWS_AHEAD, PREFETCH=not interpreted,
                EXACT=padded == dstate, num_warps=warps, seg_len=chunks_per_seg * chunk,
                n_seg=cdiv(n_chunks, chunks_per_seg))


def _float_rows(x: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """B or C, (batch, seqlen, dstate), as float32 (batch, rows, width) with each step's states
    adjacent: what _state_row loads, zero past the sequence and the states. A copy of dstate
    values per step, small beside the dim-wide u, delta, z."""
    seqlen, dstate = x.shape[1], x.shape[2]
    out = x.new_empty(x.shape[0], rows, width, dtype=torch.float32)
    out[:, :seqlen, :dstate] = x
    out[:, seqlen:].zero_()  # only what the copy leaves: the rows past the sequence,
    out[:, :seqlen, dstate:].zero_()  # and the states past dstate
    return out


def scan_forward(u, delta, A, B, C, interpreted: bool = False, *, D=None, z=None, delta_bias=None,
                 softplus: bool = False, save_chunks: bool = True, out_dtype: torch.dtype | None = None,
                 chunks_per_segment: int | None = None):
    """out = (core(u, dt, A, B, C) + u D) silu(z) (each part where given), dt = softplus(delta +
    delta_bias), in out_dtype (u's by default) and u's layout (channels-first u gives a
    channels-first out). Returns (out, H, P): each CHUNK-step chunk's initial state and decay,
    (batch, n_chunks, dim, dstate) float32, for the chunked backward kernels (None, None with
    save_chunks=False). Any strides and float dtypes; A is float32."""
    batch, seqlen, dim = u.shape
    dstate = A.shape[1]
    chunk = chunk_blocks(dim, dstate, interpreted)["CHUNK"]
    cfg = config(batch, seqlen, dim, dstate, chunk, u.device, interpreted, chunks_per_segment)
    seg_len, n_seg = cfg.pop("seg_len"), cfg.pop("n_seg")
    assert chunk % T == 0 and seg_len % chunk == 0, (chunk, seg_len)  # tiles never straddle a chunk
    grid = (batch, cdiv(dim, cfg["BLOCK_D"]), n_seg)
    flags = kernel_flags(D, z, delta_bias, softplus)
    bias = u if delta_bias is None else delta_bias  # placeholder pointers where not given
    fast_exp = not interpreted
    # every row the ring reads or L1 is asked for: the last segment's whole tiles, and
    # ROWS_AHEAD steps or a tile past them
    rows = n_seg * seg_len + max(cfg["ROWS_AHEAD"], 2 * T)
    B32 = _float_rows(B, rows, cfg["DSTATE"])
    common = (seqlen, seg_len, dim, dstate, *strides3(u), *strides3(delta), A.stride(0), A.stride(1),
              *strides3(B32))
    s_loc, s_decay, h_seg = (torch.empty(batch, n_seg, dim, dstate, device=u.device, dtype=torch.float32)
                             for _ in range(3))
    s_strides = strides3(s_loc)
    _seq_local_kernel[grid](u, delta, bias, A, B32, s_loc, s_decay, *common, *s_strides, FAST_EXP=fast_exp,
                            HAS_BIAS=flags["HAS_BIAS"], SOFTPLUS=flags["SOFTPLUS"], **cfg)
    carry_walk(s_loc, s_decay, h_seg, False, chunk_blocks(dim, dstate, interpreted))
    del s_loc, s_decay
    # out in u's layout: a channels-first u (time contiguous) gives a channels-first out.
    if u.stride(1) == 1 and seqlen > 1:
        out = torch.empty(batch, dim, seqlen, device=u.device, dtype=out_dtype or u.dtype).transpose(1, 2)
    else:
        out = torch.empty(batch, seqlen, dim, device=u.device, dtype=out_dtype or u.dtype)
    n_chunks = cdiv(seqlen, chunk)
    if save_chunks:
        h_chunk = torch.empty(batch, n_chunks, dim, dstate, device=u.device, dtype=torch.float32)
        p_chunk = torch.empty_like(h_chunk)
    else:
        h_chunk = p_chunk = h_seg  # placeholders, never written
    gate = u if z is None else z
    C32 = _float_rows(C, rows, cfg["DSTATE"])
    _seq_out_kernel[grid](u, delta, bias, A, B32, C32, u if D is None else D, gate, h_seg, out, h_chunk, p_chunk,
                          *common, *strides3(C32), *strides3(gate), *strides3(out), *s_strides,
                          *strides3(h_chunk), CHUNK=chunk, FAST_EXP=fast_exp, SAVE_CHUNKS=save_chunks, **flags,
                          **cfg, **({} if interpreted else dict(maxnreg=OUT_MAXNREG)))
    if not save_chunks:
        return out, None, None
    return out, h_chunk, p_chunk
