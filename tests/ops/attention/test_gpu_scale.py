"""GPU-only checks at sizes the CPU cannot reach: long sequences, tensors past 2^31
elements, and peak memory that grows linearly in N. Run by tools/gpu_tests.sh after the other
tests, one at a time (whole_gpu): beside 16 workers' tests on an 80 GB card they run out of memory."""

from __future__ import annotations

import gc

import pytest
import torch

import genoflash

from tests.utils import EPS

pytestmark = [pytest.mark.gpu, pytest.mark.whole_gpu]


def sampled_rows_attention(q_rows, rows, k, v, seqlen_q, causal, softmax_scale):
    """Standard attention for a few query rows only: (batch, rows, nheads, dim), no N x N tensor.

    Matmuls in the input dtype, softmax in fp32 (fp64 for fp64), as attention_reference does."""
    acc = torch.float64 if q_rows.dtype == torch.float64 else torch.float32
    scores = torch.einsum("brhd,bkhd->bhrk", q_rows, k).to(acc) * softmax_scale
    if causal:
        j = torch.arange(k.shape[1], device=k.device)
        visible = j[None, :] <= rows[:, None] + (k.shape[1] - seqlen_q)
        scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0).to(v.dtype)
    return torch.einsum("bhrk,bkhd->brhd", probs, v)


def sampled_loss_grads(q, k, v, rows, dout_rows, causal, dtype):
    """Gradients of sum(out[:, rows] * dout_rows) through sampled-row standard attention in `dtype`."""
    q_, k_, v_ = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    out_rows = sampled_rows_attention(q_[:, rows], rows, k_, v_, q.shape[1], causal, q.shape[-1] ** -0.5)
    dq, dk, dv = torch.autograd.grad(out_rows, (q_, k_, v_), dout_rows.to(dtype))
    return out_rows, dq[:, rows], dk, dv


def check_sampled_rows(q, k, v, causal, n_rows=256):
    """genoflash vs fp64 sampled-row ground truth, under the rule, with bf16 standard attention
    (on the same rows) as the yardstick."""
    rows = torch.randperm(q.shape[1], device=q.device)[:n_rows].sort().values
    dout_rows = torch.randn(q.shape[0], len(rows), *q.shape[2:], device=q.device, dtype=q.dtype)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out = genoflash.flash_attn_func(qg, kg, vg, causal=causal)
    dout = torch.zeros_like(out)
    dout[:, rows] = dout_rows
    dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
    got = (out[:, rows], dq[:, rows], dk, dv)
    truth = sampled_loss_grads(q, k, v, rows, dout_rows, causal, torch.float64)
    same = sampled_loss_grads(q, k, v, rows, dout_rows, causal, q.dtype)
    for name, g, t, s in zip(("out", "dq", "dk", "dv"), got, truth, same):
        assert not torch.isnan(g).any(), name
        err = (g.double() - t).abs().max().item()
        err_std = (s.double() - t).abs().max().item()
        eps = EPS[q.dtype] * max(t.abs().max().item(), 1.0)
        assert err <= 2 * err_std + eps, f"{name}: {err:.3e} > 2 x {err_std:.3e} + {eps:.1e}"
    # Rows outside the sample got no upstream gradient: their dq must be exactly 0.
    others = torch.ones(q.shape[1], dtype=torch.bool, device=q.device)
    others[rows] = False
    assert (dq[:, others] == 0).all()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
# 70,001 keys: past configs.FORWARD_KEY_CHUNK (65,536), so the full (non-causal) forward runs as
# two launches with the softmax state carried between them, the second over a ragged 4,465-key
# chunk; the causal one stays one launch.
@pytest.mark.parametrize("seqlen", [4097, 16384, 65536, 70001])
def test_long_sequences_sampled_rows(seqlen, causal):
    torch.manual_seed(seqlen)
    q, k, v = (torch.randn(1, seqlen, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    check_sampled_rows(q, k, v, causal)


def test_unequal_long_lengths():
    torch.manual_seed(7)
    q = torch.randn(1, 20000, 4, 96, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 33333, 4, 96, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    check_sampled_rows(q, k, v, causal=True)


@pytest.mark.parametrize("deterministic", [True, False], ids=["two-pass", "one-pass"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tensors_past_2_31_elements(causal, deterministic):
    """batch 65 x 16 heads x 16,384 x 128 = 2.18e9 elements: the last batch element starts past
    element 2^31. It must equal the same element computed alone, bit for bit, in every output
    and gradient (the per-head computation does not depend on the batch size). With
    deterministic=False (on an H200 the Gluon backward, whose dQ is summed in no fixed order) dQ
    may differ in its last bits, and nothing else may."""
    torch.manual_seed(8)
    shape = (65, 16384, 16, 128)
    assert shape[0] * shape[1] * shape[2] * shape[3] > 2**31
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (t.requires_grad_() for t in (q, k, v))
    out = genoflash.flash_attn_func(qg, kg, vg, causal=causal, deterministic=deterministic)
    big = (out[-1:].clone(), *(g[-1:].clone() for g in torch.autograd.grad(out, (qg, kg, vg), dout)))
    del out
    torch.cuda.empty_cache()
    q1, k1, v1 = (t[-1:].detach().clone().requires_grad_() for t in (q, k, v))
    out1 = genoflash.flash_attn_func(q1, k1, v1, causal=causal, deterministic=deterministic)
    alone = (out1, *torch.autograd.grad(out1, (q1, k1, v1), dout[-1:]))
    for name, a, b in zip(("out", "dq", "dk", "dv"), big, alone):
        if name == "dq" and not deterministic:  # one rounding of a float32 sum to bf16: 2 ulp at most
            tol = 2 * 2.0 ** -8 * b.float().abs().max().item()
            assert (a.float() - b.float()).abs().max().item() <= tol, "dq of the last batch element differs past 2^31"
        else:
            assert torch.equal(a, b), f"{name} of the last batch element differs past 2^31"
    check_sampled_rows(q1.detach(), k1.detach(), v1.detach(), causal, n_rows=64)


def peak_fwd_bwd_bytes(seqlen, nheads=8, headdim=128, deterministic=True):
    # An earlier test's tensors held in reference cycles (same xdist worker) would be freed whenever
    # the garbage collector next runs: inside the window below, that lowers memory_allocated under
    # `base` and the peak reads too small (seen on the H200: 163 MiB at N = 32k, where the four
    # outputs alone take 256 MiB). Collect first, and keep the collector off while measuring.
    gc.collect()
    torch.cuda.empty_cache()
    q, k, v, dout = (torch.randn(1, seqlen, nheads, headdim, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    qg, kg, vg = (t.requires_grad_() for t in (q, k, v))
    torch.cuda.synchronize()
    gc.disable()
    try:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = genoflash.flash_attn_func(qg, kg, vg, deterministic=deterministic)
        grads = torch.autograd.grad(out, (qg, kg, vg), dout)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    finally:
        gc.enable()
    del out, grads
    return peak


@pytest.mark.parametrize("mode", ["deterministic", "one-pass", "one-pass-short-of-memory"])
def test_peak_memory_is_linear_in_seqlen(mode, monkeypatch):
    """Peak extra memory for fwd+bwd at N = 16k, 32k, 64k: exactly what the outputs, gradients,
    LSE and delta must occupy (plus, for the one-pass Hopper backward, its float32 dQ
    accumulator), so it doubles with N and has no N^2 term. Short of free memory the one-pass
    backward stands aside and the peak is the floor again."""
    from genoflash.ops.attention import backward_sm90
    if mode == "one-pass-short-of-memory":
        monkeypatch.setattr(backward_sm90, "ACCUM_MAX_FREE_FRACTION", 0.0)
    one_pass = mode == "one-pass" and torch.cuda.get_device_capability() == (9, 0)
    # fast_launch off: a launch plan recorded by another mode's call of this shape would replay its
    # choice of backward, which the constant patched above is meant to change
    with genoflash.settings(fast_launch=False):
        peaks = {n: peak_fwd_bwd_bytes(n, deterministic=mode == "deterministic") for n in (16384, 32768, 65536)}
    for n, peak in peaks.items():
        tensor = n * 8 * 128 * 2  # one (1, n, 8, 128) bf16 tensor
        # out, dq, dk, dv (4 tensors) + lse and delta (fp32, n * 8 each).
        must = 4 * tensor + 2 * n * 8 * 4
        if one_pass:
            must += backward_sm90.accumulator_bytes(torch.empty(1, n, 8, 128, device="meta"))
        assert peak <= 1.05 * must, f"N={n}: peak {peak / 2**20:.1f} MiB > 1.05 x {must / 2**20:.1f} MiB"
        # out, dq, dk and dv are all alive at the end: a smaller peak means the measurement is wrong.
        assert peak >= 4 * tensor, (f"N={n}: peak {peak / 2**20:.1f} MiB is under what the four "
                                    f"outputs take, {4 * tensor / 2**20:.1f} MiB")
        if one_pass:  # and the accumulator was there: the one-pass kernel ran
            assert peak >= 5.5 * tensor, f"N={n}: peak {peak / 2**20:.1f} MiB: no dQ accumulator?"
    assert abs(peaks[32768] / peaks[16384] - 2) < 0.05
    assert abs(peaks[65536] / peaks[32768] - 2) < 0.05


def test_grid_with_more_than_65535_heads():
    """batch * nheads = 70,400 programs per row block: more than a grid's y/z axes could hold."""
    from tests.utils import assert_within_rule, outputs_and_grads, random_qkv, reference_pair

    torch.manual_seed(9)
    q, k, v, dout = random_qkv(1100, 33, 47, 64, 16, torch.bfloat16, "cuda")
    got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, causal=True), q, k, v, dout)
    truth, same = reference_pair(q, k, v, dout, causal=True)
    assert_within_rule(got, truth, same)


def test_decoding_reads_a_heads_first_cache_past_2_31_elements():
    """transformers keeps its KV cache heads-first, (batch, heads, capacity, dim), and decoding reads
    it in place: here K/V head 16's keys start 16 * 2^21 * 64 = 2^31 elements in (an int32 head
    offset wrapped there and read out of bounds)."""
    torch.manual_seed(10)
    nheads_k, n, d = 17, 2**21, 64
    kh = torch.randn(1, nheads_k, n, d, device="cuda", dtype=torch.bfloat16)
    vh = torch.randn_like(kh)
    q = torch.randn(1, 1, 2 * nheads_k, d, device="cuda", dtype=torch.bfloat16)  # GQA 2:1
    # One key per checked head that its query picks out (score ~ 8 |q|^2 / sqrt(d), far above the
    # rest): the output is that key's value, O(1), so reading another head's keys cannot pass.
    for h, j in ((0, 12345), (2 * nheads_k - 1, n - 7)):
        kh[0, h // 2, j] = 8 * q[0, 0, h]
    out = genoflash.flash_attn_with_kvcache(q, kh.transpose(1, 2), vh.transpose(1, 2))
    for h in (0, 2 * nheads_k - 1):
        s = (q[0, 0, h].float() @ kh[0, h // 2].float().T) * d**-0.5
        want = torch.softmax(s, -1) @ vh[0, h // 2].float()
        torch.testing.assert_close(out[0, 0, h].float(), want, rtol=0, atol=2e-2)
    del kh, vh
    gc.collect()
    torch.cuda.empty_cache()
