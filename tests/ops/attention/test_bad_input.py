"""Bad input gets a clear error naming the argument, never a wrong answer."""

from __future__ import annotations

import pytest
import torch

import genoflash
from genoflash.ops.common import checks


def qkv(b=1, n=16, h=2, d=32, dtype=torch.float32, nk=None):
    nk = n if nk is None else nk
    return (torch.randn(b, n, h, d, dtype=dtype), torch.randn(b, nk, h, d, dtype=dtype),
            torch.randn(b, nk, h, d, dtype=dtype))


def call(q, k, v, **kw):
    with genoflash.use_backend("torch"):
        return genoflash.flash_attn_func(q, k, v, **kw)


@pytest.mark.parametrize(
    "make,error,match",
    [
        (lambda: (torch.randn(16, 2, 32), *qkv()[1:]), ValueError, r"q must have rank 4"),
        (lambda: (qkv()[0], torch.randn(1, 1, 16, 2, 32), qkv()[2]), ValueError, r"k must have rank 4"),
        (lambda: (*qkv()[:2], torch.randn(1, 16, 2)), ValueError, r"v must have rank 4"),
        (lambda: (qkv(b=2)[0], *qkv(b=1)[1:]), ValueError, r"batch mismatch"),
        (lambda: (qkv(h=3)[0], *qkv(h=2)[1:]), ValueError, r"must be divisible by k/v's nheads"),
        (lambda: (*qkv(h=4)[:2], qkv(h=2)[2]), ValueError, r"nheads mismatch: k has 4, v has 2"),
        (lambda: (qkv(d=64)[0], *qkv(d=32)[1:]), ValueError, r"headdim mismatch"),
        (lambda: (*qkv()[:2], qkv(nk=15)[2]), ValueError, r"k and v must have the same seqlen"),
        (lambda: qkv(d=264), ValueError, r"headdim must be between 1 and 256, got 264"),
        (lambda: qkv(d=0), ValueError, r"headdim must be between 1 and 256, got 0"),
        (lambda: qkv(n=0), ValueError, r"seqlen_q and seqlen_k must be >= 1"),
        (lambda: (qkv()[0].half(), *qkv()[1:]), TypeError, r"share one dtype"),
        (lambda: tuple(t.to(torch.int32) for t in qkv()), TypeError, r"q must be a floating-point tensor"),
        (lambda: (qkv()[0].numpy(), *qkv()[1:]), TypeError, r"q must be a torch.Tensor"),
        (lambda: (*qkv()[:2], qkv()[2].to("meta")), ValueError, r"one device"),
    ],
    ids=["q-rank", "k-rank", "v-rank", "batch", "heads-not-divisible", "kv-heads", "headdim", "kv-seqlen", "headdim-too-large",
         "headdim-not-multiple-of-8", "empty", "mixed-dtypes", "integer-dtype", "not-a-tensor", "mixed-devices"],
)
def test_bad_tensors(make, error, match):
    with pytest.raises(error, match=match):
        call(*make())


@pytest.mark.parametrize("scale,error", [(0.0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
                                         (float("inf"), ValueError), ("0.1", TypeError)])
def test_bad_softmax_scale(scale, error):
    with pytest.raises(error, match="softmax_scale"):
        call(*qkv(), softmax_scale=scale)


def test_unknown_backend_name():
    with pytest.raises(ValueError, match=r"use_backend\(name\): unknown backend 'flash'"):
        with genoflash.use_backend("flash"):
            pass
    with pytest.raises(ValueError, match=r"settings\(backend=...\): unknown backend 'flash'"):
        with genoflash.settings(backend="flash"):
            pass


def test_triton_backend_rejects_float64():
    with pytest.raises(TypeError, match="triton backend supports float16, bfloat16 and float32"):
        with genoflash.use_backend("triton"):
            genoflash.flash_attn_func(*qkv(dtype=torch.float64))


def test_triton_backend_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.setattr(checks, "triton_interpreted", lambda: False)  # the check lives in ops/common/checks.py
    with pytest.raises(ValueError, match="triton backend needs CUDA tensors"):
        with genoflash.use_backend("triton"):
            genoflash.flash_attn_func(*qkv())


def test_float64_runs_on_torch_backend():
    """float64 is allowed where it can be honoured (torch and reference backends)."""
    q, k, v = qkv(dtype=torch.float64)
    out = call(q, k, v, causal=True)
    with genoflash.use_backend("reference"):
        ref = genoflash.flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(out, ref)
