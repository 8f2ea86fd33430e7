"""An Enformer-style encoder (Avsec et al. 2021): a conv tower pools bases into bins, a
transformer relates the bins, heads predict tracks per bin.

one-hot (batch, L, 4)
  -> stem: conv (15 bp), residual pointwise conv block, pool /2
  -> tower: log2(bin_size) - 1 stages of conv block (5), residual pointwise conv block,
     pool /2; channels grow geometrically from dim/2 to dim
  -> (batch, L / bin_size, dim) bin embeddings
  -> depth pre-norm blocks of non-causal genoflash attention (RoPE) + SwiGLU
  -> heads: softplus tracks per bin, and classification logits from the mean over bins.

Differences from the published Enformer: RoPE instead of relative-position basis
functions, SwiGLU instead of the ReLU MLP, no cropping or final pointwise layer, and
RMSNorm over channels in the conv blocks instead of BatchNorm. The last makes the tower
a per-position function of its input window in training and eval alike, so
`encode_long` can run it chunk by chunk over a chromosome and get the same bins.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..data.onehot import one_hot
from ..layers import MultiHeadAttention
from .blocks import PreNormBlock, RMSNorm, swiglu_hidden

POOLINGS = ("attention", "max")


@dataclass
class EnformerConfig:
    """Shape of an Enformer; saved as config.json by `save_pretrained`.

    Attributes:
        dim, depth, nheads: transformer width, number of blocks, attention heads.
        bin_size: bases per output bin, a power of two >= 4 (one pool /2 in the stem, the
            rest in the tower).
        stem_kernel_size, tower_kernel_size: odd conv widths ('same' padding).
        pooling: "attention" (Enformer's softmax-weighted pool) or "max".
        channel_multiple: tower channels between dim/2 and dim are rounded to multiples of it.
        ffn_mult: SwiGLU hidden width is ffn_mult * dim, rounded up to a multiple of 64.
        window_size: attention window in bins on each side; -1 is global.
        rotary_base, rotary_interpolation: RoPE over bin positions.
        rotary_fused: RoPE inside the attention kernels instead of a pass before them.
        attn_dropout: dropout on the attention probabilities (training only), fused.
        heads: name -> number of tracks predicted per bin (softplus: counts are >= 0).
        class_heads: name -> number of classes predicted per sequence from the mean bin.
    """

    dim: int = 1536
    depth: int = 11
    nheads: int = 8
    bin_size: int = 128
    stem_kernel_size: int = 15
    tower_kernel_size: int = 5
    pooling: str = "attention"
    channel_multiple: int = 128
    ffn_mult: float = 2.0
    window_size: int = -1
    rotary_base: float = 10000.0
    rotary_interpolation: float = 1.0
    rotary_fused: bool = False
    attn_dropout: float = 0.0
    heads: dict[str, int] = field(default_factory=lambda: {"human": 5313, "mouse": 1643})
    class_heads: dict[str, int] = field(default_factory=dict)

    def __post_init__(self):
        if self.dim % 2 or self.dim % self.nheads:
            raise ValueError(f"dim ({self.dim}) must be even and divisible by nheads ({self.nheads})")
        if self.bin_size < 4 or self.bin_size & (self.bin_size - 1):
            raise ValueError(f"bin_size must be a power of two >= 4, got {self.bin_size}")
        if self.stem_kernel_size % 2 == 0 or self.tower_kernel_size % 2 == 0:
            raise ValueError("stem_kernel_size and tower_kernel_size must be odd ('same' padding)")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if set(self.heads) & set(self.class_heads):
            raise ValueError(f"head names used twice: {sorted(set(self.heads) & set(self.class_heads))}")

    @property
    def tower_channels(self) -> list[int]:
        """Output channels of each tower stage: dim/2 geometrically up to dim (Enformer's
        exponential_linspace_int), the ends exact and the rest rounded to channel_multiple (never
        below dim/2, so small test models keep non-empty convolutions)."""
        stages, start = int(math.log2(self.bin_size)) - 1, self.dim // 2
        if stages == 1:
            return [self.dim]
        channels = [max(start, self.channel_multiple * round(start * 2 ** (i / (stages - 1)) / self.channel_multiple))
                    for i in range(stages)]
        channels[0], channels[-1] = start, self.dim
        return channels


class ConvBlock(nn.Module):
    """RMSNorm over channels -> GELU -> conv ('same' padding): (B, C_in, L) -> (B, C_out, L)."""

    def __init__(self, channels_in: int, channels_out: int, kernel_size: int):
        super().__init__()
        self.norm = RMSNorm(channels_in)
        self.conv = nn.Conv1d(channels_in, channels_out, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.gelu(self.norm(x.transpose(1, 2)).transpose(1, 2)))


class Residual(nn.Module):
    """x + fn(x)."""

    def __init__(self, fn: nn.Module):
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fn(x)


class AttentionPool(nn.Module):
    """Enformer's pool: each output is a softmax-weighted mean of pool_size neighbours, with
    per-channel weights from a pointwise conv (initialised to 2 x identity, i.e. near max pooling
    of the channel itself). (B, C, L) -> (B, C, L / pool_size); L must divide."""

    def __init__(self, channels: int, pool_size: int = 2):
        super().__init__()
        self.pool_size = pool_size
        self.to_logits = nn.Conv1d(channels, channels, 1, bias=False)
        with torch.no_grad():
            nn.init.dirac_(self.to_logits.weight).mul_(2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, n = x.shape
        logits = self.to_logits(x).view(b, c, n // self.pool_size, self.pool_size)
        return (x.view(b, c, n // self.pool_size, self.pool_size) * logits.softmax(-1)).sum(-1)


def _pool(kind: str, channels: int) -> nn.Module:
    return AttentionPool(channels) if kind == "attention" else nn.MaxPool1d(2)


class ConvTower(nn.Module):
    """one-hot (B, L, 4) -> bin embeddings (B, L / bin_size, dim); L must be a multiple of bin_size.

    Each bin depends only on the `receptive_field` bases around it, which is what lets
    `forward_chunked` cut a chromosome into overlapping windows.
    """

    def __init__(self, config: EnformerConfig):
        super().__init__()
        self.bin_size = config.bin_size
        stem = config.dim // 2
        self.stem = nn.Sequential(
            nn.Conv1d(4, stem, config.stem_kernel_size, padding=config.stem_kernel_size // 2),
            Residual(ConvBlock(stem, stem, 1)),
            _pool(config.pooling, stem))
        channels = [stem] + config.tower_channels
        self.stages = nn.Sequential(*(
            nn.Sequential(ConvBlock(c_in, c_out, config.tower_kernel_size),
                          Residual(ConvBlock(c_out, c_out, 1)),
                          _pool(config.pooling, c_out))
            for c_in, c_out in zip(channels[:-1], channels[1:])))

    def forward(self, onehot: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(onehot.transpose(1, 2))).transpose(1, 2)

    @property
    def receptive_field(self) -> int:
        """Bases of input one output bin depends on (its own bin_size included).

        Walks the layers in execution order (modules() is registration order, which is
        execution order here): a conv of width k adds (k - 1) x the current stride, a
        pool /2 adds 1 x the stride and doubles it. Residual branches are pointwise.
        """
        field_, stride = 1, 1
        for module in self.modules():
            if isinstance(module, nn.Conv1d):
                field_ += (module.kernel_size[0] - 1) * module.dilation[0] * stride
            elif isinstance(module, (AttentionPool, nn.MaxPool1d)):
                field_ += stride
                stride *= 2
        return field_

    @property
    def context_bins(self) -> int:
        """Bins of context a chunk needs on each side so its inner bins come out exact.

        A bin's dependencies span receptive_field bases, its own bin_size among them, so
        neither side reaches further than receptive_field - bin_size bases.
        """
        return math.ceil((self.receptive_field - self.bin_size) / self.bin_size)

    def forward_chunked(self, fetch: Callable[[int, int], torch.Tensor], length: int,
                        chunk_bins: int, n_value: float = 0.25) -> torch.Tensor:
        """The bin embeddings of a `length`-base sequence, computed chunk_bins bins at a time.

        fetch(start, end) returns bases [start, end) as tokens (B, end - start) of any
        integer dtype or a one-hot (B, end - start, 4). Each chunk (plus context_bins of
        context each side) is moved to the tower's device and turned into a one-hot
        there, so only one chunk's one-hot ever exists. Chunk edges sit on bin
        boundaries, so every pool sees the same pairs as in a single pass; the sequence's
        own ends get the same zero padding as in `forward`.
        """
        if length <= 0 or length % self.bin_size:
            raise ValueError(f"length must be a positive multiple of bin_size ({self.bin_size}), "
                             f"got {length}; pad the sequence (N or [PAD]) to a whole bin")
        if chunk_bins < 1:
            raise ValueError(f"chunk_bins must be >= 1, got {chunk_bins}")
        weight = self.stem[0].weight
        nbins, context = length // self.bin_size, self.context_bins
        out = None
        for first in range(0, nbins, chunk_bins):
            last = min(first + chunk_bins, nbins)
            lo, hi = max(0, first - context), min(nbins, last + context)
            chunk = fetch(lo * self.bin_size, hi * self.bin_size)
            if chunk.dim() not in (2, 3) or chunk.shape[1] != (hi - lo) * self.bin_size:
                raise ValueError(f"fetch({lo * self.bin_size}, {hi * self.bin_size}) returned shape "
                                 f"{tuple(chunk.shape)}; expected tokens (batch, {(hi - lo) * self.bin_size}) "
                                 f"or a one-hot (batch, {(hi - lo) * self.bin_size}, 4)")
            if chunk.is_floating_point():
                chunk = chunk.to(weight.device, weight.dtype)
            else:  # tokens: 1 byte per base until here; long only for the one-hot lookup
                chunk = one_hot(chunk.to(weight.device).long(), n_value=n_value, dtype=weight.dtype)
            bins = self(chunk)[:, first - lo:last - lo]
            if out is None:
                out = bins.new_empty(bins.shape[0], nbins, bins.shape[2])
            out[:, first:last] = bins
        return out


class Enformer(nn.Module):
    """one-hot (B, L, 4) -> {head name: (B, L / bin_size, tracks)} and {class head: (B, classes)}.

    `forward(onehot)`, or `forward(input_ids=tokens)` with token ids (B, L) (one-hot with N as
    0.25, in the weights' dtype). The output is a plain dict of the heads: no loss, since the
    loss of a track head (Poisson, MSE, ...) is the task's choice.
    """

    def __init__(self, config: EnformerConfig):
        super().__init__()
        self.config = config
        window = (config.window_size, config.window_size)
        ffn_hidden = swiglu_hidden(config.dim, config.ffn_mult)
        self.tower = ConvTower(config)
        self.blocks = nn.ModuleList(
            PreNormBlock(config.dim, MultiHeadAttention(
                config.dim, config.nheads, window_size=window, rotary_base=config.rotary_base,
                rotary_interpolation=config.rotary_interpolation, rotary_fused=config.rotary_fused,
                dropout=config.attn_dropout),
                ffn_hidden)
            for _ in range(config.depth))
        self.norm = RMSNorm(config.dim)
        self.heads = nn.ModuleDict({name: nn.Linear(config.dim, n) for name, n in config.heads.items()})
        self.class_heads = nn.ModuleDict({name: nn.Linear(config.dim, n)
                                          for name, n in config.class_heads.items()})

    def forward(self, onehot: torch.Tensor | None = None, *,
                input_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if (onehot is None) == (input_ids is None):
            raise TypeError("Enformer takes a one-hot (onehot) or token ids (input_ids), one of the two; got "
                            + ("both" if onehot is not None else "neither"))
        if input_ids is not None:
            if input_ids.dim() != 2 or input_ids.is_floating_point():
                raise ValueError(f"input_ids must be integer token ids (batch, length), got "
                                 f"{tuple(input_ids.shape)} {input_ids.dtype}")
            onehot = one_hot(input_ids.long(), dtype=self.tower.stem[0].weight.dtype)
        if onehot.dim() != 3 or onehot.shape[-1] != 4 or not onehot.is_floating_point():
            raise ValueError(f"expected a float one-hot (batch, length, 4), got {tuple(onehot.shape)} "
                             f"{onehot.dtype}; for token ids pass input_ids= (or encode_long)")
        if onehot.shape[1] == 0 or onehot.shape[1] % self.config.bin_size:
            raise ValueError(f"length must be a positive multiple of bin_size ({self.config.bin_size}), "
                             f"got {onehot.shape[1]}")
        return self.predict(self.tower(onehot))

    def encode_long(self, sequence: torch.Tensor | Callable[[int, int], torch.Tensor],
                    length: int | None = None, *, chunk_bins: int = 1024,
                    n_value: float = 0.25) -> dict[str, torch.Tensor]:
        """`forward` for sequences too long to one-hot at once (a whole chromosome).

        The conv tower runs over overlapping chunks of chunk_bins bins (see
        `ConvTower.forward_chunked`; the overlap comes from its receptive field), then the
        transformer and heads run over all bins at once.

        Args:
            sequence: tokens (B, L) of any integer dtype (uint8 is the 1-byte-per-base
                floor), a one-hot (B, L, 4), or fetch(start, end) returning either for
                bases [start, end) (e.g. read from a FASTA file on demand).
            length: the sequence's length in bases; needed only for a fetch function.
            n_value: one-hot value of N tokens (0.25 or 0.0, see genoflash.data.one_hot).
        """
        if callable(sequence):
            if length is None:
                raise ValueError("length is required when sequence is a fetch function")
            fetch = sequence
        else:
            length = sequence.shape[1]

            def fetch(start: int, end: int) -> torch.Tensor:
                return sequence[:, start:end]
        return self.predict(self.tower.forward_chunked(fetch, length, chunk_bins, n_value))

    def predict(self, bins: torch.Tensor) -> dict[str, torch.Tensor]:
        """Transformer and heads over bin embeddings (B, nbins, dim) from the conv tower."""
        x = bins
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        out = {name: F.softplus(head(x)) for name, head in self.heads.items()}
        pooled = x.mean(dim=1)
        out.update({name: head(pooled) for name, head in self.class_heads.items()})
        return out
