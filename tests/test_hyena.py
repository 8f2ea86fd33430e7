"""Hyena: `fftconv` against the direct-sum reference (outputs and gradients), what its autograd
saves, its input checks, and the `HyenaOperator` layer (shapes, causality, the filter cache).

Accuracy is measured as the relative error ||y - ref|| / ||ref|| against the float64 direct
sums: FFT rounding spreads over the whole output, so a norm-wise figure is the meaningful one.
"""

import pytest
import torch

from genoflash.layers.hyena import HyenaFilter, HyenaOperator
from genoflash.ops.hyena import fftconv, long_conv_reference
from genoflash.ops.hyena.fftconv import fft_size

FP32_TOL = 2e-6  # measured up to 3e-7 at seqlen 1000
FP64_TOL = 1e-12


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref.double()).norm() / ref.double().norm()).item()


def conv_inputs(batch: int, seqlen: int, channels: int, causal: bool, taps: int | None = None, seed: int = 0):
    """float64 x (batch, seqlen, channels), h (channels, taps) with full-length taps by default, D (channels,)."""
    gen = torch.Generator().manual_seed(seed)
    taps = taps or (seqlen if causal else 2 * seqlen - 1)
    x = torch.randn(batch, seqlen, channels, generator=gen, dtype=torch.float64)
    h = torch.randn(channels, taps, generator=gen, dtype=torch.float64)
    D = torch.randn(channels, generator=gen, dtype=torch.float64)
    return x, h, D


# ---------------------------------------------------------------- fftconv: outputs

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("channel_chunk", [None, 2])
@pytest.mark.parametrize("seqlen", [1, 17, 129, 1000])
@pytest.mark.parametrize("causal", [True, False])
def test_fftconv_matches_direct_sums(causal, seqlen, channel_chunk, dtype, poison_allocations):
    x, h, D = conv_inputs(2, seqlen, 5, causal)  # 5 channels in groups of 2: the last group is short
    ref = long_conv_reference(x, h, D, causal)
    y = fftconv(x.to(dtype), h.to(dtype), D.to(dtype), causal, channel_chunk)
    assert y.dtype == dtype and y.shape == x.shape
    assert rel_err(y, ref) < (FP32_TOL if dtype == torch.float32 else FP64_TOL)


@pytest.mark.parametrize("causal, taps", [(True, 1), (True, 5), (False, 1), (False, 9)])
def test_filters_shorter_than_the_sequence(causal, taps):
    x, h, D = conv_inputs(2, 129, 3, causal, taps=taps)
    assert rel_err(fftconv(x, h, None, causal), long_conv_reference(x, h, None, causal)) < FP64_TOL
    assert rel_err(fftconv(x, h, D, causal), long_conv_reference(x, h, D, causal)) < FP64_TOL


def test_fp32_accuracy_figure():
    """fp32 FFT against float64 direct sums, printed for the record (pytest -s)."""
    for causal in (True, False):
        x, h, D = conv_inputs(2, 4096, 4, causal)
        err = rel_err(fftconv(x.float(), h.float(), D.float(), causal), long_conv_reference(x, h, D, causal))
        print(f"\nfp32 fftconv vs fp64 direct sums, seqlen 4096, causal={causal}: rel. err {err:.2e}")
        assert err < FP32_TOL


def test_bf16_inputs_accuracy_figure():
    """bf16 x (the FFT still runs in fp32): the error is the bf16 rounding of the output, not the FFT."""
    x, h, D = conv_inputs(2, 1000, 8, True)
    x16 = x.to(torch.bfloat16)
    ref = long_conv_reference(x16.double(), h, D)  # exact result for the bf16-rounded input
    y = fftconv(x16, h.float(), D.float())
    floor = rel_err(ref.to(torch.bfloat16), ref)  # rounding the exact answer to bf16
    print(f"\nbf16 fftconv vs fp64 direct sums: rel. err {rel_err(y, ref):.2e} (bf16 output rounding: {floor:.2e})")
    assert y.dtype == torch.bfloat16
    assert rel_err(y, ref) < 2 * floor + 1e-5


def test_groups_see_at_most_channel_chunk_channels(monkeypatch):
    """Only one channel group goes through each FFT call, forward and backward."""
    widths = []
    rfft = torch.fft.rfft

    def spy(t, *args, **kwargs):
        widths.append(t.shape[-2])  # (.., group, seqlen) or (group, taps)
        return rfft(t, *args, **kwargs)

    monkeypatch.setattr(torch.fft, "rfft", spy)
    x, h, D = (t.requires_grad_() for t in conv_inputs(2, 64, 7, True))
    fftconv(x, h, D, channel_chunk=3).sum().backward()
    assert widths and max(widths) == 3


def test_fft_size_is_the_next_5_smooth_number():
    def smooth(n):
        for p in (2, 3, 5):
            while n % p == 0:
                n //= p
        return n == 1

    for m in range(1, 600):
        n = fft_size(m)
        assert n >= m and smooth(n) and not any(smooth(k) for k in range(m, n))
    assert fft_size(2 * 2**20 - 1) == 2**21


# ---------------------------------------------------------------- fftconv: gradients

@pytest.mark.parametrize("channel_chunk", [None, 2])
@pytest.mark.parametrize("seqlen", [1, 17, 64])
@pytest.mark.parametrize("causal", [True, False])
def test_gradients_match_autograd_through_the_reference(causal, seqlen, channel_chunk):
    x, h, D = (t.requires_grad_() for t in conv_inputs(2, seqlen, 5, causal))
    dy = torch.randn(2, seqlen, 5, dtype=torch.float64)
    ref_grads = torch.autograd.grad(long_conv_reference(x, h, D, causal), (x, h, D), dy)
    for dtype, tol in ((torch.float64, FP64_TOL), (torch.float32, 1e-5)):
        inputs = [t.detach().to(dtype).requires_grad_() for t in (x, h, D)]
        grads = torch.autograd.grad(fftconv(*inputs, causal, channel_chunk), inputs, dy.to(dtype))
        for name, g, ref, inp in zip("xhD", grads, ref_grads, inputs):
            assert g.dtype == dtype and g.shape == inp.shape, name
            assert rel_err(g, ref) < tol, (name, dtype, rel_err(g, ref))


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck(causal):
    x, h, D = (t.requires_grad_() for t in conv_inputs(2, 6, 3, causal))
    assert torch.autograd.gradcheck(lambda x, h, D: fftconv(x, h, D, causal, 2), (x, h, D))
    assert torch.autograd.gradcheck(lambda x, h: fftconv(x, h, None, causal), (x, h))


def test_gradients_only_where_asked():
    x, h, D = conv_inputs(2, 33, 4, True)
    h.requires_grad_()
    fftconv(x, h, D).sum().backward()
    assert h.grad is not None and x.grad is None and D.grad is None
    ref_h = h.detach().requires_grad_()
    long_conv_reference(x, ref_h, D).sum().backward()
    assert rel_err(h.grad, ref_h.grad) < FP64_TOL


# ---------------------------------------------------------------- fftconv: what autograd keeps

def saved_bytes(fn) -> tuple[torch.Tensor, int]:
    """fn()'s output and the bytes of every tensor autograd saved while computing it."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, total


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_autograd_saves_only_x_h_and_D(x_dtype):
    x, h, D = conv_inputs(2, 1024, 8, True)
    x = x.to(x_dtype).requires_grad_()
    h, D = h.float().requires_grad_(), D.float().requires_grad_()
    _, ours = saved_bytes(lambda: fftconv(x, h, D))
    assert ours == sum(t.numel() * t.element_size() for t in (x, h, D))

    def plain_fft_conv():  # the same convolution through torch.fft under plain autograd
        n = 2 * x.shape[1]
        xf = torch.fft.rfft(x.float().transpose(1, 2), n=n)
        return torch.fft.irfft(xf * torch.fft.rfft(h, n=n), n=n)[..., : x.shape[1]].transpose(1, 2) + D * x

    _, plain = saved_bytes(plain_fft_conv)
    print(f"\nsaved for backward: fftconv {ours / 2**20:.2f} MiB, plain torch.fft autograd {plain / 2**20:.2f} MiB")
    assert plain > 2 * ours


# ---------------------------------------------------------------- fftconv: input checks

def _bad_calls():
    x, h, D = (t.float() for t in conv_inputs(2, 8, 3, True))
    hb = torch.randn(3, 15)
    return [
        (lambda: fftconv(x.numpy(), h), TypeError, "torch.Tensor"),
        (lambda: fftconv(x.long(), h), TypeError, "float16, bfloat16"),
        (lambda: fftconv(x.to(torch.complex64), h), TypeError, "float16, bfloat16"),
        (lambda: fftconv(x[0], h), ValueError, "rank 3"),
        (lambda: fftconv(x[:, :0], h[:, :0]), ValueError, ">= 1"),
        (lambda: fftconv(x, h[0]), ValueError, "rank 2"),
        (lambda: fftconv(x, h[:2]), ValueError, "h has 2 channels"),
        (lambda: fftconv(x, torch.randn(3, 9)), ValueError, "reach no output"),
        (lambda: fftconv(x, hb[:, :14], causal=False), ValueError, "odd number"),
        (lambda: fftconv(x, torch.randn(3, 17), causal=False), ValueError, "at most 2 \\* seqlen - 1"),
        (lambda: fftconv(x, h, D[:2]), ValueError, "D has 2 channels"),
        (lambda: fftconv(x, h, D.int()), TypeError, "D must be float16"),
        (lambda: fftconv(x, h.to("meta")), ValueError, "device"),
        (lambda: fftconv(x, h, causal=1), TypeError, "causal must be a bool"),
        (lambda: fftconv(x, h, channel_chunk=0), ValueError, "channel_chunk must be >= 1"),
        (lambda: fftconv(x, h, channel_chunk=2.0), TypeError, "channel_chunk must be an int"),
        (lambda: fftconv(x, h, channel_chunk=True), TypeError, "channel_chunk must be an int"),
    ]


@pytest.mark.parametrize("index", range(len(_bad_calls())))
def test_bad_inputs_raise_clear_errors(index):
    call, error, match = _bad_calls()[index]
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------- HyenaOperator

@pytest.mark.parametrize("seqlen", [1, 33, 64])
@pytest.mark.parametrize("causal", [True, False])
def test_operator_shapes_and_gradients(causal, seqlen):
    torch.manual_seed(0)
    layer = HyenaOperator(d_model=8, l_max=64, order=3, filter_order=16, causal=causal)
    u = torch.randn(2, seqlen, 8, requires_grad=True)
    y = layer(u)
    assert y.shape == u.shape
    y.square().sum().backward()
    for name, p in [("input", u), *layer.named_parameters()]:
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_operator_rejects_bad_shapes():
    layer = HyenaOperator(d_model=8, l_max=16)
    with pytest.raises(ValueError, match="exceeds l_max"):
        layer(torch.randn(1, 17, 8))
    with pytest.raises(ValueError, match="expected input"):
        layer(torch.randn(1, 16, 4))
    with pytest.raises(ValueError, match="order must be"):
        HyenaOperator(d_model=8, l_max=16, order=0)


@pytest.mark.parametrize("causal", [True, False])
def test_operator_causality(causal):
    """Changing input p leaves outputs before p unchanged (up to FFT rounding) iff causal."""
    torch.manual_seed(0)
    layer = HyenaOperator(d_model=16, l_max=256, causal=causal)
    u = torch.randn(2, 256, 16)
    with torch.no_grad():
        y = layer(u)
        for p in (0, 1, 100, 255):
            moved = u.clone()
            moved[:, p] += 1.0
            change = (layer(moved) - y).abs()
            assert change[:, p:].max() > 1e-3  # the perturbation does reach the output
            if p > 0 and causal:
                assert change[:, :p].max() < 1e-5, (p, change[:, :p].max().item())
            elif p > 0:
                assert change[:, :p].max() > 1e-3


@pytest.mark.parametrize("causal", [True, False])
def test_filters_do_not_depend_on_the_length_asked(causal):
    """The filter for seqlen is the prefix (causal) or centre (two-sided) of the one for l_max."""
    torch.manual_seed(0)
    filt = HyenaFilter(d_model=4, order=2, l_max=50, filter_order=8, causal=causal)
    full, short = filt(50), filt(20)
    assert full.shape == (2, 4, 50 if causal else 99) and short.shape == (2, 4, 20 if causal else 39)
    torch.testing.assert_close(short, full[..., :20] if causal else full[..., 30:69])


def test_filters_are_cached_at_inference_only():
    torch.manual_seed(0)
    filt = HyenaFilter(d_model=4, order=2, l_max=32, filter_order=8)
    assert filt(32) is not filt(32)  # training: recomputed every call
    filt.eval()
    assert filt(32).requires_grad and filt(32) is not filt(32)  # eval with grad: recomputed, differentiable
    with torch.no_grad():
        cached = filt(32)
        assert filt(32) is cached
        assert filt(16) is not cached and filt(16).shape[-1] == 16
        filt.mlp[-1].bias.add_(1.0)  # an in-place update (an optimizer step, load_state_dict)
        assert not torch.allclose(filt(16), cached[..., :16])


def test_operator_channel_chunk_does_not_change_the_output():
    torch.manual_seed(0)
    layer = HyenaOperator(d_model=12, l_max=100)
    u = torch.randn(2, 100, 12)
    y = layer(u)
    layer.channel_chunk = 5
    torch.testing.assert_close(layer(u), y, atol=1e-5, rtol=1e-5)


def test_operator_under_bf16_autocast():
    torch.manual_seed(0)
    layer = HyenaOperator(d_model=16, l_max=128)
    u = torch.randn(2, 128, 16)
    ref = layer(u)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(u)
    y.float().sum().backward()
    print(f"\nHyenaOperator under bf16 autocast vs fp32: rel. err {rel_err(y, ref):.2e}")
    assert rel_err(y, ref) < 5e-2


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "two-sided"])
def test_window_sum_is_the_sum_over_every_lag(causal):
    rates = torch.tensor([0.5, 3.0, 15.0], dtype=torch.float64)
    for l_max in (1, 7, 1000):
        lags = torch.arange(0 if causal else 1 - l_max, l_max, dtype=torch.float64)
        brute = torch.exp(-rates[:, None] * lags.abs()[None] / l_max).sum(-1)
        assert torch.allclose(HyenaFilter._window_sum(rates, l_max, causal), brute, rtol=1e-12)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "two-sided"])
def test_output_scale_does_not_grow_with_l_max(causal):
    """Without the window normalisation an order-2 operator's output grows like l_max^2
    (x4096 from l_max 256 to 16,384); with it the scale stays put."""
    stds = {}
    for l_max in (256, 16384):
        torch.manual_seed(0)
        layer = HyenaOperator(d_model=8, l_max=l_max, order=2, filter_order=16, causal=causal)
        with torch.no_grad():
            stds[l_max] = layer(torch.randn(1, l_max, 8)).std().item()
    assert 0.25 < stds[16384] / stds[256] < 4.0, stds
