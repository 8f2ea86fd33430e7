"""What a user may switch, in one place: `genoflash.settings(...)`.

| field | default | what it does |
|---|---|---|
| `backend` | `None` | which implementation runs the ops: `"triton"` (the fused kernels), `"torch"` (the same tiled algorithm in PyTorch ops) or `"reference"` (standard attention, N x N); `None` picks by device: CUDA tensors run `triton` where triton is installed, others `torch` |
| `tma` | `True` | Hopper's TMA copy engine for tile loads where it applies (fixed-length batches, aligned tensors). `False` takes the pointer loads that GPUs before Hopper take, with the same results: to compare the two paths or to step around a driver problem |
| `check_indices` | `True` | read the index tensors of `flash_attn_with_kvcache` (`cache_seqlens`, `cache_batch_idx`, `cache_leftpad`, `block_table`) and of `apply_rotary_emb` (`seqlen_offsets`) to the host and check every value before the cache or the tables are touched: one synchronisation per call, 62 us on a 190 us decoding step at 131k keys on an H100 (docs/design/decoding.md). `False` trusts them, so that a decoding step never waits on the host; a bad index is then undefined behaviour, as in flash-attn |
| `fast_launch` | `True` | after the first launch of a kind, call the compiled kernels directly and replay repeated attention calls from a recording of their launches (docs/design/launch-path.md). `False` sends every launch through triton's own launcher: for debuggers and tools that wrap triton's launches |

Settings hold inside the block for the calling thread or task (a context variable), and nest.
An attention call reads them once, when it is made, so its backward runs with the settings of
its forward on whichever thread autograd runs it. Under `torch.compile` they are read when the
graph is traced and guarded on: a change of settings retraces (docs/design/custom-ops.md).

    with genoflash.settings(backend="reference"):
        out = genoflash.flash_attn_func(q, k, v)
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading

import torch

BACKENDS = ("triton", "torch", "reference")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The switches a user may change; see the module's table. Frozen (hashable): launch plans
    key on it."""
    backend: str | None = None
    tma: bool = True
    fast_launch: bool = True
    check_indices: bool = True

    def __post_init__(self):
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"settings(backend=...): unknown backend {self.backend!r}; choose one of "
                             f"{', '.join(BACKENDS)} (or None: by device)")
        for name in ("tma", "fast_launch", "check_indices"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"settings({name}=...) must be a bool, got {type(getattr(self, name)).__name__}")


_current: contextvars.ContextVar[Settings] = contextvars.ContextVar("genoflash_settings", default=Settings())


class _Mirror(threading.local):
    """The thread's settings, mirrored from the context variable by `settings()`. Dynamo cannot
    trace `ContextVar.get` (a graph break), but reads a thread-local attribute and guards on it."""

    def __init__(self):  # runs once per thread: an instance attribute, never the class's
        self.settings = Settings()


_mirror = _Mirror()


def current() -> Settings:
    """The settings in force here."""
    if torch.compiler.is_compiling():
        # Equal to _current.get() on this thread, except inside asyncio tasks that interleave
        # settings() blocks on one thread, which compiled code does not do.
        return _mirror.settings
    return _current.get()


@contextlib.contextmanager
def settings(**changes):
    """Change some settings inside this block (the others stay as they are); yields the new Settings."""
    unknown = set(changes) - {f.name for f in dataclasses.fields(Settings)}
    if unknown:
        raise TypeError(f"settings() got unknown setting(s) {', '.join(sorted(unknown))}; "
                        f"known: {', '.join(f.name for f in dataclasses.fields(Settings))}")
    previous = _mirror.settings
    token = _current.set(dataclasses.replace(_current.get(), **changes))
    _mirror.settings = _current.get()
    try:
        yield _current.get()
    finally:
        _current.reset(token)
        _mirror.settings = previous
