"""FlashAttention forward in Triton: one fused kernel, O and the LSE are its only writes.

Each program owns one BLOCK_M tile of queries of one (sequence, head) (FlashAttention-2's
sequence-parallel split). Its Q tile stays on chip while it streams K/V tiles through
an online softmax; the N x N score matrix never exists outside registers. Masks
(causal, sliding window, sequence ends), ALiBi and softcap are applied to each score
tile in registers, and tiles a mask hides entirely are never loaded.

Long fixed-length keys (over 65,536 on the GPU, without a causal or window mask) are split
into chunks, one launch each (configs.forward_key_chunk), so that the K/V a head's programs
share stay in L2: then each launch but the last also writes its softmax state, which the next
one reads, in float32 (O(N) like the output). docs/design/attention-forward.md says why the
kernel is built this way and what each choice measured.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.host import cdiv
from . import plans
from .args import AttentionArgs
from .block_info import _kv_block_range
from .channel_groups import _load_pt_tma, _load_qk, _load_qk_tma, _qk_dot
from .configs import FORWARD_KEY_CHUNK, forward_config, forward_key_chunk, value_blocks
from .descriptors import key_descriptors, rope_tma_applies, tile_descriptor, tma_applies
from .dropout import DROPOUT_RUNTIME_ARGS
from .kernel_args import alibi_pointer, feature_args, kernel_geometry, lse_layout, qk_blocks, seq_strides
from .launch import launch
from .mask import _dropout_keep, _mask_scores
from .score_mods import _alibi_bias, _softcap
from .seqlen_info import _sequence_bounds
from .softmax import _finalize_softmax, _online_softmax_update
from .tile_scheduler import _tile_of_program
try:  # the Gluon forward for Hopper (forward_sm90.py); a triton without Gluon's Hopper API keeps this one
    from . import forward_sm90
except (ImportError, AttributeError):  # pragma: no cover - depends on the installed triton
    forward_sm90 = None
from .tiles import (_head_base, _load_tile, _load_tile_tma, _load_tile_tma_at, _row_ptr, _store_tile,
                    _store_tile_tma, _store_tile_tma_at)


@triton.jit
def _attn_fwd_tiles(acc, acc_t, m_i, l_i, qa, qb, qp, qt, k_base, v_base, k_desc, v_desc, vt_desc, kp_desc,
                    kt_desc, cos_desc, sin_desc,
                    off_b, off_hk, stride_kn,
                    stride_vn, start_m, lo, hi,
                    seqlen_q, seqlen_k, window_left, window_right, qk_scale_log2, softcap_in, softcap_out,
                    slope_raw, COS, SIN, stride_rot, bh, dropout_seed, dropout_offset, dropout_threshold,
                    dropout_rescale,
                    HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr,
                    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DVT: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                    HAS_ALIBI: tl.constexpr, FAST_TANH: tl.constexpr, ROTARY_DIM: tl.constexpr,
                    ROTARY_INTERLEAVED: tl.constexpr, HAS_DROPOUT: tl.constexpr, MASKED: tl.constexpr,
                    INPUT_PRECISION: tl.constexpr, TMA: tl.constexpr):
    """Stream key tiles [lo, hi) into the running state of one query tile.

    Invariant after each tile: acc is un-normalised (acc / l_i is the output over the keys
    seen so far), m_i is the running row max of scale*log2(e)*s, and l_i = sum exp2(. - m_i).
    With BLOCK_DVT > 0 (configs.value_blocks), V's channels are two groups, [0, BLOCK_DV) and
    [BLOCK_DV, HEAD_DIM_V), and acc_t is the second group's accumulator under the same invariant;
    otherwise acc_t is a placeholder nothing touches.
    """
    rows = (start_m + tl.arange(0, BLOCK_M))[:, None]
    offs_n = tl.arange(0, BLOCK_N)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_dvt = tl.arange(0, BLOCK_DVT if BLOCK_DVT > 0 else 16)
    # Channels of the first group that exist: all of it when V is split (its tail holds the rest).
    DV_MAIN: tl.constexpr = BLOCK_DV if BLOCK_DVT > 0 else HEAD_DIM_V
    for start_n in range(lo, hi, BLOCK_N):
        cols = (start_n + offs_n)[None, :]
        # Only masked tiles can hold the seqlen_k tail, so only they check rows.
        # With RoPE, key j sits at position j and the K tile is rotated as it arrives.
        if TMA:  # the tile through the copy engine, zero-filled past the end
            if ROTARY_DIM > 0:  # NeoX halves and their tables by TMA too (host check), rotated here
                ka, kb, kp, kt = _load_qk_tma(k_desc, kp_desc, kt_desc, cos_desc, sin_desc, off_b, start_n, off_hk,
                                              HEAD_DIM, ROTARY_DIM, BLOCK_R, BLOCK_P, BLOCK_T, BLOCK_N, qp.dtype)
            else:  # the channel groups p (and t), one box each
                kp, kt = _load_pt_tma(k_desc, kt_desc, off_b, start_n, off_hk, 0, BLOCK_P, BLOCK_T, BLOCK_N)
                ka = kp  # the rotary groups do not exist without RoPE; _qk_dot never reads them
                kb = kp
            # V is asked for beside K, so the pipeliner gives both copies one barrier and one
            # wait per tile; asked for after the softmax, V got a barrier and wait of its own
            # between the two dots, 5-11% slower with the same loop body
            # (docs/design/attention-forward.md).
            v = _load_tile_tma(v_desc, off_b, start_n, off_hk, BLOCK_N, BLOCK_DV)
            if BLOCK_DVT > 0:  # V's second channel group: its own box, from channel BLOCK_DV on
                vt = _load_tile_tma_at(vt_desc, off_b, start_n, off_hk, BLOCK_DV, BLOCK_N, BLOCK_DVT)
            s = _qk_dot(qa, qb, qp, qt, ka, kb, kp, kt, HEAD_DIM, ROTARY_DIM, BLOCK_T, INPUT_PRECISION)
        else:
            ka, kb, kp, kt = _load_qk(_row_ptr(k_base, start_n, stride_kn), offs_n, seqlen_k - start_n, stride_kn,
                                      start_n + offs_n, COS, SIN, stride_rot, HEAD_DIM, ROTARY_DIM, BLOCK_R, BLOCK_P,
                                      BLOCK_T, ROTARY_INTERLEAVED, BLOCK_N, MASKED)
            s = _qk_dot(qa, qb, qp, qt, ka, kb, kp, kt, HEAD_DIM, ROTARY_DIM, BLOCK_T, INPUT_PRECISION)
        if HAS_DROPOUT:
            # Drawn here, between the QK^T issue and the first use of s: the integer Philox work
            # does not depend on s, so it can run while the tensor cores compute the scores.
            keep = _dropout_keep(dropout_seed, dropout_offset, bh, start_m + tl.arange(0, BLOCK_M), start_n,
                                 dropout_threshold, BLOCK_M, BLOCK_N)
        if HAS_SOFTCAP:
            s, _ = _softcap(s, softcap_in, softcap_out, FAST_TANH)
        if HAS_ALIBI:
            s += _alibi_bias(rows, cols, seqlen_q, seqlen_k, slope_raw)
        if MASKED:
            s = _mask_scores(s, rows, cols, seqlen_q, seqlen_k, window_left, window_right, HAS_LEFT, HAS_RIGHT)
        p, alpha, m_i, l_i = _online_softmax_update(s, m_i, l_i, qk_scale_log2, MASKED)
        if HAS_DROPOUT:  # after the update: l_i sums the undropped probabilities, as softmax does
            # The kept p's factor 1 / (1 - p_drop) is one constant: the kernel applies it to acc
            # once, after the loop, instead of to every score here.
            p = tl.where(keep, p, 0.0)
        if not TMA:
            v_row = _row_ptr(v_base, start_n, stride_vn)
            v = _load_tile(v_row, offs_n, seqlen_k - start_n, stride_vn, offs_dv, DV_MAIN, BLOCK_DV, MASKED)
            if BLOCK_DVT > 0:
                vt = _load_tile(v_row + BLOCK_DV, offs_n, seqlen_k - start_n, stride_vn, offs_dvt,
                                HEAD_DIM_V - BLOCK_DV, BLOCK_DVT, MASKED)
        p = p.to(v.dtype)
        if BLOCK_DVT > 0:  # the same P against the second channel group: no padded channels in the dot
            acc_t = tl.dot(p, vt, acc_t * alpha[:, None], input_precision=INPUT_PRECISION)
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision=INPUT_PRECISION)
    return acc, acc_t, m_i, l_i


@triton.jit(do_not_specialize=DROPOUT_RUNTIME_ARGS)
def _attn_fwd_kernel(
    Q, K, V, O, LSE, ACC_STATE, ML_STATE, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI_SLOPES, COS, SIN,
    q_desc, k_desc, v_desc, o_desc, kp_desc, cos_desc, sin_desc, vt_desc, ot_desc, qt_desc, kt_desc,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_om, stride_oh,
    stride_lse_b, stride_lse_h, stride_alibi_b, stride_rot,
    nheads, kv_group, seqlen_q, seqlen_k, num_m_blocks, key_lo, key_hi,
    qk_scale_log2, window_left, window_right, softcap_in, softcap_out, alibi_to_raw,
    dropout_seed, dropout_offset, dropout_threshold, dropout_rescale,
    HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr,
    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DVT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, IS_VARLEN: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    FAST_TANH: tl.constexpr, ROTARY_DIM: tl.constexpr, ROTARY_INTERLEAVED: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, INPUT_PRECISION: tl.constexpr, HEAVY_LAST: tl.constexpr, TMA: tl.constexpr,
    CARRY_IN: tl.constexpr, CARRY_OUT: tl.constexpr,
):
    # HEAVY_LAST (causal): query tiles late in the sequence see the most keys; launch them first.
    start_m, off_b, off_h = _tile_of_program(tl.program_id(0), num_m_blocks, nheads, BLOCK_M, HEAVY_LAST)
    q_start, seqlen_q, k_start, seqlen_k = _sequence_bounds(off_b, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q,
                                                            seqlen_k, IS_VARLEN)
    if start_m >= seqlen_q:  # varlen: this sequence is shorter than max_seqlen_q; padding costs nothing
        return
    off_hk = off_h // kv_group  # GQA: query heads share K/V heads; K/V are never expanded
    offs_m = tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_dvt = tl.arange(0, BLOCK_DVT if BLOCK_DVT > 0 else 16)
    DV_MAIN: tl.constexpr = BLOCK_DV if BLOCK_DVT > 0 else HEAD_DIM_V  # as in _attn_fwd_tiles

    # The Q tile is loaded (and rotated) once and stays on chip for the whole key loop.
    # With RoPE, query i sits at position i + seqlen_k - seqlen_q (bottom-right alignment).
    # TMA (descriptors.py): fixed-length batches take their tiles through the copy engine; with
    # RoPE only K's halves and the tables do (in the key loop), and Q keeps its one pointer load.
    if TMA and ROTARY_DIM == 0:  # with RoPE, Q (loaded once) keeps the pointer path below
        qp, qt = _load_pt_tma(q_desc, qt_desc, off_b, start_m, off_h, 0, BLOCK_P, BLOCK_T, BLOCK_M)
        qa = qp  # the rotary groups do not exist without RoPE; _qk_dot never reads them
        qb = qp
    else:
        q_ptr = _row_ptr(_head_base(Q, off_b, off_h, stride_qb, stride_qh), q_start + start_m, stride_qm)
        qa, qb, qp, qt = _load_qk(q_ptr, offs_m, seqlen_q - start_m, stride_qm,
                                  start_m + offs_m + (seqlen_k - seqlen_q), COS, SIN, stride_rot, HEAD_DIM, ROTARY_DIM,
                                  BLOCK_R, BLOCK_P, BLOCK_T, ROTARY_INTERLEAVED, BLOCK_M, True)
    k_base = _row_ptr(_head_base(K, off_b, off_hk, stride_kb, stride_kh), k_start, stride_kn)
    v_base = _row_ptr(_head_base(V, off_b, off_hk, stride_vb, stride_vh), k_start, stride_vn)
    slope_raw = 0.0
    if HAS_ALIBI:
        slope_raw = tl.load(ALIBI_SLOPES + off_b * stride_alibi_b + off_h) * alibi_to_raw
    bh = off_b * nheads + off_h  # the dropout stream of this (sequence, head)

    # Split keys (attention_forward, configs.forward_key_chunk): this launch covers keys
    # [key_lo, key_hi) and the online softmax's state (acc, m_i, l_i) passes between launches
    # through float32 buffers, so the result is the one-launch result, bit for bit. A launch
    # that is not the last stores its state instead of the output.
    st_rows = off_b.to(tl.int64) * nheads + off_h  # (batch, head) of the state buffers
    acc_state = ACC_STATE + (st_rows * seqlen_q + start_m) * HEAD_DIM_V
    ml_state = ML_STATE + st_rows * 2 * seqlen_q + start_m
    acc_t = tl.zeros([1, 1], dtype=tl.float32)  # placeholder unless V is split (BLOCK_DVT > 0)
    if CARRY_IN:
        acc = _load_tile(acc_state, offs_m, seqlen_q - start_m, HEAD_DIM_V, offs_dv, DV_MAIN, BLOCK_DV, True)
        if BLOCK_DVT > 0:
            acc_t = _load_tile(acc_state + BLOCK_DV, offs_m, seqlen_q - start_m, HEAD_DIM_V, offs_dvt,
                               HEAD_DIM_V - BLOCK_DV, BLOCK_DVT, True)
        m_i = tl.load(ml_state + offs_m, mask=offs_m < seqlen_q - start_m, other=float("-inf"))
        l_i = tl.load(ml_state + seqlen_q + offs_m, mask=offs_m < seqlen_q - start_m, other=0.0)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        if BLOCK_DVT > 0:
            acc_t = tl.zeros([BLOCK_M, BLOCK_DVT], dtype=tl.float32)

    lo, mid_lo, mid_hi, hi = _kv_block_range(start_m, seqlen_q, seqlen_k, window_left, window_right,
                                             BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    # Clamped to this launch's keys; order is kept (key_lo is a multiple of BLOCK_N, and key_hi
    # too unless it is seqlen_k), and [0, seqlen_k) changes nothing.
    lo = tl.minimum(tl.maximum(lo, key_lo), key_hi)
    mid_lo = tl.minimum(tl.maximum(mid_lo, key_lo), key_hi)
    mid_hi = tl.minimum(tl.maximum(mid_hi, key_lo), key_hi)
    hi = tl.minimum(tl.maximum(hi, key_lo), key_hi)
    # Left edge of a sliding window: masked.
    acc, acc_t, m_i, l_i = _attn_fwd_tiles(acc, acc_t, m_i, l_i, qa, qb, qp, qt, k_base, v_base, k_desc, v_desc,
                                    vt_desc, kp_desc, kt_desc, cos_desc,
                                    sin_desc, off_b, off_hk, stride_kn, stride_vn, start_m, lo, mid_lo,
                                    seqlen_q, seqlen_k, window_left, window_right, qk_scale_log2, softcap_in,
                                    softcap_out, slope_raw, COS, SIN, stride_rot, bh, dropout_seed, dropout_offset,
                                    dropout_threshold, dropout_rescale, HEAD_DIM, BLOCK_R, BLOCK_P, BLOCK_T, HEAD_DIM_V,
                                    BLOCK_DV, BLOCK_DVT, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI,
                                    FAST_TANH, ROTARY_DIM, ROTARY_INTERLEAVED, HAS_DROPOUT, True, INPUT_PRECISION, TMA)
    # Whole tiles where every score is visible: no mask work.
    acc, acc_t, m_i, l_i = _attn_fwd_tiles(acc, acc_t, m_i, l_i, qa, qb, qp, qt, k_base, v_base, k_desc, v_desc,
                                    vt_desc, kp_desc, kt_desc, cos_desc,
                                    sin_desc, off_b, off_hk, stride_kn, stride_vn, start_m, mid_lo,
                                    mid_hi, seqlen_q, seqlen_k, window_left, window_right, qk_scale_log2,
                                    softcap_in, softcap_out, slope_raw, COS, SIN, stride_rot, bh, dropout_seed,
                                    dropout_offset, dropout_threshold, dropout_rescale, HEAD_DIM, BLOCK_R,
                                    BLOCK_P, BLOCK_T, HEAD_DIM_V, BLOCK_DV, BLOCK_DVT, BLOCK_M, BLOCK_N, HAS_LEFT,
                                    HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, FAST_TANH, ROTARY_DIM, ROTARY_INTERLEAVED,
                                    HAS_DROPOUT,
                                    False, INPUT_PRECISION, TMA)
    # The causal diagonal / right window edge and the seqlen_k tail: masked.
    acc, acc_t, m_i, l_i = _attn_fwd_tiles(acc, acc_t, m_i, l_i, qa, qb, qp, qt, k_base, v_base, k_desc, v_desc,
                                    vt_desc, kp_desc, kt_desc, cos_desc,
                                    sin_desc, off_b, off_hk, stride_kn, stride_vn, start_m, mid_hi, hi,
                                    seqlen_q, seqlen_k, window_left, window_right, qk_scale_log2, softcap_in,
                                    softcap_out, slope_raw, COS, SIN, stride_rot, bh, dropout_seed, dropout_offset,
                                    dropout_threshold, dropout_rescale, HEAD_DIM, BLOCK_R, BLOCK_P, BLOCK_T, HEAD_DIM_V,
                                    BLOCK_DV, BLOCK_DVT, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI,
                                    FAST_TANH, ROTARY_DIM, ROTARY_INTERLEAVED, HAS_DROPOUT, True, INPUT_PRECISION, TMA)

    if CARRY_OUT:
        _store_tile(acc_state, acc, offs_m, seqlen_q - start_m, HEAD_DIM_V, offs_dv, DV_MAIN, BLOCK_DV)
        if BLOCK_DVT > 0:
            _store_tile(acc_state + BLOCK_DV, acc_t, offs_m, seqlen_q - start_m, HEAD_DIM_V, offs_dvt,
                        HEAD_DIM_V - BLOCK_DV, BLOCK_DVT)
        tl.store(ml_state + offs_m, m_i, mask=offs_m < seqlen_q - start_m)
        tl.store(ml_state + seqlen_q + offs_m, l_i, mask=offs_m < seqlen_q - start_m)
        return
    if HAS_DROPOUT:  # the kept probabilities' rescale, left out of the loop (_attn_fwd_tiles)
        acc = acc * dropout_rescale
        if BLOCK_DVT > 0:
            acc_t = acc_t * dropout_rescale
    out, lse = _finalize_softmax(acc, m_i, l_i)
    o_row = _row_ptr(_head_base(O, off_b, off_h, stride_ob, stride_oh), q_start + start_m, stride_om)
    if TMA:
        _store_tile_tma(o_desc, out.to(O.dtype.element_ty), off_b, start_m, off_h, BLOCK_M, BLOCK_DV)
    else:
        _store_tile(o_row, out, offs_m, seqlen_q - start_m, stride_om, offs_dv, DV_MAIN, BLOCK_DV)
    if BLOCK_DVT > 0:
        out_t, _ = _finalize_softmax(acc_t, m_i, l_i)
        if TMA:
            _store_tile_tma_at(ot_desc, out_t.to(O.dtype.element_ty), off_b, start_m, off_h, BLOCK_DV, BLOCK_M,
                               BLOCK_DVT)
        else:
            _store_tile(o_row + BLOCK_DV, out_t, offs_m, seqlen_q - start_m, stride_om, offs_dvt,
                        HEAD_DIM_V - BLOCK_DV, BLOCK_DVT)
    lse_ptr = _row_ptr(_head_base(LSE, off_b, off_h, stride_lse_b, stride_lse_h), q_start + start_m, 1)
    tl.store(lse_ptr + offs_m, lse, mask=offs_m < seqlen_q - start_m)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: AttentionArgs):
    """Returns (out, lse). q (B, Nq, H, D) and k/v (B, Nk, Hk, D or Dv), or packed (total, H, D)
    with a.cu_seqlens_*; the last dim of each is contiguous. A repeated kind of call is replayed
    from its launch plan (plans.py)."""
    return plans.planned(plan_key(q, k, v, a), (q, k, v), lambda: _attention_forward(q, k, v, a),
                         a.settings.fast_launch)


def plan_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: AttentionArgs) -> tuple | None:
    """The kind of an attention_forward call (plans.py), or None where it takes the usual path."""
    if not plans.plannable(a, q):
        return None
    if k.shape[1] > FORWARD_KEY_CHUNK and a.window_left < 0 and a.window_right < 0:
        return None  # the key-chunk split is decided from the free memory at the time
    return ("fwd", q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, q.device,
            q.data_ptr() & 15, k.data_ptr() & 15, v.data_ptr() & 15, a.softmax_scale, a.window_left,
            a.window_right, a.softcap, a.settings, *plans.switches())


def _attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: AttentionArgs):
    if forward_sm90 is not None and forward_sm90.applies(q, k, v, a):  # Hopper, warp-specialised, in Gluon
        return forward_sm90.attention_forward_sm90(q, k, v, a)
    batch, nheads, nheads_k, seqlen_q, seqlen_k = kernel_geometry(q, k, v, a)
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    out = torch.empty((*q.shape[:-1], head_dim_v), device=q.device, dtype=q.dtype)
    lse, stride_lse_b, stride_lse_h = lse_layout(batch, nheads, seqlen_q, q.shape[0], a.varlen, q.device)
    cfg = forward_config(head_dim, head_dim_v, a.causal_only, q.dtype, q.device, a.rotary_table_bytes,
                         a.dropout is not None, max(seqlen_q, seqlen_k))
    num_m_blocks = cdiv(seqlen_q, cfg.block_m)
    alibi, stride_alibi_b = alibi_pointer(q, a)
    scalars, constexprs = feature_args(q, a)
    blocks = qk_blocks(head_dim, a.rotary_dim)
    rope_tma = rope_tma_applies(a, q, k, v, out)
    tma = rope_tma or tma_applies(a, q, k, v, out)
    block_dv, block_dvt = value_blocks(head_dim_v)
    # Q, K, V, O, then K's pass-through channels and the cos/sin tables (RoPE), then the second
    # channel groups of V and O (when V is split), then Q's and K's tail groups t (channel_groups.py)
    descs = [None] * 11
    if tma:
        k_desc, *rope_descs, kt_desc = key_descriptors(k, cfg.block_n, blocks, rope_tma, a.rotary_dim,
                                                       a.rotary_cos, a.rotary_sin)
        descs = [tile_descriptor(q, cfg.block_m, blocks["BLOCK_P"]), k_desc, tile_descriptor(v, cfg.block_n, block_dv),
                 tile_descriptor(out, cfg.block_m, block_dv), *rope_descs, None, None, None, kt_desc]
        if block_dvt:
            descs[7:9] = [tile_descriptor(v, cfg.block_n, block_dvt), tile_descriptor(out, cfg.block_m, block_dvt)]
        if blocks["BLOCK_T"] and not rope_tma:  # with RoPE, Q keeps its pointer load
            descs[9] = tile_descriptor(q, cfg.block_m, blocks["BLOCK_T"])
    # Key ranges, one launch each: the whole at once, or (for long fixed-length keys, where a
    # head's K and V outgrow L2 and the programs of a head drift apart along them) chunks
    # whose K and V fit, with the softmax state carried in float32 between launches.
    chunk = None if a.varlen else forward_key_chunk(
        seqlen_k, cfg.block_n, q.device, masked=a.window_left >= 0 or a.window_right >= 0,
        state_bytes=batch * nheads * seqlen_q * (head_dim_v + 2) * 4)
    if chunk is None or seqlen_k <= chunk:  # varlen never chunks (chunk is None above)
        ranges = [(0, seqlen_k)]
        acc_state = ml_state = lse  # placeholders: nothing reads them
    else:
        ranges = [(lo, min(lo + chunk, seqlen_k)) for lo in range(0, seqlen_k, chunk)]
        acc_state = torch.empty(batch, nheads, seqlen_q, head_dim_v, device=q.device, dtype=torch.float32)
        ml_state = torch.empty(batch, nheads, 2, seqlen_q, device=q.device, dtype=torch.float32)
    for i, (key_lo, key_hi) in enumerate(ranges):
        launch(_attn_fwd_kernel, (num_m_blocks * batch * nheads,), cfg,
            q, k, v, out, lse, acc_state, ml_state, a.cu_seqlens_q, a.cu_seqlens_k, alibi, a.rotary_cos,
            a.rotary_sin, *descs, *seq_strides(q, a.varlen), *seq_strides(k, a.varlen), *seq_strides(v, a.varlen),
            *seq_strides(out, a.varlen), stride_lse_b, stride_lse_h, stride_alibi_b, a.rotary_stride,
            nheads, nheads // nheads_k, seqlen_q, seqlen_k, num_m_blocks, key_lo, key_hi, *scalars,
            HEAD_DIM=head_dim, **blocks, HEAD_DIM_V=head_dim_v, BLOCK_DV=block_dv, BLOCK_DVT=block_dvt,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAVY_LAST=a.causal_only, TMA=tma, **constexprs,
            CARRY_IN=i > 0, CARRY_OUT=i < len(ranges) - 1,
        )
    return out, lse
