"""The Hyena operator (Poli et al. 2023, "Hyena Hierarchy"; HyenaDNA, Nguyen et al. 2023) as nn.Modules.

Hyena replaces attention by a recurrence of long convolutions and element-wise gates:

    v, x_1, .., x_N = split(ShortConv(Linear(u)))         N = order
    z_1 = v;   z_{i+1} = x_i * (h_i * z_i + D_i z_i)       * : convolution over the sequence
    y = Linear(z_{N+1})

The filters h_i span the whole sequence, but are implicit: a small MLP of positional
features gives every tap, so the parameter count does not grow with the length. The long
convolutions run by FFT (`genoflash.ops.hyena.fftconv_channels_first`), O(N log N) time and
O(N) memory.

Layout. The operator takes and returns (batch, seqlen, d_model) like the rest of genoflash, but
works inside on (batch, channels, seqlen): the FFTs and the short convolution run along seqlen,
so that layout makes every row they read contiguous. The input projection writes its output in
that layout and the output projection reads it there (`genoflash.ops.common.projection`:
matmuls that read the transposed operand in place), so no tensor is transposed by a copy,
forward or backward; the filter MLP likewise emits each filter as a contiguous row.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..ops.hyena import fftconv_channels_first
from ..ops.hyena.implicit_filter import implicit_filter
from ..ops.common.projection import autocast_operands, project_from_channels_first, project_to_channels_first
from ..ops.common.short_conv import depthwise_conv1d


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
    """Depthwise convolution over a few neighbouring positions: `forward` takes and returns
    (batch, seqlen, channels), `channels_first` (batch, channels, seqlen).

    Causal pads on the left only, so output t sees inputs t - kernel_size + 1 .. t; otherwise
    the window is centred (one extra position on the right for even kernels). On the triton
    backend the padding is a load mask in `genoflash.ops.common.short_conv` (no padded copy, a
    contiguous output); elsewhere nn.Conv1d runs on a padded copy."""

    def __init__(self, channels: int, kernel_size: int, causal: bool):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel_size, groups=channels)
        self.left = kernel_size - 1 if causal else (kernel_size - 1) // 2

    def channels_first(self, x: torch.Tensor, input_bias: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, channels, seqlen) -> (batch, channels, seqlen): the convolution of x + input_bias
        (channels,), if given: the bias of the linear layer before it, added here at no extra pass."""
        # (channels, 1, K) -> (channels, K) by a reshape, not `[:, 0]`: a select's backward scatters
        # into a zero-filled tensor (two kernels), a view's is the same storage reshaped.
        return depthwise_conv1d(x, self.conv.weight.flatten(1), self.conv.bias, self.left, input_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.channels_first(x.transpose(1, 2)).transpose(1, 2)


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
            the prefix/centre property above still holds. Off by default, as in HyenaDNA: with
            it on (or with the square root of the sum as divisor), a 2-layer Hyena classifier
            stayed at chance on the demo's long-range task (224 bp, 300 steps, seed 0), which
            the unnormalised filters learned (0.996; 3 of 8 seed and learning-rate runs did;
            docs/design/mixer-comparison.md). The block's
            pre-norm absorbs the growth; the option is for callers who need bounded outputs.
    """

    CONSTANTS_CACHE_BYTES = 64 * 2**20  # 256 channels x 128k taps in bf16

    def __init__(self, d_model: int, order: int, l_max: int, filter_order: int = 64, causal: bool = True,
                 num_freqs: int = 4, fast_decay: float = 0.3, slow_decay: float = 1.5, target: float = 1e-2,
                 normalize: bool = False):
        super().__init__()
        self.d_model, self.order, self.l_max, self.causal, self.num_freqs = d_model, order, l_max, causal, num_freqs
        self.mlp = nn.Sequential(
            nn.Linear(1 + 2 * num_freqs, filter_order), Sine(filter_order),
            nn.Linear(filter_order, filter_order), Sine(filter_order),
            nn.Linear(filter_order, order * d_model),
        )
        for param in self.mlp.parameters():  # HyenaDNA trains the implicit filters without weight decay
            param._no_weight_decay = True
        decay = torch.linspace(fast_decay, slow_decay, d_model)
        # Derived from the constructor's arguments, so kept out of the state dict.
        rates = math.log(1.0 / target) / decay
        self.register_buffer("rates", rates, persistent=False)
        self.register_buffer("window_sum", self._window_sum(rates.double(), l_max, causal).float()
                             if normalize else torch.ones(d_model), persistent=False)
        # (key, filters) of the last inference call; see `forward`.
        self._cache: tuple[tuple, torch.Tensor] | None = None
        # (key, (features, window)) of the last call; see `constants`.
        self._constants_cache: tuple[tuple, tuple[torch.Tensor, torch.Tensor]] | None = None

    @staticmethod
    def _window_sum(rates: torch.Tensor, l_max: int, causal: bool) -> torch.Tensor:
        """sum over lags s = 0..l_max-1 of exp(-rate |s| / l_max), doubled less the lag-0 tap when
        two-sided: a geometric series, in float64."""
        one_side = -torch.expm1(-rates) / -torch.expm1(-rates / l_max) if l_max > 1 else torch.ones_like(rates)
        return one_side if causal else 2 * one_side - 1

    def positions(self, seqlen: int) -> torch.Tensor:
        """t = lag / l_max for every tap, (taps,) in the MLP's dtype."""
        # Made on the device: a host tensor would be copied from pageable memory every call, a
        # copy that can hold the host until the GPU catches up. float64 keeps t exact-then-rounded.
        lags = torch.arange(0 if self.causal else 1 - seqlen, seqlen, dtype=torch.float64, device=self.rates.device)
        return (lags / self.l_max).to(self.mlp[0].weight.dtype)

    def features(self, t: torch.Tensor) -> torch.Tensor:
        """(taps,) -> (taps, 1 + 2 num_freqs)."""
        angles = 2 * math.pi * t[:, None] * torch.arange(1, self.num_freqs + 1, device=t.device, dtype=t.dtype)
        return torch.cat([t[:, None], torch.cos(angles), torch.sin(angles)], dim=-1)

    def constants(self, seqlen: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(features, window) for seqlen: the MLP's input (1 + 2 num_freqs, taps) and the decay
        window (d_model, taps). Neither depends on a parameter, only on seqlen and the buffers, so
        up to CONSTANTS_CACHE_BYTES of window they are kept for the next call with the same key:
        at short lengths the layer is bound by host time, and these are a dozen small ops."""
        # Under torch.compile they are made inside the graph, a few fused ops: Dynamo cannot key
        # on tensor version counters, and a compiled graph pays no host time per op.
        compiling = torch.compiler.is_compiling()
        key = None if compiling else (seqlen, self.rates.device, self.rates.dtype, self.mlp[0].weight.dtype,
                                      self.rates._version, self.window_sum._version)
        if key is not None and self._constants_cache is not None and self._constants_cache[0] == key:
            return self._constants_cache[1]
        t = self.positions(seqlen)
        x = self.features(t).mT
        window = torch.exp(-self.rates[:, None] * t.abs()) / self.window_sum[:, None]
        # Not from inference mode: its tensors could not be saved for a later backward.
        if (key is not None and window.numel() * window.element_size() <= self.CONSTANTS_CACHE_BYTES
                and not torch.is_inference_mode_enabled()):
            self._constants_cache = (key, (x, window))
        return x, window

    def filters(self, seqlen: int) -> list[torch.Tensor]:
        """[h_i for each order i], each (d_model, taps), contiguous, computed on its own.

        The MLP runs with features as columns, W @ x + b per layer, so every filter comes out
        as contiguous rows in the layout fftconv's FFTs read, and the MLP's gradients stay in
        that layout too: no transpose either way. The last layer runs once per order, so each
        h_i is its own tensor. Forward and backward are one autograd Function
        (`genoflash.ops.hyena.implicit_filter`): through autograd the same math is ~200 small ops."""
        x, window = self.constants(seqlen)
        *hidden, last = self.mlp
        pairs = list(zip(hidden[0::2], hidden[1::2]))
        if len(hidden) % 2 or not all(isinstance(a, nn.Linear) and isinstance(b, Sine) for a, b in pairs):
            raise TypeError("HyenaFilter.mlp must be (Linear, Sine) pairs followed by a Linear")
        layers = [(linear.weight, linear.bias, sine.freq) for linear, sine in pairs]
        return list(implicit_filter(x, window, layers, last.weight, last.bias, self.order))

    def _recomputed(self) -> bool:
        # Compiled inference recomputes them too: the cache keys on version counters (see constants).
        return self.training or torch.is_grad_enabled() or torch.compiler.is_compiling()

    def forward(self, seqlen: int) -> torch.Tensor:
        """The filters for seqlen as one (order, d_model, taps) tensor, recomputed each call except
        at inference.

        At inference (eval mode, no grad) they are cached. The key holds every parameter's
        version counter, so an in-place update (optimizer step, load_state_dict) recomputes."""
        if self._recomputed():
            return torch.stack(self.filters(seqlen))
        params = list(self.parameters())
        key = (seqlen, params[0].device, params[0].dtype, tuple(p._version for p in params))
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, torch.stack(self.filters(seqlen)))
        return self._cache[1]

    def per_order(self, seqlen: int) -> list[torch.Tensor] | tuple[torch.Tensor, ...]:
        """The filters one order at a time, as `HyenaOperator` uses them: `filters` when they are
        recomputed (no stacked copy, forward or backward), views of the cached `forward` otherwise."""
        return self.filters(seqlen) if self._recomputed() else self(seqlen).unbind(0)


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
        normalize_filters: divide each implicit filter by its window's sum (`HyenaFilter`).
    """

    def __init__(self, d_model: int, l_max: int, order: int = 2, filter_order: int = 64, short_filter_order: int = 3,
                 causal: bool = True, dropout: float = 0.0, channel_chunk: int | None = None,
                 normalize_filters: bool = False):
        super().__init__()
        for name, value in (("d_model", d_model), ("l_max", l_max), ("order", order), ("filter_order", filter_order),
                            ("short_filter_order", short_filter_order)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.d_model, self.l_max, self.order, self.causal = d_model, l_max, order, causal
        self.channel_chunk = channel_chunk
        self.in_proj = nn.Linear(d_model, (order + 1) * d_model)
        self.short_conv = ShortConv((order + 1) * d_model, short_filter_order, causal)
        self.filter = HyenaFilter(d_model, order, l_max, filter_order, causal, normalize=normalize_filters)
        self.skip = nn.Parameter(torch.randn(order, d_model))  # D_i: the filters' lag-0 bias
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        if u.dim() != 3 or u.shape[-1] != self.d_model:
            raise ValueError(f"expected input (batch, seqlen, {self.d_model}), got shape {tuple(u.shape)}")
        seqlen = u.shape[1]
        if seqlen > self.l_max:
            raise ValueError(f"sequence length {seqlen} exceeds l_max = {self.l_max}")
        # (batch, (order + 1) d_model, seqlen) from here to the output projection: channel slices
        # keep seqlen contiguous, so the FFTs, gates and dropout below read whole rows. The input
        # projection's bias is added inside the short convolution (no pass of its own).
        z = project_to_channels_first(*autocast_operands(u, self.in_proj.weight))
        v, *gates = self.short_conv.channels_first(z, self.in_proj.bias).split(self.d_model, dim=1)
        for gate, h, D in zip(gates, self.filter.per_order(seqlen), self.skip):
            v = self.dropout(gate * fftconv_channels_first(v, h, D, self.causal, self.channel_chunk))
        return project_from_channels_first(*autocast_operands(v, self.out_proj.weight, self.out_proj.bias))
