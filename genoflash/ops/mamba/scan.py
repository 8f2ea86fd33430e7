"""The selective scan's core in Triton, chunked so a long sequence fills the GPU.

The core is h[t] = a[t] * h[t-1] + b[t], y[t] = sum_n C[t, n] h[t], per (batch, channel d,
state n), with a = exp(dt A) and b = dt B u (reference.py). The element-wise parts around it
run inside the same kernels, as in mamba-ssm's CUDA scan: the step size dt = softplus(delta +
delta_bias) is formed from delta where a tile is loaded, and the output pass writes
out = (y + u D) * silu(z) in the output dtype. No (token, channel) float32 tensor reaches HBM:
at a million tokens and 512 channels each would be 2 GiB.

A program owns one chunk of CHUNK time steps of BLOCK_D channels, all states, as a register
tile (CHUNK, BLOCK_D, BLOCK_N), and scans along time with `tl.associative_scan` over the
linear-recurrence operator (a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2). Chunks depend on each
other only through one state each, so the scan runs in three passes:
  1. every chunk scans from a zero state: its final local state S_c and its decay P_c = prod a;
  2. the chunk carries H_{c+1} = P_c H_c + S_c, a walk over the chunks in order (a
     (BLOCK_D, BLOCK_N) tile per chunk). With many chunks (32k at a million tokens) the walk
     is two-level so its sequential depth is ~2 sqrt(n_chunks), not n_chunks: groups of G
     chunks compose their (P, S) in parallel, one walk over the groups gives each group's
     carry, and the groups expand it to their chunks in parallel;
  3. every chunk rescans from its true initial state H_c, h[t] = h_loc[t] + (prod a)[0..t] H_c,
     and writes y.
The backward runs the adjoint g[t] = dL/dh[t] = C[t] dy[t] + a[t+1] g[t+1] the same way in
reverse (a reverse associative scan), with dy = dout silu(z) the core's share of the output
gradient. Then, with h and g both in registers for a chunk, it forms every gradient in one
pass. a[t] h[t-1] = h[t] - b[t] gives the terms that need h[t-1] without a shifted copy:
    du[t, d]  = dt[t, d] sum_n g B[t, n] + D[d] dy[t, d]
    ddt[t, d] = sum_n A g (h - b) + u[t, d] sum_n g B[t, n]      ddelta = ddt sigmoid(delta + bias)
    dz[t, d]  = dout (y + u D) silu'(z), y = sum_n C h recomputed from the h in registers
    dA[d, n]  = sum_t dt g (h - b)     dB[t, n] = sum_d g dt u     dC[t, n] = sum_d dy h
    dD[d]     = sum_t dy u             ddelta_bias[d] = sum_t ddelta
dA, dD and ddelta_bias go out as per-chunk partial sums. dB and dC sum over channels, which
other programs own: each channel block writes its partial sums and PyTorch adds them (no
atomics, so the backward is deterministic); with deterministic=False they are added atomically
instead, from narrower channel blocks.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..host import cdiv, next_power_of_2


@triton.jit
def _linear_recurrence(a1, b1, a2, b2):
    """Compose h -> a1 h + b1 (earlier) with h -> a2 h + b2 (later)."""
    return a1 * a2, a2 * b1 + b2


@triton.jit
def _tile_2d(ptr, stride_t, stride_x, offs_t, offs_x, n_t, n_x):
    """(CHUNK, X) tile of a (time, x) slice as float32; out-of-range reads are 0."""
    mask = (offs_t[:, None] < n_t) & (offs_x[None, :] < n_x)
    return tl.load(ptr + offs_t[:, None] * stride_t + offs_x[None, :] * stride_x, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _softplus(x):
    """log(1 + exp(x)) = max(x, 0) + log1p(e), e = exp(-|x|) in (0, 1], without overflow (as
    PyTorch's softplus, which returns x itself above 20, where this rounds to x as well).
    log1p(e) = 2 atanh(s), s = e / (2 + e) <= 1/3, by its odd series to s^13 (truncation below
    2e-8 relative), with one exp and one division: within ~1e-7 relative near x = 0, ~2e-6 at
    |x| = 30 (exp2 of a rounded large argument; tests/test_mamba.py checks it). log(1 + e) itself loses
    relative accuracy where e is small (e ~ 1e-3 at Mamba's smallest initial steps), in
    fp32 and in PTX's approximate lg2 alike. Each (time, channel) value is computed by every
    thread that holds one of its states (the (CHUNK, BLOCK_D) tile is a slice of the 3-D one),
    so it is kept to two MUFU operations; libdevice's precise log took the local pass from 768
    to 1,800 instructions per thread (sm_90, bf16 inputs)."""
    e = tl.math.exp2(-tl.abs(x) * 1.4426950408889634)
    s = e / (2.0 + e)
    s2 = s * s
    series = 1.0 + s2 * (1.0 / 3 + s2 * (1.0 / 5 + s2 * (1.0 / 7 + s2 * (1.0 / 9 + s2 * (1.0 / 11 + s2 / 13)))))
    return tl.maximum(x, 0.0) + 2.0 * s * series


@triton.jit
def _sigmoid(x):
    """1 / (1 + exp(-x)), with exp2 (one MUFU) and the approximate division."""
    return 1.0 / (1.0 + tl.math.exp2(-x * 1.4426950408889634))


@triton.jit
def _step_size(DELTA, DELTA_BIAS, off_b, t0, d0, dim, stride_db, stride_dl, stride_dd, offs_t, offs_d, n_t,
               HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """dt = softplus(delta + delta_bias) (each part where asked) over one (CHUNK, BLOCK_D) tile,
    float32, and x = delta + delta_bias (softplus's derivative is sigmoid(x)). Steps at or past
    n_t get dt = 0, so a = exp(dt A) = 1 and b = 0 there: they leave the state unchanged (a
    bias would otherwise make softplus(0 + bias) > 0 past the sequence end)."""
    delta = _tile_2d(DELTA + off_b.to(tl.int64) * stride_db + t0.to(tl.int64) * stride_dl + d0 * stride_dd,
                     stride_dl, stride_dd, offs_t, offs_d, n_t, dim - d0)
    x = delta
    if HAS_BIAS:
        x += tl.load(DELTA_BIAS + d0 + offs_d, mask=offs_d < dim - d0, other=0.0).to(tl.float32)[None, :]
    dt = x
    if SOFTPLUS:
        dt = _softplus(x)
    return tl.where((offs_t < n_t)[:, None], dt, 0.0), x


@triton.jit
def _channel_vector(X, d0, dim, offs_d, HAS: tl.constexpr, BLOCK_D: tl.constexpr):
    """A (BLOCK_D,) slice of a per-channel float vector (D), float32; zeros when not given."""
    v = tl.zeros([BLOCK_D], dtype=tl.float32)
    if HAS:
        v = tl.load(X + d0 + offs_d, mask=offs_d < dim - d0, other=0.0).to(tl.float32)
    return v


@triton.jit
def _chunk_inputs(U, DELTA, DELTA_BIAS, A, B, off_b, t0, d0, seqlen, dim, dstate,
                  stride_ub, stride_ul, stride_ud, stride_db, stride_dl, stride_dd, stride_ad, stride_an,
                  stride_bb, stride_bl, stride_bn,
                  CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """a = exp(dt A), b = dt u B over one chunk, (CHUNK, BLOCK_D, BLOCK_N) float32, with u, dt,
    x = delta + bias, B and A as loaded (float32). Past the sequence end dt = 0 (_step_size)."""
    offs_t = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    n_t = seqlen - t0
    u = _tile_2d(U + off_b.to(tl.int64) * stride_ub + t0.to(tl.int64) * stride_ul + d0 * stride_ud,
                 stride_ul, stride_ud, offs_t, offs_d, n_t, dim - d0)
    dt, x = _step_size(DELTA, DELTA_BIAS, off_b, t0, d0, dim, stride_db, stride_dl, stride_dd, offs_t, offs_d, n_t,
                       HAS_BIAS, SOFTPLUS)
    bmat = _tile_2d(B + off_b.to(tl.int64) * stride_bb + t0.to(tl.int64) * stride_bl, stride_bl, stride_bn,
                    offs_t, offs_n, n_t, dstate)
    amat = _tile_2d(A + d0 * stride_ad, stride_ad, stride_an, offs_d, offs_n, dim - d0, dstate)
    a = tl.exp(dt[:, :, None] * amat[None, :, :])
    b = (dt * u)[:, :, None] * bmat[:, None, :]
    return a, b, u, dt, x, bmat, amat


@triton.jit
def _write_partial(ptr, value, mask, ATOMIC: tl.constexpr):
    """A partial sum: added into one shared float32 buffer (ATOMIC: no partials, but the order of
    the additions varies from run to run), or stored in this program's own slot."""
    if ATOMIC:
        tl.atomic_add(ptr, value, mask=mask, sem="relaxed")
    else:
        tl.store(ptr, value, mask=mask)


@triton.jit
def _row(x, offs_t, t: tl.constexpr):
    """Row t of a (CHUNK, ...) tile: a masked sum, since register tiles are not indexable."""
    return tl.sum(tl.where(offs_t[:, None, None] == t, x, 0.0), 0)


@triton.jit
def _state_ptrs(S, off_b, chunk, d0, stride_sb, stride_sc, stride_sd, dim, dstate,
                BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    ptrs = (S + off_b.to(tl.int64) * stride_sb + chunk.to(tl.int64) * stride_sc + (d0 + offs_d)[:, None] * stride_sd
            + offs_n[None, :])
    mask = ((d0 + offs_d)[:, None] < dim) & (offs_n[None, :] < dstate)
    return ptrs, mask


@triton.jit
def _scan_chunk_local_kernel(U, DELTA, DELTA_BIAS, A, B, S_LOC, P, seqlen, dim, dstate,
                             stride_ub, stride_ul, stride_ud, stride_db, stride_dl, stride_dd, stride_ad, stride_an,
                             stride_bb, stride_bl, stride_bn, stride_sb, stride_sc, stride_sd,
                             CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                             HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """Pass 1: each chunk's final state from a zero start (S_c) and its decay (P_c)."""
    off_b, d0, chunk = tl.program_id(0), tl.program_id(1) * BLOCK_D, tl.program_id(2)
    a, b, _, _, _, _, _ = _chunk_inputs(U, DELTA, DELTA_BIAS, A, B, off_b, chunk * CHUNK, d0, seqlen, dim, dstate,
                                        stride_ub, stride_ul, stride_ud, stride_db, stride_dl, stride_dd, stride_ad,
                                        stride_an, stride_bb, stride_bl, stride_bn, CHUNK, BLOCK_D, BLOCK_N,
                                        HAS_BIAS, SOFTPLUS)
    a_cum, h_loc = tl.associative_scan((a, b), 0, _linear_recurrence)
    offs_t = tl.arange(0, CHUNK)
    ptrs, mask = _state_ptrs(S_LOC, off_b, chunk, d0, stride_sb, stride_sc, stride_sd, dim, dstate, BLOCK_D, BLOCK_N)
    tl.store(ptrs, _row(h_loc, offs_t, CHUNK - 1), mask=mask)
    ptrs, mask = _state_ptrs(P, off_b, chunk, d0, stride_sb, stride_sc, stride_sd, dim, dstate, BLOCK_D, BLOCK_N)
    tl.store(ptrs, _row(a_cum, offs_t, CHUNK - 1), mask=mask)


@triton.jit
def _scan_chunk_pass_kernel(S_LOC, P, H, n_chunks, dim, dstate, stride_sb, stride_sc, stride_sd,
                            REVERSE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pass 2: walk the chunks in order (forward: H_{c+1} = P_c H_c + S_c, storing each chunk's
    initial state), or in reverse for the adjoint (X_{c-1} = S_c + P_c X_c, storing each
    chunk's carried-in adjoint). S_LOC and P are indexed by chunk either way."""
    off_b, d0 = tl.program_id(0), tl.program_id(1) * BLOCK_D
    carry = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    for i in range(0, n_chunks):
        if REVERSE:
            chunk = n_chunks - 1 - i
        else:
            chunk = i
        ptrs, mask = _state_ptrs(H, off_b, chunk, d0, stride_sb, stride_sc, stride_sd, dim, dstate, BLOCK_D, BLOCK_N)
        tl.store(ptrs, carry, mask=mask)
        p_ptrs, _ = _state_ptrs(P, off_b, chunk, d0, stride_sb, stride_sc, stride_sd, dim, dstate, BLOCK_D, BLOCK_N)
        s_ptrs, _ = _state_ptrs(S_LOC, off_b, chunk, d0, stride_sb, stride_sc, stride_sd, dim, dstate, BLOCK_D,
                                BLOCK_N)
        carry = tl.load(p_ptrs, mask=mask, other=0.0) * carry + tl.load(s_ptrs, mask=mask, other=0.0)


@triton.jit
def _chunk_groups_kernel(S_LOC, P, OUT, GROUP_S, GROUP_P, GROUP_H, n_chunks, group_size, dim, dstate,
                         stride_sb, stride_sc, stride_sd, stride_gb, stride_gc, stride_gd,
                         EXPAND: tl.constexpr, REVERSE: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_N: tl.constexpr):
    """The two ends of the two-level carry walk, for the group of chunks this program owns
    (chunks in walk order, reversed for the adjoint):
      EXPAND False: compose the group's chunk maps h -> P h + S into one, (GROUP_P, GROUP_S);
      EXPAND True:  walk the group from its carry GROUP_H, storing each chunk's carry in OUT."""
    off_b, d0, group = tl.program_id(0), tl.program_id(1) * BLOCK_D, tl.program_id(2)
    g_ptrs, mask = _state_ptrs(GROUP_H, off_b, group, d0, stride_gb, stride_gc, stride_gd, dim, dstate, BLOCK_D,
                               BLOCK_N)
    if EXPAND:
        carry = tl.load(g_ptrs, mask=mask, other=0.0)
    else:
        carry = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    decay = tl.full([BLOCK_D, BLOCK_N], 1.0, dtype=tl.float32)
    for j in range(0, group_size):
        step = group * group_size + j
        if step < n_chunks:
            if REVERSE:
                chunk = n_chunks - 1 - step
            else:
                chunk = step
            p_ptrs, _ = _state_ptrs(P, off_b, chunk, d0, stride_sb, stride_sc, stride_sd, dim, dstate, BLOCK_D,
                                    BLOCK_N)
            s_ptrs, _ = _state_ptrs(S_LOC, off_b, chunk, d0, stride_sb, stride_sc, stride_sd, dim, dstate, BLOCK_D,
                                    BLOCK_N)
            p = tl.load(p_ptrs, mask=mask, other=0.0)
            if EXPAND:
                o_ptrs, _ = _state_ptrs(OUT, off_b, chunk, d0, stride_sb, stride_sc, stride_sd, dim, dstate,
                                        BLOCK_D, BLOCK_N)
                tl.store(o_ptrs, carry, mask=mask)
            else:
                decay = p * decay
            carry = p * carry + tl.load(s_ptrs, mask=mask, other=0.0)
    if not EXPAND:
        s_ptrs, _ = _state_ptrs(GROUP_S, off_b, group, d0, stride_gb, stride_gc, stride_gd, dim, dstate, BLOCK_D,
                                BLOCK_N)
        tl.store(s_ptrs, carry, mask=mask)
        p_ptrs, _ = _state_ptrs(GROUP_P, off_b, group, d0, stride_gb, stride_gc, stride_gd, dim, dstate, BLOCK_D,
                                BLOCK_N)
        tl.store(p_ptrs, decay, mask=mask)


@triton.jit
def _scan_chunk_out_kernel(U, DELTA, DELTA_BIAS, A, B, C, D, Z, H, OUT, seqlen, dim, dstate,
                           stride_ub, stride_ul, stride_ud, stride_db, stride_dl, stride_dd, stride_ad, stride_an,
                           stride_bb, stride_bl, stride_bn, stride_cb, stride_cl, stride_cn,
                           stride_zb, stride_zl, stride_zd, stride_sb, stride_sc, stride_sd,
                           CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                           HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_D: tl.constexpr,
                           HAS_Z: tl.constexpr):
    """Pass 3: rescan each chunk from its true initial state and write out = (sum_n C h + u D)
    * silu(z), rounded once to OUT's dtype. OUT has u's layout (the launcher checks)."""
    off_b, d0, chunk = tl.program_id(0), tl.program_id(1) * BLOCK_D, tl.program_id(2)
    t0 = chunk * CHUNK
    a, b, u, _, _, _, _ = _chunk_inputs(U, DELTA, DELTA_BIAS, A, B, off_b, t0, d0, seqlen, dim, dstate,
                                        stride_ub, stride_ul, stride_ud, stride_db, stride_dl, stride_dd, stride_ad,
                                        stride_an, stride_bb, stride_bl, stride_bn, CHUNK, BLOCK_D, BLOCK_N,
                                        HAS_BIAS, SOFTPLUS)
    a_cum, h_loc = tl.associative_scan((a, b), 0, _linear_recurrence)
    ptrs, mask = _state_ptrs(H, off_b, chunk, d0, stride_sb, stride_sc, stride_sd, dim, dstate, BLOCK_D, BLOCK_N)
    h = h_loc + a_cum * tl.load(ptrs, mask=mask, other=0.0)[None, :, :]
    offs_t = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    cmat = _tile_2d(C + off_b.to(tl.int64) * stride_cb + t0.to(tl.int64) * stride_cl, stride_cl, stride_cn,
                    offs_t, offs_n, seqlen - t0, dstate)
    y = tl.sum(h * cmat[:, None, :], 2)
    if HAS_D:
        y += u * _channel_vector(D, d0, dim, offs_d, HAS_D, BLOCK_D)[None, :]
    base = off_b.to(tl.int64) * stride_ub + t0.to(tl.int64) * stride_ul + d0 * stride_ud
    if HAS_Z:
        z = _tile_2d(Z + off_b.to(tl.int64) * stride_zb + t0.to(tl.int64) * stride_zl + d0 * stride_zd,
                     stride_zl, stride_zd, offs_t, offs_d, seqlen - t0, dim - d0)
        y *= z * _sigmoid(z)
    tl.store(OUT + base + offs_t[:, None] * stride_ul + offs_d[None, :] * stride_ud, y.to(OUT.dtype.element_ty),
             mask=(offs_t[:, None] < seqlen - t0) & ((d0 + offs_d)[None, :] < dim))


@triton.jit
def _chunk_adjoint(DELTA, DELTA_BIAS, C, DOUT, Z, off_b, t0, d0, seqlen, dim, dstate, amat,
                   stride_db, stride_dl, stride_dd, stride_cb, stride_cl, stride_cn, stride_yb, stride_yl, stride_yd,
                   stride_zb, stride_zl, stride_zd,
                   CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr,
                   SOFTPLUS: tl.constexpr, HAS_Z: tl.constexpr, FLIP_SCAN: tl.constexpr):
    """The within-chunk adjoint from dy alone, g_loc[t] = C[t] dy[t] + a[t+1] g_loc[t+1], and
    prod_{s>t} a[s] (the factor on the adjoint carried in from later chunks); plus the core's
    dy = dout silu(z) (dout where there is no gate), C, dout and z as loaded."""
    offs_t = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    n_t = seqlen - t0
    # a[t+1] within this chunk; 1 at the chunk's last step (the carried-in adjoint covers it)
    # and past the sequence end, where _step_size gives dt = 0.
    dt_next, _ = _step_size(DELTA, DELTA_BIAS, off_b, t0 + 1, d0, dim, stride_db, stride_dl, stride_dd, offs_t,
                            offs_d, tl.minimum(n_t - 1, CHUNK - 1), HAS_BIAS, SOFTPLUS)
    alpha = tl.exp(dt_next[:, :, None] * amat[None, :, :])
    base = off_b.to(tl.int64) * stride_yb + t0.to(tl.int64) * stride_yl + d0 * stride_yd
    dout = _tile_2d(DOUT + base, stride_yl, stride_yd, offs_t, offs_d, n_t, dim - d0)
    z = dout  # a placeholder where there is no gate
    dy = dout
    if HAS_Z:
        z = _tile_2d(Z + off_b.to(tl.int64) * stride_zb + t0.to(tl.int64) * stride_zl + d0 * stride_zd,
                     stride_zl, stride_zd, offs_t, offs_d, n_t, dim - d0)
        dy = dout * (z * _sigmoid(z))
    cmat = _tile_2d(C + off_b.to(tl.int64) * stride_cb + t0.to(tl.int64) * stride_cl, stride_cl, stride_cn,
                    offs_t, offs_n, n_t, dstate)
    dyc = dy[:, :, None] * cmat[:, None, :]
    if FLIP_SCAN:
        # The reverse scan as a forward scan of the time-flipped tile, flipped back: the same
        # compositions in the same order. On the forward's 16-channel tiles Triton keeps the
        # forward scan along time inside each thread, where the flips cost nothing, but lowers
        # reverse=True with lane shuffles (sm_90 SASS: the gradient kernel's 3,200 instructions
        # per thread, 1,056 of them SHFL, become 2,560 with 416; benchmarks/NOTES.md). On the
        # atomic path's 4-channel tiles the flips go through shared memory and cost more.
        alpha_rev, g_rev = tl.associative_scan((tl.flip(alpha, 0), tl.flip(dyc, 0)), 0, _linear_recurrence)
        return tl.flip(alpha_rev, 0), tl.flip(g_rev, 0), dy, cmat, dout, z
    alpha_cum, g_loc = tl.associative_scan((alpha, dyc), 0, _linear_recurrence, reverse=True)
    return alpha_cum, g_loc, dy, cmat, dout, z


@triton.jit
def _scan_chunk_bwd_local_kernel(U, DELTA, DELTA_BIAS, A, B, C, DOUT, Z, Y_LOC, seqlen, dim, dstate,
                                 stride_ub, stride_ul, stride_ud, stride_db, stride_dl, stride_dd, stride_ad,
                                 stride_an, stride_bb, stride_bl, stride_bn, stride_cb, stride_cl, stride_cn,
                                 stride_zb, stride_zl, stride_zd, stride_sb, stride_sc, stride_sd,
                                 CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                                 HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_Z: tl.constexpr,
                                 FLIP_SCAN: tl.constexpr):
    """Backward pass 1: what each chunk hands to the one before it from its own dy,
    a[first] g_loc[first] (the reverse pass then adds the decayed adjoint from later chunks).
    DOUT has u's layout."""
    off_b, d0, chunk = tl.program_id(0), tl.program_id(1) * BLOCK_D, tl.program_id(2)
    t0 = chunk * CHUNK
    a, _, _, _, _, _, amat = _chunk_inputs(U, DELTA, DELTA_BIAS, A, B, off_b, t0, d0, seqlen, dim, dstate,
                                           stride_ub, stride_ul, stride_ud, stride_db, stride_dl, stride_dd,
                                           stride_ad, stride_an, stride_bb, stride_bl, stride_bn,
                                           CHUNK, BLOCK_D, BLOCK_N, HAS_BIAS, SOFTPLUS)
    _, g_loc, _, _, _, _ = _chunk_adjoint(DELTA, DELTA_BIAS, C, DOUT, Z, off_b, t0, d0, seqlen, dim, dstate, amat,
                                          stride_db, stride_dl, stride_dd, stride_cb, stride_cl, stride_cn,
                                          stride_ub, stride_ul, stride_ud, stride_zb, stride_zl, stride_zd,
                                          CHUNK, BLOCK_D, BLOCK_N, HAS_BIAS,
                                          SOFTPLUS, HAS_Z, FLIP_SCAN)
    offs_t = tl.arange(0, CHUNK)
    ptrs, mask = _state_ptrs(Y_LOC, off_b, chunk, d0, stride_sb, stride_sc, stride_sd, dim, dstate, BLOCK_D, BLOCK_N)
    tl.store(ptrs, _row(a * g_loc, offs_t, 0), mask=mask)


@triton.jit
def _scan_chunk_grads_kernel(U, DELTA, DELTA_BIAS, A, B, C, D, Z, DOUT, H, X, DU, DDELTA, DZ,
                             DA_PART, DB_PART, DC_PART, DD_PART, DBIAS_PART, seqlen, dim, dstate,
                             stride_ub, stride_ul, stride_ud, stride_db, stride_dl, stride_dd, stride_ad, stride_an,
                             stride_bb, stride_bl, stride_bn, stride_cb, stride_cl, stride_cn,
                             stride_zb, stride_zl, stride_zd, stride_sb, stride_sc, stride_sd,
                             stride_pk, stride_pb, stride_pl, stride_vb, stride_vc,
                             CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                             HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_D: tl.constexpr,
                             HAS_Z: tl.constexpr, ATOMIC: tl.constexpr, FLIP_SCAN: tl.constexpr):
    """Backward pass 3: with h (forward rescan from H_c) and g (reverse rescan with X_c) of
    one chunk in registers, every gradient term (module docstring). du, ddelta and dz go out
    in their inputs' dtypes, rounded once, in u's layout (as DOUT); dA as per-chunk
    partial sums, dD and ddelta_bias as per-chunk (batch, chunk, channel) partial sums; dB and
    dC as per-channel-block partial sums, or (ATOMIC) added straight into one (B, L, N) float32
    buffer: no partials, but the order of the additions varies from run to run."""
    off_b, pid_d, chunk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    d0 = pid_d * BLOCK_D
    t0 = chunk * CHUNK
    a, b, u, dt, x, bmat, amat = _chunk_inputs(U, DELTA, DELTA_BIAS, A, B, off_b, t0, d0, seqlen, dim, dstate,
                                               stride_ub, stride_ul, stride_ud, stride_db, stride_dl, stride_dd,
                                               stride_ad, stride_an, stride_bb, stride_bl, stride_bn,
                                               CHUNK, BLOCK_D, BLOCK_N, HAS_BIAS, SOFTPLUS)
    a_cum, h_loc = tl.associative_scan((a, b), 0, _linear_recurrence)
    ptrs, mask = _state_ptrs(H, off_b, chunk, d0, stride_sb, stride_sc, stride_sd, dim, dstate, BLOCK_D, BLOCK_N)
    h = h_loc + a_cum * tl.load(ptrs, mask=mask, other=0.0)[None, :, :]
    alpha_cum, g_loc, dy, cmat, dout, z = _chunk_adjoint(
        DELTA, DELTA_BIAS, C, DOUT, Z, off_b, t0, d0, seqlen, dim, dstate, amat, stride_db, stride_dl, stride_dd,
        stride_cb, stride_cl, stride_cn, stride_ub, stride_ul, stride_ud, stride_zb, stride_zl, stride_zd,
        CHUNK, BLOCK_D, BLOCK_N, HAS_BIAS, SOFTPLUS, HAS_Z, FLIP_SCAN)
    ptrs, mask = _state_ptrs(X, off_b, chunk, d0, stride_sb, stride_sc, stride_sd, dim, dstate, BLOCK_D, BLOCK_N)
    g = g_loc + alpha_cum * tl.load(ptrs, mask=mask, other=0.0)[None, :, :]

    offs_t = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    d_skip = _channel_vector(D, d0, dim, offs_d, HAS_D, BLOCK_D)
    gb_sum = tl.sum(g * bmat[:, None, :], 2)                      # sum_n g B          (CHUNK, BLOCK_D)
    g_hb = g * (h - b)                                            # g a h[t-1]
    du = dt * gb_sum
    if HAS_D:
        du += dy * d_skip[None, :]
    ddelta = tl.sum(g_hb * amat[None, :, :], 2) + u * gb_sum      # dL/d dt
    if SOFTPLUS:
        ddelta *= _sigmoid(x)                                     # d softplus(x) / dx
    row_mask = offs_t < seqlen - t0
    td_mask = row_mask[:, None] & ((d0 + offs_d)[None, :] < dim)
    base = off_b.to(tl.int64) * stride_ub + t0.to(tl.int64) * stride_ul + d0 * stride_ud
    td = offs_t[:, None] * stride_ul + offs_d[None, :] * stride_ud
    tl.store(DU + base + td, du.to(DU.dtype.element_ty), mask=td_mask)
    tl.store(DDELTA + base + td, ddelta.to(DDELTA.dtype.element_ty), mask=td_mask)
    if HAS_Z:
        # dz needs the gate's input, y + u D: the core's y recomputed from the h in registers
        # instead of a float32 (token, channel) copy kept from the forward.
        y = tl.sum(h * cmat[:, None, :], 2) + u * d_skip[None, :]
        sig = _sigmoid(z)
        tl.store(DZ + base + td, (dout * y * (sig * (1.0 + z * (1.0 - sig)))).to(DZ.dtype.element_ty), mask=td_mask)

    ptrs, mask = _state_ptrs(DA_PART, off_b, chunk, d0, stride_sb, stride_sc, stride_sd, dim, dstate, BLOCK_D,
                             BLOCK_N)
    tl.store(ptrs, tl.sum(g_hb * dt[:, :, None], 0), mask=mask)
    # Per-channel sums over this chunk's steps (rows past the end hold dy = 0 and g = 0, so
    # they add nothing); PyTorch sums the chunks.
    v_ptrs = off_b.to(tl.int64) * stride_vb + chunk.to(tl.int64) * stride_vc + d0 + offs_d
    if HAS_D:
        tl.store(DD_PART + v_ptrs, tl.sum(dy * u, 0), mask=offs_d < dim - d0)
    if HAS_BIAS:
        tl.store(DBIAS_PART + v_ptrs, tl.sum(tl.where(td_mask, ddelta, 0.0), 0), mask=offs_d < dim - d0)
    tn_mask = row_mask[:, None] & (offs_n[None, :] < dstate)
    if ATOMIC:
        part = off_b.to(tl.int64) * stride_pb + t0.to(tl.int64) * stride_pl
    else:
        part = pid_d.to(tl.int64) * stride_pk + off_b.to(tl.int64) * stride_pb + t0.to(tl.int64) * stride_pl
    tn = offs_t[:, None] * stride_pl + offs_n[None, :]
    _write_partial(DB_PART + part + tn, tl.sum(g * (dt * u)[:, :, None], 1), tn_mask, ATOMIC)
    _write_partial(DC_PART + part + tn, tl.sum(dy[:, :, None] * h, 1), tn_mask, ATOMIC)


# ---------------------------------------------------------------- launchers

def _blocks(dim: int, dstate: int, interpreted: bool) -> dict:
    # A (CHUNK, BLOCK_D, BLOCK_N) float32 tile per live tensor: CHUNK * BLOCK_D * BLOCK_N = 8192
    # keeps each at 32 registers per thread over 8 warps.
    block_n = max(2, next_power_of_2(dstate))
    block_d = 8 if interpreted else max(1, min(16, 256 // block_n))
    chunk = 16 if interpreted else max(8, 8192 // (block_d * block_n))
    # 8 warps: 256 threads share each 8192-element tile (4 warps made the gradient pass spill).
    return dict(CHUNK=chunk, BLOCK_D=block_d, BLOCK_N=block_n, num_warps=8)


def _grads_blocks(dim: int, dstate: int, interpreted: bool, deterministic: bool) -> dict:
    """The gradient pass's tile. Deterministic: the forward's (each channel block writes its own
    dB/dC partials, so fewer, wider blocks keep those small), at 255 registers, one 8-warp
    program per SM. Not deterministic: a quarter of the channels, 108 registers, two programs
    per SM (offline_compile.py mamba), dB/dC added atomically with no partials."""
    cfg = _blocks(dim, dstate, interpreted)
    if not deterministic and not interpreted:
        cfg["BLOCK_D"] = max(1, cfg["BLOCK_D"] // 4)
    return cfg


def _strides3(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


# Below this many chunks one sequential walk is short enough.
_ONE_LEVEL_CHUNKS = 16

# Whether the backward scans the adjoint as a flipped forward scan (_chunk_adjoint; in
# scan_channels_first.py, a forward scan over inputs read in reversed step order). None: where the
# kernels are compiled. The interpreter runs tl.flip slowly (the scan tests took ~3x as long), so
# CPU runs take reverse=True unless a test sets this to True (tests/test_mamba.py does, for both).
FLIP_REVERSE_SCAN: bool | None = None


def _flip_reverse_scan(interpreted: bool) -> bool:
    return (not interpreted) if FLIP_REVERSE_SCAN is None else FLIP_REVERSE_SCAN


def _carry_walk(s_loc: torch.Tensor, decay: torch.Tensor, out: torch.Tensor, reverse: bool, cfg: dict) -> None:
    """out[c] = the carry into chunk c of the walk carry <- P_c carry + S_c (in chunk order, or
    reversed), from a zero start."""
    batch, n_chunks, dim, dstate = s_loc.shape
    blocks = dict(BLOCK_D=cfg["BLOCK_D"], BLOCK_N=cfg["BLOCK_N"], num_warps=4)
    grid = (batch, cdiv(dim, cfg["BLOCK_D"]))
    strides = _strides3(s_loc)
    if n_chunks <= _ONE_LEVEL_CHUNKS:
        _scan_chunk_pass_kernel[grid](s_loc, decay, out, n_chunks, dim, dstate, *strides, REVERSE=reverse, **blocks)
        return
    group_size = max(2, math.isqrt(n_chunks))
    n_groups = cdiv(n_chunks, group_size)
    group_s, group_p, group_h = (torch.empty(batch, n_groups, dim, dstate, device=s_loc.device, dtype=torch.float32)
                                 for _ in range(3))
    g_strides = _strides3(group_s)
    for expand in (False, True):
        if expand:  # the groups' carries: one walk over the composed groups, in walk order
            _scan_chunk_pass_kernel[grid](group_s, group_p, group_h, n_groups, dim, dstate, *g_strides,
                                          REVERSE=False, **blocks)
        _chunk_groups_kernel[(*grid, n_groups)](s_loc, decay, out, group_s, group_p, group_h, n_chunks, group_size,
                                                dim, dstate, *strides, *g_strides, EXPAND=expand, REVERSE=reverse,
                                                **blocks)


def _flags(D, z, delta_bias, softplus: bool) -> dict:
    return dict(HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(softplus), HAS_D=D is not None, HAS_Z=z is not None)


def _same_layout(u: torch.Tensor, **others: torch.Tensor | None) -> None:
    """The kernels index z, dout and the (token, channel) gradients with u's strides."""
    for name, t in others.items():
        if t is not None and (t.shape != u.shape or t.stride() != u.stride()):
            raise ValueError(f"{name} must have u's shape and strides {tuple(u.shape)} {u.stride()}, "
                             f"got {tuple(t.shape)} {t.stride()}")


def scan_forward(u, delta, A, B, C, interpreted: bool = False, *, D=None, z=None, delta_bias=None,
                 softplus: bool = False, out_dtype: torch.dtype | None = None):
    """out = (core(u, dt, A, B, C) + u D) * silu(z), dt = softplus(delta + delta_bias) (each
    part where given), in out_dtype (u's by default), with the chunk-initial states H and the
    chunk decays P (for the backward). A is float32; the rest may be any float dtype."""
    batch, seqlen, dim = u.shape
    dstate = A.shape[1]
    cfg = _blocks(dim, dstate, interpreted)
    n_chunks = cdiv(seqlen, cfg["CHUNK"])
    grid = (batch, cdiv(dim, cfg["BLOCK_D"]), n_chunks)
    states = [torch.empty(batch, n_chunks, dim, dstate, device=u.device, dtype=torch.float32) for _ in range(3)]
    s_loc, decay, h0 = states
    flags = _flags(D, z, delta_bias, softplus)
    bias = u if delta_bias is None else delta_bias  # a placeholder pointer where not given (HAS_BIAS)
    common = (seqlen, dim, dstate, *_strides3(u), *_strides3(delta), A.stride(0), A.stride(1), *_strides3(B))
    s_strides = (s_loc.stride(0), s_loc.stride(1), s_loc.stride(2))
    _scan_chunk_local_kernel[grid](u, delta, bias, A, B, s_loc, decay, *common, *s_strides, HAS_BIAS=flags["HAS_BIAS"],
                                   SOFTPLUS=flags["SOFTPLUS"], **cfg)
    _carry_walk(s_loc, decay, h0, False, cfg)
    del s_loc, states  # the out pass needs the walk's result only
    out = torch.empty(u.shape, device=u.device, dtype=out_dtype or u.dtype)  # u is contiguous, so out has its strides
    _same_layout(u, out=out)
    _scan_chunk_out_kernel[grid](u, delta, bias, A, B, C, u if D is None else D, u if z is None else z, h0, out,
                                 *common, *_strides3(C), *_strides3(u if z is None else z), *s_strides, **flags,
                                 **cfg)
    return out, h0, decay


def scan_backward(dout, u, delta, A, B, C, h0, decay, interpreted: bool = False, deterministic: bool = True, *,
                  D=None, z=None, delta_bias=None, softplus: bool = False):
    """(du, ddelta, dA, dB, dC, dD, dz, ddelta_bias) of scan_forward's output, given dL/dout:
    du, ddelta and dz in u's, delta's and z's dtypes, the rest float32 (None where the input
    was not given). `deterministic=False` sums dB and dC with atomics (see _grads_blocks)."""
    batch, seqlen, dim = u.shape
    dstate = A.shape[1]
    dout = dout.contiguous()
    _same_layout(u, dout=dout)
    cfg = _blocks(dim, dstate, interpreted)
    n_chunks = h0.shape[1]
    grid = (batch, cdiv(dim, cfg["BLOCK_D"]), n_chunks)
    flags = _flags(D, z, delta_bias, softplus)
    bias, d_skip, gate = (u if t is None else t for t in (delta_bias, D, z))  # placeholders where not given
    y_loc, carried = torch.empty_like(h0), torch.empty_like(h0)
    common = (seqlen, dim, dstate, *_strides3(u), *_strides3(delta), A.stride(0), A.stride(1), *_strides3(B))
    s_strides = (h0.stride(0), h0.stride(1), h0.stride(2))
    # Both backward kernels scan the adjoint in reverse: as a flipped forward scan on the
    # forward's tiles, natively on the atomic path's narrower ones (_chunk_adjoint).
    flip = _flip_reverse_scan(interpreted)
    z_strides = _strides3(gate)
    _scan_chunk_bwd_local_kernel[grid](u, delta, bias, A, B, C, dout, gate, y_loc, *common, *_strides3(C),
                                       *z_strides, *s_strides, HAS_BIAS=flags["HAS_BIAS"], SOFTPLUS=flags["SOFTPLUS"],
                                       HAS_Z=flags["HAS_Z"], FLIP_SCAN=flip, **cfg)
    _carry_walk(y_loc, decay, carried, True, cfg)
    del y_loc
    du = torch.empty_like(u)  # u, dout and these share one layout (_same_layout)
    ddelta = torch.empty(u.shape, device=u.device, dtype=delta.dtype)
    dz = torch.empty_like(u, dtype=z.dtype) if z is not None else du  # in u's layout; du: a placeholder
    da_part = torch.empty_like(h0)
    cfg = _grads_blocks(dim, dstate, interpreted, deterministic)
    grid = (batch, cdiv(dim, cfg["BLOCK_D"]), n_chunks)
    parts = 1 if not deterministic else grid[1]
    db_part = (torch.zeros if not deterministic else torch.empty)(parts, batch, seqlen, dstate, device=u.device,
                                                                   dtype=torch.float32)
    dc_part = (torch.zeros if not deterministic else torch.empty)(db_part.shape, device=u.device, dtype=torch.float32)
    # dD and ddelta_bias: one float32 partial per (batch, chunk, channel); the kernel writes every
    # channel of every chunk it owns.
    vec_part = [torch.empty(batch, n_chunks, dim, device=u.device, dtype=torch.float32) if given else None
                for given in (flags["HAS_D"], flags["HAS_BIAS"])]
    dd_part, dbias_part = (da_part if t is None else t for t in vec_part)  # placeholders where not given
    _same_layout(u, ddelta=ddelta)
    _scan_chunk_grads_kernel[grid](u, delta, bias, A, B, C, d_skip, gate, dout, h0, carried, du, ddelta, dz,
                                   da_part, db_part, dc_part, dd_part, dbias_part, *common, *_strides3(C),
                                   *z_strides, *s_strides, db_part.stride(0), db_part.stride(1), db_part.stride(2),
                                   n_chunks * dim, dim, **flags, ATOMIC=not deterministic,
                                   FLIP_SCAN=flip and deterministic, **cfg)
    del carried
    dD, dbias = (None if t is None else t.sum((0, 1)) for t in vec_part)
    return (du, ddelta, da_part.sum((0, 1)), db_part.sum(0), dc_part.sum(0), dD, dz if z is not None else None,
            dbias)
