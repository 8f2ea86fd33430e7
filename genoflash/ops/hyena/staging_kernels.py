"""The Triton kernels behind staging.py's `load_rows` and `write_window` (their fused path), and
their launches. staging.py states what each computes and imports this module only when a call
takes the kernels, so genoflash imports without triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.host import cdiv


@triton.jit
def _load_rows_kernel(SRC, DST, group, length, n_blocks, stride_sb, stride_sc, stride_sl, stride_db, stride_dc,
                      REVERSE: tl.constexpr, BLOCK: tl.constexpr):
    row, block = tl.program_id(0) // n_blocks, tl.program_id(0) % n_blocks  # row = b * group + c
    b, c = (row // group).to(tl.int64), (row % group).to(tl.int64)
    k = block * BLOCK + tl.arange(0, BLOCK)
    mask = k < length
    pos = (length - 1 - k) if REVERSE else k
    v = tl.load(SRC + b * stride_sb + c * stride_sc + pos.to(tl.int64) * stride_sl, mask=mask)
    v = v.to(DST.dtype.element_ty)
    tl.store(DST + b * stride_db + c * stride_dc + k, v, mask=mask)


@triton.jit
def _write_window_kernel(CORR, D, SKIP, OUT, group, length, n_blocks, start, scale, stride_cb, stride_cc,
                         stride_sb, stride_sc, stride_sl, stride_ob, stride_oc, stride_ol,
                         HAS_SKIP: tl.constexpr, BLOCK: tl.constexpr):
    row, block = tl.program_id(0) // n_blocks, tl.program_id(0) % n_blocks
    b, c = (row // group).to(tl.int64), (row % group).to(tl.int64)
    k = block * BLOCK + tl.arange(0, BLOCK)
    mask = k < length
    v = tl.load(CORR + b * stride_cb + c * stride_cc + start + k, mask=mask) * scale
    if HAS_SKIP:
        skip = tl.load(SKIP + b * stride_sb + c * stride_sc + k.to(tl.int64) * stride_sl, mask=mask)
        v += tl.load(D + c).to(v.dtype) * skip.to(v.dtype)
    tl.store(OUT + b * stride_ob + c * stride_oc + k.to(tl.int64) * stride_ol, v.to(OUT.dtype.element_ty), mask=mask)


def _block(interpreted: bool) -> int:
    # Small blocks under the interpreter, so CPU tests cross block boundaries at small lengths.
    return 64 if interpreted else 1024


def _as_3d(t: torch.Tensor) -> torch.Tensor:
    """(group, length) -> (1, group, length); (batch, group, length) as is."""
    return t if t.dim() == 3 else t[None]


def launch_load_rows(dst: torch.Tensor, src: torch.Tensor, reverse: bool, interpreted: bool) -> None:
    """`load_rows` by `_load_rows_kernel`: dst (..., group, length) <- src, reversed if asked."""
    src3, dst3 = _as_3d(src), _as_3d(dst)
    batch, group, length = src3.shape
    block = _block(interpreted)
    n_blocks = cdiv(length, block)
    _load_rows_kernel[(batch * group * n_blocks,)](
        src3, dst3, group, length, n_blocks, *src3.stride(), dst3.stride(0), dst3.stride(1),
        REVERSE=reverse, BLOCK=block)


def launch_write_window(out: torch.Tensor, corr: torch.Tensor, start: int, D: torch.Tensor | None,
                        skip: torch.Tensor | None, interpreted: bool) -> None:
    """`write_window` by `_write_window_kernel`: corr is the inverse FFT's unnormalised output,
    which the kernel scales by 1 / n."""
    length = out.shape[-1]
    out3, corr3 = _as_3d(out), _as_3d(corr)
    skip3 = corr3 if skip is None else _as_3d(skip)
    batch, group, _ = out3.shape
    block = _block(interpreted)
    n_blocks = cdiv(length, block)
    _write_window_kernel[(batch * group * n_blocks,)](
        corr3, corr3 if D is None else D, skip3, out3, group, length, n_blocks, start, 1.0 / corr.shape[-1],
        corr3.stride(0), corr3.stride(1), *skip3.stride(), *out3.stride(), HAS_SKIP=D is not None, BLOCK=block)
