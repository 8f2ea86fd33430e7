"""Hyena's long convolution, written directly: what `fftconv` computes, in O(N^2) time.

This is what a reader opens first to learn what the op computes. Per channel c, with the
filter h[c] read as a list of taps indexed by lag s:

    causal:         y[t] = sum_{s = 0}^{t}            h[c, s]         x[t - s]   (+ D[c] x[t])
    bidirectional:  y[t] = sum_{s = -(K-1)}^{K-1}     h[c, s + K - 1] x[t - s]   (+ D[c] x[t])

x[t - s] reads as 0 outside [0, seqlen). A causal filter holds K taps, lags 0..K-1; a
bidirectional one holds 2K - 1 taps, lags -(K-1)..K-1 with lag 0 at its centre. K <= seqlen
(a longer filter reaches no output). Layout: x and y are (batch, seqlen, channels), h is
(channels, K) or (channels, 2K - 1), D is (channels,).

It loops over lags, one shifted copy of x per lag, so it costs O(K) passes over x: it exists
for tests (the float64 ground truth, and plain autograd for the gradients), never for long
sequences.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def shift(x: torch.Tensor, s: int) -> torch.Tensor:
    """x[:, t - s] along dim 1, zero where t - s falls outside [0, seqlen)."""
    seqlen = x.shape[1]
    if s >= 0:
        return F.pad(x[:, : seqlen - s], (0, 0, s, 0))
    return F.pad(x[:, -s:], (0, 0, 0, -s))


def long_conv_reference(x: torch.Tensor, h: torch.Tensor, D: torch.Tensor | None = None,
                        causal: bool = True) -> torch.Tensor:
    """y (batch, seqlen, channels) in x's dtype, differentiable through plain torch autograd."""
    taps = h.shape[1]
    # Index j of the filter holds lag j - lag0: lag 0 sits first (causal) or in the middle.
    lag0 = 0 if causal else (taps - 1) // 2
    y = torch.zeros_like(x)
    for j in range(taps):
        y = y + h[:, j] * shift(x, j - lag0)
    if D is not None:
        y = y + D * x
    return y
