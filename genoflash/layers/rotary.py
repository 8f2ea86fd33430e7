"""`RotaryEmbedding`: flash-attn's rotary module (flash_attn.layers.rotary.RotaryEmbedding), with its
arguments and its in-place rotation of packed qkv, on genoflash's tables and `apply_rotary_emb`."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.rotary import apply_rotary_emb, rotary_tables


class RotaryEmbedding(nn.Module):
    """Rotates q and k of a packed qkv (or q and a packed kv) in place, at their positions.

    Args:
        dim: the rotary dim, even; the first `dim` channels of each head rotate.
        base: the frequency base.
        interleaved: GPT-J pairs (2m, 2m + 1) instead of NeoX halves (m, m + dim / 2).
        scale_base: XPos: queries are scaled by zeta^(n / scale_base) and keys by its inverse, with
            zeta_m = (2m + 0.4 dim) / (1.4 dim) and n a token's position minus half the cached
            length, as flash-attn's module computes it (so, as there, the scales depend on the
            longest length seen).
        pos_idx_in_fp32: must be True: genoflash computes every angle in float64 and rounds the
            tables to float32 (`rotary_tables`), at least as accurate as flash-attn's float32 path.
        device: accepted for flash-attn's signature; the tables are built on the input's device.
    """

    def __init__(self, dim: int, base: float = 10000.0, interleaved: bool = False, scale_base: float | None = None,
                 pos_idx_in_fp32: bool = True, device=None):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
            raise ValueError(f"dim must be a positive even int, got {dim!r}")
        if not base > 0:
            raise ValueError(f"base must be > 0, got {base}")
        if scale_base is not None and not scale_base > 0:
            raise ValueError(f"scale_base must be None or > 0, got {scale_base}")
        if pos_idx_in_fp32 is not True:
            raise ValueError("pos_idx_in_fp32 must be True: the tables' angles are computed in float64")
        if not isinstance(interleaved, bool):
            raise TypeError(f"interleaved must be a bool, got {type(interleaved).__name__}")
        self.dim, self.base, self.interleaved, self.scale_base = dim, float(base), interleaved, scale_base
        del device  # the tables follow the input (`tables`), so no buffer needs placing
        # (device) -> (cos_q, sin_q, cos_k, sin_k), float32 (positions, dim / 2); q's and k's tables
        # are the same tensors without XPos.
        self._cache: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def tables(self, seqlen: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(cos_q, sin_q, cos_k, sin_k) covering at least `seqlen` positions."""
        device = torch.device(device)
        cached = self._cache.get(device)
        if cached is not None and cached[0].shape[0] >= seqlen:
            return cached
        # Without XPos the values do not depend on the length: grow to a power of two, so that
        # growing lengths rebuild O(log N) times. XPos centres its scales on the cached length,
        # which flash-attn sets to exactly the length asked for.
        length = seqlen if self.scale_base is not None else 1 << max(0, seqlen - 1).bit_length()
        cos, sin = rotary_tables(length, self.dim, self.base, device=device, dtype=torch.float64)
        if self.scale_base is None:
            cos, sin = cos.float(), sin.float()
            cached = (cos, sin, cos, sin)
        else:
            pairs = torch.arange(0, self.dim, 2, dtype=torch.float64, device=device)
            zeta = (pairs + 0.4 * self.dim) / (1.4 * self.dim)
            power = (torch.arange(length, dtype=torch.float64, device=device) - length // 2) / self.scale_base
            scale = zeta[None, :] ** power[:, None]
            cached = tuple(t.float() for t in (cos * scale, sin * scale, cos / scale, sin / scale))
        self._cache[device] = cached
        return cached

    def forward(self, qkv: torch.Tensor, kv: torch.Tensor | None = None, seqlen_offset: int | torch.Tensor = 0,
                max_seqlen: int | None = None, num_heads_q: int | None = None):
        """
        qkv: (batch, seqlen, 3, nheads, headdim); or (batch, seqlen, nheads_q + 2 nheads_k, headdim)
            with num_heads_q; or q (batch, seqlen, nheads, headdim) when kv is given.
        kv: optional (batch, seqlen, 2, nheads_k, headdim).
        seqlen_offset: token t sits at position t + seqlen_offset: an int, or (batch,) int tensor
            (decoding with a KV cache); max_seqlen, if given, sizes the tables for such offsets.

        Returns qkv, or (q, kv), with q and k rotated in place.
        """
        if not isinstance(qkv, torch.Tensor):
            raise TypeError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
        if kv is None:
            if num_heads_q is None:
                if qkv.dim() != 5 or qkv.shape[2] != 3:
                    raise ValueError(f"qkv must be (batch, seqlen, 3, nheads, headdim), got {tuple(qkv.shape)}")
                q, k = qkv[:, :, 0], qkv[:, :, 1]
            else:
                heads = qkv.shape[2] if qkv.dim() == 4 else None
                if heads is None or not 0 < num_heads_q < heads or (heads - num_heads_q) % 2:
                    raise ValueError(f"qkv must be (batch, seqlen, num_heads_q + 2 nheads_k, headdim) with "
                                     f"num_heads_q = {num_heads_q}, got {tuple(qkv.shape)}")
                heads_k = (heads - num_heads_q) // 2
                q, k = qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q:num_heads_q + heads_k]
        else:
            if num_heads_q is not None:
                raise ValueError("num_heads_q goes with a packed qkv, not with a separate kv")
            if qkv.dim() != 4:
                raise ValueError(f"with kv given, qkv is q: (batch, seqlen, nheads, headdim), got {tuple(qkv.shape)}")
            if not isinstance(kv, torch.Tensor) or kv.dim() != 5 or kv.shape[2] != 2:
                raise ValueError(f"kv must be (batch, seqlen, 2, nheads_k, headdim), got "
                                 f"{tuple(kv.shape) if isinstance(kv, torch.Tensor) else type(kv).__name__}")
            q, k = qkv, kv[:, :, 0]
        seqlen = q.shape[1]
        if isinstance(seqlen_offset, torch.Tensor):
            end = max_seqlen if max_seqlen is not None else seqlen + int(seqlen_offset.max().item())
        else:
            end = seqlen + int(seqlen_offset)
        cos_q, sin_q, cos_k, sin_k = self.tables(max(end, 1), q.device)
        apply_rotary_emb(q, cos_q, sin_q, self.interleaved, True, seqlen_offset)
        apply_rotary_emb(k, cos_k, sin_k, self.interleaved, True, seqlen_offset)
        return qkv if kv is None else (qkv, kv)
