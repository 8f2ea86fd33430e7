"""The one-pass backward for Hopper, in Gluon (Triton's explicit-layout dialect).

Why a second backward: the triton backward (backward.py) runs two passes and 7 matmuls per
visible tile pair, where a one-pass backward runs 5 (S, dP, dV, dK and this pair's share of dQ,
summed in float32). Written in plain Triton the one-pass form was slower than the two passes
(docs/design/backward-sm90.md): the compiler waits for each matmul before
the next and cannot overlap the softmax work, the dQ reductions and the loads. Gluon lets the
kernel say what overlaps: every wgmma is issued asynchronously and waited for only where its
result is read, and the work is split between warps (warp specialisation):

- 8 compute warps (two warpgroups, 240 registers each thread): the matmuls and the softmax work;
- 1 load warp: K and V once, then each step's Q, dO, lse2 and delta by TMA, into two buffers;
- 1 dQ warp: each step's dQ share, left in shared memory, goes to a float32 accumulator as one
  bulk reduction by the copy engine (cp.reduce.async.bulk). Per-element atomics from the compute
  warps cost 28% more time.

One program owns BLOCK_N keys of one K/V head (dK and dV stay in registers) and streams the
query tiles that see them, of every query head in its GQA group. Per query tile, with the keys
as rows (so that P^T and dS^T are the left operands of dV and dK, straight from registers):

    S^T = K Q^T,  dP^T = V dO^T,  P^T = exp2(S^T * scale * log2(e) - lse2),
    dV += P^T dO,  dS^T = P^T (dP^T - delta),  dK += dS^T Q,  dQ += dS K  (float32, by the dQ warp)

The two warpgroups each own BLOCK_N / 2 keys; the dQ matmul contracts over all BLOCK_N keys, so
dS^T goes through shared memory and the compute warps meet at two barriers per query tile. At head
dim 256 (the "wide" partitions below) they split the work by accumulator instead: one warpgroup
S^T, P^T and dV, the other dP^T, dS^T and dK, with P^T and dS^T crossing through shared memory and
dQ^T (rows: the head dim) split between them. Two
light triton passes surround the kernel: delta = rowsum(O * dO) and lse2 before (with the dQ
accumulator zeroed), dQ's scaling and cast after.

Taken where it applies (`applies`): sm_90, 16-bit, head dim 64, 128 or 256 (Q/K and V alike), fixed lengths,
full or causal attention without dropout, RoPE, ALiBi, softcap or window, TMA-aligned tensors,
and deterministic=False (the copy engine sums dQ in no fixed order). Everything else runs
backward.py. Not under the Triton interpreter (it has no Gluon): CPU tests check the dispatch
rule and compile the kernel for sm_90 (tests/ops/attention/test_sm90_compile.py); the GPU tests
run it. docs/design/backward-sm90.md says why it is built this way and what it measured.

Gluon is triton's experimental dialect and its API moves between releases: this module is
imported only where it can run (backward.py imports it guarded), and a triton without the Hopper
API it uses leaves the two passes in charge (`UNAVAILABLE` says why).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ...backends import triton_interpreted
from ..common.host import MAX_GRID_YZ, cdiv
from .args import AttentionArgs
from . import descriptors
from .configs import LIGHT_PASS, TileConfig, fits_in_free_memory, sm90_min_seqlen
from .descriptors import aligned
from .launch import launch
from .softmax import LOG2E_HOST, _lse_for_recompute, _rowsum_o_do
from .tiles import _head_base, _load_tile, _row_ptr, _store_tile

# head dim -> (query rows per step, keys per program: two warpgroups of BLOCK_N / 2). Head dim 64
# holds K and V in registers (SMALL_HEAD below); larger query steps spilled there. Head dim 256:
# the wide kernel (32 query rows per step, 64 keys per program, one accumulator per warpgroup;
# see _bwd_wide_p_partition). docs/design/tile-configs.md has the measurements.
TILES = {128: (64, 128), 64: (64, 128), 256: (32, 64)}
# Launch settings of the main kernel: 8 compute warps (its load and dQ warps come on top, from
# gl.warp_specialize); the wide kernel launches its P warpgroup (4 warps) and adds the dS warpgroup
# as a worker. num_stages does nothing in a Gluon kernel, which places its own buffers.
_MAIN_TILES = {d: TileConfig(m, n, num_warps=4 if d > 128 else 8, num_stages=3) for d, (m, n) in TILES.items()}
# Shorter sequences keep the triton passes: the shortest length (of queries or keys) per head dim,
# where this kernel, timed forced at every length beside the two passes, started to win
# (docs/design/backward-sm90.md). override_configs(sm90_min_seqlen=0) takes it at any length.
MIN_SEQLEN = {64: 1024, 128: 512, 256: 512}
MIN_SEQLEN_CAUSAL = {64: 2048, 128: 1024, 256: 512}
# The float32 dQ accumulator, (batch * heads, seqlen, head_dim), is 2x dq and lives through the
# backward: the fwd+bwd peak is 1.25x the floor (q, k, v, dout, out, dq, dk, dv) that the two
# passes keep, as cuDNN's is (docs/design/memory.md). Where it (with lse2 and delta) would take
# more than this share of the device's free memory, the two passes run instead: a genome-scale
# backward near the memory limit stays at the floor rather than running out.
ACCUM_MAX_FREE_FRACTION = 0.5
NUM_BUF = 2  # query tiles in flight (Q, dO, lse2, delta)
STAT_PAD = 128  # lse2 / delta rows are padded to this, so that every TMA box lies inside


@triton.jit
def _bwd_sm90_prologue_kernel(OUT, DOUT, LSE, DELTA, LSE2, DQ_ACCUM, stride_ob, stride_om, stride_oh, stride_dob,
                              stride_dom, stride_doh, stride_lse_b, stride_lse_h, nheads, seqlen_q, seqlen_pad,
                              HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, DQ_T: tl.constexpr):
    """Per query row, float32, in (batch * heads, seqlen_pad) buffers: delta = rowsum(O * dO) and
    lse2 = lse * log2(e) (+inf for a row that sees no key and for the padding rows, so that their
    P = exp2(-inf) = 0); and dQ's accumulator rows set to 0. The padding lets every TMA box of the
    main kernel lie inside its buffer."""
    start = tl.program_id(0) * BLOCK
    bh = tl.program_id(1)
    off_b, off_h = bh // nheads, bh % nheads
    offs = tl.arange(0, BLOCK)
    cols = tl.arange(0, HEAD_DIM)
    n_rows = seqlen_q - start  # rows of the sequence in this block (<= 0 in the padding)
    # int64 bases (tiles.py): offsets pass 2^31 elements at genome scale (tests/test_gpu_scale.py)
    do = _load_tile(_row_ptr(_head_base(DOUT, off_b, off_h, stride_dob, stride_doh), start, stride_dom), offs,
                    n_rows, stride_dom, cols, HEAD_DIM, HEAD_DIM, True)
    delta = _rowsum_o_do(_row_ptr(_head_base(OUT, off_b, off_h, stride_ob, stride_oh), start, stride_om), do, offs,
                         n_rows, stride_om, cols, HEAD_DIM, HEAD_DIM)
    lse = tl.load(_row_ptr(_head_base(LSE, off_b, off_h, stride_lse_b, stride_lse_h), start, 1) + offs,
                  mask=offs < n_rows, other=float("-inf"))
    row = bh * seqlen_pad + start  # of the padded (batch * heads, seqlen_pad) buffers
    tl.store(_row_ptr(DELTA, row, 1) + offs, delta)
    tl.store(_row_ptr(LSE2, row, 1) + offs, _lse_for_recompute(lse))
    tl.store(_accum_tile(DQ_ACCUM, bh, start, seqlen_pad, offs, cols, HEAD_DIM, DQ_T),
             tl.zeros([BLOCK, HEAD_DIM], tl.float32))


@triton.jit
def _accum_tile(DQ_ACCUM, bh, start, seqlen_pad, offs, cols, HEAD_DIM: tl.constexpr, DQ_T: tl.constexpr):
    """Pointers to rows start + offs of head bh's dQ accumulator, (seqlen_pad, HEAD_DIM) per head,
    or (HEAD_DIM, seqlen_pad) with DQ_T (the wide kernel sums dQ^T); int64 as tiles.py's bases."""
    base = DQ_ACCUM + bh.to(tl.int64) * seqlen_pad * HEAD_DIM
    if DQ_T:
        return base + cols[None, :].to(tl.int64) * seqlen_pad + (start + offs)[:, None]
    return base + (start + offs)[:, None].to(tl.int64) * HEAD_DIM + cols[None, :]


@triton.jit
def _bwd_sm90_dq_kernel(DQ_ACCUM, DQ, stride_dqb, stride_dqm, stride_dqh, nheads, seqlen_q, seqlen_pad,
                        softmax_scale, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, DQ_T: tl.constexpr):
    """dQ = softmax_scale * the summed accumulator, in q's layout and dtype."""
    start = tl.program_id(0) * BLOCK
    bh = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    cols = tl.arange(0, HEAD_DIM)
    accum = tl.load(_accum_tile(DQ_ACCUM, bh, start, seqlen_pad, offs, cols, HEAD_DIM, DQ_T))
    dq = _row_ptr(_head_base(DQ, bh // nheads, bh % nheads, stride_dqb, stride_dqh), start, stride_dqm)
    _store_tile(dq, accum * softmax_scale, offs, seqlen_q - start, stride_dqm, cols, HEAD_DIM, HEAD_DIM)


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """global[box at coord] += src (shared memory), by the copy engine (cp.reduce.async.bulk.tensor); its
    completion is waited for as a TMA store's (tma.store_wait). Triton 3.6 builds the op but Gluon's
    Python layer does not name it yet."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _step_coords(i, n_m, m_first, off_hk, kv_group, BLOCK_M: gl.constexpr):
    """Step i of a program = query tile i % n_m (from m_first) of its group's query head i // n_m."""
    return off_hk * kv_group + i // n_m, (m_first + i % n_m) * BLOCK_M


@gluon.jit
def _bwd_load_partition(q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, k_smem, v_smem, q_smem, do_smem,
                        lse2_smem, delta_smem, kv_bar, ready, free, n_steps, n_m, m_first, off_b, off_hk, n0,
                        kv_group, nheads, seqlen_pad, BLOCK_M: gl.constexpr, NUM_BUF: gl.constexpr):
    """One warp: K and V once, then each step's Q, dO, lse2 and delta into the buffer the compute
    warps released (`free`), signalling `ready` by the bytes that land."""
    mbarrier.expect(kv_bar.index(0), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [off_b, n0, off_hk, 0], kv_bar.index(0), k_smem)
    tma.async_copy_global_to_shared(v_desc, [off_b, n0, off_hk, 0], kv_bar.index(0), v_smem)
    nbytes: gl.constexpr = (q_desc.block_type.nbytes + do_desc.block_type.nbytes + lse2_desc.block_type.nbytes
                            + delta_desc.block_type.nbytes)
    for i in range(n_steps):
        buf = i % NUM_BUF
        # Parity trick: the first round's wait (parity 1) passes on a fresh barrier.
        mbarrier.wait(free.index(buf), ((i // NUM_BUF) & 1) ^ 1)
        off_h, m0 = _step_coords(i, n_m, m_first, off_hk, kv_group, BLOCK_M)
        bar = ready.index(buf)
        mbarrier.expect(bar, nbytes)
        tma.async_copy_global_to_shared(q_desc, [off_b, m0, off_h, 0], bar, q_smem.index(buf))
        tma.async_copy_global_to_shared(do_desc, [off_b, m0, off_h, 0], bar, do_smem.index(buf))
        row = (off_b * nheads + off_h) * seqlen_pad + m0
        tma.async_copy_global_to_shared(lse2_desc, [row], bar, lse2_smem.index(buf))
        tma.async_copy_global_to_shared(delta_desc, [row], bar, delta_smem.index(buf))


@gluon.jit
def _bwd_dq_partition(dq_desc, dq_smem, dq_full, dq_empty, n_steps, n_m, m_first, off_b, off_hk, kv_group, nheads,
                      seqlen_pad, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, DQ_T: gl.constexpr):
    """One warp: each step's dQ share, left in shared memory by the compute warps, goes to the float32
    accumulator as one bulk reduction by the copy engine; the buffer is handed back once read.
    DQ_T (the wide kernel): the share is dQ^T, (HEAD_DIM, BLOCK_M), and the accumulator
    (batch * heads * HEAD_DIM, seqlen_pad)."""
    for i in range(n_steps):
        mbarrier.wait(dq_full.index(0), i & 1)
        off_h, m0 = _step_coords(i, n_m, m_first, off_hk, kv_group, BLOCK_M)
        if DQ_T:
            _tma_reduce_add(dq_desc, [(off_b * nheads + off_h) * HEAD_DIM, m0], dq_smem)
        else:
            _tma_reduce_add(dq_desc, [(off_b * nheads + off_h) * seqlen_pad + m0, 0], dq_smem)
        tma.store_wait(0)  # dq_smem has been read (the sum itself completes in L2 on its own)
        mbarrier.arrive(dq_empty.index(0))


@gluon.jit
def _store_rows(ptr, stride_b, stride_h, stride_n, off_b, off_hk, n0, seqlen_k, value, layout: gl.constexpr,
                BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """A (BLOCK_N, HEAD_DIM) tile of dK or dV at key n0 (rows past seqlen_k left out)."""
    rows = (n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))).to(gl.int64)
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    b64 = off_b.to(gl.int64)  # a batch offset passes 2^31 elements at genome scale
    gl.store(ptr + b64 * stride_b + off_hk * stride_h + rows[:, None] * stride_n + cols[None, :], value,
             mask=rows[:, None] < seqlen_k)


@gluon.jit
def _bwd_compute_partition(k_smem, v_smem, q_smem, do_smem, lse2_smem, delta_smem, ds_smem, dq_smem, kv_bar, ready,
                           free, dq_full, dq_empty, DK, DV, stride_dkb, stride_dkn, stride_dkh, stride_dvb,
                           stride_dvn, stride_dvh, n_steps, n_m, m_first, off_b, off_hk, n0, diag, seqlen_k,
                           qk_scale_log2, softmax_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                           BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr):
    """The 8 warps (two warpgroups) that run the matmuls and the elementwise work; see the module
    docstring for the step."""
    dtype: gl.constexpr = k_smem.dtype
    # Accumulator layouts of the wgmma instructions. Keys are rows: each of the 8 warps owns 16
    # of the BLOCK_N keys in S^T, dP^T, dK and dV. dQ (BLOCK_M x HEAD_DIM) splits its columns
    # over the two warpgroups instead.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    DQ_SPLIT: gl.constexpr = 2 if BLOCK_M == 64 else 1  # 64 query rows: one warpgroup per half of dQ's columns
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8 // DQ_SPLIT, DQ_SPLIT],
                                                        instr_shape=[16, HEAD_DIM // DQ_SPLIT, 16])
    # P^T and dS^T as the left operand of dV += P^T dO and dK += dS^T Q, from registers: the
    # accumulator's fragment is already the operand's, so the conversion moves no data.
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)  # one value per query (column of S^T)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)  # one value per key

    k_tile = k_smem.reshape([BLOCK_N, HEAD_DIM])
    v_tile = v_smem.reshape([BLOCK_N, HEAD_DIM])
    # Head dim 64 has registers to spare (hd128 does not): there K and V, the left operands of S^T
    # and dP^T in every step, are read from shared memory once and held in registers, which halves
    # those matmuls' shared-memory reads; and P stays in float32 for dS (no 16-bit round trip).
    SMALL_HEAD: gl.constexpr = HEAD_DIM <= 64
    kv_a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    dq_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
    keys = n0 + gl.arange(0, BLOCK_N, layout=row_layout)
    mbarrier.wait(kv_bar.index(0), 0)
    if SMALL_HEAD:
        k_op = k_tile.load(kv_a_layout)
        v_op = v_tile.load(kv_a_layout)
    else:
        k_op = k_tile
        v_op = v_tile

    for i in range(n_steps):
        buf = i % NUM_BUF
        mbarrier.wait(ready.index(buf), (i // NUM_BUF) & 1)
        q_tile = q_smem.index(buf).reshape([BLOCK_M, HEAD_DIM])
        do_tile = do_smem.index(buf).reshape([BLOCK_M, HEAD_DIM])
        s_tok = warpgroup_mma(k_op, q_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(v_op, do_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        lse2 = lse2_smem.index(buf).load(col_layout)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        p = gl.exp2(s * qk_scale_log2 - lse2[None, :])
        m0 = (m_first + i % n_m) * BLOCK_M
        if CAUSAL:
            # Only the query tiles that cross the diagonal hold a key past some query.
            if m0 + diag < n0 + BLOCK_N - 1:
                queries = m0 + gl.arange(0, BLOCK_M, layout=col_layout)
                p = gl.where(keys[:, None] <= queries[None, :] + diag, p, 0.0)
        p16 = p.to(dtype)
        dv_tok = warpgroup_mma(gl.convert_layout(p16, a_layout), do_tile, dv, is_async=True)
        delta = delta_smem.index(buf).load(col_layout)
        dp = warpgroup_mma_wait(1, deps=[dp_tok])
        if SMALL_HEAD:
            ds16 = (p * (dp - delta[None, :])).to(dtype)
        else:
            # P's 16-bit copy (the dV operand) stands in for P here: one tile of registers less.
            ds16 = (p16.to(gl.float32) * (dp - delta[None, :])).to(dtype)
        dk_tok = warpgroup_mma(gl.convert_layout(ds16, a_layout), q_tile, dk, is_async=True)
        ds_buf = ds_smem.index(i % 2)
        ds_buf.store(ds16)
        fence_async_shared()
        # Every warp has stored its dS^T rows; and has finished step i - 1, whose dQ matmul read
        # the other dS^T buffer (so the next step may overwrite it).
        gl.thread_barrier()
        dq_tok = warpgroup_mma(ds_buf.permute((1, 0)), k_tile, dq_zero, use_acc=False, is_async=True)
        dv, dk, dq = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, dq_tok])
        mbarrier.wait(dq_empty.index(0), (i & 1) ^ 1)  # step i - 1's share has left dq_smem
        dq_smem.store(dq)
        fence_async_shared()
        gl.thread_barrier()  # all of dQ is in dq_smem, and no warp reads this step's Q / dO again
        mbarrier.arrive(dq_full.index(0))
        mbarrier.arrive(free.index(buf))

    # Keys no query sees (causal, seqlen_q < seqlen_k) run no step: their dK, dV are 0.
    _store_rows(DK, stride_dkb, stride_dkh, stride_dkn, off_b, off_hk, n0, seqlen_k, (dk * softmax_scale).to(dtype),
                kv_layout, BLOCK_N, HEAD_DIM)
    _store_rows(DV, stride_dvb, stride_dvh, stride_dvn, off_b, off_hk, n0, seqlen_k, dv.to(dtype), kv_layout,
                BLOCK_N, HEAD_DIM)


# The wide kernel (head dim 256). dK and dV of a 64-key tile are 2 x 64 x 256 float32: 128 registers
# a thread over both warpgroups, so the two warpgroups cannot each own half of the keys as above
# (wgmma's rows come in 64s per warpgroup). Each warpgroup owns one accumulator instead, over all
# 64 keys and all 256 channels: the "P" warpgroup S^T, P^T and dV, the "dS" warpgroup dP^T, dS^T and
# dK. P^T crosses from the first to the second through shared memory, and dS^T the other way; dQ^T
# (256 x BLOCK_M, K^T dS^T, so that its rows are the head dim's and come in 64s) splits its rows over
# the two. Per step, 5 matmuls against the two triton passes' 7. 32 query rows per step keep
# shared memory within the H200's 227 KB: K and V 64 KB, Q and dO 2 x 32 KB, P^T and dS^T 16 KB,
# dQ^T 32 KB.


@gluon.constexpr_function
def _wide_layouts(BLOCK_M, HEAD_DIM):
    """One warpgroup's wgmma layouts: S^T-shaped tiles (keys or channels as rows, BLOCK_M query
    columns), a (BLOCK_N, HEAD_DIM) accumulator, and the left-operand layout of P^T / dS^T from
    registers (the S^T accumulator's fragment is already it: the conversion moves no data)."""
    s_layout = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 16])
    acc_layout = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
    return s_layout, acc_layout, gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)


@gluon.jit
def _wide_step(i, ready, q_smem, do_smem, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_BUF: gl.constexpr):
    """Step i's buffers, once its Q and dO have landed: the Q / dO buffer, the P^T / dS^T buffer
    (each reused every second step), and the Q and dO tiles."""
    buf = i % NUM_BUF
    mbarrier.wait(ready.index(buf), (i // NUM_BUF) & 1)
    return (buf, i % 2, q_smem.index(buf).reshape([BLOCK_M, HEAD_DIM]),
            do_smem.index(buf).reshape([BLOCK_M, HEAD_DIM]))


@gluon.jit
def _wide_dq_share(kt_rows, ds_buf, dqt_zero, dq_smem_rows, acc, acc_tok, dq_full, dq_empty, i):
    """This warpgroup's rows of dQ^T = K^T dS^T into dQ's shared buffer, once the dQ warp has
    taken the previous step's; waits for this step's accumulator matmul too. Returns it."""
    dq_tok = warpgroup_mma(kt_rows, ds_buf, dqt_zero, use_acc=False, is_async=True)
    acc, dqt = warpgroup_mma_wait(0, deps=[acc_tok, dq_tok])
    mbarrier.wait(dq_empty.index(0), (i & 1) ^ 1)
    dq_smem_rows.store(dqt)
    fence_async_shared()
    gl.thread_barrier()  # the warpgroup's rows are all in dq_smem, and its matmuls have read Q, dO, dS^T
    mbarrier.arrive(dq_full.index(0))
    return acc


@gluon.jit
def _bwd_wide_p_partition(k_smem, q_smem, do_smem, lse2_smem, p_smem, ds_smem, dq_smem, kv_bar, ready, free, p_full,
                          p_empty, ds_full, ds_empty, dq_full, dq_empty, DV, stride_dvb, stride_dvn, stride_dvh,
                          n_steps, n_m, m_first, off_b, off_hk, n0, diag, seqlen_k, qk_scale_log2,
                          HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr):
    """The P warpgroup (the default partition, 4 warps): S^T = K Q^T, P^T (to the dS warpgroup),
    dV += P^T dO, and dQ^T's first HEAD_DIM / 2 rows."""
    dtype: gl.constexpr = k_smem.dtype
    s_layout: gl.constexpr = _wide_layouts(BLOCK_M, HEAD_DIM)[0]
    acc_layout: gl.constexpr = _wide_layouts(BLOCK_M, HEAD_DIM)[1]
    a_layout: gl.constexpr = _wide_layouts(BLOCK_M, HEAD_DIM)[2]
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)  # one value per query (column of S^T)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)  # one value per key
    HALF: gl.constexpr = HEAD_DIM // 2
    k_tile = k_smem.reshape([BLOCK_N, HEAD_DIM])
    kt_rows = k_tile.slice(0, HALF, dim=1).permute((1, 0))  # K^T's first HALF rows, for dQ^T
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    dqt_zero = gl.zeros([HALF, BLOCK_M], gl.float32, s_layout)
    keys = n0 + gl.arange(0, BLOCK_N, layout=row_layout)
    mbarrier.wait(kv_bar.index(0), 0)

    for i in range(n_steps):
        buf, pb, q_tile, do_tile = _wide_step(i, ready, q_smem, do_smem, BLOCK_M, HEAD_DIM, NUM_BUF)
        s_tok = warpgroup_mma(k_tile, q_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        lse2 = lse2_smem.index(buf).load(col_layout)
        s = warpgroup_mma_wait(0, deps=[s_tok])
        p = gl.exp2(s * qk_scale_log2 - lse2[None, :])
        if CAUSAL:
            m0 = (m_first + i % n_m) * BLOCK_M
            # Only the query tiles that cross the diagonal hold a key past some query.
            if m0 + diag < n0 + BLOCK_N - 1:
                queries = m0 + gl.arange(0, BLOCK_M, layout=col_layout)
                p = gl.where(keys[:, None] <= queries[None, :] + diag, p, 0.0)
        p16 = p.to(dtype)
        dv_tok = warpgroup_mma(gl.convert_layout(p16, a_layout), do_tile, dv, is_async=True)
        # P^T to the dS warpgroup, once it has read this buffer two steps ago (parity trick: the
        # first round's wait passes on a fresh barrier).
        mbarrier.wait(p_empty.index(pb), ((i // 2) & 1) ^ 1)
        p_smem.index(pb).store(p16)
        gl.thread_barrier()  # (the dS warpgroup reads P^T with plain loads: no async-proxy fence)
        mbarrier.arrive(p_full.index(pb))
        mbarrier.wait(ds_full.index(pb), (i // 2) & 1)
        dv = _wide_dq_share(kt_rows, ds_smem.index(pb), dqt_zero, dq_smem.slice(0, HALF, dim=0), dv, dv_tok,
                            dq_full, dq_empty, i)
        mbarrier.arrive(ds_empty.index(pb))
        mbarrier.arrive(free.index(buf))

    _store_rows(DV, stride_dvb, stride_dvh, stride_dvn, off_b, off_hk, n0, seqlen_k, dv.to(dtype), acc_layout,
                BLOCK_N, HEAD_DIM)


@gluon.jit
def _bwd_wide_ds_partition(k_smem, v_smem, q_smem, do_smem, delta_smem, p_smem, ds_smem, dq_smem, kv_bar, ready,
                           free, p_full, p_empty, ds_full, ds_empty, dq_full, dq_empty, DK, stride_dkb, stride_dkn,
                           stride_dkh, n_steps, off_b, off_hk, n0, seqlen_k, softmax_scale, HEAD_DIM: gl.constexpr,
                           BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr):
    """The dS warpgroup (a 4-warp worker): dP^T = V dO^T, dS^T = P^T (dP^T - delta) with P^T from
    the P warpgroup, dK += dS^T Q, and dQ^T's last HEAD_DIM / 2 rows."""
    dtype: gl.constexpr = k_smem.dtype
    s_layout: gl.constexpr = _wide_layouts(BLOCK_M, HEAD_DIM)[0]
    acc_layout: gl.constexpr = _wide_layouts(BLOCK_M, HEAD_DIM)[1]
    a_layout: gl.constexpr = _wide_layouts(BLOCK_M, HEAD_DIM)[2]
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    HALF: gl.constexpr = HEAD_DIM // 2
    v_tile = v_smem.reshape([BLOCK_N, HEAD_DIM])
    kt_rows = k_smem.reshape([BLOCK_N, HEAD_DIM]).slice(HALF, HALF, dim=1).permute((1, 0))
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    dqt_zero = gl.zeros([HALF, BLOCK_M], gl.float32, s_layout)
    mbarrier.wait(kv_bar.index(0), 0)

    for i in range(n_steps):
        buf, pb, q_tile, do_tile = _wide_step(i, ready, q_smem, do_smem, BLOCK_M, HEAD_DIM, NUM_BUF)
        dp_tok = warpgroup_mma(v_tile, do_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        delta = delta_smem.index(buf).load(col_layout)
        dp = warpgroup_mma_wait(0, deps=[dp_tok])
        mbarrier.wait(p_full.index(pb), (i // 2) & 1)
        p = p_smem.index(pb).load(s_layout).to(gl.float32)  # masked keys arrive as P = 0, so dS = 0
        ds16 = (p * (dp - delta[None, :])).to(dtype)
        dk_tok = warpgroup_mma(gl.convert_layout(ds16, a_layout), q_tile, dk, is_async=True)
        # dS^T for both warpgroups' dQ^T rows, once both have read this buffer two steps ago.
        mbarrier.wait(ds_empty.index(pb), ((i // 2) & 1) ^ 1)
        ds_smem.index(pb).store(ds16)
        fence_async_shared()
        gl.thread_barrier()  # every warp has read P^T and stored its dS^T rows
        mbarrier.arrive(p_empty.index(pb))
        mbarrier.arrive(ds_full.index(pb))
        dk = _wide_dq_share(kt_rows, ds_smem.index(pb), dqt_zero, dq_smem.slice(HALF, HALF, dim=0), dk, dk_tok,
                            dq_full, dq_empty, i)
        mbarrier.arrive(ds_empty.index(pb))
        mbarrier.arrive(free.index(buf))

    _store_rows(DK, stride_dkb, stride_dkh, stride_dkn, off_b, off_hk, n0, seqlen_k, (dk * softmax_scale).to(dtype),
                acc_layout, BLOCK_N, HEAD_DIM)


@gluon.jit
def _attn_bwd_sm90_kernel(q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, dq_desc, DK, DV,
                          stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
                          nheads, nheads_k, seqlen_q, seqlen_k, seqlen_pad, qk_scale_log2, softmax_scale,
                          HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    WIDE: gl.constexpr = HEAD_DIM > 128  # the two-warpgroup split of the wide kernel (above)
    pid_n = gl.program_id(0)
    pid_bh = gl.program_id(1)
    off_b = pid_bh // nheads_k
    off_hk = pid_bh % nheads_k
    kv_group = nheads // nheads_k
    n0 = pid_n * BLOCK_N
    # Bottom-right aligned causal mask (flash-attn's): query i sees key j iff j <= i + diag.
    diag = seqlen_k - seqlen_q
    m_first = 0
    if CAUSAL:
        m_first = gl.maximum(n0 - diag, 0) // BLOCK_M
    n_m = gl.cdiv(seqlen_q, BLOCK_M) - m_first  # query tiles per head that see these keys
    n_steps = gl.maximum(n_m, 0) * kv_group

    k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [NUM_BUF] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [NUM_BUF] + do_desc.block_type.shape, do_desc.layout)
    lse2_smem = gl.allocate_shared_memory(gl.float32, [NUM_BUF, BLOCK_M], lse2_desc.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [NUM_BUF, BLOCK_M], delta_desc.layout)
    # dS^T for the dQ matmul, double-buffered: step i writes buffer i % 2 while the other
    # warpgroup may still be reading buffer (i - 1) % 2 in its dQ wgmma. (Since the compute warps
    # also meet after each step's dQ wait, one buffer would do; the kernel was timed with two.)
    ds_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype))
    dq_smem = gl.allocate_shared_memory(gl.float32, dq_desc.block_type.shape, dq_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    # The wide kernel's two warpgroups each release a Q / dO buffer and each hand over a dQ^T half.
    COMPUTE_GROUPS: gl.constexpr = 2 if WIDE else 1
    mbarrier.init(kv_bar.index(0), count=1)
    mbarrier.init(dq_full.index(0), count=COMPUTE_GROUPS)
    mbarrier.init(dq_empty.index(0), count=1)
    for b in gl.static_range(NUM_BUF):
        mbarrier.init(ready.index(b), count=1)
        mbarrier.init(free.index(b), count=COMPUTE_GROUPS)
    if WIDE:
        # P^T (P warpgroup -> dS warpgroup) and dS^T (-> both), each double-buffered by step parity.
        p_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M],
                                           gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype))
        p_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        p_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        ds_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for b in gl.static_range(2):
            mbarrier.init(p_full.index(b), count=1)
            mbarrier.init(p_empty.index(b), count=1)
            mbarrier.init(ds_full.index(b), count=1)
            mbarrier.init(ds_empty.index(b), count=2)  # both warpgroups' dQ^T matmuls read it
        fence_async_shared()
        gl.warp_specialize([
            (_bwd_wide_p_partition, (k_smem, q_smem, do_smem, lse2_smem, p_smem, ds_smem, dq_smem, kv_bar, ready,
                                     free, p_full, p_empty, ds_full, ds_empty, dq_full, dq_empty, DV, stride_dvb,
                                     stride_dvn, stride_dvh, n_steps, n_m, m_first, off_b, off_hk, n0, diag,
                                     seqlen_k, qk_scale_log2, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUF, CAUSAL)),
            (_bwd_wide_ds_partition, (k_smem, v_smem, q_smem, do_smem, delta_smem, p_smem, ds_smem, dq_smem, kv_bar,
                                      ready, free, p_full, p_empty, ds_full, ds_empty, dq_full, dq_empty, DK,
                                      stride_dkb, stride_dkn, stride_dkh, n_steps, off_b, off_hk, n0, seqlen_k,
                                      softmax_scale, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUF)),
            (_bwd_load_partition, (q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, k_smem, v_smem, q_smem,
                                   do_smem, lse2_smem, delta_smem, kv_bar, ready, free, n_steps, n_m, m_first, off_b,
                                   off_hk, n0, kv_group, nheads, seqlen_pad, BLOCK_M, NUM_BUF)),
            (_bwd_dq_partition, (dq_desc, dq_smem, dq_full, dq_empty, n_steps, n_m, m_first, off_b, off_hk, kv_group,
                                 nheads, seqlen_pad, BLOCK_M, HEAD_DIM, True)),
        ], [4, 1, 1], [240, 24, 24])
    else:
        fence_async_shared()
        gl.warp_specialize([
            (_bwd_compute_partition, (k_smem, v_smem, q_smem, do_smem, lse2_smem, delta_smem, ds_smem, dq_smem,
                                      kv_bar, ready, free, dq_full, dq_empty, DK, DV, stride_dkb, stride_dkn,
                                      stride_dkh, stride_dvb, stride_dvn, stride_dvh, n_steps, n_m, m_first, off_b,
                                      off_hk, n0, diag, seqlen_k, qk_scale_log2, softmax_scale, HEAD_DIM, BLOCK_M,
                                      BLOCK_N, NUM_BUF, CAUSAL)),
            (_bwd_load_partition, (q_desc, k_desc, v_desc, do_desc, lse2_desc, delta_desc, k_smem, v_smem, q_smem,
                                   do_smem, lse2_smem, delta_smem, kv_bar, ready, free, n_steps, n_m, m_first, off_b,
                                   off_hk, n0, kv_group, nheads, seqlen_pad, BLOCK_M, NUM_BUF)),
            (_bwd_dq_partition, (dq_desc, dq_smem, dq_full, dq_empty, n_steps, n_m, m_first, off_b, off_hk, kv_group,
                                 nheads, seqlen_pad, BLOCK_M, HEAD_DIM, False)),
        ], [1, 1], [24, 24])


_GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


# The descriptors are built per call, so their layouts are computed once per shape and the
# descriptors without the dataclass's checks: with them, 33 us of host time each on the H200's
# host (docs/design/launch-path.md), seven per backward. What the checks
# assert holds by construction: q, k, v, dout and out passed `supports` (16-byte aligned bases
# and strides, a contiguous last dim), the float32 buffers are fresh contiguous allocations, every
# size is >= 1 (the interface rejects empty inputs) and the boxes are powers of two.
# tests/test_attention_sm90.py checks the result equals the checked constructor's.
@functools.lru_cache(maxsize=None)
def _tile_layout(rows: int, head_dim: int, dtype: torch.dtype):
    layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], _GL_DTYPES[dtype])
    return gl.NVMMASharedLayout(layout.swizzle_byte_width, layout.element_bitwidth, rank=4)


@functools.lru_cache(maxsize=None)
def _stat_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)


@functools.lru_cache(maxsize=None)
def _accum_layout(rows: int, head_dim: int):
    return gl.NVMMASharedLayout.get_default_for([rows, head_dim], gl.float32)


# The fields _descriptor fills (triton 3.6); with any other set, the checked constructor.
_UNCHECKED_DESCRIPTORS = descriptors.has_exactly_fields(
    TensorDescriptor, {"base", "shape", "strides", "block_shape", "layout", "padding"})


def _descriptor(t: torch.Tensor, shape: list, strides: list, block_shape: list, layout) -> TensorDescriptor:
    if not _UNCHECKED_DESCRIPTORS:
        return TensorDescriptor(t, shape, strides, block_shape, layout)
    return descriptors.unchecked(TensorDescriptor, base=t, shape=shape, strides=strides, block_shape=block_shape,
                                 layout=layout, padding="zero")


def _tile_descriptor(t: torch.Tensor, rows: int, width: int | None = None) -> TensorDescriptor:
    """A 4-D descriptor over (batch, seqlen, heads, dim), one (1, rows, 1, width) box per tile
    (width: dim by default; a wider box, e.g. dim rounded up to a power of two, reads zeros past
    dim and writes nothing there)."""
    width = width or t.shape[-1]
    return _descriptor(t, list(t.shape), list(t.stride()), [1, rows, 1, width], _tile_layout(rows, width, t.dtype))


def _stat_descriptor(t: torch.Tensor, block_m: int) -> TensorDescriptor:
    return _descriptor(t, [t.numel()], [1], [block_m], _stat_layout())


def _accum_descriptor(t: torch.Tensor, block_m: int, head_dim: int) -> TensorDescriptor:
    """dQ's float32 accumulator as (rows, HEAD_DIM), one (BLOCK_M, HEAD_DIM) box per reduction; the
    wide kernel's, (batch * heads, HEAD_DIM, seqlen_pad), as (channels, seqlen_pad) with a
    (HEAD_DIM, BLOCK_M) box."""
    flat = t.view(-1, t.shape[-1])
    box = [head_dim, block_m] if _dq_transposed(head_dim) else [block_m, head_dim]
    return _descriptor(flat, list(flat.shape), list(flat.stride()), box, _accum_layout(*box))


def supports(q, k, v, dout, out, a: AttentionArgs) -> bool:
    """Whether the kernel computes this backward (dtypes, head dims, features, alignment, batch x
    heads within the grids' second axis), whatever the device; `applies` adds the device and the
    switches."""
    if q.dtype not in _GL_DTYPES or q.shape[-1] not in TILES or v.shape[-1] != q.shape[-1] or q.dim() != 4:
        return False
    if (a.varlen or a.rotary_dim or a.dropout is not None or a.alibi_slopes is not None or a.softcap > 0
            or a.window_left != -1 or a.window_right not in (-1, 0)):
        return False
    if q.shape[0] * q.shape[2] > MAX_GRID_YZ:  # the grids' second axis is (batch, head)
        return False
    return all(aligned(t) for t in (q, k, v, dout, out))


def applies(q, k, v, dout, out, a: AttentionArgs) -> bool:
    """Whether attention_backward takes this kernel: deterministic=False, an sm_90 GPU (wgmma is
    sm_90a's; Blackwell has tcgen05 instead), the tma setting on (TMA is all this kernel loads
    with), at least MIN_SEQLEN (causal: MIN_SEQLEN_CAUSAL) queries or keys, `supports`, and room
    for the float32 dQ accumulator (ACCUM_MAX_FREE_FRACTION)."""
    if a.deterministic or not a.settings.tma or triton_interpreted() or not q.is_cuda:
        return False
    if descriptors.device_capability(q.device) != (9, 0) or not supports(q, k, v, dout, out, a):
        return False
    limits = MIN_SEQLEN_CAUSAL if a.causal_only else MIN_SEQLEN
    if max(q.shape[1], k.shape[1]) < sm90_min_seqlen(limits[q.shape[-1]]):
        return False
    return fits_in_free_memory(accumulator_bytes(q), ACCUM_MAX_FREE_FRACTION, q.device)


def accumulator_bytes(q: torch.Tensor) -> int:
    """What attention_backward_sm90 allocates beyond dq, dk, dv: dQ's float32 accumulator, lse2 and delta."""
    batch, seqlen_q, nheads, head_dim = q.shape
    return batch * nheads * _padded_rows(seqlen_q) * (head_dim + 2) * 4


def _dq_transposed(head_dim: int) -> bool:
    """Whether the kernel at this head dim sums dQ^T (the wide kernel) rather than dQ."""
    return head_dim > 128


def _padded_rows(seqlen_q: int) -> int:
    """Rows per head of lse2, delta and the dQ accumulator: seqlen_q rounded up to STAT_PAD."""
    return cdiv(seqlen_q, STAT_PAD) * STAT_PAD


def attention_backward_sm90(dout, q, k, v, out, lse, a: AttentionArgs):
    """(dq, dk, dv) by the one-pass Gluon kernel, in the dtypes and layouts of q, k, v; the caller
    has checked `applies`."""
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    block_m, block_n = TILES[head_dim]
    seqlen_pad = _padded_rows(seqlen_q)
    delta = torch.empty((batch * nheads, seqlen_pad), device=q.device, dtype=torch.float32)
    lse2 = torch.empty_like(delta)
    dq_t = _dq_transposed(head_dim)
    accum_shape = (batch * nheads, head_dim, seqlen_pad) if dq_t else (batch * nheads, seqlen_pad, head_dim)
    dq_accum = torch.empty(accum_shape, device=q.device, dtype=torch.float32)
    light = 64  # rows per program of the two light passes
    # All three through launch(): after the first call of a shape its fast path calls the compiled
    # kernels directly (triton's binding took ~100 us of host time per launch on the H200's host).
    launch(_bwd_sm90_prologue_kernel, (seqlen_pad // light, batch * nheads), LIGHT_PASS,
           out, dout, lse, delta, lse2, dq_accum, out.stride(0), out.stride(1), out.stride(2), dout.stride(0),
           dout.stride(1), dout.stride(2), lse.stride(0), lse.stride(1), nheads, seqlen_q, seqlen_pad,
           HEAD_DIM=head_dim, BLOCK=light, DQ_T=dq_t)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    launch(_attn_bwd_sm90_kernel, (cdiv(seqlen_k, block_n), batch * nheads_k), _MAIN_TILES[head_dim],
           _tile_descriptor(q, block_m), _tile_descriptor(k, block_n), _tile_descriptor(v, block_n),
           _tile_descriptor(dout, block_m), _stat_descriptor(lse2, block_m), _stat_descriptor(delta, block_m),
           _accum_descriptor(dq_accum, block_m, head_dim), dk, dv, *dk.stride()[:3], *dv.stride()[:3],
           nheads, nheads_k, seqlen_q, seqlen_k, seqlen_pad, a.softmax_scale * LOG2E_HOST, a.softmax_scale,
           HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, NUM_BUF=NUM_BUF, CAUSAL=a.causal_only)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    launch(_bwd_sm90_dq_kernel, (seqlen_pad // light, batch * nheads), LIGHT_PASS,
           dq_accum, dq, dq.stride(0), dq.stride(1), dq.stride(2), nheads, seqlen_q, seqlen_pad, a.softmax_scale,
           HEAD_DIM=head_dim, BLOCK=light, DQ_T=dq_t)
    return dq, dk, dv
