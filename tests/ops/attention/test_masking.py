"""Fused masks and biases: varlen, sliding window, GQA/MQA, ALiBi, softcap and a value head dim
that differs from the key head dim; forward and all gradients against a float64 reference."""

from __future__ import annotations

import itertools

import pytest
import torch

import genoflash
from genoflash.ops.attention.configs import BackwardConfig, TileConfig, override_configs, value_blocks
from genoflash.ops.attention.dropout import DropoutArgs
from genoflash.ops.attention.reference import attention_reference, attention_reference_varlen

from tests.utils import assert_within_rule, outputs_and_grads, reference_pair
from tests.utils import HAS_CUDA

BACKENDS = ["triton", "torch"]
DTYPE = torch.bfloat16 if HAS_CUDA else torch.float16

pytestmark = pytest.mark.usefixtures("poison_allocations")


def make(shape, dtype, device, requires_grad=True):
    return torch.randn(shape, dtype=dtype, device=device).requires_grad_(requires_grad)


def check_fixed(backend, device, batch, seqlen_q, seqlen_k, nheads, nheads_k, d, dv, dtype=DTYPE, **features):
    """flash_attn_func with `features` vs attention_reference with the same features, under the rule."""
    q = make((batch, seqlen_q, nheads, d), dtype, device)
    k = make((batch, seqlen_k, nheads_k, d), dtype, device)
    v = make((batch, seqlen_k, nheads_k, dv), dtype, device)
    dout = torch.randn(batch, seqlen_q, nheads, dv, dtype=dtype, device=device)
    with genoflash.use_backend(backend):
        got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, **features), q, k, v, dout)
    ref_features = {name: x for name, x in features.items() if name != "deterministic"}  # kernels' choice only
    truth, same = reference_pair(q, k, v, dout, fn=lambda a, b, c: attention_reference(a, b, c, **ref_features)[0])
    assert_within_rule(got, truth, same)


def cu(lengths, device):
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


def check_varlen(backend, device, lens_q, lens_k, nheads, nheads_k, d, dv, dtype=DTYPE, **features):
    cu_q, cu_k = cu(lens_q, device), cu(lens_k, device)
    q = make((sum(lens_q), nheads, d), dtype, device)
    k = make((sum(lens_k), nheads_k, d), dtype, device)
    v = make((sum(lens_k), nheads_k, dv), dtype, device)
    dout = torch.randn(sum(lens_q), nheads, dv, dtype=dtype, device=device)
    with genoflash.use_backend(backend):
        got = outputs_and_grads(
            lambda a, b, c: genoflash.flash_attn_varlen_func(a, b, c, cu_q, cu_k, max(lens_q), max(lens_k),
                                                             **features), q, k, v, dout)
    ref_features = {name: x for name, x in features.items() if name != "deterministic"}
    truth, same = reference_pair(
        q, k, v, dout, fn=lambda a, b, c: attention_reference_varlen(a, b, c, cu_q, cu_k, **ref_features)[0])
    assert_within_rule(got, truth, same)


# The long sequence crosses several tiles either way: 300 on the GPU, 130 under the interpreter
# (64 x 32 tiles, where its cost grows as the square of the length).
LONG = 300 if HAS_CUDA else 130


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lens_q,lens_k", [([1, 17, LONG, 5], [1, 17, LONG, 5]), ([1, 17, LONG, 5], [40, 3, 129, 5])],
                         ids=["same-lengths", "other-k-lengths"])
def test_varlen(backend, lens_q, lens_k, causal, device):
    torch.manual_seed(10)
    check_varlen(backend, device, lens_q, lens_k, 4, 2, 32, 32, causal=causal)


@pytest.mark.parametrize("backend", BACKENDS)
def test_varlen_sequences_do_not_see_each_other(backend, device):
    """Changing one sequence's keys must leave every other sequence's output bit-for-bit unchanged."""
    torch.manual_seed(11)
    lens = [7, 33, 64, 1]
    cu_s = cu(lens, device)
    q, k, v = (torch.randn(sum(lens), 2, 16, device=device, dtype=DTYPE) for _ in range(3))
    with genoflash.use_backend(backend):
        before = genoflash.flash_attn_varlen_func(q, k, v, cu_s, cu_s, 64, 64)
        k2 = k.clone()
        k2[7:40] += 1.0  # the second sequence only
        after = genoflash.flash_attn_varlen_func(q, k2, v, cu_s, cu_s, 64, 64)
    others = torch.ones(sum(lens), dtype=torch.bool, device=device)
    others[7:40] = False
    assert torch.equal(before[others], after[others])
    assert not torch.equal(before[~others], after[~others])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "window,causal",
    [((3, 0), False), ((5, 2), False), ((0, 0), False), ((7, -1), False), ((-1, 4), False), ((10, 10), True),
     ((500, 500), False), ((500, 500), True)],
    ids=["left3-right0", "5-2", "diagonal-only", "left-only", "right-only", "causal+left10", "wider-than-seq",
         "wider-causal"],
)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(129, 129), (70, 150), (150, 70)])
def test_sliding_window(backend, window, causal, seqlen_q, seqlen_k, device):
    torch.manual_seed(12)
    check_fixed(backend, device, 1, seqlen_q, seqlen_k, 2, 2, 32, 32, window_size=window, causal=causal)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nheads,nheads_k", [(8, 1), (4, 2)], ids=["mqa-8:1", "gqa-4:2"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gqa(backend, nheads, nheads_k, causal, device):
    torch.manual_seed(13)
    check_fixed(backend, device, 2, 77, 91, nheads, nheads_k, 32, 32, causal=causal)


@pytest.mark.parametrize("nheads,nheads_k,heads_per_split", [(8, 1, 3), (8, 1, 1), (4, 2, 1)],
                         ids=["mqa-8:1-by-3", "mqa-8:1-by-1", "gqa-4:2-by-1"])
@pytest.mark.parametrize("features", ["causal", "window", "rope-dropout"])
def test_gqa_with_the_group_split_over_dkdv_programs(nheads, nheads_k, heads_per_split, features, device):
    """The GQA dK/dV pass with the group's query heads split over programs (float32 partial slices,
    summed afterwards), as the GPU takes it when there are few programs for the SMs; forced here.
    3 heads per split over a group of 8 leaves an uneven last share (3, 3, 2)."""
    torch.manual_seed(16)
    # what is split is the query heads of a group; the lengths only need to end mid-tile (of the
    # interpreter's 64 x 32 tiles there: 45 x 61)
    seqlen_q, seqlen_k = (77, 91) if HAS_CUDA else (45, 61)
    kw = {"causal": dict(causal=True), "window": dict(window_size=(5, 20))}.get(features)
    if features == "rope-dropout":
        cos, sin = genoflash.rotary_tables(91, 32, device=device)
        kw = dict(causal=True, rotary_cos=cos, rotary_sin=sin, dropout_p=0.2, dropout_seed=7)
    with override_configs(dkdv_heads_per_split=heads_per_split):
        if features == "rope-dropout":  # against the same call without the split: the mask is the kernel's own
            check_same_as_unsplit(device, nheads, nheads_k, **kw)
        else:
            check_fixed("triton", device, 2, seqlen_q, seqlen_k, nheads, nheads_k, 32, 32, **kw)


@pytest.mark.parametrize("seqlen_q,seqlen_k,d,dv", [(1, 17, 40, 24), (17, 129, 40, 24)], ids=["q1-k17", "q17-k129"])
def test_group_split_at_odd_sizes(seqlen_q, seqlen_k, d, dv, device):
    """The split at odd lengths and head dims that are not powers of two, causal (bottom-right)."""
    torch.manual_seed(17)
    with override_configs(dkdv_heads_per_split=3):
        check_fixed("triton", device, 2, seqlen_q, seqlen_k, 8, 1, d, dv, causal=True)


def check_same_as_unsplit(device, nheads, nheads_k, **kw):
    # 91 keys on the GPU; 45 under the interpreter (two 32-key tiles, the second partial)
    n = 91 if HAS_CUDA else 45
    q, k = make((2, n, nheads, 32), DTYPE, device), make((2, n, nheads_k, 32), DTYPE, device)
    v, dout = make((2, n, nheads_k, 32), DTYPE, device), torch.randn(2, n, nheads, 32, dtype=DTYPE, device=device)
    with genoflash.use_backend("triton"):
        split = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, **kw), q, k, v, dout)
        with override_configs(dkdv_heads_per_split=nheads // nheads_k):
            whole = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, **kw), q, k, v, dout)
    for name, s, w in zip(("out", "dq", "dk", "dv"), split, whole):
        assert torch.isfinite(s).all(), name
        # dK/dV: float32 partial sums, then one rounding, against one float32 sum: equal up to rounding.
        torch.testing.assert_close(s, w, rtol=2e-3, atol=2e-3, msg=name)
    assert (split[2] - whole[2]).abs().max() < whole[2].abs().max() * 1e-2


def test_dkdv_group_split_policy(monkeypatch):
    """Split only GQA with under DKDV_GROUP_SPLIT_MIN_WAVES waves of programs and enough work; aim
    for the target waves."""
    from genoflash.ops.attention import configs
    monkeypatch.setattr(configs, "triton_interpreted", lambda: False)
    monkeypatch.setattr(configs, "sm_count", lambda device: 132)
    cuda, big = torch.device("cuda"), 2.0**42  # the dK/dV FLOPs of H16 N16k hd128
    assert configs.dkdv_group_split(1, 128, big, cuda) == 1  # MHA: nothing to split
    assert configs.dkdv_group_split(16, 128, big, cuda) == 4  # MQA H16 N16k: 5 splits asked, 4 of 4 heads
    assert configs.dkdv_group_split(4, 512, big, cuda) == 4  # GQA 4:1 H16 N16k: 512 programs, no split
    assert configs.dkdv_group_split(8, 8, big, cuda) == 1  # few programs: one head per program
    assert configs.dkdv_group_split(8, 8, 2.0**30, cuda) == 8  # too little work to repay the extra launches
    assert configs.dkdv_group_split(16, 128, big, torch.device("cpu")) == 16


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("per_batch", [False, True], ids=["slopes-H", "slopes-BH"])
def test_alibi_with_causal(backend, per_batch, device):
    torch.manual_seed(14)
    slopes = torch.rand((2, 4) if per_batch else (4,), device=device) * 0.5
    check_fixed(backend, device, 2, 97, 130, 4, 4, 32, 32, causal=True, alibi_slopes=slopes)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", [(-1, -1), (9, 9)], ids=["no-window", "window9"])
def test_softcap(backend, window, device):
    torch.manual_seed(15)
    check_fixed(backend, device, 1, 100, 100, 2, 2, 32, 32, softcap=2.0, window_size=window)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d,dv", [(16, 24), (64, 192), (128, 192), (192, 128)])
def test_value_head_dim(backend, d, dv, device):
    torch.manual_seed(16)
    check_fixed(backend, device, 1, 65, 80, 2, 1, d, dv, causal=True)


def test_channel_blocks_split_only_where_they_save_padding():
    # 192 as 128 + 64 (Enformer, AlphaGenome), 96 as 64 + 32; powers of two stay one group, and
    # so do widths whose tail would be narrower than 32 (80) or that save nothing (200).
    assert [value_blocks(dv) for dv in (192, 96, 160, 128, 64, 80, 200, 24)] == [
        (128, 64), (64, 32), (128, 32), (128, 0), (64, 0), (128, 0), (256, 0), (32, 0)]
    with override_configs(split_channels=False):
        assert value_blocks(192) == (256, 0)
    with override_configs(split_channels=True):
        assert value_blocks(40) == (32, 16) and value_blocks(128) == (128, 0)


SPLIT_PATHS = ["tma", "pointers", "varlen", "key-chunks", "gqa-window-alibi-softcap", "rope-neox",
               "rope-interleaved"]


@pytest.mark.parametrize("path", SPLIT_PATHS)
def test_channels_split_in_two_groups(path, device, monkeypatch):
    """Q/K's pass-through channels (channel_groups.py's p and t) and V, O, dO and dV, each held as two
    channel groups (configs.channel_blocks; forced here at widths the interpreter runs quickly:
    40 = 32 + a 16-wide tail of 8 channels), through every load and store path of the three
    kernels, RoPE's included. The launches are watched, so a silent one-group run would fail."""
    from genoflash.ops.attention import backward, forward
    from tests.ops.attention.test_fused_rope import check as check_rope

    seen = []
    for module in (forward, backward):
        def spy(kernel, grid, cfg, *args, _real=module.launch, **constexprs):
            seen.append((kernel.fn.__name__, constexprs["BLOCK_P"], constexprs["BLOCK_T"], constexprs["BLOCK_DV"],
                         constexprs["BLOCK_DVT"]))
            return _real(kernel, grid, cfg, *args, **constexprs)
        monkeypatch.setattr(module, "launch", spy)
    torch.manual_seed(22)
    features = dict(causal=True)
    overrides = dict(split_channels=True)
    if path == "key-chunks":
        overrides["key_chunk"] = 64
    if path == "rope-neox":  # K's halves, pass-through groups and tables by TMA, in the dQ pass too
        overrides["dq_rope_by_tma"] = True
    if path == "gqa-window-alibi-softcap":
        features.update(window_size=(30, 5), softcap=5.0, alibi_slopes=torch.rand(4, device=device) * 0.3)
    with override_configs(**overrides), genoflash.settings(tma=path != "pointers"):
        if path == "varlen":
            check_varlen("triton", device, [1, 17, 130, 5], [9, 17, 100, 2], 2, 1, 40, 40, **features)
        elif path.startswith("rope"):  # 56 channels: 16 rotate, the 40 others pass through as 32 + 16
            check_rope("triton", device, 2, 100, 129, 2, 1, 56, 16, path == "rope-interleaved", dv=40, **features)
        else:  # 65 queries in the interpreter (two of its 64-query tiles), 129 on the GPU
            check_fixed("triton", device, 2, 129 if HAS_CUDA else 65, 150, 4,
                        4 if path != "gqa-window-alibi-softcap" else 2, 40, 40, **features)
    names = {name for name, *_ in seen}
    assert names == {"_attn_fwd_kernel", "_attn_bwd_dq_kernel", "_attn_bwd_dkdv_kernel"}
    assert all(tuple(blocks) == (32, 16, 32, 16) for _, *blocks in seen), seen


def test_value_head_dim_split_with_dropout_equals_one_group(device):
    """Dropout's mask does not depend on V's channels: split and unsplit runs with one seed give the
    same output and gradients, up to the dots' rounding."""
    torch.manual_seed(23)
    q, k = (make((1, 100, 2, 32), DTYPE, device) for _ in range(2))
    v = make((1, 100, 2, 40), DTYPE, device)
    dout = torch.randn(1, 100, 2, 40, dtype=DTYPE, device=device)
    runs = []
    for split in (False, True):
        with genoflash.use_backend("triton"), override_configs(split_channels=split):
            runs.append(outputs_and_grads(
                lambda a, b, c: genoflash.flash_attn_func(a, b, c, dropout_p=0.3, dropout_seed=11), q, k, v, dout))
    for name, a, b in zip(["out", "dq", "dk", "dv"], *runs):
        assert not torch.isnan(b).any(), name
        torch.testing.assert_close(b, a, atol=2e-3, rtol=2e-3, msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_everything_together(backend, device):
    """Varlen + GQA + window + ALiBi + softcap + Dv != D in one call."""
    torch.manual_seed(17)
    slopes = torch.rand(4, 4, device=device) * 0.3
    check_varlen(backend, device, [1, 17, 130, 5], [9, 17, 100, 2], 4, 2, 16, 24, causal=True,
                 window_size=(20, -1), softcap=3.0, alibi_slopes=slopes)


def test_uneven_tilings_with_window(device):
    """Window bounds with BLOCK_M != BLOCK_N, lengths mid-tile, in all three kernels."""
    with override_configs(TileConfig(16, 32), BackwardConfig(TileConfig(32, 16), TileConfig(16, 32))):
        torch.manual_seed(18)
        check_fixed("triton", device, 1, 75, 61, 2, 2, 16, 16, dtype=torch.float32, window_size=(13, 6))
        check_fixed("triton", device, 1, 61, 75, 2, 2, 16, 16, dtype=torch.float32, window_size=(2, 20))


@pytest.mark.parametrize("seqlen_q,seqlen_k,features", [
    (75, 61, dict(causal=True)),
    (61, 75, dict(causal=True)),
    (129, 129, dict(window_size=(13, 6))),
    (61, 75, dict(window_size=(2, 20), softcap=2.0)),
    (100, 100, dict(causal=True, window_size=(17, -1), dropout_p=0.2, dropout_seed=5)),
], ids=["causal-q>k", "causal-q<k", "window", "window-softcap", "causal-window-dropout"])
def test_dkdv_pass_masking_every_tile(seqlen_q, seqlen_k, features, device, monkeypatch):
    """BackwardConfig.dkdv_mask_every_tile (hd256's causal and windowed backward, where the edge
    branch serialised the wgmma at sm_90): the dK/dV pass then masks every tile, so that the whole
    tiles' scores go through the mask too. The mask keeps every score of a whole tile, so the
    gradients equal the edges-only pass's bit for bit, and both are within the rule."""
    from genoflash.ops.attention import backward

    seen = []
    real_launch = backward.launch
    def spy(kernel, *args, **kw):
        seen.append(kw.get("MASK_EDGES_ONLY"))
        return real_launch(kernel, *args, **kw)

    monkeypatch.setattr(backward, "launch", spy)
    torch.manual_seed(seqlen_q + seqlen_k)
    batch = 2 if HAS_CUDA else 1  # which tiles are masked does not depend on the batch
    q = make((batch, seqlen_q, 2, 24), torch.float32, device)
    k, v = (make((batch, seqlen_k, 2, 24), torch.float32, device) for _ in range(2))
    dout = torch.randn(batch, seqlen_q, 2, 24, device=device)
    runs = {}
    for every_tile in (False, True):
        bwd = BackwardConfig(TileConfig(16, 32), TileConfig(32, 16), dkdv_mask_every_tile=every_tile)
        with genoflash.use_backend("triton"), override_configs(TileConfig(32, 16), bwd):
            runs[every_tile] = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(a, b, c, **features),
                                                 q, k, v, dout)
    assert seen == [None, True, None, False]  # dQ (it writes delta), then dK/dV: edges only, then every tile
    for name, a, b in zip(["out", "dq", "dk", "dv"], runs[False], runs[True]):
        assert torch.equal(a, b), name
    ref_features = {n: x for n, x in features.items() if not n.startswith("dropout")}
    if "dropout_p" in features:  # the same mask, materialised (dropout.py)
        ref_features["dropout"] = DropoutArgs(features["dropout_p"], features["dropout_seed"], 0)
    truth, same = reference_pair(q, k, v, dout, fn=lambda a, b, c: attention_reference(a, b, c, **ref_features)[0])
    assert_within_rule(runs[True], truth, same)


def test_reference_backend_has_every_feature(device):
    torch.manual_seed(19)
    lens = [3, 40, 9]
    cu_s = cu(lens, device)
    q, k, v = (torch.randn(sum(lens), 2, 16, device=device) for _ in range(3))
    kw = dict(causal=True, window_size=(5, -1), softcap=1.5, alibi_slopes=torch.rand(2, device=device))
    with genoflash.use_backend("reference"):
        out, lse = genoflash.flash_attn_varlen_func(q, k, v, cu_s, cu_s, 40, 40, return_lse=True, **kw)
    ref_out, ref_lse = attention_reference_varlen(q, k, v, cu_s, cu_s, **kw)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    with genoflash.use_backend("torch"):
        out_t, lse_t = genoflash.flash_attn_varlen_func(q, k, v, cu_s, cu_s, 40, 40, return_lse=True, **kw)
    assert lse_t.shape == (2, sum(lens))
    torch.testing.assert_close(out_t, ref_out, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse_t, ref_lse, atol=2e-5, rtol=2e-5)


def test_pad_unpad_roundtrip_matches_padded_attention(device):
    """A padded batch with a key-padding mask, through unpad -> varlen attention -> pad, equals
    attention on each sequence alone; gradients flow through both helpers."""
    torch.manual_seed(20)
    batch, seqlen, h, d = 3, 50, 2, 16
    lengths = [50, 13, 1]
    mask = torch.arange(seqlen, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
    x = torch.randn(batch, seqlen, h, d, device=device, requires_grad=True)
    packed, indices, cu_s, max_len, seqlens = genoflash.unpad_input(x, mask)
    assert cu_s.tolist() == [0, 50, 63, 64] and max_len == 50 and seqlens.tolist() == lengths
    with genoflash.use_backend("torch"):
        out = genoflash.pad_input(genoflash.flash_attn_varlen_func(packed, packed, packed, cu_s, cu_s, max_len,
                                                                   max_len, causal=True), indices, batch, seqlen)
        for b, n in enumerate(lengths):
            alone = genoflash.flash_attn_func(x[b:b + 1, :n], x[b:b + 1, :n], x[b:b + 1, :n], causal=True)
            torch.testing.assert_close(out[b:b + 1, :n], alone)
    assert (out[~mask] == 0).all()
    out.sum().backward()
    assert (x.grad[~mask] == 0).all() and x.grad[mask].abs().sum() > 0


def test_unpad_with_unused_mask_packs_both_and_counts_the_used(device):
    """flash-attn's unused_mask: its tokens are packed too (cu_seqlens and max_seqlen count them),
    in their places; the last output counts only the tokens attention_mask marks."""
    x = torch.arange(2 * 6, dtype=torch.float32, device=device).view(2, 6, 1)
    used = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]], device=device)
    unused = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 1, 1]], device=device)
    packed, indices, cu_s, max_len, seqlens = genoflash.unpad_input(x, used, unused)
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    assert packed[:, 0].tolist() == [float(i) for i in indices.tolist()]
    assert cu_s.tolist() == [0, 5, 11] and max_len == 6 and seqlens.tolist() == [3, 2]
    assert torch.equal(genoflash.unpad_input(x, used)[4], seqlens)  # without it: the same used counts
    with pytest.raises(ValueError, match="unused_mask must be false wherever attention_mask is true"):
        genoflash.unpad_input(x, used, used)
    with pytest.raises(ValueError, match=r"unused_mask must be \(batch, seqlen\) = \(2, 6\)"):
        genoflash.unpad_input(x, used, unused[:, :5])


# ---------------------------------------------------------------- bad input

def varlen_call(**overrides):
    lens = [3, 5]
    args = dict(q=torch.randn(8, 2, 16), k=torch.randn(8, 2, 16), v=torch.randn(8, 2, 16),
                cu_seqlens_q=cu(lens, "cpu"), cu_seqlens_k=cu(lens, "cpu"), max_seqlen_q=5, max_seqlen_k=5)
    args.update(overrides)
    with genoflash.use_backend("torch"):
        return genoflash.flash_attn_varlen_func(**args)


@pytest.mark.parametrize(
    "overrides,error,match",
    [
        (dict(cu_seqlens_q=torch.tensor([0, 5, 3, 8], dtype=torch.int32)), ValueError, "never decrease"),
        (dict(cu_seqlens_q=torch.tensor([1, 3, 8], dtype=torch.int32)), ValueError, "start at 0"),
        (dict(cu_seqlens_q=torch.tensor([0, 3, 8])), TypeError, "int32"),
        (dict(cu_seqlens_k=torch.tensor([0, 3, 7], dtype=torch.int32)), ValueError, "holds 8 tokens"),
        (dict(cu_seqlens_k=torch.tensor([0, 8], dtype=torch.int32), max_seqlen_k=8), ValueError,
         "describes 2 sequences"),
        (dict(max_seqlen_q=4), ValueError, r"max_seqlen \(4\) is smaller"),
        (dict(q=torch.randn(1, 8, 2, 16)), ValueError, "q must have rank 3"),
        (dict(window_size=(-2, 0)), ValueError, "window_size left must be >= -1"),
        (dict(window_size=(3,)), ValueError, "window_size must be a pair"),
        (dict(softcap=-1.0), ValueError, "softcap must be finite and >= 0"),
        (dict(alibi_slopes=torch.rand(3)), ValueError, r"alibi_slopes must have shape \(2,\) or \(2, 2\)"),
        (dict(alibi_slopes=torch.rand(2, dtype=torch.float64)), TypeError, "alibi_slopes must be a float32"),
        (dict(k=torch.randn(8, 3, 16), v=torch.randn(8, 3, 16)), ValueError, "divisible"),
    ],
    ids=["cu-decreasing", "cu-not-from-0", "cu-not-int32", "cu-total", "cu-batch", "max-seqlen-too-small",
         "rank", "window-below-minus-1", "window-not-pair", "softcap-negative", "alibi-shape", "alibi-dtype",
         "gqa-not-divisible"],
)
def test_bad_varlen_and_feature_input(overrides, error, match):
    with pytest.raises(error, match=match):
        varlen_call(**overrides)


def test_window_below_minus_one_in_fixed_api():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="window_size right must be >= -1"):
        genoflash.flash_attn_func(q, q, q, window_size=(4, -3))
