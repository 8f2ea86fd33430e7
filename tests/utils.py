"""What the tests share: whether a GPU is here, fresh random inputs, and the error rule.

The rule (DEVELOPERS.md): for the output and every gradient,
    max|genoflash - fp64 ref| <= 2 * max|same-dtype standard attention - fp64 ref| + eps.

Imported after conftest.py has set TRITON_INTERPRET (on a machine without CUDA).
"""

from __future__ import annotations

import torch

from genoflash.ops.attention.reference import attention_reference

HAS_CUDA = torch.cuda.is_available()
# eps, relative to the largest magnitude of the fp64 reference tensor (at least 1).
EPS = {torch.float32: 1e-5, torch.float16: 1e-4, torch.bfloat16: 1e-3}


def random_qkv(batch, seqlen_q, seqlen_k, nheads, headdim, dtype, device, requires_grad=True):
    """Fresh normal inputs (never zeros) and a random upstream gradient."""
    def make(n):
        return torch.randn(batch, n, nheads, headdim, dtype=dtype, device=device).requires_grad_(requires_grad)
    return make(seqlen_q), make(seqlen_k), make(seqlen_k), torch.randn(batch, seqlen_q, nheads, headdim,
                                                                      dtype=dtype, device=device)


def random_gqa_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, d, dtype, dv=None, device="cuda"):
    """Fresh normal q (nheads heads), k and v (nheads_k heads; v's head dim dv, by default d), all
    requiring grad, and a random upstream gradient shaped as the output."""
    q = torch.randn(batch, seqlen_q, nheads, d, device=device, dtype=dtype).requires_grad_()
    k = torch.randn(batch, seqlen_k, nheads_k, d, device=device, dtype=dtype).requires_grad_()
    v = torch.randn(batch, seqlen_k, nheads_k, dv or d, device=device, dtype=dtype).requires_grad_()
    return q, k, v, torch.randn(batch, seqlen_q, nheads, dv or d, device=device, dtype=dtype)


def outputs_and_grads(fn, q, k, v, dout):
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    return (out, *grads)


def reference_pair(q, k, v, dout, causal=False, softmax_scale=None, fn=None):
    """(fp64 ground truth, same-dtype standard attention), each as (out, dq, dk, dv).

    fn(q, k, v) -> out is the standard attention to use; by default attention_reference with
    the given causal and softmax_scale."""
    if fn is None:
        def fn(a, b, c):
            return attention_reference(a, b, c, softmax_scale, causal)[0]

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    truth = outputs_and_grads(fn, q64, k64, v64, dout.double())
    same = outputs_and_grads(fn, q, k, v, dout)
    return truth, same


def assert_within_rule(got, truth, same, names=("out", "dq", "dk", "dv"), factor=2.0):
    for name, g, t, s in zip(names, got, truth, same):
        assert g.shape == t.shape, f"{name}: shape {tuple(g.shape)} != {tuple(t.shape)}"
        assert g.dtype == s.dtype, f"{name}: dtype {g.dtype} != {s.dtype}"
        assert not torch.isnan(g).any(), f"{name}: NaN (an unwritten or poisoned element)"
        err = (g.double() - t).abs().max().item()
        err_std = (s.double() - t).abs().max().item()
        eps = EPS[g.dtype] * max(t.abs().max().item(), 1.0)
        assert err <= factor * err_std + eps, (
            f"{name}: error {err:.3e} > {factor:g} x standard attention's {err_std:.3e} + eps {eps:.1e}")
