"""Hyena's implicit filter MLP as one autograd Function: positional features -> (Linear -> Sine)
x n -> Linear, one row block per order, times a decay window.

    a_1 = W_1 x + b_1,  g_1 = sin(f_1 * a_1),  ...,  a_n = W_n g_{n-1} + b_n,  g_n = sin(f_n * a_n)
    h_i = (W_last[rows_i] g_n + b_last[rows_i]) * window          i = 0 .. order - 1

with x (features, taps) and every activation laid out (width, taps): each filter comes out as
contiguous rows, the layout the FFT convolution reads.

Why a Function: the same math through autograd is ~200 small ops per forward+backward (slices of
the last layer per order and their zero-filled slice gradients, a Mul and a Sin node per hidden
layer, ...). At 16k tokens the Hyena layer is bound by host time, not by its kernels (docs/design/hyena.md),
and this filter is the largest block of those ops. Here the backward is written out: one
gradient buffer per parameter, each written once.

The reference is the same composition in torch ops (`implicit_filter_reference`), which
tests/test_hyena.py compares against in float64, values and every gradient.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


def implicit_filter_reference(x: torch.Tensor, window: torch.Tensor, hidden: list[tuple[torch.Tensor, ...]],
                              w_last: torch.Tensor, b_last: torch.Tensor, order: int) -> list[torch.Tensor]:
    """The same filters by plain autograd: the readable statement of what the Function computes."""
    for weight, bias, freq in hidden:
        x = torch.sin(freq[:, None] * (weight @ x + bias[:, None]))
    d = w_last.shape[0] // order
    return [(w_last[i * d:(i + 1) * d] @ x + b_last[i * d:(i + 1) * d, None]) * window for i in range(order)]


class ImplicitFilterFunction(torch.autograd.Function):
    """Inputs: x, window, order, w_last, b_last, then (weight, bias, freq) per hidden layer,
    flattened. x and window are constants (no gradient): they depend on the sequence length and
    the module's buffers only.

    Every order's rows of the last layer run as one matmul, forward and backward: the filters are
    returned as views of one (order * d, taps) result, and their gradients are stacked back into
    one. Op count matters more than bytes here (the module docstring)."""

    @staticmethod
    def forward(ctx, x, window, order, w_last, b_last, *hidden_flat):
        hidden = [hidden_flat[i:i + 3] for i in range(0, len(hidden_flat), 3)]
        # Kept per hidden layer: its input (for dW), its pre-activation a (for df), the sine's
        # argument f a (for the derivative cos(f a)) and, of the last layer, the sine's output
        # (for dW_last). f a is computed on the way to the sine anyway; keeping it saves the
        # backward recomputing it.
        saved = [x]
        for weight, bias, freq in hidden:
            a = torch.addmm(bias[:, None], weight, x)
            fa = freq[:, None] * a
            x = torch.sin(fa)
            saved += [a, fa, x]
        d = w_last.shape[0] // order
        # (order * d, taps) viewed as (order, d, taps): the window multiplies every order's rows.
        filters = torch.addmm(b_last[:, None], w_last, x).view(order, d, -1).mul_(window)
        ctx.save_for_backward(window, w_last, *hidden_flat, *saved)
        ctx.set_materialize_grads(False)  # an order whose filter reaches no loss arrives as None, not zeros
        ctx.order, ctx.n_hidden, ctx.b_last_dtype = order, len(hidden), b_last.dtype
        return tuple(filters.unbind(0))

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        window, w_last, *rest = ctx.saved_tensors
        n = ctx.n_hidden
        hidden = [rest[3 * i: 3 * i + 3] for i in range(n)]
        acts = rest[3 * n:]  # x, then (a, f a, g) per hidden layer
        inputs = [acts[0]] + [acts[3 + 3 * i] for i in range(n - 1)]  # the input of each hidden layer
        pre = [acts[1 + 3 * i] for i in range(n)]
        args = [acts[2 + 3 * i] for i in range(n)]
        g_last = acts[-1]
        # The matmuls run in the activations' dtype, as the forward's did (autocast's, under
        # autocast; the parameters' otherwise, and then every cast below is a no-op). Gradients
        # are returned in each parameter's own dtype.
        ct = g_last.dtype
        if all(g is None for g in grads):  # no filter reached a loss
            return (None,) * (5 + 3 * n)
        # An order whose filter reached no loss contributes zero rows (in the others' dtype: the
        # filters' own, which the stack and the in-place product keep).
        present = next(g for g in grads if g is not None)
        grads = [torch.zeros_like(present) if g is None else g for g in grads]
        dz = torch.stack(grads).mul_(window).to(ct).view(w_last.shape[0], -1)  # d(z * window)/dz
        dw_last = dz @ g_last.mT
        db_last = dz.sum(1)
        dg = w_last.to(ct).mT @ dz  # gradient of the last hidden output, (width, taps)
        hidden_grads: list[torch.Tensor | None] = []
        for k in reversed(range(n)):
            weight, bias, freq = hidden[k]
            # g = sin(f a): dg/da = f cos(f a), dg/df = a cos(f a).
            dgc = torch.cos(args[k]).mul_(dg)
            # Not as a batched dot (bmm of (width, 1, taps) by (width, taps, 1)): one op fewer, but
            # cuBLAS took 56 us for it at 64 x 64k where these two take 19, and 779 against 150 at
            # 1M (H200; docs/design/hyena.md).
            dfreq = (dgc * pre[k]).sum(1)
            da = dgc.mul_(freq[:, None]).to(ct)
            dweight = da @ inputs[k].mT
            dbias = da.sum(1)
            dg = weight.to(ct).mT @ da if k > 0 else None  # x, the features, needs no gradient
            hidden_grads = [dweight.to(weight.dtype), dbias.to(bias.dtype), dfreq.to(freq.dtype)] + hidden_grads
        return (None, None, None, dw_last.to(w_last.dtype), db_last.to(ctx.b_last_dtype), *hidden_grads)


def implicit_filter(x: torch.Tensor, window: torch.Tensor, hidden: list[tuple[torch.Tensor, ...]],
                    w_last: torch.Tensor, b_last: torch.Tensor, order: int) -> tuple[torch.Tensor, ...]:
    """The order filters h_i (rows_i of the last layer), each (w_last.shape[0] // order, taps), contiguous.

    x: (features, taps), the positional features; window: (d, taps); hidden: (weight, bias, freq)
    per Linear -> Sine layer; w_last, b_last: the last Linear, order * d rows."""
    flat = [t for layer in hidden for t in layer]
    return ImplicitFilterFunction.apply(x, window, order, w_last, b_last, *flat)
