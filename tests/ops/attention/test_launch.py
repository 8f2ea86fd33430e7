"""launch.py's fast path: a launch whose specialisation was seen before calls the cached compiled
kernel directly, skipping triton's argument binding. Its key must change with everything triton
specialises on (else a kernel compiled for other arguments would run), and the direct call must
pass what triton's own launch would. On the CPU with fakes (the interpreter has no compiled
kernels); on a GPU, against the usual path, bit for bit."""

from __future__ import annotations

import types

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

import genoflash
from genoflash.ops.attention import launch as launcher
from genoflash.ops.attention.configs import TileConfig

from tests.utils import HAS_CUDA


def _kernel(names, unspecialised=()):
    """A stand-in for a JITFunction: parameter names, do_not_specialize flags, and a compile
    that records its calls and returns a stand-in compiled kernel."""
    class FakeCompiled:
        def __init__(self, options):
            self.options, self.launches = options, []

        def __getitem__(self, grid):
            return lambda *args: self.launches.append((grid, args))

    class FakeKernel:
        fn = types.SimpleNamespace(__name__="_fake_kernel")
        arg_names = names
        params = [types.SimpleNamespace(do_not_specialize=name in unspecialised) for name in names]

        def __init__(self):
            self.compiles = []

        def __getitem__(self, grid):
            def run(*args, num_warps, num_stages, **constexprs):
                self.compiles.append((grid, args, num_stages, dict(constexprs)))
                if constexprs.get("TMA") and self.tma_breaks:
                    from triton.runtime.errors import PTXASError
                    raise PTXASError("ptxas died")
                return FakeCompiled((num_warps, num_stages, dict(constexprs)))
            return run

        tma_breaks = False

    return FakeKernel()


@pytest.fixture
def fast(monkeypatch):
    """The fast path switched on as on a GPU, with a stand-in current device."""
    monkeypatch.setattr(launcher, "_INTERPRETED", False)
    monkeypatch.setattr(launcher, "driver", types.SimpleNamespace(
        active=types.SimpleNamespace(get_current_device=lambda: 0)))
    launcher._compiled.clear()


def test_specialisation_key_follows_what_triton_specialises_on():
    kernel = _kernel(["X", "n", "seed", "scale", "flag", "D"], unspecialised=("seed",))
    x = torch.randn(64)
    key = lambda *args: launcher.specialisation_key(kernel, args)  # noqa: E731
    base = key(x, 16, 5, 0.5, None, None)
    assert key(torch.randn(64), 16, 7, 0.5, None, None) == base  # other data, other seed: same kernel
    assert key(x[1:], 16, 5, 0.5, None, None) != base  # a data pointer off 16-byte alignment
    assert key(x.half(), 16, 5, 0.5, None, None) != base  # another dtype
    assert key(x, 17, 5, 0.5, None, None) != base  # divisibility by 16
    assert key(x, 48, 5, 0.5, None, None) == base  # another multiple of 16: the same kernel
    assert key(x, 2**40, 5, 0.5, None, None) != base  # a 64-bit int
    assert key(x, 1, 5, 0.5, None, None) != key(x, True, 5, 0.5, None, None)  # 1 is a constexpr, True a u1
    assert key(x, 16, 2**40, 0.5, None, None) != base  # an unspecialised int past 32 bits
    assert key(torch.nn.Parameter(x), 16, 5, 0.5, None, None) == base  # a tensor subclass as a tensor
    assert key(x, 16, 5, 0.5, object(), None) is None  # an unknown kind: triton binds as usual
    t = torch.randn(2, 32, 4, 64, dtype=torch.float16)
    desc = TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 16, 1, 64])
    other = torch.randn(3, 48, 4, 64, dtype=torch.float16)
    same_box = TensorDescriptor(other, list(other.shape), list(other.stride()), [1, 16, 1, 64])
    wider = TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 32, 1, 64])
    assert key(x, 16, 5, 0.5, None, desc) == key(x, 16, 5, 0.5, None, same_box)  # shape, strides: runtime
    assert key(x, 16, 5, 0.5, None, desc) != key(x, 16, 5, 0.5, None, wider)
    # The key holds no tensor (the cache must not keep activations alive).
    assert not any(isinstance(part, torch.Tensor) for part in key(x, 16, 5, 0.5, None, desc))


def test_int_keys_equal_triton_s_own_specialisation():
    """Two ints share a key exactly where triton's native_specialize_impl gives them the same
    specialisation (type and divisibility, or the constexpr 1)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    values = [0, 1, 2, 15, 16, 17, 32, 48, -1, -16, 2**31 - 16, 2**31, 2**31 + 1, 2**40, 2**63, 2**63 + 16]
    triton_key = {v: native_specialize_impl(BaseBackend, v, False, True, True) for v in values}
    for a in values:
        for b in values:
            assert (launcher._int_key(a) == launcher._int_key(b)) == (triton_key[a] == triton_key[b]), (a, b)


@pytest.mark.parametrize("unchecked", [True, False])
def test_descriptors_equal_triton_s_checked_constructor(unchecked, monkeypatch):
    """descriptors.py builds TensorDescriptors without triton's per-object checks (host time at
    short sequences) where triton's TensorDescriptor has the fields it knows; what it builds must
    be what the checked constructor would, field for field, either way."""
    import dataclasses

    from genoflash.ops.attention import descriptors
    from genoflash.ops.attention.descriptors import table_descriptor, tile_descriptor

    import triton

    if triton.__version__.startswith("3.6."):  # the version the project pins: the fast form is in use
        assert descriptors._UNCHECKED_DESCRIPTORS
    monkeypatch.setattr(descriptors, "_UNCHECKED_DESCRIPTORS", unchecked)
    t = torch.randn(2, 33, 6, 64, dtype=torch.float16)[:, :, 1:5]  # a head slice: strides of the parent
    table = torch.randn(40, 16)
    for got, ref in ((tile_descriptor(t, 16, 32), TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 16, 1, 32])),
                     (table_descriptor(table, 64, 16), TensorDescriptor(table, [40, 16], [16, 1], [64, 16]))):
        assert type(got) is TensorDescriptor
        for field in dataclasses.fields(TensorDescriptor):
            a, b = getattr(got, field.name), getattr(ref, field.name)
            assert (a is b) if field.name == "base" else (a == b and type(a) is type(b)), field.name


def test_launch_calls_the_cached_kernel_with_triton_s_arguments(fast):
    kernel = _kernel(["X", "n", "BLOCK", "TMA"])
    cfg = TileConfig(64, 32, 4, 3)
    x = torch.randn(64)
    launcher.launch(kernel, (7,), cfg, x, 16, BLOCK=64, TMA=False)
    assert len(kernel.compiles) == 1
    before = launcher.fast_launches
    launcher.launch(kernel, (7,), cfg, x, 16, BLOCK=64, TMA=False)
    launcher.launch(kernel, (9, 2), cfg, torch.randn(64), 16, BLOCK=64, TMA=False)
    assert len(kernel.compiles) == 1 and launcher.fast_launches == before + 2
    compiled = next(iter(launcher._compiled.values()))[0]
    # All three grid axes; the runtime arguments, then the constexprs in parameter order.
    assert [(grid, args[1:]) for grid, args in compiled.launches] == [((7, 1, 1), (16, 64, False)),
                                                                       ((9, 2, 1), (16, 64, False))]
    # Anything triton would specialise differently compiles (here: goes through kernel[grid]) again.
    launcher.launch(kernel, (7,), cfg, x[1:], 16, BLOCK=64, TMA=False)
    launcher.launch(kernel, (7,), cfg, x, 17, BLOCK=64, TMA=False)
    launcher.launch(kernel, (7,), cfg, x, 16, BLOCK=128, TMA=False)
    launcher.launch(kernel, (7,), TileConfig(64, 32, 8, 3), x, 16, BLOCK=64, TMA=False)
    assert len(kernel.compiles) == 5
    launcher.launch(kernel, (7,), cfg, x, 32, BLOCK=64, TMA=False)  # 32 specialises as 16 does: no compile
    assert len(kernel.compiles) == 5


def test_direct_launch_passes_tensors_as_addresses(fast, monkeypatch):
    """A compiled kernel with triton's launcher fields is called through its launcher as the
    runner would call it, each tensor given as its address (so triton's C launcher neither calls
    data_ptr() nor asks the driver about it), descriptors and scalars as they are; with a launch
    -enter hook set (a profiler reading the tensors), through the runner with the tensors."""
    from triton import knobs

    class Compiled:
        function, packed_metadata = 1234, (8, 1, 4096)

        def __init__(self):
            self.direct, self.runner = [], []

        def run(self, *args):
            self.direct.append(args)

        def __getitem__(self, grid):
            return lambda *args: self.runner.append((grid, args))

    compiled = Compiled()

    class Kernel:
        fn = types.SimpleNamespace(__name__="_direct_kernel")
        arg_names = ["X", "D", "n", "BLOCK"]
        params = [types.SimpleNamespace(do_not_specialize=False) for _ in arg_names]

        def __getitem__(self, grid):
            return lambda *args, num_warps, num_stages, **constexprs: compiled

    monkeypatch.setattr(launcher, "driver", types.SimpleNamespace(active=types.SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda device: 77)))
    kernel, cfg = Kernel(), TileConfig(64, 32, 4, 3)
    x = torch.randn(64)
    t = torch.randn(2, 32, 4, 64, dtype=torch.float16)
    desc = TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 16, 1, 64])
    launcher.launch(kernel, (5, 2), cfg, x, desc, 16, BLOCK=64)  # compiles
    launcher.launch(kernel, (5, 2), cfg, x, desc, 16, BLOCK=64)
    assert compiled.direct == [(5, 2, 1, 77, 1234, (8, 1, 4096), None, None, None, x.data_ptr(), desc, 16, 64)]
    assert type(compiled.direct[0][9]) is int
    # triton's default hooks are empty chains: nothing to call, so the direct path stands.
    assert not launcher.hooked(knobs.runtime.launch_enter_hook) and not launcher.hooked(None)
    chain = type(knobs.runtime.launch_enter_hook)()
    chain.add(lambda metadata: None)
    for hook in ("launch_enter_hook", "launch_exit_hook"):
        with monkeypatch.context() as m:
            m.setattr(knobs.runtime, hook, chain)
            launcher.launch(kernel, (5, 2), cfg, x, desc, 16, BLOCK=64)
    m = monkeypatch
    m.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)  # a plain function is a hook too
    launcher.launch(kernel, (5, 2), cfg, x, desc, 16, BLOCK=64)
    assert len(compiled.direct) == 1 and compiled.runner == [((5, 2, 1), (x, desc, 16, 64))] * 3


def test_fast_path_keeps_the_variant_that_built(fast):
    """After a TMA variant failed to build, the cached kernel is the pointer-load one and the
    direct call passes TMA=False, as the usual path would."""
    kernel = _kernel(["X", "TMA"])
    kernel.tma_breaks = True
    cfg = TileConfig(64, 32, 4, 3)
    x = torch.randn(64)
    launcher.launch(kernel, (1,), cfg, x, TMA=True)
    assert [c[3]["TMA"] for c in kernel.compiles] == [True, False]
    launcher.launch(kernel, (1,), cfg, x, TMA=True)
    assert len(kernel.compiles) == 2
    compiled = next(iter(launcher._compiled.values()))[0]
    assert compiled.options[2]["TMA"] is False and compiled.launches[-1][1][1] is False


def test_kernels_without_triton_s_parameters_take_the_usual_path(fast):
    """Stand-ins without .params (the fallback tests' fake kernels) must launch as before: on
    the H200 they reached the fast path's key and raised AttributeError (da5e9e9)."""
    calls = []

    class Bare:
        fn = types.SimpleNamespace(__name__="_bare_kernel")

        def __getitem__(self, grid):
            return lambda *args, num_warps, num_stages, **constexprs: calls.append(args)

    for _ in range(2):
        launcher.launch(Bare(), (1,), TileConfig(64, 32, 4, 3), torch.randn(4), 3, TMA=False)
    assert len(calls) == 2 and not launcher._compiled


def test_fast_path_is_off_under_the_interpreter_and_when_asked(monkeypatch):
    monkeypatch.setattr(launcher, "_INTERPRETED", True)
    assert not launcher.fast_launch_allowed()
    monkeypatch.setattr(launcher, "_INTERPRETED", False)
    assert launcher.fast_launch_allowed()
    seen = launcher.without_fast_launch(lambda: [launcher.fast_launch_allowed()])
    assert seen == [False] and launcher.fast_launch_allowed()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("features", [dict(), dict(causal=True), dict(window_size=(40, 7), softcap=5.0),
                                      dict(dropout_p=0.1, dropout_seed=3)], ids=["full", "causal", "window",
                                                                                   "dropout"])
def test_fast_path_equals_the_usual_launch_on_gpu(features, monkeypatch):
    """Fwd+bwd with the fast path and launch plans (second and later calls of a kind are replayed
    from their plan, plans.py) against the same calls through triton's binder, bit for bit; with
    inputs that specialise differently (a q whose data pointer is off 16-byte alignment, other
    lengths) between repeats. Dropout makes no plan (its seed is per call): the fast path alone."""
    from genoflash.ops.attention import plans
    torch.manual_seed(0)

    def inputs(n, misaligned=False):
        q = torch.randn(2, n, 4, 64, device="cuda", dtype=torch.bfloat16)
        if misaligned:
            q = torch.randn(q.numel() + 1, device="cuda", dtype=torch.bfloat16)[1:].view(q.shape)
        k, v = (torch.randn(2, n, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        dout = torch.randn(2, n, 4, 64, device="cuda", dtype=torch.bfloat16)
        return [t.requires_grad_() for t in (q, k, v)], dout

    def run(qkv, dout):  # deterministic: bit-for-bit gradients (the Gluon backward sums dQ in no fixed order)
        out = genoflash.flash_attn_func(*qkv, deterministic=True, **features)
        return (out, *torch.autograd.grad(out, qkv, dout))

    cases = [inputs(256), inputs(256), inputs(257), inputs(256, misaligned=True), inputs(256), inputs(257),
             inputs(256, misaligned=True)]
    with genoflash.settings(fast_launch=False):
        usual = [run(*case) for case in cases]
    monkeypatch.setattr(plans, "_plans", {})
    before, replays = launcher.fast_launches, plans.replays
    fast = [run(*case) for case in cases]
    if "dropout_p" in features:
        assert plans.replays == replays and launcher.fast_launches > before
    else:  # forward and backward of cases 1, 4, 5 and 6 come from plans
        assert plans.replays == replays + 8
    for i, (a, b) in enumerate(zip(usual, fast)):
        for name, x, y in zip(("out", "dq", "dk", "dv"), a, b):
            assert torch.equal(x, y), f"case {i}: {name}"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA or torch.cuda.get_device_capability() != (9, 0), reason="needs an sm_90 GPU")
def test_plans_replay_the_gluon_backward_and_refuse_the_group_split_on_gpu(monkeypatch):
    """The Gluon one-pass backward (three launches, float32 buffers of its own) replayed from its
    plan equals the same call without plans: out, dk and dv bit for bit, dq (summed in float32 in no
    fixed order) to float32 rounding. A GQA backward whose dK/dV pass splits the group (torch ops of
    its own: a sum and copies) gets no plan, and its gradients are those of the usual path."""
    from genoflash.ops.attention import backward_sm90, plans
    torch.manual_seed(1)
    monkeypatch.setattr(plans, "_plans", {})

    def run(q, k, v, dout, **kw):
        out = genoflash.flash_attn_func(q, k, v, **kw)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    def qkv(n, h, hk):
        q = torch.randn(1, n, h, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(1, n, hk, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        return q, k, v, torch.randn_like(q)

    calls, real = [], backward_sm90.attention_backward_sm90
    case = qkv(2048, 4, 4)
    with genoflash.settings(fast_launch=False):
        want = run(*case, causal=False)
    replays = plans.replays
    got = [run(*case, causal=False) for _ in range(3)]  # recorded, then replayed twice
    assert plans.replays == replays + 4
    with monkeypatch.context() as m, genoflash.settings(fast_launch=False):  # (a replay would skip the spy)
        m.setattr(backward_sm90, "attention_backward_sm90", lambda *a: calls.append(1) or real(*a))
        run(*case, causal=False)
    assert calls, "the Gluon backward does not apply to this case"
    for g in got:
        for name, x, y in zip(("out", "dq", "dk", "dv"), want, g):
            if name == "dq":
                torch.testing.assert_close(x.float(), y.float(), rtol=0, atol=2e-2 * y.abs().max().item())
            else:
                assert torch.equal(x, y), name
    # MQA at 4,096 tokens: 32 dK/dV programs for 132 SMs, so its heads split over programs.
    case = qkv(4096, 16, 1)
    with genoflash.settings(fast_launch=False):
        want = run(*case, causal=True, deterministic=True)
    keys = set(plans._plans)
    for _ in range(2):
        got = run(*case, causal=True, deterministic=True)
    new = [key for key in plans._plans if key not in keys]
    assert [key[0] for key in new] == ["fwd", "bwd"] and plans._plans[new[1]] is None
    for name, x, y in zip(("out", "dq", "dk", "dv"), want, got):
        assert torch.equal(x, y), name


def test_host_integer_helpers_equal_triton_s():
    """ops/common/host.py's cdiv and next_power_of_2 (plain Python, for launch code) give triton's values."""
    import triton

    from genoflash.ops.common.host import cdiv, next_power_of_2

    for a in range(0, 3000, 7):
        assert next_power_of_2(a) == triton.next_power_of_2(a), a
        for b in (1, 16, 64, 100, 128):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
    assert next_power_of_2(2**40 + 1) == 2**41
