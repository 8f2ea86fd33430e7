"""Rows into and out of fftconv's FFT buffers: `load_rows` and `write_window`, each one pass.

Both work on rows of (lead, group, length) views with any strides (int64 offsets throughout:
a million tokens times a few hundred channels passes 2^31 elements). Each has a Triton kernel
(`fused=True`: CUDA, or the interpreter in tests) and the same op in torch ops for everything
else; fftconv.py says which it uses.

    load_rows:     dst[r, k] = src[r, k], or src[r, length - 1 - k] when reversed, cast to dst's dtype.
                   Reversing while copying turns the backward's correlations into convolutions
                   (fftconv.py), so no spectrum is ever conjugated.
    write_window:  out[r, k] = scale * corr[r, start + k] (+ D[c] * skip[r, k]), cast to out's dtype.
                   The inverse FFT's normalisation, the slice of its output, the skip term and
                   the cast to the output dtype are one read and one write.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..common.host import cdiv


# Below this many elements in one group's FFT buffer, torch ops stage the rows: a Triton launch
# costs more host time (~70 us on the H200 machine) than the kernel saves on the GPU, and short
# sequences are bound by host time. 2^24 float32 is 64 MiB, e.g. 256 channels of 32k tokens.
FUSED_MIN_ELEMENTS = 2**24


class Staging(NamedTuple):
    """How one call moves its rows: by the Triton kernels (fused) or by torch ops, and whether
    Triton runs interpreted (tests on the CPU)."""
    fused: bool
    interpreted: bool


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


def load_rows(dst: torch.Tensor, src: torch.Tensor, reverse: bool, how: Staging) -> None:
    """dst (..., group, length) <- src, reversed along length if asked, cast to dst's dtype; dst's
    last dim must have stride 1."""
    if not how.fused:
        dst.copy_(src.flip(-1) if reverse else src)
        return
    src3, dst3 = _as_3d(src), _as_3d(dst)
    batch, group, length = src3.shape
    block = _block(how.interpreted)
    n_blocks = cdiv(length, block)
    _load_rows_kernel[(batch * group * n_blocks,)](
        src3, dst3, group, length, n_blocks, *src3.stride(), dst3.stride(0), dst3.stride(1),
        REVERSE=reverse, BLOCK=block)


def write_window(out: torch.Tensor, corr: torch.Tensor, start: int, D: torch.Tensor | None,
                 skip: torch.Tensor | None, how: Staging) -> None:
    """out (..., group, length) <- corr[..., start: start + length] (+ D[:, None] * skip), computed in
    corr's dtype (D and skip, in any float dtype, are cast to it) and cast to out's dtype. corr (..., group, n) is an inverse FFT's unnormalised output when fused (the
    kernel scales it by 1 / n), its normalised one otherwise; its last dim has stride 1."""
    length = out.shape[-1]
    window = corr[..., start: start + length]
    if not how.fused:
        if D is None:
            out.copy_(window)
        else:  # one op: addcmul reads the window and skip in place and casts as it writes
            torch.addcmul(window, D[:, None], skip, out=out)
        return
    out3, corr3 = _as_3d(out), _as_3d(corr)
    skip3 = corr3 if skip is None else _as_3d(skip)
    batch, group, _ = out3.shape
    block = _block(how.interpreted)
    n_blocks = cdiv(length, block)
    _write_window_kernel[(batch * group * n_blocks,)](
        corr3, corr3 if D is None else D, skip3, out3, group, length, n_blocks, start, 1.0 / corr.shape[-1],
        corr3.stride(0), corr3.stride(1), *skip3.stride(), *out3.stride(), HAS_SKIP=D is not None, BLOCK=block)
