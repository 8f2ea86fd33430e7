"""The forward for Hopper, in Gluon: warp-specialised, with the next tile's QK^T under this tile's softmax.

The triton forward (forward.py) leaves the schedule to the compiler, which waits for each matmul
before it starts the softmax work that follows it and loads K and V with the same warps that
compute. This kernel says what overlaps (docs/design/attention-forward-sm90.md):

- 1 load warp (24 registers): Q once, then K and V tile by tile by TMA into a ring of NUM_STAGES
  buffers, each K and V with a barrier of its own (`k_ready`, `v_ready`), refilled once the compute
  warps release it (`k_empty`, `v_empty`: K once S is computed, V once P V is);
- 2 compute warpgroups (4 warps each, 64 query rows each, 240 registers a thread), or 3 (160
  registers) where the head dims pad to 64 (`tiles`), each a partition of its own; per key tile j,

      wait for this warpgroup's turn
      issue S_j = Q K_j^T             (async wgmma)
      issue O += P_{j-1} V_{j-1}      (async wgmma, P from registers)
      pass the turn to the other warpgroup
      wait S_j; release K_j; softmax of S_j   (runs while the tensor cores do P_{j-1} V_{j-1})
      wait O; release V_{j-1}; O *= alpha_j

  so the exponentials of one tile run under the previous tile's PV matmul and under the other
  warpgroups' matmuls (ping-pong, round robin with three: the turns keep them from issuing at once).

One program owns BLOCK_M query rows of one head; the grid runs the row blocks heaviest-first
(causal row blocks near the bottom see the most keys). Keys are read for the band the rows can
see ([n_lo, n_hi)): tiles outside a causal or windowed band are never loaded.
Tiles that cross a mask edge or the end of the keys are masked; the others are not.

Head dims are padded to a power of two inside the kernel (the TMA boxes are that wide: they read
zeros past the head dim and write nothing there), so any D and Dv up to 256 whose rows are 16-byte
aligned run here, Dv != D included. Softcap and ALiBi are applied to the scores as forward.py
applies them (score_mods.py).

Packed sequences (varlen) read their rows and keys from the packed tensors at cu_seqlens: a box
that runs past a sequence's end reads the next sequence's rows, which the masks drop (keys) or
nothing stores (queries: a packed batch stores O from registers, masked, where a TMA box would
overwrite the next sequence's rows).

Taken where it applies (`applies`): sm_90, 16-bit, no RoPE or dropout, TMA-aligned tensors, and
configs.sm90_forward_allowed: by default for fixed-length batches at the head dims where it beat
the triton forward (the wider one in (32, 128], or 256; the design note's "Measurements" and
"Three warpgroups at head dim 64"), and for packed ones where override_configs(sm90_forward=True)
asks (their speed is not measured yet). Everything else runs forward.py. Not under the Triton
interpreter (it has no Gluon): CPU tests check the dispatch rule and compile the kernel for sm_90
(tests/ops/attention/test_sm90_compile.py); the GPU tests run it.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ...backends import triton_interpreted
from ..common.host import MAX_GRID_YZ, cdiv, next_power_of_2
from . import descriptors
from .args import AttentionArgs
from .backward_sm90 import _GL_DTYPES, _tile_descriptor
from .configs import LaunchConfig, sm90_forward_allowed
from .descriptors import aligned
from .kernel_args import alibi_pointer, lse_layout
from .launch import launch
from .softmax import LN2, LOG2E_HOST  # LN2: lse from base 2 to natural log

ROWS = 64  # query rows per compute warpgroup (wgmma's rows per warpgroup)
# Of the 227 KB an sm_90 block may take: 2 K/V stages at head dim 128 (a third, at 226 KB, was
# 1-2% slower on the H100: the design note's "Measurements"), 3 at 64.
SMEM_BYTES = 220 * 1024
MAX_STAGES = 3
# The default partition's warps: the first compute warpgroup (the second and the load warp come
# from warp_specialize).
LAUNCH = LaunchConfig(num_warps=4, num_stages=1)


def tiles(block_d: int, block_dv: int) -> tuple[int, int, int]:
    """(query rows, keys per tile, K/V stages in the ring) for padded head dims. Rows: three compute
    warpgroups (192 rows) at 64 channels, where the softmax sets the pace and each warpgroup's
    exponentials then run under two others' matmuls (1.06-1.16x two at head dim 64 on the H100; at 32,
    0.55x: docs/design/attention-forward-sm90.md, "Three warpgroups at head dim 64"); else two (128).
    Keys: 128 where the output accumulator leaves registers for a 128-wide S (64 x Dv float32 per
    warpgroup, 64 x BLOCK_N for S), else 64. Then as many stages as shared memory holds beside Q (and
    O's own buffer where its box differs from Q's)."""
    block_m = 3 * ROWS if max(block_d, block_dv) == 64 else 2 * ROWS
    block_n = 128 if max(block_d, block_dv) <= 128 else 64
    fixed = block_m * block_d * 2 + (block_m * block_dv * 2 if block_dv != block_d else 0)
    stages = min(MAX_STAGES, (SMEM_BYTES - fixed) // (block_n * (block_d + block_dv) * 2))
    return block_m, block_n, stages


@gluon.jit
def _fwd_load_partition(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty,
                        v_empty, tma_b, off_h, off_hk, q_row, k_row, n_tiles, ROWS: gl.constexpr,
                        NUM_Q: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    """One warp: each compute partition's Q rows (from row q_row of batch slice tma_b), then each
    key tile's K and V (from row k_row), each into its ring's stage once the compute warps released
    it. K_j's stage frees when S_{j - NUM_STAGES} has landed, V_j's when P V of that tile has, about
    one tile later: with K freed on its own, K runs a tile further ahead than it would if both
    waited for P V."""
    for w in gl.static_range(NUM_Q):
        mbarrier.expect(q_bar.index(w), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [tma_b, q_row + w * ROWS, off_h, 0], q_bar.index(w), q_smem.index(w))
    for j in range(n_tiles):
        stage = j % NUM_STAGES
        # A fresh barrier passes a wait for parity 1: the first round finds every stage free.
        free_parity = ((j // NUM_STAGES) & 1) ^ 1
        n0 = k_row + j * BLOCK_N
        mbarrier.wait(k_empty.index(stage), free_parity)
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [tma_b, n0, off_hk, 0], k_ready.index(stage), k_smem.index(stage))
        mbarrier.wait(v_empty.index(stage), free_parity)
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [tma_b, n0, off_hk, 0], v_ready.index(stage), v_smem.index(stage))


# Named barriers 8.. pass the turns (ids below 8 are left to the compiler's own barriers). Passing
# them through shared-memory barriers instead cost 1-16% of the forward on the H200 (a
# warpgroup-wide bar.sync before each arrive, and a spin on the wait: the design note's "Turns by
# named barriers").
TURN_BARRIER = gl.constexpr(8)


@gluon.jit
def _named_barrier(op: gl.constexpr, bar_id):
    """`bar.sync` or `bar.arrive` on named barrier `bar_id` for 256 threads (two warpgroups: one
    arrives, the other waits), executed once by each thread of the calling warpgroup."""
    one_per_thread: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    ids = gl.full([128], bar_id, gl.int32, one_per_thread)
    gl.inline_asm_elementwise(op + " $1, 256; mov.u32 $0, 0;", "=r,r", [ids], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def _await_turn(WG: gl.constexpr):
    """Ping-pong (round robin over the compute warpgroups): warpgroup WG may issue its next round of
    matmuls once the one before it (WG 0: the last one) has issued its own. The bar.sync here meets
    that warpgroup's bar.arrive (`_pass_turn`) in hardware: no spin on a shared-memory barrier."""
    _named_barrier("bar.sync", TURN_BARRIER + WG)


@gluon.jit
def _pass_turn(WG: gl.constexpr, NUM_Q: gl.constexpr):
    _named_barrier("bar.arrive", TURN_BARRIER + (WG + 1) % NUM_Q)


@gluon.jit
def _scores(s, n0, m0, seqlen_q, seqlen_k, diag, window_left, window_right, softcap_in, softcap_out, slope,
            s_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, MASKED: gl.constexpr,
            HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr):
    """Raw scores of one tile as forward.py's: softcap, then ALiBi, then (MASKED) keys past the end
    or outside a row's band set to -inf. Query i sees key j iff
    i + diag - window_left <= j <= i + diag + window_right (bottom-right aligned, flash-attn's)."""
    if HAS_SOFTCAP:  # s -> (c / scale) tanh(s scale / c), raw units (score_mods.py)
        s = _tanh_fast(s * softcap_in) * softcap_out
    if HAS_ALIBI or MASKED:
        cols = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        if HAS_ALIBI:  # -(slope / scale) |i + diag - j|
            s = s - slope[:, None] * gl.abs(rows[:, None] + diag - cols[None, :]).to(gl.float32)
        if MASKED:
            keep = (cols < seqlen_k)[None, :]
            if HAS_RIGHT:
                keep = keep & (cols[None, :] <= rows[:, None] + diag + window_right)
            if HAS_LEFT:
                keep = keep & (cols[None, :] >= rows[:, None] + diag - window_left)
            s = gl.where(keep, s, float("-inf"))
    return s


@gluon.jit
def _tanh_fast(x):
    """One MUFU instruction, max relative error ~2^-11: below 16-bit rounding of the scores it
    feeds (score_mods._tanh's fast form)."""
    return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True,
                                     pack=1)


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale_log2):
    """The online softmax's fold of one tile of raw scores (softmax.py's, in Gluon): returns
    (p, alpha, m_new, l_new). A row that has seen only masked keys keeps max -inf; 0 stands in
    for it so that its p are exp2(-inf) = 0 and not NaN."""
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale_log2)
    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale_log2 - m_ref[:, None])
    alpha = gl.exp2(m_i - m_ref)
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _fwd_compute_partition(shared, WG: gl.constexpr, NUM_Q: gl.constexpr, ROWS: gl.constexpr,
                           BLOCK_D: gl.constexpr, BLOCK_DV: gl.constexpr,
                           BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, HAS_LEFT: gl.constexpr,
                           HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr,
                           IS_VARLEN: gl.constexpr):
    """One compute warpgroup (4 warps), which owns the ROWS query rows from m0 + WG * ROWS and takes
    turns with the others to issue its matmuls. See the module docstring for the step. `shared`: what
    every compute partition takes alike (buffers, barriers, descriptors, the program's coordinates)."""
    (q_smem, k_smem, v_smem, o_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_desc, LSE, ALIBI,
     stride_lse_b, stride_lse_h, stride_alibi_b, off_b, off_h, m0, n_lo, n_tiles, seqlen_q, seqlen_k, diag,
     window_left, window_right, qk_scale_log2, softcap_in, softcap_out, alibi_to_raw, q_start, O,
     stride_o_row, stride_o_h, head_dim_v) = shared
    dtype: gl.constexpr = q_smem.dtype
    BLOCK_M: gl.constexpr = ROWS  # this partition's rows
    m0 = m0 + WG * ROWS
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_DV, 16])
    # P as the left operand of O += P V from registers: S's accumulator fragment is already the
    # operand's, so the conversion moves no data.
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_tile = q_smem.index(WG).reshape([BLOCK_M, BLOCK_D])
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([BLOCK_M, BLOCK_DV], gl.float32, o_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    rows = m0 + gl.arange(0, BLOCK_M, layout=row_s)
    slope = gl.zeros([BLOCK_M], gl.float32, row_s)
    if HAS_ALIBI:  # one slope per head (or per batch and head), in raw score units
        slope = slope + gl.load(ALIBI + off_b * stride_alibi_b + off_h) * alibi_to_raw
    # The tiles that need a mask: those crossing the end of the keys or an edge of some row's band.
    # Tiles between are seen whole by every row of the block.
    full_lo = n_lo
    full_hi = seqlen_k
    if HAS_LEFT:  # keys every row sees from: the last row's left edge
        full_lo = gl.maximum(full_lo, m0 + BLOCK_M - 1 + diag - window_left)
    if HAS_RIGHT:  # ... up to the first row's right edge
        full_hi = gl.minimum(full_hi, m0 + diag + window_right + 1)
    if WG == NUM_Q - 1:  # the last warpgroup's turn passes to warpgroup 0 before the first round
        _pass_turn(WG, NUM_Q)
    mbarrier.wait(q_bar.index(WG), 0)

    if n_tiles > 0:
        # Tile 0: S_0 and its softmax; P_0 V_0 is issued in the next step (or after the loop).
        mbarrier.wait(k_ready.index(0), 0)
        _await_turn(WG)
        s_tok = warpgroup_mma(q_tile, k_smem.index(0).reshape([BLOCK_N, BLOCK_D]).permute((1, 0)), s_zero,
                              use_acc=False, is_async=True)
        _pass_turn(WG, NUM_Q)
        s = warpgroup_mma_wait(0, deps=[s_tok])
        mbarrier.arrive(k_empty.index(0))  # K_0 is read
        if (n_lo < full_lo) | (n_lo + BLOCK_N > full_hi):
            s = _scores(s, n_lo, m0, seqlen_q, seqlen_k, diag, window_left, window_right, softcap_in, softcap_out,
                        slope, s_layout, BLOCK_M, BLOCK_N, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI)
        else:
            s = _scores(s, n_lo, m0, seqlen_q, seqlen_k, diag, window_left, window_right, softcap_in, softcap_out,
                        slope, s_layout, BLOCK_M, BLOCK_N, False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale_log2)
        for j in range(1, n_tiles):
            stage = j % NUM_STAGES
            prev = (j - 1) % NUM_STAGES
            n0 = n_lo + j * BLOCK_N
            mbarrier.wait(k_ready.index(stage), (j // NUM_STAGES) & 1)
            mbarrier.wait(v_ready.index(prev), ((j - 1) // NUM_STAGES) & 1)
            p16 = gl.convert_layout(p.to(dtype), p_layout)
            _await_turn(WG)
            s_tok = warpgroup_mma(q_tile, k_smem.index(stage).reshape([BLOCK_N, BLOCK_D]).permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)
            o_tok = warpgroup_mma(p16, v_smem.index(prev).reshape([BLOCK_N, BLOCK_DV]), acc, is_async=True)
            _pass_turn(WG, NUM_Q)
            # wgmma groups complete in order: the one left outstanding is O's, so S_j has landed.
            s = warpgroup_mma_wait(1, deps=[s_tok])
            mbarrier.arrive(k_empty.index(stage))  # K_j is read; V_{j-1}'s P V may still run
            if (n0 < full_lo) | (n0 + BLOCK_N > full_hi):
                s = _scores(s, n0, m0, seqlen_q, seqlen_k, diag, window_left, window_right, softcap_in,
                            softcap_out, slope, s_layout, BLOCK_M, BLOCK_N, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                            HAS_ALIBI)
            else:
                s = _scores(s, n0, m0, seqlen_q, seqlen_k, diag, window_left, window_right, softcap_in,
                            softcap_out, slope, s_layout, BLOCK_M, BLOCK_N, False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                            HAS_ALIBI)
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale_log2)
            acc = warpgroup_mma_wait(0, deps=[o_tok])
            mbarrier.arrive(v_empty.index(prev))  # V_{j-1} is read
            # acc holds the tiles before j relative to the old max; alpha moves it to the new one.
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        last = (n_tiles - 1) % NUM_STAGES
        mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // NUM_STAGES) & 1)
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        _await_turn(WG)
        o_tok = warpgroup_mma(p16, v_smem.index(last).reshape([BLOCK_N, BLOCK_DV]), acc, is_async=True)
        _pass_turn(WG, NUM_Q)
        acc = warpgroup_mma_wait(0, deps=[o_tok])
        mbarrier.arrive(v_empty.index(last))

    # A row that saw no key (l == 0) gets output 0 and lse -inf, never NaN.
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    out = acc / gl.convert_layout(l_safe, row_o)[:, None]
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
    # (varlen: stride_lse_b is 0 and the LSE is (nheads, total_q), this sequence's rows from q_start)
    gl.store(LSE + off_b.to(gl.int64) * stride_lse_b + off_h * stride_lse_h + q_start + rows, lse,
             mask=rows < seqlen_q)
    if IS_VARLEN:
        # The rows after a sequence's last are the next sequence's, which a TMA box would
        # overwrite: packed sequences store their rows from registers, masked.
        cols = gl.arange(0, BLOCK_DV, layout=gl.SliceLayout(0, o_layout))
        rows_o = m0 + gl.arange(0, BLOCK_M, layout=row_o)
        o_ptrs = (O + (q_start + rows_o).to(gl.int64)[:, None] * stride_o_row + off_h * stride_o_h
                  + cols[None, :])
        gl.store(o_ptrs, out.to(dtype), mask=(rows_o < seqlen_q)[:, None] & (cols < head_dim_v)[None, :])
    else:
        # O leaves by TMA (rows past seqlen_q and channels past Dv fall outside the descriptor's
        # bounds and are not written), through Q's buffer where the boxes match: every matmul that
        # read Q has completed.
        o_buf = o_smem.index(WG)
        o_buf.reshape([BLOCK_M, BLOCK_DV]).store(out.to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(o_desc, [off_b, m0, off_h, 0], o_buf)
        tma.store_wait(0)


@gluon.jit
def _attn_fwd_sm90_kernel(q_desc, k_desc, v_desc, o_desc, O, LSE, ALIBI, CU_SEQLENS_Q, CU_SEQLENS_K,
                          stride_o_row, stride_o_h, stride_lse_b, stride_lse_h, stride_alibi_b,
                          nheads, nheads_k, seqlen_q, seqlen_k, head_dim_v, num_m_blocks, window_left, window_right,
                          qk_scale_log2, softcap_in, softcap_out, alibi_to_raw,
                          BLOCK_D: gl.constexpr, BLOCK_DV: gl.constexpr, BLOCK_M: gl.constexpr,
                          ROWS: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                          HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
                          HAS_ALIBI: gl.constexpr, IS_VARLEN: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    # Compute warpgroups of ROWS rows each (2 or 3, `tiles`); q_desc's and o_desc's boxes are one's rows.
    NUM_Q: gl.constexpr = BLOCK_M // ROWS
    # Heaviest row blocks first: with a causal or right-bounded band the last rows see the most
    # keys, and a short one left for the end fills the tail of the grid.
    pid_m = num_m_blocks - 1 - gl.program_id(0)
    pid_bh = gl.program_id(1)
    off_b = pid_bh // nheads
    off_h = pid_bh % nheads
    off_hk = off_h // (nheads // nheads_k)
    m0 = pid_m * BLOCK_M
    # Where this sequence's rows are in the descriptors' (batch, seqlen) coordinates: its own batch
    # slice, or (varlen) rows [cu_seqlens[b], cu_seqlens[b + 1]) of a packed batch of one.
    tma_b = off_b
    q_start = 0
    k_start = 0
    if IS_VARLEN:
        tma_b = 0
        q_start = gl.load(CU_SEQLENS_Q + off_b)
        seqlen_q = gl.load(CU_SEQLENS_Q + off_b + 1) - q_start
        k_start = gl.load(CU_SEQLENS_K + off_b)
        seqlen_k = gl.load(CU_SEQLENS_K + off_b + 1) - k_start
        if m0 >= seqlen_q:  # the grid is sized for the longest sequence
            return
    diag = seqlen_k - seqlen_q
    # The keys some row of the block sees, [n_lo, n_hi), from whole tiles starting at n_lo.
    n_lo = 0
    n_hi = seqlen_k
    if HAS_LEFT:
        n_lo = gl.maximum(m0 + diag - window_left, 0) // BLOCK_N * BLOCK_N
    if HAS_RIGHT:
        n_hi = gl.minimum(m0 + BLOCK_M - 1 + diag + window_right + 1, seqlen_k)
    n_tiles = gl.maximum(gl.cdiv(n_hi - n_lo, BLOCK_N), 0)

    q_smem = gl.allocate_shared_memory(dtype, [NUM_Q] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + v_desc.block_type.shape, v_desc.layout)
    if BLOCK_DV == BLOCK_D:
        o_smem = q_smem
    else:
        o_smem = gl.allocate_shared_memory(dtype, [NUM_Q] + o_desc.block_type.shape, o_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [NUM_Q, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for w in gl.static_range(NUM_Q):
        mbarrier.init(q_bar.index(w), count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        # Every compute partition releases each stage.
        mbarrier.init(k_empty.index(i), count=NUM_Q)
        mbarrier.init(v_empty.index(i), count=NUM_Q)
    fence_async_shared()
    # What every compute partition takes alike (a tuple of runtime values; the constexprs are passed
    # apart, since a tuple would turn them into tensors).
    shared = (q_smem, k_smem, v_smem, o_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_desc, LSE, ALIBI,
              stride_lse_b, stride_lse_h, stride_alibi_b, off_b, off_h, m0, n_lo, n_tiles, seqlen_q, seqlen_k, diag,
              window_left, window_right, qk_scale_log2, softcap_in, softcap_out, alibi_to_raw, q_start, O,
              stride_o_row, stride_o_h, head_dim_v)
    # Registers (65,536 a block): 240 for each of two compute warpgroups, 160 for each of three; the
    # load warp's warpgroup gives its own back (24 or 32). The two lists are spelled out: Gluon
    # (triton 3.6) cannot bind a (partition, arguments) pair to a variable to share between them.
    if NUM_Q == 2:
        gl.warp_specialize([
            (_fwd_compute_partition, (shared, 0, NUM_Q, ROWS, BLOCK_D, BLOCK_DV, BLOCK_N, NUM_STAGES, HAS_LEFT,
                                      HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, IS_VARLEN)),
            (_fwd_compute_partition, (shared, 1, NUM_Q, ROWS, BLOCK_D, BLOCK_DV, BLOCK_N, NUM_STAGES, HAS_LEFT,
                                      HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, IS_VARLEN)),
            (_fwd_load_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty,
                                   v_empty, tma_b, off_h, off_hk, q_start + m0, k_start + n_lo, n_tiles, ROWS,
                                   NUM_Q, BLOCK_N, NUM_STAGES)),
        ], [4, 1], [240, 24])
    else:
        gl.warp_specialize([
            (_fwd_compute_partition, (shared, 0, NUM_Q, ROWS, BLOCK_D, BLOCK_DV, BLOCK_N, NUM_STAGES, HAS_LEFT,
                                      HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, IS_VARLEN)),
            (_fwd_compute_partition, (shared, 1, NUM_Q, ROWS, BLOCK_D, BLOCK_DV, BLOCK_N, NUM_STAGES, HAS_LEFT,
                                      HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, IS_VARLEN)),
            (_fwd_compute_partition, (shared, 2, NUM_Q, ROWS, BLOCK_D, BLOCK_DV, BLOCK_N, NUM_STAGES, HAS_LEFT,
                                      HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, IS_VARLEN)),
            (_fwd_load_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty,
                                   v_empty, tma_b, off_h, off_hk, q_start + m0, k_start + n_lo, n_tiles, ROWS,
                                   NUM_Q, BLOCK_N, NUM_STAGES)),
        ], [4, 4, 1], [160, 160, 32])


def padded(head_dim: int) -> int:
    """A head dim's width inside the kernel: the next power of two, at least 16 (wgmma's K step)."""
    return max(16, next_power_of_2(head_dim))


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: AttentionArgs) -> bool:
    """Whether the kernel computes this forward (dtypes, head dims, features, alignment, batch x heads
    within the grid's second axis), whatever the device; `applies` adds the device and the switches."""
    if q.dtype not in _GL_DTYPES or max(q.shape[-1], v.shape[-1]) > 256:
        return False
    if a.rotary_dim or a.dropout is not None or q.dim() != (3 if a.varlen else 4):
        return False
    batch = a.cu_seqlens_q.numel() - 1 if a.varlen else q.shape[0]
    if batch * q.shape[-2] > MAX_GRID_YZ:  # the grid's second axis is (batch, head)
        return False
    return all(aligned(t) for t in (q, k, v))


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: AttentionArgs) -> bool:
    """Whether attention_forward takes this kernel: an sm_90 GPU (wgmma is sm_90a's), the tma
    setting on (TMA is all this kernel loads with), configs.sm90_forward_allowed, and `supports`."""
    if not a.settings.tma or triton_interpreted() or not q.is_cuda:
        return False
    if not sm90_forward_allowed(q.shape[-1], v.shape[-1], a.varlen):
        return False
    return descriptors.device_capability(q.device) == (9, 0) and supports(q, k, v, a)


def attention_forward_sm90(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: AttentionArgs):
    """(out, lse) by the Gluon kernel; the caller has checked `applies`. q (B, Nq, H, D) and k/v
    (B, Nk, Hk, D or Dv), or packed (total, H, D) with a.cu_seqlens_* (then the descriptors see one
    batch slice of `total` rows, and lse is (H, total_q) as flash-attn's)."""
    nheads, head_dim = q.shape[-2:]
    nheads_k, head_dim_v = k.shape[-2], v.shape[-1]
    out = torch.empty((*q.shape[:-1], head_dim_v), device=q.device, dtype=q.dtype)
    if a.varlen:
        batch, seqlen_q, seqlen_k = a.cu_seqlens_q.numel() - 1, a.max_seqlen_q, a.max_seqlen_k
        q4, k4, v4, out4 = (t.unsqueeze(0) for t in (q, k, v, out))
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        q4, k4, v4, out4 = q, k, v, out
    block_d, block_dv = padded(head_dim), padded(head_dim_v)
    block_m, block_n, stages = tiles(block_d, block_dv)
    lse, stride_lse_b, stride_lse_h = lse_layout(batch, nheads, seqlen_q, q.shape[0], a.varlen, q.device)
    alibi, stride_alibi_b = alibi_pointer(q, a)
    scale = a.softmax_scale
    num_m_blocks = cdiv(seqlen_q, block_m)
    if num_m_blocks * batch * nheads == 0:  # no rows: nothing to launch
        return out, lse
    cu_q = a.cu_seqlens_q if a.varlen else lse  # (never read without varlen)
    cu_k = a.cu_seqlens_k if a.varlen else lse
    launch(_attn_fwd_sm90_kernel, (num_m_blocks, batch * nheads), LAUNCH,
           _tile_descriptor(q4, ROWS, block_d), _tile_descriptor(k4, block_n, block_d),  # Q and O: one warpgroup's rows
           _tile_descriptor(v4, block_n, block_dv), _tile_descriptor(out4, ROWS, block_dv), out, lse, alibi, cu_q, cu_k,
           out4.stride(1), out4.stride(2), stride_lse_b, stride_lse_h, stride_alibi_b, nheads, nheads_k, seqlen_q,
           seqlen_k, head_dim_v, num_m_blocks,
           a.window_left, a.window_right, scale * LOG2E_HOST, scale / a.softcap if a.softcap > 0 else 0.0,
           a.softcap / scale if a.softcap > 0 else 0.0, 1.0 / scale,
           BLOCK_D=block_d, BLOCK_DV=block_dv, BLOCK_M=block_m, ROWS=ROWS, BLOCK_N=block_n, NUM_STAGES=stages,
           HAS_LEFT=a.window_left >= 0, HAS_RIGHT=a.window_right >= 0, HAS_SOFTCAP=a.softcap > 0,
           HAS_ALIBI=a.alibi_slopes is not None, IS_VARLEN=a.varlen)
    return out, lse
