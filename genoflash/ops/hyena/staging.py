"""Rows into and out of fftconv's FFT buffers: `load_rows` and `write_window`, each one pass.

Both work on rows of (lead, group, length) views with any strides (int64 offsets throughout:
a million tokens times a few hundred channels passes 2^31 elements). Each has a Triton kernel
(`fused=True`: CUDA, or the interpreter in tests; in staging_kernels.py, imported only then) and
the same op in torch ops for everything else; fftconv.py says which it uses.

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


# Below this many elements in one group's FFT buffer, torch ops stage the rows: a Triton launch
# costs more host time (~70 us on the H200 machine) than the kernel saves on the GPU, and short
# sequences are bound by host time. 2^24 float32 is 64 MiB, e.g. 256 channels of 32k tokens.
FUSED_MIN_ELEMENTS = 2**24


class Staging(NamedTuple):
    """How one call moves its rows: by the Triton kernels (fused) or by torch ops, and whether
    Triton runs interpreted (tests on the CPU)."""
    fused: bool
    interpreted: bool


def load_rows(dst: torch.Tensor, src: torch.Tensor, reverse: bool, how: Staging) -> None:
    """dst (..., group, length) <- src, reversed along length if asked, cast to dst's dtype; dst's
    last dim must have stride 1."""
    if not how.fused:
        dst.copy_(src.flip(-1) if reverse else src)
        return
    from .staging_kernels import launch_load_rows  # triton is only needed for the fused path
    launch_load_rows(dst, src, reverse, how.interpreted)


def write_window(out: torch.Tensor, corr: torch.Tensor, start: int, D: torch.Tensor | None,
                 skip: torch.Tensor | None, how: Staging) -> None:
    """out (..., group, length) <- corr[..., start: start + length] (+ D[:, None] * skip), computed in
    corr's dtype (D and skip, in any float dtype, are cast to it) and cast to out's dtype. corr (..., group, n) is an inverse FFT's unnormalised output when fused (the
    kernel scales it by 1 / n), its normalised one otherwise; its last dim has stride 1."""
    if not how.fused:
        window = corr[..., start: start + out.shape[-1]]
        if D is None:
            out.copy_(window)
        else:  # one op: addcmul reads the window and skip in place and casts as it writes
            torch.addcmul(window, D[:, None], skip, out=out)
        return
    from .staging_kernels import launch_write_window
    launch_write_window(out, corr, start, D, skip, how.interpreted)
