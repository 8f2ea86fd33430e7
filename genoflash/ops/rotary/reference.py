"""The readable rotation the Triton pass is tested against: genoflash.rotary.apply_rotary,
applied per sequence of a packed (varlen) batch, each sequence at its own position offset."""

from __future__ import annotations

import torch

from ...rotary import apply_rotary, apply_rotary_packed


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
                     seqlen_offsets: int | list[int] = 0, cu_seqlens: list[int] | None = None,
                     inverse: bool = False) -> torch.Tensor:
    """x (batch, seqlen, nheads, headdim), or packed (total, nheads, headdim) with cu_seqlens (a
    list of batch + 1 prefix sums). Token t of sequence b sits at position t + seqlen_offsets[b]
    (one int serves every sequence). Float32 arithmetic (float64 for float64 x), x's dtype out."""
    batch = x.shape[0] if cu_seqlens is None else len(cu_seqlens) - 1
    offsets = [seqlen_offsets] * batch if isinstance(seqlen_offsets, int) else list(seqlen_offsets)
    if cu_seqlens is None:
        return torch.cat([apply_rotary(x[b:b + 1], cos, sin, interleaved, offsets[b], inverse)
                          for b in range(batch)])
    return apply_rotary_packed(x, cos, sin, cu_seqlens, offsets, interleaved, inverse)
