"""Which implementation runs an op: `triton`, `torch` or `reference`.

Chosen per call: the `backend` setting (`genoflash.settings(backend=...)`, or its shorthand
`genoflash.use_backend(name)`) if one is set, else by device: CUDA tensors run the Triton
kernels, anything else the `torch` backend.
"""

from __future__ import annotations

import os

from .settings import BACKENDS, current, settings

__all__ = ["BACKENDS", "select_backend", "triton_interpreted", "use_backend"]


def use_backend(name: str):
    """Run genoflash ops inside this block with the given backend: `settings(backend=name)`."""
    if name not in BACKENDS:
        raise ValueError(f"use_backend(name): unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return settings(backend=name)


def triton_interpreted() -> bool:
    """Whether triton runs its kernels on the CPU (TRITON_INTERPRET=1, set before importing genoflash)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def select_backend(device) -> str:
    name = current().backend
    if name is not None:
        return name
    return "triton" if device.type == "cuda" else "torch"
