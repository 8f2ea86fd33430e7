"""Linear maps across the layout boundary of the Hyena and Mamba layers, with no transpose kernel.

genoflash's activations are (batch, seqlen, channels); Hyena's FFTs and short convolution want
(batch, channels, seqlen). These two autograd Functions are nn.Linear's matmuls written so that
one side reads or writes the other layout directly (cuBLAS takes either majorness of an
operand, so a transposed view costs nothing):

    project_to_channels_first(u, W)        u (batch, seqlen, in)  -> W @ u^T,       (batch, out, seqlen)
    project_from_channels_first(z, W, b)   z (batch, in, seqlen)  -> z^T @ W^T + b, (batch, seqlen, out)

(`project_within_channels_first` is W @ x on channels-first x, for which plain autograd suffices.)

Plain autograd through `W @ u.mT` would hand u its gradient as a transposed view, and every op
upstream would then run on mixed layouts; here each gradient is written contiguous in its
input's own layout. The first takes no bias: the Hyena layer adds it inside the short
convolution that follows (short_conv.py), so it costs no pass of its own.
Operands must share one dtype (`autocast_operands` casts them as autocast casts F.linear's).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


def autocast_operands(*tensors: torch.Tensor | None) -> tuple:
    """The tensors in autocast's dtype when autocast is on for their device (floating tensors but
    float64, as autocast casts F.linear's operands), else unchanged: the dtype F.linear would use."""
    device_type = tensors[0].device.type
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t
                 for t in tensors)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b per sequence, (batch, m, k) @ (batch, k, n); either may be a stride-0 expansion. At
    batch 1 a plain mm, which costs less to launch than bmm."""
    return torch.mm(a[0], b[0])[None] if a.shape[0] == 1 else torch.bmm(a, b)


def _bmm_summed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum over the batch of a @ b, (batch, m, k) @ (batch, k, n) -> (m, n): a weight's gradient. At
    batch 1 one mm, with no sum (which would copy the result once more)."""
    return torch.mm(a[0], b[0]) if a.shape[0] == 1 else torch.bmm(a, b).sum(0)


def _per_batch(weight: torch.Tensor, batch: int) -> torch.Tensor:
    return weight.expand(batch, *weight.shape)  # batch stride 0: one matrix for every sequence, no copy


class ProjectToChannelsFirst(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(u, weight)
        return _bmm(_per_batch(weight, u.shape[0]), u.mT)  # (batch, out, seqlen), contiguous

    @staticmethod
    @once_differentiable
    def backward(ctx, dz: torch.Tensor):
        u, weight = ctx.saved_tensors
        du = _bmm(dz.mT, _per_batch(weight, u.shape[0])) if ctx.needs_input_grad[0] else None  # like u
        dw = _bmm_summed(dz, u) if ctx.needs_input_grad[1] else None
        return du, dw


class ProjectFromChannelsFirst(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        batch, _, seqlen = z.shape
        y = torch.empty(batch, seqlen, weight.shape[0], dtype=z.dtype, device=z.device)
        for b in range(batch):  # addmm with a vector bias adds it in the matmul's epilogue, not in a pass of its own
            if bias is None:
                torch.mm(z[b].mT, weight.t(), out=y[b])
            else:
                torch.addmm(bias, z[b].mT, weight.t(), out=y[b])
        ctx.save_for_backward(z, weight)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        z, weight = ctx.saved_tensors
        need_dz, need_dw, need_db = ctx.needs_input_grad
        dz = _bmm(_per_batch(weight.t(), z.shape[0]), dy.mT) if need_dz else None  # like z
        dw = _bmm_summed(dy.mT, z.mT) if need_dw else None
        db = dy.sum((0, 1)) if need_db and ctx.has_bias else None
        return dz, dw, db


def project_within_channels_first(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """weight (out, in) @ x (batch, in, seqlen) -> (batch, out, seqlen), contiguous. Both sides are
    channels-first, so plain autograd returns x's gradient contiguous in x's layout too (the Mamba
    block's x_proj and dt_proj)."""
    return _bmm(_per_batch(weight, x.shape[0]), x)


def project_to_channels_first(u: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """u (batch, seqlen, in), weight (out, in) -> W @ u^T, (batch, out, seqlen), contiguous; u's
    gradient comes back contiguous (batch, seqlen, in)."""
    return ProjectToChannelsFirst.apply(u, weight)


def project_from_channels_first(z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """z (batch, in, seqlen), weight (out, in), bias (out,) or None -> z^T @ W^T + b, (batch, seqlen,
    out), contiguous; z's gradient comes back contiguous (batch, in, seqlen)."""
    return ProjectFromChannelsFirst.apply(z, weight, bias)
