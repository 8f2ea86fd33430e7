"""The Gluon one-pass backward for Hopper (ops/attention/backward_sm90.py).

deterministic=False (the default) takes it on an sm_90 GPU for 16-bit attention with head dim 64, 128 or 256,
fixed lengths, full or causal, no other feature. On the GPU each case is checked against a
float64 reference under the error rule, with every allocation NaN-poisoned and the dispatch
watched, so that a silent fall back to the triton backward fails the test. Where it must not be
taken (deterministic=True, every other feature, misaligned tensors), the test checks that it is
not. On the CPU (CI) the dispatch rule itself is checked; test_sm90_compile.py compiles the
kernel for sm_90.
"""

from __future__ import annotations

import pytest
import torch

import genoflash
from genoflash.ops.attention import backward_sm90
from genoflash.ops.attention.args import AttentionArgs
from genoflash.ops.attention.configs import override_configs
from genoflash.ops.attention.dropout import DropoutArgs
from genoflash.ops.rotary import rotary_tables

from tests.utils import assert_within_rule, outputs_and_grads, random_gqa_qkv, reference_pair
from tests.utils import HAS_CUDA

ON_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
sm90 = pytest.mark.skipif(not ON_SM90, reason="needs an sm_90 GPU (H100 / H200)")


@pytest.fixture
def sm90_calls(monkeypatch):
    """How many backward passes went through the Gluon kernel. It is taken at every length here
    (MIN_SEQLEN keeps it from short sequences in use; the kernel itself works at any length), and
    launch plans stand aside while configs are overridden, so every call reaches the spy."""
    calls = []
    real = backward_sm90.attention_backward_sm90

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(backward_sm90, "attention_backward_sm90", spy)
    with override_configs(sm90_min_seqlen=0):
        yield calls


def _check(q, k, v, dout, calls, **features):
    got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, **features), q, k, v, dout)
    assert len(calls) == 1, "the Gluon backward was not taken"
    truth, same = reference_pair(q, k, v, dout, causal=features.get("causal", False))
    assert_within_rule(got, truth, same)


@sm90
@pytest.mark.gpu
@pytest.mark.usefixtures("poison_allocations")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k", [
    (2, 1, 1), (2, 17, 17), (1, 129, 129), (2, 1000, 1000), (1, 300, 1200), (1, 1200, 300), (3, 257, 513),
    (1, 2048, 2048),
])
@pytest.mark.parametrize("d", [128, 64, 256])
def test_gluon_backward_within_the_rule(batch, seqlen_q, seqlen_k, causal, dtype, d, sm90_calls):
    torch.manual_seed(seqlen_q * 31 + seqlen_k + d)
    q, k, v, dout = random_gqa_qkv(batch, seqlen_q, seqlen_k, 2, 2, d, dtype)
    _check(q, k, v, dout, sm90_calls, causal=causal)


@sm90
@pytest.mark.gpu
@pytest.mark.usefixtures("poison_allocations")
@pytest.mark.parametrize("nheads_k", [2, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize("d", [128, 64, 256])
def test_gluon_backward_gqa(nheads_k, d, sm90_calls):
    """Each program streams the query tiles of every query head in its K/V head's group."""
    torch.manual_seed(40 + nheads_k)
    q, k, v, dout = random_gqa_qkv(2, 777, 1000, 4, nheads_k, d, torch.bfloat16)
    _check(q, k, v, dout, sm90_calls, causal=True)


@sm90
@pytest.mark.gpu
@pytest.mark.usefixtures("poison_allocations")
@pytest.mark.parametrize("d", [128, 256])
def test_gluon_backward_strided_inputs(d, sm90_calls):
    """Views of (batch, nheads, seqlen, headdim) buffers: the descriptors take any 16-byte aligned strides."""
    torch.manual_seed(41)
    q, k, v, dout = (torch.randn(2, 4, 333, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                     for _ in range(4))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    assert not q.is_contiguous()
    _check(q, k, v, dout, sm90_calls, causal=True)


@sm90
@pytest.mark.gpu
def test_gluon_backward_is_not_taken_where_it_does_not_apply(sm90_calls):
    """deterministic=True, every other feature, head dim 96, fp32 and misaligned tensors run
    the triton backward; so does the tma setting off (TMA is all the kernel loads with)."""
    torch.manual_seed(42)
    q, k, v, dout = random_gqa_qkv(1, 200, 200, 2, 2, 128, torch.bfloat16)
    cos, sin = rotary_tables(200, 128, device="cuda")
    others = [dict(deterministic=True), dict(dropout_p=0.1), dict(window_size=(30, 30)), dict(softcap=5.0),
              dict(alibi_slopes=torch.rand(2, device="cuda")), dict(rotary_cos=cos, rotary_sin=sin)]
    for features in others:
        outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, **features), q, k, v, dout)
    for qkv in (random_gqa_qkv(1, 200, 200, 2, 2, 96, torch.bfloat16)[:3],
                random_gqa_qkv(1, 200, 200, 2, 2, 128, torch.float32)[:3]):
        outputs_and_grads(genoflash.flash_attn_func, *qkv, torch.randn_like(qkv[0]))
    # A q whose base is off 16-byte alignment cannot be a TMA descriptor.
    q_mis = torch.randn(q.numel() + 1, device="cuda", dtype=q.dtype)[1:].view(q.shape).requires_grad_()
    outputs_and_grads(genoflash.flash_attn_func, q_mis, k, v, dout)
    with genoflash.settings(tma=False):
        outputs_and_grads(genoflash.flash_attn_func, q, k, v, dout)
    assert sm90_calls == []
    outputs_and_grads(genoflash.flash_attn_func, q, k, v, dout)
    assert len(sm90_calls) == 1


def test_dispatch_rule():
    """What the kernel supports, checked on the host with CPU tensors (any device works here)."""
    def tensors(d=128, dv=None, dtype=torch.bfloat16, n=100):
        q, k = (torch.randn(2, n, 4, d, dtype=dtype) for _ in range(2))
        v = torch.randn(2, n, 4, dv or d, dtype=dtype)
        return q, k, v, torch.randn_like(v), torch.randn_like(v)

    args = AttentionArgs(0.1, deterministic=False)
    causal = AttentionArgs(0.1, -1, 0, deterministic=False)
    assert backward_sm90.supports(*tensors(), args) and backward_sm90.supports(*tensors(), causal)
    assert backward_sm90.supports(*tensors(64), args) and not backward_sm90.supports(*tensors(96), args)
    assert not backward_sm90.supports(*tensors(128, 64), args) and backward_sm90.supports(*tensors(256), args)
    assert not backward_sm90.supports(*tensors(192), args) and not backward_sm90.supports(*tensors(256, 128), args)
    assert not backward_sm90.supports(*tensors(dtype=torch.float32), args)
    for other in (AttentionArgs(0.1, 30, 30), AttentionArgs(0.1, softcap=5.0),
                  AttentionArgs(0.1, alibi_slopes=torch.rand(4)), AttentionArgs(0.1, dropout=DropoutArgs(0.1, 1, 0))):
        assert not backward_sm90.supports(*tensors(), other)
    q, k, v, dout, out = tensors()
    q_mis = torch.randn(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
    assert not backward_sm90.supports(q_mis, k, v, dout, out, args)
    # batch x heads is the grids' second axis, which stops at 65,535 programs.
    for batch, want in ((16383, True), (16384, False)):
        many = [torch.randn(batch, 1, 4, 64, dtype=torch.bfloat16) for _ in range(5)]
        assert backward_sm90.supports(*many, args) == want, batch
    # Not on a CPU tensor, nor with deterministic=True, nor under the interpreter.
    assert not backward_sm90.applies(q, k, v, dout, out, args)
    if ON_SM90:  # from MIN_SEQLEN queries or keys on, per head dim
        for d in (128, 64, 256):
            shortest, shortest_causal = backward_sm90.MIN_SEQLEN[d], backward_sm90.MIN_SEQLEN_CAUSAL[d]
            g = [t.cuda() for t in tensors(d, n=shortest)]
            assert backward_sm90.applies(*g, args) and not backward_sm90.applies(*g, AttentionArgs(0.1))
            short = [t.cuda() for t in tensors(d, n=shortest - 1)]
            assert not backward_sm90.applies(*short, args)
            # Causal takes it from MIN_SEQLEN_CAUSAL on (below, the two passes were the faster).
            g = [t.cuda() for t in tensors(d, n=shortest_causal)]
            assert backward_sm90.applies(*g, causal)
            short = [t.cuda() for t in tensors(d, n=shortest_causal - 1)]
            assert not backward_sm90.applies(*short, causal)
            assert backward_sm90.applies(*short, args) == (shortest_causal - 1 >= shortest)


@pytest.mark.usefixtures("poison_allocations")
@pytest.mark.parametrize("dq_t", [False, True], ids=["dq", "dq-transposed"])
def test_light_passes_around_the_gluon_kernel(device, dq_t):
    """The two triton passes around the Gluon kernel (the interpreter runs them on the CPU): the
    prologue's delta, lse2 (padding rows and a row that saw no key at +inf) and zeroed dQ
    accumulator, in the padded (batch * heads, seqlen_pad) layout (the wide kernel's: dQ^T,
    (batch * heads, d, seqlen_pad)); the epilogue's scaled dQ in q's strided layout. Every buffer
    starts NaN-poisoned."""
    torch.manual_seed(43)
    batch, seqlen, nheads, d = 2, 129, 3, 128
    accum_shape = (batch * nheads, d, 256) if dq_t else (batch * nheads, 256, d)
    pad = 256  # 129 rows padded to STAT_PAD
    out = torch.randn(batch, seqlen, nheads, d, device=device, dtype=torch.float16)
    dout = torch.randn(batch, nheads, seqlen, d, device=device, dtype=torch.float16).transpose(1, 2)
    lse = torch.randn(batch, nheads, seqlen, device=device)
    lse[1, 2, 5] = float("-inf")
    delta, lse2 = (torch.empty(batch * nheads, pad, device=device) for _ in range(2))
    accum = torch.empty(accum_shape, device=device)
    backward_sm90._bwd_sm90_prologue_kernel[(pad // 64, batch * nheads)](
        out, dout, lse, delta, lse2, accum, out.stride(0), out.stride(1), out.stride(2), dout.stride(0),
        dout.stride(1), dout.stride(2), lse.stride(0), lse.stride(1), nheads, seqlen, pad, HEAD_DIM=d, BLOCK=64,
        DQ_T=dq_t)
    want_delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).reshape(batch * nheads, seqlen)
    torch.testing.assert_close(delta[:, :seqlen], want_delta, rtol=1e-5, atol=1e-4)
    assert (delta[:, seqlen:] == 0).all()
    want_lse2 = (lse * 1.4426950408889634).reshape(batch * nheads, seqlen).masked_fill(
        torch.isinf(lse.reshape(batch * nheads, seqlen)), float("inf"))
    torch.testing.assert_close(lse2[:, :seqlen], want_lse2)
    assert lse2[1 * nheads + 2, 5] == float("inf") and (lse2[:, seqlen:] == float("inf")).all()
    assert (accum == 0).all()

    accum = torch.randn(accum_shape, device=device)
    dq = torch.empty(batch, nheads, seqlen, d, device=device, dtype=torch.float16).transpose(1, 2)
    backward_sm90._bwd_sm90_dq_kernel[(pad // 64, batch * nheads)](
        accum, dq, dq.stride(0), dq.stride(1), dq.stride(2), nheads, seqlen, pad, 0.125, HEAD_DIM=d, BLOCK=64,
        DQ_T=dq_t)
    rows = accum.transpose(1, 2) if dq_t else accum  # (batch * heads, seqlen_pad, d)
    want = (rows[:, :seqlen] * 0.125).reshape(batch, nheads, seqlen, d).transpose(1, 2).half()
    assert torch.equal(dq, want)


@pytest.mark.parametrize("unchecked", [True, False])
def test_descriptors_equal_gluon_s_checked_constructor(unchecked, monkeypatch):
    """backward_sm90 builds its seven Gluon TensorDescriptors per call without the dataclass's
    checks (33 us each on the H200's host) and with layouts computed once per shape; what it builds
    must be what the checked constructor builds from the same layouts, field for field."""
    import dataclasses

    import triton
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if triton.__version__.startswith("3.6."):  # the version the project pins: the fast form is in use
        assert backward_sm90._UNCHECKED_DESCRIPTORS
    monkeypatch.setattr(backward_sm90, "_UNCHECKED_DESCRIPTORS", unchecked)
    q = torch.randn(2, 130, 6, 128, dtype=torch.bfloat16)[:, :, 1:5]  # a head slice: the parent's strides
    stat = torch.randn(8, 256)
    accum = torch.randn(8, 256, 64)
    accum_t = torch.randn(8, 256, 384)
    tile = gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16)
    want = [
        (backward_sm90._tile_descriptor(q, 64),
         TensorDescriptor(q, list(q.shape), list(q.stride()), [1, 64, 1, 128],
                          gl.NVMMASharedLayout(tile.swizzle_byte_width, tile.element_bitwidth, rank=4))),
        (backward_sm90._stat_descriptor(stat, 64),
         TensorDescriptor(stat, [stat.numel()], [1], [64], gl.NVMMASharedLayout(0, 32, rank=1))),
        (backward_sm90._accum_descriptor(accum, 64, 64),
         TensorDescriptor(accum.view(-1, 64), [8 * 256, 64], [64, 1], [64, 64],
                          gl.NVMMASharedLayout.get_default_for([64, 64], gl.float32))),
        # The wide kernel's dQ^T accumulator, (batch * heads, 256, seqlen_pad), one (256, 32) box.
        (backward_sm90._accum_descriptor(accum_t, 32, 256),
         TensorDescriptor(accum_t.view(-1, 384), [8 * 256, 384], [384, 1], [256, 32],
                          gl.NVMMASharedLayout.get_default_for([256, 32], gl.float32))),
    ]
    for got, ref in want:
        assert type(got) is TensorDescriptor
        for field in dataclasses.fields(TensorDescriptor):
            a, b = getattr(got, field.name), getattr(ref, field.name)
            if field.name == "base":
                assert a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            else:
                assert a == b and type(a) is type(b), field.name
