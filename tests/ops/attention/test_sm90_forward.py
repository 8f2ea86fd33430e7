"""The Gluon forward for Hopper (ops/attention/forward_sm90.py).

An sm_90 GPU takes it for 16-bit attention, fixed-length or packed (varlen), any head dims up to
256 (Dv != D included) whose rows are 16-byte aligned, full, causal or windowed, GQA/MQA, softcap
and ALiBi; not for RoPE or dropout. On the GPU each case is checked against a
float64 reference under the error rule (outputs, the LSE, and the gradients, whose backward reads
the LSE), with every allocation NaN-poisoned and the dispatch watched, so that a silent fall back
to the triton forward fails the test. Where it must not be taken, the test checks that it is not.
On the CPU (CI) the dispatch rule is checked; test_sm90_compile.py compiles the kernel for sm_90.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import genoflash
from genoflash.ops.attention import configs, forward_sm90
from genoflash.ops.attention.args import AttentionArgs
from genoflash.ops.attention.configs import TileConfig, override_configs
from genoflash.ops.attention.dropout import DropoutArgs
from genoflash.ops.attention.reference import attention_reference, attention_reference_varlen
from genoflash.ops.rotary import rotary_tables

from tests.utils import HAS_CUDA, assert_within_rule, outputs_and_grads, random_gqa_qkv, reference_pair

ON_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
sm90 = pytest.mark.skipif(not ON_SM90, reason="needs an sm_90 GPU (H100 / H200)")


@pytest.fixture
def sm90_calls(monkeypatch):
    """How many forwards went through the Gluon kernel (launch plans stand aside while configs are
    overridden, so every call reaches the spy)."""
    calls = []
    real = forward_sm90.attention_forward_sm90

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(forward_sm90, "attention_forward_sm90", spy)
    with override_configs(sm90_forward=True):
        yield calls


def _check(q, k, v, dout, calls, **features):
    got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, **features), q, k, v, dout)
    assert len(calls) == 1, "the Gluon forward was not taken"
    truth, same = reference_pair(q, k, v, dout, fn=lambda a, b, c: attention_reference(a, b, c, None, **features)[0])
    assert_within_rule(got, truth, same)
    # The LSE: float32 against the float64 reference's (rows that see no key: -inf in both).
    _, lse = genoflash.flash_attn_func(q.detach(), k.detach(), v.detach(), return_lse=True, **features)
    _, lse64 = attention_reference(q.detach().double(), k.detach().double(), v.detach().double(), None, **features)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse64))
    finite = ~torch.isinf(lse64)
    torch.testing.assert_close(lse[finite].double(), lse64[finite], rtol=0, atol=2e-2)


@sm90
@pytest.mark.gpu
@pytest.mark.usefixtures("poison_allocations")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask", ["full", "causal", "window"])
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k", [
    (2, 1, 1), (2, 17, 17), (1, 129, 129), (2, 1000, 1000), (1, 300, 1200), (1, 1200, 300), (3, 257, 513),
    (1, 1, 777),
])
@pytest.mark.parametrize("d", [128, 64])
def test_gluon_forward_within_the_rule(batch, seqlen_q, seqlen_k, mask, dtype, d, sm90_calls):
    torch.manual_seed(seqlen_q * 31 + seqlen_k + d)
    q, k, v, dout = random_gqa_qkv(batch, seqlen_q, seqlen_k, 2, 2, d, dtype)
    features = {"full": {}, "causal": dict(causal=True), "window": dict(window_size=(150, 40))}[mask]
    _check(q, k, v, dout, sm90_calls, **features)


@sm90
@pytest.mark.gpu
@pytest.mark.usefixtures("poison_allocations")
@pytest.mark.parametrize("nheads_k", [2, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize("d", [128, 64])
def test_gluon_forward_gqa(nheads_k, d, sm90_calls):
    torch.manual_seed(50 + nheads_k)
    q, k, v, dout = random_gqa_qkv(2, 777, 1000, 4, nheads_k, d, torch.bfloat16)
    _check(q, k, v, dout, sm90_calls, causal=True)


@sm90
@pytest.mark.gpu
@pytest.mark.usefixtures("poison_allocations")
@pytest.mark.parametrize("d, dv", [(96, 96), (256, 256), (64, 192), (192, 128), (32, 32), (40, 40), (80, 112),
                                   (59, 59)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gluon_forward_head_dims(d, dv, causal, sm90_calls):
    """Head dims padded to a power of two inside the kernel (its boxes read zeros past the head dim
    and write nothing there), and Dv != D. 59 is first padded to 64 by the interface (rows of 118
    bytes cannot be TMA tiles), as every head dim that is not a multiple of 8."""
    torch.manual_seed(d * 7 + dv)
    q, k, v, dout = random_gqa_qkv(2, 259, 300, 2, 2, d, torch.bfloat16, dv=dv)
    _check(q, k, v, dout, sm90_calls, causal=causal)


@sm90
@pytest.mark.gpu
@pytest.mark.usefixtures("poison_allocations")
@pytest.mark.parametrize("features", ["softcap", "alibi", "alibi-per-batch", "softcap-alibi-window"])
@pytest.mark.parametrize("d", [128, 64])
def test_gluon_forward_score_mods(features, d, sm90_calls):
    torch.manual_seed(54 + d)
    q, k, v, dout = random_gqa_qkv(2, 333, 517, 2, 2, d, torch.bfloat16)
    slopes = torch.rand(2, device="cuda")
    kw = {"softcap": dict(softcap=3.0), "alibi": dict(alibi_slopes=slopes, causal=True),
          "alibi-per-batch": dict(alibi_slopes=torch.rand(2, 2, device="cuda")),
          "softcap-alibi-window": dict(softcap=3.0, alibi_slopes=slopes, window_size=(100, 30))}[features]
    _check(q, k, v, dout, sm90_calls, **kw)


@sm90
@pytest.mark.gpu
@pytest.mark.usefixtures("poison_allocations")
@pytest.mark.parametrize("window", [(0, 0), (3, -1), (-1, 5), (300, 0)])
def test_gluon_forward_band_edges(window, sm90_calls):
    """Bands narrower than a tile, open on one side, and rows that see no key (Nq > Nk with a
    right bound: the first rows' bands end before key 0)."""
    torch.manual_seed(51)
    q, k, v, dout = random_gqa_qkv(1, 700, 400, 2, 2, 128, torch.bfloat16)
    _check(q, k, v, dout, sm90_calls, window_size=window)


@sm90
@pytest.mark.gpu
@pytest.mark.usefixtures("poison_allocations")
def test_gluon_forward_strided_inputs(sm90_calls):
    """Views of (batch, nheads, seqlen, headdim) buffers: the descriptors take any 16-byte aligned strides."""
    torch.manual_seed(52)
    q, k, v, dout = (torch.randn(2, 4, 333, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                     for _ in range(4))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    assert not q.is_contiguous()
    _check(q, k, v, dout, sm90_calls, causal=True)


def _cu(lengths):
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")


@sm90
@pytest.mark.gpu
@pytest.mark.usefixtures("poison_allocations")
@pytest.mark.parametrize("mask", ["full", "causal", "window"])
@pytest.mark.parametrize("lens_q, lens_k", [
    ([1, 17, 129, 1000, 5, 64], [1, 17, 129, 1000, 5, 64]),  # a sequence's last rows end inside a block
    ([1, 17, 129, 1000, 5, 64], [40, 3, 300, 777, 1, 200]),  # Nq != Nk per sequence, both ways
], ids=["same-lengths", "other-k-lengths"])
@pytest.mark.parametrize("d", [128, 64, 96])
def test_gluon_forward_varlen(lens_q, lens_k, mask, d, sm90_calls):
    """Packed sequences: each one's rows and keys come from its own slice of the packed tensors
    (the boxes that cross into the next sequence are masked there, and a sequence's last block
    stores its rows one by one), the LSE is flash-attn's (nheads, total_q), and the backward that
    reads it is within the rule too."""
    torch.manual_seed(60 + d + len(mask))
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    q, dout = (torch.randn(sum(lens_q), 4, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(sum(lens_k), 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    features = {"full": {}, "causal": dict(causal=True), "window": dict(window_size=(150, 40))}[mask]

    def call(a, b, c, **kw):
        return genoflash.flash_attn_varlen_func(a, b, c, cu_q, cu_k, max(lens_q), max(lens_k), **features, **kw)

    got = outputs_and_grads(call, q, k, v, dout)
    assert len(sm90_calls) == 1, "the Gluon forward was not taken"
    truth, same = reference_pair(
        q, k, v, dout, fn=lambda a, b, c: attention_reference_varlen(a, b, c, cu_q, cu_k, **features)[0])
    assert_within_rule(got, truth, same)
    _, lse = call(q.detach(), k.detach(), v.detach(), return_lse=True)
    _, lse64 = attention_reference_varlen(q.detach().double(), k.detach().double(), v.detach().double(), cu_q, cu_k,
                                          **features)
    assert lse.shape == lse64.shape == (4, sum(lens_q))
    assert torch.equal(torch.isinf(lse), torch.isinf(lse64))
    finite = ~torch.isinf(lse64)
    torch.testing.assert_close(lse[finite].double(), lse64[finite], rtol=0, atol=2e-2)


@sm90
@pytest.mark.gpu
def test_gluon_forward_varlen_sequences_do_not_see_each_other(sm90_calls):
    """A tile that crosses into the next sequence reads its keys and values; they weigh exactly 0,
    so changing them leaves every other sequence's output bit for bit."""
    torch.manual_seed(61)
    lens = [100, 333, 64, 1]
    cu_s = _cu(lens)
    q, k, v = (torch.randn(sum(lens), 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    before = genoflash.flash_attn_varlen_func(q, k, v, cu_s, cu_s, 333, 333)
    k2, v2 = k.clone(), v.clone()
    k2[100:433] += 1.0  # the second sequence's keys and values only
    v2[100:433] *= 3.0
    after = genoflash.flash_attn_varlen_func(q, k2, v2, cu_s, cu_s, 333, 333)
    assert len(sm90_calls) == 2
    others = torch.ones(sum(lens), dtype=torch.bool, device="cuda")
    others[100:433] = False
    assert torch.equal(before[others], after[others])
    assert not torch.equal(before[~others], after[~others])


@sm90
@pytest.mark.gpu
def test_gluon_forward_is_not_taken_where_it_does_not_apply(sm90_calls):
    """Dropout, RoPE, fp32, misaligned tensors, the tma setting off,
    override_configs(sm90_forward=False) and a forced triton tiling run the triton forward."""
    torch.manual_seed(53)
    q, k, v, _ = random_gqa_qkv(1, 200, 200, 2, 2, 128, torch.bfloat16)
    cos, sin = rotary_tables(200, 128, device="cuda")
    for features in (dict(dropout_p=0.1), dict(rotary_cos=cos, rotary_sin=sin)):
        genoflash.flash_attn_func(q, k, v, **features)
    genoflash.flash_attn_func(*random_gqa_qkv(1, 200, 200, 2, 2, 128, torch.float32)[:3])
    q_mis = torch.randn(q.numel() + 1, device="cuda", dtype=q.dtype)[1:].view(q.shape)
    genoflash.flash_attn_func(q_mis, k, v)
    with genoflash.settings(tma=False):
        genoflash.flash_attn_func(q, k, v)
    with override_configs(sm90_forward=False):
        genoflash.flash_attn_func(q, k, v)
    assert sm90_calls == []
    with override_configs(forward=TileConfig(64, 32)):  # a triton tiling
        genoflash.flash_attn_func(q, k, v)
    assert sm90_calls == []
    genoflash.flash_attn_func(q, k, v)
    assert len(sm90_calls) == 1


def test_dispatch_rule():
    """What the kernel supports, checked on the host with CPU tensors."""
    def tensors(d=128, dv=None, dtype=torch.bfloat16, n=100):
        q, k = (torch.randn(2, n, 4, d, dtype=dtype) for _ in range(2))
        return q, k, torch.randn(2, n, 4, dv or d, dtype=dtype)

    plain, causal, window = AttentionArgs(0.1), AttentionArgs(0.1, -1, 0), AttentionArgs(0.1, 30, 7)
    for a in (plain, causal, window, AttentionArgs(0.1, softcap=5.0), AttentionArgs(0.1, alibi_slopes=torch.rand(4))):
        assert forward_sm90.supports(*tensors(), a) and forward_sm90.supports(*tensors(64), a)
    assert forward_sm90.supports(*tensors(dtype=torch.float16), plain)
    for d, dv in ((96, None), (256, None), (128, 64), (32, None), (64, 192), (8, None)):
        assert forward_sm90.supports(*tensors(d, dv), plain)
    for d, dv in ((59, None), (264, None), (128, 264)):  # rows not 16-byte aligned; past 256
        assert not forward_sm90.supports(*tensors(d, dv), plain)
    assert not forward_sm90.supports(*tensors(dtype=torch.float32), plain)
    varlen = AttentionArgs(0.1, cu_seqlens_q=torch.tensor([0, 100]), cu_seqlens_k=torch.tensor([0, 100]))
    assert forward_sm90.supports(*(t[0] for t in tensors()), varlen)  # packed (total, heads, dim)
    for other in (AttentionArgs(0.1, dropout=DropoutArgs(0.1, 1, 0)),
                  AttentionArgs(0.1, rotary_cos=torch.rand(100, 64), rotary_sin=torch.rand(100, 64))):
        assert not forward_sm90.supports(*tensors(), other)
    assert not forward_sm90.supports(*tensors(), varlen)  # varlen takes packed tensors
    assert not forward_sm90.supports(*(t[0] for t in tensors()), plain)
    q, k, v = tensors()
    q_mis = torch.randn(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
    assert not forward_sm90.supports(q_mis, k, v, plain)
    # batch x heads is the grid's second axis, which stops at 65,535 programs.
    for batch, want in ((16383, True), (16384, False)):
        assert forward_sm90.supports(*(torch.randn(batch, 1, 4, 16, dtype=torch.bfloat16) for _ in range(3)),
                                     plain) == want, batch
    many = torch.randn(65536, 1, 16, dtype=torch.bfloat16)
    cu = torch.arange(0, 65537, dtype=torch.int32)  # 65,536 sequences of one token, one head
    assert not forward_sm90.supports(many, many, many, AttentionArgs(0.1, cu_seqlens_q=cu, cu_seqlens_k=cu))
    assert forward_sm90.supports(many[:65535], many[:65535], many[:65535],
                                 AttentionArgs(0.1, cu_seqlens_q=cu[:65536], cu_seqlens_k=cu[:65536]))
    assert not forward_sm90.applies(q, k, v, plain)  # not on a CPU tensor, nor under the interpreter
    # Taken by default where it was measured faster (configs.sm90_forward_preferred), else where
    # override_configs says.
    preferred = {(128, 128): True, (96, 96): True, (128, 64): True, (80, 112): True, (256, 256): True,
                 (64, 64): True, (48, 40): True, (32, 32): False, (16, 32): False, (192, 192): False,
                 (64, 192): False, (256, 128): True}
    for (d, dv), want in preferred.items():
        assert configs.sm90_forward_allowed(d, dv) == want, (d, dv)
        assert not configs.sm90_forward_allowed(d, dv, varlen=True)  # packed: only when asked (unmeasured)
        with override_configs(sm90_forward=not want):
            assert configs.sm90_forward_allowed(d, dv) == (not want), (d, dv)
        with override_configs(sm90_forward=True):
            assert configs.sm90_forward_allowed(d, dv, varlen=True)
        with override_configs(sm90_forward=True, forward=TileConfig(64, 32)):  # a triton tiling wins
            assert not configs.sm90_forward_allowed(d, dv)
        if ON_SM90:
            g = [t.cuda() for t in tensors(d, dv)]
            assert forward_sm90.applies(*g, plain) == want, (d, dv)
            packed = AttentionArgs(0.1, cu_seqlens_q=torch.tensor([0, 100], device="cuda", dtype=torch.int32),
                                   cu_seqlens_k=torch.tensor([0, 100], device="cuda", dtype=torch.int32))
            assert not forward_sm90.applies(*(t[0] for t in g), packed), (d, dv)  # not by default


@pytest.mark.parametrize("d, dv, rows, keys, stages", [
    (64, 64, 192, 128, 3), (48, 64, 192, 128, 3), (32, 32, 128, 128, 3), (16, 16, 128, 128, 3),
    (128, 128, 128, 128, 2), (128, 64, 128, 128, 3), (64, 128, 128, 128, 3), (256, 256, 128, 64, 2),
])
def test_tiles_per_padded_head_dims(d, dv, rows, keys, stages):
    """Three compute warpgroups (192 rows) exactly where the head dims pad to 64, two elsewhere; the
    ring's stages fill the shared memory budget beside Q and never exceed it."""
    block_d, block_dv = forward_sm90.padded(d), forward_sm90.padded(dv)
    got = forward_sm90.tiles(block_d, block_dv)
    assert got == (rows, keys, stages)
    fixed = rows * block_d * 2 + (rows * block_dv * 2 if block_dv != block_d else 0)
    assert fixed + stages * keys * (block_d + block_dv) * 2 <= forward_sm90.SMEM_BYTES
