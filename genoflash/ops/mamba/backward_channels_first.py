"""The selective scan's backward for channels-first activations, with a loop over states.

Same math, same chunks and same chunk states as backward.py (whose module docstring states the
three passes and every gradient term); only the tiling differs. backward.py holds a
(CHUNK, BLOCK_D, BLOCK_N) tile per program with time inside each thread and the states across
lanes, so every (time, channel) value (the softplus, the gate) is computed by all the lanes that
share it, and every sum over states is a lane shuffle. Here a program holds (CHUNK, BLOCK_D)
tiles and loops over the states, as mamba-ssm's CUDA scan does: each (time, channel) value is
computed once, and sums over states are register accumulations.

This tiling pays only when time is the contiguous axis in memory, (batch, dim, seqlen), which
mamba-ssm also takes. Triton lays a tile out after its loads: with time contiguous it loads 8
16-bit steps per thread and keeps them inside the thread (threads [4, 8] x warps [1, W] over
(time, channel)), so each scan is 8 steps in registers and a 2-step shuffle tail over 4 lanes.
With channels contiguous it splits time across warps or lanes instead and each scan step crosses
threads (docs/design/mamba-scan.md). The tensors are passed as (batch, seqlen, dim)
views of channels-first memory; every kernel takes their strides.

BLOCK_D = 8 x num_warps channels, so each thread owns 8 steps of one channel per tile: the
gradient pass's dozen live tiles and two scans per state fit in ~210 registers without spills
(sm_90; the 3-D gradient pass spills at 255). dB and dC (sums over channels) are the only
reductions across warps.

What each state's step costs, in sm_90 SASS instructions per thread of the loop over states
(8 steps of one channel; `tools/offline_compile.py mamba 16 --channels-first --sass DIR`):
backward local 237 -> 81, gradients 728 -> 482, from B and C read as state-major float32
(`_state_major`: one vector load per run of steps, where each step took a scalar load, a 64-bit
address and a conversion), the decays as ex2.approx.ftz of dt * A log2(e) (`_decay`), and the
adjoint scans run as forward scans over inputs already in reversed step order (`_adjoint_order`;
C's columns from a chunk-reversed copy, `_adjoint_columns`), since Triton lowers reverse=True
with butterfly shuffles across the warp. The gradient pass's time did not follow its last cut in
instructions (57.0 -> 56.7 ms at 1M x 512 on the H200): its 8 warps per SM wait on each state's
chain of scans, shuffles and barriers, not on issue (docs/design/mamba-scan.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.host import cdiv
from .chunk_states import carry_walk
from .recurrence import (_channel_vector, _decay, _linear_recurrence, _sigmoid, _step_size, _tile_2d, _write_partial,
                         chunk_blocks, flip_reverse_scan, kernel_flags, strides3)

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _adjoint_order(offs_t, CHUNK: tl.constexpr, FLIP_SCAN: tl.constexpr):
    """The steps of a chunk in the order the adjoint scans take them. FLIP_SCAN (the compiled
    default): reversed, element i is step CHUNK - 1 - i, so the reverse-in-time adjoint is a
    forward associative_scan; the adjoint's inputs are loaded in that order (the masks compare
    step indices, so they hold in either order). Otherwise as loaded, for reverse=True (the
    interpreter's choice: there tl.flip is slow)."""
    if FLIP_SCAN:
        return CHUNK - 1 - offs_t
    return offs_t


@triton.jit
def _adjoint_columns_end(n_t, CHUNK: tl.constexpr, FLIP_SCAN: tl.constexpr):
    """How many of a chunk's elements to read from CA, the C the adjoint scans take (the
    launcher's _adjoint_columns): all CHUNK of the reversed, zero-padded copy, or the n_t steps
    of C itself in step order. Either way a contiguous vector load per state (reversed
    addresses would take a scalar load and a mask per step)."""
    if FLIP_SCAN:
        return CHUNK
    return n_t


@triton.jit
def _adjoint_scan(decay_next, dyc, FLIP_SCAN: tl.constexpr):
    """(alpha_cum, g_loc) of the adjoint g_t = dy_t C_t + a_{t+1} g_{t+1} over a (CHUNK, BLOCK_D)
    tile in _adjoint_order: g from a zero carry past the chunk's end, and the decay
    prod_{t < s <= end + 1} a_s that carries one in. Reversed steps make the reverse scan a
    forward one: Triton lowers reverse=True to butterfly shuffles across the warp, and flipping
    the inputs and outputs of a forward scan instead took 64 shuffles per state in the gradient
    pass (sm_90 SASS). With the inputs in reversed
    order, the backward local pass flips nothing and the gradient pass flips g once per state."""
    if FLIP_SCAN:
        return tl.associative_scan((decay_next, dyc), 0, _linear_recurrence)
    return tl.associative_scan((decay_next, dyc), 0, _linear_recurrence, reverse=True)


@triton.jit
def _time_row(x, offs_t, t: tl.constexpr):
    """Step t of a (CHUNK, BLOCK_D) tile, (BLOCK_D,): a masked sum (tiles are not indexable)."""
    return tl.sum(tl.where(offs_t[:, None] == t, x, 0.0), 0)


@triton.jit
def _state_column(X, off_b, t0, n, stride_xb, stride_xl, stride_xn, offs_t, n_t):
    """B[t0:t0+CHUNK, n] (or C's), (CHUNK,) float32: the same for every channel."""
    return tl.load(X + off_b.to(tl.int64) * stride_xb + (t0 + offs_t).to(tl.int64) * stride_xl + n * stride_xn,
                   mask=offs_t < n_t, other=0.0).to(tl.float32)


@triton.jit
def _a_column(A, n, d0, offs_d, d_mask, stride_ad, stride_an):
    """A[d0:d0+BLOCK_D, n], (BLOCK_D,) float32."""
    return tl.load(A + (d0 + offs_d) * stride_ad + n * stride_an, mask=d_mask, other=0.0)


@triton.jit
def _state_columns(A, X, n, off_b, t0, d0, offs_t, offs_d, n_t, d_mask, stride_ad, stride_an, stride_xb, stride_xl,
                   stride_xn):
    """State n's A column, (BLOCK_D,), and its column of X (B or C) over the chunk, (CHUNK,):
    what every loop over states reads per state."""
    return (_a_column(A, n, d0, offs_d, d_mask, stride_ad, stride_an),
            _state_column(X, off_b, t0, n, stride_xb, stride_xl, stride_xn, offs_t, n_t))


@triton.jit
def _next_state(n, dstate):
    """The state whose columns a loop over states requests while it works on state n: n + 1,
    or n again on the last (a load of the same addresses, never used). Requested a whole state
    ahead, their global-memory latency hides behind the scan of state n: the loads do not feed
    a dot, so Triton's pipeliner leaves them where they are written."""
    return tl.minimum(n + 1, dstate - 1)


@triton.jit
def _tile_at(X, off_b, t0, d0, stride_xb, stride_xl, stride_xd, offs_t, offs_d, n_t, n_d):
    return _tile_2d(X + off_b.to(tl.int64) * stride_xb + t0.to(tl.int64) * stride_xl + d0 * stride_xd,
                    stride_xl, stride_xd, offs_t, offs_d, n_t, n_d)


@triton.jit
def _cf_chunk_prologue(U, DELTA, DELTA_BIAS, off_b, t0, d0, seqlen, dim, stride_ub, stride_ul, stride_ud,
                       stride_db, stride_dl, stride_dd, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr,
                       HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """What every pass needs before its loop over states: the tile's offsets and masks, u, the
    step size dt (zero past the sequence end), x = delta + bias, and dt u."""
    offs_t = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    n_t = seqlen - t0
    u = _tile_at(U, off_b, t0, d0, stride_ub, stride_ul, stride_ud, offs_t, offs_d, n_t, dim - d0)
    dt, x = _step_size(DELTA, DELTA_BIAS, off_b, t0, d0, dim, stride_db, stride_dl, stride_dd, offs_t, offs_d, n_t,
                       HAS_BIAS, SOFTPLUS)
    return offs_t, offs_d, n_t, offs_d < dim - d0, u, dt, x, dt * u


@triton.jit
def _cf_state_scan(a_col, b_col, dt, dtu, FAST_EXP: tl.constexpr):
    """One state's forward scan over the chunk from a zero start, given its A and B columns:
    (b = dt u B, the cumulative decays, h_loc)."""
    b = dtu * b_col[:, None]
    a_cum, h_loc = tl.associative_scan((_decay(dt, (a_col * LOG2E)[None, :], FAST_EXP), b), 0, _linear_recurrence)
    return b, a_cum, h_loc


@triton.jit
def _cf_next_step_size(DELTA, DELTA_BIAS, off_b, t0, d0, seqlen, dim, stride_db, stride_dl, stride_dd, offs_t, offs_d,
                       CHUNK: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """dt at the next step, at the steps offs_t (any order): 0 one past the chunk's last step and
    past the sequence end, so a = 1 there (the decay into the next chunk comes with its carry)."""
    dt_next, _ = _step_size(DELTA, DELTA_BIAS, off_b, t0 + 1, d0, dim, stride_db, stride_dl, stride_dd, offs_t,
                            offs_d, tl.minimum(seqlen - t0 - 1, CHUNK - 1), HAS_BIAS, SOFTPLUS)
    return dt_next


@triton.jit
def _cf_gated_dout(DOUT, Z, off_b, t0, d0, seqlen, dim, stride_ob, stride_ol, stride_od, stride_zb, stride_zl,
                   stride_zd, offs_t, offs_d, HAS_Z: tl.constexpr):
    """The core's dy = dout silu(z) at the steps offs_t (any order), and dout and z as loaded (z
    is dout where there is no gate)."""
    n_t = seqlen - t0
    dout = _tile_at(DOUT, off_b, t0, d0, stride_ob, stride_ol, stride_od, offs_t, offs_d, n_t, dim - d0)
    z = dout
    dy = dout
    if HAS_Z:
        z = _tile_at(Z, off_b, t0, d0, stride_zb, stride_zl, stride_zd, offs_t, offs_d, n_t, dim - d0)
        dy = dout * (z * _sigmoid(z))
    return dy, dout, z


@triton.jit
def _cf_bwd_local_kernel(DELTA, DELTA_BIAS, A, CA, DOUT, Z, Y_LOC, seqlen, dim, dstate,
                         stride_db, stride_dl, stride_dd, stride_ad, stride_an, stride_cb, stride_cl, stride_cn,
                         stride_ob, stride_ol, stride_od, stride_zb, stride_zl, stride_zd, stride_sb, stride_sc,
                         stride_sd, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, FAST_EXP: tl.constexpr,
                         HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_Z: tl.constexpr,
                         FLIP_SCAN: tl.constexpr):
    """Backward pass 1: a[first] g_loc[first] per state, what each chunk hands to the one before
    it from its own dy."""
    off_b, d0, chunk = tl.program_id(0), tl.program_id(1) * BLOCK_D, tl.program_id(2)
    t0 = chunk * CHUNK
    offs_t = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    n_t = seqlen - t0
    d_mask = offs_d < dim - d0
    dt, _ = _step_size(DELTA, DELTA_BIAS, off_b, t0, d0, dim, stride_db, stride_dl, stride_dd, offs_t, offs_d, n_t,
                       HAS_BIAS, SOFTPLUS)
    dt_first = _time_row(dt, offs_t, 0)
    # Everything the adjoint scan reads, in its order.
    offs_a = _adjoint_order(offs_t, CHUNK, FLIP_SCAN)
    dt_next = _cf_next_step_size(DELTA, DELTA_BIAS, off_b, t0, d0, seqlen, dim, stride_db, stride_dl, stride_dd,
                                 offs_a, offs_d, CHUNK, HAS_BIAS, SOFTPLUS)
    dy, _, _ = _cf_gated_dout(DOUT, Z, off_b, t0, d0, seqlen, dim, stride_ob, stride_ol, stride_od, stride_zb,
                              stride_zl, stride_zd, offs_a, offs_d, HAS_Z)
    s_off = off_b.to(tl.int64) * stride_sb + chunk.to(tl.int64) * stride_sc + (d0 + offs_d) * stride_sd
    n_ta = _adjoint_columns_end(n_t, CHUNK, FLIP_SCAN)
    a_nxt, c_nxt = _state_columns(A, CA, 0, off_b, t0, d0, offs_t, offs_d, n_ta, d_mask, stride_ad, stride_an,
                                  stride_cb, stride_cl, stride_cn)
    for n in range(0, dstate):
        a_col, c_col = a_nxt, c_nxt
        a_nxt, c_nxt = _state_columns(A, CA, _next_state(n, dstate), off_b, t0, d0, offs_t, offs_d, n_ta, d_mask,
                                      stride_ad, stride_an, stride_cb, stride_cl, stride_cn)
        _, g_loc = _adjoint_scan(_decay(dt_next, (a_col * LOG2E)[None, :], FAST_EXP), dy * c_col[:, None], FLIP_SCAN)
        tl.store(Y_LOC + s_off + n, _decay(dt_first, a_col * LOG2E, FAST_EXP) * _time_row(g_loc, offs_a, 0),
                 mask=d_mask)


@triton.jit
def _cf_grads_kernel(U, DELTA, DELTA_BIAS, A, B, C, CA, D, Z, DOUT, H, X, DU, DDELTA, DZ,
                     DA_PART, DB_PART, DC_PART, DD_PART, DBIAS_PART, seqlen, dim, dstate,
                     stride_ub, stride_ul, stride_ud, stride_db, stride_dl, stride_dd, stride_ad, stride_an,
                     stride_bb, stride_bl, stride_bn, stride_cb, stride_cl, stride_cn, stride_cab, stride_cal,
                     stride_can,
                     stride_zb, stride_zl, stride_zd, stride_ob, stride_ol, stride_od, stride_sb, stride_sc, stride_sd,
                     stride_pk, stride_pb, stride_pl, stride_vb, stride_vc,
                     CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, FAST_EXP: tl.constexpr, HAS_BIAS: tl.constexpr,
                     SOFTPLUS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, ATOMIC: tl.constexpr,
                     FLIP_SCAN: tl.constexpr):
    """Backward pass 3, state by state: for each n, h_n (forward rescan from H_c) and g_n
    (reverse rescan with X_c), their terms of du, ddelta and dz accumulated in registers, and
    dA[:, n], dB[:, n], dC[:, n] written at once. DU, DDELTA and DZ have DOUT's strides (the
    launcher allocates them so); partial sums as backward.py's gradient pass writes them."""
    off_b, pid_d, chunk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    d0 = pid_d * BLOCK_D
    t0 = chunk * CHUNK
    offs_t, offs_d, n_t, d_mask, u, dt, x, dtu = _cf_chunk_prologue(
        U, DELTA, DELTA_BIAS, off_b, t0, d0, seqlen, dim, stride_ub, stride_ul, stride_ud, stride_db, stride_dl,
        stride_dd, CHUNK, BLOCK_D, HAS_BIAS, SOFTPLUS)
    row_mask = offs_t < n_t
    dy, dout, z = _cf_gated_dout(DOUT, Z, off_b, t0, d0, seqlen, dim, stride_ob, stride_ol, stride_od, stride_zb,
                                 stride_zl, stride_zd, offs_t, offs_d, HAS_Z)
    dt_next_a = _cf_next_step_size(DELTA, DELTA_BIAS, off_b, t0, d0, seqlen, dim, stride_db, stride_dl, stride_dd,
                                   offs_t, offs_d, CHUNK, HAS_BIAS, SOFTPLUS)
    dy_a = dy
    if FLIP_SCAN:
        # What the adjoint scan reads, in its order (_adjoint_order): the two tiles flipped once
        # per chunk (their loads stay vectorised), C's columns from the reversed copy; g comes
        # back to step order once per state.
        dt_next_a = tl.flip(dt_next_a, 0)
        dy_a = tl.flip(dy, 0)
    s_off = off_b.to(tl.int64) * stride_sb + chunk.to(tl.int64) * stride_sc + (d0 + offs_d) * stride_sd
    if ATOMIC:
        part = off_b.to(tl.int64) * stride_pb + (t0 + offs_t).to(tl.int64) * stride_pl
    else:
        part = (pid_d.to(tl.int64) * stride_pk + off_b.to(tl.int64) * stride_pb
                + (t0 + offs_t).to(tl.int64) * stride_pl)
    gb_sum = tl.zeros([CHUNK, BLOCK_D], dtype=tl.float32)  # sum_n g B
    ddt = tl.zeros([CHUNK, BLOCK_D], dtype=tl.float32)     # dL/d dt: sum_n A g (h - b), + u gb_sum below
    y = tl.zeros([CHUNK, BLOCK_D], dtype=tl.float32)       # the core's output, for dz
    a_nxt, b_nxt = _state_columns(A, B, 0, off_b, t0, d0, offs_t, offs_d, n_t, d_mask, stride_ad, stride_an,
                                  stride_bb, stride_bl, stride_bn)
    c_nxt = _state_column(C, off_b, t0, 0, stride_cb, stride_cl, stride_cn, offs_t, n_t)
    n_ta = _adjoint_columns_end(n_t, CHUNK, FLIP_SCAN)
    ca_nxt = _state_column(CA, off_b, t0, 0, stride_cab, stride_cal, stride_can, offs_t, n_ta)
    h_nxt = tl.load(H + s_off, mask=d_mask, other=0.0)
    x_nxt = tl.load(X + s_off, mask=d_mask, other=0.0)
    for n in range(0, dstate):
        a_col, b_col, c_col, ca_col, h_init, x_init = a_nxt, b_nxt, c_nxt, ca_nxt, h_nxt, x_nxt
        m = _next_state(n, dstate)
        a_nxt, b_nxt = _state_columns(A, B, m, off_b, t0, d0, offs_t, offs_d, n_t, d_mask, stride_ad, stride_an,
                                      stride_bb, stride_bl, stride_bn)
        c_nxt = _state_column(C, off_b, t0, m, stride_cb, stride_cl, stride_cn, offs_t, n_t)
        ca_nxt = _state_column(CA, off_b, t0, m, stride_cab, stride_cal, stride_can, offs_t, n_ta)
        h_nxt = tl.load(H + s_off + m, mask=d_mask, other=0.0)
        x_nxt = tl.load(X + s_off + m, mask=d_mask, other=0.0)
        b, a_cum, h_loc = _cf_state_scan(a_col, b_col, dt, dtu, FAST_EXP)
        h = h_loc + a_cum * h_init[None, :]
        alpha_cum, g_loc = _adjoint_scan(_decay(dt_next_a, (a_col * LOG2E)[None, :], FAST_EXP),
                                         dy_a * ca_col[:, None], FLIP_SCAN)
        g = g_loc + alpha_cum * x_init[None, :]
        if FLIP_SCAN:
            g = tl.flip(g, 0)                                              # back to step order
        g_hb = g * (h - b)                                                 # g a h[t-1]
        gb_sum += g * b_col[:, None]
        ddt += g_hb * a_col[None, :]
        if HAS_Z:
            y += h * c_col[:, None]
        tl.store(DA_PART + s_off + n, tl.sum(g_hb * dt, 0), mask=d_mask)
        # Rows past the sequence end hold g = 0 and dy = 0, so they add nothing.
        _write_partial(DB_PART + part + n, tl.sum(g * dtu, 1), row_mask, ATOMIC)
        _write_partial(DC_PART + part + n, tl.sum(dy * h, 1), row_mask, ATOMIC)

    d_skip = _channel_vector(D, d0, dim, offs_d, HAS_D, BLOCK_D)
    du = dt * gb_sum
    if HAS_D:
        du += dy * d_skip[None, :]
    ddt += u * gb_sum
    ddelta = ddt
    if SOFTPLUS:
        ddelta = ddt * _sigmoid(x)                                         # d softplus(x) / dx
    td_mask = row_mask[:, None] & d_mask[None, :]
    o_off = (off_b.to(tl.int64) * stride_ob + (t0 + offs_t)[:, None].to(tl.int64) * stride_ol
             + (d0 + offs_d)[None, :] * stride_od)
    tl.store(DU + o_off, du.to(DU.dtype.element_ty), mask=td_mask)
    tl.store(DDELTA + o_off, ddelta.to(DDELTA.dtype.element_ty), mask=td_mask)
    if HAS_Z:
        sig = _sigmoid(z)
        y += u * d_skip[None, :]
        tl.store(DZ + o_off, (dout * y * (sig * (1.0 + z * (1.0 - sig)))).to(DZ.dtype.element_ty), mask=td_mask)
    v_off = off_b.to(tl.int64) * stride_vb + chunk.to(tl.int64) * stride_vc + d0 + offs_d
    if HAS_D:
        tl.store(DD_PART + v_off, tl.sum(dy * u, 0), mask=d_mask)
    if HAS_BIAS:
        tl.store(DBIAS_PART + v_off, tl.sum(tl.where(td_mask, ddelta, 0.0), 0), mask=d_mask)


# ---------------------------------------------------------------- launchers

def _as_channels_first(t: torch.Tensor) -> torch.Tensor:
    """t if it is a view of dense (batch, dim, seqlen) memory, else such a copy of it."""
    dense = t.stride(1) == 1 and t.stride(2) == t.shape[1] and t.stride(0) == t.shape[1] * t.shape[2]
    return t if dense else t.transpose(1, 2).contiguous().transpose(1, 2)


def _state_major(x: torch.Tensor) -> torch.Tensor:
    """B or C, (batch, seqlen, dstate), as float32 with the steps adjacent in memory (a view of
    (batch, dstate, seqlen)). Each thread then reads its run of steps of state n in one vector
    load, already float32: read as given (dstate contiguous, 16-bit), a state's column took one
    scalar load, a 64-bit address and a conversion per step, a third of the output pass's
    instructions (sm_90 SASS). The copy is small: dstate values per step
    against the dim-wide u, delta and z."""
    if x.dtype == torch.float32 and x.stride(1) == 1 and x.stride(2) == x.shape[1]:
        return x
    return x.float().transpose(1, 2).contiguous().transpose(1, 2)


def _adjoint_columns(C: torch.Tensor, chunk: int, flip: bool) -> torch.Tensor:
    """C as the adjoint scans read it (_adjoint_order, _adjoint_columns_end): with flip, float32,
    each chunk's steps reversed (element t0 + i is step t0 + chunk - 1 - i) and zero past the
    sequence end, state-major as _state_major; C itself otherwise. A copy of dstate values per
    step, small beside the dim-wide tensors."""
    if not flip:
        return C
    batch, seqlen, dstate = C.shape
    padded_len = cdiv(seqlen, chunk) * chunk
    padded = torch.zeros(batch, dstate, padded_len, device=C.device, dtype=torch.float32)
    padded[:, :, :seqlen] = C.transpose(1, 2)
    reversed_chunks = padded.view(batch, dstate, padded_len // chunk, chunk).flip(-1)
    return reversed_chunks.reshape(batch, dstate, padded_len).transpose(1, 2)


def _cfg(dim: int, dstate: int, interpreted: bool) -> dict:
    # The chunk length is the forward's (chunk_blocks): its chunk states are what this takes.
    chunk = chunk_blocks(dim, dstate, interpreted)["CHUNK"]
    warps = 1 if interpreted else 8
    return dict(CHUNK=chunk, BLOCK_D=8 * warps, FAST_EXP=not interpreted, num_warps=warps)


def scan_backward(dout, u, delta, A, B, C, h0, decay, interpreted: bool = False, deterministic: bool = True, *,
                  D=None, z=None, delta_bias=None, softplus: bool = False):
    """backward.scan_backward for channels-first inputs; du, ddelta and dz come back as (batch,
    seqlen, dim) views of channels-first memory. dout is copied to channels-first if it is not."""
    batch, seqlen, dim = u.shape
    dstate = A.shape[1]
    cfg = _cfg(dim, dstate, interpreted)
    B, C = _state_major(B), _state_major(C)
    n_chunks = h0.shape[1]
    grid = (batch, cdiv(dim, cfg["BLOCK_D"]), n_chunks)
    dout = _as_channels_first(dout)
    flags = kernel_flags(D, z, delta_bias, softplus)
    bias, d_skip, gate = (u if t is None else t for t in (delta_bias, D, z))  # placeholders where not given
    s_strides = strides3(h0)
    flip = flip_reverse_scan(interpreted)
    c_adj = _adjoint_columns(C, cfg["CHUNK"], flip)
    y_loc, carried = torch.empty_like(h0), torch.empty_like(h0)
    _cf_bwd_local_kernel[grid](delta, bias, A, c_adj, dout, gate, y_loc, seqlen, dim, dstate, *strides3(delta),
                               A.stride(0), A.stride(1), *strides3(c_adj), *strides3(dout), *strides3(gate),
                               *s_strides, HAS_BIAS=flags["HAS_BIAS"], SOFTPLUS=flags["SOFTPLUS"],
                               HAS_Z=flags["HAS_Z"], FLIP_SCAN=flip, **cfg)
    carry_walk(y_loc, decay, carried, True, chunk_blocks(dim, dstate, interpreted))
    del y_loc
    # The gradient kernel writes du, ddelta and dz with dout's strides; dout is dense, so
    # empty_like gives them exactly those.
    du = torch.empty_like(dout, dtype=u.dtype)
    ddelta = torch.empty_like(dout, dtype=delta.dtype)
    dz = torch.empty_like(dout, dtype=z.dtype) if z is not None else du  # du: a placeholder
    da_part = torch.empty_like(h0)
    parts = 1 if not deterministic else grid[1]
    alloc = torch.zeros if not deterministic else torch.empty
    db_part = alloc(parts, batch, seqlen, dstate, device=u.device, dtype=torch.float32)
    dc_part = alloc(db_part.shape, device=u.device, dtype=torch.float32)
    vec_part = [torch.empty(batch, n_chunks, dim, device=u.device, dtype=torch.float32) if given else None
                for given in (flags["HAS_D"], flags["HAS_BIAS"])]
    dd_part, dbias_part = (da_part if t is None else t for t in vec_part)  # placeholders where not given
    _cf_grads_kernel[grid](u, delta, bias, A, B, C, c_adj, d_skip, gate, dout, h0, carried, du, ddelta, dz, da_part,
                           db_part, dc_part, dd_part, dbias_part, seqlen, dim, dstate, *strides3(u),
                           *strides3(delta), A.stride(0), A.stride(1), *strides3(B), *strides3(C),
                           *strides3(c_adj), *strides3(gate),
                           *strides3(dout), *s_strides, db_part.stride(0), db_part.stride(1), db_part.stride(2),
                           n_chunks * dim, dim, **flags, ATOMIC=not deterministic, FLIP_SCAN=flip, **cfg)
    del carried
    dD, dbias = (None if t is None else t.sum((0, 1)) for t in vec_part)
    return (du, ddelta, da_part.sum((0, 1)), db_part.sum(0), dc_part.sum(0), dD, dz if z is not None else None,
            dbias)
