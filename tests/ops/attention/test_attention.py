"""flash_attn_func against a float64 reference: forward, all gradients, every backend.

On the CPU the `triton` backend runs the real kernels under the Triton interpreter.
On a GPU (tools/gpu_tests.sh) the same tests run compiled, with bfloat16 added.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

import genoflash
from genoflash.ops.attention.configs import BackwardConfig, TileConfig, override_configs
from genoflash.ops.attention.reference import attention_reference

from tests.utils import assert_within_rule, outputs_and_grads, random_qkv, reference_pair
from tests.utils import HAS_CUDA

BACKENDS = ["triton", "torch"]
# bf16 tl.dot is wrong under the Triton interpreter (triton 3.6), so bf16 is tested on the GPU.
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if HAS_CUDA else [])

pytestmark = pytest.mark.usefixtures("poison_allocations")


def run_case(backend, batch, seqlen_q, seqlen_k, nheads, headdim, causal, dtype, device, softmax_scale=None):
    torch.manual_seed(hash((batch, seqlen_q, seqlen_k, nheads, headdim, causal)) % 2**31)
    q, k, v, dout = random_qkv(batch, seqlen_q, seqlen_k, nheads, headdim, dtype, device)
    with genoflash.use_backend(backend):
        got = outputs_and_grads(
            lambda a, b, c: genoflash.flash_attn_func(a, b, c, softmax_scale=softmax_scale, causal=causal),
            q, k, v, dout)
    truth, same = reference_pair(q, k, v, dout, causal, softmax_scale)
    assert_within_rule(got, truth, same)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "batch,seqlen_q,seqlen_k,nheads",
    [
        (2, 1, 1, 2),
        (2, 17, 17, 2),
        (1, 129, 129, 3),
        # 1000 keys: the GPU also runs 1000 x 1000; under the interpreter 129 queries over the 1000
        # keys cross the same 32 key tiles (the last partial) at an eighth of the cost, and
        # (1000, 129) below keeps 1000 queries.
        (1, 1000, 1000, 1) if HAS_CUDA else (1, 129, 1000, 1),
        (2, 17, 129, 2),  # seqlen_q < seqlen_k
        (2, 129, 17, 2),  # seqlen_q > seqlen_k: with causal, the first rows see no key
        (1, 1, 129, 1),
        (1, 129, 1, 1),
        (1, 1000, 129, 2 if HAS_CUDA else 1),  # one head under the interpreter: its cost is per head
    ],
)
def test_matches_reference(backend, batch, seqlen_q, seqlen_k, nheads, causal, dtype, device):
    run_case(backend, batch, seqlen_q, seqlen_k, nheads, 64, causal, dtype, device)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [8, 16, 40, 64, 80, 96, 128, 192, 256])
def test_head_dims(backend, headdim, causal, dtype, device):
    # Under the interpreter (64 x 32 tiles) 65 x 47 still ends mid-tile on both sides, as 129 x 97
    # does on the GPU's tiles; the head dim is what this test varies.
    seqlen_q, seqlen_k = (129, 97) if HAS_CUDA else (65, 47)
    run_case(backend, 2, seqlen_q, seqlen_k, 2, headdim, causal, dtype, device)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim,headdim_v", [(1, 1), (3, 13), (59, 59), (100, 36), (255, 255)])
def test_any_head_dim(backend, headdim, headdim_v, causal, dtype, device):
    """Head dims that are not multiples of 8 (flash-attn takes any up to 256): the triton backend
    runs them zero-padded; outputs and every gradient keep the real head dims."""
    torch.manual_seed(headdim + headdim_v)
    seqlen = 17 if headdim < 255 else 9
    q, k, v, dout = random_qkv(2, seqlen, seqlen + 4, 2, headdim, dtype, device)
    v = torch.randn(2, seqlen + 4, 2, headdim_v, dtype=dtype, device=device, requires_grad=True)
    dout = torch.randn(2, seqlen, 2, headdim_v, dtype=dtype, device=device)
    with genoflash.use_backend(backend):
        got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, causal=causal), q, k, v, dout)
    truth, same = reference_pair(q, k, v, dout, causal)
    # One channel in bfloat16: the backward's delta = rowsum(dO * O) reads the output rounded to
    # bfloat16, whose 2^-8 relative error reaches dS whole, with no second channel to average it
    # (standard attention's backward sums P * dP unrounded). FlashAttention's backward shares this;
    # measured on an H100 (2026-12-05): dq 3.5 x standard attention's error, on both backends.
    factor = 4.0 if dtype == torch.bfloat16 and headdim == 1 else 2.0
    assert_within_rule(got, truth, same, factor=factor)


def test_kernels_see_head_dims_in_multiples_of_8(monkeypatch, device):
    """The tile shapes and TMA rows the kernels were built and measured for: an odd head dim reaches
    them padded, never as it is."""
    from genoflash.ops.attention import backward, forward
    seen = []
    for module, name in ((forward, "attention_forward"), (backward, "attention_backward")):
        original = getattr(module, name)

        def spy(*tensors_and_args, _original=original):
            seen.extend(t.shape[-1] for t in tensors_and_args if isinstance(t, torch.Tensor) and t.dim() == 4)
            return _original(*tensors_and_args)
        monkeypatch.setattr(module, name, spy)
    q, k, v, dout = random_qkv(1, 9, 9, 1, 59, torch.float32, device)
    with genoflash.use_backend("triton"):
        torch.autograd.grad(genoflash.flash_attn_func(q, k, v), (q, k, v), dout)
    assert seen and all(d % 8 == 0 for d in seen), seen


@pytest.mark.parametrize(
    "fwd,bwd",
    [
        (TileConfig(16, 16), BackwardConfig(TileConfig(16, 16), TileConfig(16, 16))),
        (TileConfig(16, 64), BackwardConfig(TileConfig(64, 16), TileConfig(16, 64))),
        (TileConfig(64, 16), BackwardConfig(TileConfig(16, 64), TileConfig(64, 16))),
    ],
    ids=["16x16", "16x64", "64x16"],
)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(100, 37), (37, 100), (130, 130)])
def test_uneven_tilings(fwd, bwd, seqlen_q, seqlen_k, device):
    """Causal bounds with BLOCK_M != BLOCK_N and lengths that fall mid-tile on both sides."""
    with override_configs(fwd, bwd):
        run_case("triton", 1, seqlen_q, seqlen_k, 2, 32, True, torch.float32, device)


@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_scale(backend, device):
    run_case(backend, 1, 65, 80, 2, 32, True, torch.float32, device, softmax_scale=0.37)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lse_and_rows_that_see_no_key(backend, device):
    """Causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k rows see nothing.
    They must give output 0, lse -inf and zero gradients, never NaN."""
    torch.manual_seed(1)
    q, k, v, dout = random_qkv(2, 50, 20, 2, 32, torch.float32, device)
    with genoflash.use_backend(backend):
        out, lse = genoflash.flash_attn_func(q, k, v, causal=True, return_lse=True)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    ref_out, ref_lse = attention_reference(q.double(), k.double(), v.double(), causal=True)
    assert lse.dtype == torch.float32 and lse.shape == (2, 2, 50)
    empty = slice(0, 30)
    assert torch.isneginf(lse[:, :, empty]).all()
    assert (out[:, empty] == 0).all() and (dq[:, empty] == 0).all()
    assert torch.isfinite(lse[:, :, 30:]).all()
    torch.testing.assert_close(lse[:, :, 30:].double(), ref_lse[:, :, 30:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))


def test_deterministic_backward(device):
    torch.manual_seed(2)
    # several programs add into each dQ tile either way: 300 x 257 on the GPU, 150 x 129 (of
    # 64 x 32 tiles) under the interpreter
    seqlen_q, seqlen_k = (300, 257) if HAS_CUDA else (150, 129)
    q, k, v, dout = random_qkv(2, seqlen_q, seqlen_k, 2, 64, torch.float16, device)
    with genoflash.use_backend("triton"):
        first = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, causal=True, deterministic=True),
                                  q, k, v, dout)
        second = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, causal=True, deterministic=True),
                                   q, k, v, dout)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_noncontiguous_inputs(backend, device):
    """Transposed views (from a (batch, nheads, seqlen, headdim) buffer) and strided channels."""
    torch.manual_seed(3)
    batch, n, h, d = 2, 77, 3, 40
    q = torch.randn(batch, h, n, d, device=device).transpose(1, 2).requires_grad_()
    k = torch.randn(batch, n, h, 2 * d, device=device)[..., ::2].detach().requires_grad_()
    v = torch.randn(batch, n + 5, h, d, device=device)[:, 5:].detach().requires_grad_()
    dout = torch.randn(batch, h, n, d, device=device).transpose(1, 2)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous() or dout.is_contiguous())
    with genoflash.use_backend(backend):
        got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, causal=True), q, k, v, dout)
    truth, same = reference_pair(q, k, v, dout, True)
    assert_within_rule(got, truth, same)


@pytest.mark.parametrize("tma", [True, False], ids=["tma", "pointers"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k,headdim,nheads_k", [(1, 1, 64, 2), (17, 129, 40, 2), (129, 17, 96, 1),
                                                                # several tiles, ending 1 past a key tile
                                                                (300, 257, 72, 2) if HAS_CUDA else (150, 129, 72, 2),
                                                                # 2 past a tile (misaligned q: pointers)
                                                                (130, 130, 24, 2) if HAS_CUDA else (66, 66, 24, 2)])
def test_tma_descriptor_and_pointer_loads(tma, causal, seqlen_q, seqlen_k, headdim, nheads_k, monkeypatch, device):
    """The kernels' two load paths (descriptors.py): TMA descriptors, whose boxes run past the
    sequence end and the head dim, and pointer loads with masks. In the head-dim-24 case q starts
    2 bytes past a 16-byte boundary, which the copy engine cannot take, so it must fall back to
    pointer loads even where TMA is allowed."""
    from genoflash.ops.attention import backward, forward

    seen = []
    real_launch = forward.launch
    def spy(kernel, *args, **kw):
        seen.append(kw["TMA"])
        return real_launch(kernel, *args, **kw)

    for module in (forward, backward):  # forward, dK/dV and dQ launches
        monkeypatch.setattr(module, "launch", spy)
    torch.manual_seed(seqlen_q + seqlen_k + headdim)
    q, k, v, dout = random_qkv(2, seqlen_q, seqlen_k, 2, headdim, torch.float16, device)
    k, v = (t.detach()[:, :, :nheads_k].clone().requires_grad_() for t in (k, v))  # GQA when nheads_k < 2
    misaligned = headdim == 24
    if misaligned:
        q = torch.randn(q.numel() + 1, dtype=q.dtype, device=device)[1:].view(q.shape).requires_grad_()
    # Q by TMA in the dK/dV pass too (the tile config's choice; off at hd128 on the GPU).
    bwd = BackwardConfig(TileConfig(32, 64), TileConfig(64, 32), dkdv_q_by_tma=True)
    # fast_launch off: a launch plan would replay the launches without the spy seeing them; the
    # triton forward (the Gluon forward loads by TMA alone: test_sm90_forward.py)
    with genoflash.settings(backend="triton", tma=tma, fast_launch=False), \
            override_configs(backward=bwd, sm90_forward=False):
        # deterministic: the triton passes (the Gluon backward, all TMA, is tested in test_sm90.py)
        got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, causal=causal, deterministic=True),
                                q, k, v, dout)
    hopper = device.type != "cuda" or torch.cuda.get_device_capability()[0] >= 9
    assert seen == [tma and hopper and not misaligned] * 3

    def standard(a, b, c):
        group = a.shape[2] // b.shape[2]
        return attention_reference(a, b.repeat_interleave(group, 2), c.repeat_interleave(group, 2), causal=causal)[0]

    truth, same = reference_pair(q, k, v, dout, fn=standard)
    assert_within_rule(got, truth, same)


def test_launch_falls_back_to_pointer_loads_when_ptxas_fails():
    """ptxas (triton 3.6, sm_90) crashed on some TMA kernel variants; the launcher must then run
    the pointer-load variant, remember that, and re-raise only a failure that has no fallback."""
    from triton.runtime.errors import PTXASError

    from genoflash.ops.attention import launch as launcher

    calls = []

    class FakeKernel:
        fn = types.SimpleNamespace(__name__="_fake_tma_kernel")

        def __getitem__(self, grid):
            def run(*args, num_warps, num_stages, **constexprs):
                calls.append(constexprs["TMA"])
                if constexprs["TMA"] or constexprs.get("BROKEN"):
                    raise PTXASError("ptxas died with SIGSEGV")
            return run

    cfg = TileConfig(64, 64, 4, 2)
    launcher.launch(FakeKernel(), (1,), cfg, TMA=True)
    launcher.launch(FakeKernel(), (1,), cfg, TMA=True)  # remembered: no second failed compile
    assert calls == [True, False, False]
    assert launcher.tma_fallbacks[-1] == "_fake_tma_kernel"
    with pytest.raises(PTXASError):
        launcher.launch(FakeKernel(), (1,), cfg, TMA=False, BROKEN=True)


def test_reference_backend_is_standard_attention(device):
    torch.manual_seed(4)
    q, k, v, _ = random_qkv(1, 33, 40, 2, 16, torch.float32, device)
    with genoflash.use_backend("reference"):
        out, lse = genoflash.flash_attn_func(q, k, v, causal=True, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal=True)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_rule_catches_wrong_answers(device):
    """The checker must fail on a wrong mask, a lost value row and an unwritten (NaN) element."""
    torch.manual_seed(5)
    q, k, v, dout = random_qkv(1, 40, 40, 2, 32, torch.float32, device)
    truth, same = reference_pair(q, k, v, dout, causal=True)
    wrong_mask = outputs_and_grads(lambda a, b, c: attention_reference(a, b, c, causal=False)[0], q, k, v, dout)
    with pytest.raises(AssertionError):
        assert_within_rule(wrong_mask, truth, same)
    keep = (torch.arange(40, device=device) != 3)[None, :, None, None]  # one value row lost
    lost_value = outputs_and_grads(lambda a, b, c: attention_reference(a, b, c * keep, causal=True)[0],
                                   q, k, v, dout)
    with pytest.raises(AssertionError):
        assert_within_rule(lost_value, truth, same)
    unwritten = tuple(t.clone() for t in same)
    unwritten[0][0, 7, 1, 3] = math.nan
    with pytest.raises(AssertionError):
        assert_within_rule(unwritten, truth, same)


def test_default_backend_follows_device():
    from genoflash.backends import select_backend

    assert select_backend(torch.device("cpu")) == "torch"
    assert select_backend(torch.device("cuda")) == "triton"
    with genoflash.settings(backend="reference"):
        assert select_backend(torch.device("cpu")) == "reference"
        assert select_backend(torch.device("cuda")) == "reference"
    with genoflash.use_backend("triton"):
        with genoflash.use_backend("torch"):
            assert select_backend(torch.device("cpu")) == "torch"
        assert select_backend(torch.device("cpu")) == "triton"
    assert select_backend(torch.device("cpu")) == "torch"  # restored on leaving the blocks
    with pytest.raises(ValueError, match="unknown backend 'cudnn'"):
        with genoflash.settings(backend="cudnn"):
            pass


def test_settings_nest_and_reject_unknown_names():
    from genoflash.settings import current

    assert current() == genoflash.Settings()
    with genoflash.settings(tma=False) as outer:
        assert outer.tma is False and outer.fast_launch is True
        with genoflash.settings(fast_launch=False) as inner:
            assert (inner.tma, inner.fast_launch) == (False, False)
        assert current() == outer
    assert current() == genoflash.Settings()
    with pytest.raises(TypeError, match="unknown setting"):
        with genoflash.settings(tmaa=False):
            pass
    with pytest.raises(TypeError, match=r"settings\(tma=...\) must be a bool"):
        with genoflash.settings(tma="no"):
            pass


def test_a_call_keeps_the_settings_it_was_made_with():
    """The backward reads the settings of its forward (autograd may run it on another thread, where
    the caller's settings block is not in force)."""
    from genoflash.ops.attention import interface

    q = torch.randn(1, 5, 1, 8, requires_grad=True)
    seen = []
    real = interface.backward_pass
    def spy(dout, q, k, v, out, lse, a, backend):
        seen.append(a.settings)
        return real(dout, q, k, v, out, lse, a, backend)
    interface.backward_pass = spy
    try:
        with genoflash.settings(tma=False, fast_launch=False):
            out = genoflash.flash_attn_func(q, q, q)
        out.sum().backward()  # outside the block
    finally:
        interface.backward_pass = real
    assert seen == [genoflash.Settings(tma=False, fast_launch=False)]


def test_launch_steps_down_pipeline_stages_when_shared_memory_runs_out():
    """A tiling that does not fit on chip is retried with fewer stages, and the fit is remembered."""
    from triton.runtime.errors import OutOfResources

    from genoflash.ops.attention.configs import TileConfig
    from genoflash.ops.attention.launch import launch

    stages_tried = []

    class KernelThatFitsOneStage:
        class fn:
            __name__ = "fits_one_stage"

        def __getitem__(self, grid):
            def run(*args, num_warps, num_stages, **constexprs):
                stages_tried.append(num_stages)
                if num_stages > 1:
                    raise OutOfResources(300_000, 232_448, "shared memory")
            return run

    launch(KernelThatFitsOneStage(), (1,), TileConfig(64, 64, 4, 3), BLOCK=64)
    assert stages_tried == [3, 2, 1]
    launch(KernelThatFitsOneStage(), (1,), TileConfig(64, 64, 4, 3), BLOCK=64)
    assert stages_tried == [3, 2, 1, 1]

    class NeverFits:
        class fn:
            __name__ = "never_fits"

        def __getitem__(self, grid):
            def run(*args, num_warps, num_stages, **constexprs):
                raise OutOfResources(300_000, 232_448, "shared memory")
            return run

    with pytest.raises(OutOfResources):  # even one stage does not fit: the error reaches the caller
        launch(NeverFits(), (1,), TileConfig(64, 64, 4, 2))
