"""Checks of `apply_rotary_emb`'s positions, shared by the eager path and the custom op."""

from __future__ import annotations

import torch

from ...settings import current as current_settings


def check_offsets(seqlen_offsets, batch: int, device) -> tuple[int | torch.Tensor, list[int] | None]:
    """(what the kernel takes, the offset of each sequence). The offsets of a tensor are read
    here, except while torch.compile traces (None): the custom op reads them when it runs."""
    if isinstance(seqlen_offsets, torch.Tensor):
        if seqlen_offsets.dtype not in (torch.int32, torch.int64) or tuple(seqlen_offsets.shape) != (batch,):
            raise TypeError(f"seqlen_offsets must be an int or an integer tensor of shape ({batch},), got "
                            f"{seqlen_offsets.dtype} {tuple(seqlen_offsets.shape)}")
        if seqlen_offsets.device != device:
            raise ValueError(f"seqlen_offsets must be on {device}, got {seqlen_offsets.device}")
        if torch.compiler.is_compiling() or not current_settings().check_indices:  # trusted, never waited on
            return seqlen_offsets.to(torch.int32).contiguous(), None
        values = seqlen_offsets.tolist()  # one small copy: positions outside the tables must never be read
        check_offset_range(values)
        return seqlen_offsets.to(torch.int32).contiguous(), values
    if isinstance(seqlen_offsets, bool) or not isinstance(seqlen_offsets, int) or not 0 <= seqlen_offsets < 2**31:
        raise ValueError(f"seqlen_offsets must be an int in [0, 2^31) or a tensor, got {seqlen_offsets!r}")
    return seqlen_offsets, [seqlen_offsets] * batch


def check_offset_range(values: list[int]) -> None:
    if min(values) < 0 or max(values) >= 2**31:
        raise ValueError(f"seqlen_offsets must be in [0, 2^31), got {min(values)}..{max(values)}")


def check_positions(lengths: list[int], offsets: list[int], positions: int) -> None:
    """Every token's position (its index plus its sequence's offset) lies inside the tables."""
    check_offset_range(offsets)
    end = max(n + o for n, o in zip(lengths, offsets))
    if end > positions:
        raise ValueError(f"the tables cover {positions} positions but a sequence reaches position {end - 1}")
