"""The carry walk over chunks: the state entering each chunk from each chunk's own final state and decay.

Chunks (or the forward's segments) depend on each other only through one state each: with S_c
the state chunk c reaches from a zero start and P_c = prod of its a's, the state entering chunk
c + 1 is H_{c+1} = P_c H_c + S_c. The forward walks its segments in order; both backwards walk
their chunks in reverse for the adjoint (X_{c-1} = S_c + P_c X_c). With many chunks (32k at a
million tokens) the walk is two-level, so its sequential depth is ~2 sqrt(n_chunks), not
n_chunks: groups of G chunks compose their (P, S) in parallel, one walk over the groups gives
each group's carry, and the groups expand it to their chunks in parallel.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..common.host import cdiv
from .recurrence import strides3


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


# Below this many chunks one sequential walk is short enough.
_ONE_LEVEL_CHUNKS = 16


def carry_walk(s_loc: torch.Tensor, decay: torch.Tensor, out: torch.Tensor, reverse: bool, cfg: dict) -> None:
    """out[c] = the carry into chunk c of the walk carry <- P_c carry + S_c (in chunk order, or
    reversed), from a zero start."""
    batch, n_chunks, dim, dstate = s_loc.shape
    blocks = dict(BLOCK_D=cfg["BLOCK_D"], BLOCK_N=cfg["BLOCK_N"], num_warps=4)
    grid = (batch, cdiv(dim, cfg["BLOCK_D"]))
    strides = strides3(s_loc)
    if n_chunks <= _ONE_LEVEL_CHUNKS:
        _scan_chunk_pass_kernel[grid](s_loc, decay, out, n_chunks, dim, dstate, *strides, REVERSE=reverse, **blocks)
        return
    group_size = max(2, math.isqrt(n_chunks))
    n_groups = cdiv(n_chunks, group_size)
    group_s, group_p, group_h = (torch.empty(batch, n_groups, dim, dstate, device=s_loc.device, dtype=torch.float32)
                                 for _ in range(3))
    g_strides = strides3(group_s)
    for expand in (False, True):
        if expand:  # the groups' carries: one walk over the composed groups, in walk order
            _scan_chunk_pass_kernel[grid](group_s, group_p, group_h, n_groups, dim, dstate, *g_strides,
                                          REVERSE=False, **blocks)
        _chunk_groups_kernel[(*grid, n_groups)](s_loc, decay, out, group_s, group_p, group_h, n_chunks, group_size,
                                                dim, dstate, *strides, *g_strides, EXPAND=expand, REVERSE=reverse,
                                                **blocks)
