"""`selective_scan_fn`: Mamba's selective scan with mamba-ssm's argument names, in genoflash's
(batch, seqlen, ...) layout. Validate -> the chosen backend: `triton` runs the Triton kernels
(forward.py; backward.py or backward_channels_first.py by layout), which also do the element-wise
prologue (delta_bias, softplus) and epilogue (skip D, gate z), inside one autograd Function;
`torch` and `reference` run the sequential recurrence of reference.py (slow, for CPUs and tests).
docs/design/mamba-scan.md says why the kernels are built this way.
"""

from __future__ import annotations

import torch

from ...backends import select_backend, triton_interpreted
from .layout import time_contiguous
from .reference import selective_scan_reference

MAX_DSTATE = 64
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class SelectiveScanFunction(torch.autograd.Function):
    """out = ((core(u, dt, A, B, C) + u D) * silu(z)) in u's dtype, dt = softplus(delta +
    delta_bias), where core is y[t, d] = sum_n C[t, n] h[t, d, n], h[t] = exp(dt A) h[t-1] +
    dt B u. The Triton kernels do all of it in float32 registers and round once, as reference.py
    computes it.

    Memory: autograd keeps the inputs as given (usually 16-bit) and the core's chunk states,
    nothing of size (token, channel) of its own. The backward kernels recompute dt, the gate
    and the core's output from them. Composed of PyTorch ops around the core, the same function
    kept about 24 bytes of float32 per (token, channel) (dt before and after softplus, u, the
    skip sum, silu(z) and z), and its backward made several float32 temporaries of that size
    (2 GiB each at 1M tokens and 512 channels).
    """

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, softplus, deterministic):
        from . import backward, backward_channels_first, forward
        interpreted = triton_interpreted()
        # Channels-first u and delta ((batch, seqlen, dim) views of (batch, dim, seqlen) memory)
        # go to the backward's state-loop kernels; everything else to backward.py's, which read
        # (token, channel) rows. The forward takes either layout. Any float dtype is read and
        # upcast in registers. z is read with its own strides (the Mamba layer's is a view into
        # in_proj's output, which stays alive anyway: no copy).
        if time_contiguous(u) and time_contiguous(delta):
            ctx.kernels = backward_channels_first
        else:
            u, delta = u.contiguous(), delta.contiguous()
            ctx.kernels = backward
        A32 = A.float().contiguous()
        B, C = B.contiguous(), C.contiguous()
        # The kernels read D and delta_bias as dense (dim,) vectors.
        D = None if D is None else D.contiguous()
        delta_bias = None if delta_bias is None else delta_bias.contiguous()
        # The forward writes each chunk's initial state and decay, which the backward takes, only
        # when a backward will run.
        out, h0, decay = forward.scan_forward(u, delta, A32, B, C, interpreted, D=D, z=z, delta_bias=delta_bias,
                                              softplus=softplus, save_chunks=any(ctx.needs_input_grad))
        ctx.save_for_backward(u, delta, A32, B, C, D, z, delta_bias, h0, decay)
        ctx.softplus, ctx.interpreted, ctx.deterministic, ctx.a_dtype = softplus, interpreted, deterministic, A.dtype
        return out

    @staticmethod
    def backward(ctx, dout):
        u, delta, A32, B, C, D, z, delta_bias, h0, decay = ctx.saved_tensors
        du, ddelta, dA, dB, dC, dD, dz, ddelta_bias = ctx.kernels.scan_backward(
            dout, u, delta, A32, B, C, h0, decay, ctx.interpreted, ctx.deterministic, D=D, z=z,
            delta_bias=delta_bias, softplus=ctx.softplus)
        return (du, ddelta, dA.to(ctx.a_dtype), dB.to(B.dtype), dC.to(C.dtype),
                None if dD is None else dD.to(D.dtype), dz,
                None if ddelta_bias is None else ddelta_bias.to(delta_bias.dtype), None, None)


def _check(u, delta, A, B, C, D, z, delta_bias) -> None:
    for name, t in (("u", u), ("delta", delta), ("A", A), ("B", B), ("C", C)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if u.dim() != 3:
        raise ValueError(f"u must be (batch, seqlen, dim), got shape {tuple(u.shape)}")
    batch, seqlen, dim = u.shape
    if delta.shape != u.shape:
        raise ValueError(f"delta must have u's shape {tuple(u.shape)}, got {tuple(delta.shape)}")
    if A.dim() != 2 or A.shape[0] != dim:
        raise ValueError(f"A must be (dim, dstate) = ({dim}, dstate), got {tuple(A.shape)}")
    dstate = A.shape[1]
    if not 1 <= dstate <= MAX_DSTATE:
        raise ValueError(f"dstate must be in [1, {MAX_DSTATE}], got {dstate}")
    for name, t in (("B", B), ("C", C)):
        if t.shape != (batch, seqlen, dstate):
            raise ValueError(f"{name} must be (batch, seqlen, dstate) = {(batch, seqlen, dstate)}, got {tuple(t.shape)}")
    if z is not None and z.shape != u.shape:
        raise ValueError(f"z must have u's shape {tuple(u.shape)}, got {tuple(z.shape)}")
    for name, t in (("D", D), ("delta_bias", delta_bias)):
        if t is not None and t.shape != (dim,):
            raise ValueError(f"{name} must be (dim,) = ({dim},), got {tuple(t.shape)}")
    tensors = [t for t in (u, delta, A, B, C, D, z, delta_bias) if t is not None]
    if len({t.device for t in tensors}) != 1:
        raise ValueError("all tensors must be on one device")
    if any(not t.is_floating_point() for t in tensors):
        raise TypeError("all tensors must be floating point")


def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      deterministic=True):
    """Mamba-1's selective scan (reference.py states the recurrence). Returns (batch, seqlen, dim).

    u, delta, z: (batch, seqlen, dim); A: (dim, dstate), negative; B, C: (batch, seqlen, dstate);
    D, delta_bias: (dim,). Differentiable in every tensor argument. `deterministic=False` lets
    the triton backward sum dB and dC with atomics (less memory, order-dependent rounding).

    Layout: u and delta given as (batch, seqlen, dim) views of (batch, dim, seqlen) memory (time
    contiguous, mamba-ssm's layout; `x.transpose(1, 2)` of a channels-first tensor) take the
    faster state-loop backward (backward_channels_first.py; 2.4x at 1M x 512 on the H200), and
    the output comes back in that layout. Dense (batch, seqlen, dim) tensors take backward.py's
    kernels. The Mamba block makes its activations channels-first for this."""
    _check(u, delta, A, B, C, D, z, delta_bias)
    backend = select_backend(u.device)
    if backend != "triton":
        return selective_scan_reference(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    if u.dtype not in _DTYPES:
        raise TypeError(f"the triton backend supports float16, bfloat16 and float32, got {u.dtype}")
    if u.device.type != "cuda" and not triton_interpreted():
        raise ValueError(f"the triton backend needs CUDA tensors (got {u.device}); use the 'torch' backend on CPU")
    return SelectiveScanFunction.apply(u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus), deterministic)
