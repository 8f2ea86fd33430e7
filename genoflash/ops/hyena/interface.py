"""`fftconv` (channels last) and `fftconv_channels_first`: validate -> fix the geometry and channel
group -> `FFTConvFunction`."""

from __future__ import annotations

import torch

from ...backends import select_backend, triton_interpreted
from ..common.checks import check_float_tensor
from . import custom_ops, staging
from .fftconv import FFTConvFunction, auto_channel_chunk, compute_dtype, conv_geometry
from .staging import Staging

def _check_filter(h: torch.Tensor, seqlen: int, channels: int, causal: bool) -> None:
    check_float_tensor("h", h, 2, "(channels, taps)")
    if h.shape[0] != channels:
        raise ValueError(f"h has {h.shape[0]} channels but x has {channels}")
    taps = h.shape[1]
    if causal and not 1 <= taps <= seqlen:
        raise ValueError(f"a causal filter needs 1 to seqlen = {seqlen} taps (lags 0..seqlen-1), got {taps}: "
                         "longer filters reach no output")
    if not causal and (taps % 2 == 0 or taps > 2 * seqlen - 1):
        raise ValueError(f"a bidirectional filter needs an odd number of taps, at most 2 * seqlen - 1 = "
                         f"{2 * seqlen - 1} (lags -(seqlen-1)..seqlen-1, lag 0 in the middle), got {taps}")


def _check_and_apply(x: torch.Tensor, h: torch.Tensor, D: torch.Tensor | None, causal: bool,
                     channel_chunk: int | None, channels_last: bool) -> torch.Tensor:
    layout = "(batch, seqlen, channels)" if channels_last else "(batch, channels, seqlen)"
    check_float_tensor("x", x, 3, layout)
    if min(x.shape) < 1:
        raise ValueError(f"x must have batch, seqlen and channels >= 1, got shape {tuple(x.shape)} {layout}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    batch, seqlen, channels = (x.shape[0], x.shape[1], x.shape[2]) if channels_last else \
        (x.shape[0], x.shape[2], x.shape[1])
    _check_filter(h, seqlen, channels, causal)
    if D is not None:
        check_float_tensor("D", D, 1, "(channels,)")
        if D.shape[0] != channels:
            raise ValueError(f"D has {D.shape[0]} channels but x has {channels}")
    for name, t in (("h", h), ("D", D)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} must be on x's device {x.device}, got {t.device}")
    if channel_chunk is not None and (isinstance(channel_chunk, bool) or not isinstance(channel_chunk, int)):
        raise TypeError(f"channel_chunk must be an int or None, got {type(channel_chunk).__name__}")
    if channel_chunk is not None and channel_chunk < 1:
        raise ValueError(f"channel_chunk must be >= 1, got {channel_chunk}")

    geo = conv_geometry(seqlen, h.shape[1], causal)
    dtype = compute_dtype(x.dtype, h.dtype)
    chunk = channel_chunk or auto_channel_chunk(batch, channels, geo, dtype)
    # The Triton staging kernels (staging.py) on the triton backend, in float32, where Triton runs,
    # for groups large enough to repay a launch; torch ops otherwise (float64, CPUs, short
    # sequences): the same values either way. The interpreter (CPU tests) truncates float32 to
    # bfloat16 where the GPU rounds, so it leaves bf16 outputs to torch.
    interpreted = triton_interpreted()
    fused = (select_backend(x.device) == "triton" and dtype == torch.float32
             and (x.device.type == "cuda" or interpreted) and not (interpreted and x.dtype == torch.bfloat16)
             and batch * min(chunk, channels) * geo.fft_len >= staging.FUSED_MIN_ELEMENTS)
    if torch.compiler.is_compiling():  # one graph node per pass, not a loop over channel groups
        return custom_ops.fftconv(x, h, D, causal, chunk, channels_last, fused, interpreted)
    return FFTConvFunction.apply(x, h, D, geo, chunk, channels_last, Staging(fused, interpreted))


def fftconv(x: torch.Tensor, h: torch.Tensor, D: torch.Tensor | None = None, causal: bool = True,
            channel_chunk: int | None = None) -> torch.Tensor:
    """Per-channel long convolution of x with h by FFT, plus the skip term D * x.

    Args:
        x: (batch, seqlen, channels), channels last like the rest of genoflash; any float dtype.
        h: the filters, one per channel. Causal: (channels, K) holding lags 0..K-1, so that
            y[t] = sum_s h[c, s] x[t - s]. Bidirectional: (channels, 2K - 1) holding lags
            -(K-1)..K-1 with lag 0 at index K - 1, so that y[t] = sum_s h[c, s + K - 1] x[t - s].
            1 <= K <= seqlen; a full-length filter is (channels, seqlen) or (channels, 2 seqlen - 1).
        D: (channels,) skip weights, or None for no skip term.
        causal: whether h holds lags >= 0 only (output t then depends on x[.. t] only).
        channel_chunk: channels per FFT group. Only one group's spectra are alive at a time, so
            the peak transient memory scales with it; None picks a group of about 256 MiB of
            spectrum (all channels at once for short sequences).

    Returns y (batch, seqlen, channels), contiguous, in x's dtype. The FFTs run in float32
    (float64 if x or h is float64) whatever the input dtype. Autograd saves only x, h and D; the
    backward recomputes the spectra group by group (reference.py states the same op in plain
    loops). The FFTs run along seqlen, so every group is transposed on its way in and out;
    `fftconv_channels_first` skips that for data already stored (batch, channels, seqlen).
    """
    return _check_and_apply(x, h, D, causal, channel_chunk, channels_last=True)


def fftconv_channels_first(x: torch.Tensor, h: torch.Tensor, D: torch.Tensor | None = None, causal: bool = True,
                           channel_chunk: int | None = None) -> torch.Tensor:
    """`fftconv` for x stored (batch, channels, seqlen): the same convolution, transposed.

    fftconv_channels_first(x, h, D, causal) equals fftconv(x.transpose(1, 2), h, D, causal)
    .transpose(1, 2); h, D, causal and channel_chunk mean what they mean there. Returns y
    (batch, channels, seqlen), contiguous, in x's dtype; x.grad comes back in the same layout.
    The FFTs run along seqlen, so nothing is transposed: each channel group's rows are copied
    once into the FFT buffer (cast and zero-padded in the same write), and each output row is
    written once. x may have any strides, but rows read fastest when seqlen has stride 1 (a
    channel slice of a contiguous (batch, channels, seqlen) tensor qualifies).
    """
    return _check_and_apply(x, h, D, causal, channel_chunk, channels_last=False)
