"""RoPE fused into the attention kernels, the tables helper and the attention layer."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import genoflash
from genoflash.layers import MultiHeadAttention
from genoflash.ops.attention.reference import attention_reference, attention_reference_varlen
from genoflash.ops.rotary import rotary_tables, rotate, rotate_packed

from tests.utils import assert_within_rule, outputs_and_grads, reference_pair
from tests.utils import HAS_CUDA

BACKENDS = ["triton", "torch"]
DTYPE = torch.bfloat16 if HAS_CUDA else torch.float16

pytestmark = pytest.mark.usefixtures("poison_allocations")


def rope_then_attention(cos, sin, interleaved, **features):
    """Standard attention on explicitly rotated q and k: what the fused kernels must equal."""
    def fn(q, k, v):
        qr = rotate(q, cos, sin, interleaved, k.shape[1] - q.shape[1])
        kr = rotate(k, cos, sin, interleaved, 0)
        return attention_reference(qr, kr, v, **features)[0]
    return fn


def check(backend, device, batch, seqlen_q, seqlen_k, nheads, nheads_k, d, rotary_dim, interleaved, dv=None,
          table_dtype=torch.float32, **features):
    cos, sin = rotary_tables(max(seqlen_k, 1) + 3, rotary_dim, device=device, dtype=table_dtype)
    dv = dv or d
    q = torch.randn(batch, seqlen_q, nheads, d, device=device, dtype=DTYPE, requires_grad=True)
    k = torch.randn(batch, seqlen_k, nheads_k, d, device=device, dtype=DTYPE, requires_grad=True)
    v = torch.randn(batch, seqlen_k, nheads_k, dv, device=device, dtype=DTYPE, requires_grad=True)
    dout = torch.randn(batch, seqlen_q, nheads, dv, device=device, dtype=DTYPE)
    with genoflash.use_backend(backend):
        got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_func(
            a, b, c, rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved, **features), q, k, v, dout)
    truth, same = reference_pair(q, k, v, dout, fn=rope_then_attention(cos, sin, interleaved, **features))
    assert_within_rule(got, truth, same)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("d,rotary_dim", [(64, 64), (64, 32), (40, 24), (96, 8)])
def test_rotary_layouts_and_partial_dims(backend, interleaved, d, rotary_dim, device):
    torch.manual_seed(30)
    # one sequence under the interpreter (test_k_and_tables_go_by_tma_... rotates batches of 2 there)
    check(backend, device, 2 if HAS_CUDA else 1, 77, 77, 2, 2, d, rotary_dim, interleaved)


# The GPU tile configs depend on the head dims and on the tables' width in bytes (the tables
# stream beside K or Q, in shared memory): each of these runs a different config on the GPU.
WIDE_HEADS = [(128, 128, 128), (64, 64, 192), (256, 256, 256), (128, 128, 192)] if HAS_CUDA else [(128, 128, 128)]


@pytest.mark.parametrize("backend", ["triton"])
@pytest.mark.parametrize("table_dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("d,rotary_dim,dv", WIDE_HEADS)
def test_rotary_table_dtypes_and_wide_heads(backend, table_dtype, d, rotary_dim, dv, device):
    """Tables in any float dtype (flash-attn passes them in q's dtype), at the production tile
    configs: these crossed the shared-memory limit once, on the GPU only."""
    torch.manual_seed(34)
    n = 1000 if HAS_CUDA else 129
    check(backend, device, 1, n, n, 2, 1, d, rotary_dim, False, dv=dv, table_dtype=table_dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(33, 129), (1, 50), (129, 129)])
def test_rotary_causal_bottom_right_positions(backend, seqlen_q, seqlen_k, device):
    """Query i sits at position i + seqlen_k - seqlen_q, as its causal alignment says."""
    torch.manual_seed(31)
    check(backend, device, 1, seqlen_q, seqlen_k, 4, 2, 32, 32, False, causal=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotary_with_window_and_alibi(backend, device):
    torch.manual_seed(32)
    check(backend, device, 1, 100, 120, 2, 1, 32, 16, True, window_size=(9, 3),
          alibi_slopes=torch.rand(2, device=device))


def check_packed(backend, q, k, v, dout, cu_q, cu_k, cos, sin):
    """Causal fused RoPE on a packed batch, output and gradients, within the rule against each
    sequence rotated and attended on its own (rope_then_attention: bottom-right positions)."""
    bq, bk = cu_q.tolist(), cu_k.tolist()
    max_q, max_k = (max(e - s for s, e in zip(b, b[1:])) for b in (bq, bk))
    with genoflash.use_backend(backend):
        got = outputs_and_grads(lambda a, b, c: genoflash.flash_attn_varlen_func(
            a, b, c, cu_q, cu_k, max_q, max_k, causal=True, rotary_cos=cos, rotary_sin=sin), q, k, v, dout)

    def per_sequence(a, b, c):
        return torch.cat([rope_then_attention(cos, sin, False, causal=True)(a[None, q0:q1], b[None, k0:k1],
                                                                            c[None, k0:k1])[0]
                          for q0, q1, k0, k1 in zip(bq, bq[1:], bk, bk[1:])])

    truth, same = reference_pair(q, k, v, dout, fn=per_sequence)
    assert_within_rule(got, truth, same)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotary_positions_restart_in_each_varlen_sequence(backend, device):
    """A packed batch equals each sequence on its own, each starting at position 0."""
    torch.manual_seed(33)
    lens = [1, 17, 90, 5]
    cu_s = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)
    cos, sin = rotary_tables(90, 32, device=device)
    q, k, v = (torch.randn(sum(lens), 2, 32, device=device, dtype=DTYPE, requires_grad=True) for _ in range(3))
    dout = torch.randn(sum(lens), 2, 32, device=device, dtype=DTYPE)
    check_packed(backend, q, k, v, dout, cu_s, cu_s, cos, sin)
    # The reference backend rotates per sequence too.
    with genoflash.use_backend("reference"):
        ref = genoflash.flash_attn_varlen_func(q, k, v, cu_s, cu_s, 90, 90, causal=True, rotary_cos=cos, rotary_sin=sin)
    ref_alone = attention_reference_varlen(*(per_sequence_rotated(t, cu_s, cos, sin) for t in (q, k)), v, cu_s, cu_s,
                                           causal=True)[0]
    torch.testing.assert_close(ref, ref_alone)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotary_varlen_with_seqlen_q_below_seqlen_k(backend, device):
    """Packed sequences whose queries are fewer than their keys: in each sequence query i sits at
    position i + seqlen_k - seqlen_q of that sequence (bottom-right, per sequence)."""
    torch.manual_seed(36)
    lens_q, lens_k = [1, 17, 40], [9, 30, 40]
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32, device=device)
                  for n in (lens_q, lens_k))
    cos, sin = rotary_tables(40, 16, device=device)
    q = torch.randn(sum(lens_q), 2, 24, device=device, dtype=DTYPE, requires_grad=True)
    k, v = (torch.randn(sum(lens_k), 2, 24, device=device, dtype=DTYPE, requires_grad=True) for _ in range(2))
    dout = torch.randn(sum(lens_q), 2, 24, device=device, dtype=DTYPE)
    check_packed(backend, q, k, v, dout, cu_q, cu_k, cos, sin)


def per_sequence_rotated(x, cu_s, cos, sin):
    return rotate_packed(x, cos, sin, cu_s.tolist(), [0] * (cu_s.numel() - 1))


# ---------------------------------------------------------------- tables

def test_tables_are_accurate_at_genomic_positions():
    """cos/sin error < 1e-6 up to position 4,194,304; float32 angles would miss by far more."""
    n, rotary_dim = 4_194_304, 64
    cos, sin = rotary_tables(n, rotary_dim)
    positions = torch.tensor([0, 1, 12_345, 1_000_003, 2_999_999, n - 1])
    m = torch.arange(rotary_dim // 2)
    exact = [[(math.cos(p * 10000.0 ** (-2 * j / rotary_dim)), math.sin(p * 10000.0 ** (-2 * j / rotary_dim)))
              for j in m.tolist()] for p in positions.tolist()]
    exact = torch.tensor(exact, dtype=torch.float64)
    err = max((cos[positions].double() - exact[..., 0]).abs().max().item(),
              (sin[positions].double() - exact[..., 1]).abs().max().item())
    assert err < 1e-6
    inv_freq32 = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    naive = (positions.float()[:, None] * inv_freq32[None, :]).cos()
    assert (naive.double() - exact[..., 0]).abs().max().item() > 1e-3  # why the angles are float64


def test_interpolation_equals_scaled_positions():
    scale = 16.0
    cos, sin = rotary_tables(1000, 32, interpolation=scale, dtype=torch.float64)
    inv_freq = 10000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    angles = (torch.arange(1000, dtype=torch.float64) / scale)[:, None] * inv_freq
    torch.testing.assert_close(cos, angles.cos(), rtol=0, atol=1e-12)
    torch.testing.assert_close(sin, angles.sin(), rtol=0, atol=1e-12)


def test_ntk_alpha_scales_the_base():
    cos, _ = rotary_tables(100, 32, ntk_alpha=8.0, dtype=torch.float64)
    ref, _ = rotary_tables(100, 32, base=10000.0 * 8.0 ** (32 / 30), dtype=torch.float64)
    torch.testing.assert_close(cos, ref)


@pytest.mark.parametrize("kwargs,match", [(dict(rotary_dim=7), "even"), (dict(seqlen=0), "seqlen"),
                                          (dict(interpolation=0.0), "> 0")])
def test_tables_bad_input(kwargs, match):
    args = dict(seqlen=10, rotary_dim=8) | kwargs
    with pytest.raises(ValueError, match=match):
        rotary_tables(**args)


def test_rotary_bad_input():
    q = torch.randn(1, 20, 2, 32)
    cos, sin = rotary_tables(20, 16)
    with pytest.raises(ValueError, match="given together"):
        genoflash.flash_attn_func(q, q, q, rotary_cos=cos)
    with pytest.raises(ValueError, match="cover 10 positions but seqlen_k is 20"):
        genoflash.flash_attn_func(q, q, q, rotary_cos=cos[:10], rotary_sin=sin[:10])
    big_cos, big_sin = rotary_tables(20, 64)
    with pytest.raises(ValueError, match="must be in"):
        genoflash.flash_attn_func(q, q, q, rotary_cos=big_cos, rotary_sin=big_sin)
    with pytest.raises(ValueError, match="seqlen_q <= seqlen_k"):
        genoflash.flash_attn_func(q, q[:, :5], q[:, :5], rotary_cos=cos, rotary_sin=sin)
    with pytest.raises(TypeError, match="2-D"):
        genoflash.flash_attn_func(q, q, q, rotary_cos=cos[0], rotary_sin=sin[0])


@pytest.mark.parametrize("d,rotary_dim,table_dtype,interleaved,takes_tma", [
    (64, 64, torch.float32, False, True),    # all channels rotated
    (64, 32, torch.float16, False, True),    # pass-through channels by a second box; 16-bit tables
    (48, 16, torch.float32, False, True),    # halves of 8: boxes of 16 reach into the next group
    (40, 24, torch.float32, False, False),   # the second half would start 24 bytes in: pointers
    (64, 64, torch.float32, True, False),    # interleaved pairs are not two boxes: pointers
], ids=["d64-r64", "d64-r32-fp16", "d48-r16", "d40-r24", "interleaved"])
@pytest.mark.parametrize("dq_by_tma", [False, True], ids=["dq-pointers", "dq-tma"])
def test_k_and_tables_go_by_tma_where_they_allow_it(d, rotary_dim, table_dtype, interleaved, takes_tma, dq_by_tma,
                                                     monkeypatch, device):
    """With RoPE the forward, and the backward's dQ pass where the tile config asks for it
    (BackwardConfig.dq_rope_by_tma, forced here both ways), take K's NeoX halves, its
    pass-through channels and both tables through TMA descriptors (channel_groups._load_qk_tma); the
    dK/dV pass keeps pointer loads for its rotated Q. Causal with seqlen_q != seqlen_k, GQA and
    lengths off the tiles, so boxes run past the ends; checked forward and all gradients."""
    from genoflash.ops.attention import backward, forward
    from genoflash.ops.attention.configs import override_configs

    seen = []
    for module in (forward, backward):
        def spy(kernel, *a, _real=module.launch, **kw):
            seen.append((kernel.fn.__name__, kw["TMA"]))
            return _real(kernel, *a, **kw)
        monkeypatch.setattr(module, "launch", spy)
    torch.manual_seed(d + rotary_dim)
    hopper = device.type != "cuda" or torch.cuda.get_device_capability()[0] >= 9
    with override_configs(dq_rope_by_tma=dq_by_tma):
        check("triton", device, 2, 61, 133, 2, 1, d, rotary_dim, interleaved, table_dtype=table_dtype, causal=True)
    by_tma = takes_tma and hopper
    assert seen == [("_attn_fwd_kernel", by_tma), ("_attn_bwd_dq_kernel", by_tma and dq_by_tma),
                    ("_attn_bwd_dkdv_kernel", False)]


# ---------------------------------------------------------------- layer

def test_attention_layer_uses_rotary_and_caches_tables(device):
    torch.manual_seed(34)
    layer = MultiHeadAttention(64, nheads=4, nheads_k=2, causal=True).to(device)
    x = torch.randn(2, 50, 64, device=device)
    out = layer(x)
    assert out.shape == x.shape
    cos, sin = layer.rotary(50, x.device)
    assert cos.shape == (64, 8) and layer.rotary(60, x.device)[0] is cos  # cached, grown to a power of two
    # Same layer, RoPE off: a different function (positions now matter).
    plain = MultiHeadAttention(64, nheads=4, nheads_k=2, causal=True, rotary=False).to(device)
    plain.load_state_dict(layer.state_dict())
    assert not torch.allclose(plain(x), out)
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


def test_attention_layer_reads_float16_tables_for_16bit_inputs(device):
    """16-bit q and k get float16 tables (faster kernels); the result stays within the rule
    against float64 attention on exactly rotated q and k, as the float32 tables' result does."""
    torch.manual_seed(35)
    layer = MultiHeadAttention(64, nheads=4, causal=True, rotary_fused=True).to(device, DTYPE)
    x = torch.randn(2, 50, 64, device=device, dtype=DTYPE)
    q = layer.q_proj(x).view(2, 50, 4, 16)
    k, v = layer.kv_proj(x).view(2, 50, 2, 4, 16).unbind(-3)
    cos16, sin16 = layer.rotary_tables_for(50, q)
    assert cos16.dtype == sin16.dtype == torch.float16
    assert layer.rotary_tables_for(50, q.float())[0].dtype == torch.float32
    with torch.no_grad():
        out = layer(x)
        fused = genoflash.flash_attn_func(q, k, v, causal=True, rotary_cos=cos16, rotary_sin=sin16)
        torch.testing.assert_close(out, layer.out_proj(fused.reshape(2, 50, 64)), rtol=0, atol=0)
        cos32, sin32 = layer.rotary(50, device)  # float32 angles, the exact rotation's stand-in
        with32 = genoflash.flash_attn_func(q, k, v, causal=True, rotary_cos=cos32, rotary_sin=sin32)
        truth = rope_then_attention(cos32.double(), sin32.double(), False, causal=True)(
            q.double(), k.double(), v.double())
    err16 = (fused.double() - truth).abs().max().item()
    err32 = (with32.double() - truth).abs().max().item()
    assert err16 <= 2 * err32 + 1e-5, (err16, err32)

