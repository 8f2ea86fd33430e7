"""`selective_scan_fn`: Mamba's selective scan with mamba-ssm's argument names, in genoflash's
(batch, seqlen, ...) layout. Validate -> element-wise prologue/epilogue in PyTorch -> the core
scan on the chosen backend (`triton`: scan.py; `torch` and `reference`: the sequential
recurrence of reference.py, slow, for CPUs and tests).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...backends import select_backend, triton_interpreted
from .reference import selective_scan_reference

MAX_DSTATE = 64
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class SelectiveScanCore(torch.autograd.Function):
    """y[t, d] = sum_n C[t, n] h[t, d, n], h[t] = exp(delta A) h[t-1] + delta B u, by the Triton
    kernels; y in float32."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, deterministic=True):
        from .scan import scan_forward
        interpreted = triton_interpreted()
        y, h0, decay = scan_forward(u, delta, A, B, C, interpreted)
        ctx.save_for_backward(u, delta, A, B, C, h0, decay)
        ctx.interpreted, ctx.deterministic = interpreted, deterministic
        return y

    @staticmethod
    def backward(ctx, dy):
        from .scan import scan_backward
        u, delta, A, B, C, h0, decay = ctx.saved_tensors
        du, ddelta, dA, dB, dC = scan_backward(dy, u, delta, A, B, C, h0, decay, ctx.interpreted, ctx.deterministic)
        return du.to(u.dtype), ddelta.to(delta.dtype), dA.to(A.dtype), dB.to(B.dtype), dC.to(C.dtype), None


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
    the triton backward sum dB and dC with atomics (less memory, order-dependent rounding)."""
    _check(u, delta, A, B, C, D, z, delta_bias)
    backend = select_backend(u.device)
    if backend != "triton":
        return selective_scan_reference(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    if u.dtype not in _DTYPES:
        raise TypeError(f"the triton backend supports float16, bfloat16 and float32, got {u.dtype}")
    if u.device.type != "cuda" and not triton_interpreted():
        raise ValueError(f"the triton backend needs CUDA tensors (got {u.device}); use the 'torch' backend on CPU")
    dt = delta.float() if delta_bias is None else delta.float() + delta_bias.float()
    if delta_softplus:
        dt = F.softplus(dt)
    # Everything around the core is float32, as in the reference: u enters as float32, so its
    # gradient from the core and from the skip D add up before the one rounding to u's dtype,
    # and the output is rounded once at the end.
    u32 = u.float()  # one cast, so both uses' gradients add in float32 before it rounds them
    y = SelectiveScanCore.apply(u32.contiguous(), dt.contiguous(), A.float().contiguous(), B.contiguous(),
                                C.contiguous(), deterministic)
    if D is not None:
        y = y + u32 * D.float()
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(u.dtype)
