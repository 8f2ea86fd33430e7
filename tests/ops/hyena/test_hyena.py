"""Hyena: `fftconv` against the direct-sum reference (outputs and gradients), what its autograd
saves, its input checks, and the `HyenaOperator` layer (shapes, causality, the filter cache).
Then the channels-first pieces the layer runs on: `fftconv_channels_first` (against the
reference and against `fftconv`), and the layer against the same computation written
channels-last. (The short convolution and the layout-crossing projections, which the Mamba block
shares, are tested in tests/ops/common.) Tests marked by `backend` run
each of genoflash's backends: on a CPU, `triton` runs the kernels under the interpreter.

Accuracy is measured as the relative error ||y - ref|| / ||ref|| against the float64 direct
sums: FFT rounding spreads over the whole output, so a norm-wise figure is the meaningful one.
"""

import pytest
import torch
import torch.nn.functional as F

import genoflash
from genoflash.layers.hyena import HyenaFilter, HyenaOperator
from genoflash.ops.hyena import fftconv, fftconv_channels_first, long_conv_reference
from genoflash.ops.hyena import staging, staging_kernels
from genoflash.ops.hyena.fftconv import fft_size

FP32_TOL = 2e-6  # measured up to 3e-7 at seqlen 1000
BACKENDS = ["torch", "triton"]  # on a CPU, triton runs the staging kernels under the interpreter
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


@pytest.fixture(autouse=True)
def stage_with_triton_at_every_size(monkeypatch):
    """The triton backend stages small FFT groups with torch ops (launches cost more than they
    save there); the tests' sizes are all small, so they lift that floor to reach the kernels."""
    monkeypatch.setattr(staging, "FUSED_MIN_ELEMENTS", 0)


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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("asked", ["h", "D", "x", "xD", "hD", "xh"])
def test_gradients_only_where_asked(asked, causal, dtype, backend):
    """Each subset of (x, h, D): the backward builds only the spectra it needs (dD comes from dh's
    correlation when h is asked too, from a direct sum otherwise), and the rest stay None. float32
    on the triton backend takes the staging kernels (their unnormalised inverse FFT: dD's 1 / n)."""
    x64, h64, D64 = conv_inputs(2, 33, 4, causal)
    dy = torch.randn(2, 33, 4, dtype=torch.float64)
    inputs = {"x": x64.to(dtype), "h": h64.to(dtype), "D": D64.to(dtype)}
    for name in asked:
        inputs[name].requires_grad_()
    with genoflash.use_backend(backend):
        fftconv(inputs["x"], inputs["h"], inputs["D"], causal, 3).backward(dy.to(dtype))  # groups of 3 and 1
    ref = {name: t.requires_grad_(name in asked) for name, t in zip("xhD", (x64, h64, D64))}
    long_conv_reference(ref["x"], ref["h"], ref["D"], causal).backward(dy)
    for name, t in inputs.items():
        if name in asked:
            assert rel_err(t.grad, ref[name].grad) < (FP64_TOL if dtype == torch.float64 else 1e-5), name
        else:
            assert t.grad is None, name


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
        (lambda: fftconv(x, h, D.int()), TypeError, "D must be a floating-point tensor"),
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
def test_output_scale_with_and_without_filter_normalisation(causal):
    """HyenaDNA's unnormalised filters (the default): an order-2 operator's output grows like
    l_max^2 (x4096 from l_max 256 to 16,384). normalize_filters=True divides each filter by its
    window's sum, and the scale stays put."""
    stds = {}
    for normalize in (False, True):
        for l_max in (256, 16384):
            torch.manual_seed(0)
            layer = HyenaOperator(d_model=8, l_max=l_max, order=2, filter_order=16, causal=causal,
                                  normalize_filters=normalize)
            with torch.no_grad():
                stds[normalize, l_max] = layer(torch.randn(1, l_max, 8)).std().item()
    assert 0.25 < stds[True, 16384] / stds[True, 256] < 4.0, stds
    assert stds[False, 16384] / stds[False, 256] > 100.0, stds


# ---------------------------------------------------------------- fftconv_channels_first



def as_channels_first(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).contiguous()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("channel_chunk", [None, 2])
@pytest.mark.parametrize("seqlen", [1, 17, 129])
@pytest.mark.parametrize("causal", [True, False])
def test_channels_first_matches_direct_sums(causal, seqlen, channel_chunk, backend, poison_allocations):
    """Every output element written (NaN-poisoned allocations), whatever the group split."""
    x, h, D = conv_inputs(2, seqlen, 5, causal)
    ref = as_channels_first(long_conv_reference(x, h, D, causal))
    for dtype, tol in ((torch.float32, FP32_TOL), (torch.float64, FP64_TOL)):
        with genoflash.use_backend(backend):
            y = fftconv_channels_first(as_channels_first(x).to(dtype), h.to(dtype), D.to(dtype), causal, channel_chunk)
        assert y.dtype == dtype and y.shape == ref.shape and y.is_contiguous()
        assert rel_err(y, ref) < tol, (dtype, rel_err(y, ref))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal, taps", [(True, 1), (True, 5), (False, 1), (False, 9)])
def test_channels_first_short_filters(causal, taps, backend):
    x, h, D = conv_inputs(2, 33, 3, causal, taps=taps)
    with genoflash.use_backend(backend):
        for skip in (None, D):
            y = fftconv_channels_first(as_channels_first(x).float(), h.float(), None if skip is None else skip.float(),
                                       causal)
            assert rel_err(y, as_channels_first(long_conv_reference(x, h, skip, causal))) < FP32_TOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seqlen", [1, 17, 64])
@pytest.mark.parametrize("causal", [True, False])
def test_channels_first_gradients_match_the_reference(causal, seqlen, backend, poison_allocations):
    x, h, D = (t.requires_grad_() for t in conv_inputs(2, seqlen, 5, causal))
    dy = torch.randn(2, seqlen, 5, dtype=torch.float64)
    ref_grads = torch.autograd.grad(long_conv_reference(x, h, D, causal), (x, h, D), dy)
    ref_grads = (as_channels_first(ref_grads[0]), *ref_grads[1:])
    for dtype, tol in ((torch.float64, FP64_TOL), (torch.float32, 1e-5)):
        inputs = [as_channels_first(x).detach().to(dtype).requires_grad_(),
                  *(t.detach().to(dtype).requires_grad_() for t in (h, D))]
        with genoflash.use_backend(backend):
            grads = torch.autograd.grad(fftconv_channels_first(*inputs, causal, 2), inputs,
                                        as_channels_first(dy).to(dtype))
        for name, g, ref, inp in zip("xhD", grads, ref_grads, inputs):
            assert g.dtype == dtype and g.shape == inp.shape and g.is_contiguous(), name
            assert rel_err(g, ref) < tol, (name, dtype, rel_err(g, ref))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_channels_first_is_fftconv_transposed(causal, dtype, backend):
    """The two entry points compute the same thing, forward and backward, in every input dtype."""
    x, h, D = conv_inputs(3, 45, 6, causal)
    x = x.to(dtype)
    h, D = h.float(), D.float()
    dy = torch.randn(3, 45, 6).to(dtype)
    with genoflash.use_backend(backend):
        last = [t.clone().requires_grad_() for t in (x, h, D)]
        y_last = fftconv(*last, causal, 4)
        g_last = torch.autograd.grad(y_last, last, dy)
        first = [as_channels_first(x).requires_grad_(), h.clone().requires_grad_(), D.clone().requires_grad_()]
        y_first = fftconv_channels_first(*first, causal, 4)
        g_first = torch.autograd.grad(y_first, first, as_channels_first(dy))
    assert y_last.is_contiguous() and y_first.is_contiguous() and y_first.dtype == y_last.dtype == dtype
    torch.testing.assert_close(y_first, as_channels_first(y_last), rtol=0, atol=0)
    torch.testing.assert_close(g_first[0], as_channels_first(g_last[0]), rtol=0, atol=0)
    for a, b in zip(g_first[1:], g_last[1:]):
        torch.testing.assert_close(a, b)  # summed over (batch, time): the order of the sums may differ


@pytest.mark.parametrize("backend", BACKENDS)
def test_channels_first_takes_strided_inputs(backend, poison_allocations):
    """x a channel slice of a wider tensor (batch stride > channels * seqlen), h a transposed
    view, dy an expanded tensor (from .sum()): the results do not depend on strides."""
    x, h, D = conv_inputs(2, 50, 4, True)
    wide = torch.randn(2, 11, 50, dtype=torch.float64)
    wide[:, 3:7] = as_channels_first(x)
    xs = wide.float()[:, 3:7].requires_grad_()
    hs = h.float().t().contiguous().t().requires_grad_()
    assert not xs.is_contiguous() and not hs.is_contiguous()
    with genoflash.use_backend(backend):
        y = fftconv_channels_first(xs, hs, D.float(), True, 3)
        y.sum().backward()
    xr, hr = (t.detach().clone().requires_grad_() for t in (x, h))
    ref = long_conv_reference(xr, hr, D, True)
    ref.sum().backward()
    assert rel_err(y, as_channels_first(ref)) < FP32_TOL
    assert rel_err(xs.grad, as_channels_first(xr.grad)) < 1e-5 and rel_err(hs.grad, hr.grad) < 1e-5


def test_channels_first_saves_only_x_h_and_D():
    x, h, D = conv_inputs(2, 256, 8, True)
    x = as_channels_first(x).to(torch.bfloat16).requires_grad_()
    h, D = h.float().requires_grad_(), D.float().requires_grad_()
    _, ours = saved_bytes(lambda: fftconv_channels_first(x, h, D))
    assert ours == sum(t.numel() * t.element_size() for t in (x, h, D))


def _bad_channels_first_calls():
    x, h, D = (t.float() for t in conv_inputs(2, 8, 3, True))
    x = as_channels_first(x)  # (2, 3, 8)
    return [
        (lambda: fftconv_channels_first(x.numpy(), h), TypeError, "torch.Tensor"),
        (lambda: fftconv_channels_first(x.long(), h), TypeError, "float16, bfloat16"),
        (lambda: fftconv_channels_first(x[0], h), ValueError, "rank 3 \\(batch, channels, seqlen\\)"),
        (lambda: fftconv_channels_first(x[:, :, :0], h[:, :0]), ValueError, ">= 1"),
        (lambda: fftconv_channels_first(x, h[:2]), ValueError, "h has 2 channels but x has 3"),
        (lambda: fftconv_channels_first(x, torch.randn(3, 9)), ValueError, "reach no output"),
        (lambda: fftconv_channels_first(x, torch.randn(3, 14), causal=False), ValueError, "odd number"),
        (lambda: fftconv_channels_first(x, h, D[:2]), ValueError, "D has 2 channels"),
        (lambda: fftconv_channels_first(x, h.to("meta")), ValueError, "device"),
        (lambda: fftconv_channels_first(x, h, causal=1), TypeError, "causal must be a bool"),
        (lambda: fftconv_channels_first(x, h, channel_chunk=0), ValueError, "channel_chunk must be >= 1"),
    ]


@pytest.mark.parametrize("index", range(len(_bad_channels_first_calls())))
def test_channels_first_bad_inputs_raise_clear_errors(index):
    call, error, match = _bad_channels_first_calls()[index]
    with pytest.raises(error, match=match):
        call()


def test_small_groups_are_staged_by_torch_ops(monkeypatch):
    """Under the floor the triton backend runs no staging kernel, and computes the same values.

    The kernels run where Triton does: on the GPU, or interpreted on the CPU. CPU tensors on a
    machine with a GPU take torch ops at every size, so the test uses the GPU there."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, h, D = (t.float().to(device) for t in conv_inputs(2, 40, 3, True))
    x = as_channels_first(x)
    with genoflash.use_backend("triton"):
        fused = fftconv_channels_first(x, h, D)

        class NoLaunch:
            def __getitem__(self, grid):
                raise AssertionError("a staging kernel was launched")

        monkeypatch.setattr(staging_kernels, "_load_rows_kernel", NoLaunch())
        monkeypatch.setattr(staging_kernels, "_write_window_kernel", NoLaunch())
        with pytest.raises(AssertionError, match="launched"):
            fftconv_channels_first(x, h, D)
        monkeypatch.setattr(staging, "FUSED_MIN_ELEMENTS", 2 * 3 * 80 + 1)  # batch * channels * n, plus one
        torch.testing.assert_close(fftconv_channels_first(x, h, D), fused)


def test_a_channels_last_tensor_is_not_read_as_channels_first():
    """(batch, seqlen, channels) handed to the channels-first entry point fails loudly when the
    filter's channel count does not fit dim 1."""
    x, h, _ = conv_inputs(1, 16, 3, True)
    with pytest.raises(ValueError, match="h has 3 channels but x has 16"):
        fftconv_channels_first(x, h)


# ---------------------------------------------------------------- the layer, channels-first inside

def channels_last_hyena(layer: HyenaOperator, u: torch.Tensor) -> torch.Tensor:
    """HyenaOperator.forward as it reads on paper, every step channels-last through public ops:
    what the channels-first internals must reproduce."""
    z = F.linear(u, layer.in_proj.weight, layer.in_proj.bias)
    conv = layer.short_conv.conv
    z = F.conv1d(F.pad(z.transpose(1, 2), (layer.short_conv.left, conv.kernel_size[0] - 1 - layer.short_conv.left)),
                 conv.weight, conv.bias, groups=conv.in_channels).transpose(1, 2)
    v, *gates = z.split(layer.d_model, dim=-1)
    for gate, h, D in zip(gates, layer.filter(u.shape[1]), layer.skip):
        v = gate * fftconv(v, h, D, layer.causal)
    return layer.out_proj(v)


@pytest.mark.parametrize("backend, dtype, tol", [("torch", torch.float64, 1e-12), ("torch", torch.float32, 1e-5),
                                                 ("triton", torch.float32, 1e-5)])
@pytest.mark.parametrize("causal, short", [(True, 3), (False, 3), (False, 4)])
def test_operator_is_its_channels_last_composition(causal, short, backend, dtype, tol):
    torch.manual_seed(0)
    layer = HyenaOperator(d_model=6, l_max=40, order=2, filter_order=8, short_filter_order=short,
                          causal=causal).to(dtype)
    layer.channel_chunk = 4  # two groups of the 6 channels, the second short
    u = torch.randn(2, 37, 6, dtype=dtype, requires_grad=True)
    dy = torch.randn(2, 37, 6, dtype=dtype)
    params = [u, *layer.parameters()]
    with genoflash.use_backend(backend):
        y = layer(u)
        grads = torch.autograd.grad(y, params, dy)
    ref = channels_last_hyena(layer, u)
    ref_grads = torch.autograd.grad(ref, params, dy)
    assert y.is_contiguous() and grads[0].is_contiguous()
    names = ["y", "u", *(name for name, _ in layer.named_parameters())]
    for name, g, r in zip(names, [y, *grads], [ref, *ref_grads]):
        assert rel_err(g, r) < tol, (name, rel_err(g, r))


def test_filters_come_out_as_the_mlp_computes_them():
    """The column-wise MLP (one filter per order, each its own tensor) equals nn.Sequential
    applied row by row, times the window."""
    torch.manual_seed(0)
    filt = HyenaFilter(d_model=5, order=3, l_max=30, filter_order=8, causal=False)
    t = filt.positions(30)
    rows = filt.mlp(filt.features(t)).view(-1, 3, 5)  # (taps, order, d_model)
    window = torch.exp(-filt.rates * t.abs()[:, None]) / filt.window_sum
    expected = (rows * window[:, None, :]).permute(1, 2, 0)
    per_order = filt.filters(30)
    assert len(per_order) == 3 and all(h.is_contiguous() and h.shape == (5, 59) for h in per_order)
    torch.testing.assert_close(torch.stack(per_order), expected)
    torch.testing.assert_close(filt(30), expected)


def test_operator_state_dict_keys_are_unchanged():
    """Checkpoints from before the channels-first rewrite load as they are."""
    layer = HyenaOperator(d_model=4, l_max=8, order=2)
    assert sorted(layer.state_dict()) == sorted([
        "in_proj.weight", "in_proj.bias", "short_conv.conv.weight", "short_conv.conv.bias",
        "filter.mlp.0.weight", "filter.mlp.0.bias", "filter.mlp.1.freq", "filter.mlp.2.weight", "filter.mlp.2.bias",
        "filter.mlp.3.freq", "filter.mlp.4.weight", "filter.mlp.4.bias", "skip", "out_proj.weight", "out_proj.bias"])


@pytest.mark.parametrize("used", [(0, 1, 2), (1,)], ids=["every-order", "one-order"])
def test_implicit_filter_function_matches_autograd_through_the_reference(used):
    """The hand-written backward against autograd through the same math, float64, every gradient;
    with one order's filter unused, its rows of the last layer's gradients must come back zero."""
    from genoflash.ops.hyena.implicit_filter import implicit_filter, implicit_filter_reference
    gen = torch.Generator().manual_seed(0)

    def param(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()
    x, window = torch.randn(9, 37, generator=gen, dtype=torch.float64), torch.rand(5, 37, generator=gen,
                                                                                  dtype=torch.float64)
    hidden = [(param(8, 9), param(8), param(8)), (param(8, 8), param(8), param(8))]
    w_last, b_last = param(15, 8), param(15)
    params = [t for layer in hidden for t in layer] + [w_last, b_last]
    grads = [torch.randn(5, 37, generator=gen, dtype=torch.float64) for _ in range(3)]

    def loss(outs):
        return sum((outs[i] * grads[i]).sum() for i in used)
    got = implicit_filter(x, window, hidden, w_last, b_last, order=3)
    ref = implicit_filter_reference(x, window, hidden, w_last, b_last, order=3)
    for g, r in zip(got, ref):
        assert g.shape == (5, 37) and g.is_contiguous()
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
    dgot = torch.autograd.grad(loss(got), params)
    dref = torch.autograd.grad(loss(ref), params, allow_unused=True)
    for g, r in zip(dgot, dref):
        torch.testing.assert_close(g, torch.zeros_like(g) if r is None else r, rtol=1e-10, atol=1e-12)
    assert dgot[-2].abs().sum() > 0  # a test that can fail: the used order's rows are not zero
    assert torch.autograd.gradcheck(lambda *p: implicit_filter(x, window, [p[0:3], p[3:6]], p[6], p[7], 3),
                                    params)


def test_implicit_filter_under_bf16_autocast_returns_gradients_in_each_parameter_dtype():
    torch.manual_seed(0)
    filt = HyenaFilter(d_model=4, order=2, l_max=32, filter_order=8)
    ref = filt.filters(32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hs = filt.filters(32)
    assert all(h.dtype == torch.bfloat16 for h in hs)
    grads = torch.autograd.grad(sum(h.float().sum() for h in hs), list(filt.parameters()))
    assert all(g.dtype == p.dtype and torch.isfinite(g).all() for g, p in zip(grads, filt.parameters()))
    assert max(rel_err(h, r) for h, r in zip(hs, ref)) < 5e-2


def test_filter_constants_are_cached_until_the_buffers_or_the_length_change():
    torch.manual_seed(0)
    filt = HyenaFilter(d_model=4, order=2, l_max=32, filter_order=8)
    x, window = filt.constants(32)
    assert filt.constants(32)[1] is window and filt.constants(16)[1].shape == (4, 16)
    before = filt.filters(32)
    filt.rates.mul_(2.0)  # an in-place change of a buffer bumps its version: recomputed
    x2, window2 = filt.constants(32)
    assert window2 is not window and not torch.allclose(window2, window)
    assert not torch.allclose(filt.filters(32)[0], before[0])
    with torch.inference_mode():  # inference tensors could not be saved for a later backward
        filt.constants(20)
    assert filt.constants(20)[1] is not filt.constants(32)[1]
    h = filt.filters(20)[0]
    torch.autograd.grad(h.sum(), filt.mlp[0].weight)  # trains after an inference-mode call
    filt.CONSTANTS_CACHE_BYTES = 0  # above the cap: computed every call
    assert filt.constants(32)[1] is not filt.constants(32)[1]


def test_filter_mlp_of_another_shape_gets_a_clear_error():
    filt = HyenaFilter(d_model=4, order=2, l_max=16, filter_order=8)
    filt.mlp = torch.nn.Sequential(torch.nn.Linear(9, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    with pytest.raises(TypeError, match=r"\(Linear, Sine\) pairs followed by a Linear"):
        filt.filters(16)
