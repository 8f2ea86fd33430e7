"""Rotary position embedding (RoPE) in plain PyTorch: the cos/sin tables and the readable rotation.

The tables feed both the rotary pass (forward.py) and the attention kernels, which can rotate
Q and K tiles on chip (flash_attn_func's rotary_cos / rotary_sin). The rotation here is what the
`torch` and `reference` backends run and what the Triton pass is tested against.

Layouts, as in flash-attn's rotary: each head's first `rotary_dim` channels rotate, the
rest pass through. "NeoX" (default) pairs channel c with c + rotary_dim/2; "interleaved"
(GPT-J) pairs 2m with 2m + 1. Pair m at position p rotates by the angle p * theta_m.
"""

from __future__ import annotations

import torch


def rotary_tables(seqlen: int, rotary_dim: int, base: float = 10000.0, interpolation: float = 1.0,
                  ntk_alpha: float = 1.0, device=None, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (seqlen, rotary_dim / 2).

    Angles are computed in float64 and cast afterwards: at genomic positions (millions) a
    float32 product p * theta already loses several digits of the angle.

    Args:
        interpolation: linear position interpolation; positions are divided by it (Evo
            stretched its RoPE x16 to x128 this way to extend its context).
        ntk_alpha: NTK-aware scaling; the base becomes base * alpha^(d / (d - 2)), which
            stretches low frequencies while keeping the highest ones.
    """
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    if seqlen < 1:
        raise ValueError(f"seqlen must be >= 1, got {seqlen}")
    if not (interpolation > 0 and ntk_alpha > 0 and base > 0):
        raise ValueError(f"base, interpolation and ntk_alpha must be > 0, got {base}, {interpolation}, {ntk_alpha}")
    if ntk_alpha != 1.0:
        base = base * ntk_alpha ** (rotary_dim / (rotary_dim - 2)) if rotary_dim > 2 else base * ntk_alpha
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim)
    positions = torch.arange(seqlen, dtype=torch.float64, device=device) / interpolation
    angles = positions[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotary_pairs(rotary_dim: int, interleaved: bool, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Channel indices (first, second) of each rotating pair m = 0 .. rotary_dim/2 - 1."""
    m = torch.arange(rotary_dim // 2, device=device)
    return (2 * m, 2 * m + 1) if interleaved else (m, m + rotary_dim // 2)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
           position_offset: int = 0, inverse: bool = False) -> torch.Tensor:
    """Rotate x (batch, seqlen, nheads, headdim); token t sits at position t + position_offset.

    Computed in float32 (float64 for float64 inputs) and returned in x's dtype. inverse=True
    applies the transposed rotation, which maps a gradient w.r.t. rotated x back to x.
    """
    rotary_dim = 2 * cos.shape[1]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    seqlen = x.shape[1]
    c = cos[position_offset:position_offset + seqlen].to(acc)[None, :, None, :]
    s = sin[position_offset:position_offset + seqlen].to(acc)[None, :, None, :]
    if inverse:
        s = -s
    first, second = rotary_pairs(rotary_dim, interleaved, x.device)
    a, b = x[..., first].to(acc), x[..., second].to(acc)
    out = x.to(acc).clone()
    out[..., first] = a * c - b * s
    out[..., second] = b * c + a * s
    return out.to(x.dtype)


def rotate_packed(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seqlens: list[int],
                  offsets: list[int], interleaved: bool = False, inverse: bool = False) -> torch.Tensor:
    """`rotate` on a packed (total, nheads, headdim) batch: sequence b is rows
    cu_seqlens[b]:cu_seqlens[b + 1], and its token t sits at position t + offsets[b]."""
    return torch.cat([rotate(x[None, start:end], cos, sin, interleaved, offset, inverse)[0]
                      for start, end, offset in zip(cu_seqlens, cu_seqlens[1:], offsets)])


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
                     seqlen_offsets: int | list[int] = 0, cu_seqlens: list[int] | None = None,
                     inverse: bool = False) -> torch.Tensor:
    """x (batch, seqlen, nheads, headdim), or packed (total, nheads, headdim) with cu_seqlens (a
    list of batch + 1 prefix sums). Token t of sequence b sits at position t + seqlen_offsets[b]
    (one int serves every sequence). Float32 arithmetic (float64 for float64 x), x's dtype out."""
    batch = x.shape[0] if cu_seqlens is None else len(cu_seqlens) - 1
    offsets = [seqlen_offsets] * batch if isinstance(seqlen_offsets, int) else list(seqlen_offsets)
    if cu_seqlens is None:
        return torch.cat([rotate(x[b:b + 1], cos, sin, interleaved, offsets[b], inverse)
                          for b in range(batch)])
    return rotate_packed(x, cos, sin, cu_seqlens, offsets, interleaved, inverse)
