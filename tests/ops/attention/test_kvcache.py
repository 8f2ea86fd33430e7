"""flash_attn_with_kvcache against a float64 reference built one sequence at a time: new tokens
appended in place (contiguous and paged caches, cache_batch_idx, left padding), RoPE at flash-attn's
positions, the masks counted from the first key, GQA, and the cache's contents after the call."""

from __future__ import annotations

import pytest
import torch

import genoflash
from genoflash.ops.attention.reference import attention_reference
from genoflash.ops.rotary import rotary_reference, rotary_tables

from tests.utils import EPS, HAS_CUDA

BACKENDS = ["triton", "torch"]
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if HAS_CUDA else [])

pytestmark = pytest.mark.usefixtures("poison_allocations")


def reference(q, k_rows, v_rows, seqlens, leftpad, k_new, v_new, cos, sin, interleaved, causal, window, softcap,
              alibi, dtype):
    """Per sequence b: its cache row (k_rows[b], as it was) with the new tokens written at
    seqlens[b] (rotated at their slots), keys from leftpad[b]; q rotated at flash-attn's positions;
    standard attention in `dtype`. Returns (out, lse, the rows after the append)."""
    outs, lses, rows_k, rows_v = [], [], [], []
    batch, seqlen_q = q.shape[:2]
    for b in range(batch):
        kb, vb, qb = k_rows[b].to(dtype).clone(), v_rows[b].to(dtype).clone(), q[b:b + 1].to(dtype)
        n, p = seqlens[b], leftpad[b]
        c, s = (cos.to(dtype), sin.to(dtype)) if cos is not None and dtype == torch.float64 else (cos, sin)
        if k_new is not None:
            new_k = k_new[b:b + 1].to(dtype)
            if cos is not None:
                new_k = rotary_reference(new_k, c, s, interleaved, [n])
            kb[n:n + k_new.shape[1]] = new_k[0]
            vb[n:n + k_new.shape[1]] = v_new[b].to(dtype)
        rows_k.append(kb)
        rows_v.append(vb)
        if cos is not None:
            if causal or window != (-1, -1):
                qb = rotary_reference(qb, c, s, interleaved, [n])
            else:  # every query at slot n
                qb = torch.cat([rotary_reference(qb[:, i:i + 1], c, s, interleaved, [n]) for i in range(seqlen_q)], 1)
        end = n + (0 if k_new is None else k_new.shape[1])
        keys, values = kb[None, p:end], vb[None, p:end]
        group = q.shape[2] // keys.shape[2]
        keys, values = (t.repeat_interleave(group, dim=2) for t in (keys, values))
        out, lse = attention_reference(qb, keys, values, None, causal, window, softcap,
                                       None if alibi is None else alibi[b] if alibi.dim() == 2 else alibi)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses), torch.stack(rows_k), torch.stack(rows_v)


def within_rule(got, truth, same, name):
    assert not torch.isnan(got).any(), f"{name}: NaN"
    err = (got.double() - truth).abs().max().item()
    err_std = (same.double() - truth).abs().max().item()
    eps = EPS[got.dtype] * max(truth.abs().max().item(), 1.0)
    assert err <= 2 * err_std + eps, f"{name}: error {err:.3e} > 2 x {err_std:.3e} + {eps:.1e}"


CASES = {  # batch, seqlen_q, nheads, nheads_k, headdim, seqlens, seqlen_new, leftpad, extra arguments
    "decode-one-token": (3, 1, 4, 2, 40, [0, 16, 128], 1, None, {}),
    "prefill-causal": (2, 17, 2, 2, 24, [5, 0], 17, None, dict(causal=True)),
    "no-new-tokens": (2, 3, 4, 1, 16, [1, 129], 0, None, dict(causal=True)),
    "left-padding": (2, 2, 2, 1, 16, [20, 9], 2, [7, 9], dict(causal=True)),
    "window-softcap-alibi": (2, 5, 2, 2, 16, [40, 12], 5, None, dict(causal=True, window_size=(8, 0), softcap=5.0,
                                                                    alibi=True)),
    "rotary-causal": (2, 3, 2, 1, 32, [17, 60], 3, None, dict(causal=True, rotary=True)),
    "rotary-full": (2, 3, 2, 1, 32, [17, 60], 3, [4, 0], dict(rotary=True, interleaved=False)),
}


@pytest.mark.parametrize("backend,num_splits", [("triton", 0), ("triton", 5), ("torch", 0)],
                         ids=["triton", "triton-5-splits", "torch"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_the_float64_reference(backend, num_splits, dtype, layout, case, device):
    """On the triton backend every case decodes (decode.py); 5 splits of at most 129 keys leave
    parts that end inside a tile and parts with no key at all. The slots past each sequence's end
    hold NaN."""
    batch, seqlen_q, nheads, nheads_k, d, seqlens, seqlen_new, leftpad, extra = CASES[case]
    paged = layout == "paged"
    if paged and leftpad is not None:
        pytest.skip("cache_leftpad goes with a contiguous cache")
    torch.manual_seed(sum(seqlens) + seqlen_q)
    capacity, page = 144, 16  # a paged sequence may fill past the last row of a page
    q = torch.randn(batch, seqlen_q, nheads, d, dtype=dtype, device=device)
    rows_k = torch.randn(batch, capacity, nheads_k, d, dtype=dtype, device=device)
    rows_v = torch.randn(batch, capacity, nheads_k, d + 8, dtype=dtype, device=device)
    k_new = v_new = None
    if seqlen_new:
        k_new = torch.randn(batch, seqlen_new, nheads_k, d, dtype=dtype, device=device)
        v_new = torch.randn(batch, seqlen_new, nheads_k, d + 8, dtype=dtype, device=device)
    cos = sin = None
    # Slots past each sequence's end (after the append) hold NaN: no kernel may let them reach an
    # output, though a tile reads them.
    ends = [n + seqlen_new for n in seqlens]
    for b, end in enumerate(ends):
        rows_k[b, end:] = rows_v[b, end:] = float("nan")
    if extra.get("rotary"):
        cos, sin = rotary_tables(capacity, 24, device=device)  # rotary_dim 24 < headdim 32
    interleaved = extra.get("interleaved", True)
    alibi = torch.rand(batch, nheads, device=device) if extra.get("alibi") else None
    causal, window, softcap = extra.get("causal", False), extra.get("window_size", (-1, -1)), extra.get("softcap", 0.0)
    kw = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=torch.tensor(seqlens, dtype=torch.int32, device=device),
              cache_leftpad=None if leftpad is None else torch.tensor(leftpad, dtype=torch.int32, device=device),
              causal=causal, window_size=window, softcap=softcap, rotary_interleaved=interleaved, alibi_slopes=alibi,
              num_splits=num_splits, return_softmax_lse=True)
    if paged:  # the pages of the sequences shuffled through a pool with spare pages
        pages = capacity // page
        order = torch.randperm(batch * pages + 3, device=device)[:batch * pages].view(batch, pages)
        k_cache = torch.randn(batch * pages + 3, page, nheads_k, d, dtype=dtype, device=device)
        v_cache = torch.randn(batch * pages + 3, page, nheads_k, d + 8, dtype=dtype, device=device)
        k_cache[order.flatten()] = rows_k.reshape(-1, page, nheads_k, d)
        v_cache[order.flatten()] = rows_v.reshape(-1, page, nheads_k, d + 8)
        kw["block_table"] = order.to(torch.int32)
    else:  # the sequences in a larger cache, in another order
        k_cache = torch.randn(batch + 2, capacity, nheads_k, d, dtype=dtype, device=device)
        v_cache = torch.randn(batch + 2, capacity, nheads_k, d + 8, dtype=dtype, device=device)
        idx = torch.randperm(batch + 2, device=device)[:batch]
        k_cache[idx], v_cache[idx] = rows_k, rows_v
        kw["cache_batch_idx"] = idx.to(torch.int32)
    with genoflash.use_backend(backend):
        out, lse = genoflash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **kw)
    args = (q, rows_k, rows_v, seqlens, leftpad or [0] * batch, k_new, v_new, cos, sin, interleaved, causal, window,
            softcap, alibi)
    truth = reference(*args, torch.float64)
    same = reference(*args, dtype)
    within_rule(out, truth[0], same[0], "out")
    finite = torch.isfinite(truth[1])
    assert torch.equal(torch.isfinite(lse), finite)
    atol = 1e-5 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(lse[finite].double(), truth[1][finite], rtol=0, atol=atol)
    # The cache now holds the (rotated) new tokens where they belong, and nothing else changed.
    after_k = k_cache[kw["block_table"].long()].reshape(batch, capacity, nheads_k, d) if paged else k_cache[idx]
    after_v = v_cache[kw["block_table"].long()].reshape(batch, capacity, nheads_k, d + 8) if paged else v_cache[idx]
    for b, end in enumerate(ends):
        within_rule(after_k[b, :end], truth[2][b, :end], same[2][b, :end], "k_cache")
    torch.testing.assert_close(after_v, same[3], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(after_k.isnan(), same[2].isnan(), rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_whole_cache_is_read_in_place(backend, device):
    """A prefill too long to decode (65 queries x 2 heads per KV head > decode.MAX_ROWS), with
    cache_seqlens None (every slot filled) and rows in order: the call reads the cache as it lies and
    equals flash_attn_func on it."""
    torch.manual_seed(11)
    q = torch.randn(2, 65, 4, 16, device=device)
    k_cache, v_cache = (torch.randn(2, 80, 2, 16, device=device) for _ in range(2))
    with genoflash.use_backend(backend):
        got = genoflash.flash_attn_with_kvcache(q, k_cache, v_cache)
        want = genoflash.flash_attn_func(q, k_cache, v_cache)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_int_cache_seqlens_and_decoding_step_by_step(device):
    """Decoding token by token into a cache equals attention over the whole sequence at each step."""
    torch.manual_seed(12)
    k_all, v_all = (torch.randn(1, 9, 2, 16, device=device) for _ in range(2))
    q_all = torch.randn(1, 9, 2, 16, device=device)
    k_cache, v_cache = (torch.zeros(1, 16, 2, 16, device=device) for _ in range(2))
    with genoflash.use_backend("torch"):
        for t in range(9):
            got = genoflash.flash_attn_with_kvcache(q_all[:, t:t + 1], k_cache, v_cache, k_all[:, t:t + 1],
                                                    v_all[:, t:t + 1], cache_seqlens=t, causal=True)
            want = genoflash.flash_attn_func(q_all[:, t:t + 1], k_all[:, :t + 1], v_all[:, :t + 1], causal=True)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k_cache[:, :9], k_all, rtol=0, atol=0)


@pytest.mark.parametrize("kw,error,match", [
    (dict(cache_seqlens=torch.tensor([10, 31], dtype=torch.int32)), ValueError, r"cache_seqlens\[1\] = 31 plus 2 new"),
    (dict(cache_seqlens=torch.tensor([1, 2])), None, None),  # int64 is taken
    (dict(cache_seqlens=torch.tensor([1.0, 2.0])), TypeError, "cache_seqlens must be an int32 tensor"),
    (dict(cache_seqlens=None), ValueError, "cache_seqlens must be given with new k and v"),
    (dict(cache_leftpad=torch.tensor([3, 0], dtype=torch.int32)), ValueError, r"cache_leftpad\[0\] = 3"),
    (dict(cache_batch_idx=torch.tensor([0, 2], dtype=torch.int32)), ValueError, "cache_batch_idx must index"),
    (dict(cache_batch_idx=torch.tensor([1, 1], dtype=torch.int32)), ValueError, "repeats a row"),
    (dict(block_table=torch.zeros(2, 2, dtype=torch.int64)), TypeError, "block_table must be an int32"),
    (dict(block_table=torch.tensor([[0, 1], [9, 2]], dtype=torch.int32)), ValueError, r"pages in \[0, 8\)"),
    (dict(num_splits=-1), ValueError, "num_splits must be an int >= 0"),
    (dict(rotary_cos=torch.ones(4, 4)), ValueError, "rotary_cos and rotary_sin must be given together"),
    (dict(rotary_cos=torch.ones(3, 4), rotary_sin=torch.ones(3, 4)), ValueError, "tables cover 3 positions"),
])
def test_bad_input_names_the_argument(kw, error, match):
    q = torch.randn(2, 2, 2, 16)
    k_cache, v_cache = torch.zeros(2, 32, 1, 16), torch.zeros(2, 32, 1, 16)
    k, v = torch.randn(2, 2, 1, 16), torch.randn(2, 2, 1, 16)
    args = dict(cache_seqlens=torch.tensor([1, 2], dtype=torch.int32))
    args.update(kw)
    if "block_table" in kw:
        k_cache, v_cache = torch.zeros(8, 16, 1, 16), torch.zeros(8, 16, 1, 16)
    if error is None:
        genoflash.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, **args)
        return
    with pytest.raises(error, match=match):
        genoflash.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, **args)
    assert not k_cache.any()  # nothing was written before the error


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seqlens", [[0, 5], [0, 0]], ids=["one-empty", "all-empty"])
def test_a_sequence_without_keys_gets_zeros_and_minus_inf(backend, seqlens, device):
    torch.manual_seed(13)
    q = torch.randn(2, 1, 2, 16, device=device)
    k_cache, v_cache = (torch.randn(2, 8, 2, 16, device=device) for _ in range(2))
    with genoflash.use_backend(backend):
        out, lse = genoflash.flash_attn_with_kvcache(q, k_cache, v_cache, return_softmax_lse=True,
                                                     cache_seqlens=torch.tensor(seqlens, dtype=torch.int32,
                                                                                device=device))
    for b, n in enumerate(seqlens):
        if n == 0:
            assert (out[b] == 0).all() and (lse[b] == -torch.inf).all()
        else:
            want = genoflash.flash_attn_func(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n])
            torch.testing.assert_close(out[b:b + 1], want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_varlen_with_a_block_table_equals_the_packed_keys(backend, device):
    """flash_attn_varlen_func(..., block_table=): keys read from shuffled pages (one sequence filling
    past a page's last row) give the packed call's output, and the gradients land in the pages."""
    torch.manual_seed(14)
    lengths, page = [21, 7], 8
    cu_q = torch.tensor([0, 3, 5], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 21, 28], dtype=torch.int32, device=device)
    q = torch.randn(5, 4, 16, device=device, requires_grad=True)
    k_packed, v_packed = (torch.randn(28, 2, 16, device=device) for _ in range(2))
    table = torch.tensor([[4, 0, 2], [3, 5, 1]], dtype=torch.int32, device=device)
    k_pages, v_pages = (torch.randn(6, page, 2, 16, device=device) for _ in range(2))
    for b, (start, n) in enumerate(zip([0, 21], lengths)):
        for t in range(n):
            k_pages[table[b, t // page], t % page] = k_packed[start + t]
            v_pages[table[b, t // page], t % page] = v_packed[start + t]
    k_pages.requires_grad_()
    v_pages.requires_grad_()
    k_packed.requires_grad_()
    v_packed.requires_grad_()
    dout = torch.randn(5, 4, 16, device=device)
    with genoflash.use_backend(backend):
        got = genoflash.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 3, 21, causal=True, block_table=table)
        want = genoflash.flash_attn_varlen_func(q, k_packed, v_packed, cu_q, cu_k, 3, 21, causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    dk_pages, = torch.autograd.grad(got, k_pages, dout)
    dk_packed, = torch.autograd.grad(want, k_packed, dout)
    for b, (start, n) in enumerate(zip([0, 21], lengths)):
        for t in range(n):
            torch.testing.assert_close(dk_pages[table[b, t // page], t % page], dk_packed[start + t], rtol=0, atol=0)
    with pytest.raises(ValueError, match="block_table holds 24 per sequence"):
        genoflash.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, torch.tensor([0, 25, 28], dtype=torch.int32,
                                                                                 device=device), 3, 25,
                                         block_table=table)


def test_decoding_reads_pages_in_place(device, monkeypatch):
    """The decoding kernel reads a paged cache through its block table: no key is gathered, and the
    answer is the gathered path's."""
    from genoflash.ops.attention import kvcache

    torch.manual_seed(13)
    q = torch.randn(2, 1, 4, 16, device=device)
    k_cache, v_cache = (torch.randn(9, 16, 2, 16, device=device) for _ in range(2))
    table = torch.randperm(9, device=device)[:8].view(2, 4).to(torch.int32)
    seqlens = torch.tensor([50, 17], dtype=torch.int32, device=device)
    with genoflash.use_backend("torch"):
        want = genoflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table)

    def no_gather(*args, **kwargs):
        raise AssertionError("the decoding path gathered the keys")

    monkeypatch.setattr(kvcache, "gather", no_gather)
    with genoflash.use_backend("triton"):
        got = genoflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                                num_splits=3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unchecked_indices_give_the_same_answer_without_reading_them(backend, device, monkeypatch):
    """settings(check_indices=False): the decoding path never reads an index tensor to the host
    (a spy on Tensor.tolist), appends and rotates on the device, and answers as the checked call."""
    torch.manual_seed(14)
    batch, nheads, nheads_k, d = 2, 4, 2, 32
    q = torch.randn(batch, 1, nheads, d, device=device)
    k_new, v_new = (torch.randn(batch, 1, nheads_k, d, device=device) for _ in range(2))
    k_cache, v_cache = (torch.randn(9, 16, nheads_k, d, device=device) for _ in range(2))
    table = torch.randperm(9, device=device)[:8].view(batch, 4).to(torch.int32)
    seqlens = torch.tensor([40, 16], dtype=torch.int32, device=device)
    cos, sin = rotary_tables(64, d, device=device)
    kw = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens, block_table=table, causal=True)
    caches = [(k_cache.clone(), v_cache.clone()) for _ in range(2)]
    with genoflash.use_backend(backend):
        want = genoflash.flash_attn_with_kvcache(q, *caches[0], k_new, v_new, **kw)
        reads = []
        real_tolist = torch.Tensor.tolist
        monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.shape) or real_tolist(t))
        with genoflash.settings(check_indices=False):
            got = genoflash.flash_attn_with_kvcache(q, *caches[1], k_new, v_new, **kw)
    if backend == "triton":
        assert reads == [], f"index tensors read to the host: {reads}"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[1][0], caches[0][0], rtol=0, atol=0)
    torch.testing.assert_close(caches[1][1], caches[0][1], rtol=0, atol=0)


@pytest.mark.gpu  # decoding steps replay compiled kernels, which the interpreter has not
@pytest.mark.parametrize("d", [128, 72])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_decoding_steps_equal_the_usual_launches_bit_for_bit(dtype, d):
    """decode_attention replays a kind of step it has seen (decode.py's steps) with the new
    addresses, strides and key count: a cache in transformers' layout growing step by step, with and
    without splits, with the padding mask and the LSE, read through transposed views or as it is
    (heads_first), answers bit for bit as with every launch through triton's own launcher (whose
    answers the float64 tests above check)."""
    from genoflash.ops.attention import decode

    torch.manual_seed(15)
    batch, nheads, nheads_k, capacity = 2, 8, 2, 1100
    k_all, v_all = (torch.randn(batch, nheads_k, capacity, d, device="cuda", dtype=dtype) for _ in range(2))
    mask_all = torch.rand(batch, capacity, device="cuda") > 0.1
    steps_before = len(decode._steps)
    for keys in (1, 17, 129, 1000, 1001, 1002):
        qh = torch.randn(batch, nheads, 1, d, device="cuda", dtype=dtype)
        # a fresh cache per step, as DynamicCache's torch.cat makes one: strides grow with it
        kh, vh = (t[:, :, :keys].clone() for t in (k_all, v_all))
        q, k, v = (t.transpose(1, 2) for t in (qh, kh, vh))
        mask = mask_all[:, :keys].clone()
        mask[:, -1] = True
        for splits, lse_too in ((0, False), (0, True), (1, False), (3, True)):
            kw = dict(softmax_scale=d ** -0.5, key_mask=mask, num_splits=splits, return_lse=lse_too)
            with genoflash.settings(fast_launch=False):
                want, want_lse = decode.decode_attention(q, k, v, None, keys, **kw)
            # the first call of a kind records it, the others replay it; heads_first reads
            # transformers' layout as it is, as the transposed views
            for args, heads_first in (((q, k, v), False), ((q, k, v), False), ((qh, kh, vh), True)):
                got, got_lse = decode.decode_attention(*args, None, keys, heads_first=heads_first, **kw)
                assert torch.equal(got, want)
                if lse_too:
                    assert torch.equal(got_lse, want_lse)
                else:
                    assert got_lse is None
    assert len(decode._steps) > steps_before


@pytest.mark.gpu
def test_the_combine_launched_as_a_dependent_answers_as_a_plain_launch():
    """On sm_90+ the combine kernel is a programmatic dependent of the split kernel
    (DecodeConfig.pdl): it may start before the split kernel ends, and waits for it (gdc_wait)
    before reading a part. Fresh queries every step, so a combine that read parts before they were
    written (stale ones from the step before, in the allocator's reused scratch) would differ."""
    from genoflash.ops.attention import decode

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90+")
    torch.manual_seed(16)
    k, v = (torch.randn(2, 65536, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for step in range(20):
        q = torch.randn(2, 1, 16, 128, device="cuda", dtype=torch.bfloat16)
        kw = dict(softmax_scale=128 ** -0.5, num_splits=0 if step % 2 else 64)
        with decode.use_config(pdl=False):
            want, want_lse = decode.decode_attention(q, k, v, None, 65536, **kw)
        got, got_lse = decode.decode_attention(q, k, v, None, 65536, **kw)
        assert torch.equal(got, want) and torch.equal(got_lse, want_lse), step


@pytest.mark.parametrize("programs, splits", [(8, 66), (32, 16), (128, 4), (100, 5), (528, 1), (1024, 1)])
def test_split_count_fits_programs_per_sm_rounded_down(programs, splits):
    """On a 132-SM GPU at 4 programs per SM (528 slots), a grid of `programs` (sequence, KV head)
    pairs gets the most parts that fit the slots, never more (a part more would leave some SMs a
    program more than the rest: docs/design/decoding.md, "How many parts"); at least one part; and
    no part shorter than min_keys_per_split."""
    from genoflash.ops.attention import decode

    cfg = decode.DEFAULT_CONFIG
    most = decode._splits_for(programs, 132, cfg)
    assert most == splits and most * programs <= max(cfg.programs_per_sm * 132, programs)
    assert decode._split_count(most, 1_000_000, cfg) == splits
    assert decode._split_count(most, 3 * cfg.min_keys_per_split, cfg) == min(splits, 3)


@pytest.mark.parametrize("layout", ["contiguous", "paged", "heads-first"])
@pytest.mark.parametrize("nheads, nheads_k, seqlen_q", [(4, 4, 1), (8, 4, 1), (6, 6, 3), (8, 2, 2)],
                         ids=["mha", "gqa", "mha-3-queries", "gqa-2-queries"])
def test_kv_heads_side_by_side_answer_as_one_head_per_program(layout, nheads, nheads_k, seqlen_q, device):
    """DecodeConfig.kv_heads_per_program = 2: one program reads two KV heads' channels side by
    side, each query row zero outside its own head's; every output and LSE equals one head per
    program's, in every cache layout, with NaN past each sequence's end, a causal mask and a
    sequence shorter than the split."""
    from genoflash.ops.attention import decode

    torch.manual_seed(nheads * 10 + seqlen_q)
    d, dv, capacity = 40, 48, 320
    q = torch.randn(2, seqlen_q, nheads, d, device=device)
    k = torch.randn(2, capacity, nheads_k, d, device=device)
    v = torch.randn(2, capacity, nheads_k, dv, device=device)
    lengths = [capacity, 123]
    for b, n in enumerate(lengths):
        k[b, n:] = v[b, n:] = float("nan")
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    kw = dict(softmax_scale=d ** -0.5, window_left=-1, window_right=0, num_splits=3)
    if layout == "paged":  # pages of 16 rows in the order given by a shuffled table
        order = torch.randperm(2 * capacity // 16, device=device).view(2, -1)
        pages_k, pages_v = torch.empty(2 * capacity // 16, 16, nheads_k, d, device=device), torch.empty(
            2 * capacity // 16, 16, nheads_k, dv, device=device)
        pages_k[order.flatten()] = k.reshape(-1, 16, nheads_k, d)
        pages_v[order.flatten()] = v.reshape(-1, 16, nheads_k, dv)
        args, kw["block_table"] = (q, pages_k, pages_v), order.to(torch.int32)
    elif layout == "heads-first":  # transformers' (batch, heads, capacity, dim), read in place
        args, kw["heads_first"] = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)), True
    else:
        args = (q, k, v)
    answers = []
    for heads in (1, 2):
        with decode.use_config(kv_heads_per_program=heads) as cfg:
            assert decode._geometry(2, seqlen_q, nheads, nheads_k, dv, -1, cfg)[1] == heads  # heads per program
            answers.append(decode.decode_attention(*args, seqlens, capacity, **kw))
    (out1, lse1), (out2, lse2) = answers
    assert not torch.isnan(out1).any()
    torch.testing.assert_close(out2, out1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse2, lse1, rtol=1e-5, atol=1e-5)


def test_kv_heads_side_by_side_only_where_their_rows_fit_one_block():
    """Two KV heads per program only while both heads' query rows fit tl.dot's 16-row block (a
    decoding step's few rows), and where they divide the KV heads; else one."""
    from genoflash.ops.attention import decode

    cfg = decode.DecodeConfig(kv_heads_per_program=2)
    assert decode._heads_per_program(cfg, 4, 8) == 2  # GQA 32:8, one query
    assert decode._heads_per_program(cfg, 8, 8) == 2
    assert decode._heads_per_program(cfg, 16, 8) == 1  # 32 rows: a wider block, twice the registers
    assert decode._heads_per_program(cfg, 1, 3) == 1  # 3 KV heads do not pair
    assert decode._geometry(1, 4, 32, 8, 128, -1, cfg)[1] == 1  # 4 queries x group 4
    assert decode._geometry(1, 1, 32, 8, 128, -1, cfg)[1:3] == (2, 16)


def test_device_configs_by_device_and_layout(monkeypatch):
    """A device named in DEVICE_CONFIGS decodes with its (contiguous, paged) pair, any other with
    DEFAULT_CONFIG, and use_config replaces both for every device and layout."""
    from genoflash.ops.attention import decode

    names = {0: "NVIDIA H200", 1: "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: names[index])
    decode._device_configs.cache_clear()
    try:
        contiguous, paged = decode.DEVICE_CONFIGS["H200"]
        assert decode.config_for(0, False) is contiguous and decode.config_for(0, True) is paged
        assert decode.config_for(1, False) is decode.config_for(1, True) is decode.DEFAULT_CONFIG
        assert decode.config_for(-1, True) is decode.DEFAULT_CONFIG  # the interpreter's CPU
        with decode.use_config(programs_per_sm=3) as cfg:
            assert decode.config_for(0, False) is decode.config_for(1, True) is cfg
            assert cfg.kv_heads_per_program == decode.DEFAULT_CONFIG.kv_heads_per_program
    finally:
        decode._device_configs.cache_clear()


@pytest.mark.parametrize("changes, match", [
    (dict(kv_heads_per_program=0), "kv_heads_per_program"), (dict(programs_per_sm=-1), "programs_per_sm"),
    (dict(block_n=48), "block_n"), (dict(num_warps=2.5), "num_warps"), (dict(max_splits=True), "max_splits"),
])
def test_bad_decode_config_names_the_field(changes, match):
    """`bench decode --sweep --grid` and use_config build DecodeConfigs from user values: a bad one
    is refused with the field's name, before any kernel sees it."""
    from genoflash.ops.attention import decode

    with pytest.raises(ValueError, match=match):
        with decode.use_config(**changes):
            pass
    assert decode._override is None
