"""The selective scan's triton kernels as `torch.library` custom ops, for `torch.compile`:
`genoflash::selective_scan` and `genoflash::selective_scan_backward`, with fake (meta)
implementations and an autograd formula. Eager calls keep interface.py's SelectiveScanFunction,
and the two run the same kernels on the same layouts. docs/design/custom-ops.md says why.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..common.host import cdiv
from .layout import time_contiguous


def _channels_first(u: torch.Tensor, delta: torch.Tensor) -> bool:
    """Whether the kernels take the channels-first path, where (token, channel) tensors come and
    go as (batch, seqlen, dim) views of (batch, dim, seqlen) memory; else they are dense."""
    return time_contiguous(u) and time_contiguous(delta) and u.shape[1] > 1


def _empty(like: torch.Tensor, channels_first: bool, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new (batch, seqlen, dim) tensor in the layout every (token, channel) output of these ops has."""
    batch, seqlen, dim = like.shape
    if channels_first:
        return like.new_empty(batch, dim, seqlen, dtype=dtype or like.dtype).transpose(1, 2)
    return like.new_empty(batch, seqlen, dim, dtype=dtype or like.dtype)


def _in_layout(t: torch.Tensor, channels_first: bool) -> torch.Tensor:
    """t itself when it already has that layout (the kernels' usual result), else a copy: the fake
    implementations promise the layout, and compiled code indexes the outputs by it."""
    out = _empty(t, channels_first)
    if t.stride() == out.stride():
        return t
    return out.copy_(t)


def _kernel_operands(u, delta, A, B, C, D, delta_bias):
    """What the kernels read, as SelectiveScanFunction prepares it: u and delta time contiguous
    (the channels-first backward) or dense (backward.py's), A in float32, the rest contiguous."""
    from . import backward, backward_channels_first
    if time_contiguous(u) and time_contiguous(delta):
        kernels = backward_channels_first
    else:
        u, delta, kernels = u.contiguous(), delta.contiguous(), backward
    return (kernels, u, delta, A.float().contiguous(), B.contiguous(), C.contiguous(),
            None if D is None else D.contiguous(), None if delta_bias is None else delta_bias.contiguous())


@torch.library.custom_op("genoflash::selective_scan", mutates_args=())
def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: Optional[torch.Tensor], z: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor],
                   softplus: bool, interpreted: bool, deterministic: bool, save_chunks: bool,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, each chunk's initial state, each chunk's decay); the last two are empty without
    save_chunks. deterministic is the backward's (kept with the forward's arguments)."""
    from .forward import scan_forward
    _, uk, dk, A32, B, C, D, delta_bias = _kernel_operands(u, delta, A, B, C, D, delta_bias)
    out, h0, decay = scan_forward(uk, dk, A32, B, C, interpreted, D=D, z=z, delta_bias=delta_bias,
                                  softplus=softplus, save_chunks=save_chunks)
    if h0 is None:  # two tensors of their own: an op's outputs never alias one another
        h0, decay = u.new_empty(0, dtype=torch.float32), u.new_empty(0, dtype=torch.float32)
    return _in_layout(out, _channels_first(u, delta)), h0, decay


@selective_scan.register_fake
def _(u, delta, A, B, C, D, z, delta_bias, softplus, interpreted, deterministic, save_chunks):
    from .recurrence import chunk_blocks
    batch, seqlen, dim = u.shape
    out = _empty(u, _channels_first(u, delta))
    if not save_chunks:
        return out, u.new_empty(0, dtype=torch.float32), u.new_empty(0, dtype=torch.float32)
    n_chunks = cdiv(seqlen, chunk_blocks(dim, A.shape[1], interpreted)["CHUNK"])
    chunks = (batch, n_chunks, dim, A.shape[1])
    return out, u.new_empty(chunks, dtype=torch.float32), u.new_empty(chunks, dtype=torch.float32)


@torch.library.custom_op("genoflash::selective_scan_backward", mutates_args=())
def selective_scan_backward(dout: torch.Tensor, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor,
                            B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                            delta_bias: Optional[torch.Tensor], h0: torch.Tensor, decay: torch.Tensor,
                            softplus: bool, interpreted: bool, deterministic: bool) -> list[torch.Tensor]:
    """[du, ddelta, dA, dB, dC, dD, dz, ddelta_bias] in their inputs' dtypes; an empty tensor for
    each input that is None (an op returns tensors only)."""
    kernels, uk, dk, A32, Bk, Ck, Dk, bias_k = _kernel_operands(u, delta, A, B, C, D, delta_bias)
    channels_first = _channels_first(u, delta)
    dout = _in_layout(dout, channels_first)  # the kernels index dout with u's strides
    grads = kernels.scan_backward(dout, uk, dk, A32, Bk, Ck, h0, decay, interpreted, deterministic, D=Dk, z=z,
                                  delta_bias=bias_k, softplus=softplus)
    out = []
    for g, t in zip(grads, (u, delta, A, B, C, D, z, delta_bias)):
        if t is None:
            out.append(u.new_empty(0))
        else:
            g = g.to(t.dtype)
            out.append(_in_layout(g, channels_first) if g.dim() == 3 and g.shape == u.shape else g)
    return out


@selective_scan_backward.register_fake
def _(dout, u, delta, A, B, C, D, z, delta_bias, *rest):
    channels_first = _channels_first(u, delta)
    return [u.new_empty(0) if t is None else
            _empty(t, channels_first) if t.dim() == 3 and t.shape == u.shape else t.new_empty(t.shape)
            for t in (u, delta, A, B, C, D, z, delta_bias)]


def _setup_context(ctx, inputs, output):
    u, delta, A, B, C, D, z, delta_bias, softplus, interpreted, deterministic, _ = inputs
    _, h0, decay = output
    ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, h0, decay)
    ctx.mark_non_differentiable(h0, decay)  # the backward's inputs, not results
    ctx.flags = (softplus, interpreted, deterministic)


def _backward(ctx, dout, _dh0, _ddecay):
    u, delta, A, B, C, D, z, delta_bias, h0, decay = ctx.saved_tensors
    grads = selective_scan_backward(dout, u, delta, A, B, C, D, z, delta_bias, h0, decay, *ctx.flags)
    grads = [None if t is None else g for g, t in zip(grads, (u, delta, A, B, C, D, z, delta_bias))]
    return (*grads, None, None, None, None)


selective_scan.register_autograd(_backward, setup_context=_setup_context)
