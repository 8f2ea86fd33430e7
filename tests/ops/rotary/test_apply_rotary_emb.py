"""RoPE as a pass of its own (genoflash.ops.rotary.apply_rotary_emb): the Triton kernel against
the float64 rotation, forward and gradient, every layout and position rule, bad input, and the
attention layer's unfused path against its fused one."""

from __future__ import annotations

import pytest
import torch

import genoflash
from genoflash.layers import MultiHeadAttention
from genoflash.ops.rotary import apply_rotary_emb, rotary_reference
from genoflash.ops.rotary import rotary_tables

from tests.utils import EPS
from tests.utils import HAS_CUDA

DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if HAS_CUDA else [])

pytestmark = pytest.mark.usefixtures("poison_allocations")


def check_rule(got, truth, same, name):
    """error(got - fp64) <= 2 error(same-dtype rotation - fp64) + eps, and nothing unwritten."""
    assert got.shape == truth.shape and got.dtype == same.dtype, name
    assert not torch.isnan(got).any(), f"{name}: NaN (an unwritten element)"
    err = (got.double() - truth).abs().max().item()
    err_same = (same.double() - truth).abs().max().item()
    eps = EPS[got.dtype] * max(truth.abs().max().item(), 1.0)
    assert err <= 2 * err_same + eps, f"{name}: error {err:.3e} > 2 x {err_same:.3e} + {eps:.1e}"


def run_and_check(x, cos, sin, interleaved, offsets, cu_seqlens=None, max_seqlen=None):
    """apply_rotary_emb (triton) against rotary_reference in float64 and in x's dtype: output and
    the gradient with respect to x."""
    x = x.detach().requires_grad_()
    dout = torch.randn_like(x)
    offset_values = offsets.tolist() if isinstance(offsets, torch.Tensor) else offsets
    cu = cu_seqlens.tolist() if cu_seqlens is not None else None
    with genoflash.use_backend("triton"):
        out = apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=offsets, cu_seqlens=cu_seqlens,
                               max_seqlen=max_seqlen)
    (dx,) = torch.autograd.grad(out, x, dout)
    results = {}
    for name, dtype in (("truth", torch.float64), ("same", x.dtype)):
        xr = x.detach().to(dtype).requires_grad_()
        c, s = (cos.double(), sin.double()) if dtype == torch.float64 else (cos, sin)
        ref = rotary_reference(xr, c, s, interleaved, offset_values, cu)
        results[name] = (ref, torch.autograd.grad(ref, xr, dout.to(dtype))[0])
    for i, name in enumerate(("out", "dx")):
        check_rule((out, dx)[i], results["truth"][i], results["same"][i], name)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("d,rotary_dim", [(64, 64), (40, 24), (96, 8), (72, 72)])
@pytest.mark.parametrize("seqlen", [1, 17, 129])
def test_matches_the_float64_rotation(dtype, interleaved, d, rotary_dim, seqlen, device):
    torch.manual_seed(seqlen + d + rotary_dim)
    cos, sin = rotary_tables(seqlen + 5, rotary_dim, device=device)
    x = torch.randn(2, seqlen, 3, d, device=device, dtype=dtype)
    run_and_check(x, cos, sin, interleaved, 5 if seqlen > 1 else 0)


def test_positions_and_strided_input(device):
    """Position t + offset, the tables in 16 bits, and x a strided view (K out of a packed K/V
    projection, as the attention layer makes it): the output is a new contiguous tensor."""
    torch.manual_seed(3)
    cos, sin = rotary_tables(300, 32, device=device, dtype=torch.float16)
    kv = torch.randn(2, 200, 2, 4, 48, device=device, dtype=torch.float16)
    k = kv[:, :, 0]
    out = run_and_check(k, cos, sin, False, 100)
    assert out.is_contiguous()
    # Position really is t + offset: the rotation at offset 100 is the rotation of rows 100.. of a
    # longer sequence.
    longer = torch.randn(2, 300, 4, 48, device=device, dtype=torch.float32)
    with genoflash.use_backend("triton"):
        whole = apply_rotary_emb(longer, cos.float(), sin.float())
        part = apply_rotary_emb(longer[:, 100:], cos.float(), sin.float(), seqlen_offsets=100)
    torch.testing.assert_close(part, whole[:, 100:], rtol=0, atol=1e-6)


@pytest.mark.parametrize("per_sequence", [False, True], ids=["one-offset", "offset-per-sequence"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
def test_varlen_positions_restart_per_sequence(per_sequence, interleaved, device):
    torch.manual_seed(4)
    lengths = [17, 1, 0, 129, 64]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device=device, dtype=torch.int32)
    cos, sin = rotary_tables(200, 40, device=device)
    x = torch.randn(sum(lengths), 3, 56, device=device, dtype=torch.float16)
    offsets = torch.tensor([3, 0, 7, 1, 60], device=device, dtype=torch.int32) if per_sequence else 2
    out = run_and_check(x, cos, sin, interleaved, offsets, cu, max(lengths))
    # Sequence 3 alone, as a fixed-length batch of one, gives the same rows.
    first, offset = 18, (1 if per_sequence else 2)
    with genoflash.use_backend("triton"):
        alone = apply_rotary_emb(x[None, first:first + 129], cos, sin, interleaved, seqlen_offsets=offset)[0]
    torch.testing.assert_close(out[first:first + 129], alone, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_backends_agree(dtype, device):
    """The torch backend (PyTorch ops) and the Triton kernel compute the same rotation; float64
    runs on the PyTorch backends only."""
    torch.manual_seed(5)
    cos, sin = rotary_tables(64, 16, device=device, dtype=torch.float64)
    x = torch.randn(2, 64, 2, 32, device=device, dtype=dtype)
    with genoflash.use_backend("torch"):
        expected = apply_rotary_emb(x, cos, sin)
    if dtype == torch.float64:
        with genoflash.use_backend("triton"), pytest.raises(TypeError, match="float16, bfloat16 and float32"):
            apply_rotary_emb(x, cos, sin)
        return
    with genoflash.use_backend("triton"):
        got = apply_rotary_emb(x, cos, sin)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_bad_input_gets_a_clear_error(device):
    cos, sin = rotary_tables(32, 16, device=device)
    x = torch.randn(1, 32, 2, 16, device=device)
    cu = torch.tensor([0, 10, 32], device=device, dtype=torch.int32)
    cases = [
        (lambda: apply_rotary_emb(x[0], cos, sin), ValueError, "rank 4"),
        (lambda: apply_rotary_emb(x, cos, sin, cu_seqlens=cu, max_seqlen=22), ValueError, "rank 3"),
        (lambda: apply_rotary_emb(x.long(), cos, sin), TypeError, "floating-point"),
        (lambda: apply_rotary_emb(x, cos[:, :4], sin), ValueError, "differ in shape"),
        (lambda: apply_rotary_emb(x, cos[None], sin[None]), TypeError, "2-D"),
        (lambda: apply_rotary_emb(x[..., :8], cos, sin), ValueError, "rotary_dim"),
        (lambda: apply_rotary_emb(x, cos, sin, seqlen_offsets=1), ValueError, "reaches position 32"),
        (lambda: apply_rotary_emb(x, cos, sin, seqlen_offsets=-1), ValueError, "seqlen_offsets"),
        (lambda: apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.zeros(2, dtype=torch.int32, device=device)),
         TypeError, "shape"),
        (lambda: apply_rotary_emb(x, cos, sin, interleaved=1), TypeError, "bool"),
        (lambda: apply_rotary_emb(x, cos, sin, max_seqlen=32), ValueError, "max_seqlen goes with cu_seqlens"),
        (lambda: apply_rotary_emb(x[0], cos, sin, cu_seqlens=torch.tensor([0, 40, 32], dtype=torch.int32,
                                                                           device=device), max_seqlen=40),
         ValueError, "never decrease"),
        (lambda: apply_rotary_emb(x[0], cos, sin, cu_seqlens=cu, max_seqlen=10), ValueError, "max_seqlen"),
        (lambda: apply_rotary_emb(x[0], cos, sin, seqlen_offsets=torch.tensor([0, 11], device=device), cu_seqlens=cu,
                                  max_seqlen=22), ValueError, "reaches position 32"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_attention_layer_unfused_rotary_equals_fused(varlen, device):
    """MultiHeadAttention(rotary_fused=False) rotates q and k in a pass of their own, then
    attends without RoPE: the same output and parameter gradients as the fused kernels, to
    rounding."""
    torch.manual_seed(6)
    dtype = torch.bfloat16 if HAS_CUDA else torch.float32
    layers = {fused: MultiHeadAttention(64, 4, causal=True, rotary_fused=fused).to(device=device, dtype=dtype)
              for fused in (True, False)}
    layers[False].load_state_dict(layers[True].state_dict())
    if varlen:
        x = torch.randn(150, 64, device=device, dtype=dtype)
        kw = dict(cu_seqlens=torch.tensor([0, 50, 150], device=device, dtype=torch.int32), max_seqlen=100)
    else:
        x = torch.randn(2, 75, 64, device=device, dtype=dtype)
        kw = {}
    with genoflash.use_backend("triton"):
        outs = {fused: layer(x, **kw) for fused, layer in layers.items()}
        grads = {fused: torch.autograd.grad(outs[fused].float().square().sum(), layer.q_proj.weight)[0]
                 for fused, layer in layers.items()}
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[False], outs[True], **tol)
    torch.testing.assert_close(grads[False], grads[True], **tol)
    assert outs[False].abs().max() > 0.01  # not trivially zero


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("layout", ["contiguous", "view-of-packed-qkv", "strided-channels", "varlen"])
def test_inplace_writes_x_and_keeps_the_gradient(backend, layout, device):
    """inplace=True returns x itself, holding what the out-of-place call returns, and the gradient
    through it (to the tensor x was made from) is the out-of-place one."""
    torch.manual_seed(7)
    cos, sin = rotary_tables(40, 24, device=device)
    kw = dict(seqlen_offsets=3)
    if layout == "varlen":
        kw = dict(cu_seqlens=torch.tensor([0, 5, 22], dtype=torch.int32, device=device), max_seqlen=17)
    shape = {"contiguous": (2, 17, 3, 40), "view-of-packed-qkv": (2, 17, 3, 3, 40),
             "strided-channels": (2, 17, 3, 40, 2), "varlen": (22, 3, 40)}[layout]
    source = torch.randn(*shape, device=device, requires_grad=True)

    def view(t):  # the tensor rotated: all of t, q's slice of a packed qkv, or every other channel
        views = {"view-of-packed-qkv": lambda: t[:, :, 0], "strided-channels": lambda: t[..., 0]}
        return views.get(layout, lambda: t)()

    dout = torch.randn_like(view(source))
    with genoflash.use_backend(backend):
        want = apply_rotary_emb(view(source), cos, sin, **kw)
        (want_grad,) = torch.autograd.grad(want, source, dout)
        whole = source.clone()  # not a leaf: autograd allows writing into it
        x = view(whole)
        got = apply_rotary_emb(x, cos, sin, inplace=True, **kw)
        assert got is x
        (got_grad,) = torch.autograd.grad(got, source, dout)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(view(whole), want, rtol=0, atol=0)  # written where it lies
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=0)
    if layout == "view-of-packed-qkv":  # k and v are untouched
        torch.testing.assert_close(whole[:, :, 1:], source[:, :, 1:], rtol=0, atol=0)


def test_inplace_on_a_leaf_that_requires_grad_is_refused(device):
    cos, sin = rotary_tables(8, 16, device=device)
    x = torch.randn(1, 8, 1, 16, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        apply_rotary_emb(x, cos, sin, inplace=True)
    with pytest.raises(TypeError, match="inplace must be a bool"):
        apply_rotary_emb(x, cos, sin, False, 0)
