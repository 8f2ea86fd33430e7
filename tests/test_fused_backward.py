"""The one-pass backward that deterministic=False allows: the dK/dV pass also sums dQ in float32
(atomics, or TMA bulk reductions) and the dQ pass is skipped. The tile table takes it only where
it was measured faster (nowhere on the H200 yet), so these tests force it (override_configs
one_pass=True). Every feature goes through that path too; each case is checked against a float64
reference under the error rule, forward and all gradients, and the launches are watched so that
a silent fall back to the two-pass backward would fail the test."""

from __future__ import annotations

import pytest
import torch

import genoflash
from genoflash.ops.attention import backward, backward_sm90
from genoflash.ops.attention.configs import override_configs
from genoflash.ops.attention.reference import attention_reference, attention_reference_varlen
from genoflash.rotary import rotary_tables

from .attention_utils import LIGHT_PASSES, assert_within_rule, outputs_and_grads, reference_pair
from .conftest import HAS_CUDA
from .test_masking import cu
from .test_rotary import rope_then_attention

DTYPE = torch.bfloat16 if HAS_CUDA else torch.float16

pytestmark = pytest.mark.usefixtures("poison_allocations", "triton_one_pass_only")


@pytest.fixture
def triton_one_pass_only():
    """These tests are about backward.py's one-pass form: keep the Gluon backward (which
    deterministic=False takes on an H200 at head dim 128) out of the way."""
    with backward_sm90.use_sm90_backward(False):
        yield


def spy_backward_launches(monkeypatch, record, light_passes=False):
    """Watch the backward's launches: record(kernel name, constexprs) for each (the light passes
    only with light_passes=True); its non-None results are collected in the returned list."""
    seen = []
    real_launch = backward.launch

    def spy(kernel, grid, cfg, *args, **constexprs):
        if light_passes or kernel.fn.__name__ not in LIGHT_PASSES:
            item = record(kernel.fn.__name__, constexprs)
            if item is not None:
                seen.append(item)
        return real_launch(kernel, grid, cfg, *args, **constexprs)

    monkeypatch.setattr(backward, "launch", spy)
    return seen


@pytest.fixture
def launches(monkeypatch):
    """Names of the backward's kernels launched, with their FUSED_DQ switch; dq_tma_launches gets
    their DQ_TMA switches (dQ by TMA bulk reductions)."""
    def record(name, constexprs):
        dq_tma_launches.append(constexprs.get("DQ_TMA"))
        return name, constexprs.get("FUSED_DQ")

    dq_tma_launches.clear()
    seen = spy_backward_launches(monkeypatch, record)
    with override_configs(one_pass=True):
        yield seen


dq_tma_launches: list = []
# dQ goes in by TMA bulk reductions on Hopper GPUs, for fixed-length, RoPE-free, aligned tensors;
# the interpreter has no descriptor reductions.
DQ_BY_TMA = HAS_CUDA and torch.cuda.get_device_capability()[0] >= 9


def qkv(shape_q, shape_k, dv, device):
    q = torch.randn(*shape_q, device=device, dtype=DTYPE, requires_grad=True)
    k = torch.randn(*shape_k, device=device, dtype=DTYPE, requires_grad=True)
    v = torch.randn(*shape_k[:-1], dv, device=device, dtype=DTYPE, requires_grad=True)
    dout = torch.randn(*shape_q[:-1], dv, device=device, dtype=DTYPE)
    return q, k, v, dout


FIXED_CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window-narrower-than-a-tile": dict(window_size=(5, 3)),
    "softcap+window": dict(softcap=3.0, window_size=(20, -1)),
    "alibi+causal": dict(causal=True, alibi=True),
}


@pytest.mark.parametrize("case", FIXED_CASES, ids=str)
@pytest.mark.parametrize("seqlen_q,seqlen_k,nheads_k", [(129, 97, 2), (1, 17, 1), (300, 300, 4)])
def test_fused_backward_matches_reference(case, seqlen_q, seqlen_k, nheads_k, launches, device):
    torch.manual_seed(60 + seqlen_q)
    features = dict(FIXED_CASES[case])
    if features.pop("alibi", False):
        features["alibi_slopes"] = torch.rand(4, device=device, dtype=torch.float32) * 0.3
    q, k, v, dout = qkv((2, seqlen_q, 4, 40), (2, seqlen_k, nheads_k, 40), 24, device)
    with genoflash.use_backend("triton"):
        got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, deterministic=False, **features),
                                q, k, v, dout)
    assert launches == [("_attn_bwd_dkdv_kernel", True)]  # one pass, dQ fused into it
    assert dq_tma_launches == [DQ_BY_TMA]  # head dim 40 in bf16: 80-byte rows, aligned for TMA

    def standard(a, b, c):
        group = a.shape[2] // b.shape[2]
        return attention_reference(a, b.repeat_interleave(group, 2), c.repeat_interleave(group, 2), **features)[0]

    truth, same = reference_pair(q, k, v, dout, fn=standard)
    assert_within_rule(got, truth, same)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fused_backward_varlen(causal, launches, device):
    torch.manual_seed(61)
    lens_q, lens_k = [1, 17, 300, 5], [40, 3, 129, 5]
    cu_q, cu_k = cu(lens_q, device), cu(lens_k, device)
    q, k, v, dout = qkv((sum(lens_q), 4, 32), (sum(lens_k), 2, 32), 32, device)
    with genoflash.use_backend("triton"):
        got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_varlen_func(
            a, b, c, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, deterministic=False), q, k, v, dout)
    assert launches == [("_attn_bwd_dkdv_kernel", True)]
    assert dq_tma_launches == [False]  # varlen: atomics by pointers

    def standard(a, b, c):
        return attention_reference_varlen(a, b.repeat_interleave(2, 1), c.repeat_interleave(2, 1), cu_q, cu_k,
                                          causal=causal)[0]

    truth, same = reference_pair(q, k, v, dout, fn=standard)
    assert_within_rule(got, truth, same)


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("d,rotary_dim", [(64, 64), (40, 24)])
def test_fused_backward_unrotates_dq(interleaved, d, rotary_dim, launches, device):
    """With RoPE the accumulator holds dQ in the rotated frame; the convert pass must unrotate it."""
    torch.manual_seed(62)
    cos, sin = rotary_tables(80, rotary_dim, device=device, dtype=torch.float32)
    q, k, v, dout = qkv((2, 77, 2, d), (2, 77, 2, d), d, device)
    kw = dict(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved, causal=True)
    with genoflash.use_backend("triton"):
        got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, deterministic=False, **kw),
                                q, k, v, dout)
    assert launches == [("_attn_bwd_dkdv_kernel", True)]
    truth, same = reference_pair(q, k, v, dout, fn=rope_then_attention(cos, sin, interleaved, causal=True))
    assert_within_rule(got, truth, same)


def test_fused_backward_with_dropout_equals_the_two_pass_backward(device):
    """Same seed, same mask: the fused and two-pass backward agree up to summation order."""
    torch.manual_seed(63)
    q, k, v, dout = qkv((2, 129, 4, 32), (2, 97, 2, 32), 32, device)
    grads = {}
    for det in (True, False):
        with genoflash.use_backend("triton"), override_configs(one_pass=True):
            grads[det] = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(
                a, b, c, dropout_p=0.2, dropout_seed=5, causal=True, deterministic=det), q, k, v, dout)
    for name, a, b in zip(("out", "dq", "dk", "dv"), grads[True], grads[False]):
        assert not torch.isnan(b).any(), name
        scale = a.float().abs().max().item()
        assert (a.float() - b.float()).abs().max().item() <= 4e-3 * scale, name
    assert not torch.equal(grads[True][1], torch.zeros_like(grads[True][1]))


def test_deterministic_true_is_the_two_pass_backward_even_where_one_pass_is_forced(launches, device):
    torch.manual_seed(64)
    q, k, v, dout = qkv((1, 65, 2, 32), (1, 65, 2, 32), 32, device)
    with genoflash.use_backend("triton"):
        outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, deterministic=True), q, k, v, dout)
    # The dQ pass first: it writes delta (rowsum(dO * O)), which the dK/dV pass then reads.
    assert launches == [("_attn_bwd_dq_kernel", None), ("_attn_bwd_dkdv_kernel", False)]


def test_delta_comes_from_the_dq_pass_or_from_its_own_pass_in_the_one_pass_backward(monkeypatch, device):
    """delta = rowsum(dO * O): the two-pass backward computes it in the dQ pass (launched first),
    with no light pass of its own; the one-pass backward has no dQ pass and keeps the light pass.
    Outputs are NaN-poisoned, so a row whose delta is never written shows in dK."""
    seen = spy_backward_launches(monkeypatch, lambda name, kw: name, light_passes=True)
    torch.manual_seed(66)
    q, k, v, dout = qkv((2, 77, 2, 40), (2, 129, 2, 40), 40, device)
    grads = {}
    for one_pass in (False, True):
        seen.clear()
        with genoflash.use_backend("triton"), override_configs(one_pass=one_pass, split_channels=True):
            grads[one_pass] = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(
                a, b, c, causal=True, deterministic=False), q, k, v, dout)
        if one_pass:
            assert seen == ["_attn_bwd_preprocess_kernel", "_attn_bwd_dkdv_kernel", "_attn_bwd_dq_convert_kernel"]
        else:
            assert seen == ["_attn_bwd_dq_kernel", "_attn_bwd_dkdv_kernel"]
    for name, a, b in zip(("out", "dq", "dk", "dv"), grads[False], grads[True]):
        assert not torch.isnan(a).any() and not torch.isnan(b).any(), name
        scale = a.float().abs().max().item()
        assert (a.float() - b.float()).abs().max().item() <= 1e-2 * scale, name


def test_deterministic_false_takes_the_one_pass_backward_only_where_the_table_says(monkeypatch, device):
    """No tile table entry takes the one-pass backward (slower on the H200), so deterministic=False
    runs the two passes, whose Q-by-TMA choice in dK/dV stays the deterministic one's."""
    seen = spy_backward_launches(monkeypatch, lambda name, kw: (name, kw.get("FUSED_DQ"), kw.get("TMA")))
    torch.manual_seed(65)
    q, k, v, dout = qkv((1, 65, 2, 32), (1, 65, 2, 32), 32, device)
    runs = {}
    for det in (True, False):
        seen.clear()
        with genoflash.use_backend("triton"):
            outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, deterministic=det), q, k, v, dout)
        runs[det] = list(seen)
    assert [name for name, _, _ in runs[False]] == ["_attn_bwd_dq_kernel", "_attn_bwd_dkdv_kernel"]
    assert runs[False] == runs[True]
