"""The short depthwise convolution over (batch, channels, seqlen): Hyena's short filter and
Mamba's causal conv1d. Its Triton kernels are in short_conv_kernels.py, imported only when a call
takes them, so the torch path runs without triton.

Per channel c, with K taps and `left` positions of zero padding before the sequence:

    y[b, c, t] = bias[c] + sum_{j < K} w[c, j] x'[b, c, t + j - left],
    x'[b, c, p] = x[b, c, p] + input_bias[c] for p in [0, seqlen), 0 outside (the padding).

left = K - 1 is causal (output t sees t - K + 1 .. t); left = (K - 1) // 2 centres the window.
This is nn.Conv1d(channels, channels, K, groups=channels) applied to x + input_bias, zero-padded
by left and K - 1 - left (`short_conv_reference`, the torch backend and the tests' reference).
input_bias is the bias of the linear layer before the convolution (Hyena's input projection),
added here so it costs no pass over x of its own. With activation="silu" the output is
silu(y) (Mamba's causal conv1d, as the causal-conv1d package fuses it): no pass of its own
either way, and the backward recomputes y where it needs silu's derivative instead of saving it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...backends import select_backend, triton_interpreted
from . import custom_ops
from .projection import autocast_operands

_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


ACTIVATIONS = (None, "silu")


def _check_activation(activation) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def short_conv_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, left: int,
                         input_bias: torch.Tensor | None = None, activation: str | None = None) -> torch.Tensor:
    """The same op by nn.functional: x (batch, channels, seqlen), weight (channels, K)."""
    _check_activation(activation)
    taps = weight.shape[-1]
    if input_bias is not None:
        x = x + input_bias.to(x.dtype)[:, None]
    y = F.conv1d(F.pad(x, (left, taps - 1 - left)), weight[:, None, :], bias, groups=x.shape[1])
    return F.silu(y) if activation == "silu" else y


def short_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, left: int,
               input_bias: torch.Tensor | None = None, interpreted: bool = False,
               activation: str | None = None) -> torch.Tensor:
    """Depthwise convolution of x + input_bias (batch, channels, seqlen) with weight (channels, K),
    K >= 1, zero padding `left` positions before the sequence and K - 1 - left after it; bias and
    input_bias (channels,) or None; then the activation (None or "silu"). x, weight and bias share
    one dtype, float16, bfloat16 or float32 (input_bias may be any float dtype; sums run in
    float32), on CUDA or under TRITON_INTERPRET. Returns y (batch, channels, seqlen), contiguous."""
    _check_activation(activation)
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[1]:
        raise ValueError(f"expected x (batch, channels, seqlen) and weight (channels, taps), got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    if not 0 <= left < weight.shape[1]:
        raise ValueError(f"left must be in [0, taps), got {left} for {weight.shape[1]} taps")
    if x.dtype not in _TRITON_DTYPES or any(t is not None and t.dtype != x.dtype for t in (weight, bias)):
        raise TypeError(f"x, weight and bias must share one dtype of float16, bfloat16, float32; got "
                        f"{x.dtype}, {weight.dtype}, {None if bias is None else bias.dtype}")
    for name, t in (("bias", bias), ("input_bias", input_bias)):
        if t is not None and t.shape != (x.shape[1],):
            raise ValueError(f"{name} must be (channels,) = ({x.shape[1]},), got {tuple(t.shape)}")
    if torch.compiler.is_compiling():  # one graph node per pass, not a trace of the launch
        return custom_ops.short_conv(x, weight.contiguous(), bias, input_bias, left, interpreted, activation)
    from .short_conv_kernels import ShortConvFunction  # triton is only needed for the kernels
    return ShortConvFunction.apply(x, weight.contiguous(), bias, input_bias, left, interpreted, activation)


def _kernel_applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, interpreted: bool) -> bool:
    """Whether the Triton kernels take these operands: one dtype of float16, bfloat16 or float32,
    where Triton runs; not bfloat16 under the interpreter (CPU tests), which truncates float32 to
    bfloat16 where the GPU rounds."""
    return ((x.device.type == "cuda" or interpreted) and x.dtype in _TRITON_DTYPES
            and not (interpreted and x.dtype == torch.bfloat16)
            and all(t is None or t.dtype == x.dtype for t in (weight, bias)))


def depthwise_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, left: int,
                     input_bias: torch.Tensor | None = None, activation: str | None = None) -> torch.Tensor:
    """`short_conv` on the triton backend where its kernels take the operands (autocast's dtype
    under autocast, as nn.Conv1d would run), else `short_conv_reference`: what the Hyena and
    Mamba layers call. x (batch, channels, seqlen), weight (channels, K)."""
    if select_backend(x.device) == "triton":
        interpreted = triton_interpreted()
        xt, wt, bt = autocast_operands(x, weight, bias)
        if _kernel_applies(xt, wt, bt, interpreted):
            return short_conv(xt, wt, bt, left, input_bias, interpreted, activation)
    return short_conv_reference(x, weight, bias, left, input_bias, activation)
