"""Standard attention, written the plain way: the seed's "standard self-attention".

This is what a reader opens first to learn what the op computes. It materialises the
full (seqlen_q, seqlen_k) score matrix, so it costs O(N^2) memory: it exists for tests
(the float64 ground truth) and for memory comparisons, never for long sequences.

Layout follows flash-attn: q is (batch, seqlen_q, nheads, headdim), k and v are
(batch, seqlen_k, nheads, headdim).

Causal masking is aligned bottom-right (flash-attn >= 2.1): query i may attend to key j
iff j <= i + seqlen_k - seqlen_q. A query that sees no key at all gets output 0 and a
log-sum-exp of -inf (never NaN).
"""

from __future__ import annotations

import math

import torch


def attention_mask(seqlen_q: int, seqlen_k: int, causal: bool, device=None) -> torch.Tensor | None:
    """Boolean (seqlen_q, seqlen_k) mask, True where query i may attend to key j."""
    if not causal:
        return None
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    return j <= i + (seqlen_k - seqlen_q)


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (out, lse), lse in natural log. Differentiable through plain torch autograd.

    Matmuls run in the input dtype (as "same-dtype standard attention" does); the softmax
    runs in float32 (float64 for float64 inputs) and its probabilities are cast back to the
    input dtype before the second matmul.
    """
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    # (batch, nheads, seqlen_q, seqlen_k): the N x N matrix that flash attention avoids.
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k).to(acc_dtype) * scale
    mask = attention_mask(q.shape[1], k.shape[1], causal, q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # -inf for rows that see no key
    # exp(s - lse) is the softmax; rows with lse = -inf would give NaN, so zero them.
    probs = torch.exp(scores - lse.unsqueeze(-1).masked_fill(torch.isinf(lse).unsqueeze(-1), 0.0))
    probs = probs.to(v.dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    return out, lse  # float32 (float64 for float64 inputs)
