"""Hyena's long convolution by FFT, one channel group at a time, with a backward that recomputes.

With the filter h as stored and lag0 the index of its lag-0 tap (0 when causal, K - 1 for a
two-sided filter of 2K - 1 taps; see reference.py), every output is

    y[b, c, t] = sum_j h[c, j] x[b, c, t + lag0 - j]  +  D[c] x[b, c, t].

By FFT: zero-pad x and h to n points, multiply the spectra, invert, and read y at indices
lag0 .. lag0 + seqlen - 1 of the circular result. Index m of that result sums x at
(m - j) mod n; the smallest m - j we read is lag0 - (taps - 1), which wraps to a position at
or past seqlen (so x reads as zero there, as a linear convolution wants) as long as

    n >= seqlen + taps - 1 - lag0          (2 seqlen - 1 for a full-length filter, either way).

The same bound keeps both correlations of the backward free of wrap-around (see
`fftconv_backward`). n is rounded up to a 5-smooth size, which the FFT libraries handle at
full speed.

Layout. The code below reads x, dy and writes y, dx as (batch, channels, seqlen) views: the
FFTs run along the last dim, so a channel group's rows go straight into the FFT buffer. A
channels-last caller (`fftconv`) hands in the transposed view of its (batch, seqlen, channels)
tensor and gets its outputs allocated channels-last; only the copies into and out of the FFT
buffers then read across channels.

Memory. The FFTs run in float32 (float64 for float64 inputs), whatever the input dtype. A
channel group's spectra are the only complex tensors alive at any time: channels are
processed in groups of `channel_chunk`, and the backward recomputes the spectra group by
group instead of saving them. Autograd keeps only x, h and D, O(batch * seqlen * channels),
where keeping the fp32 spectra of all channels costs several times that.

Traffic. Each operand reaches its FFT through one write (staging.py, `load_rows`): cast to
the compute dtype, and reversed where the backward needs it, into the head of a zero-padded
buffer whose tail is zeroed once per call (`PaddedRows`), not cast, then padded, per group.
Each result leaves through one read (`write_window`): the window of the inverse FFT, its 1/n,
the skip term D x and the cast to the output dtype in one pass.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from .staging import Staging, load_rows, write_window

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


class PaddedRows:
    """A (..., chunk, n) buffer in the compute dtype for one operand's channel groups.

    Invariant: columns >= length are zero. They are zeroed once, here; `load` writes only
    columns < length, and nothing else writes the buffer (the forward FFT reads its input and
    leaves it intact), so every group after the first finds its zero padding already in place."""

    def __init__(self, lead: tuple[int, ...], chunk: int, length: int, n: int, dtype: torch.dtype, device,
                 how: Staging):
        self.buf = torch.empty(*lead, chunk, n, dtype=dtype, device=device)
        self.buf[..., length:].zero_()
        self.length, self.how = length, how

    def load(self, src: torch.Tensor, reverse: bool = False) -> torch.Tensor:
        """src (..., group, length) in any dtype and strides -> its zero-padded rows, (..., group, n),
        in one cast-and-copy; reversed along length if asked."""
        rows = self.buf[..., : src.shape[-2], :]
        load_rows(rows[..., : self.length], src, reverse, self.how)
        return rows

    def load_and_dot(self, src: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`load(src)`, and the row sums of src * other in the compute dtype, (..., group), from the same read."""
        rows = self.buf[..., : src.shape[-2], :]
        return rows, load_rows(rows[..., : self.length], src, False, self.how, dot_with=other)


def _inverse(spectrum: torch.Tensor, n: int, how: Staging) -> torch.Tensor:
    """irfft, left unnormalised when `write_window` applies the 1 / n itself (fused)."""
    return torch.fft.irfft(spectrum, n=n, norm="forward" if how.fused else "backward")


def _batch_sum(spectrum: torch.Tensor) -> torch.Tensor:
    """Sum over dim 0; at batch 1 a view, not a copy."""
    return spectrum[0] if spectrum.shape[0] == 1 else spectrum.sum(0)


def _swap_if(t: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """Between the caller's layout and the (batch, channels, seqlen) view the code below works on:
    the transposed view if channels_last, else t itself. Its own inverse, and never a copy."""
    return t.transpose(1, 2) if channels_last else t


def _empty_activation(like: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """A new (batch, channels, seqlen) view shaped and typed like `like`, over contiguous storage in
    the caller's layout: (batch, seqlen, channels) if channels_last, else (batch, channels, seqlen).
    Allocating by layout, not `empty_like`, keeps outputs contiguous whatever strides x had."""
    batch, channels, seqlen = like.shape
    if channels_last:
        return torch.empty(batch, seqlen, channels, dtype=like.dtype, device=like.device).transpose(1, 2)
    return torch.empty(batch, channels, seqlen, dtype=like.dtype, device=like.device)


def fftconv_forward(x: torch.Tensor, h: torch.Tensor, D: torch.Tensor | None, geo: ConvGeometry,
                    chunk: int, channels_last: bool, how: Staging) -> torch.Tensor:
    """y in x's layout and dtype, computed one channel group at a time. x is (batch, seqlen,
    channels) if channels_last, else (batch, channels, seqlen).

    y[t] = sum_j h[j] x[t + lag0 - j] is the circular convolution of the padded rows read at
    t + lag0 (module docstring)."""
    xc = _swap_if(x, channels_last)
    batch, channels, _ = xc.shape
    dtype, n = compute_dtype(x.dtype, h.dtype), geo.fft_len
    width = min(chunk, channels)
    yc = _empty_activation(xc, channels_last)
    x_rows = PaddedRows((batch,), width, geo.seqlen, n, dtype, x.device, how)
    h_rows = PaddedRows((), width, geo.taps, n, dtype, x.device, how)
    for cs in _channel_groups(channels, chunk):
        spectrum = torch.fft.rfft(x_rows.load(xc[:, cs]))
        spectrum.mul_(torch.fft.rfft(h_rows.load(h[cs])))  # in place: the product needs no third spectrum
        conv = _inverse(spectrum, n, how)
        del spectrum  # before the next group's rfft, so at most one group's spectra are alive
        # D in its own dtype: write_window computes in the compute dtype (to which D casts exactly).
        write_window(yc[:, cs], conv, geo.lag0, None if D is None else D[cs], xc[:, cs], how)
    return _swap_if(yc, channels_last)


def fftconv_backward(dy: torch.Tensor, x: torch.Tensor, h: torch.Tensor, D: torch.Tensor | None,
                     geo: ConvGeometry, chunk: int, channels_last: bool, how: Staging,
                     need: tuple[bool, bool, bool]):
    """(dx, dh, dD), each in its input's dtype (dx also in x's layout; None where not needed),
    recomputing the spectra per group.

    The gradient of a convolution is a correlation. From y[t] = sum_j h[j] x[t + lag0 - j]:
        dx[u] = sum_t dy[t] h[t + lag0 - u],    dh[j] = sum_{b, t} dy[t] x[t + lag0 - j].
    With the other operand reversed as it is loaded, hr[i] = h[taps - 1 - i] and
    xr[i] = x[seqlen - 1 - i], both become plain convolutions:
        dx[u] = (dy * hr)[u + taps - 1 - lag0],      dh[j] = sum_b (dy * xr)[j + seqlen - 1 - lag0],
    so the spectra multiply as in the forward, with no conjugate (which torch would materialise
    as one more pass over a spectrum). dh sums over the batch in the frequency domain: one
    inverse FFT per channel, not per sequence. The reads stay inside [0, n), and every index
    that wraps lands at or past seqlen, on zeros, because n >= seqlen + taps - 1 - lag0 and
    taps - 1 >= 2 lag0 (so n >= seqlen + lag0).
    """
    need_dx, need_dh, need_dD = need
    dyc, xc = _swap_if(dy, channels_last), _swap_if(x, channels_last)
    batch, channels, seqlen = xc.shape
    dtype, n, device = compute_dtype(x.dtype, h.dtype), geo.fft_len, x.device
    width = min(chunk, channels)
    dxc = _empty_activation(xc, channels_last) if need_dx else None
    dh = torch.empty(h.shape, dtype=h.dtype, device=h.device) if need_dh else None
    dD = torch.empty(D.shape, dtype=D.dtype, device=D.device) if need_dD else None
    # dy's rows, then x's: x is loaded only once dy's spectrum and the dD products are taken.
    rows = PaddedRows((batch,), width, seqlen, n, dtype, device, how)
    h_rows = PaddedRows((), width, geo.taps, n, dtype, device, how) if need_dx else None
    for cs in _channel_groups(channels, chunk):
        # dD = sum_{b, t} dy x, its products in the compute dtype (x's cast to it is exact) as in
        # the skip term's forward, read while dy is loaded.
        if need_dD:
            dy_g, dots = rows.load_and_dot(dyc[:, cs], xc[:, cs])
            dD[cs] = dots.sum(0)
        else:
            dy_g = rows.load(dyc[:, cs])
        if not (need_dx or need_dh):
            continue
        dy_spectrum = torch.fft.rfft(dy_g)
        if need_dh:
            product = dy_spectrum * torch.fft.rfft(rows.load(xc[:, cs], reverse=True))
            corr = _inverse(_batch_sum(product), n, how)
            del product
            write_window(dh[cs], corr, seqlen - 1 - geo.lag0, None, None, how)
        if need_dx:  # the skip term's share, D dy, is added in the same pass: d(D x)/dx = D
            dy_spectrum.mul_(torch.fft.rfft(h_rows.load(h[cs], reverse=True)))  # dy's spectrum is not needed after
            corr = _inverse(dy_spectrum, n, how)
            write_window(dxc[:, cs], corr, geo.taps - 1 - geo.lag0, None if D is None else D[cs], dyc[:, cs], how)
        del dy_spectrum
    return (None if dxc is None else _swap_if(dxc, channels_last)), dh, dD


class FFTConvFunction(torch.autograd.Function):
    """Saves only x, h and D; the backward recomputes every spectrum, group by group."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, h: torch.Tensor, D: torch.Tensor | None, geo: ConvGeometry,
                chunk: int, channels_last: bool, how: Staging) -> torch.Tensor:
        ctx.save_for_backward(x, h, D)
        ctx.geo, ctx.chunk, ctx.channels_last, ctx.how = geo, chunk, channels_last, how
        return fftconv_forward(x, h, D, geo, chunk, channels_last, how)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        x, h, D = ctx.saved_tensors
        dx, dh, dD = fftconv_backward(dy, x, h, D, ctx.geo, ctx.chunk, ctx.channels_last, ctx.how,
                                      ctx.needs_input_grad[:3])
        return dx, dh, dD, None, None, None, None
