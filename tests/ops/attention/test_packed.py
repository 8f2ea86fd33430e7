"""flash-attn's packed forms (qkv and kv in one tensor, fixed-length and varlen) against a float64
reference, and flash-attn's integer-like arguments (numpy and 0-d tensor ints) taken as ints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import genoflash
from genoflash.ops.attention.reference import attention_reference, attention_reference_varlen

from tests.utils import HAS_CUDA, assert_within_rule

BACKENDS = ["triton", "torch"]
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if HAS_CUDA else [])

pytestmark = pytest.mark.usefixtures("poison_allocations")


def _grads_through(fn, packed_inputs, dout):
    """(out, *gradients of the packed inputs) of fn(*packed_inputs)."""
    out = fn(*packed_inputs)
    return (out, *torch.autograd.grad(out, packed_inputs, dout))


def _check(fn_got, fn_std, packed_inputs, dout, names):
    """fn_got run on the packed tensors against fn_std (standard attention on their slices), in
    float64 and in the inputs' dtype: the fp64 rule for the output and every packed gradient."""
    got = _grads_through(fn_got, packed_inputs, dout)
    truth = _grads_through(fn_std, [t.detach().double().requires_grad_() for t in packed_inputs], dout.double())
    same = _grads_through(fn_std, [t.detach().clone().requires_grad_() for t in packed_inputs], dout)
    assert_within_rule(got, truth, same, names)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_qkvpacked(backend, dtype, causal, device):
    torch.manual_seed(0)
    qkv = torch.randn(2, 17, 3, 2, 40, dtype=dtype, device=device, requires_grad=True)
    dout = torch.randn(2, 17, 2, 40, dtype=dtype, device=device)

    def std(qkv):
        return attention_reference(*qkv.unbind(2), None, causal)[0]

    with genoflash.use_backend(backend):
        _check(lambda t: genoflash.flash_attn_qkvpacked_func(t, causal=causal), std, [qkv], dout, ("out", "dqkv"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_kvpacked_gqa_with_fewer_queries(backend, dtype, causal, device):
    torch.manual_seed(1)
    q = torch.randn(2, 17, 4, 40, dtype=dtype, device=device, requires_grad=True)
    kv = torch.randn(2, 33, 2, 2, 40, dtype=dtype, device=device, requires_grad=True)
    dout = torch.randn(2, 17, 4, 40, dtype=dtype, device=device)

    def std(q, kv):
        k, v = (t.repeat_interleave(2, dim=2) for t in kv.unbind(2))
        return attention_reference(q, k, v, None, causal)[0]

    with genoflash.use_backend(backend):
        _check(lambda a, b: genoflash.flash_attn_kvpacked_func(a, b, causal=causal), std, [q, kv], dout,
               ("out", "dq", "dkv"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_varlen_qkvpacked(backend, dtype, device):
    torch.manual_seed(2)
    cu = torch.tensor([0, 1, 18, 47], dtype=torch.int32, device=device)  # lengths 1, 17, 29
    qkv = torch.randn(47, 3, 3, 24, dtype=dtype, device=device, requires_grad=True)
    dout = torch.randn(47, 3, 24, dtype=dtype, device=device)

    def std(qkv):
        return attention_reference_varlen(*qkv.unbind(1), cu, cu, None, causal=True)[0]

    with genoflash.use_backend(backend):
        _check(lambda t: genoflash.flash_attn_varlen_qkvpacked_func(t, cu, 29, causal=True), std, [qkv], dout,
               ("out", "dqkv"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_varlen_kvpacked_gqa(backend, dtype, device):
    torch.manual_seed(3)
    cu_q = torch.tensor([0, 5, 22], dtype=torch.int32, device=device)   # 5 and 17 queries
    cu_k = torch.tensor([0, 9, 38], dtype=torch.int32, device=device)   # 9 and 29 keys
    q = torch.randn(22, 4, 16, dtype=dtype, device=device, requires_grad=True)
    kv = torch.randn(38, 2, 1, 16, dtype=dtype, device=device, requires_grad=True)
    dout = torch.randn(22, 4, 16, dtype=dtype, device=device)

    def std(q, kv):
        k, v = (t.expand(-1, 4, -1) for t in kv.unbind(1))
        return attention_reference_varlen(q, k, v, cu_q, cu_k, None, causal=False)[0]

    with genoflash.use_backend(backend):
        _check(lambda a, b: genoflash.flash_attn_varlen_kvpacked_func(a, b, cu_q, cu_k, 17, 29), std, [q, kv], dout,
               ("out", "dq", "dkv"))


def test_packed_shapes_are_checked():
    qkv = torch.randn(1, 8, 2, 2, 16)
    with pytest.raises(ValueError, match=r"qkv must have shape \(batch, seqlen, 3, nheads, headdim\)"):
        genoflash.flash_attn_qkvpacked_func(qkv)
    with pytest.raises(ValueError, match=r"kv must have shape \(total_k, 2, nheads_k, headdim\)"):
        genoflash.flash_attn_varlen_kvpacked_func(torch.randn(8, 2, 16), torch.randn(8, 3, 2, 16),
                                                  *[torch.tensor([0, 8], dtype=torch.int32)] * 2, 8, 8)
    with pytest.raises(TypeError, match="qkv must be a torch.Tensor"):
        genoflash.flash_attn_qkvpacked_func([qkv])


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_like_arguments_are_ints(backend, device):
    """numpy and 0-d tensor ints (window_size, max_seqlen, dropout seed/offset) and numpy floats
    (softmax_scale, softcap, dropout_p) give exactly the Python-number call's result."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(21, 2, 16, device=device) for _ in range(3))
    cu = torch.tensor([0, 8, 21], dtype=torch.int32, device=device)
    plain = dict(dropout_p=0.25, softmax_scale=0.3, window_size=(3, 1), softcap=5.0, dropout_seed=7,
                 dropout_offset=16)
    numpy_like = dict(dropout_p=np.float32(0.25), softmax_scale=np.float64(0.3), window_size=np.array([3, 1]),
                      softcap=np.float32(5.0), dropout_seed=np.int64(7), dropout_offset=np.uint16(16))
    tensor_like = dict(dropout_p=torch.tensor(0.25), softmax_scale=torch.tensor(0.3, dtype=torch.float64),
                       window_size=torch.tensor([3, 1]), softcap=torch.tensor(5.0), dropout_seed=torch.tensor(7),
                       dropout_offset=torch.tensor(16, dtype=torch.int32))
    with genoflash.use_backend(backend):
        want = genoflash.flash_attn_varlen_func(q, k, v, cu, cu, 13, 13, **plain)
        for kw, max_seqlen in ((numpy_like, np.int32(13)), (tensor_like, torch.tensor(13))):
            got = genoflash.flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen, **kw)
            assert torch.equal(got, want)


@pytest.mark.parametrize("kw,error,match", [
    (dict(window_size=(1.5, 0)), TypeError, "window_size left must be an int, got float"),
    (dict(window_size=torch.tensor([[1, 2]])), ValueError, "window_size must be a pair"),
    (dict(window_size=(True, 0)), TypeError, "window_size left must be an int, got a bool"),
    (dict(softmax_scale=torch.ones(2)), TypeError, "softmax_scale must be a float or a 0-d tensor"),
    (dict(softcap="1"), TypeError, "softcap must be a float, got str"),
    (dict(dropout_p=0.1, dropout_seed=torch.tensor(1.0)), TypeError, "dropout_seed must be an int or a 0-d integer"),
])
def test_integer_like_arguments_refuse_what_is_not(kw, error, match):
    q = torch.randn(1, 8, 1, 16)
    with pytest.raises(error, match=match):
        genoflash.flash_attn_func(q, q, q, **kw)


def test_max_seqlen_must_be_an_int():
    q = torch.randn(8, 1, 16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(TypeError, match="max_seqlen_q must be an int, got float"):
        genoflash.flash_attn_varlen_func(q, q, q, cu, cu, 8.0, 8)
