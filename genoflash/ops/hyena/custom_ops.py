"""`fftconv` as `torch.library` custom ops, for `torch.compile`: `genoflash::fftconv` and
`genoflash::fftconv_backward`, with fake (meta) implementations and an autograd formula.

Under `torch.compile` interface.py validates, picks the channel group and the staging, and calls
these ops, so the graph holds one node per pass instead of an unrolled loop over channel groups
with the staging kernels' launches inside. Eager calls keep fftconv.py's FFTConvFunction.
docs/design/custom-ops.md says why.
"""

from __future__ import annotations

from typing import Optional

import torch


@torch.library.custom_op("genoflash::fftconv", mutates_args=())
def fftconv(x: torch.Tensor, h: torch.Tensor, D: Optional[torch.Tensor], causal: bool, chunk: int,
            channels_last: bool, fused: bool, interpreted: bool) -> torch.Tensor:
    from .fftconv import conv_geometry, fftconv_forward
    from .staging import Staging
    geo = conv_geometry(x.shape[1] if channels_last else x.shape[2], h.shape[1], causal)
    return fftconv_forward(x, h, D, geo, chunk, channels_last, Staging(fused, interpreted))


@fftconv.register_fake
def _(x, *rest):
    # fftconv.py allocates outputs contiguous in the caller's layout (_empty_activation), as x's here
    return x.new_empty(x.shape)


@torch.library.custom_op("genoflash::fftconv_backward", mutates_args=())
def fftconv_backward(dy: torch.Tensor, x: torch.Tensor, h: torch.Tensor, D: Optional[torch.Tensor], causal: bool,
                     chunk: int, channels_last: bool, fused: bool, interpreted: bool,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dh, dD); dD is an empty tensor when D is None (an op returns tensors only)."""
    from .fftconv import conv_geometry, fftconv_backward as backward
    from .staging import Staging
    geo = conv_geometry(x.shape[1] if channels_last else x.shape[2], h.shape[1], causal)
    dx, dh, dD = backward(dy, x, h, D, geo, chunk, channels_last, Staging(fused, interpreted),
                          (True, True, D is not None))
    return dx, dh, h.new_empty(0) if dD is None else dD


@fftconv_backward.register_fake
def _(dy, x, h, D, *rest):
    return x.new_empty(x.shape), h.new_empty(h.shape), h.new_empty(0) if D is None else D.new_empty(D.shape)


def _setup_context(ctx, inputs, output):
    x, h, D, *ctx.rest = inputs
    ctx.save_for_backward(x, h, D)


def _backward(ctx, dy):
    x, h, D = ctx.saved_tensors
    dx, dh, dD = fftconv_backward(dy, x, h, D, *ctx.rest)
    return (dx, dh, None if D is None else dD) + (None,) * len(ctx.rest)


fftconv.register_autograd(_backward, setup_context=_setup_context)
