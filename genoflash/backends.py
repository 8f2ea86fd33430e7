"""Which implementation runs an op: `triton`, `torch` or `reference`.

Chosen per call: the `backend` setting (`genoflash.settings(backend=...)`, or its shorthand
`genoflash.use_backend(name)`) if one is set, else by device: CUDA tensors run the Triton
kernels where triton is installed, anything else the `torch` backend. triton is imported only
by the `triton` backend's kernels, so genoflash imports and runs without it (off Linux).
"""

from __future__ import annotations

import importlib.util
import os

from .settings import BACKENDS, current, settings

__all__ = ["BACKENDS", "select_backend", "triton_available", "triton_interpreted", "use_backend"]

TRITON_MISSING = ("the 'triton' backend needs triton, which is not installed (Linux: pip install triton); "
                  "use backend='torch', or leave the backend unset")


def use_backend(name: str):
    """Run genoflash ops inside this block with the given backend: `settings(backend=name)`."""
    if name not in BACKENDS:
        raise ValueError(f"use_backend(name): unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return settings(backend=name)


def triton_interpreted() -> bool:
    """Whether triton runs its kernels on the CPU (TRITON_INTERPRET=1, set before importing genoflash)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _find_triton() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a broken install, or an import hook that refuses it
        return False


# Asked once, at import, without importing triton: select_backend asks on every CUDA call, and a
# module constant is what torch.compile can read while tracing (a cache would be traced through).
_TRITON_AVAILABLE = _find_triton()


def triton_available() -> bool:
    """Whether triton is installed here (its wheels are for Linux only)."""
    return _TRITON_AVAILABLE


def select_backend(device) -> str:
    """The backend for an op on `device`; raises ImportError when the `triton` backend is asked
    for and triton is not installed."""
    name = current().backend
    if name is None:
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if name == "triton" and not triton_available():
        raise ImportError(TRITON_MISSING)
    return name
