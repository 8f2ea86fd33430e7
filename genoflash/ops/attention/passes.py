"""An attention call's forward and backward on a chosen backend: what interface.py's autograd
Function and custom_ops.py's ops both run, so that eager and compiled calls run the same code.

`triton` runs the kernels (forward.py, backward.py), which rotate q and k on chip; `torch` runs
chunked.py's tiled online softmax in PyTorch ops, after rotating q and k here.
"""

from __future__ import annotations

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


def forward_pass(q, k, v, a: AttentionArgs, backend: str):
    if backend == "triton":
        from .forward import attention_forward  # triton is only needed for this backend
        return attention_forward(q, k, v, a)
    q, k = rotate_qk(q, k, a)
    if a.varlen:
        return chunked.attention_chunked_varlen_forward(q, k, v, a.cu_seqlens_q, a.cu_seqlens_k,
                                                        a.softmax_scale, **torch_kwargs(a))
    return chunked.attention_chunked_forward(q, k, v, a.softmax_scale, **torch_kwargs(a))


def backward_pass(dout, q, k, v, out, lse, a: AttentionArgs, backend: str):
    if backend == "triton":
        from .backward import attention_backward
        return attention_backward(dout, q, k, v, out, lse, a)
    q, k = rotate_qk(q, k, a)
    if a.varlen:
        dq, dk, dv = chunked.attention_chunked_varlen_backward(dout, q, k, v, out, lse, a.cu_seqlens_q,
                                                               a.cu_seqlens_k, a.softmax_scale, **torch_kwargs(a))
    else:
        dq, dk, dv = chunked.attention_chunked_backward(dout, q, k, v, out, lse, a.softmax_scale, **torch_kwargs(a))
    dq, dk = rotate_qk(dq, dk, a, inverse=True)
    return dq, dk, dv
