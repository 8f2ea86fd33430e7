"""Which layout a tensor handed to the selective scan is in, asked on the host: in a module of its
own, without triton, so that interface.py (and the torch backend behind it) imports without triton."""

from __future__ import annotations

import torch


def time_contiguous(t: torch.Tensor) -> bool:
    """Whether a (batch, seqlen, dim) tensor's steps are adjacent in memory, as in a view of
    (batch, dim, seqlen) memory: what the scan's kernels need to keep runs of steps in each thread.
    A single step is either layout."""
    return t.stride(1) == 1 or t.shape[1] == 1
