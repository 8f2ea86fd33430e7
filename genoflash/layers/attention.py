"""Multi-head attention as an nn.Module, with RoPE on by default (a pass of its own, or fused into the kernels)."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.attention import MAX_HEADDIM, flash_attn_func, flash_attn_varlen_func
from ..ops.rotary import apply_rotary_emb, rotary_tables


class RotaryTables(nn.Module):
    """cos/sin tables computed once per (device, dtype) and grown when a longer sequence comes.

    Tables are built for the next power of two at or above the length asked for, so a
    training run with varying lengths rebuilds them O(log N) times, not every step."""

    def __init__(self, rotary_dim: int, base: float = 10000.0, interpolation: float = 1.0, ntk_alpha: float = 1.0):
        super().__init__()
        self.rotary_dim, self.base, self.interpolation, self.ntk_alpha = rotary_dim, base, interpolation, ntk_alpha
        self._cache: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, seqlen: int, device: torch.device, dtype: torch.dtype = torch.float32):
        key = (torch.device(device), dtype)
        cached = self._cache.get(key)
        if cached is None or cached[0].shape[0] < seqlen:
            length = 1 << max(0, seqlen - 1).bit_length()
            cached = rotary_tables(length, self.rotary_dim, self.base, self.interpolation, self.ntk_alpha,
                                   device=device, dtype=dtype)
            self._cache[key] = cached
        return cached


class MultiHeadAttention(nn.Module):
    """x (batch, seqlen, dim) -> (batch, seqlen, dim), or packed (total, dim) with cu_seqlens.

    Args:
        dim: model width. nheads query heads of head_dim (default dim // nheads) channels;
            nheads_k K/V heads (default nheads; fewer gives GQA/MQA).
        causal, window_size, softcap: as in `flash_attn_func`.
        dropout: attention dropout probability, fused into the kernels; applied in training mode only.
        context_parallel: set by `genoflash.distributed.enable_context_parallel`: the layer then
            sees this rank's shard of each sequence and attends over the whole sequence with ring
            attention (RoPE at global positions).
        rotary: apply RoPE inside the kernels (default on) to the first rotary_dim channels of
            each head (default all), with `rotary_base`, `rotary_interpolation` (linear position
            interpolation) and `rotary_ntk_alpha` (NTK-aware base scaling) for length extrapolation.
            The tables are float16 when q is float16 or bfloat16 (`rotary_tables_for`), else float32.
        rotary_fused: False (the default) rotates q and k in a pass of their own
            (`genoflash.apply_rotary_emb`) and attends without RoPE; True rotates Q and K inside
            the attention kernels, so that no rotated copy is ever written. The pass costs one q-
            and one k-sized tensor (+5% peak memory for the layer) and is the faster of the two:
            the layer's fwd+bwd took 19.4 ms against 27.8 fused at H16 N16k hd128 on the H200
            (140 against 209 at H8 N64k). In the kernels every query tile rotates every key tile
            again, which costs at least ~10% (docs/design/fused-rope-dropout.md).
    """

    def __init__(self, dim: int, nheads: int, nheads_k: int | None = None, head_dim: int | None = None,
                 causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                 rotary: bool = True, rotary_dim: int | None = None, rotary_base: float = 10000.0,
                 rotary_interpolation: float = 1.0, rotary_ntk_alpha: float = 1.0, rotary_interleaved: bool = False,
                 rotary_fused: bool = False, dropout: float = 0.0, bias: bool = False):
        super().__init__()
        self.nheads, self.nheads_k = nheads, nheads_k or nheads
        self.head_dim = head_dim or dim // nheads
        # A layer's head dim is one the kernels tile as it is (the functions pad others per call: passes.py)
        if self.head_dim % 8 or not 8 <= self.head_dim <= MAX_HEADDIM:
            source = "head_dim" if head_dim else f"dim // nheads = {dim} // {nheads}"
            raise ValueError(f"the head dim ({source} = {self.head_dim}) must be a multiple of 8 between 8 and "
                             f"{MAX_HEADDIM}")
        if self.nheads % self.nheads_k:
            raise ValueError(f"nheads ({nheads}) must be divisible by nheads_k ({self.nheads_k})")
        self.causal, self.window_size, self.softcap, self.dropout = causal, window_size, softcap, dropout
        self.rotary_interleaved, self.rotary_fused = rotary_interleaved, rotary_fused
        self.q_proj = nn.Linear(dim, self.nheads * self.head_dim, bias=bias)
        self.kv_proj = nn.Linear(dim, 2 * self.nheads_k * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(self.nheads * self.head_dim, dim, bias=bias)
        self.rotary = RotaryTables(rotary_dim or self.head_dim, rotary_base, rotary_interpolation,
                                   rotary_ntk_alpha) if rotary else None
        self.context_parallel = None  # a genoflash.distributed.ContextParallel, or None

    def rotary_tables_for(self, seqlen: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for `seqlen` positions, in the dtype the kernels read best for q's dtype.

        For 16-bit q and k the tables are float16: the forward then fits 128x128 tiles in shared
        memory and took 7.59 ms against 9.05 ms with float32 tables at H16 N16k hd128 on the H200
        (docs/design/fused-rope-dropout.md). The angles are still made
        in float64; float16's 11-bit mantissa is finer than bfloat16 q and k, and the kernels
        rotate in float32, so the only change is each cos/sin rounded to within 2^-11."""
        dtype = torch.float16 if q.dtype in (torch.float16, torch.bfloat16) else torch.float32
        return self.rotary(seqlen, q.device, dtype)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                max_seqlen: int | None = None) -> torch.Tensor:
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.nheads, self.head_dim)
        k, v = self.kv_proj(x).view(*lead, 2, self.nheads_k, self.head_dim).unbind(-3)
        if self.context_parallel is not None:
            if cu_seqlens is not None:
                raise ValueError("context parallelism shards one sequence per batch row; packed varlen input "
                                 "is not supported")
            out = self.context_parallel.attention(q, k, v, self)
            return self.out_proj(out.reshape(*lead, self.nheads * self.head_dim))
        kw = dict(causal=self.causal, window_size=self.window_size, softcap=self.softcap,
                  dropout_p=self.dropout if self.training else 0.0)
        if self.rotary is not None:
            length = max_seqlen if cu_seqlens is not None else x.shape[1]
            cos, sin = self.rotary_tables_for(length, q)
            if self.rotary_fused:
                kw.update(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=self.rotary_interleaved)
            else:  # self-attention: q and k share positions
                rotate = dict(interleaved=self.rotary_interleaved, cu_seqlens=cu_seqlens,
                              max_seqlen=max_seqlen if cu_seqlens is not None else None)
                q, k = apply_rotary_emb(q, cos, sin, **rotate), apply_rotary_emb(k, cos, sin, **rotate)
        if cu_seqlens is not None:
            out = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **kw)
        else:
            out = flash_attn_func(q, k, v, **kw)
        return self.out_proj(out.reshape(*lead, self.nheads * self.head_dim))
