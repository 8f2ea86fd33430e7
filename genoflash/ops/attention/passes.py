"""An attention call's forward and backward on a chosen backend: what interface.py's autograd
Function and custom_ops.py's ops both run, so that eager and compiled calls run the same code.

`triton` runs the kernels (forward.py, backward.py), which rotate q and k on chip; `torch` runs
chunked.py's tiled online softmax in PyTorch ops, after rotating q and k here.
"""

from __future__ import annotations

import torch

from ..rotary import rotate, rotate_packed
from . import chunked
from .args import AttentionArgs


def torch_kwargs(a: AttentionArgs) -> dict:
    """AttentionArgs -> the keyword arguments of the torch and reference backends."""
    return dict(causal=False, window_size=(a.window_left, a.window_right), softcap=a.softcap,
                alibi_slopes=a.alibi_slopes, dropout=a.dropout)


def rotate_qk(q, k, a: AttentionArgs, inverse: bool = False):
    """RoPE for the torch and reference backends (the kernels rotate on chip instead). With
    inverse=True, maps gradients w.r.t. rotated q and k back to q and k. Differentiable."""
    if not a.rotary_dim:
        return q, k
    table = (a.rotary_cos, a.rotary_sin)
    if not a.varlen:
        return (rotate(q, *table, a.rotary_interleaved, k.shape[1] - q.shape[1], inverse),
                rotate(k, *table, a.rotary_interleaved, 0, inverse))
    cu_q, cu_k = a.cu_seqlens_q.tolist(), a.cu_seqlens_k.tolist()
    # Query i of sequence b sits at i + seqlen_k - seqlen_q of that sequence.
    offsets_q = [(k1 - k0) - (q1 - q0) for q0, q1, k0, k1 in zip(cu_q, cu_q[1:], cu_k, cu_k[1:])]
    return (rotate_packed(q, *table, cu_q, offsets_q, a.rotary_interleaved, inverse),
            rotate_packed(k, *table, cu_k, [0] * len(offsets_q), a.rotary_interleaved, inverse))


# The kernels' channel tiles (and TMA's 16-byte rows) take head dims in multiples of 8; any other
# head dim runs zero-padded to the next one, as flash-attn pads. Zero channels add nothing to a score
# (softmax_scale was fixed from the real head dim) and produce zero output channels, which are cut
# (docs/design/flash-attn-api.md).
CHANNEL_MULTIPLE = 8


def _pad_channels(t: torch.Tensor) -> torch.Tensor:
    extra = -t.shape[-1] % CHANNEL_MULTIPLE
    return torch.nn.functional.pad(t, (0, extra)) if extra else t


def _needs_padding(q, v) -> bool:
    return bool(q.shape[-1] % CHANNEL_MULTIPLE or v.shape[-1] % CHANNEL_MULTIPLE)


def forward_pass(q, k, v, a: AttentionArgs, backend: str):
    if backend == "triton":
        from .forward import attention_forward  # triton is only needed for this backend
        if _needs_padding(q, v):
            out, lse = attention_forward(_pad_channels(q), _pad_channels(k), _pad_channels(v), a)
            return out[..., :v.shape[-1]].contiguous(), lse
        return attention_forward(q, k, v, a)
    q, k = rotate_qk(q, k, a)
    if a.varlen:
        return chunked.attention_chunked_varlen_forward(q, k, v, a.cu_seqlens_q, a.cu_seqlens_k,
                                                        a.softmax_scale, **torch_kwargs(a))
    return chunked.attention_chunked_forward(q, k, v, a.softmax_scale, **torch_kwargs(a))


def backward_pass(dout, q, k, v, out, lse, a: AttentionArgs, backend: str):
    if backend == "triton":
        from .backward import attention_backward
        if _needs_padding(q, v):  # out's padded channels were zeros: padding them again is exact
            dq, dk, dv = attention_backward(*(_pad_channels(t) for t in (dout, q, k, v, out)), lse, a)
            d, d_v = q.shape[-1], v.shape[-1]
            return dq[..., :d].contiguous(), dk[..., :d].contiguous(), dv[..., :d_v].contiguous()
        return attention_backward(dout, q, k, v, out, lse, a)
    q, k = rotate_qk(q, k, a)
    if a.varlen:
        dq, dk, dv = chunked.attention_chunked_varlen_backward(dout, q, k, v, out, lse, a.cu_seqlens_q,
                                                               a.cu_seqlens_k, a.softmax_scale, **torch_kwargs(a))
    else:
        dq, dk, dv = chunked.attention_chunked_backward(dout, q, k, v, out, lse, a.softmax_scale, **torch_kwargs(a))
    dq, dk = rotate_qk(dq, dk, a, inverse=True)
    return dq, dk, dv
