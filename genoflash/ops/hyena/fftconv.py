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
buffer whose tail is zeroed once per call (`StagedRows`), not cast, then padded, per group.
The operands of a pass share that buffer; at short lengths, where host time per op bounds
the layer, one batched rfft per group transforms them all. Each result leaves through one read
(`write_window`): the window of the inverse FFT, its 1/n, the skip term D x and the cast to
the output dtype in one pass.
"""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=256)  # a pure function of one int, asked on every call (host time)
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
    # Dynamo traces through lru_cache (and warns): while compiling, the plain function, the same value.
    size = fft_size.__wrapped__ if torch.compiler.is_compiling() else fft_size
    return ConvGeometry(seqlen, taps, lag0, size(seqlen + taps - 1 - lag0))


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """float64 if any operand is float64, else float32: the FFTs never run in half precision."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def auto_channel_chunk(batch: int, channels: int, geo: ConvGeometry, dtype: torch.dtype) -> int:
    """Channels per group such that one group's spectrum of x stays near GROUP_SPECTRUM_BYTES.

    A channel's spectrum holds n / 2 + 1 complex numbers, about n reals: 8 MiB at 1M tokens in fp32."""
    per_channel = batch * geo.fft_len * dtype.itemsize
    return max(1, min(channels, GROUP_SPECTRUM_BYTES // per_channel))


def _channel_groups(channels: int, chunk: int):
    return (slice(c0, min(c0 + chunk, channels)) for c0 in range(0, channels, chunk))


class StagedRows:
    """One (slots, chunk, n) buffer in the compute dtype for the operands a pass transforms. At
    short lengths, where the layer is bound by host time per op (docs/design/hyena.md), each
    operand has its own slots and one batched rfft per group transforms them all; at long ones
    `spectrum` transforms slot by slot, and the backward lets operands take turns in the slots.

    `lengths[s]` is the length of the rows slot s holds (an activation fills `batch` slots, a
    filter one). Invariant: in slot s, columns >= lengths[s] are zero. They are zeroed once, here,
    one `zero_` per run of slots of equal length; `load` writes only columns < lengths[s], and
    nothing else writes the buffer (rfft reads its input and leaves it intact), so every group
    after the first finds its padding in place."""

    def __init__(self, lengths: list[int], chunk: int, n: int, dtype: torch.dtype, device, how: Staging):
        self.buf = torch.empty(len(lengths), chunk, n, dtype=dtype, device=device)
        start = 0
        while start < len(lengths):
            stop = start
            while stop < len(lengths) and lengths[stop] == lengths[start]:
                stop += 1
            self.buf[start:stop, :, lengths[start]:].zero_()
            start = stop
        self.lengths, self.how = lengths, how

    def load(self, slot: int, src: torch.Tensor, reverse: bool = False) -> None:
        """src (rows, group, length) or (group, length), any dtype and strides -> slots
        [slot, slot + rows), cast in the same copy; reversed along length if asked."""
        src3 = src if src.dim() == 3 else src[None]
        rows, group, length = src3.shape
        assert all(self.lengths[s] == length for s in range(slot, slot + rows)), "slot holds another length"
        load_rows(self.buf[slot: slot + rows, :group, :length], src3, reverse, self.how)

    def spectrum(self, group: int, last: bool, slots: slice = slice(None)) -> torch.Tensor:
        """rfft of the first `group` rows of `slots` (all by default): (slots, group, n // 2 + 1), in
        one batched call where the host bounds the layer (short lengths). `last`: no rfft of this
        buffer follows, so it is released at once and the products and inverse FFTs that follow
        reuse its memory."""
        rows = self.buf[slots, :group]
        if self.how.fused:
            # Large groups (where the staging kernels run): one rfft per slot, into one spectrum.
            # cuFFT's work area grows with the batch of one call (the suspected part of +0.27 GiB
            # at 64k with three slots in one call); the extra calls cost
            # nothing that matters at these sizes, where the GPU, not the host, bounds the layer.
            spectrum = torch.empty(*rows.shape[:-1], self.buf.shape[-1] // 2 + 1, dtype=rows.dtype.to_complex(),
                                   device=rows.device)
            for slot in range(rows.shape[0]):
                torch.fft.rfft(rows[slot], out=spectrum[slot])
        else:
            spectrum = torch.fft.rfft(rows)
        if last:
            self.buf = None  # stream-ordered: the allocator hands it out only after the rfft ran
        return spectrum


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
    yc = _empty_activation(xc, channels_last)
    # Slots 0 .. batch - 1 hold x's rows, slot batch h's: one rfft per group for both.
    rows = StagedRows([geo.seqlen] * batch + [geo.taps], min(chunk, channels), n, dtype, x.device, how)
    for cs in _channel_groups(channels, chunk):
        rows.load(0, xc[:, cs])
        rows.load(batch, h[cs])
        spectrum = rows.spectrum(cs.stop - cs.start, last=cs.stop == channels)
        product = spectrum[:batch]
        product.mul_(spectrum[batch])  # in place: the product needs no spectrum of its own
        conv = _inverse(product, n, how)
        del spectrum, product  # before the next group's rfft, so at most one group's spectra are alive
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

    The skip term D x is a lag-0 tap outside h, so dD = sum_{b, t} dy x is dh's lag-0 entry:
    index seqlen - 1 of the same correlation, read there at the cost of one small copy.
    """
    need_dx, need_dh, need_dD = need
    dyc, xc = _swap_if(dy, channels_last), _swap_if(x, channels_last)
    batch, channels, seqlen = xc.shape
    dtype, n, device = compute_dtype(x.dtype, h.dtype), geo.fft_len, x.device
    dxc = _empty_activation(xc, channels_last) if need_dx else None
    dh = torch.empty(h.shape, dtype=h.dtype, device=h.device) if need_dh else None
    dD = torch.empty(D.shape, dtype=D.dtype, device=D.device) if need_dD else None
    # Where the host bounds the layer (short lengths, torch staging), every operand has its own
    # slots and one rfft per group transforms dy, x reversed (for dh) and h reversed (for dx)
    # together. Where the GPU does (the staging kernels' sizes), memory matters more than op
    # count: x's rows take dy's slots once dy's spectrum is taken, and each is transformed on
    # its own, so at most two spectra of a group are alive, as before the slots were shared.
    together = not how.fused
    x_slot = batch if together else 0
    h_slot = batch * (2 if together and need_dh else 1)
    lengths = [seqlen] * (h_slot if need_dh else batch) + ([geo.taps] if need_dx else [])
    rows = StagedRows(lengths, min(chunk, channels), n, dtype, device, how) if (need_dx or need_dh) else None
    for cs in _channel_groups(channels, chunk):
        if need_dD and not need_dh:  # no correlation to read it from: the direct sum, in the compute dtype
            dD[cs] = (dyc[:, cs].to(dtype) * xc[:, cs].to(dtype)).sum((0, 2))
        if rows is None:
            continue
        group, last = cs.stop - cs.start, cs.stop == channels
        rows.load(0, dyc[:, cs])
        if together:
            if need_dh:
                rows.load(x_slot, xc[:, cs], reverse=True)
            if need_dx:
                rows.load(h_slot, h[cs], reverse=True)
            spectrum = rows.spectrum(group, last)
            dy_spectrum = spectrum[:batch]
        else:
            spectrum = None
            dy_spectrum = rows.spectrum(group, False, slots=slice(0, batch))
        if need_dh:
            if together:
                product = spectrum[x_slot: x_slot + batch]
            else:  # into dy's slots, whose spectrum is taken
                rows.load(x_slot, xc[:, cs], reverse=True)
                product = rows.spectrum(group, last and not need_dx, slots=slice(x_slot, x_slot + batch))
            product.mul_(dy_spectrum)  # x's spectrum is not needed after
            corr = _inverse(_batch_sum(product), n, how)
            del product
            write_window(dh[cs], corr, seqlen - 1 - geo.lag0, None, None, how)
            if need_dD:  # dh's lag-0 entry; a fused corr is unnormalised (write_window scales it)
                torch.mul(corr[:, seqlen - 1], 1.0 / n if how.fused else 1.0, out=dD[cs])
            del corr
        if need_dx:  # the skip term's share, D dy, is added in the same pass: d(D x)/dx = D
            if together:
                h_spectrum = spectrum[h_slot]
            else:
                rows.load(h_slot, h[cs], reverse=True)
                h_spectrum = rows.spectrum(group, last, slots=slice(h_slot, h_slot + 1))[0]
            dy_spectrum.mul_(h_spectrum)  # dy's spectrum is not needed after
            del h_spectrum
            corr = _inverse(dy_spectrum, n, how)
            write_window(dxc[:, cs], corr, geo.taps - 1 - geo.lag0, None if D is None else D[cs], dyc[:, cs], how)
        del spectrum, dy_spectrum
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
