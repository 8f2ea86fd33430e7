"""Hyena's long convolution by FFT, one channel group at a time, with a backward that recomputes.

With the filter h as stored and lag0 the index of its lag-0 tap (0 when causal, K - 1 for a
two-sided filter of 2K - 1 taps; see reference.py), every output is

    y[b, t, c] = sum_j h[c, j] x[b, t + lag0 - j, c]  +  D[c] x[b, t, c].

By FFT: zero-pad x and h to n points, multiply the spectra, invert, and read y at indices
lag0 .. lag0 + seqlen - 1 of the circular result. Index m of that result sums x at
(m - j) mod n; the smallest m - j we read is lag0 - (taps - 1), which wraps to a position at
or past seqlen (so x reads as zero there, as a linear convolution wants) as long as

    n >= seqlen + taps - 1 - lag0          (2 seqlen - 1 for a full-length filter, either way).

The same bound keeps both correlations of the backward free of wrap-around (see
`_conv_group_backward`). n is rounded up to a 5-smooth size, which the FFT libraries handle
at full speed.

Memory. The FFTs run in float32 (float64 for float64 inputs), whatever the input dtype. A
channel group's spectra are the only complex tensors alive at any time: channels are
processed in groups of `channel_chunk`, and the backward recomputes the spectra group by
group instead of saving them. Autograd keeps only x, h and D, O(batch * seqlen * channels),
where keeping the fp32 spectra of all channels costs several times that.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

# The automatic channel group holds about this many bytes of one spectrum: large enough that
# the FFT calls stay batched over many channels, small next to the activations at 1M tokens.
GROUP_SPECTRUM_BYTES = 256 * 2**20


class ConvGeometry(NamedTuple):
    """The lengths of one call, fixed once: every FFT and slice below reads them from here."""
    seqlen: int
    taps: int  # filter length: K causal, 2K - 1 bidirectional
    lag0: int  # index of the lag-0 tap in the filter
    fft_len: int  # n: >= seqlen + taps - 1 - lag0, 5-smooth


def fft_size(min_len: int) -> int:
    """The smallest n >= min_len of the form 2^a 3^b 5^c."""
    best = 1 << max(0, min_len - 1).bit_length()  # a power of two always qualifies
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            n = p35
            while n < min_len:
                n *= 2
            best = min(best, n)
            p35 *= 3
        p5 *= 5
    return best


def conv_geometry(seqlen: int, taps: int, causal: bool) -> ConvGeometry:
    lag0 = 0 if causal else (taps - 1) // 2
    return ConvGeometry(seqlen, taps, lag0, fft_size(seqlen + taps - 1 - lag0))


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """float64 if any operand is float64, else float32: the FFTs never run in half precision."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def auto_channel_chunk(batch: int, channels: int, geo: ConvGeometry, dtype: torch.dtype) -> int:
    """Channels per group such that one group's spectrum of x stays near GROUP_SPECTRUM_BYTES.

    A channel's spectrum holds n / 2 + 1 complex numbers, about n reals: 8 MiB at 1M tokens in fp32."""
    per_channel = batch * geo.fft_len * torch.empty((), dtype=dtype).element_size()
    return max(1, min(channels, GROUP_SPECTRUM_BYTES // per_channel))


def _channel_groups(channels: int, chunk: int):
    return (slice(c0, min(c0 + chunk, channels)) for c0 in range(0, channels, chunk))


def _group(x: torch.Tensor, cs: slice, dtype: torch.dtype) -> torch.Tensor:
    """Channels cs of x (batch, seqlen, channels) as (batch, group, seqlen) in dtype: FFTs run on the last dim."""
    return x[:, :, cs].transpose(1, 2).to(dtype)


def _undo_lag0(corr: torch.Tensor, lag0: int, length: int) -> torch.Tensor:
    """corr[(k - lag0) mod n] for k in [0, length): reindex a circular correlation from lag to position."""
    return torch.roll(corr, lag0, dims=-1)[..., :length] if lag0 else corr[..., :length]


def _conv_group(x_g: torch.Tensor, h_g: torch.Tensor, D_g: torch.Tensor | None, geo: ConvGeometry) -> torch.Tensor:
    """x_g (batch, group, seqlen), h_g (group, taps) -> y_g (batch, group, seqlen), all in one dtype."""
    n = geo.fft_len
    spectrum = torch.fft.rfft(x_g, n=n) * torch.fft.rfft(h_g, n=n)
    y_g = torch.fft.irfft(spectrum, n=n)[..., geo.lag0: geo.lag0 + geo.seqlen]
    if D_g is not None:
        y_g = y_g + D_g[:, None] * x_g
    return y_g


def _conv_group_backward(dy_g: torch.Tensor, x_g: torch.Tensor | None, h_g: torch.Tensor, geo: ConvGeometry,
                         need_dx: bool, need_dh: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dx_g, dh_g) of one group: the gradient of a convolution is a correlation.

    From y[t] = sum_j h[j] x[t + lag0 - j]:
        dx[u] = sum_t dy[t] h[t + lag0 - u],    dh[j] = sum_{b, t} dy[t] x[t + lag0 - j].
    The circular correlation c[k] = sum_t dy[t] h[(t - k) mod n] is irfft(DY * conj(H)), and
    dx[u] = c[(u - lag0) mod n]; likewise for dh with X in place of H, summed over the batch
    in the frequency domain (one inverse FFT per channel, not per sequence). n is large enough
    that no index of dy, h or x wraps onto a non-zero value (see the module docstring).
    """
    n = geo.fft_len
    dy_spectrum = torch.fft.rfft(dy_g, n=n)
    dx_g = dh_g = None
    if need_dx:
        corr = torch.fft.irfft(dy_spectrum * torch.fft.rfft(h_g, n=n).conj(), n=n)
        dx_g = _undo_lag0(corr, geo.lag0, geo.seqlen)
    if need_dh:
        corr = torch.fft.irfft((dy_spectrum * torch.fft.rfft(x_g, n=n).conj()).sum(0), n=n)
        dh_g = _undo_lag0(corr, geo.lag0, geo.taps)
    return dx_g, dh_g


def fftconv_forward(x: torch.Tensor, h: torch.Tensor, D: torch.Tensor | None, geo: ConvGeometry,
                    chunk: int) -> torch.Tensor:
    """y (batch, seqlen, channels) in x's dtype, computed one channel group at a time."""
    dtype = compute_dtype(x.dtype, h.dtype)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    for cs in _channel_groups(x.shape[2], chunk):
        D_g = None if D is None else D[cs].to(dtype)
        y[:, :, cs] = _conv_group(_group(x, cs, dtype), h[cs].to(dtype), D_g, geo).transpose(1, 2)
    return y


def fftconv_backward(dy: torch.Tensor, x: torch.Tensor, h: torch.Tensor, D: torch.Tensor | None,
                     geo: ConvGeometry, chunk: int, need: tuple[bool, bool, bool]):
    """(dx, dh, dD), each in its input's dtype (None where not needed), recomputing the spectra per group."""
    need_dx, need_dh, need_dD = need
    dtype = compute_dtype(x.dtype, h.dtype)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if need_dx else None
    dh = torch.empty(h.shape, dtype=h.dtype, device=h.device) if need_dh else None
    dD = torch.empty(D.shape, dtype=D.dtype, device=D.device) if need_dD else None
    for cs in _channel_groups(x.shape[2], chunk):
        dy_g = _group(dy, cs, dtype)
        x_g = _group(x, cs, dtype) if need_dh or need_dD else None
        dx_g, dh_g = _conv_group_backward(dy_g, x_g, h[cs].to(dtype), geo, need_dx, need_dh)
        if need_dx:
            if D is not None:  # the skip term's share: d(D x)/dx = D
                dx_g = dx_g + D[cs].to(dtype)[:, None] * dy_g
            dx[:, :, cs] = dx_g.transpose(1, 2)
        if need_dh:
            dh[cs] = dh_g
        if need_dD:
            dD[cs] = (dy_g * x_g).sum((0, 2))
    return dx, dh, dD


class FFTConvFunction(torch.autograd.Function):
    """Saves only x, h and D; the backward recomputes every spectrum, group by group."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, h: torch.Tensor, D: torch.Tensor | None, geo: ConvGeometry,
                chunk: int) -> torch.Tensor:
        ctx.save_for_backward(x, h, D)
        ctx.geo, ctx.chunk = geo, chunk
        return fftconv_forward(x, h, D, geo, chunk)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        x, h, D = ctx.saved_tensors
        dx, dh, dD = fftconv_backward(dy, x, h, D, ctx.geo, ctx.chunk, ctx.needs_input_grad[:3])
        return dx, dh, dD, None, None
