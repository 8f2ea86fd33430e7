"""Helpers for the operators' launch code on the host.

triton.cdiv and triton.next_power_of_2 are ConstexprFunctions: about 2-3 us per call from Python,
paid on every launch where host time bounds the step (attention at N = 512, Hyena at 16k).
`cdiv` and `next_power_of_2` are the same integers in plain Python."""

from __future__ import annotations

import functools

import torch


def cdiv(a: int, b: int) -> int:
    """Ceiling of a / b for b > 0."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n for n >= 1 (0 for 0), as triton.next_power_of_2."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


# A CUDA grid's second and third axes stop at 65,535 programs (the first at 2^31 - 1).
MAX_GRID_YZ = 65535


def sm_count(device: torch.device | int) -> int:
    """Multiprocessors of a CUDA device (a torch.device, its index, or a device without an index
    for the current one). Cached per index: launch code asks on every call."""
    if isinstance(device, torch.device):
        device = device.index if device.index is not None else torch.cuda.current_device()
    return _sm_count(device)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
