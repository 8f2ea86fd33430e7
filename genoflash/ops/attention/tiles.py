"""Tile loads and stores with padding done in-kernel by masks (never by copying).

A tile is BLOCK_ROWS consecutive sequence positions of one (batch, head), by BLOCK_D
channels. `base` already points at the tile's first row: it is built from int64 offsets,
so tensors past 2^31 elements are addressed correctly. Offsets inside a tile are int32:
BLOCK_ROWS * stride_row stays far below 2^31 (the host checks the stride).
"""

import triton
import triton.language as tl


@triton.jit
def _tile_offsets(offs_row, stride_row, offs_d):
    return offs_row[:, None] * stride_row + offs_d[None, :]


@triton.jit
def _tile_mask(offs_row, n_rows, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               CHECK_ROWS: tl.constexpr):
    """In-bounds elements: rows < n_rows (when CHECK_ROWS), channels < HEAD_DIM (when padded)."""
    mask = offs_d[None, :] < BLOCK_D  # all true; gives the mask its 2-D shape
    if CHECK_ROWS:
        mask = mask & (offs_row[:, None] < n_rows)
    if HEAD_DIM != BLOCK_D:
        mask = mask & (offs_d[None, :] < HEAD_DIM)
    return mask


@triton.jit
def _load_tile(base, offs_row, n_rows, stride_row, offs_d, HEAD_DIM: tl.constexpr,
               BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr):
    """Rows past n_rows and channels past HEAD_DIM read as 0, so they add nothing to a dot."""
    ptrs = base + _tile_offsets(offs_row, stride_row, offs_d)
    if CHECK_ROWS or HEAD_DIM != BLOCK_D:
        return tl.load(ptrs, mask=_tile_mask(offs_row, n_rows, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS),
                       other=0.0)
    return tl.load(ptrs)


@triton.jit
def _store_tile(base, value, offs_row, n_rows, stride_row, offs_d, HEAD_DIM: tl.constexpr,
                BLOCK_D: tl.constexpr):
    ptrs = base + _tile_offsets(offs_row, stride_row, offs_d)
    tl.store(ptrs, value.to(base.dtype.element_ty),
             mask=_tile_mask(offs_row, n_rows, offs_d, HEAD_DIM, BLOCK_D, True))


@triton.jit
def _head_base(ptr, off_b, off_h, stride_b, stride_h):
    """Pointer to sequence position 0 of (batch off_b, head off_h), computed in int64."""
    return ptr + off_b.to(tl.int64) * stride_b + off_h.to(tl.int64) * stride_h


@triton.jit
def _row_ptr(base, row, stride_row):
    """base advanced to sequence position `row`; row * stride can pass 2^31, so int64."""
    return base + tl.cast(row, tl.int64) * stride_row


@triton.jit
def _load_tile_tma(desc, off_b, row, off_h, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows [row, row + BLOCK_ROWS) of (batch off_b, head off_h) through a TMA descriptor
    (descriptors.py). The copy engine reads rows past the sequence end and channels past the
    head dim as 0, as _load_tile's masks do."""
    return _load_tile_tma_at(desc, off_b, row, off_h, 0, BLOCK_ROWS, BLOCK_D)


@triton.jit
def _load_tile_tma_at(desc, off_b, row, off_h, col, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """_load_tile_tma from channel `col` on (a group of channels, as RoPE's halves are); the
    box's start along the contiguous dim must be 16-byte aligned."""
    return desc.load([off_b, row, off_h, col]).reshape(BLOCK_ROWS, BLOCK_D)


@triton.jit
def _store_tile_tma(desc, value, off_b, row, off_h, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """The store twin of _load_tile_tma: rows past the sequence end and padded channels are
    clipped by the copy engine, never written."""
    _store_tile_tma_at(desc, value, off_b, row, off_h, 0, BLOCK_ROWS, BLOCK_D)


@triton.jit
def _store_tile_tma_at(desc, value, off_b, row, off_h, col, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """_store_tile_tma from channel `col` on (a group of channels, as V's split tail is)."""
    desc.store([off_b, row, off_h, col], value.reshape(1, BLOCK_ROWS, 1, BLOCK_D))
