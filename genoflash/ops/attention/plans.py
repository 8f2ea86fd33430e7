"""Launch plans: a repeated attention call replayed from a recording of its launches.

At short sequences the host, not the GPU, sets the pace: one fwd+bwd at B32 N512 H16 hd128 took
0.8-1.3 ms of host time on the H200's host while the GPU was busy for 0.64 ms of it
(docs/design/launch-path.md). Most of that time recomputed, on every call, what depends only on
the kind of call: tile configs, grids, strides, descriptor shapes, the fast launch's key over ~80
arguments.

A plan is made from the first call of a kind: the pass runs as usual while launch.py records each
launch (the compiled kernel's launcher and its arguments), and each tensor argument is traced back
to one of the call's inputs, to one of its outputs, or to a buffer it allocated. A later call of
the same kind allocates the outputs and buffers and calls the same launchers with the same
arguments but for the new addresses: the same kernels, so the same results, bit for bit
(tests/ops/attention/test_launch.py compares them on the GPU).

The kind of a call is its pass's `plan_key` (forward.py, backward.py): everything the launch code
reads that may differ between calls (shapes, strides, alignments, dtypes, scalars, the settings),
or None where a call has tensors or per-call values of its own (varlen's cu_seqlens, ALiBi slopes,
RoPE tables, dropout's seed) or where the launch code decides from the device's free memory at the
time. Launch code that runs torch ops of its own besides allocation (a sum, a fill) calls
`launch.not_replayable()`. No plan is made or used under the Triton interpreter, with the
fast_launch setting off, while tile configs are overridden (tests), or while a launch hook is set
(a profiler).
"""

from __future__ import annotations

from typing import Callable

import torch
from triton import knobs
from triton.runtime import driver
from triton.tools.tensor_descriptor import TensorDescriptor

from . import configs, descriptors, launch as launcher
from .args import AttentionArgs

try:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as _GluonTensorDescriptor
except ImportError:  # pragma: no cover
    _GluonTensorDescriptor = TensorDescriptor
_DESCRIPTORS = (TensorDescriptor, _GluonTensorDescriptor)
_SCALARS = (int, float, bool, type(None))

_plans: dict[tuple, "_Plan | None"] = {}  # key -> plan, or None: this kind of call cannot be replayed
_PLANS_MAX = 256  # keys hold shapes: a workload whose shapes never repeat must not grow this without end
replays = 0  # calls answered by a plan (tests read this)


def plannable(a: AttentionArgs, q: torch.Tensor) -> bool:
    """Whether a call with these arguments may have a plan: CUDA tensors, the fast launch on, and
    no tensors or per-call values beside q, k and v (varlen, ALiBi, RoPE, dropout)."""
    return (q.is_cuda and a.settings.fast_launch and not a.varlen and a.alibi_slopes is None
            and a.rotary_cos is None and a.dropout is None)


def switches() -> tuple:
    """What every key holds beside its call's own values: triton compiles per debug and
    instrumentation setting, and per device."""
    return knobs.runtime.debug, knobs.compilation.instrumentation_mode, driver.active.get_current_device()


def usable() -> bool:
    """Whether plans (and decode.py's steps) may be made or used now (beyond what a key says)."""
    if not launcher.fast_launch_allowed() or configs.overridden():
        return False
    return not (launcher.hooked(knobs.runtime.launch_enter_hook) or launcher.hooked(knobs.runtime.launch_exit_hook))


# ---------------------------------------------------------------- plans

class _Address:
    """A descriptor's base in a replay: all triton's launcher reads of it is data_ptr()."""
    __slots__ = ("address", "dtype")

    def __init__(self, address: int, dtype: torch.dtype):
        self.address, self.dtype = address, dtype

    def data_ptr(self) -> int:
        return self.address


class _Plan:
    """outputs: (shape, dtype) of each output, allocated contiguous; buffers: (numel, dtype) of each
    buffer; launches: one `_Launch` or `_RawLaunch` per recorded launch, in order."""
    __slots__ = ("outputs", "buffers", "launches")

    def __init__(self, outputs, buffers, launches):
        self.outputs, self.buffers, self.launches = outputs, buffers, launches

    def run(self, inputs: tuple) -> tuple:
        device = inputs[0].device
        outs = tuple(torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.outputs)
        bufs = [torch.empty(numel, dtype=dtype, device=device) for numel, dtype in self.buffers]
        addresses = ([t.data_ptr() for t in inputs], [t.data_ptr() for t in outs], [t.data_ptr() for t in bufs])
        stream = driver.active.get_current_stream(driver.active.get_current_device())
        for launch in self.launches:
            launch(addresses, stream)
        return outs


class _Launch:
    """A recorded launch through its CudaLauncher (the runner's call, no hooks): the arguments as
    given, with each tensor slot (position, source: 0 input / 1 output / 2 buffer, index, byte
    offset) filled by an address and each descriptor slot by a descriptor of the new address."""
    __slots__ = ("run", "function", "metadata", "tail", "grid", "template", "tensor_slots", "desc_slots")

    def __init__(self, run, function, metadata, tail, grid, template, tensor_slots, desc_slots):
        self.run, self.function, self.metadata, self.tail, self.grid = run, function, metadata, tail, grid
        self.template, self.tensor_slots, self.desc_slots = template, tensor_slots, desc_slots

    def __call__(self, addresses, stream) -> None:
        args = self.template.copy()
        for pos, source, index, offset in self.tensor_slots:
            args[pos] = addresses[source][index] + offset
        for pos, cls, fields, source, index, offset, dtype in self.desc_slots:
            args[pos] = descriptors.unchecked(cls, **fields, base=_Address(addresses[source][index] + offset, dtype))
        g0, g1, g2 = self.grid
        self.run(g0, g1, g2, stream, self.function, self.metadata, None, None, None, *args, *self.tail)


class _RawLaunch:
    """A recorded launch through triton's C launcher itself, with the arguments as its Python
    wrappers would have expanded them: each descriptor as its CUtensorMap (or base address), shape
    and strides. Of that, only the addresses change between calls: tensor slots as in _Launch, and
    map slots (position, source, index, offset, the rest of fill_tma_descriptor's arguments, a
    cache of maps by address). The wrappers cost ~35 us per launch on the H200's host (a Python
    loop over ~85 arguments, a CUtensorMap encoded per descriptor per launch); in a loop the same
    tensors, and so the same maps, come back (the caching allocator reuses blocks), and a map is
    copied into the launch's parameters, so one object serves every launch at its address."""
    __slots__ = ("raw", "function", "metadata", "cooperative", "pdl", "grid", "template", "tensor_slots",
                 "map_slots", "fill")

    def __init__(self, raw, function, metadata, cooperative, pdl, grid, template, tensor_slots, map_slots, fill):
        self.raw, self.function, self.metadata, self.cooperative, self.pdl = raw, function, metadata, cooperative, pdl
        self.grid, self.template, self.tensor_slots, self.map_slots, self.fill = grid, template, tensor_slots, \
            map_slots, fill

    def __call__(self, addresses, stream) -> None:
        args = self.template.copy()
        for pos, source, index, offset in self.tensor_slots:
            args[pos] = addresses[source][index] + offset
        for pos, source, index, offset, fill_args, cache in self.map_slots:
            address = addresses[source][index] + offset
            tensor_map = cache.get(address)
            if tensor_map is None:
                if len(cache) >= _MAPS_PER_SLOT:
                    cache.clear()
                tensor_map = cache[address] = self.fill(address, *fill_args)
            args[pos] = tensor_map
        g0, g1, g2 = self.grid
        self.raw(g0, g1, g2, stream, self.function, self.cooperative, self.pdl, None, None, self.metadata, None,
                 None, None, *args)


_MAPS_PER_SLOT = 8


def _raw_launcher(run):
    """(C launch function, tensordesc metadata list or None) of a CudaLauncher whose launches need
    no scratch memory, or None where this triton's launcher is not laid out as 3.6's."""
    if type(run).__name__ != "CudaLauncher":
        return None
    try:
        if run.global_scratch_size or run.profile_scratch_size:
            return None
        launch = run.launch
        code = getattr(launch, "__code__", None)
        if code is None or code.co_name != "inner":  # no descriptor arguments: the C function itself
            return launch, None
        # wrap_handle_tensordesc's closure: the C function and the descriptors' metadata
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in launch.__closure__)))
        raw, metas = cells["launcher"], cells["tensordesc_meta"]
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    if not callable(raw) or not isinstance(metas, list):
        return None
    return raw, metas


def replayer(recorded) -> "Callable | None":
    """One recorded launch's kernel as `call(g0, g1, g2, stream, *arguments)`, the arguments being
    the kernel's runtime parameters with each tensor given as its address (the constexprs are
    appended as recorded): through triton's C launcher where its layout is known (as _RawLaunch),
    else through the compiled kernel's runner (launch.py's direct call). For launch code that
    builds its own arguments per call because some of them change every call (decode.py's steps:
    the strides and key count of a growing cache). None for a launch with a TMA descriptor
    argument (not handled here) or one that was not recorded."""
    if recorded is None:
        return None
    (_, tail, (run, function, metadata)), _, args = recorded
    if any(type(a) in _DESCRIPTORS for a in args):
        return None
    found = _raw_launcher(run)
    if found is None:
        def call(g0, g1, g2, stream, *arguments):
            run(g0, g1, g2, stream, function, metadata, None, None, None, *arguments, *tail)
        return call
    raw = found[0]
    cooperative, pdl = run.launch_cooperative_grid, run.launch_pdl

    def call_raw(g0, g1, g2, stream, *arguments):
        raw(g0, g1, g2, stream, function, cooperative, pdl, None, None, metadata, None, None, None, *arguments, *tail)
    return call_raw


def descriptor_arguments(desc, meta, address_of=None):
    """What triton 3.6's launcher wrapper (driver.make_tensordesc_arg) passes its C launcher for a
    descriptor argument, as (arguments, fill arguments or None): with metadata, a CUtensorMap made
    by fill_tma_descriptor(address, *fill arguments), shape and strides; without, the base, shape,
    strides, the padding flag, shape and strides again. The map (or base) is left as None, to be
    filled per call; tests compare the rest with triton's own."""
    if meta is None:
        return [None, *desc.shape, *desc.strides, desc.padding == "nan", *desc.shape, *desc.strides], None
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST
    shape = list(desc.shape)
    assert desc.strides[-1] == 1
    if meta["fp4_padded"]:
        shape[-1] *= 2
    fill_args = (meta["swizzle"], meta["elem_size"], TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]], meta["block_size"],
                 shape, desc.strides, 1 if desc.padding == "nan" else 0)
    return [None, *shape, *desc.strides], fill_args


def _raw_launch(run, function, metadata, tail, grid, args, source_of) -> "_RawLaunch | None":
    found = _raw_launcher(run)
    if found is None:
        return None
    raw, metas = found
    template, tensor_slots, map_slots = [], [], []
    desc_index = 0
    for arg in (*args, *tail):
        if isinstance(arg, torch.Tensor):
            source = source_of(arg)
            if source is None:
                return None
            tensor_slots.append((len(template), *source))
            template.append(None)
        elif type(arg) in _DESCRIPTORS:
            source = source_of(arg.base)
            if source is None:
                return None
            meta = metas[desc_index] if metas else None
            desc_index += 1
            expanded, fill_args = descriptor_arguments(arg, meta)
            if fill_args is None:  # the base goes as a pointer
                tensor_slots.append((len(template), *source))
            else:
                map_slots.append((len(template), *source, fill_args, {}))
            template.extend(expanded)
        else:
            template.append(arg)
    if metas and desc_index != len(metas):
        return None
    return _RawLaunch(raw, function, metadata, run.launch_cooperative_grid, run.launch_pdl, grid, template,
                      tuple(tensor_slots), tuple(map_slots), driver.active.utils.fill_tma_descriptor)


def build(recorded: list, inputs: tuple, outputs: tuple) -> _Plan | None:
    """A plan from one call's recorded launches, or None where it cannot replay them."""
    if not recorded or any(entry is None for entry in recorded):
        return None
    by_id = {id(t): i for i, t in enumerate(inputs)}
    if len(by_id) < len(inputs):  # one tensor given twice (q is k): a later call need not do the same
        return None
    input_storages = {t.untyped_storage().data_ptr() for t in inputs}
    output_storages = {}
    for j, t in enumerate(outputs):
        if not t.is_contiguous() or t.storage_offset() != 0:
            return None
        output_storages[t.untyped_storage().data_ptr()] = j
    buffer_storages: dict[int, int] = {}
    buffers: list[tuple[int, torch.dtype]] = []

    def source_of(t: torch.Tensor):
        i = by_id.get(id(t))
        if i is not None:
            return 0, i, 0
        base = t.untyped_storage().data_ptr()
        offset = t.data_ptr() - base
        if base in output_storages:
            return 1, output_storages[base], offset
        if base in input_storages:  # a view of an input: its offset need not be the same next time
            return None
        k = buffer_storages.get(base)
        if k is None:
            nbytes = t.untyped_storage().nbytes()
            if nbytes % t.element_size():
                return None
            k = buffer_storages[base] = len(buffers)
            buffers.append((nbytes // t.element_size(), t.dtype))
        return 2, k, offset

    launches = []
    for (compiled, tail, direct), grid, args in recorded:
        run, function, metadata = direct
        raw = _raw_launch(run, function, metadata, tail, grid, args, source_of)
        if raw is not None:
            launches.append(raw)
            continue
        template, tensor_slots, desc_slots = list(args), [], []
        for pos, arg in enumerate(args):
            if isinstance(arg, torch.Tensor):
                source = source_of(arg)
                if source is None:
                    return None
                tensor_slots.append((pos, *source))
                template[pos] = None
            elif type(arg) in _DESCRIPTORS:
                source = source_of(arg.base)
                if source is None:
                    return None
                fields = {name: value for name, value in vars(arg).items() if name != "base"}
                desc_slots.append((pos, type(arg), fields, *source, arg.base.dtype))
                template[pos] = None
            elif not isinstance(arg, _SCALARS):
                return None
        launches.append(_Launch(run, function, metadata, tail, grid, template, tuple(tensor_slots), tuple(desc_slots)))
    return _Plan(tuple((tuple(t.shape), t.dtype) for t in outputs), buffers, launches)


def planned(key: tuple | None, inputs: tuple, call, fast: bool = True):
    """call()'s outputs (a tuple of tensors): replayed from the plan for `key` when there is one;
    else call() runs, recorded, and its launches become the plan for `key`. fast=False (the
    fast_launch setting off): call() runs with every launch through triton's own launcher."""
    global replays
    if not fast:
        return launcher.without_fast_launch(call)
    if key is None or not usable():
        return call()
    plan = _plans.get(key, launcher.MISSING)
    if plan is None:  # this kind of call cannot be replayed
        return call()
    if plan is not launcher.MISSING:
        replays += 1
        return plan.run(inputs)
    with launcher.record_launches() as recorded:
        outputs = call()
    if len(_plans) >= _PLANS_MAX:
        _plans.clear()
    _plans[key] = build(recorded, inputs, outputs)
    return outputs
