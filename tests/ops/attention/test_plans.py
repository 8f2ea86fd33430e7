"""Launch plans (ops/attention/plans.py): a repeated kind of call replayed from a recording of its
launches. On the CPU with stand-in kernels (the interpreter has no compiled kernels): what a replay
passes each launcher, which calls get a plan and which keys refuse one. On the GPU, replays against
the usual path bit for bit (test_launch.py, test_fast_path_equals_the_usual_launch_on_gpu)."""

from __future__ import annotations

import types

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

import genoflash
from genoflash.ops.attention import backward, configs, forward, launch as launcher, plans
from genoflash.ops.attention.args import AttentionArgs
from genoflash.ops.attention.configs import TileConfig
from genoflash.ops.attention.dropout import DropoutArgs


class _Compiled:
    """A compiled kernel with the launcher fields launch.py's direct call uses; records the calls."""
    function, packed_metadata = 99, (4, 1, 0)

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)

    def __getitem__(self, grid):
        raise AssertionError("the runner is not taken without launch hooks")


def _kernel(names, compiled):
    class Kernel:
        fn = types.SimpleNamespace(__name__="_plan_kernel")
        arg_names = names
        params = [types.SimpleNamespace(do_not_specialize=False) for _ in names]

        def __getitem__(self, grid):
            def run(*args, num_warps, num_stages, **constexprs):
                compiled.run(*grid, "first launch", *args)
                return compiled
            return run
    return Kernel()


@pytest.fixture
def gpu_like(monkeypatch):
    """Fast launch and plans on, with a stand-in driver (device 0, stream 7)."""
    fake = types.SimpleNamespace(active=types.SimpleNamespace(get_current_device=lambda: 0,
                                                              get_current_stream=lambda device: 7))
    monkeypatch.setattr(launcher, "_INTERPRETED", False)
    monkeypatch.setattr(launcher, "driver", fake)
    monkeypatch.setattr(plans, "driver", fake)
    monkeypatch.setattr(plans, "_plans", {})
    launcher._compiled.clear()


def _op(kernel, calls):
    """Launch code as attention_forward is: allocates an output and a buffer, launches once with
    tensors (an input, the output, a view of the buffer), descriptors of an input and of the
    output, and scalars."""
    def op(x):
        calls.append(x)
        out = torch.empty_like(x)
        buf = torch.empty(8, dtype=torch.float32)
        dx = TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 16, 1, 64])
        dout = TensorDescriptor(out, list(out.shape), list(out.stride()), [1, 16, 1, 64])
        launcher.launch(kernel, (3, 2), TileConfig(64, 32, 4, 3), x, out, buf[2:], dx, dout, 16, 0.5, None,
                        BLOCK=64)
        return (out,)
    return op


def test_a_replay_passes_the_recorded_arguments_with_new_addresses(gpu_like):
    compiled = _Compiled()
    kernel = _kernel(["X", "O", "B", "DX", "DO", "n", "scale", "none", "BLOCK"], compiled)
    calls = []
    op = _op(kernel, calls)
    x1 = torch.randn(2, 32, 4, 64, dtype=torch.float16)
    (out1,) = plans.planned(("k",), (x1,), lambda: op(x1))  # recorded
    assert len(calls) == 1 and len(compiled.calls) == 1
    replays = plans.replays
    x2 = torch.randn(2, 32, 4, 64, dtype=torch.float16)
    allocated, empty = [], torch.empty
    with pytest.MonkeyPatch.context() as m:  # (through torch.empty: tests' NaN poisoning reaches replays too)
        m.setattr(torch, "empty", lambda *a, **kw: allocated.append(empty(*a, **kw)) or allocated[-1])
        (out2,) = plans.planned(("k",), (x2,), lambda: op(x2))  # replayed: op does not run
    assert [t.dtype for t in allocated] == [torch.float16, torch.float32] and allocated[0] is out2
    assert allocated[1].numel() == 8
    assert len(calls) == 1 and plans.replays == replays + 1
    assert out2.shape == x2.shape and out2.dtype == x2.dtype and out2.data_ptr() != x2.data_ptr()
    call = compiled.calls[-1]
    assert call[:9] == (3, 2, 1, 7, 99, (4, 1, 0), None, None, None)
    x_addr, out_addr, buf_view, dx, dout = call[9:14]
    assert x_addr == x2.data_ptr() and out_addr == out2.data_ptr()
    assert type(buf_view) is int and buf_view == allocated[1].data_ptr() + 8  # a fresh buffer, at the view's offset
    assert type(dx) is TensorDescriptor and dx.base.data_ptr() == x2.data_ptr()
    assert (dx.shape, dx.strides, dx.block_shape, dx.padding) == ([2, 32, 4, 64], list(x2.stride()), [1, 16, 1, 64],
                                                                  "zero")
    assert dout.base.data_ptr() == out2.data_ptr()
    assert call[14:] == (16, 0.5, None, 64)  # the scalars, then the constexpr tail


def test_calls_that_cannot_be_replayed_take_the_usual_path(gpu_like):
    compiled = _Compiled()
    kernel = _kernel(["X", "O", "B", "DX", "DO", "n", "scale", "none", "BLOCK"], compiled)
    calls = []
    op = _op(kernel, calls)

    def marked(x):
        result = op(x)
        launcher.not_replayable()  # e.g. a torch op of its own after the launch
        return result
    for _ in range(3):
        x = torch.randn(2, 32, 4, 64, dtype=torch.float16)
        plans.planned(("marked",), (x,), lambda: marked(x))
    assert len(calls) == 3 and plans._plans[("marked",)] is None
    # A tensor argument that is a view of an input: its offset could differ next time.
    parent = torch.randn(3, 32, 4, 64, dtype=torch.float16)
    calls.clear()
    for _ in range(2):
        plans.planned(("view",), (parent,), lambda: op(parent[1:]))
    assert len(calls) == 2 and plans._plans[("view",)] is None
    # One tensor given as two inputs: a plan would bind both slots to whichever came first.
    calls.clear()
    x = torch.randn(2, 32, 4, 64, dtype=torch.float16)
    for _ in range(2):
        plans.planned(("twice",), (x, x), lambda: op(x))
    assert len(calls) == 2 and plans._plans[("twice",)] is None
    # A call with the fast_launch setting off: no recording, no plan, and no launch takes the
    # cached kernel (the stand-in's first-launch path runs every time).
    calls.clear()
    for _ in range(2):
        x = torch.randn(2, 32, 4, 64, dtype=torch.float16)
        plans.planned(("slow",), (x,), lambda: op(x), fast=False)
    assert len(calls) == 2 and ("slow",) not in plans._plans
    assert launcher.fast_launch_allowed()  # on again after the call
    # No key: no recording, no plan.
    plans.planned(None, (x,), lambda: op(x))
    assert None not in plans._plans


def test_keys_refuse_what_a_plan_cannot_hold(gpu_like, monkeypatch):
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # CPU tensors stand in
    q, k, v = (torch.randn(2, 64, 4, 64, dtype=torch.float16) for _ in range(3))
    plain = AttentionArgs(0.125)
    key = forward.plan_key(q, k, v, plain)
    assert key is not None and key == forward.plan_key(*(torch.randn_like(t) for t in (q, k, v)), plain)
    assert forward.plan_key(q, k, v, AttentionArgs(0.125, -1, 0)) != key  # causal is another kind
    assert forward.plan_key(q[:, :63], k, v, plain) != key
    for other in (AttentionArgs(0.125, alibi_slopes=torch.rand(4)), AttentionArgs(0.125, dropout=DropoutArgs(0.1, 1, 0)),
                  AttentionArgs(0.125, rotary_cos=torch.rand(64, 8), rotary_sin=torch.rand(64, 8)),
                  AttentionArgs(0.125, settings=genoflash.Settings(fast_launch=False))):
        assert forward.plan_key(q, k, v, other) is None
    # The settings are part of the key: the tma setting changes what the launch code does.
    assert forward.plan_key(q, k, v, AttentionArgs(0.125, settings=genoflash.Settings(tma=False))) not in (None, key)
    # Long unmasked keys: the key-chunk split is decided from the free memory at the time.
    long_k = torch.randn(1, configs.FORWARD_KEY_CHUNK + 1, 1, 8, dtype=torch.float16)
    assert forward.plan_key(q[:1, :, :1, :8], long_k, long_k, plain) is None
    assert forward.plan_key(q[:1, :, :1, :8], long_k, long_k, AttentionArgs(0.125, -1, 0)) is not None
    # The backward's key holds deterministic (which picks the kernels) beside what the forward's holds.
    monkeypatch.setitem(configs._total_memory, None, 141 * 2**30)  # the stand-in device's memory
    out, lse, dout = torch.randn_like(q), torch.randn(2, 4, 64), torch.randn_like(q)
    bkey = backward.plan_key(dout, q, k, v, out, lse, plain)
    assert bkey is not None and bkey != backward.plan_key(dout, q, k, v, out, lse, AttentionArgs(0.125, deterministic=False))
    # While configs are overridden (tests, tools) no plan is made or used, whatever the key.
    calls = []
    with configs.override_configs(TileConfig(64, 32)):
        for _ in range(2):
            plans.planned(("overridden",), (q,), lambda: calls.append(1) or (torch.empty(1),))
    assert len(calls) == 2 and ("overridden",) not in plans._plans


def test_raw_launch_passes_what_triton_s_wrapper_would(monkeypatch):
    """A replay through triton's C launcher itself must hand it what triton 3.6's Python wrapper
    (driver.wrap_handle_tensordesc, CudaLauncher.__call__) would: the 13 base arguments, then the
    kernel's, each descriptor expanded to its CUtensorMap, shape and strides (with metadata) or to
    its base, shape, strides, padding flag, shape and strides (without). The C function and the map
    encoder are stand-ins here; the wrapper is triton's own."""
    import triton
    from triton.backends.nvidia import driver as nv_driver
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    from triton.experimental.gluon import language as gl

    encoded = []

    def fill_tma_descriptor(address, *rest):
        encoded.append(address)
        return ("map", address, rest[0])  # (an object standing in for a CUtensorMap)
    fake_driver = types.SimpleNamespace(utils=types.SimpleNamespace(fill_tma_descriptor=fill_tma_descriptor),
                                        get_current_device=lambda: 0, get_current_stream=lambda device: 7)
    monkeypatch.setattr(triton.runtime.driver, "_active", fake_driver)
    monkeypatch.setattr(plans, "driver", types.SimpleNamespace(active=fake_driver))
    got = []

    def c_launch(*args):  # triton's generated C function, standing in
        got.append(args)

    x = torch.randn(2, 32, 4, 64, dtype=torch.float16)
    y = torch.randn(2, 32, 4, 64, dtype=torch.float16)
    d_meta = TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 16, 1, 64])
    d_plain = TensorDescriptor(y, list(y.shape), list(y.stride()), [1, 32, 1, 64])
    d_gluon = GluonDescriptor(y, list(y.shape), list(y.stride()), [1, 16, 1, 64],
                              gl.NVMMASharedLayout(128, 16, rank=4))
    signature = {"X": "*fp16", "D0": "tensordesc<fp16[1,16,1,64]>", "n": "i32", "D1": "tensordesc<fp16[1,32,1,64]>",
                 "D2": "tensordesc<fp16[1,16,1,64]>", "s": "fp32", "BLOCK": "constexpr"}
    metas = [dict(swizzle=3, elem_size=2, elem_type=6, block_size=[64, 16, 1, 1], fp4_padded=False), None,
             dict(swizzle=2, elem_size=2, elem_type=6, block_size=[64, 16, 1, 1], fp4_padded=True)]

    class CudaLauncher:  # the fields plans.py reads, named as triton's class
        launch = staticmethod(nv_driver.wrap_handle_tensordesc(c_launch, signature, metas))
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid, launch_pdl = False, True

        def __call__(self, gx, gy, gz, stream, function, *args):  # as triton 3.6's CudaLauncher.__call__
            self.launch(gx, gy, gz, stream, function, self.launch_cooperative_grid, self.launch_pdl, None, None,
                        *args)
    run = CudaLauncher()
    args = (x, d_meta, 16, d_plain, d_gluon, 0.5)
    run(3, 2, 1, 7, 99, (4, 1, 0), None, None, None, *args, 64)  # what triton's path passes
    inputs = (x, y)
    by_id = {id(t): i for i, t in enumerate(inputs)}
    raw = plans._raw_launch(run, 99, (4, 1, 0), (64,), (3, 2, 1), args, lambda t: (0, by_id[id(t)], 0))
    assert raw is not None and raw.raw is c_launch
    raw(([x.data_ptr(), y.data_ptr()], [], []), 7)
    # The same, but each tensor (x; d_plain's base, passed as a pointer) as its address, which the
    # C launcher takes as it takes a tensor's data_ptr().
    want = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in got[0])
    assert len(got) == 2 and got[1] == want and len(want) == 13 + 1 + 9 + 1 + 18 + 9 + 1 + 1
    assert encoded == [x.data_ptr(), y.data_ptr()] * 2  # triton's call, then the replay's (maps cached after)
    raw(([x.data_ptr(), y.data_ptr()], [], []), 7)
    assert got[2] == want and len(encoded) == 4
    # Without descriptors the launcher is the C function itself; scratch memory keeps the wrapper.
    run.launch = c_launch
    assert plans._raw_launcher(run) == (c_launch, None)
    run.global_scratch_size = 64
    assert plans._raw_launcher(run) is None


# ---------------------------------------------------------------- decoding steps (decode.py)

class _StandIn:
    """A decoding kernel's JITFunction face (its real parameters) over a stand-in compiled kernel."""

    def __init__(self, real, compiled):
        self.fn, self.arg_names, self.compiled = real.fn, real.arg_names, compiled
        # (the interpreter's function keeps no parameters: decode.py declares seqlen_k_fixed alone
        # do_not_specialize)
        self.params = [types.SimpleNamespace(do_not_specialize=name == "seqlen_k_fixed") for name in real.arg_names]

    def __getitem__(self, grid):
        def first_launch(*args, num_warps, num_stages, **constexprs):
            self.compiled.calls.append(("first launch", *grid, *args))
            self.compiled.configs.append((num_warps, num_stages, constexprs))
            return self.compiled
        return first_launch


@pytest.fixture
def decode_stand_ins(gpu_like, monkeypatch):
    from genoflash.ops.attention import decode

    monkeypatch.setattr(decode, "driver", plans.driver)
    monkeypatch.setattr(decode, "_steps", {})
    compiled = {"split": _Compiled(), "combine": _Compiled()}
    for c in compiled.values():
        c.configs = []
    monkeypatch.setattr(decode, "_decode_split_kernel", _StandIn(decode._decode_split_kernel, compiled["split"]))
    monkeypatch.setattr(decode, "_combine_kernel", _StandIn(decode._combine_kernel, compiled["combine"]))
    return decode, compiled


def _named(call: tuple, pointers: int, tensors: dict) -> tuple:
    """A launcher call (9 launch arguments, then the kernel's) with its `pointers` pointer arguments
    replaced by (name, byte offset) in whichever of `tensors` holds them; an address in none of them
    is a fresh scratch buffer's (the split kernel's partials), named by its offset from the lowest."""
    spans = [(name, t.data_ptr(), t.untyped_storage().nbytes()) for name, t in tensors.items()]
    addresses = call[9:9 + pointers]
    outside = [a for a in addresses if not any(start <= a < start + size for _, start, size in spans)]
    named = []
    for a in addresses:
        hits = [(name, a - start) for name, start, size in spans if start <= a < start + size]
        named.append(hits[0] if hits else ("scratch", a - min(outside)))
    return (*call[:9], *named, *call[9 + pointers:])


def _transformers_cache(keys: int, dtype=torch.float16, headdim: int = 64):
    """q and a K/V cache as transformers' decoding step holds them: (batch, heads, seqlen, dim), viewed
    as (batch, seqlen, heads, dim)."""
    q = torch.randn(2, 8, 1, headdim, dtype=dtype).transpose(1, 2)
    k, v = (torch.randn(2, 2, keys, headdim, dtype=dtype).transpose(1, 2) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("headdim", [64, 40])
def test_a_decoding_step_launches_what_the_usual_path_launches(decode_stand_ins, monkeypatch, num_splits,
                                                               return_lse, headdim):
    """Once a kind of step has run, decode_attention calls the two kernels' launchers with the call's
    own arguments, as the usual path (launch.py's direct call) would have: same grid, stream,
    scalars and constexprs, and each tensor's address. The cache grows between calls, so the
    strides and key count differ from the recorded call's (but not in what triton specialises on:
    300, 302 and 306 keys keep the cache's strides multiples of 16 at head dims 64 and 40, and the
    mask's not)."""
    decode, compiled = decode_stand_ins
    calls = {}
    for keys in (300, 302, 306):
        q, k, v = _transformers_cache(keys, headdim=headdim)
        mask = torch.ones(2, keys, dtype=torch.bool)
        for path in ("step", "usual"):
            for c in compiled.values():
                c.calls.clear()
            if path == "usual":
                monkeypatch.setattr(decode, "_steps", {})  # nothing recorded: launch() for both kernels
            out, lse = decode.decode_attention(q, k, v, None, keys, softmax_scale=0.2, window_left=64,
                                               window_right=0, key_mask=mask, num_splits=num_splits,
                                               return_lse=return_lse)
            assert (lse is not None) == return_lse
            tensors = dict(q=q, k=k, v=v, mask=mask, out=out, **({"lse": lse} if return_lse else {}))
            calls[path] = [c.calls[0] for c in compiled.values() if c.calls]
            assert len(calls[path]) == (2 if num_splits > 1 else 1)
            if keys > 300:  # (300: the kernels' first launches, with tensors)
                assert all(call[0] != "first launch" for call in calls[path])
                # the pointer arguments: 13 of the split kernel, 4 of the combine kernel
                calls[path] = [_named(call, pointers, tensors) for call, pointers in zip(calls[path], (13, 4))]
        if keys > 300:
            assert calls["step"] == calls["usual"]
            assert len(decode._steps) == 1  # one kind of step across the growing cache
    assert launcher.fast_launches > 0


def test_steps_are_not_taken_for_unaligned_tensors_or_with_fast_launch_off(decode_stand_ins):
    decode, compiled = decode_stand_ins
    q, k, v = _transformers_cache(64)
    decode.decode_attention(q, k, v, None, 64, softmax_scale=0.2, num_splits=1)
    assert len(decode._steps) == 1
    # q one element off a 16-byte boundary: the kernel compiled for an aligned q must not see it
    q_off = torch.randn(2 * 8 * 64 + 1, dtype=torch.float16)[1:].view(2, 1, 8, 64)
    before = launcher.fast_launches
    decode.decode_attention(q_off, k, v, None, 64, softmax_scale=0.2, num_splits=1)
    assert len(decode._steps) == 1 and launcher.fast_launches == before  # triton's own (stand-in) launch
    assert compiled["split"].calls[-1][0] == "first launch"
    # fast_launch=False: every launch through triton's own launcher, no step
    decode._steps.clear()
    with genoflash.settings(fast_launch=False):
        for _ in range(2):
            decode.decode_attention(q, k, v, None, 64, softmax_scale=0.2, num_splits=1)
            assert compiled["split"].calls[-1][0] == "first launch"
    assert not decode._steps


def test_a_step_key_separates_what_triton_specialises(decode_stand_ins):
    """A key-mask stride that 16 divides and one it does not are two kinds of step; so are a window
    of 1 (a constexpr to triton) and of 2."""
    decode, _ = decode_stand_ins
    q, k, v = _transformers_cache(64)
    for mask_len, left in ((64, 2), (65, 2), (80, 2), (64, 1)):
        mask = torch.ones(2, mask_len, dtype=torch.bool)[:, :64]
        decode.decode_attention(q, k, v, None, 64, softmax_scale=0.2, window_left=left, key_mask=mask,
                                num_splits=1)
    assert len(decode._steps) == 3  # (64 and 80 share one: both strides divisible by 16)


def test_heads_first_launches_what_the_transposed_views_launch(decode_stand_ins):
    """heads_first=True reads transformers' (batch, heads, seqlen, dim) tensors as they are: the
    launches are those of the same tensors viewed (batch, seqlen, heads, dim)."""
    decode, compiled = decode_stand_ins
    q = torch.randn(2, 8, 1, 64, dtype=torch.float16)
    k, v = (torch.randn(2, 2, 300, 64, dtype=torch.float16) for _ in range(2))
    seen = []
    for heads_first in (False, True, False, True):  # the first call compiles and records, the rest replay
        args = (q, k, v) if heads_first else (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        for c in compiled.values():
            c.calls.clear()
        out, lse = decode.decode_attention(*args, None, 300, softmax_scale=0.2, num_splits=3,
                                           heads_first=heads_first)
        assert out.shape == (2, 1, 8, 64) and lse.shape == (2, 8, 1)
        if seen or heads_first:
            seen.append([_named(c.calls[0], pointers, dict(q=q, k=k, v=v, out=out, lse=lse))
                         for c, pointers in zip(compiled.values(), (13, 4))])
        else:
            seen.append(None)
    assert seen[1] == seen[2] == seen[3]
    assert len(decode._steps) == 1  # one kind: the same kernels, strides and flags
    with pytest.raises(ValueError, match="heads_first"):
        decode.decode_attention(q, k, v, None, 300, softmax_scale=0.2, heads_first=True,
                                block_table=torch.zeros(2, 1, dtype=torch.int32))


def test_use_config_reaches_the_launches_and_keeps_steps_out(decode_stand_ins):
    """`bench decode --sweep` times DecodeConfig's fields through use_config: each setting must
    reach the kernel's launch (tile, warps, stages) and the split count, and no step recorded
    under the default may answer for it (it gets its own)."""
    decode, compiled = decode_stand_ins
    q, k, v = _transformers_cache(4096)
    for _ in range(2):  # the default: a step from the second call on
        decode.decode_attention(q, k, v, None, 4096, softmax_scale=0.2)
    assert len(decode._steps) == 1
    default_splits = decode.choose_splits(2, 8, 2, 4096, q.device)
    with decode.use_config(block_n=64, num_warps=2, num_stages=3, programs_per_sm=1) as cfg:
        assert cfg.launch_config.num_warps == 2
        assert decode.choose_splits(2, 8, 2, 4096, q.device) == 1 < default_splits
        decode.decode_attention(q, k, v, None, 4096, softmax_scale=0.2)
        num_warps, num_stages, constexprs = compiled["split"].configs[-1]
        assert (num_warps, num_stages, constexprs["BLOCK_N"]) == (2, 3, 64)
        assert compiled["split"].calls[-1][1] == 1  # the grid's split axis: one part per sequence
    assert len(decode._steps) == 2 and decode._override is None
