"""Validation of an attention call's arguments, once, into AttentionArgs.

Every check raises a ValueError or TypeError that names the argument: bad input never reaches a
kernel. The public functions (interface.py), ring attention and the block backward all validate
through here.
"""

from __future__ import annotations

import math

import torch

from ...settings import current as current_settings
from ..common.checks import as_float, as_int, check_cu_seqlens, check_float_tensor, check_triton_device
from .args import AttentionArgs
from .dropout import DropoutArgs, draw_seed_and_offset, dropout_threshold

__all__ = ["MAX_HEADDIM", "attention_args", "check_cu_seqlens", "check_qkv", "check_rotary_lengths",
           "check_triton_device", "last_dim_contiguous"]

MAX_HEADDIM = 256
# Tile-local offsets in the kernels are int32: up to 256 rows times the sequence stride.
_MAX_SEQ_STRIDE = (2**31 - 1) // 256


# ---------------------------------------------------------------- validation

def check_headdim(name: str, d: int) -> None:
    """Any head dim from 1 to MAX_HEADDIM; the triton backend pads others than multiples of 8
    (passes.py)."""
    if not 1 <= d <= MAX_HEADDIM:
        raise ValueError(f"{name} headdim must be between 1 and {MAX_HEADDIM}, got {d}")


def check_qkv(q, k, v, varlen: bool) -> None:
    rank, layout = (3, "(total, nheads, headdim)") if varlen else (4, "(batch, seqlen, nheads, headdim)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(name, t, rank, layout)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got q {q.device}, k {k.device}, v {v.device}")
    if not varlen and not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(f"batch mismatch: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[-3] != v.shape[-3]:
        raise ValueError(f"k and v must have the same seqlen, got k {k.shape[-3]}, v {v.shape[-3]}")
    nheads, nheads_k = q.shape[-2], k.shape[-2]
    if v.shape[-2] != nheads_k:
        raise ValueError(f"nheads mismatch: k has {nheads_k}, v has {v.shape[-2]}")
    if nheads_k < 1 or nheads % nheads_k != 0:
        raise ValueError(f"nheads mismatch: q's nheads ({nheads}) must be divisible by k/v's nheads ({nheads_k})")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"headdim mismatch: q {q.shape[-1]}, k {k.shape[-1]}")
    check_headdim("q/k", q.shape[-1])
    check_headdim("v", v.shape[-1])
    if any(s < 1 for s in q.shape[:-2] + k.shape[:-2]):
        raise ValueError(f"batch, seqlen_q and seqlen_k must be >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")


def check_scale(softmax_scale, headdim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(headdim)
    softmax_scale = as_float("softmax_scale", softmax_scale)
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale}")
    return float(softmax_scale)


def check_window(window_size, causal: bool) -> tuple[int, int]:
    try:  # a tuple, a list, a numpy array or a tensor of two integers
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}") from None
    left, right = as_int("window_size left", left), as_int("window_size right", right)
    for side, w in (("left", left), ("right", right)):
        if w < -1:
            raise ValueError(f"window_size {side} must be >= -1 (-1 means unbounded), got {w}")
    # flash-attn: causal is a window whose right edge is the diagonal.
    return left, (0 if causal else right)


def check_softcap(softcap) -> float:
    softcap = as_float("softcap", softcap)
    if not (math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap must be finite and >= 0 (0 disables it), got {softcap}")
    return float(softcap)


def check_alibi(alibi_slopes, batch: int, nheads: int, device) -> torch.Tensor | None:
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32:
        raise TypeError("alibi_slopes must be a float32 tensor")
    if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
        raise ValueError(f"alibi_slopes must have shape ({nheads},) or ({batch}, {nheads}), "
                         f"got {tuple(alibi_slopes.shape)}")
    if alibi_slopes.device != device:
        raise ValueError(f"alibi_slopes must be on {device}, got {alibi_slopes.device}")
    return alibi_slopes.contiguous()


def check_rotary(cos, sin, interleaved, headdim: int, lengths_q: list[int], lengths_k: list[int], device):
    """Returns contiguous (cos, sin) or (None, None). Query i sits at position i + seqlen_k - seqlen_q,
    so every position lies in [0, seqlen_k)."""
    if cos is None and sin is None:
        return None, None
    if cos is None or sin is None:
        raise ValueError("rotary_cos and rotary_sin must be given together")
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != 2:
            raise TypeError(f"{name} must be a 2-D floating-point tensor (seqlen, rotary_dim / 2)")
        if t.device != device:
            raise ValueError(f"{name} must be on {device}, got {t.device}")
    if cos.shape != sin.shape:
        raise ValueError(f"rotary_cos {tuple(cos.shape)} and rotary_sin {tuple(sin.shape)} differ in shape")
    if not isinstance(interleaved, bool):
        raise TypeError(f"rotary_interleaved must be a bool, got {type(interleaved).__name__}")
    rotary_dim = 2 * cos.shape[1]
    if not 0 < rotary_dim <= headdim:
        raise ValueError(f"rotary_dim (2 x {cos.shape[1]} = {rotary_dim}) must be in [2, headdim = {headdim}]")
    if lengths_q is not None:  # None while compiling: the custom op checks the lengths (custom_ops.py)
        check_rotary_lengths(cos, lengths_q, lengths_k)
    return cos.contiguous(), sin.contiguous()


def check_rotary_lengths(cos, lengths_q: list[int], lengths_k: list[int]) -> None:
    """Every query and key position lies inside the tables."""
    if cos.shape[0] < max(lengths_k):
        raise ValueError(f"rotary tables cover {cos.shape[0]} positions but seqlen_k is {max(lengths_k)}")
    if any(nq > nk for nq, nk in zip(lengths_q, lengths_k)):
        raise ValueError("rotary embeddings need seqlen_q <= seqlen_k: query i sits at position "
                         "i + seqlen_k - seqlen_q, which would be negative")


def check_dropout(dropout_p, seed, offset) -> DropoutArgs | None:
    """None for p = 0 (the kernels then compile without any dropout code)."""
    dropout_p = as_float("dropout_p", dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if dropout_p == 0.0:
        return None
    # The kernels draw 8 random bits per score (dropout.py), so p is rounded to a multiple of
    # 1/256; a p that rounds to 0 or to 1 would silently mean no dropout or dropping everything.
    threshold = dropout_threshold(dropout_p)
    if not 0 < threshold < 256:
        raise ValueError(f"dropout_p must be 0 or in [1/512, 1 - 1/512): the kernels draw 8 random bits per "
                         f"score and round p to a multiple of 1/256, which would turn {dropout_p} into "
                         f"{threshold}/256")
    if seed is None:
        if torch.compiler.is_compiling():  # drawn in the graph instead (custom_ops.flash_attn)
            return DropoutArgs(float(dropout_p), None, None)
        seed, offset = draw_seed_and_offset()
    seed, offset = as_int("dropout_seed", seed), as_int("dropout_offset", offset)
    for name, value, limit in (("dropout_seed", seed, 2**63), ("dropout_offset", offset, 2**31)):
        if not 0 <= value < limit:
            raise ValueError(f"{name} must be an int in [0, {limit}), got {value!r}")
    return DropoutArgs(float(dropout_p), seed, offset)


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    # The kernels take any batch/seq/head strides; only the channel stride must be 1.
    if t.stride(-1) != 1 or t.stride(-3) > _MAX_SEQ_STRIDE:
        t = t.contiguous()
    return t


def attention_args(q, lengths_q: list[int], lengths_k: list[int], dropout_p, softmax_scale, causal, window_size,
                   softcap, alibi_slopes, rotary_cos, rotary_sin, rotary_interleaved, dropout_seed, dropout_offset,
                   deterministic=True, **varlen) -> AttentionArgs:
    """Validate the non-tensor arguments shared by both public functions, once, into AttentionArgs.
    lengths_q/k are the per-sequence lengths (one entry for a fixed-length batch), or None for a
    packed batch while torch.compile traces (check_cu_seqlens)."""
    left, right = check_window(window_size, causal)
    cos, sin = check_rotary(rotary_cos, rotary_sin, rotary_interleaved, q.shape[-1], lengths_q, lengths_k, q.device)
    batch = varlen["cu_seqlens_q"].shape[0] - 1 if varlen else q.shape[0]
    return AttentionArgs(
        softmax_scale=check_scale(softmax_scale, q.shape[-1]), window_left=left, window_right=right,
        softcap=check_softcap(softcap), alibi_slopes=check_alibi(alibi_slopes, batch, q.shape[-2], q.device),
        rotary_cos=cos, rotary_sin=sin, rotary_interleaved=rotary_interleaved,
        dropout=check_dropout(dropout_p, dropout_seed, dropout_offset), deterministic=bool(deterministic),
        settings=current_settings(), **varlen)
