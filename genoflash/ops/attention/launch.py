"""Kernel launches that degrade in speed, never fail, when a variant does not build, and
that skip triton's per-launch argument binding once a specialisation has been seen.

configs.py holds the measured best tiling per shape and feature set. Some feature
combinations (RoPE tables, the dropout mask's word shuffle, wide heads) take extra shared
memory, and Triton only learns a kernel's shared-memory size when it compiles. Rather than a
hand-written rule for every combination, a launch that fails with OutOfResources is retried
with one stage fewer (fewer K/V tiles in flight; same tiles, same grid, same results).

TMA descriptor loads (TMA=True, descriptors.py) crashed ptxas (triton 3.6, sm_90: SIGSEGV) in
some kernel and tile combinations, e.g. the dK/dV pass with Q by TMA at 32x64 tiles, hd64,
causal. Such a launch is retried with pointer loads (TMA=False: the same tiles and results; the
descriptors are then ignored). Both fallbacks are remembered per kernel specialisation,
so the failed compile is paid once per process.

The attention kernels take ~56 runtime arguments and ~25 constexprs. Triton's JITFunction.run
binds and specialises all of them on every launch, ~75 us per launch on the H200's host (with
its launcher, ~120 of the ~400 us a launch costs there; docs/design/launch-path.md): at short
sequences the host, not the GPU, sets the pace. So once a
launch has compiled, the compiled kernel is kept under a key made of everything its
specialisation depends on (`specialisation_key`), and a later launch with the same key calls it
directly: through the compiled kernel's launcher, with the arguments triton's own launch
passes after binding. A key that differs in anything triton specialises on is a different
entry, never a wrong hit. The fast_launch setting (genoflash.settings) turns this off for a
call; it is off under the Triton interpreter.

The direct call passes each tensor as its device address (an int). Given a tensor, triton's C
launcher calls its data_ptr() and then asks the driver whether the address is a device one
(cuPointerGetAttribute): ~9 tensors per launch, every launch. The key holds each tensor's dtype,
alignment and is_cuda, so an address reaches a kernel only where a tensor of the same kind built
it. With a launch hook set (profilers such as proton read the tensors) the fast path calls
`CompiledKernel[grid](*args)` with the tensors instead, as triton would; without one, no
launch metadata is built and no empty hook chain is called (triton's runner does both).
"""

from __future__ import annotations

import contextlib
import threading

import torch
from triton import knobs
from triton.runtime import driver
from triton.runtime.errors import OutOfResources, PTXASError
from triton.tools.tensor_descriptor import TensorDescriptor

try:  # Gluon (triton >= 3.5): the one-pass Hopper backward's descriptors
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as _GluonTensorDescriptor
except ImportError:  # pragma: no cover
    _GluonTensorDescriptor = TensorDescriptor

from ...backends import triton_interpreted
from .configs import LaunchConfig

_fitted: dict[tuple, tuple[int, bool]] = {}  # key -> (num_stages, TMA) that built
tma_fallbacks: list[str] = []  # kernels whose TMA variant failed to build (for tests and reports)
# The constexpr switch of the TMA paths (descriptor loads and stores); a ptxas failure turns it off.
_TMA_FLAGS = ("TMA",)

# (kernel, device, triton's debug and instrumentation knobs, launch key, specialisation key) ->
# (compiled kernel, constexpr values in parameter order). Bounded: keys hold argument values
# (shapes, strides), so a workload whose shapes never repeat (varlen batches' max lengths) would
# otherwise grow it without end.
_compiled: dict[tuple, tuple] = {}
_COMPILED_MAX = 512
fast_launches = 0  # launches that took the cached kernel (tests read this)
_INT32 = (-(2**31), 2**31)


_INTERPRETED = triton_interpreted()  # fixed for the process: it must be set before genoflash is imported
# Per thread: set while a call runs with the fast_launch setting off (without_fast_launch), and
# while a thread records its launches for a plan (record_launches).
_local = threading.local()


def fast_launch_allowed() -> bool:
    """Whether this thread's launches may take the cached kernels now."""
    return not _INTERPRETED and not getattr(_local, "slow", False)


def without_fast_launch(call):
    """call() with every launch of this thread through triton's own launcher."""
    saved, _local.slow = getattr(_local, "slow", False), True
    try:
        return call()
    finally:
        _local.slow = saved


_unspecialised: dict = {}  # kernel -> positions of its do_not_specialize parameters


def _unspecialised_positions(kernel) -> tuple[int, ...] | None:
    """Positions of the parameters declared do_not_specialize (the dropout seed and offset,
    which change every call): triton keys those on their integer width only. None for an
    object that is not a JITFunction (tests' stand-ins): it takes the usual path."""
    positions = _unspecialised.get(kernel)
    if positions is None:
        params = getattr(kernel, "params", None)
        if params is None:
            return None
        positions = _unspecialised[kernel] = tuple(i for i, p in enumerate(params) if p.do_not_specialize)
    return positions


# (kernel, the arguments' types) -> _Layout, or None where an argument is of a kind the key does
# not know (then triton binds as usual). Kernels are called with a handful of type patterns (a None
# where a feature is off), so this stays small.
_layouts: dict[tuple, "_Layout | None"] = {}
_SCALARS = (int, float, bool, type(None))


class _Layout:
    """Where a launch's tensors, descriptors and do_not_specialize ints sit, found once per
    (kernel, argument types): the key below then touches those positions alone and takes every
    other argument (ints, floats, bools, None) as it is, at C speed."""

    __slots__ = ("tensors", "descriptors", "unspecialised", "ints", "types")

    def __init__(self, tensors, descriptors, unspecialised, ints, types):
        self.tensors, self.descriptors, self.unspecialised, self.types = tensors, descriptors, unspecialised, types
        self.ints = ints


def _layout(kernel, types: tuple) -> _Layout | None:
    unspecialised = _unspecialised_positions(kernel)
    if unspecialised is None:
        return None
    tensors, descriptors, normalised = [], [], []
    for i, t in enumerate(types):
        if issubclass(t, torch.Tensor):  # nn.Parameter and other subclasses bind as tensors
            tensors.append(i)
            t = torch.Tensor
        elif t is TensorDescriptor or t is _GluonTensorDescriptor:
            descriptors.append(i)
        elif t not in _SCALARS:
            return None
        normalised.append(t)
    # The do_not_specialize ints (the dropout seed and offset) are keyed on their width alone.
    unspecialised = tuple(i for i in unspecialised if i < len(types) and types[i] is int)
    ints = tuple(i for i, t in enumerate(types) if t is int and i not in unspecialised)
    return _Layout(tuple(tensors), tuple(descriptors), unspecialised, ints, tuple(normalised))


def _int_key(a: int):
    """What triton specialises an int on (its native_specialize_impl): 1 becomes a constexpr;
    any other value, its width (i32, i64 or u64) and whether 16 divides it. Keying on this, not on
    the value, lets a stride or length that changes every call (a growing KV cache) hit."""
    if a == 1:
        return 1
    width = 0 if _INT32[0] <= a < _INT32[1] else 1 if -(2**63) <= a < 2**63 else 2
    return width, a % 16 == 0


def specialisation_key(kernel, args: tuple) -> tuple | None:
    """What triton's binder specialises a launch on, or finer (a finer key only misses more);
    None where an argument is of a kind this does not know (then triton binds as usual).

    Tensors: dtype, 16-byte alignment of the data pointer, and whether it is a CUDA tensor. TMA
    descriptors (triton's and Gluon's): the dtype and box shape, and the shared-memory layout of
    a Gluon one (the strides and shape are runtime values). Ints as triton specialises them
    (_int_key: == 1, divisible by 16, 32 or 64 bits), the do_not_specialize ints on their width
    alone; floats, bools and None by value. The argument types are part of the key
    (True == 1 and 1.0 == 1 in Python, but triton types them u1, a constexpr 1 and fp32). No
    tensor is held by the key."""
    return _specialise(kernel, args)[0]


def _specialise(kernel, args: tuple) -> tuple[tuple | None, list | None]:
    """(specialisation_key, the arguments for the direct call: each tensor as its address)."""
    types = tuple(map(type, args))
    layout = _layouts.get((kernel, types), MISSING)
    if layout is MISSING:
        layout = _layouts[(kernel, types)] = _layout(kernel, types)
    if layout is None:
        return None, None
    key = list(args)
    call = list(args)
    for i in layout.tensors:
        a = args[i]
        address = call[i] = a.data_ptr()
        key[i] = (a.dtype, address & 15 == 0, a.is_cuda)
    for i in layout.descriptors:
        a = args[i]
        layout_key = getattr(a, "layout", None)  # Gluon's descriptors carry their shared-memory layout
        if layout_key is not None:
            layout_key = repr(layout_key)  # (a dataclass with a list field: repr, not hash)
        key[i] = (a.base.dtype, tuple(a.block_shape), layout_key)
    for i in layout.unspecialised:
        key[i] = _INT32[0] <= args[i] < _INT32[1]
    for i in layout.ints:
        key[i] = _int_key(args[i])
    key.append(layout.types)
    return tuple(key), call


MISSING = object()


def hooked(hook) -> bool:
    """Whether a launch hook would call anything: triton 3.6 keeps an empty HookChain there by
    default, which its runner builds launch metadata for and its C launcher calls on every launch."""
    return hook is not None and getattr(hook, "calls", True) != []


def _remember(kernel, compiled, fast_key: tuple, nargs: int, constexprs: dict) -> None:
    if compiled is None or not hasattr(compiled, "__getitem__"):
        return
    try:  # every parameter after the runtime ones must be a given constexpr (no defaults)
        tail = tuple(constexprs[name] for name in kernel.arg_names[nargs:])
    except (AttributeError, KeyError):
        return
    # What CompiledKernel's runner hands its launcher (the kernel has just run, so its handles
    # are loaded); None for objects without them (tests' stand-ins), which are called as they are.
    direct = None
    if all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
        direct = (compiled.run, compiled.function, compiled.packed_metadata)
    if len(_compiled) >= _COMPILED_MAX:
        _compiled.clear()
    _compiled[fast_key] = (compiled, tail, direct)


# Recording (plans.py): while a thread records, every launch it makes is appended as (the cached
# entry (compiled, tail, direct), the grid's three axes, the arguments as given), or as None where
# the launch could not be replayed (no fast-path entry, or one without a launcher).
@contextlib.contextmanager
def record_launches():
    """Collect this thread's launches in the yielded list while the block runs."""
    saved, _local.launches = getattr(_local, "launches", None), []
    try:
        yield _local.launches
    finally:
        _local.launches = saved


def _record(entry, grid: tuple, args: tuple) -> None:
    launches = getattr(_local, "launches", None)
    if launches is not None:
        launches.append(None if entry is None or entry[2] is None else (entry, grid, args))


def not_replayable() -> None:
    """Called by launch code that does more than allocate and launch (a torch op of its own): the
    call being recorded, if any, gets no plan."""
    launches = getattr(_local, "launches", None)
    if launches is not None:
        launches.append(None)


def launch(kernel, grid: tuple, cfg: LaunchConfig, *args, **constexprs) -> None:
    """kernel[grid](*args, **constexprs) with cfg's warps and stages (a TileConfig's too)."""
    global fast_launches
    # Every keyword here is a constexpr switch (bools, ints, strings), so the items hash as they
    # are. A call site passes them in one order, so they need no sorting: a key built in another
    # order would only be a cache miss, never a wrong hit.
    key = (kernel.fn.__name__, cfg, tuple(constexprs.items()))
    fast_key = None
    spec, call_args = _specialise(kernel, args) if fast_launch_allowed() else (None, None)
    if spec is not None:
        device = driver.active.get_current_device()
        # triton also compiles per debug and instrumentation setting (knobs a user may switch at run time).
        fast_key = (kernel, device, knobs.runtime.debug, knobs.compilation.instrumentation_mode, key, spec)
        hit = _compiled.get(fast_key)
        if hit is not None:
            compiled, tail, direct = hit
            # All three grid axes, as CompiledKernel.__getitem__ indexes them.
            g0, g1, g2 = grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1
            if direct is None or hooked(knobs.runtime.launch_enter_hook) or hooked(knobs.runtime.launch_exit_hook):
                compiled[(g0, g1, g2)](*args, *tail)  # the runner, with tensors (hooks may read them)
            else:  # the runner's own call, where no hook would be called (so no launch metadata either)
                run, function, metadata = direct
                run(g0, g1, g2, driver.active.get_current_stream(device), function, metadata, None, None, None,
                    *call_args, *tail)
            fast_launches += 1
            _record(hit, (g0, g1, g2), args)
            return
    asked = {flag: constexprs[flag] for flag in _TMA_FLAGS if flag in constexprs}
    stages, tma = _fitted.get(key, (cfg.num_stages, any(asked.values())))
    while True:
        for flag, value in asked.items():  # after a fallback, every TMA path is off
            constexprs[flag] = value and tma
        try:
            compiled = kernel[grid](*args, num_warps=cfg.num_warps, num_stages=stages,
                                    **({"launch_pdl": True} if getattr(cfg, "pdl", False) else {}), **constexprs)
        except OutOfResources:  # raised before the kernel runs: nothing was written
            if stages <= 1:
                raise
            stages -= 1
            continue
        except PTXASError:  # raised by the compiler, before the kernel runs
            if not tma:
                raise
            tma = False
            tma_fallbacks.append(kernel.fn.__name__)
            continue
        _fitted[key] = (stages, tma)
        if fast_key is not None:  # the kernel that ran: its stages and TMA flags are in `constexprs`
            _remember(kernel, compiled, fast_key, len(args), constexprs)
        entry = _compiled.get(fast_key) if fast_key is not None else None
        _record(entry, (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1), args)
        return
