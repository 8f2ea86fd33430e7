"""The Triton kernels of the short depthwise convolution (short_conv.py states the op), their
launches and `ShortConvFunction`.

The padding is a load mask, so no padded copy of x is made, and y is written contiguous:
a program owns BLOCK positions of one (batch, channel) row and reads the K shifted windows
of x it needs (K is a few taps, so the re-reads hit the cache). The backward is the same
loop twice: dx is the sum with the taps mirrored, dx[p] = sum_j w[c, j] g[p + left - j], where
g is the gradient at the convolution's output; dw, dbias and dinput_bias (= sum dx) are sums
over (batch, time), which each program writes as partial sums over its block and PyTorch adds
up (no atomics, so the result is deterministic). Without the activation g is dy. With it,
g = dy silu'(y) is one pass of its own first (the forward's loop, recomputing y), written in
dy's dtype as autograd's silu backward writes it: dx needs g at K shifted positions, and
recomputing y at each of them inside the backward (K^2 loads of x and K sigmoids per position)
took 6.4 ms at 1M x 512 on an H200, four times what its bytes need (docs/design/hyena.md). The
cost is one (batch, channels, seqlen) buffer during the backward.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable
import triton
import triton.language as tl

from .host import cdiv


@triton.jit
def _load_shifted(x_row, IN_BIAS, c, p, seqlen, HAS_INPUT_BIAS: tl.constexpr):
    """x'[p] in float32: x[p] + input_bias[c] inside the sequence, 0 outside (the padding is this mask)."""
    inside = (p >= 0) & (p < seqlen)
    x = tl.load(x_row + p, mask=inside, other=0.0).to(tl.float32)
    if HAS_INPUT_BIAS:
        x = tl.where(inside, x + tl.load(IN_BIAS + c).to(tl.float32), 0.0)
    return x


@triton.jit
def _conv_at(x_row, W, BIAS, IN_BIAS, c, t, seqlen, TAPS: tl.constexpr, LEFT: tl.constexpr,
             HAS_BIAS: tl.constexpr, HAS_INPUT_BIAS: tl.constexpr):
    """y[t] before the activation, in float32, at the positions t (any, the padding is the load mask)."""
    acc = tl.zeros(t.shape, dtype=tl.float32)
    for j in tl.static_range(TAPS):
        x = _load_shifted(x_row, IN_BIAS, c, t + (j - LEFT), seqlen, HAS_INPUT_BIAS)
        acc += tl.load(W + c * TAPS + j).to(tl.float32) * x
    if HAS_BIAS:
        acc += tl.load(BIAS + c).to(tl.float32)
    return acc


@triton.jit
def _silu(y):
    return y * tl.sigmoid(y)


@triton.jit
def _silu_grad(y):
    """d silu(y) / dy = s (1 + y (1 - s)), s = sigmoid(y)."""
    s = tl.sigmoid(y)
    return s * (1.0 + y * (1.0 - s))


@triton.jit
def _short_conv_fwd_kernel(X, W, BIAS, IN_BIAS, Y, channels, seqlen, n_blocks, stride_xb, stride_xc,
                           TAPS: tl.constexpr, LEFT: tl.constexpr, HAS_BIAS: tl.constexpr,
                           HAS_INPUT_BIAS: tl.constexpr, SILU: tl.constexpr, BLOCK: tl.constexpr):
    # One grid axis (up to 2^31 programs): row = b * channels + c, then the block along seqlen.
    row, block = tl.program_id(0) // n_blocks, tl.program_id(0) % n_blocks
    b, c = row // channels, row % channels
    t = block * BLOCK + tl.arange(0, BLOCK)
    # int64 row offsets: batch * channels * seqlen passes 2^31 at a million tokens
    x_row = X + b.to(tl.int64) * stride_xb + c.to(tl.int64) * stride_xc
    acc = _conv_at(x_row, W, BIAS, IN_BIAS, c, t, seqlen, TAPS, LEFT, HAS_BIAS, HAS_INPUT_BIAS)
    if SILU:
        acc = _silu(acc)
    tl.store(Y + row.to(tl.int64) * seqlen + t, acc.to(Y.dtype.element_ty), mask=t < seqlen)


@triton.jit
def _silu_grad_kernel(DY, X, W, BIAS, IN_BIAS, G, channels, seqlen, n_blocks, stride_dyb, stride_dyc, stride_xb,
                      stride_xc, TAPS: tl.constexpr, LEFT: tl.constexpr, HAS_BIAS: tl.constexpr,
                      HAS_INPUT_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """g = dy silu'(y), the gradient at the convolution's output, once per position: y is
    recomputed as the forward computes it (the forward keeps no y)."""
    row, block = tl.program_id(0) // n_blocks, tl.program_id(0) % n_blocks
    b, c = row // channels, row % channels
    t = block * BLOCK + tl.arange(0, BLOCK)
    in_seq = t < seqlen
    x_row = X + b.to(tl.int64) * stride_xb + c.to(tl.int64) * stride_xc
    dy = tl.load(DY + b.to(tl.int64) * stride_dyb + c.to(tl.int64) * stride_dyc + t, mask=in_seq,
                 other=0.0).to(tl.float32)
    g = dy * _silu_grad(_conv_at(x_row, W, BIAS, IN_BIAS, c, t, seqlen, TAPS, LEFT, HAS_BIAS, HAS_INPUT_BIAS))
    tl.store(G + row.to(tl.int64) * seqlen + t, g.to(G.dtype.element_ty), mask=in_seq)


@triton.jit
def _short_conv_bwd_kernel(DY, X, W, IN_BIAS, DX, PARTIAL, channels, seqlen, n_blocks, stride_dyb, stride_dyc,
                           stride_xb, stride_xc, TAPS: tl.constexpr, LEFT: tl.constexpr,
                           HAS_INPUT_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """dx and this block's partial sums, from DY = g, the gradient at the convolution's output
    (dy, or _silu_grad_kernel's dy silu'(y) with the activation)."""
    row, block = tl.program_id(0) // n_blocks, tl.program_id(0) % n_blocks
    b, c = row // channels, row % channels
    t = block * BLOCK + tl.arange(0, BLOCK)
    in_seq = t < seqlen
    dy_row = DY + b.to(tl.int64) * stride_dyb + c.to(tl.int64) * stride_dyc
    x_row = X + b.to(tl.int64) * stride_xb + c.to(tl.int64) * stride_xc
    # dx[p] = sum_j w[c, j] g[p + LEFT - j]: every output that read x[p], through tap j.
    dx = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TAPS):
        q = t + (LEFT - j)
        g = tl.load(dy_row + q, mask=(q >= 0) & (q < seqlen), other=0.0).to(tl.float32)
        dx += tl.load(W + c * TAPS + j).to(tl.float32) * g
    tl.store(DX + row.to(tl.int64) * seqlen + t, dx.to(DX.dtype.element_ty), mask=in_seq)
    # This block's share of the sums over (batch, time), PARTIAL[row, block, :]:
    # dw[c, j] = sum g[t] x'[t + j - LEFT] for j < TAPS, then dbias = sum g, then dinput_bias = sum dx.
    g = tl.load(dy_row + t, mask=in_seq, other=0.0).to(tl.float32)  # 0 past the sequence end
    out = PARTIAL + (row.to(tl.int64) * n_blocks + block) * (TAPS + 2)
    for j in tl.static_range(TAPS):
        x = _load_shifted(x_row, IN_BIAS, c, t + (j - LEFT), seqlen, HAS_INPUT_BIAS)
        tl.store(out + j, tl.sum(g * x, 0))
    tl.store(out + TAPS, tl.sum(g, 0))
    tl.store(out + TAPS + 1, tl.sum(tl.where(in_seq, dx, 0.0), 0))


def _block(interpreted: bool) -> int:
    # Small blocks under the interpreter, so CPU tests cross block boundaries at small lengths.
    return 32 if interpreted else 1024


def _rows_with_unit_stride(t: torch.Tensor) -> torch.Tensor:
    """t itself when its seqlen dim is contiguous (any batch and channel strides), else a copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def short_conv_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       input_bias: torch.Tensor | None, left: int, interpreted: bool,
                       activation: str | None = None) -> torch.Tensor:
    batch, channels, seqlen = x.shape
    block = _block(interpreted)
    n_blocks = cdiv(seqlen, block)
    y = torch.empty(batch, channels, seqlen, dtype=x.dtype, device=x.device)
    _short_conv_fwd_kernel[(batch * channels * n_blocks,)](
        x, weight, weight if bias is None else bias, weight if input_bias is None else input_bias, y, channels,
        seqlen, n_blocks, x.stride(0), x.stride(1), TAPS=weight.shape[-1], LEFT=left, HAS_BIAS=bias is not None,
        HAS_INPUT_BIAS=input_bias is not None, SILU=activation == "silu", BLOCK=block)
    return y


def short_conv_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        input_bias: torch.Tensor | None, left: int, interpreted: bool, activation: str | None = None):
    """(dx, dweight, dbias, dinput_bias): dx (batch, channels, seqlen) contiguous, the others float32."""
    batch, channels, seqlen = x.shape
    taps = weight.shape[-1]
    block = _block(interpreted)
    n_blocks = cdiv(seqlen, block)
    grid = (batch * channels * n_blocks,)
    if activation == "silu":
        g = torch.empty(batch, channels, seqlen, dtype=dy.dtype, device=dy.device)
        _silu_grad_kernel[grid](
            dy, x, weight, weight if bias is None else bias, weight if input_bias is None else input_bias, g, channels,
            seqlen, n_blocks, dy.stride(0), dy.stride(1), x.stride(0), x.stride(1), TAPS=taps, LEFT=left,
            HAS_BIAS=bias is not None, HAS_INPUT_BIAS=input_bias is not None, BLOCK=block)
        dy = g
    dx = torch.empty(batch, channels, seqlen, dtype=x.dtype, device=x.device)
    partial = torch.empty(batch, channels, n_blocks, taps + 2, dtype=torch.float32, device=x.device)
    _short_conv_bwd_kernel[grid](
        dy, x, weight, weight if input_bias is None else input_bias, dx, partial, channels, seqlen, n_blocks,
        dy.stride(0), dy.stride(1), x.stride(0), x.stride(1), TAPS=taps, LEFT=left,
        HAS_INPUT_BIAS=input_bias is not None, BLOCK=block)
    sums = partial.sum((0, 2))  # (channels, taps + 2)
    return dx, sums[:, :taps], sums[:, taps], sums[:, taps + 1]


class ShortConvFunction(torch.autograd.Function):
    """Saves x and the weights; y and dx come out contiguous (batch, channels, seqlen)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                input_bias: torch.Tensor | None, left: int, interpreted: bool, activation: str | None) -> torch.Tensor:
        x = _rows_with_unit_stride(x)
        ctx.save_for_backward(x, weight, bias, input_bias)
        ctx.left, ctx.interpreted, ctx.activation = left, interpreted, activation
        return short_conv_forward(x, weight, bias, input_bias, left, interpreted, activation)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        x, weight, bias, input_bias = ctx.saved_tensors
        dx, dw, db, dib = short_conv_backward(_rows_with_unit_stride(dy), x, weight, bias, input_bias, ctx.left,
                                              ctx.interpreted, ctx.activation)
        return (dx, dw.to(weight.dtype), None if bias is None else db.to(bias.dtype),
                None if input_bias is None else dib.to(input_bias.dtype), None, None, None)
