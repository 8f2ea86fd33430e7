"""The KV cache of `flash_attn_with_kvcache`: where each sequence's tokens live, appending new ones in
place, and reading a sequence's keys out, for a contiguous cache or a paged one.

A sequence b of the batch owns the cache rows of `cache_batch_idx[b]` (a contiguous cache) or the
pages `block_table[b]` (a paged cache, token t in page block_table[b, t // page_size] at row
t % page_size). Its keys are the slots [cache_leftpad[b], cache_seqlens[b] + seqlen_new): the slots
before cache_leftpad are left padding, and the new tokens go at cache_seqlens[b] onwards. Positions
(RoPE, as in flash-attn) are slot indices; the masks count keys from cache_leftpad
(docs/design/flash-attn-api.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..common.checks import as_int
from .validation import check_headdim


@dataclass(frozen=True)
class CacheLayout:
    """Validated cache geometry. The lists are per sequence of the batch, host values read once, or
    None where the index tensor was not read (settings(check_indices=False)); the tensors are the
    same indices on the device, for the kernels and the append."""

    seqlens: list[int] | None   # filled slots before this call's new tokens (cache_seqlens)
    leftpad: list[int] | None   # the first slot that holds a key
    rows: list[int] | None      # contiguous cache: the cache row of each sequence (cache_batch_idx)
    pages: torch.Tensor | None  # paged cache: (batch, max_pages) int page indices (block_table)
    page_size: int              # a paged cache's rows per page; a contiguous cache's seqlen_cache
    capacity: int               # slots a sequence can hold
    seqlen_new: int             # new tokens appended to each sequence
    seqlens_t: torch.Tensor     # (batch,) int32: cache_seqlens on the device
    leftpad_t: torch.Tensor | None  # (batch,) cache_leftpad, None for none
    rows_t: torch.Tensor | None     # (batch,) cache_batch_idx, None for rows 0 .. batch - 1

    def ends(self) -> list[int]:
        return [n + self.seqlen_new for n in self.seqlens]

    def max_keys(self) -> int:
        """A bound on any sequence's keys after this call: exact when read, else the capacity."""
        return max(self.ends(), default=0) if self.seqlens is not None else self.capacity

    def slot_index(self, start: list[int], end: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
        return slot_index(start, end, self.rows, self.pages, self.page_size, device)


def slot_index(start: list[int], end: list[int], rows: list[int] | None, pages: torch.Tensor | None, page_size: int,
               device) -> tuple[torch.Tensor, torch.Tensor]:
    """(first-dim, second-dim) index tensors of a cache for slots [start[b], end[b]) of every
    sequence b, concatenated in batch order: its cache row `rows[b]`, or its pages `pages[b]`."""
    counts = torch.tensor([e - s for s, e in zip(start, end)], device=device)
    seq = torch.repeat_interleave(torch.arange(len(start), device=device), counts)
    first = torch.tensor(start, device=device).repeat_interleave(counts)
    starts_in_batch = (torch.cumsum(counts, 0) - counts).repeat_interleave(counts)  # each sequence's first row
    slot = first + torch.arange(seq.numel(), device=device) - starts_in_batch
    if pages is not None:
        return pages[seq, slot // page_size].long(), slot % page_size
    return torch.tensor(rows, device=device)[seq], slot


def check_cache(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                read_values: bool = True) -> CacheLayout:
    """Shapes, dtypes and, with read_values, every index value, with errors naming the argument:
    nothing out of the cache is ever read or written. Without read_values the index tensors are
    checked for dtype, shape and device only, and nothing waits on the device."""
    batch, _, nheads, headdim = q.shape
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (batch_cache, seqlen_cache, nheads_k, headdim) or, paged, "
                             f"(num_blocks, page_block_size, nheads_k, headdim)")
        if t.dtype != q.dtype or t.device != q.device:
            raise TypeError(f"{name} must have q's dtype and device ({q.dtype}, {q.device}), got {t.dtype}, {t.device}")
        if t.stride(-1) != 1:  # written in place and read by the kernels as they lie
            raise ValueError(f"{name} must have contiguous channels (stride(-1) == 1), got strides {t.stride()}")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must agree but for "
                         f"the last dim")
    if k_cache.shape[-1] != headdim:
        raise ValueError(f"k_cache's headdim ({k_cache.shape[-1]}) must be q's ({headdim})")
    check_headdim("v_cache", v_cache.shape[-1])
    nheads_k = k_cache.shape[2]
    if nheads % nheads_k:
        raise ValueError(f"q's nheads ({nheads}) must be a multiple of the cache's nheads_k ({nheads_k})")
    if (k is None) != (v is None):
        raise ValueError("k and v (the new tokens) must be given together")
    seqlen_new = 0
    if k is not None:
        want_k = (batch, k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 else -1, nheads_k, headdim)
        for name, t, d in (("k", k, headdim), ("v", v, v_cache.shape[-1])):
            if not isinstance(t, torch.Tensor) or t.dim() != 4 or tuple(t.shape) != (*want_k[:3], d):
                raise ValueError(f"{name} must be (batch, seqlen_new, nheads_k, headdim) = "
                                 f"{(batch, 'seqlen_new', nheads_k, d)}, got "
                                 f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
            if t.dtype != q.dtype or t.device != q.device:
                raise TypeError(f"{name} must have q's dtype and device, got {t.dtype}, {t.device}")
        seqlen_new = k.shape[1]

    def values(name, t):
        _check_index_tensor(name, t, batch, q.device)
        return t.tolist() if read_values else None  # one small copy: checked before the cache is touched

    paged = block_table is not None
    rows = rows_t = None
    if paged:
        check_block_table(block_table, batch, q.device)
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx goes with a contiguous cache: a paged cache's block_table already "
                             "names each sequence's pages")
        if cache_leftpad is not None:
            raise ValueError("cache_leftpad goes with a contiguous cache, not with block_table")
        num_blocks, page_size = k_cache.shape[:2]
        capacity = block_table.shape[1] * page_size
    else:
        cache_batch, page_size = k_cache.shape[:2]
        capacity = page_size
        if cache_batch_idx is None:
            if cache_batch < batch:
                raise ValueError(f"the cache holds {cache_batch} sequences but q has batch {batch}; pass "
                                 "cache_batch_idx to pick cache rows")
            rows = list(range(batch))
        else:
            rows, rows_t = values("cache_batch_idx", cache_batch_idx), cache_batch_idx
            if rows is not None:
                if min(rows) < 0 or max(rows) >= cache_batch:
                    raise ValueError(f"cache_batch_idx must index the cache's {cache_batch} rows, got "
                                     f"{min(rows)}..{max(rows)}")
                if len(set(rows)) != len(rows) and seqlen_new:
                    raise ValueError("cache_batch_idx repeats a row: two sequences would append to the same "
                                     "cache row")

    if cache_seqlens is None:
        if seqlen_new:
            raise ValueError("cache_seqlens must be given with new k and v: it says where they go")
        seqlens = [capacity] * batch
        seqlens_t = torch.full((batch,), capacity, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.dim() == 1:
        seqlens, seqlens_t = values("cache_seqlens", cache_seqlens), cache_seqlens
    else:
        seqlens = [as_int("cache_seqlens", cache_seqlens)] * batch
        seqlens_t = torch.full((batch,), seqlens[0], dtype=torch.int32, device=q.device)
    leftpad = [0] * batch if cache_leftpad is None else values("cache_leftpad", cache_leftpad)
    if seqlens is not None:
        for b, n in enumerate(seqlens):
            if n < 0 or n + seqlen_new > capacity:
                raise ValueError(f"cache_seqlens[{b}] = {n} plus {seqlen_new} new tokens must fit the cache's "
                                 f"{capacity} slots")
            if leftpad is not None and not 0 <= leftpad[b] <= n:
                raise ValueError(f"cache_leftpad[{b}] = {leftpad[b]} must be in [0, cache_seqlens[{b}] = {n}]")
        if paged and read_values:
            check_pages(block_table, [n + seqlen_new for n in seqlens], page_size, num_blocks)
    return CacheLayout(seqlens, leftpad, rows, block_table if paged else None, page_size, capacity, seqlen_new,
                       seqlens_t, cache_leftpad, rows_t)


def check_block_table(block_table, batch: int, device) -> None:
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2 \
            or block_table.shape[0] != batch:
        raise TypeError(f"block_table must be an int32 (batch, max_num_blocks_per_seq) tensor with batch = {batch}")
    if block_table.device != device:
        raise ValueError(f"block_table must be on {device}, got {block_table.device}")


def check_pages(block_table: torch.Tensor, ends: list[int], page_size: int, num_blocks: int) -> None:
    """The pages holding slots [0, ends[b]) of every sequence exist."""
    used = -(-max(ends, default=0) // page_size)
    if used:
        pages = block_table[:, :used]
        lo, hi = int(pages.min()), int(pages.max())
        if lo < 0 or hi >= num_blocks:
            raise ValueError(f"block_table must name pages in [0, {num_blocks}), got {lo}..{hi}")


def paged_keys(k: torch.Tensor, v: torch.Tensor, block_table, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_attn_varlen_func's paged K/V: sequence b's first lengths[b] tokens from its pages,
    packed (total_k, nheads_k, headdim). Differentiable (a gather)."""
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"with block_table, {name} must be a paged cache (num_blocks, page_block_size, "
                             f"nheads_k, headdim), got {tuple(t.shape)}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree but for the last dim")
    batch = len(lengths)
    check_block_table(block_table, batch, k.device)
    num_blocks, page_size = k.shape[:2]
    capacity = block_table.shape[1] * page_size
    if max(lengths) > capacity:
        raise ValueError(f"cu_seqlens_k asks for {max(lengths)} keys but block_table holds {capacity} per sequence")
    check_pages(block_table, lengths, page_size, num_blocks)
    first, second = slot_index([0] * batch, lengths, None, block_table, page_size, k.device)
    return k[first, second], v[first, second]


def _check_index_tensor(name: str, t, batch: int, device) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64) or tuple(t.shape) != (batch,):
        raise TypeError(f"{name} must be an int32 tensor of shape ({batch},), got "
                        f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}"
                        f"{' ' + str(tuple(t.shape)) if isinstance(t, torch.Tensor) else ''}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")


def append(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: CacheLayout) -> None:
    """Write k and v (batch, seqlen_new, ...) into the caches at slots [cache_seqlens[b], + seqlen_new),
    with indices computed on the device (nothing waits on the host)."""
    slots = layout.seqlens_t.long()[:, None] + torch.arange(k.shape[1], device=k.device)  # (batch, seqlen_new)
    if layout.pages is not None:
        first, second = layout.pages.long().gather(1, slots // layout.page_size), slots % layout.page_size
    else:
        rows = layout.rows_t.long() if layout.rows_t is not None else torch.arange(k.shape[0], device=k.device)
        first, second = rows[:, None].expand_as(slots), slots
    k_cache[first, second] = k
    v_cache[first, second] = v


def gather(k_cache: torch.Tensor, v_cache: torch.Tensor, layout: CacheLayout):
    """(keys, values, counts): every sequence's slots [cache_leftpad[b], end), packed (total, nheads_k, d)."""
    ends = layout.ends()
    first, second = layout.slot_index(layout.leftpad, ends, k_cache.device)
    return k_cache[first, second], v_cache[first, second], [e - p for p, e in zip(layout.leftpad, ends)]


def whole_rows(layout: CacheLayout, batch: int) -> bool:
    """Whether every sequence's keys are its whole cache row, in order: the cache can be read as it is."""
    return (layout.pages is None and layout.rows == list(range(batch)) and not any(layout.leftpad)
            and all(e == layout.capacity for e in layout.ends()))
