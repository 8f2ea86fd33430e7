"""Dropout fused into the attention kernels: the in-kernel Philox mask, its gradients, and its statistics."""

from __future__ import annotations

import itertools

import pytest
import torch

import genoflash
from genoflash.ops.attention.dropout import DropoutArgs
from genoflash.ops.attention.reference import attention_reference, attention_reference_varlen
from genoflash.ops.rotary import rotary_tables, rotate, rotate_packed

from tests.utils import assert_within_rule, outputs_and_grads, reference_pair
from tests.utils import HAS_CUDA

BACKENDS = ["triton", "torch"]
DTYPE = torch.bfloat16 if HAS_CUDA else torch.float16

pytestmark = pytest.mark.usefixtures("poison_allocations")


def qkvd(shape_q, shape_k, device, dtype=DTYPE):
    q = torch.randn(shape_q, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(shape_k, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
    return q, k, v, torch.randn(shape_q, device=device, dtype=dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_matches_reference_with_the_same_mask(backend, causal, p, device):
    """Forward and gradients equal standard attention with the materialised Philox mask."""
    torch.manual_seed(40)
    # GQA, two batch rows (the mask counts both): 4:2 heads on the GPU, 2:1 under the interpreter
    heads, heads_k = (4, 2) if HAS_CUDA else (2, 1)
    q, k, v, dout = qkvd((2, 77, heads, 32), (2, 93, heads_k, 32), device)
    seed, offset = 2**40 + 17, 12345
    with genoflash.use_backend(backend):
        got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(
            a, b, c, p, causal=causal, dropout_seed=seed, dropout_offset=offset), q, k, v, dout)
    d = DropoutArgs(p, seed, offset)
    truth, same = reference_pair(q, k, v, dout, fn=lambda a, b, c: attention_reference(
        a, b, c, causal=causal, dropout=d)[0])
    assert_within_rule(got, truth, same)


# Each of these runs a different tile config on the GPU (the mask's word shuffle takes shared
# memory; it overflowed the H200's at hd128 before the launcher learned to step down).
PRODUCTION_HEADS = [(64, False), (128, False), (128, True), (256, False)] if HAS_CUDA else [(128, True)]


@pytest.mark.parametrize("d,with_rope", PRODUCTION_HEADS, ids=lambda x: str(x))
def test_dropout_at_production_tile_configs(d, with_rope, device):
    torch.manual_seed(42)
    n = 700 if HAS_CUDA else 129
    q, k, v, dout = qkvd((1, n, 2, d), (1, n, 2, d), device)
    cos, sin = rotary_tables(n, d, device=device)
    rope = dict(rotary_cos=cos, rotary_sin=sin) if with_rope else {}
    with genoflash.use_backend("triton"):
        got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(
            a, b, c, 0.15, dropout_seed=5, dropout_offset=3, **rope), q, k, v, dout)
    drop = DropoutArgs(0.15, 5, 3)

    def reference(a, b, c):
        if with_rope:
            a, b = rotate(a, cos, sin), rotate(b, cos, sin)
        return attention_reference(a, b, c, dropout=drop)[0]

    truth, same = reference_pair(q, k, v, dout, fn=reference)
    assert_within_rule(got, truth, same)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_dropout_window_varlen_together(backend, device):
    torch.manual_seed(41)
    lens = [1, 17, 90, 5]
    cu_s = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)
    q, k, v, dout = qkvd((sum(lens), 2, 32), (sum(lens), 2, 32), device)
    cos, sin = rotary_tables(90, 32, device=device)
    d = DropoutArgs(0.2, 99, 7)
    kw = dict(causal=True, window_size=(20, -1))
    with genoflash.use_backend(backend):
        got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_varlen_func(
            a, b, c, cu_s, cu_s, 90, 90, 0.2, rotary_cos=cos, rotary_sin=sin, dropout_seed=99, dropout_offset=7,
            **kw), q, k, v, dout)

    def rotated_then_reference(a, b, c):  # positions restart at 0 in each sequence
        bounds = cu_s.tolist()
        a, b = (rotate_packed(x, cos, sin, bounds, [0] * len(lens)) for x in (a, b))
        return attention_reference_varlen(a, b, c, cu_s, cu_s, dropout=d, **kw)[0]

    truth, same = reference_pair(q, k, v, dout, fn=rotated_then_reference)
    assert_within_rule(got, truth, same)


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeds(backend, device):
    """Same seed: bitwise the same. Another seed: another mask. No seed: torch's generator decides."""
    torch.manual_seed(42)
    q, k, v, _ = qkvd((1, 64, 2, 16), (1, 64, 2, 16), device)
    with genoflash.use_backend(backend):
        def run(**kw):
            return genoflash.flash_attn_func(q, k, v, 0.3, **kw)
        assert torch.equal(run(dropout_seed=5), run(dropout_seed=5))
        assert not torch.equal(run(dropout_seed=5), run(dropout_seed=6))
        assert not torch.equal(run(dropout_seed=5), run(dropout_seed=5, dropout_offset=1))
        torch.manual_seed(123)
        first = run()
        torch.manual_seed(123)
        assert torch.equal(first, run())
        assert not torch.equal(first, run())  # the generator moved on


def test_one_compiled_kernel_serves_every_seed(device):
    """Seeds and offsets change every call: they must not pick new kernel variants (Triton types
    ints by size and specialises on divisibility by 16), and seeds at the top of the range, whose
    bit 62 sits next to the tag bit the host sets (dropout.KERNEL_SEED_TAG), must keep their mask."""
    from genoflash.ops.attention import backward, forward
    from genoflash.ops.attention.dropout import KERNEL_SEED_TAG, kernel_seed

    assert kernel_seed(DropoutArgs(0.1, 5, 0)) == 5 | KERNEL_SEED_TAG
    kernels = (forward._attn_fwd_kernel, backward._attn_bwd_dkdv_kernel, backward._attn_bwd_dq_kernel)
    for kernel in kernels:  # a JITFunction on the GPU; in the interpreter its kwargs are kept
        unspecialised = ({p.name for p in kernel.params if p.do_not_specialize} if hasattr(kernel, "params")
                         else set(kernel.kwargs["do_not_specialize"]))
        assert unspecialised == {"dropout_seed", "dropout_offset"}
    torch.manual_seed(45)
    q, k, v, dout = qkvd((1, 40, 2, 16), (1, 40, 2, 16), device)

    def run(seed, offset):
        with genoflash.use_backend("triton"):
            return outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(
                a, b, c, 0.3, dropout_seed=seed, dropout_offset=offset), q, k, v, dout)

    def compiled():  # kernels compiled so far (the interpreter compiles nothing)
        return [sum(len(cache[0]) for cache in getattr(kernel, "device_caches", {}).values()) for kernel in kernels]

    run(2**40 + 17, 3)
    before = compiled()
    for seed, offset in ((16, 0), (1, 1), (2**31 + 32, 48), (2**63 - 1, 2**31 - 1)):
        got = run(seed, offset)
        d = DropoutArgs(0.3, seed, offset)
        truth, same = reference_pair(q, k, v, dout, fn=lambda a, b, c: attention_reference(a, b, c, dropout=d)[0])
        assert_within_rule(got, truth, same)
    assert compiled() == before


def test_p_zero_is_exactly_no_dropout(device):
    torch.manual_seed(43)
    q, k, v, _ = qkvd((1, 50, 2, 16), (1, 50, 2, 16), device)
    with genoflash.use_backend("triton"):
        assert torch.equal(genoflash.flash_attn_func(q, k, v, 0.0, causal=True),
                           genoflash.flash_attn_func(q, k, v, causal=True))


def test_keep_rate_matches_one_minus_p():
    # 8 random bits per score: p is rounded to a multiple of 1/256 (0.1 -> 26/256 = 0.1016).
    for p, effective in ((0.1, 26 / 256), (0.5, 0.5), (0.9, 230 / 256), (1 / 512, 1 / 256)):
        assert DropoutArgs(p, 0, 0).effective_p == effective
        assert DropoutArgs(p, 0, 0).rescale == pytest.approx(1 / (1 - effective), rel=1e-12)
        keep = genoflash.dropout_mask(4, 8, 256, 256, p, seed=2024)
        assert keep.dtype == torch.bool and keep.shape == (4, 8, 256, 256)
        assert abs(keep.float().mean().item() - (1 - effective)) < 1.5e-3  # 2M draws: sd <= 3.5e-4


def test_neighbouring_keys_drop_independently():
    """Each key's 8 bits are its own: a shuffle that reused a byte, a word or a Philox call for
    two keys would correlate them. Joint keep rate of keys j and j + lag = (1 - p)^2 for every
    lag inside and just past one 16-key Philox group."""
    p = 0.5
    keep = genoflash.dropout_mask(2, 4, 256, 512, p, seed=7).float()
    for lag in range(1, 18):
        joint = (keep[..., :-lag] * keep[..., lag:]).mean().item()
        assert abs(joint - (1 - p) ** 2) < 4e-3, lag  # 1M pairs: sd ~ 4e-4
    # Every key offset inside a 16-key Philox group keeps at the same rate.
    per_slot = keep.view(2, 4, 256, 32, 16).mean(dim=(0, 1, 2, 3))
    assert (per_slot - (1 - p)).abs().max().item() < 0.01  # 32k draws each: sd ~ 2.8e-3


def test_mean_over_seeds_converges_to_no_dropout(device):
    """E[dropout attention] = attention: the average over seeds approaches it like 1/sqrt(K)."""
    torch.manual_seed(44)
    q, k, v, _ = qkvd((1, 32, 1, 16), (1, 32, 1, 16), device, dtype=torch.float32)
    with genoflash.use_backend("triton"):
        exact = genoflash.flash_attn_func(q, k, v)
        samples = torch.stack([genoflash.flash_attn_func(q, k, v, 0.5, dropout_seed=s) for s in range(64)])
    single = (samples[0] - exact).abs().mean()
    averaged = (samples.mean(0) - exact).abs().mean()
    assert averaged < 0.25 * single  # 1/sqrt(64) = 0.125 expected


def test_kernel_mask_is_the_debug_mask(device):
    """With v = identity rows and no softmax spread (one visible key per query: window (0, 0)),
    out = P_dropped V exposes the kernel's keep decision on the diagonal directly."""
    n, p = 64, 0.4
    q = torch.randn(1, n, 2, 16, device=device)
    v = torch.ones(1, n, 2, 16, device=device)
    with genoflash.use_backend("triton"):
        out = genoflash.flash_attn_func(q, q, v, p, window_size=(0, 0), dropout_seed=77, dropout_offset=3)
    kept = out[0, :, :, 0].T > 0  # (nheads, n): kept -> 1 / (1 - p), dropped -> 0
    mask = genoflash.dropout_mask(1, 2, n, n, p, seed=77, offset=3, device=device)[0]
    assert torch.equal(kept, mask.diagonal(dim1=-2, dim2=-1))


@pytest.mark.parametrize("p,error", [(-0.1, ValueError), (1.0, ValueError), ("0.1", TypeError), (True, TypeError),
                                     (0.001, ValueError), (0.999, ValueError)])  # round to 0/256 and 256/256
def test_bad_dropout_p(p, error):
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(error, match="dropout_p"):
        genoflash.flash_attn_func(q, q, q, p)


def test_bad_dropout_seed():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="dropout_seed"):
        genoflash.flash_attn_func(q, q, q, 0.1, dropout_seed=-1)
    with pytest.raises(ValueError, match="dropout_offset"):
        genoflash.flash_attn_func(q, q, q, 0.1, dropout_seed=1, dropout_offset=2**31)


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
def test_return_attn_probs_is_flash_attns_dropout_encoded_softmax(varlen, dropout_p, device):
    """(out, lse, S_dmask): |S_dmask| is the softmax, its sign the kernels' keep mask; kept
    probabilities, rescaled, times v give the output."""
    torch.manual_seed(21)
    lengths_q, lengths_k = [5, 17], [9, 17]
    seed, offset = 1234, 32
    kw = dict(causal=True, dropout_seed=seed, dropout_offset=offset, return_attn_probs=True)
    if varlen:
        q = torch.randn(sum(lengths_q), 2, 16, device=device)
        k, v = (torch.randn(sum(lengths_k), 1, 16, device=device) for _ in range(2))
        cu_q, cu_k = (torch.tensor([0, n[0], sum(n)], dtype=torch.int32, device=device) for n in (lengths_q, lengths_k))
        out, lse, probs = genoflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17, dropout_p, **kw)
        pieces = [(q[None, cu_q[b]:cu_q[b + 1]], k[None, cu_k[b]:cu_k[b + 1]], v[None, cu_k[b]:cu_k[b + 1]],
                   out[cu_q[b]:cu_q[b + 1]][None]) for b in range(2)]
        assert probs.shape == (2, 2, 17, 17)
    else:
        q = torch.randn(2, 17, 2, 16, device=device)
        k, v = (torch.randn(2, 17, 1, 16, device=device) for _ in range(2))
        out, lse, probs = genoflash.flash_attn_func(q, k, v, dropout_p, **kw)
        pieces = [(q[b:b + 1], k[b:b + 1], v[b:b + 1], out[b:b + 1]) for b in range(2)]
        lengths_q = lengths_k = [17, 17]
    for b, (qb, kb, vb, ob) in enumerate(pieces):
        nq, nk = lengths_q[b], lengths_k[b]
        s = probs[b, :, :nq, :nk]
        want, _ = attention_reference(qb.double(), kb.double(), vb.double(), None, True)
        softmax = torch.softmax((torch.einsum("bqhd,bkhd->bhqk", qb.double(), kb.double().expand(-1, -1, 2, -1))
                                 / 4.0).masked_fill(~torch.ones(nq, nk, dtype=torch.bool, device=device)
                                                    .tril(nk - nq), float("-inf")), -1)[0]
        torch.testing.assert_close(s.abs().double(), softmax, rtol=1e-5, atol=1e-6)
        if dropout_p:
            keep = genoflash.dropout_mask(b + 1, 2, nq, nk, dropout_p, seed, offset, device=device)[b]
            assert torch.equal(s >= 0, keep | (softmax == 0))  # -0.0 >= 0: masked entries read as kept
            assert (s < 0).any()
        else:
            assert (s >= 0).all()
            torch.testing.assert_close(ob.double(), want, rtol=1e-4, atol=1e-5)
        kept = s.clamp(min=0).double() / (1 - dropout_p)  # 0.25 is a whole 64/256: no rounding of p
        torch.testing.assert_close(ob.double(), torch.einsum("hqk,kd->qhd", kept, vb[0, :, 0].double())[None],
                                   rtol=1e-4, atol=1e-5)
    if not varlen:
        torch.testing.assert_close(probs.double().abs().sum(-1), torch.ones(2, 2, 17, dtype=torch.float64,
                                                                             device=device), rtol=0, atol=1e-6)
