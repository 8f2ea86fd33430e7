"""genoflash.layers.RotaryEmbedding against flash-attn's rotary module, written out here in float64
from its definition: every packed layout, int and per-sequence offsets, interleaved pairs, a rotary
dim below the head dim, and XPos; the rotation is in place and differentiable."""

from __future__ import annotations

import pytest
import torch

import genoflash
from genoflash.layers import RotaryEmbedding

from tests.utils import EPS


def rotated(x, dim, base, interleaved, positions, scale_base=None, cached_length=None, key=False):
    """x (batch, seqlen, heads, headdim) in float64, its first `dim` channels of token t of sequence b
    rotated by positions[b][t] * base^(-2m/dim) (and XPos-scaled, centred on cached_length)."""
    x = x.double()
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions.double()[..., None] * inv_freq  # (batch, seqlen, dim / 2)
    cos, sin = angles.cos()[:, :, None], angles.sin()[:, :, None]
    if scale_base is not None:
        zeta = (torch.arange(0, dim, 2, dtype=torch.float64) + 0.4 * dim) / (1.4 * dim)
        scale = zeta ** ((positions.double() - cached_length // 2) / scale_base)[..., None]
        scale = scale[:, :, None] ** (-1 if key else 1)
        cos, sin = cos * scale, sin * scale
    m = torch.arange(dim // 2)
    first, second = (2 * m, 2 * m + 1) if interleaved else (m, m + dim // 2)
    out = x.clone()
    out[..., first] = x[..., first] * cos - x[..., second] * sin
    out[..., second] = x[..., second] * cos + x[..., first] * sin
    return out


def close(got, want, name):
    assert not torch.isnan(got).any(), name
    err = (got.double() - want).abs().max().item()
    # float32 in and out: one rounding of the input, the tables and the result
    assert err <= 4 * EPS[torch.float32] * max(want.abs().max().item(), 1.0), f"{name}: error {err:.2e}"


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("layout", ["qkv", "num_heads_q", "q-and-kv"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("offset", ["int", "per-sequence"])
def test_matches_flash_attn_rotary_embedding(backend, layout, interleaved, offset, device):
    torch.manual_seed(8)
    batch, seqlen, heads, heads_k, headdim, dim = 2, 17, 4, 2, 40, 24
    offsets = torch.tensor([3, 11], device=device) if offset == "per-sequence" else 5
    positions = torch.arange(seqlen)[None] + (offsets.cpu()[:, None] if offset == "per-sequence" else offsets)
    positions = positions.expand(batch, seqlen)
    module = RotaryEmbedding(dim, base=500.0, interleaved=interleaved)
    if layout == "qkv":
        source = torch.randn(batch, seqlen, 3, heads, headdim, device=device)
        q, k, v = source.unbind(2)
    elif layout == "num_heads_q":
        source = torch.randn(batch, seqlen, heads + 2 * heads_k, headdim, device=device)
        q, k, v = source.split([heads, heads_k, heads_k], dim=2)
    else:
        source = (torch.randn(batch, seqlen, heads, headdim, device=device),
                  torch.randn(batch, seqlen, 2, heads_k, headdim, device=device))
        q, (k, v) = source[0], source[1].unbind(2)
    want_q, want_k = (rotated(t.cpu(), dim, 500.0, interleaved, positions) for t in (q, k))
    want_v = v.clone()
    with genoflash.use_backend(backend):
        if layout == "q-and-kv":
            out = module(*source, seqlen_offset=offsets)
            assert out[0] is source[0] and out[1] is source[1]
        else:
            out = module(source, seqlen_offset=offsets, num_heads_q=heads if layout == "num_heads_q" else None)
            assert out is source
    close(q.cpu(), want_q, "q")
    close(k.cpu(), want_k, "k")
    torch.testing.assert_close(v, want_v, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_xpos_scales_queries_up_and_keys_down(backend, device):
    torch.manual_seed(9)
    module = RotaryEmbedding(16, scale_base=64.0)
    qkv = torch.randn(1, 21, 3, 2, 16, device=device)
    q, k = qkv[:, :, 0].clone(), qkv[:, :, 1].clone()
    positions = (torch.arange(21) + 2)[None]
    with genoflash.use_backend(backend):
        module(qkv, seqlen_offset=2)
    # The tables were built for exactly 23 positions: XPos centres its scales there, as flash-attn does.
    close(qkv[:, :, 0].cpu(), rotated(q.cpu(), 16, 10000.0, False, positions, 64.0, 23), "q")
    close(qkv[:, :, 1].cpu(), rotated(k.cpu(), 16, 10000.0, False, positions, 64.0, 23, key=True), "k")


def test_gradient_flows_through_the_in_place_rotation(device):
    torch.manual_seed(10)
    module = RotaryEmbedding(16)
    leaf = torch.randn(1, 9, 3, 1, 16, device=device, requires_grad=True)
    dout = torch.randn(1, 9, 3, 1, 16, device=device)
    (grad,) = torch.autograd.grad(module(leaf.clone()), leaf, dout)
    # The rotation is orthogonal: q's and k's gradients are dout rotated back; v's is dout.
    positions = torch.arange(9)[None]
    for i in (0, 1):
        back = rotated(dout[:, :, i].cpu(), 16, 10000.0, False, -positions)  # R(a)^T = R(-a)
        close(grad[:, :, i].cpu(), back, f"d{'qk'[i]}")
    torch.testing.assert_close(grad[:, :, 2], dout[:, :, 2], rtol=0, atol=0)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="dim must be a positive even int"):
        RotaryEmbedding(15)
    with pytest.raises(ValueError, match="pos_idx_in_fp32 must be True"):
        RotaryEmbedding(16, pos_idx_in_fp32=False)
    module = RotaryEmbedding(16)
    with pytest.raises(ValueError, match=r"qkv must be \(batch, seqlen, 3, nheads, headdim\)"):
        module(torch.randn(1, 4, 2, 1, 16))
    with pytest.raises(ValueError, match="num_heads_q = 3"):
        module(torch.randn(1, 4, 4, 16), num_heads_q=3)
    with pytest.raises(ValueError, match=r"kv must be \(batch, seqlen, 2, nheads_k, headdim\)"):
        module(torch.randn(1, 4, 1, 16), torch.randn(1, 4, 3, 1, 16))
