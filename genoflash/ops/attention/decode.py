"""Split-KV decoding (flash-decoding): a few query rows against a long KV cache, read in place.

One new token per sequence leaves the training forward's grid (one program per 128 query rows)
nearly empty, so a decoding step would read the cache from a handful of SMs. Here the keys of each
sequence are split into `num_splits` parts and every (split, sequence, KV head) is a program:

    grid = (num_splits, batch * nheads_k, row blocks)

A program packs every query of its KV head's group as rows, row r = query r // G of head
hk * G + r % G (G = nheads // nheads_k), so K and V are read from HBM once per KV head, not once
per query head. It runs the online softmax over its part of the keys and writes a partial output
and its log-sum-exp; `_combine_kernel` merges the parts through their LSEs (a part that saw no key
has LSE -inf and weight 0). With one part the first kernel writes the output itself.

Keys of sequence b are the slots [leftpad[b], seqlens_k[b]) of its cache row (`cache_rows[b]`, or
b) or of its pages (`block_table[b]`, slot t in page block_table[b, t // page_size], row
t % page_size); key j counts from leftpad, and the masks (causal, window, ALiBi) are bottom-right
aligned to each sequence's own key count, as in the training kernels. An optional key mask
(batch, capacity) drops single slots (transformers' padding mask). Every index tensor lives on the
device and is read by the kernel, so a decoding step needs no host synchronisation and no
recompilation as the cache grows: the lengths are data, not constants.

The split count and tile sizes come from measurements (docs/design/decoding.md). A kind of call
seen before is launched as a step: its compiled kernels' launchers called with the new arguments
(below), which keeps a decoding step's host time near SDPA's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.runtime import driver

from ...backends import triton_interpreted
from ...settings import current as current_settings
from ..common.host import cdiv, next_power_of_2, sm_count
from .configs import LaunchConfig
from .kernel_args import input_precision
from . import launch as launcher, plans
from .launch import launch
from .mask import _visible
from .score_mods import _alibi_bias, _softcap
from .softmax import LOG2E_HOST, _finalize_softmax, _online_softmax_update


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """The split kernel's tile and pipelining, and how finely a call splits its keys: the most
    splits whose grid fits `programs_per_sm` programs on every SM, while each split keeps at least
    `min_keys_per_split` keys, up to `max_splits`. `pdl`: where the GPU has programmatic dependent
    launch (sm_90+), the combine kernel starts while the split kernel's last programs run, and
    waits for them (gdc_wait) before it reads a part. `kv_heads_per_program`: KV heads read side
    by side by one program (where `_heads_per_program` allows), so that a program keeps twice the
    bytes in flight (docs/design/decoding.md, "On the H200")."""
    block_n: int = 32
    num_warps: int = 4
    num_stages: int = 2
    programs_per_sm: int = 4
    min_keys_per_split: int = 256
    max_splits: int = 128
    pdl: bool = True
    kv_heads_per_program: int = 1

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type in ("int", int) and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"DecodeConfig.{field.name} must be a positive int, got {value!r}")
        if self.block_n & (self.block_n - 1) or self.block_n < 16:
            raise ValueError(f"DecodeConfig.block_n must be a power of two of at least 16, got {self.block_n}")

    @functools.cached_property
    def launch_config(self) -> LaunchConfig:
        return LaunchConfig(self.num_warps, self.num_stages)


# Chosen by `genoflash bench decode --sweep` (docs/design/decoding.md): on an H100, for every
# device without an entry below. A device whose HBM feeds each SM faster needs more of the cache
# in flight per SM: per device-name fragment, (contiguous cache, paged cache). `use_config`
# replaces them all for the sweep.
DEFAULT_CONFIG = DecodeConfig()
DEVICE_CONFIGS = {"H200": (DecodeConfig(kv_heads_per_program=2), DecodeConfig(programs_per_sm=6))}
_override: DecodeConfig | None = None
COMBINE_CONFIG = LaunchConfig(num_warps=4, num_stages=1)
COMBINE_CONFIG_PDL = dataclasses.replace(COMBINE_CONFIG, pdl=True)
MAX_ROWS = 128  # query rows per KV head (seqlen_q x group) up to which decoding takes this path
INTERPRETER_SMS = 4  # the CPU interpreter has no SMs: a small count still exercises the splits


# seqlen_k_fixed grows by one per decoding step: specialising on its divisibility would compile the
# kernel twice over a generation for nothing.
@triton.jit(do_not_specialize=["seqlen_k_fixed"])
def _decode_split_kernel(
    Q, K, V, Out, Lse, OutPart, LsePart,
    SeqlensK, Leftpad, CacheRows, BlockTable, KeyMask, Alibi,
    stride_kb, stride_kn, stride_kh,  # the cache's strides, which grow with it in transformers' layout
    stride_vb, stride_vn, stride_vh,
    stride_mask,
    stride_qb, stride_qs, stride_qh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    stride_bt, stride_alibi,
    batch, seqlen_q, nheads, num_splits, page_size, seqlen_k_fixed,
    qk_scale_log2, inv_scale, window_left, window_right, softcap_in, softcap_out,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, GROUP: tl.constexpr, HEADS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_SEQLENS: tl.constexpr, HAS_LEFTPAD: tl.constexpr, HAS_ROWS: tl.constexpr, PAGED: tl.constexpr,
    HAS_KEY_MASK: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    FAST_TANH: tl.constexpr, SPLIT: tl.constexpr, STORE_LSE: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    LAUNCH_DEPENDENTS: tl.constexpr,
):
    if LAUNCH_DEPENDENTS:  # the combine kernel may be scheduled now; it waits for this grid to finish
        gdc_launch_dependents()
    split = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_m = tl.program_id(2)
    b = pid_bh // (nheads // GROUP // HEADS)
    hk = pid_bh % (nheads // GROUP // HEADS) * HEADS  # the first of this program's HEADS KV heads

    # Packed rows: query i of head (hk + j) * GROUP + g is row (i * HEADS + j) * GROUP + g. With
    # HEADS KV heads side by side, a K row holds HEADS heads' channels one after the other (column
    # c: channel c % HEAD_DIM of KV head hk + c // HEAD_DIM), and a query row is zero outside its
    # own head's channels, so one matmul gives each row the scores against its own head's keys
    # (and P V each row's output in its head's columns).
    offs_r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q_idx = offs_r // (GROUP * HEADS)
    row_kv = offs_r // GROUP % HEADS  # the row's KV head, counted from hk
    head = (hk + row_kv) * GROUP + offs_r % GROUP
    row_ok = q_idx < seqlen_q
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    b64 = b.to(tl.int64)
    # A head's offset in a heads-first cache (transformers' (batch, heads, capacity, dim), read in
    # place) passes 2^31 elements at 32 heads of 1M keys: int64.
    col_kv = (hk + offs_d // HEAD_DIM).to(tl.int64)  # each K column's KV head
    col_v = (hk + offs_dv // HEAD_DIM_V).to(tl.int64)
    k_cols = col_kv * stride_kh + offs_d % HEAD_DIM
    v_cols = col_v * stride_vh + offs_dv % HEAD_DIM_V
    d_ok = offs_d < HEAD_DIM * HEADS
    dv_ok = offs_dv < HEAD_DIM_V * HEADS
    q_ptrs = (Q + b64 * stride_qb + q_idx[:, None].to(tl.int64) * stride_qs + head[:, None] * stride_qh
              + (offs_d % HEAD_DIM)[None, :])
    own_d = (offs_d // HEAD_DIM)[None, :] == row_kv[:, None]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :] & own_d, other=0.0)

    # This sequence's keys, counted from its first slot, and the part this program reads.
    start = 0
    if HAS_LEFTPAD:
        start = tl.load(Leftpad + b)
    end = seqlen_k_fixed
    if HAS_SEQLENS:
        end = tl.load(SeqlensK + b)
    seqlen_k = end - start
    first_q = pid_m * BLOCK_M // (GROUP * HEADS)
    last_q = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // (GROUP * HEADS), seqlen_q - 1)
    lo = 0
    hi = seqlen_k
    if HAS_LEFT:  # keys left of every row's window are never read
        lo = tl.maximum(first_q + seqlen_k - seqlen_q - window_left, 0)
    if HAS_RIGHT:  # nor keys right of it (causal is window_right = 0)
        hi = tl.minimum(last_q + seqlen_k - seqlen_q + window_right + 1, seqlen_k)
    hi = tl.maximum(hi, lo)
    # Equal parts in whole tiles: a part's tiles start BLOCK_N-aligned from lo.
    chunk = tl.cdiv(tl.cdiv(hi - lo, num_splits), BLOCK_N) * BLOCK_N
    n_start = lo + split * chunk
    n_end = tl.minimum(n_start + chunk, hi)

    row = b64
    if HAS_ROWS:
        row = tl.load(CacheRows + b).to(tl.int64)
    slope = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_ALIBI:
        slope = tl.load(Alibi + b * stride_alibi + head, mask=row_ok, other=0.0) * inv_scale

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    for n0 in range(n_start, n_end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < n_end
        slot = start + cols
        if PAGED:
            page = tl.load(BlockTable + b64 * stride_bt + slot // page_size, mask=col_ok, other=0).to(tl.int64)
            k_rows = page * stride_kb + (slot % page_size).to(tl.int64) * stride_kn
            v_rows = page * stride_vb + (slot % page_size).to(tl.int64) * stride_vn
        else:
            k_rows = row * stride_kb + slot.to(tl.int64) * stride_kn
            v_rows = row * stride_vb + slot.to(tl.int64) * stride_vn
        k = tl.load(K + k_rows[:, None] + k_cols[None, :], mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
        if HAS_SOFTCAP:
            s, _ = _softcap(s, softcap_in, softcap_out, FAST_TANH)
        if HAS_ALIBI:
            s += _alibi_bias(q_idx[:, None], cols[None, :], seqlen_q, seqlen_k, slope[:, None])
        visible = col_ok[None, :] & _visible(q_idx[:, None], cols[None, :], seqlen_q, seqlen_k, window_left,
                                             window_right, HAS_LEFT, HAS_RIGHT)
        if HAS_KEY_MASK:
            keep = tl.load(KeyMask + b64 * stride_mask + slot, mask=col_ok, other=0)
            visible = visible & (keep != 0)[None, :]
        s = tl.where(visible, s, float("-inf"))
        p, alpha, m_i, l_i = _online_softmax_update(s, m_i, l_i, qk_scale_log2, True)
        v = tl.load(V + v_rows[:, None] + v_cols[None, :], mask=col_ok[:, None] & dv_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
    out, lse = _finalize_softmax(acc, m_i, l_i)
    # A row's output is its own head's columns.
    out_ok = row_ok[:, None] & dv_ok[None, :] & ((offs_dv // HEAD_DIM_V)[None, :] == row_kv[:, None])
    out_col = (offs_dv % HEAD_DIM_V)[None, :]

    if SPLIT:  # partials (num_splits, batch, nheads, seqlen_q[, HEAD_DIM_V]) in float32
        part = ((split * batch + b64) * nheads + head) * seqlen_q + q_idx
        tl.store(LsePart + part, lse, mask=row_ok)
        tl.store(OutPart + part[:, None] * HEAD_DIM_V + out_col, out, mask=out_ok)
    else:
        o_ptrs = Out + b64 * stride_ob + q_idx[:, None].to(tl.int64) * stride_os + head[:, None] * stride_oh
        tl.store(o_ptrs + out_col, out.to(Out.dtype.element_ty), mask=out_ok)
        if STORE_LSE:
            tl.store(Lse + b64 * stride_lb + head * stride_lh + q_idx, lse, mask=row_ok)


@triton.jit
def _combine_kernel(OutPart, LsePart, Out, Lse, batch, nheads, seqlen_q, num_splits,
                    stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                    HEAD_DIM_V: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr, STORE_LSE: tl.constexpr,
                    WAIT_PRIOR: tl.constexpr):
    """One output row (b, head, i): the parts weighted by exp(lse_part - lse)."""
    if WAIT_PRIOR:  # launched as a dependent of the split kernel: no part is read before it has finished
        gdc_wait()
    r = tl.program_id(0)
    i = r % seqlen_q
    head = (r // seqlen_q) % nheads
    b = r // (seqlen_q * nheads)
    rows = batch * nheads * seqlen_q
    parts = tl.arange(0, BLOCK_S)
    part_ok = parts < num_splits
    lse_parts = tl.load(LsePart + parts * rows + r, mask=part_ok, other=float("-inf"))
    m = tl.max(lse_parts, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # every part empty: all weights are exp(-inf) = 0
    w = tl.exp(lse_parts - m_safe)
    total = tl.sum(w, 0)
    offs_dv = tl.arange(0, BLOCK_DV)
    o = tl.load(OutPart + (parts[:, None].to(tl.int64) * rows + r) * HEAD_DIM_V + offs_dv[None, :],
                mask=part_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    lse = tl.where(total == 0.0, float("-inf"), m_safe + tl.log(total))
    b64 = b.to(tl.int64)
    tl.store(Out + b64 * stride_ob + i * stride_os + head * stride_oh + offs_dv, out.to(Out.dtype.element_ty),
             mask=offs_dv < HEAD_DIM_V)
    if STORE_LSE:
        tl.store(Lse + b64 * stride_lb + head * stride_lh + i, lse)


@functools.lru_cache(maxsize=None)
def _has_pdl(device_index: int) -> bool:
    """Whether the device launches programmatic dependents (sm_90+; never the interpreter's CPU, -1)."""
    return device_index >= 0 and not triton_interpreted() and torch.cuda.get_device_capability(device_index)[0] >= 9


def _sm_count(device_index: int) -> int:
    """SMs of a CUDA device; the interpreter's stand-in count for the CPU (index -1)."""
    return INTERPRETER_SMS if device_index < 0 else sm_count(device_index)


def _splits_for(programs: int, sms: int, cfg: DecodeConfig) -> int:
    """The most parts per sequence worth having: as many as fit `programs_per_sm` programs on every
    SM (a decoding step is a stream of K and V from HBM, and each SM needs loads from several
    programs in flight), rounded down, so that no program is left over to load some SMs more than
    the others (docs/design/decoding.md, "How many parts")."""
    return max(1, min(cfg.programs_per_sm * sms // max(programs, 1), cfg.max_splits))


def _split_count(most_splits: int, max_keys: int, cfg: DecodeConfig) -> int:
    """At most `most_splits` parts, none so short that the combine's reads and the per-part setup
    outweigh them."""
    return max(1, min(most_splits, cdiv(max_keys, cfg.min_keys_per_split)))


@functools.lru_cache(maxsize=None)
def _device_configs(device_index: int) -> tuple[DecodeConfig, DecodeConfig]:
    """(contiguous, paged) configs of a CUDA device; the defaults for the interpreter's CPU (-1)."""
    name = torch.cuda.get_device_name(device_index) if device_index >= 0 else ""
    return next((cfgs for fragment, cfgs in DEVICE_CONFIGS.items() if fragment in name),
                (DEFAULT_CONFIG, DEFAULT_CONFIG))


def config_for(device_index: int, paged: bool) -> DecodeConfig:
    """The configuration a call on this device (-1: the CPU) and cache layout runs with."""
    if _override is not None:
        return _override
    return _device_configs(device_index)[paged]


def _heads_per_program(cfg: DecodeConfig, rows: int, nheads_k: int) -> int:
    """KV heads side by side in a program: cfg's where they divide the KV heads and their rows
    together still fit tl.dot's 16-row minimum block, so that the wider tile costs no rows (a
    decoding step's few query rows); else 1. (At 64 rows, two heads' 64 x 256 float32
    accumulator takes the kernel to 255 registers.)"""
    heads = cfg.kv_heads_per_program
    return heads if nheads_k % heads == 0 and rows * heads <= 16 else 1


def choose_splits(batch: int, nheads: int, nheads_k: int, max_keys: int, device: torch.device,
                  paged: bool = False) -> int:
    """Parts per sequence for one query row per head (a decoding step) of `batch` sequences."""
    index = device.index or 0 if device.type == "cuda" else -1
    cfg = config_for(index, paged)
    heads = _heads_per_program(cfg, rows_per_kv_head(1, nheads, nheads_k), nheads_k)
    return _split_count(_splits_for(batch * nheads_k // heads, _sm_count(index), cfg), max_keys, cfg)


@contextlib.contextmanager
def use_config(**changes):
    """DecodeConfig's fields changed from the defaults (DEFAULT_CONFIG) inside this block, for the
    whole process, every device and layout (`bench decode --sweep`, tests); decoding steps are kept
    per configuration."""
    global _override
    saved, _override = _override, dataclasses.replace(_override or DEFAULT_CONFIG, **changes)
    try:
        yield _override
    finally:
        _override = saved


@functools.lru_cache(maxsize=1024)
def _geometry(batch: int, seqlen_q: int, nheads: int, nheads_k: int, headdim_v: int, device_index: int,
              cfg: DecodeConfig) -> tuple:
    """What a call's shapes fix, computed once per shape (a decoding step's host time counts):
    the GQA group, the KV heads per program, the row block, the grid's last two axes, the most
    useful split count, the fresh output's and LSE's strides, and whether the combine is a
    programmatic dependent."""
    group = nheads // nheads_k
    heads = _heads_per_program(cfg, rows_per_kv_head(seqlen_q, nheads, nheads_k), nheads_k)
    rows = rows_per_kv_head(seqlen_q, nheads, nheads_k) * heads
    block_m = max(16, min(64, next_power_of_2(rows)))  # tl.dot takes 16 rows at least
    grid_bh, grid_m = batch * nheads_k // heads, cdiv(rows, block_m)
    out_strides = (seqlen_q * nheads * headdim_v, nheads * headdim_v, headdim_v)
    lse_strides = (nheads * seqlen_q, seqlen_q)
    return (group, heads, block_m, grid_bh, grid_m, _splits_for(grid_bh * grid_m, _sm_count(device_index), cfg),
            out_strides, lse_strides, cfg.pdl and _has_pdl(device_index))


@functools.lru_cache(maxsize=256)
def _split_constexprs(headdim: int, headdim_v: int, group: int, heads: int, block_m: int, has_seqlens: bool,
                      has_leftpad: bool, has_rows: bool, paged: bool, has_mask: bool, has_alibi: bool,
                      has_left: bool, has_right: bool, has_softcap: bool, dtype: torch.dtype, split: bool,
                      store_lse: bool, block_n: int, pdl: bool) -> dict:
    """The split kernel's constexprs for one kind of call, built once: a decoding step's host time
    counts (docs/design/launch-path.md). launch() takes them as **kwargs, a copy."""
    return dict(
        HEAD_DIM=headdim, HEAD_DIM_V=headdim_v, GROUP=group, HEADS=heads,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, next_power_of_2(headdim * heads)),
        BLOCK_DV=max(16, next_power_of_2(headdim_v * heads)),
        HAS_SEQLENS=has_seqlens, HAS_LEFTPAD=has_leftpad, HAS_ROWS=has_rows,
        PAGED=paged, HAS_KEY_MASK=has_mask, HAS_LEFT=has_left, HAS_RIGHT=has_right,
        HAS_SOFTCAP=has_softcap, HAS_ALIBI=has_alibi,
        FAST_TANH=dtype != torch.float32 and not triton_interpreted(), SPLIT=split,
        STORE_LSE=store_lse, INPUT_PRECISION=input_precision(dtype), LAUNCH_DEPENDENTS=split and pdl,
    )


def rows_per_kv_head(seqlen_q: int, nheads: int, nheads_k: int) -> int:
    return seqlen_q * (nheads // nheads_k)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     seqlens_k: torch.Tensor | None, max_seqlen_k: int, *, softmax_scale: float,
                     window_left: int = -1, window_right: int = -1,
                     softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                     leftpad: torch.Tensor | None = None, cache_rows: torch.Tensor | None = None,
                     block_table: torch.Tensor | None = None, key_mask: torch.Tensor | None = None,
                     num_splits: int = 0, return_lse: bool = True,
                     heads_first: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of q (batch, seqlen_q, nheads, headdim) against keys read in place from a cache.

    k_cache, v_cache: (batch_cache, capacity, nheads_k, headdim[_v]) with any strides but the
    channels', or paged (num_blocks, page_size, nheads_k, headdim[_v]) with block_table.
    heads_first: q is (batch, nheads, seqlen_q, headdim) and the caches (batch_cache, nheads_k,
    capacity, headdim[_v]), transformers' layout, read as they are (not with block_table). seqlens_k,
    leftpad, cache_rows: int32 (batch,) device tensors (sequence b's keys are slots
    [leftpad[b], seqlens_k[b]) of cache row cache_rows[b]); seqlens_k None means max_seqlen_k for
    every sequence. key_mask: (batch, capacity) bool or uint8, nonzero where a slot holds a key.
    max_seqlen_k: a host bound on the key counts, which also chooses the split count. The caller
    validates every index (kvcache.check_cache does); this function trusts them.
    Returns (out (batch, seqlen_q, nheads, headdim_v) in q's dtype, lse (batch, nheads, seqlen_q)
    float32, natural log); lse is None where return_lse is False (then no kernel stores it)."""
    q_stride, k_stride, v_stride = q.stride(), k_cache.stride(), v_cache.stride()
    if heads_first and block_table is not None:
        raise ValueError("heads_first takes contiguous-slot caches, not pages (block_table)")
    if heads_first:  # (the kernels take batch, position and head strides in that order)
        batch, nheads, seqlen_q, headdim = q.shape
        nheads_k, headdim_v = k_cache.shape[1], v_cache.shape[3]
        q_ints = (q_stride[0], q_stride[2], q_stride[1])
        cache_ints = (k_stride[0], k_stride[2], k_stride[1], v_stride[0], v_stride[2], v_stride[1])
    else:
        batch, seqlen_q, nheads, headdim = q.shape
        nheads_k, headdim_v = k_cache.shape[2], v_cache.shape[3]
        q_ints, cache_ints = q_stride[:3], (*k_stride[:3], *v_stride[:3])
    cfg = config_for(q.get_device(), block_table is not None)
    group, heads, block_m, grid_bh, grid_m, most_splits, out_strides, lse_strides, pdl = _geometry(
        batch, seqlen_q, nheads, nheads_k, headdim_v, q.get_device(), cfg)
    if num_splits <= 0:
        num_splits = _split_count(most_splits, max_seqlen_k, cfg)
    grid = (num_splits, grid_bh, grid_m)
    split = num_splits > 1
    paged = block_table is not None
    mask = key_mask.view(torch.uint8) if key_mask is not None and key_mask.dtype == torch.bool else key_mask
    optional = (seqlens_k, leftpad, cache_rows, block_table, mask, alibi_slopes)
    # The split kernel's scalars in parameter order: the cache's strides (which grow with a cache in
    # transformers' layout, so a step's key holds them as triton specialises them, not by value:
    # 1, or whether 16 divides them, as launch._int_key for ints >= 0 that fit 32 bits),
    # the other ints up to seqlen_k_fixed (max_seqlen_k), then the scales, windows and softcap factors.
    cache_ints = (*cache_ints, mask.stride(0) if mask is not None else 0)
    ints = (*q_ints, *out_strides, *lse_strides, block_table.stride(0) if paged else 0,
            alibi_slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0,
            batch, seqlen_q, nheads, num_splits, k_cache.shape[1] if paged else 1)
    tail = (softmax_scale * LOG2E_HOST, 1.0 / softmax_scale, window_left, window_right,
            softmax_scale / softcap if softcap > 0 else 0.0, softcap / softmax_scale if softcap > 0 else 0.0)
    kind = (headdim, headdim_v, group, heads, block_m, seqlens_k is not None, leftpad is not None,
            cache_rows is not None, paged, mask is not None, alibi_slopes is not None, window_left >= 0,
            window_right >= 0, softcap > 0, q.dtype, split, return_lse)

    out = q.new_empty(batch, seqlen_q, nheads, headdim_v)
    lse = torch.empty(batch, nheads, seqlen_q, device=q.device, dtype=torch.float32) if return_lse else None
    # One float32 scratch (one allocation: a decoding step's host time counts) holds the partial
    # outputs (num_splits, batch, nheads, seqlen_q, headdim_v) and then their LSEs, from a 16-byte
    # boundary, as the kernels were compiled for.
    n_lse = batch * nheads * seqlen_q
    n_part = num_splits * n_lse if split else 0
    at_lse_part = _round4(n_part * headdim_v)
    scratch = torch.empty(at_lse_part + n_part, device=q.device, dtype=torch.float32) if split else None

    fast = current_settings().fast_launch
    key = None
    if fast and plans.usable():  # (never under the interpreter, the only way CPU tensors reach these kernels)
        qkv = (q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr())
        # Steps replay kernels compiled for 16-byte aligned tensors and ints that fit 32 bits.
        aligned = not (qkv[0] | qkv[1] | qkv[2]) & 15 and not any(t.data_ptr() & 15 for t in optional if t is not None)
        if aligned and max(cache_ints) < _INT32_END and max(ints) < _INT32_END:
            switches = plans.switches()  # (..., the current device, whose stream the launches go to)
            key = (kind, tuple([2 if x == 1 else x % 16 == 0 for x in cache_ints]), ints, window_left, window_right,
                   max_seqlen_k < _INT32_END, k_cache.dtype, v_cache.dtype,
                   *(t.dtype for t in optional if t is not None), *switches,
                   _override)  # (the default for this device and layout is fixed by the key's other fields)
            step = _steps.get(key, launcher.MISSING)
            if step is None:
                key = None  # this kind of step cannot be replayed
            elif step is not launcher.MISSING:
                step.run(switches[2], grid, qkv, out, lse, scratch, n_lse, at_lse_part, optional,
                         (*cache_ints, *ints, max_seqlen_k, *tail), (batch, nheads, seqlen_q, num_splits, *out_strides,
                                                                     *lse_strides))
                return out, lse

    # The usual path: launch() (after the first call of a specialisation it calls the compiled
    # kernel directly, launch.py), with each tensor argument a tensor; recorded where it may
    # become a step.
    lse_out = lse if return_lse else out  # not written where STORE_LSE is off
    out_part = scratch[:n_part * headdim_v] if split else out  # ... nor the partials where SPLIT is off
    lse_part = scratch[at_lse_part:] if split else lse_out

    def launches():
        launch(_decode_split_kernel, grid, cfg.launch_config,
               *_split_pointers(q, k_cache, v_cache, out, lse_out, out_part, lse_part, optional, out),
               *cache_ints, *ints, max_seqlen_k, *tail, **_split_constexprs(*kind, cfg.block_n, pdl))
        if split:
            launch(_combine_kernel, (n_lse,), COMBINE_CONFIG_PDL if pdl else COMBINE_CONFIG, out_part, lse_part, out,
                   lse_out, batch, nheads, seqlen_q, num_splits, *out_strides, *lse_strides,
                   HEAD_DIM_V=headdim_v, BLOCK_S=max(2, next_power_of_2(num_splits)),
                   BLOCK_DV=max(16, next_power_of_2(headdim_v)), STORE_LSE=return_lse, WAIT_PRIOR=pdl)

    with launcher.record_launches() if key is not None else contextlib.nullcontext() as recorded:
        launches() if fast else launcher.without_fast_launch(launches)  # the setting off: triton's own launcher
    if key is not None:
        if len(_steps) >= _STEPS_MAX:
            _steps.clear()
        _steps[key] = _Step.build(recorded)
    return out, lse


# ---------------------------------------------------------------- steps: a decoding step's host path
#
# Generation calls decode_attention once per layer per token with arguments that differ only in
# the addresses, the key count and the strides of a growing cache, and the host sets the pace
# (docs/design/decoding.md, "Where the host time went"). A step keeps, per kind of call, the two
# compiled kernels' launchers, and calls them with the new arguments: no per-launch
# specialisation over ~50 arguments. Its key is what the kernels were compiled for (constexprs,
# argument dtypes, the ints as triton specialises them, 16-byte alignment), so a call it answers
# runs the very kernels the usual path would run.

_steps: dict = {}  # key -> _Step, or None: this kind of step is launched the usual way
_STEPS_MAX = 256
_INT32_END = 2**31


def _round4(n: int) -> int:
    """n float32 elements rounded up to whole 16 bytes."""
    return (n + 3) & ~3


def _split_pointers(q, k_cache, v_cache, out, lse, out_part, lse_part, optional, dummy) -> tuple:
    """The split kernel's pointer arguments, as tensors or as addresses; `dummy` stands for the
    optional tensors a call does not have (never read)."""
    return (q, k_cache, v_cache, out, lse, out_part, lse_part, *(t if t is not None else dummy for t in optional))


class _Step:
    """The split and combine kernels of one kind of decoding step, called as plans.replayer does."""
    __slots__ = ("split", "combine")

    def __init__(self, split, combine):
        self.split, self.combine = split, combine

    @classmethod
    def build(cls, recorded: list) -> "_Step | None":
        launches = [plans.replayer(entry) for entry in recorded]
        if not launches or None in launches:
            return None
        return cls(launches[0], launches[1] if len(launches) > 1 else None)

    def run(self, device, grid, qkv, out, lse, scratch, n_lse, at_lse_part, optional, scalars,
            combine_ints) -> None:
        """decode_attention's launches as its usual path makes them (_split_pointers' order), each
        tensor given as its address, unused pointers as `out`'s."""
        out_p = out.data_ptr()
        lse_p = lse.data_ptr() if lse is not None else out_p
        part_p = scratch.data_ptr() if scratch is not None else out_p
        lse_part_p = part_p + 4 * at_lse_part if scratch is not None else lse_p  # float32 elements
        stream = driver.active.get_current_stream(device)
        self.split(*grid, stream, *qkv, out_p, lse_p, part_p, lse_part_p,
                   *[t.data_ptr() if t is not None else out_p for t in optional], *scalars)
        if self.combine is not None:
            self.combine(n_lse, 1, 1, stream, part_p, lse_part_p, out_p, lse_p, *combine_ints)


@torch.library.custom_op("genoflash::decode_attention", mutates_args=())
def decode_attention_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        seqlens_k: Optional[torch.Tensor], max_seqlen_k: int, softmax_scale: float, window_left: int,
                        window_right: int, softcap: float, alibi_slopes: Optional[torch.Tensor],
                        leftpad: Optional[torch.Tensor], cache_rows: Optional[torch.Tensor],
                        block_table: Optional[torch.Tensor], key_mask: Optional[torch.Tensor],
                        num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """decode_attention as one graph node, for callers traced by torch.compile (transformers
    compiles a static cache's decoding step): Dynamo cannot trace the launch code
    (docs/design/custom-ops.md)."""
    return decode_attention(q, k_cache, v_cache, seqlens_k, max_seqlen_k, softmax_scale=softmax_scale,
                            window_left=window_left, window_right=window_right, softcap=softcap,
                            alibi_slopes=alibi_slopes, leftpad=leftpad, cache_rows=cache_rows,
                            block_table=block_table, key_mask=key_mask, num_splits=num_splits)


@decode_attention_op.register_fake
def _(q, k_cache, v_cache, *rest):
    batch, seqlen_q, nheads, _ = q.shape
    return (q.new_empty(batch, seqlen_q, nheads, v_cache.shape[-1]),
            q.new_empty(batch, nheads, seqlen_q, dtype=torch.float32))
