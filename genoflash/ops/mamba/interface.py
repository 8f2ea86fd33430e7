"""`selective_scan_fn`: Mamba's selective scan with mamba-ssm's argument names, in genoflash's
(batch, seqlen, ...) layout. Validate -> the chosen backend: `triton` runs the core scan of
scan.py inside one autograd Function with its element-wise prologue (delta_bias, softplus) and
epilogue (skip D, gate z); `torch` and `reference` run the sequential recurrence of
reference.py (slow, for CPUs and tests).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...backends import select_backend, triton_interpreted
from .reference import selective_scan_reference

MAX_DSTATE = 64
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _step_sizes(delta, delta_bias, softplus: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The core's float32 step sizes dt = softplus(x), x = delta + delta_bias (each part where
    given), with x (softplus's derivative is sigmoid(x))."""
    x = delta.float() if delta_bias is None else delta.float() + delta_bias.float()
    return x, (F.softplus(x) if softplus else x)


def _with_skip(y_core, u, D) -> torch.Tensor:
    """The core's output plus the skip term u D, in float32."""
    return y_core if D is None else y_core + u.float() * D.float()


class SelectiveScanFunction(torch.autograd.Function):
    """out = ((core(u, dt, A, B, C) + u D) * silu(z)) in u's dtype, dt = softplus(delta +
    delta_bias), where core is y[t, d] = sum_n C[t, n] h[t, d, n], h[t] = exp(dt A) h[t-1] +
    dt B u, by the Triton kernels of scan.py. Everything around the core is float32, as in
    reference.py, and rounded once at the end; du's two parts (core and skip) add in float32.

    Memory: autograd keeps the inputs (as given, usually 16-bit), the core's float32 output and
    its chunk states, nothing else. dt, the skip sum and the gate are recomputed in the
    backward, which frees each float32 temporary as soon as it is used (at 1M tokens and 512
    channels each is 2 GiB). Composed of PyTorch ops, the same function kept about 24 bytes of
    float32 intermediates per (token, channel) (dt before and after softplus, u, the skip sum,
    silu(z) and z), 13 GB at that size.
    """

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, softplus, deterministic):
        from .scan import scan_forward
        interpreted = triton_interpreted()
        u = u.contiguous()  # the kernels read any float dtype and upcast in registers
        dt = _step_sizes(delta, delta_bias, softplus)[1].contiguous()
        A32 = A.float().contiguous()
        y_core, h0, decay = scan_forward(u, dt, A32, B.contiguous(), C.contiguous(), interpreted)
        del dt
        y = _with_skip(y_core, u, D)
        if z is not None:
            y = y * F.silu(z.float())
        ctx.save_for_backward(u, delta, A32, B, C, D, z, delta_bias, y_core, h0, decay)
        ctx.softplus, ctx.interpreted, ctx.deterministic, ctx.a_dtype = softplus, interpreted, deterministic, A.dtype
        return y.to(u.dtype)

    @staticmethod
    def backward(ctx, dout):
        from .scan import scan_backward
        u, delta, A32, B, C, D, z, delta_bias, y_core, h0, decay = ctx.saved_tensors
        dD = dz = ddelta_bias = None
        dy = dout.float()  # dL/d(core + u D); dout itself is never written to
        if z is not None:
            z32 = z.to(torch.float32, copy=True)  # a copy even of a float32 z: it is overwritten below
            sig = torch.sigmoid(z32)
            dsilu = sig * (1 + z32 * (1 - sig))  # d silu(z) / dz
            gate = z32.mul_(sig)  # silu(z), in z32's memory
            del sig
            y_skip = _with_skip(y_core, u, D)
            dz = (dy * y_skip).mul_(dsilu).to(z.dtype)
            del y_skip, dsilu
            dy = dy * gate
            del gate
        x, dt = _step_sizes(delta, delta_bias, ctx.softplus)
        if not ctx.softplus:
            x = None  # it is dt itself then; dropping this name lets dt's memory go below
        du, ddt, dA, dB, dC = scan_backward(dy, u, dt.contiguous(), A32, B.contiguous(), C.contiguous(), h0, decay,
                                            ctx.interpreted, ctx.deterministic)
        del dt
        if D is not None:
            du += dy * D.float()
            dD = (dy * u.float()).sum((0, 1)).to(D.dtype)
        del dy
        if ctx.softplus:  # d softplus(x) / dx = sigmoid(x); x may be delta itself, so not in place
            ddt *= torch.sigmoid(x)
        if delta_bias is not None:
            ddelta_bias = ddt.sum((0, 1)).to(delta_bias.dtype)
        return (du.to(u.dtype), ddt.to(delta.dtype), dA.to(ctx.a_dtype), dB.to(B.dtype), dC.to(C.dtype), dD, dz,
                ddelta_bias, None, None)


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
    return SelectiveScanFunction.apply(u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus), deterministic)
