"""Hyena's long convolution: reference.py (what it computes, as direct sums), fftconv.py (the
FFT implementation, channel-grouped, with a recomputing backward), interface.py (`fftconv`,
`fftconv_channels_first`)."""

from .interface import fftconv, fftconv_channels_first
from .reference import long_conv_reference

__all__ = ["fftconv", "fftconv_channels_first", "long_conv_reference"]
