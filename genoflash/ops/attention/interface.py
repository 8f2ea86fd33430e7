"""`flash_attn_func`: validate -> choose a backend -> autograd.Function.

Argument names and layouts follow flash-attn, so code written for flash-attn switches
with one import.
"""

from __future__ import annotations

import math

import torch

from ...backends import select_backend, triton_interpreted
from .chunked import attention_chunked_backward, attention_chunked_forward
from .reference import attention_reference

MAX_HEADDIM = 256
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Tile-local offsets in the kernels are int32: up to 256 rows times the sequence stride.
_MAX_SEQ_STRIDE = (2**31 - 1) // 256


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor (float16, bfloat16 or float32), got {t.dtype}")
    if t.dim() != 4:
        raise ValueError(f"{name} must have rank 4 (batch, seqlen, nheads, headdim), got shape {tuple(t.shape)}")


def _check_inputs(q, k, v, softmax_scale) -> float:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got q {q.device}, k {k.device}, v {v.device}")
    batch, seqlen_q, nheads, headdim = q.shape
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"batch mismatch: q {batch}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same seqlen, got k {k.shape[1]}, v {v.shape[1]}")
    if k.shape[2] != nheads or v.shape[2] != nheads:
        raise ValueError(f"nheads mismatch: q {nheads}, k {k.shape[2]}, v {v.shape[2]}")
    if k.shape[3] != headdim or v.shape[3] != headdim:
        raise ValueError(f"headdim mismatch: q {headdim}, k {k.shape[3]}, v {v.shape[3]}")
    if headdim > MAX_HEADDIM or headdim % 8 != 0:
        raise ValueError(f"headdim must be a multiple of 8 and at most {MAX_HEADDIM}, got {headdim}")
    if batch < 1 or nheads < 1 or seqlen_q < 1 or k.shape[1] < 1:
        raise ValueError(f"batch, nheads, seqlen_q and seqlen_k must be >= 1, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    if softmax_scale is None:
        return 1.0 / math.sqrt(headdim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a float, got {type(softmax_scale).__name__}")
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale}")
    return float(softmax_scale)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    # The kernels take any batch/seq/head strides; only the channel stride must be 1.
    t = t if t.stride(-1) == 1 else t.contiguous()
    if t.stride(1) > _MAX_SEQ_STRIDE:
        t = t.contiguous()
    return t


def _triton_ops():
    # Imported lazily: triton is only needed for this backend.
    from .backward import attention_backward
    from .forward import attention_forward
    return attention_forward, attention_backward


def _check_triton_device(q: torch.Tensor) -> None:
    if q.dtype not in _TRITON_DTYPES:
        raise TypeError(f"the triton backend supports float16, bfloat16 and float32, got {q.dtype}")
    if q.device.type != "cuda" and not triton_interpreted():
        raise ValueError(f"the triton backend needs CUDA tensors (got {q.device}); on the CPU use the "
                         "'torch' backend, or set TRITON_INTERPRET=1 before importing genoflash")


class FlashAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, backend):
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
        if backend == "triton":
            forward, _ = _triton_ops()
            out, lse = forward(q, k, v, softmax_scale, causal)
        else:
            out, lse = attention_chunked_forward(q, k, v, softmax_scale, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.softmax_scale, ctx.causal, ctx.backend = softmax_scale, causal, backend
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dout = _last_dim_contiguous(dout)
        if ctx.backend == "triton":
            _, backward = _triton_ops()
            dq, dk, dv = backward(dout, q, k, v, out, lse, ctx.softmax_scale, ctx.causal)
        else:
            dq, dk, dv = attention_chunked_backward(dout, q, k, v, out, lse, ctx.softmax_scale, ctx.causal)
        return dq, dk, dv, None, None, None


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    return_lse: bool = False,
    deterministic: bool = True,
):
    """Exact attention with O(N) memory.

    Args:
        q: (batch, seqlen_q, nheads, headdim).
        k, v: (batch, seqlen_k, nheads, headdim). seqlen_k may differ from seqlen_q.
        softmax_scale: defaults to 1 / sqrt(headdim).
        causal: bottom-right aligned mask (flash-attn >= 2.1): query i sees keys
            j <= i + seqlen_k - seqlen_q. A query that sees no key gets output 0, lse -inf.
        return_lse: also return the log-sum-exp, float32 (batch, nheads, seqlen_q), natural log.
        deterministic: accepted for flash-attn compatibility. Every genoflash backward is
            deterministic (no atomics), so two backward passes are bitwise equal either way.

    Returns:
        out with q's shape and dtype, or (out, lse) when return_lse.
    """
    softmax_scale = _check_inputs(q, k, v, softmax_scale)
    backend = select_backend(q.device)
    if backend == "reference":
        out, lse = attention_reference(q, k, v, softmax_scale, causal)
        return (out, lse.detach()) if return_lse else out
    if backend == "triton":
        _check_triton_device(q)
    out, lse = FlashAttnFunc.apply(q, k, v, softmax_scale, bool(causal), backend)
    return (out, lse) if return_lse else out
