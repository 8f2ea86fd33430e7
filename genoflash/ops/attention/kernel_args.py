"""Host-side launch arguments that the forward and both backwards share.

The attention kernels take the same geometry, strides, feature scalars and constexpr switches in
each pass; they are computed here, once per call, from the validated AttentionArgs. Nothing here
launches or allocates beyond the LSE, and nothing imports a pass: forward.py, backward.py and
backward_sm90.py import this module, never each other.
"""

from __future__ import annotations

import torch

from ...backends import triton_interpreted
from ..common.host import next_power_of_2
from .args import AttentionArgs
from .configs import channel_blocks
from .dropout import kernel_seed
from .softmax import LOG2E_HOST


def input_precision(dtype: torch.dtype) -> str:
    # fp32 inputs must not silently drop to tf32: genoflash promises fp32 accuracy for fp32.
    return "ieee" if dtype == torch.float32 else "tf32"


def head_block(head_dim: int) -> int:
    # tl.dot needs every dimension >= 16; smaller or non-power-of-two head dims are padded by masks.
    return max(16, next_power_of_2(head_dim))


def qk_blocks(head_dim: int, rotary_dim: int) -> dict:
    """Block widths of the channel groups a Q/K tile is held as (channel_groups.py): the rotating pairs'
    halves (BLOCK_R) and the pass-through channels (all channels without RoPE) as a main group
    (BLOCK_P) and, where the width is not a power of two, a tail (BLOCK_T; configs.channel_blocks).

    With RoPE the pass-through channels stay one padded group unless a test forces the split: at
    sm_90 the split made ptxas serialise the RoPE dQ pass's wgmma at D 128 with 32 rotating
    channels (tools/offline_compile.py, note C7515), so it waits for a GPU timing there."""
    width = head_dim - rotary_dim
    block_p, block_t = channel_blocks(width, split_by_default=rotary_dim == 0) if width > 0 else (16, 0)
    return dict(BLOCK_R=head_block(rotary_dim // 2) if rotary_dim else 16, BLOCK_P=block_p, BLOCK_T=block_t)


def seq_strides(t: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, seq, head) strides of (batch, seq, head, dim), or of packed (total, head, dim)
    where the batch stride is 0 and sequences are found through cu_seqlens."""
    if varlen:
        return 0, t.stride(0), t.stride(1)
    return t.stride(0), t.stride(1), t.stride(2)


def kernel_geometry(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: AttentionArgs):
    """(batch, nheads, nheads_k, seqlen_q, seqlen_k) as the kernels see them (max lengths in varlen)."""
    if a.varlen:
        return a.cu_seqlens_q.numel() - 1, q.shape[1], k.shape[1], a.max_seqlen_q, a.max_seqlen_k
    return q.shape[0], q.shape[2], k.shape[2], q.shape[1], k.shape[1]


def feature_args(q: torch.Tensor, a: AttentionArgs) -> tuple[list, dict]:
    """Runtime scalars and constexpr switches shared by the forward and backward kernels."""
    scale = a.softmax_scale
    alibi = a.alibi_slopes
    d = a.dropout
    scalars = [scale * LOG2E_HOST, a.window_left, a.window_right,
               scale / a.softcap if a.softcap > 0 else 0.0, a.softcap / scale if a.softcap > 0 else 0.0,
               1.0 / scale, kernel_seed(d), d.offset if d else 0, d.threshold if d else 0,
               d.rescale if d else 1.0]
    constexprs = dict(
        IS_VARLEN=a.varlen, HAS_LEFT=a.window_left >= 0, HAS_RIGHT=a.window_right >= 0,
        HAS_SOFTCAP=a.softcap > 0, HAS_ALIBI=alibi is not None,
        FAST_TANH=q.dtype != torch.float32 and not triton_interpreted(),
        ROTARY_DIM=a.rotary_dim, ROTARY_INTERLEAVED=a.rotary_interleaved, HAS_DROPOUT=d is not None,
        INPUT_PRECISION=input_precision(q.dtype),
    )
    return scalars, constexprs


def alibi_pointer(q: torch.Tensor, a: AttentionArgs) -> tuple[torch.Tensor, int]:
    """ALiBi slopes and their batch stride (0 for per-head slopes); a dummy when unused."""
    if a.alibi_slopes is None:
        return q, 0  # never read: HAS_ALIBI is False
    slopes = a.alibi_slopes
    return slopes, (slopes.stride(0) if slopes.dim() == 2 else 0)


def lse_layout(batch: int, nheads: int, seqlen_q: int, total_q: int, varlen: bool, device):
    """LSE as flash-attn lays it out: (batch, nheads, seqlen_q), or (nheads, total_q) for varlen.
    Returns (lse, batch stride, head stride)."""
    if varlen:
        lse = torch.empty((nheads, total_q), device=device, dtype=torch.float32)
        return lse, 0, lse.stride(0)
    lse = torch.empty((batch, nheads, seqlen_q), device=device, dtype=torch.float32)
    return lse, lse.stride(0), lse.stride(1)
