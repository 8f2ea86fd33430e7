"""The short depthwise convolution's triton kernels as `torch.library` custom ops, for
`torch.compile`: `genoflash::short_conv` and `genoflash::short_conv_backward`, with fake (meta)
implementations and an autograd formula. Eager calls keep short_conv_kernels.py's ShortConvFunction.
docs/design/custom-ops.md says why.
"""

from __future__ import annotations

from typing import Optional

import torch


@torch.library.custom_op("genoflash::short_conv", mutates_args=())
def short_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
               input_bias: Optional[torch.Tensor], left: int, interpreted: bool,
               activation: Optional[str]) -> torch.Tensor:
    from .short_conv_kernels import _rows_with_unit_stride, short_conv_forward
    return short_conv_forward(_rows_with_unit_stride(x), weight, bias, input_bias, left, interpreted, activation)


@short_conv.register_fake
def _(x, *rest):
    return x.new_empty(x.shape)  # (batch, channels, seqlen), contiguous


@torch.library.custom_op("genoflash::short_conv_backward", mutates_args=())
def short_conv_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                        input_bias: Optional[torch.Tensor], left: int, interpreted: bool, activation: Optional[str],
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias, dinput_bias); the last three float32, and computed even where an
    argument is None (an op returns tensors only; they are (channels,) sums, cheap)."""
    from .short_conv_kernels import _rows_with_unit_stride, short_conv_backward as backward
    dx, dw, db, dib = backward(_rows_with_unit_stride(dy), _rows_with_unit_stride(x), weight, bias, input_bias, left,
                               interpreted, activation)
    return dx, dw.contiguous(), db.contiguous(), dib.contiguous()  # own storage each: outputs never alias


@short_conv_backward.register_fake
def _(dy, x, weight, *rest):
    channels = x.shape[1]
    f32 = dict(dtype=torch.float32)
    return x.new_empty(x.shape), x.new_empty(weight.shape, **f32), x.new_empty(channels, **f32), \
        x.new_empty(channels, **f32)


def _setup_context(ctx, inputs, output):
    x, weight, bias, input_bias, *ctx.rest = inputs
    ctx.save_for_backward(x, weight, bias, input_bias)


def _backward(ctx, dy):
    x, weight, bias, input_bias = ctx.saved_tensors
    dx, dw, db, dib = short_conv_backward(dy, x, weight, bias, input_bias, *ctx.rest)
    return (dx, dw.to(weight.dtype), None if bias is None else db.to(bias.dtype),
            None if input_bias is None else dib.to(input_bias.dtype)) + (None,) * len(ctx.rest)


short_conv.register_autograd(_backward, setup_context=_setup_context)
