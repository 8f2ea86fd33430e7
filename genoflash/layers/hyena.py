"""The Hyena operator (Poli et al. 2023, "Hyena Hierarchy"; HyenaDNA, Nguyen et al. 2023) as nn.Modules.

Hyena replaces attention by a recurrence of long convolutions and element-wise gates:

    v, x_1, .., x_N = split(ShortConv(Linear(u)))         N = order
    z_1 = v;   z_{i+1} = x_i * (h_i * z_i + D_i z_i)       * : convolution over the sequence
    y = Linear(z_{N+1})

The filters h_i span the whole sequence, but are implicit: a small MLP of positional
features gives every tap, so the parameter count does not grow with the length. The long
convolutions run by FFT (`genoflash.ops.hyena.fftconv`), O(N log N) time and O(N) memory.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.hyena import fftconv


class Sine(nn.Module):
    """sin(freq * x) with a learnable frequency per feature: the activation of the filter MLP.

    Periodic, so a filter can oscillate along the sequence; smooth, so neighbouring taps stay
    correlated."""

    def __init__(self, dim: int, freq: float = 1.0):
        super().__init__()
        self.freq = nn.Parameter(torch.full((dim,), freq))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.freq * x)


class ShortConv(nn.Module):
    """Depthwise convolution over a few neighbouring positions, (batch, seqlen, channels) in and out.

    Causal pads on the left only, so output t sees inputs t - kernel_size + 1 .. t; otherwise
    the window is centred (one extra position on the right for even kernels)."""

    def __init__(self, channels: int, kernel_size: int, causal: bool):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel_size, groups=channels)
        left = kernel_size - 1 if causal else (kernel_size - 1) // 2
        self.padding = (left, kernel_size - 1 - left)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x.transpose(1, 2), self.padding)).transpose(1, 2)


class HyenaFilter(nn.Module):
    """Implicit long filters: h[i, c, lag] = window_c(lag) * MLP(features(lag))[i, c].

    Returns (order, d_model, taps) for a sequence of length seqlen: taps = seqlen holding lags
    0..seqlen-1 when causal, taps = 2 seqlen - 1 holding lags -(seqlen-1)..seqlen-1 otherwise
    (the layout `fftconv` expects).

    Positions are normalised by l_max, not by seqlen, so the filter for a shorter sequence is
    the centre (or prefix, causal) of the filter for l_max: a sequence sees the same filter
    whatever length it is cut to.

    Args:
        filter_order: width of the MLP's two hidden layers.
        num_freqs: the positional features of lag s, with t = s / l_max, are t, cos(2 pi k t)
            and sin(2 pi k t) for k = 1..num_freqs.
        fast_decay, slow_decay, target: the window exp(-rate_c |t|) of channel c falls to
            `target` at |t| = decay_c, with decay_c spaced evenly from fast_decay to slow_decay
            over the channels: some channels stay local, others keep long memory.
        normalize: divide channel c's filter by the sum of its window over all l_max lags
            (in closed form). A slowly decaying window has O(l_max) taps of size O(1), so
            without this a convolution's output grows like l_max, and an order-2 operator's
            like l_max^2: 10^12 at a million tokens. The divisor does not depend on seqlen, so
            the prefix/centre property above still holds. (HyenaDNA does not normalise.)
    """

    def __init__(self, d_model: int, order: int, l_max: int, filter_order: int = 64, causal: bool = True,
                 num_freqs: int = 4, fast_decay: float = 0.3, slow_decay: float = 1.5, target: float = 1e-2,
                 normalize: bool = True):
        super().__init__()
        self.d_model, self.order, self.l_max, self.causal, self.num_freqs = d_model, order, l_max, causal, num_freqs
        self.mlp = nn.Sequential(
            nn.Linear(1 + 2 * num_freqs, filter_order), Sine(filter_order),
            nn.Linear(filter_order, filter_order), Sine(filter_order),
            nn.Linear(filter_order, order * d_model),
        )
        decay = torch.linspace(fast_decay, slow_decay, d_model)
        # Derived from the constructor's arguments, so kept out of the state dict.
        rates = math.log(1.0 / target) / decay
        self.register_buffer("rates", rates, persistent=False)
        self.register_buffer("window_sum", self._window_sum(rates.double(), l_max, causal).float()
                             if normalize else torch.ones(d_model), persistent=False)
        # (key, filters) of the last inference call; see `forward`.
        self._cache: tuple[tuple, torch.Tensor] | None = None

    @staticmethod
    def _window_sum(rates: torch.Tensor, l_max: int, causal: bool) -> torch.Tensor:
        """sum over lags s = 0..l_max-1 of exp(-rate |s| / l_max), doubled less the lag-0 tap when
        two-sided: a geometric series, in float64."""
        one_side = -torch.expm1(-rates) / -torch.expm1(-rates / l_max) if l_max > 1 else torch.ones_like(rates)
        return one_side if causal else 2 * one_side - 1

    def positions(self, seqlen: int) -> torch.Tensor:
        """t = lag / l_max for every tap, (taps,) in the MLP's dtype."""
        lags = torch.arange(0 if self.causal else 1 - seqlen, seqlen, dtype=torch.float64)
        return (lags / self.l_max).to(self.rates.device, self.mlp[0].weight.dtype)

    def features(self, t: torch.Tensor) -> torch.Tensor:
        """(taps,) -> (taps, 1 + 2 num_freqs)."""
        angles = 2 * math.pi * t[:, None] * torch.arange(1, self.num_freqs + 1, device=t.device, dtype=t.dtype)
        return torch.cat([t[:, None], torch.cos(angles), torch.sin(angles)], dim=-1)

    def filters(self, seqlen: int) -> torch.Tensor:
        t = self.positions(seqlen)
        taps = self.mlp(self.features(t)).view(-1, self.order, self.d_model)
        window = torch.exp(-self.rates * t.abs()[:, None]) / self.window_sum  # (taps, d_model)
        # (taps, order, d_model) -> (order, d_model, taps) as a view: fftconv takes any strides.
        return (taps * window[:, None, :]).permute(1, 2, 0)

    def forward(self, seqlen: int) -> torch.Tensor:
        """The filters for seqlen, recomputed each call except at inference.

        At inference (eval mode, no grad) they are cached. The key holds every parameter's
        version counter, so an in-place update (optimizer step, load_state_dict) recomputes."""
        if self.training or torch.is_grad_enabled():
            return self.filters(seqlen)
        params = list(self.parameters())
        key = (seqlen, params[0].device, params[0].dtype, tuple(p._version for p in params))
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self.filters(seqlen))
        return self._cache[1]


class HyenaOperator(nn.Module):
    """Hyena sequence mixer: (batch, seqlen, d_model) -> (batch, seqlen, d_model), seqlen <= l_max.

    Args:
        order: number of (long convolution, gate) steps; the input projection gives order + 1
            streams of d_model channels (v and one gate per step).
        filter_order: hidden width of the implicit filter MLP (`HyenaFilter`).
        short_filter_order: kernel size of the depthwise convolution after the input projection.
        causal: output t depends on inputs 0..t only (both the short and the long filters).
        dropout: applied to each step's gated output, in training mode.
        channel_chunk: channels per FFT group in `fftconv` (None: automatic).
    """

    def __init__(self, d_model: int, l_max: int, order: int = 2, filter_order: int = 64, short_filter_order: int = 3,
                 causal: bool = True, dropout: float = 0.0, channel_chunk: int | None = None):
        super().__init__()
        for name, value in (("d_model", d_model), ("l_max", l_max), ("order", order), ("filter_order", filter_order),
                            ("short_filter_order", short_filter_order)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.d_model, self.l_max, self.order, self.causal = d_model, l_max, order, causal
        self.channel_chunk = channel_chunk
        self.in_proj = nn.Linear(d_model, (order + 1) * d_model)
        self.short_conv = ShortConv((order + 1) * d_model, short_filter_order, causal)
        self.filter = HyenaFilter(d_model, order, l_max, filter_order, causal)
        self.skip = nn.Parameter(torch.randn(order, d_model))  # D_i: the filters' lag-0 bias
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        if u.dim() != 3 or u.shape[-1] != self.d_model:
            raise ValueError(f"expected input (batch, seqlen, {self.d_model}), got shape {tuple(u.shape)}")
        seqlen = u.shape[1]
        if seqlen > self.l_max:
            raise ValueError(f"sequence length {seqlen} exceeds l_max = {self.l_max}")
        v, *gates = self.short_conv(self.in_proj(u)).split(self.d_model, dim=-1)
        for gate, h, D in zip(gates, self.filter(seqlen), self.skip):
            v = self.dropout(gate * fftconv(v, h, D, self.causal, self.channel_chunk))
        return self.out_proj(v)
