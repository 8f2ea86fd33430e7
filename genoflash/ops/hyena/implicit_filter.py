"""Hyena's implicit filter MLP as one autograd Function: positional features -> (Linear -> Sine)
x n -> Linear, one row block per order, times a decay window.

    a_1 = W_1 x + b_1,  g_1 = sin(f_1 * a_1),  ...,  a_n = W_n g_{n-1} + b_n,  g_n = sin(f_n * a_n)
    h_i = (W_last[rows_i] g_n + b_last[rows_i]) * window          i = 0 .. order - 1

with x (features, taps) and every activation laid out (width, taps): each filter comes out as
contiguous rows, the layout the FFT convolution reads.

Why a Function: the same math through autograd is ~200 small ops per forward+backward (slices of
the last layer per order and their zero-filled slice gradients, a Mul and a Sin node per hidden
layer, ...). At 16k tokens the Hyena layer is bound by host time, not by its kernels (NOTES.md),
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
    the module's buffers only."""

    @staticmethod
    def forward(ctx, x, window, order, w_last, b_last, *hidden_flat):
        hidden = [hidden_flat[i:i + 3] for i in range(0, len(hidden_flat), 3)]
        # Kept per hidden layer: its input (for dW), its pre-activation a (for the sine's
        # derivative and df), and the sine's output of the last layer (for dW_last).
        saved = [x]
        for weight, bias, freq in hidden:
            a = torch.addmm(bias[:, None], weight, x)
            x = torch.sin(freq[:, None] * a)
            saved += [a, x]
        d = w_last.shape[0] // order
        outs = tuple(torch.addmm(b_last[i * d:(i + 1) * d, None], w_last[i * d:(i + 1) * d], x).mul_(window)
                     for i in range(order))
        ctx.save_for_backward(window, w_last, *hidden_flat, *saved)
        ctx.set_materialize_grads(False)  # an order whose filter reaches no loss arrives as None, not zeros
        ctx.order, ctx.n_hidden, ctx.b_last_dtype = order, len(hidden), b_last.dtype
        return outs

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        window, w_last, *rest = ctx.saved_tensors
        n = ctx.n_hidden
        hidden = [rest[3 * i: 3 * i + 3] for i in range(n)]
        acts = rest[3 * n:]  # x, then (a, g) per hidden layer
        inputs = [acts[0]] + [acts[2 + 2 * i] for i in range(n - 1)]  # the input of each hidden layer
        pre = [acts[1 + 2 * i] for i in range(n)]
        g_last = acts[-1]
        # The matmuls run in the activations' dtype, as the forward's did (autocast's, under
        # autocast; the parameters' otherwise, and then every cast below is a no-op). Gradients
        # are returned in each parameter's own dtype.
        ct = g_last.dtype
        d = w_last.shape[0] // ctx.order
        w_last_c = w_last.to(ct)
        # Rows of an order whose filter reached no loss must read zero; otherwise each row is written once.
        alloc = torch.empty if all(g is not None for g in grads) else torch.zeros
        dw_last = alloc(w_last.shape, dtype=ct, device=w_last.device)
        db_last = alloc(w_last.shape[0], dtype=ct, device=w_last.device)
        dg = None  # gradient of the last hidden output, (width, taps)
        for i, grad in enumerate(grads):
            if grad is None:
                continue
            rows = slice(i * d, (i + 1) * d)
            dz = torch.mul(grad, window).to(ct)  # d(z * window)/dz
            torch.mm(dz, g_last.mT, out=dw_last[rows])
            torch.sum(dz, 1, out=db_last[rows])
            dg = w_last_c[rows].mT @ dz if dg is None else dg.addmm_(w_last_c[rows].mT, dz)
        hidden_grads: list[torch.Tensor | None] = []
        for k in reversed(range(n)):
            weight, bias, freq = hidden[k]
            if dg is None:  # no filter reached a loss
                hidden_grads = [None, None, None] * (k + 1) + hidden_grads
                break
            # g = sin(f a): dg/da = f cos(f a), dg/df = a cos(f a).
            dgc = torch.cos(freq[:, None] * pre[k]).mul_(dg)
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
