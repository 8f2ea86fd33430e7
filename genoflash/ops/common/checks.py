"""Argument checks more than one operator makes. Each raises a ValueError or TypeError that names
the argument, never a wrong answer."""

from __future__ import annotations

import operator

import torch

from ...backends import triton_interpreted

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def as_int(name: str, value) -> int:
    """value as a Python int: a Python int, a numpy integer or a 0-d integer tensor (flash-attn's
    callers pass all three), read once; bools and anything else raise a TypeError naming it."""
    if isinstance(value, bool) or isinstance(value, torch.Tensor) and value.dtype == torch.bool:
        raise TypeError(f"{name} must be an int, got a bool")
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.is_floating_point() or value.is_complex():
            raise TypeError(f"{name} must be an int or a 0-d integer tensor, got a {value.dtype} tensor of shape "
                            f"{tuple(value.shape)}")
        return int(value.item())
    if isinstance(value, int):
        return int(value)
    if hasattr(value, "__index__") and not isinstance(value, float):  # numpy integers
        return operator.index(value)
    raise TypeError(f"{name} must be an int, got {type(value).__name__}")


def as_float(name: str, value) -> float:
    """value as a Python float: an int, a float, a numpy scalar or a 0-d real tensor, read once."""
    if isinstance(value, bool) or isinstance(value, torch.Tensor) and value.dtype == torch.bool:
        raise TypeError(f"{name} must be a float, got a bool")
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.is_complex():
            raise TypeError(f"{name} must be a float or a 0-d tensor, got a tensor of shape {tuple(value.shape)}")
        return float(value.item())
    if isinstance(value, (int, float)):
        return float(value)
    if hasattr(value, "__float__") and hasattr(value, "dtype") and getattr(value.dtype, "kind", "") in "iuf":
        return float(value)  # numpy scalars
    raise TypeError(f"{name} must be a float, got {type(value).__name__}")


def check_float_tensor(name: str, t, rank: int, layout: str) -> None:
    """t is a floating-point torch.Tensor of the given rank (layout names its axes, for the message)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor (float16, bfloat16, float32 or float64), "
                        f"got {t.dtype}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have rank {rank} {layout}, got shape {tuple(t.shape)}")


def check_cu_seqlens(name: str, cu: torch.Tensor, total: int, max_seqlen, device) -> list[int] | None:
    """The per-sequence lengths; None while torch.compile traces, where values do not exist yet:
    the custom ops check them again when they run (docs/design/custom-ops.md)."""
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2:
        raise TypeError(f"{name} must be a 1-D int32 tensor of batch + 1 prefix sums")
    if cu.device != device:
        raise ValueError(f"{name} must be on {device}, got {cu.device}")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int):
        raise TypeError(f"max_seqlen for {name} must be an int, got {type(max_seqlen).__name__}")
    if torch.compiler.is_compiling():
        return None
    values = cu.tolist()  # one small device-to-host copy; a wrong cu_seqlens must never read out of bounds
    lengths = [b - a for a, b in zip(values, values[1:])]
    if values[0] != 0 or min(lengths) < 0:
        raise ValueError(f"{name} must start at 0 and never decrease, got {values[:8]}...")
    if values[-1] != total:
        raise ValueError(f"{name} ends at {values[-1]} but the packed tensor holds {total} tokens")
    if max_seqlen < max(lengths):
        raise ValueError(f"max_seqlen ({max_seqlen}) is smaller than the longest sequence in {name} "
                         f"({max(lengths)})")
    return lengths


def check_triton_device(t: torch.Tensor) -> None:
    """t is a tensor the triton backend's kernels take: 16- or 32-bit floats, on CUDA or under
    the interpreter."""
    if t.dtype not in TRITON_DTYPES:
        raise TypeError(f"the triton backend supports float16, bfloat16 and float32, got {t.dtype}")
    if t.device.type != "cuda" and not triton_interpreted():
        raise ValueError(f"the triton backend needs CUDA tensors (got {t.device}); on the CPU use the "
                         "'torch' backend, or set TRITON_INTERPRET=1 before importing genoflash")
