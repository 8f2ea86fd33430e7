"""Mamba's selective scan (S6), written as the plain sequential recurrence. Readable, slow.

For every batch b, channel d and state n, over time t:
    h[t] = exp(delta[t, d] * A[d, n]) * h[t-1] + delta[t, d] * B[t, n] * u[t, d]
    y[t, d] = sum_n C[t, n] * h[t, d, n] + D[d] * u[t, d]
    out = y * silu(z)                                      (when z is given)
with delta = softplus(delta + delta_bias) when delta_softplus. A is real and negative, so
every exp(delta * A) < 1: the state forgets, at a rate the input chooses through delta.

Layouts (genoflash's (batch, seqlen, ...) order): u, delta, z (batch, seqlen, dim);
B, C (batch, seqlen, dstate) (Mamba-1's input-dependent B and C, one group); A (dim, dstate);
D, delta_bias (dim,).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def selective_scan_reference(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                             return_last_state=False):
    """The recurrence above, in float32 (float64 for float64 inputs); out in u's dtype."""
    acc = torch.float64 if u.dtype == torch.float64 else torch.float32
    u_, delta_, A_, B_, C_ = (t.to(acc) for t in (u, delta, A, B, C))
    if delta_bias is not None:
        delta_ = delta_ + delta_bias.to(acc)
    if delta_softplus:
        delta_ = F.softplus(delta_)
    batch, seqlen, dim = u.shape
    h = u_.new_zeros(batch, dim, A.shape[1])
    ys = []
    # The steps as one unbind each: indexing [:, t] once per step would give autograd a select per
    # step, whose backward writes a zero tensor of the whole sequence (quadratic in seqlen).
    steps = zip(*(t.unbind(1) for t in (delta_, u_, B_, C_)))
    for delta_t, u_t, B_t, C_t in steps:
        decay = torch.exp(delta_t[:, :, None] * A_)                          # (batch, dim, dstate)
        h = decay * h + (delta_t * u_t)[:, :, None] * B_t[:, None, :]
        ys.append((h * C_t[:, None, :]).sum(-1))                            # (batch, dim)
    y = torch.stack(ys, dim=1) if ys else u_.new_zeros(batch, 0, dim)
    if D is not None:
        y = y + u_ * D.to(acc)
    if z is not None:
        y = y * F.silu(z.to(acc))
    out = y.to(u.dtype)
    return (out, h) if return_last_state else out
