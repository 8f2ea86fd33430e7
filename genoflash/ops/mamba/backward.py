"""The selective scan's backward in Triton for (token, channel) rows, chunked so a long sequence fills the GPU.

(Channels-first activations, the Mamba block's, take backward_channels_first.py: the same math on
another tiling. The forward is forward.py's for both.)

The core is h[t] = a[t] * h[t-1] + b[t], y[t] = sum_n C[t, n] h[t], per (batch, channel d,
state n), with a = exp(dt A) and b = dt B u (reference.py). The element-wise parts around it
run inside the same kernels, as in mamba-ssm's CUDA scan: the step size dt = softplus(delta +
delta_bias) is formed from delta where a tile is loaded, and the output pass writes
out = (y + u D) * silu(z) in the output dtype. No (token, channel) float32 tensor reaches HBM:
at a million tokens and 512 channels each would be 2 GiB.

A program owns one chunk of CHUNK time steps of BLOCK_D channels, all states, as a register
tile (CHUNK, BLOCK_D, BLOCK_N), and scans along time with `tl.associative_scan` over the
linear-recurrence operator (recurrence.py). The forward saved the state entering every chunk,
H_c (forward.py). The backward runs the adjoint g[t] = dL/dh[t] = C[t] dy[t] + a[t+1] g[t+1]
in reverse, with dy = dout silu(z) the core's share of the output gradient, in three passes:
  1. every chunk scans its adjoint from a zero end state: what it hands the chunk before it;
  2. the carry walk in reverse over the chunks (chunk_states.py): the adjoint X_c carried into
     each chunk from the later ones;
  3. every chunk rescans h from H_c (h[t] = h_loc[t] + (prod a)[0..t] H_c) and g from X_c, and
     with both in registers forms every gradient in one pass.
a[t] h[t-1] = h[t] - b[t] gives the terms that need h[t-1] without a shifted copy:
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

import torch
import triton
import triton.language as tl

from ..common.host import cdiv
from .chunk_states import _state_ptrs, carry_walk
from .recurrence import (_channel_vector, _linear_recurrence, _sigmoid, _step_size, _tile_2d, _write_partial,
                         check_same_layout, chunk_blocks, flip_reverse_scan, grads_blocks, kernel_flags, strides3)


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
def _row(x, offs_t, t: tl.constexpr):
    """Row t of a (CHUNK, ...) tile: a masked sum, since register tiles are not indexable."""
    return tl.sum(tl.where(offs_t[:, None, None] == t, x, 0.0), 0)


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
        # per thread, 1,056 of them SHFL, become 2,560 with 416; docs/design/mamba-scan.md). On the
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

def scan_backward(dout, u, delta, A, B, C, h0, decay, interpreted: bool = False, deterministic: bool = True, *,
                  D=None, z=None, delta_bias=None, softplus: bool = False):
    """(du, ddelta, dA, dB, dC, dD, dz, ddelta_bias) of scan_forward's output, given dL/dout:
    du, ddelta and dz in u's, delta's and z's dtypes, the rest float32 (None where the input
    was not given). `deterministic=False` sums dB and dC with atomics (see recurrence.grads_blocks)."""
    batch, seqlen, dim = u.shape
    dstate = A.shape[1]
    dout = dout.contiguous()
    check_same_layout(u, dout=dout)
    cfg = chunk_blocks(dim, dstate, interpreted)
    n_chunks = h0.shape[1]
    grid = (batch, cdiv(dim, cfg["BLOCK_D"]), n_chunks)
    flags = kernel_flags(D, z, delta_bias, softplus)
    bias, d_skip, gate = (u if t is None else t for t in (delta_bias, D, z))  # placeholders where not given
    y_loc, carried = torch.empty_like(h0), torch.empty_like(h0)
    common = (seqlen, dim, dstate, *strides3(u), *strides3(delta), A.stride(0), A.stride(1), *strides3(B))
    s_strides = (h0.stride(0), h0.stride(1), h0.stride(2))
    # Both backward kernels scan the adjoint in reverse: as a flipped forward scan on the
    # forward's tiles, natively on the atomic path's narrower ones (_chunk_adjoint).
    flip = flip_reverse_scan(interpreted)
    z_strides = strides3(gate)
    _scan_chunk_bwd_local_kernel[grid](u, delta, bias, A, B, C, dout, gate, y_loc, *common, *strides3(C),
                                       *z_strides, *s_strides, HAS_BIAS=flags["HAS_BIAS"], SOFTPLUS=flags["SOFTPLUS"],
                                       HAS_Z=flags["HAS_Z"], FLIP_SCAN=flip, **cfg)
    carry_walk(y_loc, decay, carried, True, cfg)
    del y_loc
    du = torch.empty_like(u)  # u, dout and these share one layout (check_same_layout)
    ddelta = torch.empty(u.shape, device=u.device, dtype=delta.dtype)
    dz = torch.empty_like(u, dtype=z.dtype) if z is not None else du  # in u's layout; du: a placeholder
    da_part = torch.empty_like(h0)
    cfg = grads_blocks(dim, dstate, interpreted, deterministic)
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
    check_same_layout(u, ddelta=ddelta)
    _scan_chunk_grads_kernel[grid](u, delta, bias, A, B, C, d_skip, gate, dout, h0, carried, du, ddelta, dz,
                                   da_part, db_part, dc_part, dd_part, dbias_part, *common, *strides3(C),
                                   *z_strides, *s_strides, db_part.stride(0), db_part.stride(1), db_part.stride(2),
                                   n_chunks * dim, dim, **flags, ATOMIC=not deterministic,
                                   FLIP_SCAN=flip and deterministic, **cfg)
    del carried
    dD, dbias = (None if t is None else t.sum((0, 1)) for t in vec_part)
    return (du, ddelta, da_part.sum((0, 1)), db_part.sum(0), dc_part.sum(0), dD, dz if z is not None else None,
            dbias)
