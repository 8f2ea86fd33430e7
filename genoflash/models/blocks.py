"""Building blocks the models share: RMSNorm, the SwiGLU feed-forward, and the pre-norm block."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last axis, computed in float32 whatever x's dtype.

    torch's nn.RMSNorm works in the input dtype; in bf16 the mean of squares over a wide
    model loses enough digits to matter, so the statistics are taken in float32 here.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


def swiglu_hidden(dim: int, mult: float, multiple: int = 64) -> int:
    """SwiGLU hidden width: mult * dim rounded up to a multiple of `multiple` (matmul-friendly)."""
    return multiple * math.ceil(mult * dim / multiple)


class SwiGLU(nn.Module):
    """Gated feed-forward (Shazeer 2020): out(silu(gate(x)) * up(x)), dim -> hidden -> dim."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)  # gate and up in one matmul
        self.out = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.out(F.silu(gate) * up)


class PreNormBlock(nn.Module):
    """x + mixer(norm(x)), then x + SwiGLU(norm(x)); with ffn_hidden 0 the mixer alone (the
    layout of Mamba's and Caduceus's language models, which stack mixer-only blocks).

    The mixer moves information along the sequence (attention today; Hyena or Mamba later)
    and must map (..., dim) to the same shape, taking the packed-batch arguments
    `cu_seqlens` and `max_seqlen` that genoflash's MultiHeadAttention takes. Everything
    else in the block is per position.
    """

    def __init__(self, dim: int, mixer: nn.Module, ffn_hidden: int):
        super().__init__()
        self.mixer_norm, self.mixer = RMSNorm(dim), mixer
        if ffn_hidden < 0:
            raise ValueError(f"ffn_hidden must be >= 0 (0: no feed-forward), got {ffn_hidden}")
        self.ffn_norm, self.ffn = (RMSNorm(dim), SwiGLU(dim, ffn_hidden)) if ffn_hidden else (None, None)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                max_seqlen: int | None = None, kv_cache=None) -> torch.Tensor:
        # kv_cache (inference in chunks) goes to mixers that keep one: attention's KVCache
        extra = {} if kv_cache is None else {"kv_cache": kv_cache}
        x = x + self.mixer(self.mixer_norm(x), cu_seqlens, max_seqlen, **extra)
        return x if self.ffn is None else x + self.ffn(self.ffn_norm(x))
