"""Hyena's long convolution: reference.py (what it computes, as direct sums), fftconv.py (the
FFT implementation, channel-grouped, with a recomputing backward), interface.py (`fftconv`)."""

from .interface import fftconv
from .reference import long_conv_reference

__all__ = ["fftconv", "long_conv_reference"]
