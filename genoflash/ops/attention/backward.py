"""FlashAttention backward in Triton: recompute P tile by tile, never store it.

Two launches, neither of which holds a seqlen_q x seqlen_k tensor:
1. dQ: each program owns one query tile and streams the key tiles it sees. Before its loop it
   also writes delta_i = rowsum(dO_i * O_i), one fp32 per query row of its tile, which pass 2
   reads (no light pass of its own: one launch fewer per backward);
2. dK/dV: each program owns one key tile of one K/V head and streams the query tiles
   (of every query head in its GQA group) that see it.

Every output element is written by exactly one program, with no atomics, so the
backward is bit-for-bit deterministic. The price is recomputing P in both passes. On Hopper,
deterministic=False takes the one-pass Gluon backward instead where it applies
(backward_sm90.py); docs/design/attention-backward.md says why the passes are built this way.

With s = q.k, P = exp(score(s) - lse) where score = scale*s (softcapped, plus ALiBi),
dP = dO.V^T and dS = P * (dP - delta) the gradient w.r.t. the score:
    dV = P^T dO,   dQ = scale * (dS * score') K,   dK = scale * (dS * score')^T Q,
with score' = 1 - tanh^2 under softcap and 1 otherwise.
"""

from __future__ import annotations

import warnings

import torch
import triton
import triton.language as tl

from ..common.host import cdiv
from . import plans
from .args import AttentionArgs
from .block_info import _kv_block_range, _q_block_range
from .channel_groups import (_load_pt_tma, _load_qk, _load_qk_tma, _qk_dot, _qk_grad_update,
                             _store_qk_grad)
from .configs import backward_config, dkdv_group_split, small_buffer, value_blocks
from .descriptors import key_descriptors, rope_tma_applies, tile_descriptor, tma_applies
from .dropout import DROPOUT_RUNTIME_ARGS
from .kernel_args import alibi_pointer, feature_args, kernel_geometry, qk_blocks, seq_strides
from .launch import launch, not_replayable
from .mask import _dropout_keep, _mask_tile_scores
from .score_mods import _alibi_bias, _softcap
from .seqlen_info import _sequence_bounds
from .softmax import _lse_for_recompute, _rowsum_o_do
from .tile_scheduler import _tile_of_program
from .tiles import _head_base, _load_tile, _load_tile_tma, _load_tile_tma_at, _row_ptr, _store_tile

try:  # Gluon's Hopper API (triton's experimental dialect) moves between releases
    from . import backward_sm90
    UNAVAILABLE = ""
except (ImportError, AttributeError) as error:  # pragma: no cover - depends on the installed triton
    backward_sm90 = None
    UNAVAILABLE = (f"genoflash's one-pass Hopper backward needs triton's Gluon Hopper API, which this triton "
                   f"({triton.__version__}) lacks ({error}); the two-pass backward runs instead (correct, "
                   f"slower). triton 3.6 has it.")
_told = False


def _say_once_why_hopper_runs_two_passes(device) -> None:
    """A warning, once per process, where the Gluon backward would have run but cannot be imported."""
    global _told
    if not _told and torch.cuda.get_device_capability(device) == (9, 0):
        _told = True
        warnings.warn(UNAVAILABLE, RuntimeWarning, stacklevel=3)


@triton.jit
def _attn_bwd_dkdv_tiles(dka, dkb, dkp, dkt, dv, dvt, ka, kb, kp, kt, v, vt, q_base, do_base, lse_base, delta_base,
                         stride_qm, stride_dom, q_desc, qt_desc, off_b, off_h, start_n, lo, mid_lo, mid_hi, hi,
                         seqlen_q, seqlen_k, window_left, window_right, qk_scale_log2,
                         softcap_in, softcap_out, slope_raw, COS, SIN, stride_rot, bh, dropout_seed,
                         dropout_offset, dropout_threshold, dropout_rescale,
                         HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
                         BLOCK_T: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
                         BLOCK_DVT: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                         HAS_ALIBI: tl.constexpr, FAST_TANH: tl.constexpr, ROTARY_DIM: tl.constexpr,
                         ROTARY_INTERLEAVED: tl.constexpr, HAS_DROPOUT: tl.constexpr, MASKED: tl.constexpr,
                         EDGES_ONLY: tl.constexpr, INPUT_PRECISION: tl.constexpr, TMA: tl.constexpr):
    """Accumulate one key tile's dK (unscaled, rotated frame, as groups a/b/p) and dV over
    query rows [lo, hi) of one head. MASKED masks the scores of every query tile; with
    EDGES_ONLY as well, only those outside [mid_lo, mid_hi), which straddle a mask boundary.

    Works in the transposed frame (keys down, queries across) so that dK and dV come out
    of the dots in the layout they are stored in. Rows past seqlen_q read as q = dO = 0
    with lse = +inf, so their P is exactly 0 and they need no score mask. With BLOCK_DVT > 0
    (configs.value_blocks) V, dO and dV are two channel groups each (vt, the dO tail, dvt), as
    in the forward; otherwise vt and dvt are placeholders nothing touches.
    """
    offs_m = tl.arange(0, BLOCK_M)
    cols = (start_n + tl.arange(0, BLOCK_N))[:, None]
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_dvt = tl.arange(0, BLOCK_DVT if BLOCK_DVT > 0 else 16)
    DV_MAIN: tl.constexpr = BLOCK_DV if BLOCK_DVT > 0 else HEAD_DIM_V  # channels of the first group
    for start_m in range(lo, hi, BLOCK_M):
        rows = (start_m + offs_m)[None, :]
        # dO always by pointers: by TMA as well, this kernel (at 255 registers) spilled or
        # crashed ptxas (docs/design/attention-backward.md).
        if TMA:  # no RoPE (host check): Q is the groups p (and t); rows past the end read as 0
            qp, qt = _load_pt_tma(q_desc, qt_desc, off_b, start_m, off_h, 0, BLOCK_P, BLOCK_T, BLOCK_M)
            qa = qp  # never read without RoPE
            qb = qp
        else:
            qa, qb, qp, qt = _load_qk(_row_ptr(q_base, start_m, stride_qm), offs_m, seqlen_q - start_m, stride_qm,
                                      start_m + offs_m + (seqlen_k - seqlen_q), COS, SIN, stride_rot, HEAD_DIM,
                                      ROTARY_DIM, BLOCK_R, BLOCK_P, BLOCK_T, ROTARY_INTERLEAVED, BLOCK_M, True)
        do_row = _row_ptr(do_base, start_m, stride_dom)
        do = _load_tile(do_row, offs_m, seqlen_q - start_m, stride_dom, offs_dv, DV_MAIN, BLOCK_DV, True)
        if BLOCK_DVT > 0:
            do_t = _load_tile(do_row + BLOCK_DV, offs_m, seqlen_q - start_m, stride_dom, offs_dvt,
                              HEAD_DIM_V - BLOCK_DV, BLOCK_DVT, True)
        in_rows = offs_m < seqlen_q - start_m
        lse2 = _lse_for_recompute(tl.load(_row_ptr(lse_base, start_m, 1) + offs_m, mask=in_rows,
                                          other=float("-inf")))
        delta = tl.load(_row_ptr(delta_base, start_m, 1) + offs_m, mask=in_rows, other=0.0)
        sT = _qk_dot(ka, kb, kp, kt, qa, qb, qp, qt, HEAD_DIM, ROTARY_DIM, BLOCK_T, INPUT_PRECISION)
        if HAS_DROPOUT:  # the forward's mask, regenerated, drawn while the tensor cores compute sT
            keepT = tl.trans(_dropout_keep(dropout_seed, dropout_offset, bh, start_m + offs_m, start_n,
                                           dropout_threshold, BLOCK_M, BLOCK_N))
        if HAS_SOFTCAP:
            sT, tanhT = _softcap(sT, softcap_in, softcap_out, FAST_TANH)
        if HAS_ALIBI:
            sT += _alibi_bias(rows, cols, seqlen_q, seqlen_k, slope_raw)
        if MASKED:
            sT = _mask_tile_scores(sT, rows, cols, start_m, mid_lo, mid_hi, seqlen_q, seqlen_k, window_left,
                                   window_right, HAS_LEFT, HAS_RIGHT, EDGES_ONLY)
        pT = tl.math.exp2(sT * qk_scale_log2 - lse2[None, :])
        dpT = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
        if BLOCK_DVT > 0:  # dP sums over all of V's channels: the second group adds its share
            dpT = tl.dot(vt, tl.trans(do_t), dpT, input_precision=INPUT_PRECISION)
        if HAS_DROPOUT:  # dV sees the dropped P; dP flows back through the kept scores only
            pT_used = tl.where(keepT, pT * dropout_rescale, 0.0).to(do.dtype)
            dpT = tl.where(keepT, dpT * dropout_rescale, 0.0)
        else:
            pT_used = pT.to(do.dtype)
        dv = tl.dot(pT_used, do, dv, input_precision=INPUT_PRECISION)
        if BLOCK_DVT > 0:
            dvt = tl.dot(pT_used, do_t, dvt, input_precision=INPUT_PRECISION)
        dsT = pT * (dpT - delta[None, :])
        if HAS_SOFTCAP:
            dsT = dsT * (1.0 - tanhT * tanhT)
        dsT = dsT.to(qp.dtype)
        dka, dkb, dkp, dkt = _qk_grad_update(dka, dkb, dkp, dkt, dsT, qa, qb, qp, qt, HEAD_DIM, ROTARY_DIM, BLOCK_T,
                                             INPUT_PRECISION)
    return dka, dkb, dkp, dkt, dv, dvt


@triton.jit(do_not_specialize=DROPOUT_RUNTIME_ARGS)
def _attn_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI_SLOPES, COS, SIN, q_desc, qt_desc,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dkb, stride_dkn, stride_dkh,
    stride_dvb, stride_dvn, stride_dvh,
    stride_lse_b, stride_lse_h, stride_alibi_b, stride_rot,
    nheads_k, kv_group, seqlen_q, seqlen_k, num_n_blocks, softmax_scale,
    qk_scale_log2, window_left, window_right, softcap_in, softcap_out, alibi_to_raw,
    dropout_seed, dropout_offset, dropout_threshold, dropout_rescale,
    heads_per_split, stride_dk_split, stride_dv_split,
    HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr, BLOCK_DVT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, IS_VARLEN: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    FAST_TANH: tl.constexpr, ROTARY_DIM: tl.constexpr, ROTARY_INTERLEAVED: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, INPUT_PRECISION: tl.constexpr, TMA: tl.constexpr, GROUP_SPLIT: tl.constexpr,
    MASK_EDGES_ONLY: tl.constexpr,
):
    # Key tiles near the start are seen by the most causal queries; they go first as is.
    start_n, off_b, off_hk = _tile_of_program(tl.program_id(0), num_n_blocks, nheads_k, BLOCK_N, False)
    q_start, seqlen_q, k_start, seqlen_k = _sequence_bounds(off_b, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q,
                                                            seqlen_k, IS_VARLEN)
    if start_n >= seqlen_k:
        return
    offs_n = tl.arange(0, BLOCK_N)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_dvt = tl.arange(0, BLOCK_DVT if BLOCK_DVT > 0 else 16)
    DV_MAIN: tl.constexpr = BLOCK_DV if BLOCK_DVT > 0 else HEAD_DIM_V  # as in _attn_bwd_dkdv_tiles
    # K (rotated once, with RoPE) and V tiles stay on chip; dK and dV accumulate in registers
    # over all query tiles.
    ka, kb, kp, kt = _load_qk(_row_ptr(_head_base(K, off_b, off_hk, stride_kb, stride_kh), k_start + start_n,
                                       stride_kn),
                              offs_n, seqlen_k - start_n, stride_kn, start_n + offs_n, COS, SIN, stride_rot, HEAD_DIM,
                              ROTARY_DIM, BLOCK_R, BLOCK_P, BLOCK_T, ROTARY_INTERLEAVED, BLOCK_N, True)
    v_row = _row_ptr(_head_base(V, off_b, off_hk, stride_vb, stride_vh), k_start + start_n, stride_vn)
    v = _load_tile(v_row, offs_n, seqlen_k - start_n, stride_vn, offs_dv, DV_MAIN, BLOCK_DV, True)
    dka = tl.zeros([BLOCK_N, BLOCK_R], dtype=tl.float32)
    dkb = tl.zeros([BLOCK_N, BLOCK_R], dtype=tl.float32)
    dkp = tl.zeros([BLOCK_N, BLOCK_P], dtype=tl.float32)
    dkt = tl.zeros([BLOCK_N, BLOCK_T if BLOCK_T > 0 else 16], dtype=tl.float32)  # untouched without a t
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    vt = v  # placeholders unless V is split (configs.value_blocks)
    dvt = tl.zeros([1, 1], dtype=tl.float32)
    if BLOCK_DVT > 0:
        vt = _load_tile(v_row + BLOCK_DV, offs_n, seqlen_k - start_n, stride_vn, offs_dvt, HEAD_DIM_V - BLOCK_DV,
                        BLOCK_DVT, True)
        dvt = tl.zeros([BLOCK_N, BLOCK_DVT], dtype=tl.float32)

    lo, mid_lo, mid_hi, hi = _q_block_range(start_n, seqlen_q, seqlen_k, window_left, window_right,
                                            BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    # GQA: every query head of the group reads this K/V tile; their gradients sum here,
    # in a fixed order, so dK/dV need no atomics. With GROUP_SPLIT (few programs for the SMs;
    # configs.dkdv_group_split) this program sums only its share of the heads, program_id(1), into
    # its own float32 slice of DK/DV, and the host sums the slices in a fixed order afterwards.
    # Without it the loop is the one MHA compiles (kv_group == 1 is specialised to one trip).
    g_lo = 0
    g_hi = kv_group
    if GROUP_SPLIT:
        g_lo = tl.program_id(1) * heads_per_split
        g_hi = tl.minimum(g_lo + heads_per_split, kv_group)
    for g in range(g_lo, g_hi):
        off_h = off_hk * kv_group + g
        q_base = _row_ptr(_head_base(Q, off_b, off_h, stride_qb, stride_qh), q_start, stride_qm)
        do_base = _row_ptr(_head_base(DO, off_b, off_h, stride_dob, stride_doh), q_start, stride_dom)
        lse_base = _row_ptr(_head_base(LSE, off_b, off_h, stride_lse_b, stride_lse_h), q_start, 1)
        delta_base = _row_ptr(_head_base(DELTA, off_b, off_h, stride_lse_b, stride_lse_h), q_start, 1)
        slope_raw = 0.0
        if HAS_ALIBI:
            slope_raw = tl.load(ALIBI_SLOPES + off_b * stride_alibi_b + off_h) * alibi_to_raw
        bh = off_b * (nheads_k * kv_group) + off_h  # the dropout stream of this (sequence, query head)
        if HAS_LEFT or HAS_RIGHT:
            # One loop over every visible query tile, the masked edges (the causal diagonal, a
            # window's two edges) included. As three loops (masked edge, whole tiles, masked edge,
            # as the forward and the dQ pass have them) ptxas serialised every wgmma of this kernel
            # (its note C7515 at sm_90; tools/offline_compile.py marks such kernels
            # WGMMA-SERIALIZED): the dK/dV accumulators flow from one loop into the next.
            # MASK_EDGES_ONLY masks the edge tiles alone, behind a branch; off, every tile is masked
            # (no branch), where the branch serialised the wgmma (BackwardConfig.dkdv_mask_every_tile).
            dka, dkb, dkp, dkt, dv, dvt = _attn_bwd_dkdv_tiles(
                                      dka, dkb, dkp, dkt, dv, dvt, ka, kb, kp, kt, v, vt, q_base, do_base, lse_base,
                                      delta_base, stride_qm, stride_dom, q_desc, qt_desc,
                                      off_b, off_h, start_n, lo, mid_lo, mid_hi, hi, seqlen_q, seqlen_k,
                                      window_left, window_right,
                                      qk_scale_log2, softcap_in, softcap_out, slope_raw, COS, SIN, stride_rot, bh,
                                      dropout_seed, dropout_offset, dropout_threshold, dropout_rescale, HEAD_DIM,
                                      BLOCK_R, BLOCK_P, BLOCK_T, HEAD_DIM_V, BLOCK_DV, BLOCK_DVT, BLOCK_M, BLOCK_N,
                                      HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, FAST_TANH, ROTARY_DIM,
                                      ROTARY_INTERLEAVED,
                                      HAS_DROPOUT, True, MASK_EDGES_ONLY, INPUT_PRECISION, TMA)
        else:
            # Full attention: the whole tiles' loop between two edge loops that are empty at run
            # time. One loop alone compiled worse at sm_90 (dropout's kernel serialised its wgmma,
            # full attention's loop took 536 instructions against 520), and this is the form the
            # tile table was measured with. EDGES_ONLY is off: the middle bounds go unused.
            # Unrolled at compile time: part 0 is [lo, mid_lo), masked; part 1 the whole tiles
            # [mid_lo, mid_hi), unmasked; part 2 [mid_hi, hi), masked.
            for part in tl.static_range(3):
                part_lo = lo if part == 0 else (mid_lo if part == 1 else mid_hi)
                part_hi = mid_lo if part == 0 else (mid_hi if part == 1 else hi)
                dka, dkb, dkp, dkt, dv, dvt = _attn_bwd_dkdv_tiles(
                                      dka, dkb, dkp, dkt, dv, dvt, ka, kb, kp, kt, v, vt, q_base, do_base, lse_base,
                                      delta_base, stride_qm, stride_dom, q_desc, qt_desc,
                                      off_b, off_h, start_n, part_lo, mid_lo, mid_hi, part_hi, seqlen_q, seqlen_k,
                                      window_left, window_right,
                                      qk_scale_log2, softcap_in, softcap_out, slope_raw, COS, SIN, stride_rot, bh,
                                      dropout_seed, dropout_offset, dropout_threshold, dropout_rescale, HEAD_DIM,
                                      BLOCK_R, BLOCK_P, BLOCK_T, HEAD_DIM_V, BLOCK_DV, BLOCK_DVT, BLOCK_M, BLOCK_N,
                                      HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, FAST_TANH, ROTARY_DIM,
                                      ROTARY_INTERLEAVED,
                                      HAS_DROPOUT, part != 1, False, INPUT_PRECISION, TMA)

    if GROUP_SPLIT:  # this program's slice of the float32 partial sums
        DK += tl.program_id(1).to(tl.int64) * stride_dk_split
        DV += tl.program_id(1).to(tl.int64) * stride_dv_split
    # dk is w.r.t. the rotated keys; with RoPE the transposed rotation maps it back on the way out.
    _store_qk_grad(_row_ptr(_head_base(DK, off_b, off_hk, stride_dkb, stride_dkh), k_start + start_n, stride_dkn),
                   dka * softmax_scale, dkb * softmax_scale, dkp * softmax_scale, dkt * softmax_scale, start_n + offs_n,
                   offs_n, seqlen_k - start_n, stride_dkn, COS, SIN, stride_rot, HEAD_DIM, ROTARY_DIM, BLOCK_R, BLOCK_P,
                   BLOCK_T, ROTARY_INTERLEAVED)
    dv_row = _row_ptr(_head_base(DV, off_b, off_hk, stride_dvb, stride_dvh), k_start + start_n, stride_dvn)
    _store_tile(dv_row, dv, offs_n, seqlen_k - start_n, stride_dvn, offs_dv, DV_MAIN, BLOCK_DV)
    if BLOCK_DVT > 0:
        _store_tile(dv_row + BLOCK_DV, dvt, offs_n, seqlen_k - start_n, stride_dvn, offs_dvt, HEAD_DIM_V - BLOCK_DV,
                    BLOCK_DVT)


@triton.jit
def _attn_bwd_dq_tiles(dqa, dqb, dqp, dqt, qa, qb, qp, qt, do, do_t, lse2, delta, k_base, v_base, stride_kn,
                       stride_vn, k_desc, v_desc, vt_desc, kp_desc, kt_desc, cos_desc, sin_desc, off_b, off_hk,
                       start_m, lo, mid_lo,
                       mid_hi, hi, seqlen_q, seqlen_k, window_left, window_right, qk_scale_log2, softcap_in,
                       softcap_out, slope_raw, COS, SIN, stride_rot, bh, dropout_seed, dropout_offset,
                       dropout_threshold, dropout_rescale,
                       HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr,
                       HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DVT: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                       HAS_ALIBI: tl.constexpr, FAST_TANH: tl.constexpr, ROTARY_DIM: tl.constexpr,
                       ROTARY_INTERLEAVED: tl.constexpr, HAS_DROPOUT: tl.constexpr, MASKED: tl.constexpr,
                       EDGES_ONLY: tl.constexpr, INPUT_PRECISION: tl.constexpr, TMA: tl.constexpr):
    """Accumulate one query tile's dQ (unscaled, rotated frame, as groups a/b/p) over key tiles [lo, hi).
    MASKED masks the scores of every key tile (and bounds its loads by seqlen_k); with EDGES_ONLY
    as well, only the scores of those outside [mid_lo, mid_hi), which straddle a mask boundary.
    With BLOCK_DVT > 0 (configs.value_blocks) dO and V are two channel groups each (do_t, vt)."""
    rows = (start_m + tl.arange(0, BLOCK_M))[:, None]
    offs_n = tl.arange(0, BLOCK_N)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_dvt = tl.arange(0, BLOCK_DVT if BLOCK_DVT > 0 else 16)
    DV_MAIN: tl.constexpr = BLOCK_DV if BLOCK_DVT > 0 else HEAD_DIM_V  # channels of the first group
    for start_n in range(lo, hi, BLOCK_N):
        cols = (start_n + offs_n)[None, :]
        if TMA:  # rows past the end read as 0
            if ROTARY_DIM > 0:  # NeoX halves and their tables by TMA too (host check), as the forward
                ka, kb, kp, kt = _load_qk_tma(k_desc, kp_desc, kt_desc, cos_desc, sin_desc, off_b, start_n, off_hk,
                                              HEAD_DIM, ROTARY_DIM, BLOCK_R, BLOCK_P, BLOCK_T, BLOCK_N, qp.dtype)
            else:  # the channel groups p (and t)
                kp, kt = _load_pt_tma(k_desc, kt_desc, off_b, start_n, off_hk, 0, BLOCK_P, BLOCK_T, BLOCK_N)
                ka = kp  # never read without RoPE
                kb = kp
            v = _load_tile_tma(v_desc, off_b, start_n, off_hk, BLOCK_N, BLOCK_DV)
            if BLOCK_DVT > 0:
                vt = _load_tile_tma_at(vt_desc, off_b, start_n, off_hk, BLOCK_DV, BLOCK_N, BLOCK_DVT)
        else:
            ka, kb, kp, kt = _load_qk(_row_ptr(k_base, start_n, stride_kn), offs_n, seqlen_k - start_n, stride_kn,
                                      start_n + offs_n, COS, SIN, stride_rot, HEAD_DIM, ROTARY_DIM, BLOCK_R, BLOCK_P,
                                      BLOCK_T, ROTARY_INTERLEAVED, BLOCK_N, MASKED)
            v_row = _row_ptr(v_base, start_n, stride_vn)
            v = _load_tile(v_row, offs_n, seqlen_k - start_n, stride_vn, offs_dv, DV_MAIN, BLOCK_DV, MASKED)
            if BLOCK_DVT > 0:
                vt = _load_tile(v_row + BLOCK_DV, offs_n, seqlen_k - start_n, stride_vn, offs_dvt,
                                HEAD_DIM_V - BLOCK_DV, BLOCK_DVT, MASKED)
        s = _qk_dot(qa, qb, qp, qt, ka, kb, kp, kt, HEAD_DIM, ROTARY_DIM, BLOCK_T, INPUT_PRECISION)
        if HAS_DROPOUT:  # drawn while the tensor cores compute s (it does not depend on s)
            keep = _dropout_keep(dropout_seed, dropout_offset, bh, start_m + tl.arange(0, BLOCK_M), start_n,
                                 dropout_threshold, BLOCK_M, BLOCK_N)
        if HAS_SOFTCAP:
            s, tanh_s = _softcap(s, softcap_in, softcap_out, FAST_TANH)
        if HAS_ALIBI:
            s += _alibi_bias(rows, cols, seqlen_q, seqlen_k, slope_raw)
        if MASKED:
            s = _mask_tile_scores(s, rows, cols, start_n, mid_lo, mid_hi, seqlen_q, seqlen_k, window_left,
                                  window_right, HAS_LEFT, HAS_RIGHT, EDGES_ONLY)
        p = tl.math.exp2(s * qk_scale_log2 - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        if BLOCK_DVT > 0:  # dP sums over all of V's channels: the second group adds its share
            dp = tl.dot(do_t, tl.trans(vt), dp, input_precision=INPUT_PRECISION)
        if HAS_DROPOUT:
            dp = tl.where(keep, dp * dropout_rescale, 0.0)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - tanh_s * tanh_s)
        dqa, dqb, dqp, dqt = _qk_grad_update(dqa, dqb, dqp, dqt, ds.to(kp.dtype), ka, kb, kp, kt, HEAD_DIM,
                                             ROTARY_DIM, BLOCK_T, INPUT_PRECISION)
    return dqa, dqb, dqp, dqt


@triton.jit(do_not_specialize=DROPOUT_RUNTIME_ARGS)
def _attn_bwd_dq_kernel(
    Q, K, V, O, DO, LSE, DELTA, DQ, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI_SLOPES, COS, SIN, k_desc, v_desc, kp_desc,
    cos_desc, sin_desc, vt_desc, kt_desc,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_om, stride_oh,
    stride_dob, stride_dom, stride_doh,
    stride_dqb, stride_dqm, stride_dqh,
    stride_lse_b, stride_lse_h, stride_alibi_b, stride_rot,
    nheads, kv_group, seqlen_q, seqlen_k, num_m_blocks, softmax_scale,
    qk_scale_log2, window_left, window_right, softcap_in, softcap_out, alibi_to_raw,
    dropout_seed, dropout_offset, dropout_threshold, dropout_rescale,
    HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr, BLOCK_DVT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, IS_VARLEN: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    FAST_TANH: tl.constexpr, ROTARY_DIM: tl.constexpr, ROTARY_INTERLEAVED: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, INPUT_PRECISION: tl.constexpr, HEAVY_LAST: tl.constexpr, TMA: tl.constexpr,
):
    start_m, off_b, off_h = _tile_of_program(tl.program_id(0), num_m_blocks, nheads, BLOCK_M, HEAVY_LAST)
    q_start, seqlen_q, k_start, seqlen_k = _sequence_bounds(off_b, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q,
                                                            seqlen_k, IS_VARLEN)
    if start_m >= seqlen_q:
        return
    off_hk = off_h // kv_group
    offs_m = tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_dvt = tl.arange(0, BLOCK_DVT if BLOCK_DVT > 0 else 16)
    DV_MAIN: tl.constexpr = BLOCK_DV if BLOCK_DVT > 0 else HEAD_DIM_V  # as in _attn_bwd_dq_tiles
    row = q_start + start_m
    # Q (rotated once, with RoPE), dO, lse and delta for this tile stay on chip for the whole key loop.
    q_positions = start_m + offs_m + (seqlen_k - seqlen_q)
    qa, qb, qp, qt = _load_qk(_row_ptr(_head_base(Q, off_b, off_h, stride_qb, stride_qh), row, stride_qm), offs_m,
                              seqlen_q - start_m, stride_qm, q_positions, COS, SIN, stride_rot, HEAD_DIM, ROTARY_DIM,
                              BLOCK_R, BLOCK_P, BLOCK_T, ROTARY_INTERLEAVED, BLOCK_M, True)
    do_row = _row_ptr(_head_base(DO, off_b, off_h, stride_dob, stride_doh), row, stride_dom)
    do = _load_tile(do_row, offs_m, seqlen_q - start_m, stride_dom, offs_dv, DV_MAIN, BLOCK_DV, True)
    do_t = do  # placeholder unless V is split (configs.value_blocks)
    if BLOCK_DVT > 0:
        do_t = _load_tile(do_row + BLOCK_DV, offs_m, seqlen_q - start_m, stride_dom, offs_dvt, HEAD_DIM_V - BLOCK_DV,
                          BLOCK_DVT, True)
    in_rows = offs_m < seqlen_q - start_m
    lse_ptr = _row_ptr(_head_base(LSE, off_b, off_h, stride_lse_b, stride_lse_h), row, 1)
    delta_ptr = _row_ptr(_head_base(DELTA, off_b, off_h, stride_lse_b, stride_lse_h), row, 1)
    lse2 = _lse_for_recompute(tl.load(lse_ptr + offs_m, mask=in_rows, other=float("-inf")))
    # delta = rowsum(dO * O), the softmax backward's correction term, here where this tile's dO is on
    # chip already; every query row of every head belongs to exactly one dQ program, so each row's
    # delta is written once, and the dK/dV pass (launched after this one) reads it. This replaces a
    # light pass of its own: one launch fewer per backward, and dO read once less.
    o_row = _row_ptr(_head_base(O, off_b, off_h, stride_ob, stride_oh), row, stride_om)
    delta = _rowsum_o_do(o_row, do, offs_m, seqlen_q - start_m, stride_om, offs_dv, DV_MAIN, BLOCK_DV)
    if BLOCK_DVT > 0:
        delta += _rowsum_o_do(o_row + BLOCK_DV, do_t, offs_m, seqlen_q - start_m, stride_om, offs_dvt,
                              HEAD_DIM_V - BLOCK_DV, BLOCK_DVT)
    tl.store(delta_ptr + offs_m, delta, mask=in_rows)
    k_base = _row_ptr(_head_base(K, off_b, off_hk, stride_kb, stride_kh), k_start, stride_kn)
    v_base = _row_ptr(_head_base(V, off_b, off_hk, stride_vb, stride_vh), k_start, stride_vn)
    slope_raw = 0.0
    if HAS_ALIBI:
        slope_raw = tl.load(ALIBI_SLOPES + off_b * stride_alibi_b + off_h) * alibi_to_raw
    bh = off_b * nheads + off_h
    dqa = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    dqb = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    dqp = tl.zeros([BLOCK_M, BLOCK_P], dtype=tl.float32)
    dqt = tl.zeros([BLOCK_M, BLOCK_T if BLOCK_T > 0 else 16], dtype=tl.float32)  # untouched without a t

    lo, mid_lo, mid_hi, hi = _kv_block_range(start_m, seqlen_q, seqlen_k, window_left, window_right,
                                             BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    if TMA:
        # Masked edge, whole tiles, masked edge: three loops. K and V come by TMA (bounds handled
        # by the copy engine), and this form compiled best at sm_90 (fewest loop instructions,
        # no serialised wgmma).
        dqa, dqb, dqp, dqt = _attn_bwd_dq_tiles(dqa, dqb, dqp, dqt, qa, qb, qp, qt, do, do_t, lse2, delta, k_base,
                            v_base, stride_kn, stride_vn, k_desc, v_desc, vt_desc, kp_desc, kt_desc, cos_desc, sin_desc,
                            off_b, off_hk,
                            start_m, lo, lo, hi, mid_lo,
                            seqlen_q, seqlen_k, window_left, window_right, qk_scale_log2, softcap_in, softcap_out,
                            slope_raw, COS, SIN, stride_rot, bh, dropout_seed, dropout_offset, dropout_threshold,
                            dropout_rescale, HEAD_DIM, BLOCK_R, BLOCK_P, BLOCK_T, HEAD_DIM_V, BLOCK_DV, BLOCK_DVT,
                            BLOCK_M,
                            BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, FAST_TANH, ROTARY_DIM,
                            ROTARY_INTERLEAVED, HAS_DROPOUT, True, False, INPUT_PRECISION, TMA)
        dqa, dqb, dqp, dqt = _attn_bwd_dq_tiles(dqa, dqb, dqp, dqt, qa, qb, qp, qt, do, do_t, lse2, delta, k_base,
                            v_base, stride_kn, stride_vn, k_desc, v_desc, vt_desc, kp_desc, kt_desc, cos_desc, sin_desc,
                            off_b, off_hk,
                            start_m, mid_lo, lo, hi, mid_hi,
                            seqlen_q, seqlen_k, window_left, window_right, qk_scale_log2, softcap_in, softcap_out,
                            slope_raw, COS, SIN, stride_rot, bh, dropout_seed, dropout_offset, dropout_threshold,
                            dropout_rescale, HEAD_DIM, BLOCK_R, BLOCK_P, BLOCK_T, HEAD_DIM_V, BLOCK_DV, BLOCK_DVT,
                            BLOCK_M,
                            BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, FAST_TANH, ROTARY_DIM,
                            ROTARY_INTERLEAVED, HAS_DROPOUT, False, False, INPUT_PRECISION, TMA)
        dqa, dqb, dqp, dqt = _attn_bwd_dq_tiles(dqa, dqb, dqp, dqt, qa, qb, qp, qt, do, do_t, lse2, delta, k_base,
                            v_base, stride_kn, stride_vn, k_desc, v_desc, vt_desc, kp_desc, kt_desc, cos_desc, sin_desc,
                            off_b, off_hk,
                            start_m, mid_hi, lo, hi, hi,
                            seqlen_q, seqlen_k, window_left, window_right, qk_scale_log2, softcap_in, softcap_out,
                            slope_raw, COS, SIN, stride_rot, bh, dropout_seed, dropout_offset, dropout_threshold,
                            dropout_rescale, HEAD_DIM, BLOCK_R, BLOCK_P, BLOCK_T, HEAD_DIM_V, BLOCK_DV, BLOCK_DVT,
                            BLOCK_M,
                            BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, FAST_TANH, ROTARY_DIM,
                            ROTARY_INTERLEAVED, HAS_DROPOUT, True, False, INPUT_PRECISION, TMA)
    else:
        # Pointer loads (varlen, some RoPE layouts): one loop over every visible key tile, the
        # masked edges included, loads bounded by seqlen_k. As three loops, ptxas serialised every
        # wgmma of this kernel (note C7515 at sm_90; tools/offline_compile.py --varlen marks
        # it WGMMA-SERIALIZED), as it did the dK/dV pass's masked loops.
        dqa, dqb, dqp, dqt = _attn_bwd_dq_tiles(dqa, dqb, dqp, dqt, qa, qb, qp, qt, do, do_t, lse2, delta, k_base,
                            v_base, stride_kn, stride_vn, k_desc, v_desc, vt_desc, kp_desc, kt_desc, cos_desc, sin_desc,
                            off_b, off_hk,
                            start_m, lo, mid_lo, mid_hi,
                            hi, seqlen_q, seqlen_k, window_left, window_right, qk_scale_log2, softcap_in, softcap_out,
                            slope_raw, COS, SIN, stride_rot, bh, dropout_seed, dropout_offset, dropout_threshold,
                            dropout_rescale, HEAD_DIM, BLOCK_R, BLOCK_P, BLOCK_T, HEAD_DIM_V, BLOCK_DV, BLOCK_DVT,
                            BLOCK_M,
                            BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, FAST_TANH, ROTARY_DIM,
                            ROTARY_INTERLEAVED, HAS_DROPOUT, True, True, INPUT_PRECISION, TMA)
    # dq is w.r.t. the rotated queries; with RoPE the transposed rotation maps it back on the way out.
    _store_qk_grad(_row_ptr(_head_base(DQ, off_b, off_h, stride_dqb, stride_dqh), row, stride_dqm),
                   dqa * softmax_scale, dqb * softmax_scale, dqp * softmax_scale, dqt * softmax_scale, q_positions,
                   offs_m, seqlen_q - start_m, stride_dqm, COS, SIN, stride_rot, HEAD_DIM, ROTARY_DIM, BLOCK_R, BLOCK_P,
                   BLOCK_T, ROTARY_INTERLEAVED)


def attention_backward(dout, q, k, v, out, lse, a: AttentionArgs):
    """Returns (dq, dk, dv) in the dtypes and layouts of q, k, v. All inputs have a contiguous last
    dim. A repeated kind of call is replayed from its launch plan (plans.py)."""
    return plans.planned(plan_key(dout, q, k, v, out, lse, a), (dout, q, k, v, out, lse),
                         lambda: _attention_backward(dout, q, k, v, out, lse, a), a.settings.fast_launch)


def plan_key(dout, q, k, v, out, lse, a: AttentionArgs) -> tuple | None:
    """The kind of an attention_backward call (plans.py), or None where it takes the usual path."""
    if not plans.plannable(a, q):
        return None
    # The one-pass backward's accumulator is taken by the free memory at the time unless small.
    if backward_sm90 is not None and not small_buffer(backward_sm90.accumulator_bytes(q), q.device):
        return None
    return ("bwd", q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), out.stride(), dout.shape,
            dout.stride(), lse.shape, lse.stride(), q.dtype, q.device, q.data_ptr() & 15, k.data_ptr() & 15,
            v.data_ptr() & 15, out.data_ptr() & 15, dout.data_ptr() & 15, lse.data_ptr() & 15, a.softmax_scale,
            a.window_left, a.window_right, a.softcap, a.deterministic, a.settings, *plans.switches())


def _attention_backward(dout, q, k, v, out, lse, a: AttentionArgs):
    if backward_sm90 is not None and backward_sm90.applies(q, k, v, dout, out, a):  # Hopper, one pass, in Gluon
        return backward_sm90.attention_backward_sm90(dout, q, k, v, out, lse, a)
    if backward_sm90 is None and not a.deterministic and q.is_cuda:
        _say_once_why_hopper_runs_two_passes(q.device)
    batch, nheads, nheads_k, seqlen_q, seqlen_k = kernel_geometry(q, k, v, a)
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    kv_group = nheads // nheads_k
    cfg = backward_config(head_dim, head_dim_v, a.causal_only, q.dtype, q.device, a.rotary_table_bytes,
                          a.dropout is not None, max(seqlen_q, seqlen_k))
    block_dv, block_dvt = value_blocks(head_dim_v)
    alibi, stride_alibi_b = alibi_pointer(q, a)
    scalars, constexprs = feature_args(q, a)
    stride_lse_b, stride_lse_h = (0, lse.stride(0)) if a.varlen else (lse.stride(0), lse.stride(1))

    # delta = rowsum(dO * O) for every query row: the dQ pass computes it, runs first, and the
    # dK/dV pass reads it.
    delta = torch.empty_like(lse)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    blocks = qk_blocks(head_dim, a.rotary_dim)
    # TMA descriptors (descriptors.py) for the tiles each pass streams: K and V in dQ, and Q in dK/dV
    # where the tile config says so. With RoPE (NeoX halves, fixed lengths) the dQ pass can take K's
    # halves, its pass-through channels and both tables by TMA as the forward does, where the tile
    # config says so (BackwardConfig.dq_rope_by_tma); the dK/dV pass keeps pointer loads for its
    # rotated Q.
    tma = tma_applies(a, q, k, v, dout)
    rope_tma = cfg.dq_rope_by_tma and rope_tma_applies(a, q, k, v, dout)
    shared = dict(HEAD_DIM=head_dim, **blocks, HEAD_DIM_V=head_dim_v, BLOCK_DV=block_dv, BLOCK_DVT=block_dvt,
                  **constexprs)
    dkdv_tma = tma and cfg.dkdv_q_by_tma
    # dQ pass: K, V, then K's pass-through and cos/sin (RoPE), then V's second channel group and
    # K's tail group t (channel_groups.py)
    dkdv_descs, dq_descs = [None, None], [None] * 7  # dK/dV pass: Q's groups p and t
    block_t = blocks["BLOCK_T"]
    if dkdv_tma:
        dkdv_descs = [tile_descriptor(q, cfg.dkdv.block_m, blocks["BLOCK_P"]),
                      tile_descriptor(q, cfg.dkdv.block_m, block_t) if block_t else None]
    if tma or rope_tma:
        k_desc, *rope_descs, kt_desc = key_descriptors(k, cfg.dq.block_n, blocks, rope_tma, a.rotary_dim,
                                                       a.rotary_cos, a.rotary_sin)
        dq_descs = [k_desc, tile_descriptor(v, cfg.dq.block_n, block_dv), *rope_descs,
                    tile_descriptor(v, cfg.dq.block_n, block_dvt) if block_dvt else None, kt_desc]

    # The dQ pass first: it writes delta, which the dK/dV pass reads.
    num_m_blocks = cdiv(seqlen_q, cfg.dq.block_m)
    launch(_attn_bwd_dq_kernel, (num_m_blocks * batch * nheads,), cfg.dq,
        q, k, v, out, dout, lse, delta, dq, a.cu_seqlens_q, a.cu_seqlens_k, alibi, a.rotary_cos, a.rotary_sin,
        *dq_descs, *seq_strides(q, a.varlen), *seq_strides(k, a.varlen), *seq_strides(v, a.varlen),
        *seq_strides(out, a.varlen), *seq_strides(dout, a.varlen), *seq_strides(dq, a.varlen), stride_lse_b,
        stride_lse_h, stride_alibi_b, a.rotary_stride,
        nheads, kv_group, seqlen_q, seqlen_k, num_m_blocks, a.softmax_scale, *scalars,
        BLOCK_M=cfg.dq.block_m, BLOCK_N=cfg.dq.block_n, HEAVY_LAST=a.causal_only, TMA=tma or rope_tma,
        **shared,
    )

    num_n_blocks = cdiv(seqlen_k, cfg.dkdv.block_n)
    programs = num_n_blocks * batch * nheads_k
    # GQA with too few dK/dV programs for the SMs: the group's query heads split over `splits`
    # programs per key tile, each writing float32 partial dK/dV to its own slice (summed below).
    # dK/dV work: 4 matmuls per visible pair at most (masks only lower it), 2 FLOPs per multiply-add.
    flops = 2.0 * batch * nheads * seqlen_q * seqlen_k * (2 * head_dim + 2 * head_dim_v)
    heads_per_split = dkdv_group_split(kv_group, programs, flops, q.device)
    splits = cdiv(kv_group, heads_per_split)
    # (splits, *dk.shape): the float32 slices, or dk itself as the one slice (GROUP_SPLIT off).
    dk_out, dv_out = dk[None], dv[None]
    if splits > 1:
        dk_out = torch.empty((splits, *dk.shape), device=dk.device, dtype=torch.float32)
        dv_out = torch.empty((splits, *dv.shape), device=dv.device, dtype=torch.float32)
    launch(_attn_bwd_dkdv_kernel, (programs, splits), cfg.dkdv,
        q, k, v, dout, lse, delta, dk_out, dv_out, a.cu_seqlens_q, a.cu_seqlens_k, alibi, a.rotary_cos,
        a.rotary_sin, dkdv_descs[0], dkdv_descs[1],
        *seq_strides(q, a.varlen), *seq_strides(k, a.varlen), *seq_strides(v, a.varlen),
        *seq_strides(dout, a.varlen), *seq_strides(dk_out[0], a.varlen), *seq_strides(dv_out[0], a.varlen),
        stride_lse_b, stride_lse_h, stride_alibi_b, a.rotary_stride,
        nheads_k, kv_group, seqlen_q, seqlen_k, num_n_blocks, a.softmax_scale, *scalars,
        heads_per_split, dk_out.stride(0), dv_out.stride(0),
        BLOCK_M=cfg.dkdv.block_m, BLOCK_N=cfg.dkdv.block_n, TMA=dkdv_tma, GROUP_SPLIT=splits > 1,
        MASK_EDGES_ONLY=not cfg.dkdv_mask_every_tile, **shared,
    )
    if splits > 1:  # a fixed-order sum in float32, one rounding to the gradients' dtype
        dk.copy_(dk_out.sum(0))
        dv.copy_(dv_out.sum(0))
        not_replayable()  # torch ops of its own
    return dq, dk, dv
