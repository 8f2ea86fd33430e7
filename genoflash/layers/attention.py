"""Multi-head attention as an nn.Module, with RoPE on by default (a pass of its own, or fused into the kernels)."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.attention import MAX_HEADDIM, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
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


class KVCache:
    """One attention layer's keys and values of the tokens seen so far, for inference in chunks
    (chunked prefill, then continuations): (batch, capacity, nheads_k, head_dim) buffers, filled
    up to `seqlen` tokens in every row.

    The buffers are allocated at the layer's first call, in the dtype its keys come in (so under
    autocast, the autocast dtype). `MultiHeadAttention.forward(x, kv_cache=cache)` appends x's
    keys at slots seqlen .. seqlen + x.shape[1] and advances seqlen."""

    def __init__(self, batch: int, capacity: int):
        for name, value in (("batch", batch), ("capacity", capacity)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.batch, self.capacity, self.seqlen = batch, capacity, 0
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def append_room(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Allocate the buffers for keys like k and values like v (batch, n, nheads_k, d) on first
        use; refuse keys that do not fit the batch, the capacity or the buffers."""
        if k.shape[0] != self.batch:
            raise ValueError(f"kv_cache holds {self.batch} sequences, but x has batch {k.shape[0]}")
        if self.seqlen + k.shape[1] > self.capacity:
            raise ValueError(f"kv_cache: {self.seqlen} cached + {k.shape[1]} new tokens exceed its capacity "
                             f"{self.capacity}")
        if self.k is None:
            self.k = k.new_empty(self.batch, self.capacity, *k.shape[2:])
            self.v = v.new_empty(self.batch, self.capacity, *v.shape[2:])
        elif self.k.dtype != k.dtype or self.k.device != k.device or self.k.shape[2:] != k.shape[2:]:
            raise ValueError(f"kv_cache holds {self.k.dtype} keys of shape (..., {tuple(self.k.shape[2:])}) on "
                             f"{self.k.device}; this call's are {k.dtype} (..., {tuple(k.shape[2:])}) on {k.device}")

    def select(self, rows: torch.Tensor, capacity: int | None = None) -> "KVCache":
        """A new cache whose row i is a copy of row rows[i] of this one (rows may repeat: several
        continuations of one prefix), with room for `capacity` tokens (default this one's)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        capacity = self.capacity if capacity is None else capacity
        if rows.dim() != 1 or rows.numel() == 0:
            raise ValueError("rows must be a non-empty 1-D index of cache rows")
        if int(rows.min()) < 0 or int(rows.max()) >= self.batch:
            raise ValueError(f"rows must index this cache's {self.batch} rows, got {int(rows.min())}..{int(rows.max())}")
        if capacity < self.seqlen:
            raise ValueError(f"capacity ({capacity}) must hold the {self.seqlen} cached tokens")
        new = KVCache(rows.numel(), capacity)
        new.seqlen = self.seqlen
        if self.k is not None:
            index = rows.to(self.k.device)
            new.k = self.k.new_empty(new.batch, capacity, *self.k.shape[2:])
            new.v = self.v.new_empty(new.batch, capacity, *self.v.shape[2:])
            new.k[:, :self.seqlen] = self.k[index, :self.seqlen]
            new.v[:, :self.seqlen] = self.v[index, :self.seqlen]
        return new


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
                max_seqlen: int | None = None, kv_cache: KVCache | None = None) -> torch.Tensor:
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.nheads, self.head_dim)
        k, v = self.kv_proj(x).view(*lead, 2, self.nheads_k, self.head_dim).unbind(-3)
        if kv_cache is not None:
            return self.out_proj(self._cached(q, k, v, cu_seqlens, kv_cache).reshape(*lead, -1))
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

    def _cached(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor | None,
                cache: KVCache) -> torch.Tensor:
        """x's tokens continue the cached sequences: they sit at positions cache.seqlen onwards (RoPE),
        see the cached keys and each other (causal, bottom-right: the last query row sees every
        key), and their keys and values are appended to the cache."""
        if not isinstance(cache, KVCache):
            raise TypeError(f"kv_cache must be a genoflash KVCache, got {type(cache).__name__}")
        if cu_seqlens is not None or q.dim() != 4:
            raise ValueError("kv_cache takes a (batch, seqlen, dim) batch, not a packed one")
        if not self.causal:
            raise ValueError("kv_cache continues sequences left to right: it needs a causal layer")
        if self.context_parallel is not None:
            raise ValueError("kv_cache and context parallelism exclude each other")
        cache.append_room(k, v)
        offset = cache.seqlen
        if self.rotary is not None:  # the separate pass, fused or not: same positions, same angles
            cos, sin = self.rotary_tables_for(offset + q.shape[1], q)
            q = apply_rotary_emb(q, cos, sin, self.rotary_interleaved, seqlen_offsets=offset)
            k = apply_rotary_emb(k, cos, sin, self.rotary_interleaved, seqlen_offsets=offset)
        out = flash_attn_with_kvcache(q, cache.k, cache.v, k.contiguous(), v.contiguous(), cache_seqlens=offset,
                                      causal=True, window_size=self.window_size, softcap=self.softcap)
        cache.seqlen = offset + q.shape[1]
        return out
