"""The `genoflash::` custom ops under `torch.library.opcheck`: the schema, the fake (meta)
implementation against the real one (shapes, dtypes, strides), the autograd registration and
AOT dispatch, on small odd shapes. On the CPU the triton backend runs under the interpreter."""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

import genoflash
from genoflash.ops.attention import custom_ops as attention_ops
from genoflash.ops.attention.validation import attention_args
from genoflash.ops.common import custom_ops as short_conv_ops
from genoflash.ops.hyena import custom_ops as fftconv_ops
from genoflash.ops.hyena.fftconv import conv_geometry
from genoflash.ops.mamba import custom_ops as scan_ops
from genoflash.ops.rotary import rotary_tables
from genoflash.ops.rotary import custom_ops as rotary_ops
from tests.utils import HAS_CUDA

DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
INTERPRETED = not HAS_CUDA
# opcheck's AOT dispatch tests retrace each op (seconds each under the interpreter); the models'
# compile tests (tests/models/test_compile.py) run every op through AOT autograd instead.
TESTS = ("test_schema", "test_autograd_registration", "test_faketensor")


def _randn(*shape, dtype=torch.float32, grad=True):
    return torch.randn(*shape, dtype=dtype, device=DEVICE).requires_grad_(grad)


ATTENTION_CASES = {
    # (seqlen_q, seqlen_k, nheads, nheads_k, headdim, headdim_v, keyword arguments)
    "plain": (17, 17, 2, 2, 24, 24, {}),
    "causal-gqa-dv": (13, 29, 4, 2, 16, 24, dict(causal=True)),
    "window-softcap-alibi": (33, 33, 2, 1, 16, 16, dict(window_size=(5, 3), softcap=2.0, alibi=True)),
    "rotary": (9, 17, 2, 2, 16, 16, dict(rotary=True)),
    "dropout": (17, 17, 2, 2, 16, 16, dict(dropout_p=0.25)),
    "varlen": (None, None, 2, 2, 16, 16, dict(varlen=[5, 1, 12])),
}


def _attention_inputs(case: str):
    nq, nk, h, hk, d, dv, kw = ATTENTION_CASES[case]
    kw = dict(kw)
    lengths = kw.pop("varlen", None)
    if lengths is not None:
        total = sum(lengths)
        q, k, v = _randn(total, h, d), _randn(total, hk, d), _randn(total, hk, dv)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
        varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths), max_seqlen_k=max(lengths))
        lengths_q = lengths_k = lengths
    else:
        q, k, v = _randn(2, nq, h, d), _randn(2, nk, hk, d), _randn(2, nk, hk, dv)
        varlen, lengths_q, lengths_k = {}, [nq], [nk]
    slopes = torch.rand(h, device=DEVICE) if kw.pop("alibi", False) else None
    cos = sin = None
    if kw.pop("rotary", False):
        cos, sin = rotary_tables(nk, d, device=DEVICE)
    a = attention_args(q, lengths_q, lengths_k, kw.get("dropout_p", 0.0), None, kw.get("causal", False),
                       kw.get("window_size", (-1, -1)), kw.get("softcap", 0.0), slopes, cos, sin, False, None, 0,
                       **varlen)
    return q, k, v, a


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_ops(case, backend):
    torch.manual_seed(0)
    q, k, v, a = _attention_inputs(case)
    rest = attention_ops.op_arguments(a, backend)
    opcheck(torch.ops.genoflash.flash_attn_forward.default, (q, k, v, *rest), test_utils=TESTS)
    out, lse = torch.ops.genoflash.flash_attn_forward(q, k, v, *rest)
    dout = torch.randn_like(out)
    opcheck(torch.ops.genoflash.flash_attn_backward.default,
            (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, *rest), test_utils=TESTS)


def test_attention_op_checks_what_tracing_could_not():
    """cu_seqlens' values are read inside the op (while tracing they do not exist): a wrong one
    is still a clear error naming the argument."""
    q, k, v, a = _attention_inputs("varlen")
    rest = list(attention_ops.op_arguments(a, "torch"))
    rest[0] = torch.tensor([0, 7, 3, 18], dtype=torch.int32, device=DEVICE)  # decreasing
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0 and never decrease"):
        torch.ops.genoflash.flash_attn_forward(q, k, v, *rest)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("case", ["plain", "per-sequence", "varlen"])
def test_rotary_op(case, backend):
    torch.manual_seed(0)
    cos, sin = rotary_tables(40, 12, device=DEVICE)
    offsets, offset, cu, max_seqlen = None, 3, None, 17
    if case == "varlen":
        x = _randn(23, 2, 16)
        cu, offset = torch.tensor([0, 6, 23], dtype=torch.int32, device=DEVICE), 0
    else:
        x = _randn(2, 17, 2, 16)
    if case == "per-sequence":
        offsets = torch.tensor([0, 20], dtype=torch.int32, device=DEVICE)
    opcheck(torch.ops.genoflash.apply_rotary.default,
            (x, cos, sin, False, offsets, offset, cu, max_seqlen, False, backend), test_utils=TESTS)
    if case == "per-sequence":
        too_far = torch.tensor([0, 24], dtype=torch.int32, device=DEVICE)  # 24 + 17 > 40 positions
        with pytest.raises(ValueError, match="the tables cover 40 positions"):
            rotary_ops.apply_rotary(x, cos, sin, False, too_far, 0, None, max_seqlen, False, backend)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("channels_last", [True, False])
def test_fftconv_ops(causal, channels_last):
    torch.manual_seed(0)
    batch, seqlen, channels = 2, 19, 5
    taps = 7 if causal else 2 * 7 - 1
    x = _randn(batch, seqlen, channels) if channels_last else _randn(batch, channels, seqlen)
    h, D = _randn(channels, taps), _randn(channels)
    assert conv_geometry(seqlen, taps, causal).fft_len >= seqlen
    args = (causal, 2, channels_last, False, INTERPRETED)  # 2 channels per group: groups and a remainder
    opcheck(torch.ops.genoflash.fftconv.default, (x, h, D, *args), test_utils=TESTS)
    opcheck(torch.ops.genoflash.fftconv.default, (x, h, None, *args), test_utils=TESTS)
    dy = torch.randn_like(x)
    opcheck(torch.ops.genoflash.fftconv_backward.default, (dy, x.detach(), h.detach(), D.detach(), *args),
            test_utils=TESTS)
    assert fftconv_ops.fftconv is not None


@pytest.mark.parametrize("activation", [None, "silu"])
def test_short_conv_op(activation):
    torch.manual_seed(0)
    x, w, b, ib = _randn(2, 6, 37), _randn(6, 4), _randn(6), _randn(6)
    args = (2, INTERPRETED, activation)
    opcheck(torch.ops.genoflash.short_conv.default, (x, w, b, ib, *args), test_utils=TESTS)
    opcheck(torch.ops.genoflash.short_conv.default, (x, w, None, None, *args), test_utils=TESTS)
    opcheck(torch.ops.genoflash.short_conv_backward.default,
            (torch.randn_like(x), x.detach(), w.detach(), b.detach(), None, *args), test_utils=TESTS)
    assert short_conv_ops.short_conv is not None


@pytest.mark.parametrize("layout, extras", [("channels-first", True), ("dense", False)])
def test_selective_scan_ops(layout, extras):
    torch.manual_seed(0)
    batch, seqlen, dim, dstate = 2, 11, 3, 2

    def activation():
        t = torch.randn(batch, dim, seqlen, device=DEVICE).transpose(1, 2) if layout == "channels-first" else \
            torch.randn(batch, seqlen, dim, device=DEVICE)
        return t.requires_grad_()

    u, delta = activation(), activation()
    A = (-torch.rand(dim, dstate, device=DEVICE) - 0.5).requires_grad_()
    B, C = _randn(batch, seqlen, dstate), _randn(batch, seqlen, dstate)
    D, z, bias = (_randn(dim), activation(), _randn(dim)) if extras else (None, None, None)
    args = (u, delta, A, B, C, D, z, bias, extras, INTERPRETED, True)
    opcheck(torch.ops.genoflash.selective_scan.default, (*args, True), test_utils=TESTS)
    opcheck(torch.ops.genoflash.selective_scan.default, (*args, False), test_utils=TESTS[:3])
    out, h0, decay = torch.ops.genoflash.selective_scan(*args, True)
    detached = [None if t is None else t.detach() for t in args[:8]]
    opcheck(torch.ops.genoflash.selective_scan_backward.default,
            (torch.randn_like(out), *detached, h0.detach(), decay.detach(), extras, INTERPRETED, True),
            test_utils=TESTS)
    assert scan_ops.selective_scan is not None


def test_ops_are_registered_under_one_namespace():
    names = {"flash_attn_forward", "flash_attn_backward", "apply_rotary", "fftconv", "fftconv_backward",
             "short_conv", "short_conv_backward", "selective_scan", "selective_scan_backward"}
    assert names <= set(dir(torch.ops.genoflash))
    assert genoflash is not None
