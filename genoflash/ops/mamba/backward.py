"""The selective scan's backward as sequential reverse recurrences: one thread per channel, its
states in registers, stepping back through time (forward.py's layout, run the other way).

The gradients (scan.py's module docstring derives them), per channel d and state n, with
a_t = exp(dt_t A_n), b_t = dt_t u_t B_t, h_t = a_t h_{t-1} + b_t and dy_t = dout_t silu(z_t):

    g_t  = C_t dy_t + r_t              dL/dh_t; r_t = a_{t+1} g_{t+1} is what step t+1 hands back
    dC_t = sum_d dy_t h_t              dB_t = sum_d g_t dt_t u_t         (sums over channels)
    q_t  = r_{t-1} h_{t-1},  r_{t-1} = a_t g_t                             (g_t a_t h_{t-1})
    d dt_t += sum_n A_n q_t + u_t sum_n g_t B_t,    du_t = dt_t sum_n g_t B_t + D dy_t
    dA_n = sum_t dt_t q_t

The chunked backward kernels (scan_channels_first.py) scan each state over 32-step chunks with
`tl.associative_scan` twice (h forward, g backward) and sum dB and dC across the program's
channels per state: ~63 sm_90 instructions per state and step, 88% of the scan's time on the
H200 (benchmarks/NOTES.md, twenty-second session). A reverse walk needs h_{t-1} at each step,
and a float32 h_{t-1} = (h_t - b_t) / a_t is not usable (a_t reaches 1e-7). So:

- the forward saves the state entering every STATE_EVERY steps (forward.scan_forward's
  state_every; no decays: they are recomputed here);
- the backward walks each segment back one 8-step tile at a time. For a tile it takes the saved
  state at or before the tile's start and steps forward to the tile's start (at STATE_EVERY 16,
  every other tile recomputes 8 steps); then, GS states at a time (1 by default), it steps
  forward through the tile keeping the 8 states of each, and back through it with g. B's and
  C's 8 steps of a state come in one load from state-major copies (_state_steps).
- dB and dC of a tile and GS states are 8 GS per-channel values each, summed over channels: on
  the GPU a butterfly reduce-scatter over the warp's lanes (`_lane_sums`: N - 1 exchanges for N
  values, where a sum per value takes 5), then one sum over the program's warps. Each program
  writes its own partial sums (deterministic; the launcher adds the programs' partials).

Segments depend on each other only through r, so the backward runs in three passes, as the
forward does: (1) each segment from r = 0 at its end: r at its start, and its decay
2^(A log2(e) sum dt); (2) scan.py's carry walk, reversed: the r entering each segment's end;
(3) each segment from its true r: every gradient.

Steps past the sequence end have dt = 0 (a = 1, b = 0), dout = 0 and zero rows of B and C: g is
0 there and they add nothing.

Where it stands (twenty-third session, benchmarks/NOTES.md): within the rule in the interpreter
and on the H200 (12 of 12 test cases, bf16 among them). Timed beside the chunked backward in one
process (benchmarks/scan_backward_probe.py; channels-first bf16, dstate 16, the Mamba block's
extras): 17.7 against 17.1 ms at 262k x 512, 70.8 against 68.2 ms at 1M x 512, with 0.95 against
1.56 and 3.76 against 6.25 GiB of peak memory above the inputs. Not faster, so off by default: the
gradient kernel takes 255 registers and spills ~1.2 kB per thread (offline sm_90), two 4-warp
programs per SM, and each lane reduction ends in a cross-warp sum behind barriers. Its SASS:
~6,200 instructions, at most ~48 per state and step of its tile loop (against ~63 for the
chunked backward): the instruction count was not what bounded it.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from ..host import cdiv, switched
from .forward import (LOG2E, T, _channel_states, _chunk_decays, _decay, _segment_setup, _step_sizes, _steps,
                      _store_states, _tile_of_steps, _time_tile, _zero_states, config)
from .scan import _blocks, _carry_walk, _flags, _sigmoid, _strides3

# False (the default: timed, not faster; the module docstring): the interface runs the chunked
# backward kernels (scan_channels_first.py / scan.py), and the forward saves their 32-step chunk
# states and decays instead.
ENABLED = False
# Steps between the states the forward saves for this backward: 8 (no recompute; twice the
# memory of the chunked backward's 32-step states and decays) or 16 (every other tile steps 8
# steps forward again; the same memory as theirs).
STATE_EVERY = 16
# States per group of the tile's forward-then-back walk: 8 steps x GS states kept in registers,
# and 8 x GS values each of dB and dC per group for a lane reduction. Offline (sm_90, 4 warps, 255
# registers), with B's and C's rows loaded per step: GS 4 spilled 1.3 kB per thread, 2 628 B, 1
# 44 B (twice the reductions of 2, each ending behind a barrier). With the state-major loads
# (_state_steps, which cut the compile time 4x) GS 1 spills 1.2 kB. Only GS 1 has been timed.
GS = 1


def use_sequential_backward(enabled: bool):
    """Allow (True) or forbid (False, the default) this backward (process-wide)."""
    return switched(sys.modules[__name__], "ENABLED", enabled)


@triton.jit
def _lane_id(like):
    """Each thread's lane in its warp, shaped as `like` (one element per thread)."""
    return tl.inline_asm_elementwise("mov.u32 $0, %laneid;", "=r,r", [like.to(tl.int32, bitcast=True)],
                                     dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _shfl_xor(x, OFFSET: tl.constexpr):
    """x from the lane whose id differs from this one's in bit OFFSET (shfl.sync.bfly; the
    constant offset reaches ptxas as an immediate)."""
    offset = tl.full(x.shape, OFFSET, tl.int32)
    return tl.inline_asm_elementwise("shfl.sync.bfly.b32 $0, $1, $2, 0x1f, 0xffffffff;", "=f,f,r", [x, offset],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _lane_sums(vals, N: tl.constexpr, BLOCK_D: tl.constexpr):
    """The sums over the program's channels of N (8, 16 or 32) per-channel values (a tuple of N
    (BLOCK_D,) vectors, one channel per thread), as a (32,) vector whose element i is the sum of
    value i mod N.

    A reduce-scatter across each warp's lanes: in the round for lane bit o (N/2 down to 1) each
    lane keeps the half of its remaining values whose index has that bit equal to its own, and
    adds its partner's copy of that half (one shuffle and two selects per value kept). After
    log2(N) rounds lane l holds the sum of value l mod N over the lanes that share its bits
    above log2(N); shuffles across those bits (xor 16, ...) finish the warp's sum. N - 1
    shuffles for 32 values, where a shuffle tree per value (tl.sum) takes 5 per value. The
    warps' sums are then added through shared memory (element w * 32 + l of the program's
    vector is warp w's lane l: one channel per thread, in order)."""
    lane = _lane_id(vals[0])
    cur = vals
    # (a name bound to N >> k would be a tensor, not a constant: Triton's assignments)
    for k in tl.static_range(1, N.bit_length()):
        upper = (lane & (N >> k)) != 0
        nxt = ()
        for i in tl.static_range(N >> k):
            send = tl.where(upper, cur[i], cur[i + (N >> k)])
            keep = tl.where(upper, cur[i + (N >> k)], cur[i])
            nxt = nxt + (keep + _shfl_xor(send, N >> k),)
        cur = nxt
    v = cur[0]
    if N <= 16:
        v += _shfl_xor(v, 16)
    if N <= 8:
        v += _shfl_xor(v, 8)
    return tl.sum(tl.reshape(v, (BLOCK_D // 32, 32)), 0)


@triton.jit
def _store_channel_sums(PART, offs, mask, vals, N: tl.constexpr, BLOCK_D: tl.constexpr, LANES: tl.constexpr):
    """PART[offs[i]] = the program's sum over channels of vals[i % N], i < 32; offs and mask are
    (32,) vectors (mask false from N on). LANES: _lane_sums (compiled); otherwise one tl.sum per
    value (the interpreter, which has no lanes)."""
    if LANES:
        tl.store(PART + offs, _lane_sums(vals, N, BLOCK_D), mask=mask)
    else:
        idx = tl.arange(0, 32)
        for i in tl.static_range(N):
            tl.store(PART + offs, tl.zeros([32], tl.float32) + tl.sum(vals[i], 0), mask=mask & (idx == i))


@triton.jit
def _state_steps(XT, base, n, t0, offs_t, stride_n, BLOCK_D: tl.constexpr):
    """State n of B or C at steps t0 .. t0 + 7 as 8 (BLOCK_D,) vectors (each the same in every
    channel), from the launcher's state-major float32 copy (_state_major_rows): one 32-byte
    broadcast load per thread. Per-step row loads (forward.py's _state_row) made ~600 load ops in
    the gradient kernel, and Triton's coalescing pass took 296 of its 300 s of compile time
    (MLIR_ENABLE_TIMING, offline sm_90) over them."""
    ptrs = XT + base + n * stride_n + t0 + offs_t[None, :] + tl.zeros([BLOCK_D, 1], tl.int32)
    return _steps(tl.load(ptrs))


@triton.jit
def _gate_grad_inputs(dout, z, HAS_Z: tl.constexpr):
    """dy = dout silu(z) (dout without a gate), float32, over a tile."""
    dout = dout.to(tl.float32)
    if HAS_Z:
        z = z.to(tl.float32)
        return dout * (z * _sigmoid(z))
    return dout


@triton.jit
def _seq_bwd_local_kernel(DELTA, DELTA_BIAS, A, CT, DOUT, Z, R_LOC, P, seqlen, seg_len, dim, dstate,
                          stride_db, stride_dl, stride_dd, stride_ad, stride_an, stride_tb, stride_tn,
                          stride_ob, stride_ol, stride_od, stride_zb, stride_zl, stride_zd,
                          stride_sb, stride_sc, stride_sd,
                          BLOCK_D: tl.constexpr, DSTATE: tl.constexpr, GROUP: tl.constexpr, FAST_EXP: tl.constexpr,
                          HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_Z: tl.constexpr,
                          EXACT: tl.constexpr):
    """Pass 1: each segment backwards from r = 0 at its end: the r it hands to the segment
    before it (a_first g_first) and its decay, per channel and state."""
    off_b, seg = tl.program_id(0), tl.program_id(2)
    offs_d, mask_d, a, bias = _segment_setup(A, DELTA_BIAS, dim, dstate, stride_ad, stride_an, BLOCK_D, DSTATE,
                                             HAS_BIAS)
    offs_t = tl.arange(0, 8)
    b64 = off_b.to(tl.int64)
    d_base = b64 * stride_db + offs_d.to(tl.int64) * stride_dd
    o_base = b64 * stride_ob + offs_d.to(tl.int64) * stride_od
    z_base = b64 * stride_zb + offs_d.to(tl.int64) * stride_zd
    t_start = seg * seg_len
    t_end = tl.minimum(t_start + seg_len, seqlen)
    t_base = b64 * stride_tb  # C's state-major copy (_state_steps)
    n_tiles = tl.cdiv(t_end - t_start, 8)
    r = _zero_states(BLOCK_D, DSTATE)
    dt_sum = tl.zeros([BLOCK_D], tl.float32)
    for i in range(n_tiles):
        t0 = t_start + (n_tiles - 1 - i) * 8
        dt = _step_sizes(_time_tile(DELTA, d_base, t0, offs_t, stride_dl, mask_d, t_end), t0, offs_t, seqlen, bias,
                         HAS_BIAS, SOFTPLUS)
        dout = _time_tile(DOUT, o_base, t0, offs_t, stride_ol, mask_d, t_end)
        z = dout
        if HAS_Z:
            z = _time_tile(Z, z_base, t0, offs_t, stride_zl, mask_d, t_end)
        dy = _gate_grad_inputs(dout, z, HAS_Z)
        dt_sum += tl.sum(dt, 1)
        dts, dys = _steps(dt), _steps(dy)
        nxt = ()
        for n in tl.static_range(DSTATE):  # each state's walk back through the tile (independent)
            c = _state_steps(CT, t_base, n, t0, offs_t, stride_tn, BLOCK_D)
            rn = r[n]
            for j in tl.static_range(7, -1, -1):
                rn = _decay(dts[j], a[n], FAST_EXP) * (rn + c[j] * dys[j])
            nxt = nxt + (rn,)
        r = nxt
    s_offs = b64 * stride_sb + seg.to(tl.int64) * stride_sc + offs_d * stride_sd
    _store_states(R_LOC, s_offs, mask_d, r, dstate, DSTATE, GROUP, EXACT)
    _store_states(P, s_offs, mask_d, _chunk_decays(a, dt_sum, DSTATE, FAST_EXP), dstate, DSTATE, GROUP, EXACT)


@triton.jit
def _seq_grads_kernel(U, DELTA, DELTA_BIAS, A, BT, CT, D, Z, DOUT, H, X, DU, DDELTA, DZ,
                      DA_PART, DB_PART, DC_PART, DD_PART, DBIAS_PART, seqlen, seg_len, dim, dstate,
                      stride_ub, stride_ul, stride_ud, stride_db, stride_dl, stride_dd, stride_ad, stride_an,
                      stride_tb, stride_tn, stride_zb, stride_zl, stride_zd, stride_ob, stride_ol, stride_od,
                      stride_gb, stride_gl, stride_gd, stride_hb, stride_hc, stride_hd, stride_xb, stride_xc,
                      stride_xd, stride_pk, stride_pb, stride_pl, stride_vb, stride_vc,
                      BLOCK_D: tl.constexpr, DSTATE: tl.constexpr, GROUP: tl.constexpr, GS: tl.constexpr,
                      EVERY: tl.constexpr, FAST_EXP: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
                      HAS_D: tl.constexpr, HAS_Z: tl.constexpr, LANES: tl.constexpr,
                      EXACT: tl.constexpr):
    """Pass 3: each segment backwards from its true r (X), one 8-step tile at a time: du, ddelta,
    dz of the tile (DU, DDELTA, DZ have their own strides, _g), the program's partial sums of dB
    and dC per (step, state), and per segment the partial sums of dA, dD and d delta_bias."""
    off_b, pid_d, seg = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_d, mask_d, a, bias = _segment_setup(A, DELTA_BIAS, dim, dstate, stride_ad, stride_an, BLOCK_D, DSTATE,
                                             HAS_BIAS)
    offs_t = tl.arange(0, 8)
    b64 = off_b.to(tl.int64)
    d64 = offs_d.to(tl.int64)
    u_base = b64 * stride_ub + d64 * stride_ud
    d_base = b64 * stride_db + d64 * stride_dd
    o_base = b64 * stride_ob + d64 * stride_od
    z_base = b64 * stride_zb + d64 * stride_zd
    g_base = b64 * stride_gb + d64 * stride_gd
    skip = tl.zeros([BLOCK_D], tl.float32)
    if HAS_D:
        skip = tl.load(D + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    t_start = seg * seg_len
    t_end = tl.minimum(t_start + seg_len, seqlen)
    t_base = b64 * stride_tb  # B's and C's state-major copies (_state_steps; they share strides)
    h_base = b64 * stride_hb + offs_d * stride_hd
    r = _channel_states(X, b64 * stride_xb + seg.to(tl.int64) * stride_xc + offs_d * stride_xd, mask_d, 1, dstate,
                        1.0, DSTATE)
    # dA's terms summed over the segment, per state; dD's and d delta_bias's per channel
    da = _zero_states(BLOCK_D, DSTATE)
    dd_sum = tl.zeros([BLOCK_D], tl.float32)
    dbias_sum = tl.zeros([BLOCK_D], tl.float32)
    idx = tl.arange(0, 32)
    part = pid_d.to(tl.int64) * stride_pk + b64 * stride_pb
    n_tiles = tl.cdiv(t_end - t_start, 8)
    for i in range(n_tiles):
        t0 = t_start + (n_tiles - 1 - i) * 8
        # the state entering this tile: the saved one at or before it, stepped forward to t0
        t_saved = (t0 // EVERY) * EVERY
        h = _channel_states(H, h_base + (t_saved // EVERY).to(tl.int64) * stride_hc, mask_d, 1, dstate, 1.0, DSTATE)
        for tt in range(t_saved, t0, 8):
            dt_r = _step_sizes(_time_tile(DELTA, d_base, tt, offs_t, stride_dl, mask_d, t_end), tt, offs_t, seqlen,
                               bias, HAS_BIAS, SOFTPLUS)
            dts_r = _steps(dt_r)
            dtus_r = _steps(dt_r * _time_tile(U, u_base, tt, offs_t, stride_ul, mask_d, t_end).to(tl.float32))
            h_next = ()
            for n in tl.static_range(DSTATE):  # each state through the tile (independent)
                b = _state_steps(BT, t_base, n, tt, offs_t, stride_tn, BLOCK_D)
                hn = h[n]
                for j in tl.static_range(8):
                    hn = _decay(dts_r[j], a[n], FAST_EXP) * hn + dtus_r[j] * b[j]
                h_next = h_next + (hn,)
            h = h_next
        dt = _step_sizes(_time_tile(DELTA, d_base, t0, offs_t, stride_dl, mask_d, t_end), t0, offs_t, seqlen, bias,
                         HAS_BIAS, SOFTPLUS)
        dout = _time_tile(DOUT, o_base, t0, offs_t, stride_ol, mask_d, t_end)
        z = dout
        if HAS_Z:
            z = _time_tile(Z, z_base, t0, offs_t, stride_zl, mask_d, t_end)
        dts = _steps(dt)
        dtus = _steps(dt * _time_tile(U, u_base, t0, offs_t, stride_ul, mask_d, t_end).to(tl.float32))
        dys = _steps(_gate_grad_inputs(dout, z, HAS_Z))
        zero = tl.zeros([BLOCK_D], tl.float32)
        gb = (zero, zero, zero, zero, zero, zero, zero, zero)    # sum_n g B per step
        qa = (zero, zero, zero, zero, zero, zero, zero, zero)    # sum_n A_n q per step
        ys = (zero, zero, zero, zero, zero, zero, zero, zero)    # sum_n C h per step (for dz)
        r_new = ()
        da_new = ()
        for grp in tl.static_range(DSTATE // GS):
            # forward through the tile for this group's states, keeping each step's states
            hs = ()                                             # hs[j * GS + s]: h_{t0 + j}
            prev = ()
            for s in tl.static_range(GS):
                prev = prev + (h[grp * GS + s],)
            cur = prev
            dc_vals = ()                                        # dy h, for dC, in hs's order
            ys_new = ()
            b8 = ()                                             # b8[s][j]: B[t0 + j] of state grp GS + s
            c8 = ()
            for s in tl.static_range(GS):
                b8 = b8 + (_state_steps(BT, t_base, grp * GS + s, t0, offs_t, stride_tn, BLOCK_D),)
                c8 = c8 + (_state_steps(CT, t_base, grp * GS + s, t0, offs_t, stride_tn, BLOCK_D),)
            for j in tl.static_range(8):
                nxt = ()
                yj = ys[j]
                for s in tl.static_range(GS):
                    hn = _decay(dts[j], a[grp * GS + s], FAST_EXP) * cur[s] + dtus[j] * b8[s][j]
                    nxt = nxt + (hn,)
                    dc_vals = dc_vals + (dys[j] * hn,)
                    if HAS_Z:
                        yj += c8[s][j] * hn
                cur = nxt
                hs = hs + cur
                ys_new = ys_new + (yj,)
            ys = ys_new
            # dB and dC: the program's sums over channels of 8 steps x GS states, dC's now (its
            # values need not stay live through the walk back)
            n_off = grp * GS + idx % GS
            t_off = t0 + (idx % (8 * GS)) // GS
            offs = part + t_off.to(tl.int64) * stride_pl + n_off
            smask = (t_off < seqlen) & (n_off < dstate) & (idx < 8 * GS)
            _store_channel_sums(DC_PART, offs, smask, dc_vals, 8 * GS, BLOCK_D, LANES)
            # back through the tile with g; the dB and dC values in hs's order
            rg = ()
            dag = ()
            for s in tl.static_range(GS):
                rg = rg + (r[grp * GS + s],)
                dag = dag + (da[grp * GS + s],)
            db_vals = ()
            gb_new = ()
            qa_new = ()
            for j in tl.static_range(7, -1, -1):
                gbj, qaj = gb[j], qa[j]
                dt_j, dtu_j, dy_j = dts[j], dtus[j], dys[j]
                rg_next = ()
                dag_next = ()
                dbj = ()
                for s in tl.static_range(GS):
                    if j == 0:
                        hp = prev[s]
                    else:
                        hp = hs[(j - 1) * GS + s]
                    g = rg[s] + c8[s][j] * dy_j
                    gbj += g * b8[s][j]
                    dbj = dbj + (g * dtu_j,)
                    rn = _decay(dt_j, a[grp * GS + s], FAST_EXP) * g  # r_{t-1} = a_t g_t
                    q = rn * hp                                     # g_t a_t h_{t-1}
                    qaj += q * a[grp * GS + s]                      # A_n log2(e) q: scaled back below
                    dag_next = dag_next + (dag[s] + dt_j * q,)
                    rg_next = rg_next + (rn,)
                rg, dag = rg_next, dag_next
                # values in step-major order within the tile (j * GS + s), built back to front
                db_vals = dbj + db_vals
                gb_new = (gbj,) + gb_new
                qa_new = (qaj,) + qa_new
            gb, qa = gb_new, qa_new
            r_new = r_new + rg
            da_new = da_new + dag
            _store_channel_sums(DB_PART, offs, smask, db_vals, 8 * GS, BLOCK_D, LANES)
        r, da = r_new, da_new
        # qa holds sum_n q a[n] with a[n] = A_n log2(e): back to A_n
        # The tile's inputs again (L1 or L2 hits): kept through the walk, they cost registers the
        # walk needs (offline sm_90: 255 with ~100 spilled values per tile).
        x = _time_tile(DELTA, d_base, t0, offs_t, stride_dl, mask_d, t_end).to(tl.float32)
        if HAS_BIAS:
            x += bias[:, None]
        u = _time_tile(U, u_base, t0, offs_t, stride_ul, mask_d, t_end).to(tl.float32)
        dout = _time_tile(DOUT, o_base, t0, offs_t, stride_ol, mask_d, t_end)
        if HAS_Z:
            z = _time_tile(Z, z_base, t0, offs_t, stride_zl, mask_d, t_end)
        dt = _tile_of_steps(dts)
        dy = _tile_of_steps(dys)
        gb_t = _tile_of_steps(gb)
        ddt = _tile_of_steps(qa) * (1.0 / LOG2E) + u * gb_t
        du = dt * gb_t
        if HAS_D:
            du += dy * skip[:, None]
            dd_sum += tl.sum(dy * u, 1)
        ddelta = ddt
        if SOFTPLUS:
            ddelta = ddt * _sigmoid(x)                          # d softplus(x) / dx
        t = t0 + offs_t
        tmask = mask_d[:, None] & (t < seqlen)[None, :]
        g_offs = g_base[:, None] + t[None, :].to(tl.int64) * stride_gl
        tl.store(DU + g_offs, du.to(DU.dtype.element_ty), mask=tmask)
        tl.store(DDELTA + g_offs, ddelta.to(DDELTA.dtype.element_ty), mask=tmask)
        if HAS_BIAS:
            dbias_sum += tl.sum(tl.where(tmask, ddelta, 0.0), 1)
        if HAS_Z:
            zf = z.to(tl.float32)
            sig = _sigmoid(zf)
            y = _tile_of_steps(ys) + u * skip[:, None]
            tl.store(DZ + g_offs, (dout.to(tl.float32) * y * (sig * (1.0 + zf * (1.0 - sig)))).to(DZ.dtype.element_ty),
                     mask=tmask)
    s_offs = b64 * stride_xb + seg.to(tl.int64) * stride_xc + offs_d * stride_xd
    # dA_n = sum_t dt q, this segment's part
    _store_states(DA_PART, s_offs, mask_d, da, dstate, DSTATE, GROUP, EXACT)
    v_offs = b64 * stride_vb + seg.to(tl.int64) * stride_vc + offs_d
    if HAS_D:
        tl.store(DD_PART + v_offs, dd_sum, mask=mask_d)
    if HAS_BIAS:
        tl.store(DBIAS_PART + v_offs, dbias_sum, mask=mask_d)


def _state_major_rows(x: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """B or C, (batch, seqlen, dstate), as (batch, width, rows) float32: each state's steps
    adjacent (_state_steps), zero past the sequence and past dstate. dstate values per step:
    small beside the dim-wide u, delta and z."""
    batch, seqlen, dstate = x.shape
    out = torch.zeros(batch, width, rows, device=x.device, dtype=torch.float32)
    out[:, :dstate, :seqlen] = x.transpose(1, 2)
    return out


def scan_backward(dout, u, delta, A, B, C, h_saved, interpreted: bool = False, *, D=None, z=None,
                  delta_bias=None, softplus: bool = False, state_every: int | None = None):
    """The gradients of forward.scan_forward's output in every input: (du, ddelta, dA, dB, dC,
    dD, dz, ddelta_bias), float32 for A, B, C, D, delta_bias (summed over the programs' partials
    here) and in u's, delta's and z's dtypes and u's layout for the rest. h_saved: the states
    forward.scan_forward saved with state_every (this module's STATE_EVERY by default)."""
    every = state_every or STATE_EVERY
    batch, seqlen, dim = u.shape
    dstate = A.shape[1]
    if h_saved.shape != (batch, cdiv(seqlen, every), dim, dstate):
        raise ValueError(f"h_saved must be (batch, ceil(seqlen / {every}), dim, dstate), got {tuple(h_saved.shape)}")
    cfg = config(batch, seqlen, dim, dstate, every, u.device, interpreted)
    seg_len, n_seg = cfg["seg_len"], cfg["n_seg"]
    block_d, dstate_p, group = cfg["BLOCK_D"], cfg["DSTATE"], cfg["GROUP"]
    gs = min(GS, dstate_p)
    assert seg_len % every == 0 and every % T == 0 and 8 * gs <= 32 and dstate_p % gs == 0
    grid = (batch, cdiv(dim, block_d), n_seg)
    flags = _flags(D, z, delta_bias, softplus)
    bias = u if delta_bias is None else delta_bias
    gate = u if z is None else z
    rows = n_seg * seg_len + 2 * T  # every tile the kernels read, a multiple of 16 (aligned state rows)
    BT, CT = _state_major_rows(B, rows, dstate_p), _state_major_rows(C, rows, dstate_p)
    exact = dstate_p == dstate
    common = dict(BLOCK_D=block_d, DSTATE=dstate_p, GROUP=group, FAST_EXP=not interpreted, HAS_BIAS=flags["HAS_BIAS"],
                  SOFTPLUS=flags["SOFTPLUS"], HAS_Z=flags["HAS_Z"], EXACT=exact,
                  num_warps=cfg["num_warps"])
    r_loc, decay = (torch.empty(batch, n_seg, dim, dstate, device=u.device, dtype=torch.float32) for _ in range(2))
    s_strides = _strides3(r_loc)
    _seq_bwd_local_kernel[grid](delta, bias, A, CT, dout, gate, r_loc, decay, seqlen, seg_len, dim, dstate,
                                *_strides3(delta), A.stride(0), A.stride(1), CT.stride(0), CT.stride(1),
                                *_strides3(dout),
                                *_strides3(gate), *s_strides, **common)
    carried = torch.empty_like(r_loc)
    _carry_walk(r_loc, decay, carried, True, _blocks(dim, dstate, interpreted))
    del r_loc, decay
    # du, ddelta, dz in u's layout (channels-first u: channels-first gradients), as the forward's out
    if u.stride(1) == 1 and seqlen > 1:
        def grad_like(dtype):
            return torch.empty(batch, dim, seqlen, device=u.device, dtype=dtype).transpose(1, 2)
    else:
        def grad_like(dtype):
            return torch.empty(batch, seqlen, dim, device=u.device, dtype=dtype)
    du, ddelta = grad_like(u.dtype), grad_like(delta.dtype)
    dz = grad_like(z.dtype) if z is not None else du  # du: a placeholder
    da_part = torch.empty(batch, n_seg, dim, dstate, device=u.device, dtype=torch.float32)
    parts = grid[1]
    db_part = torch.empty(parts, batch, seqlen, dstate, device=u.device, dtype=torch.float32)
    dc_part = torch.empty_like(db_part)
    vec_part = [torch.empty(batch, n_seg, dim, device=u.device, dtype=torch.float32) if given else None
                for given in (flags["HAS_D"], flags["HAS_BIAS"])]
    dd_part, dbias_part = (da_part if t is None else t for t in vec_part)  # placeholders where not given
    # both (batch, n_seg, dim) when given: the kernel takes one pair of strides for the two
    v_strides = next(((t.stride(0), t.stride(1)) for t in vec_part if t is not None), (0, 0))
    _seq_grads_kernel[grid](u, delta, bias, A, BT, CT, u if D is None else D, gate, dout, h_saved, carried,
                            du, ddelta, dz, da_part, db_part, dc_part, dd_part, dbias_part, seqlen, seg_len, dim,
                            dstate, *_strides3(u), *_strides3(delta), A.stride(0), A.stride(1), BT.stride(0),
                            BT.stride(1), *_strides3(gate), *_strides3(dout), *_strides3(du), *_strides3(h_saved),
                            *s_strides, db_part.stride(0), db_part.stride(1), db_part.stride(2), *v_strides, GS=gs,
                            EVERY=every, HAS_D=flags["HAS_D"], LANES=not interpreted, **common)
    del carried
    dD, dbias = (None if t is None else t.sum((0, 1)) for t in vec_part)
    return (du, ddelta, da_part.sum((0, 1)), db_part.sum(0), dc_part.sum(0), dD, dz if z is not None else None,
            dbias)
