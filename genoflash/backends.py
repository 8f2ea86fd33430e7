"""Which implementation runs an op: `triton`, `torch` or `reference`.

Chosen per call, in this order:
1. the innermost `genoflash.use_backend(name)` context, if any;
2. the environment variable `GENOFLASH_BACKEND`, if set;
3. by device: CUDA tensors run the Triton kernels, anything else the `torch` backend.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

BACKENDS = ("triton", "torch", "reference")

_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("genoflash_backend", default=None)


def _check_name(name: str, source: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{source}: unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return name


@contextlib.contextmanager
def use_backend(name: str):
    """Run genoflash ops inside this block with the given backend."""
    token = _override.set(_check_name(name, "use_backend(name)"))
    try:
        yield
    finally:
        _override.reset(token)


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def select_backend(device) -> str:
    name = _override.get()
    if name is not None:
        return name
    env = os.environ.get("GENOFLASH_BACKEND")
    if env:
        return _check_name(env, "GENOFLASH_BACKEND")
    return "triton" if device.type == "cuda" else "torch"
