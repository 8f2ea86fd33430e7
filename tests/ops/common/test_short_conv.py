"""The short depthwise convolution (ops/common/short_conv.py): Hyena's short filter and Mamba's
causal conv1d with its fused SiLU, against nn.functional's conv1d in float64, and its input checks."""

import pytest
import torch

import genoflash
from genoflash.ops.common.short_conv import depthwise_conv1d, short_conv, short_conv_reference

from tests.utils import HAS_CUDA


DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if HAS_CUDA else [])
# 40 crosses a block boundary under the interpreter (blocks of 32) into a partial block, as 70 did
# (the GPU's blocks of 1024 hold either whole); each block is a Python call there. Every dtype at
# that length; the lengths shorter than the taps' window (1, 5) in float32 under the interpreter
# (the same kernels, whose dtype only changes the loads' and stores' conversions), in every dtype
# on the GPU.
LENGTHS_AND_DTYPES = [(seqlen, dtype) for seqlen in (1, 5, 40) for dtype in DTYPES
                      if HAS_CUDA or seqlen == 40 or dtype == torch.float32]


@pytest.mark.parametrize("seqlen, dtype", LENGTHS_AND_DTYPES, ids=[f"{n}-{d}" for n, d in LENGTHS_AND_DTYPES])
@pytest.mark.parametrize("taps, left", [(1, 0), (3, 2), (3, 1), (4, 1), (4, 3), (5, 2)])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_short_conv_matches_conv1d(seqlen, taps, left, activation, dtype, device, poison_allocations):
    """The Triton kernel (interpreted on a CPU) against nn.functional's conv1d on a padded copy,
    with and without each bias, on a channel slice of a wider tensor, with and without the fused
    SiLU (Mamba's conv): every output and gradient, in float64, within the rounding of the dtype's
    output."""
    gen = torch.Generator().manual_seed(seqlen * 10 + taps)
    wide = torch.randn(2, 9, seqlen, generator=gen)
    w, b, ib = torch.randn(4, taps, generator=gen), torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    dy = torch.randn(2, 4, seqlen, generator=gen)
    for bias, input_bias in ((None, None), (b, ib)):
        x = wide.to(device, dtype)[:, 2:6].requires_grad_()
        args = [t.to(device, dtype).requires_grad_() for t in (w, *(() if bias is None else (bias,)))]
        ib_ = None if input_bias is None else input_bias.to(device).requires_grad_()  # float32 whatever x's dtype
        y = short_conv(x, args[0], args[1] if bias is not None else None, left, ib_,
                       interpreted=not HAS_CUDA, activation=activation)
        inputs = [x, *args, *(() if ib_ is None else (ib_,))]
        grads = torch.autograd.grad(y, inputs, dy.to(device, dtype))
        ref_in = [t.detach().double().requires_grad_() for t in inputs]
        ref = short_conv_reference(ref_in[0], ref_in[1], ref_in[2] if bias is not None else None, left,
                                   ref_in[-1] if ib_ is not None else None, activation)
        ref_grads = torch.autograd.grad(ref, ref_in, dy.to(device).double())
        assert y.is_contiguous() and y.dtype == dtype and grads[0].is_contiguous()
        tol = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
        # dw, dbias and dinput_bias are sums over (batch, time): their rounding grows as the root
        # of the number of terms (2 x 40 here; with the SiLU the terms no longer cancel as plain
        # dy's do).
        summed = (2 * seqlen) ** 0.5
        for name, g, r in zip(["y", "dx", "dw", "dbias", "dinput_bias"], [y, *grads], [ref, *ref_grads]):
            bound = tol * max(1.0, r.abs().max().item()) * (summed if name.startswith("dw") or "bias" in name else 1)
            assert (g.double() - r).abs().max() <= bound, name


def test_short_conv_rejects_bad_arguments():
    x, w = torch.randn(1, 3, 8), torch.randn(3, 3)
    with pytest.raises(ValueError, match="left must be in"):
        short_conv(x, w, None, 3, interpreted=True)
    with pytest.raises(ValueError, match="expected x"):
        short_conv(x, w[:2], None, 1, interpreted=True)
    with pytest.raises(TypeError, match="share one dtype"):
        short_conv(x, w.double(), None, 1, interpreted=True)
    with pytest.raises(ValueError, match="input_bias must be"):
        short_conv(x, w, None, 1, torch.randn(2), interpreted=True)
    with pytest.raises(ValueError, match="activation must be one of"):
        short_conv(x, w, None, 1, interpreted=True, activation="gelu")
    with genoflash.use_backend("torch"), pytest.raises(ValueError, match="activation must be one of"):
        depthwise_conv1d(x, w, None, 1, activation="gelu")  # the torch backend's path, the reference
