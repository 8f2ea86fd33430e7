"""Standard attention, written the plain way: the seed's "standard self-attention".

This is what a reader opens first to learn what the op computes. It materialises the
full (seqlen_q, seqlen_k) score matrix, so it costs O(N^2) memory: it exists for tests
(the float64 ground truth) and for memory comparisons, never for long sequences.

Layout follows flash-attn: q is (batch, seqlen_q, nheads, headdim), k is
(batch, seqlen_k, nheads_k, headdim) and v is (batch, seqlen_k, nheads_k, headdim_v).
nheads_k divides nheads (GQA/MQA): query head h uses kv head h // (nheads // nheads_k).

For query i and key j, with shift = seqlen_k - seqlen_q (positions aligned bottom-right,
as in flash-attn >= 2.1):
    score = softmax_scale * q_i . k_j
    score = softcap * tanh(score / softcap)          if softcap > 0
    score = score - slope_h * |i + shift - j|        if alibi_slopes is given
key j is visible iff (left < 0 or j >= i + shift - left) and (right < 0 or j <= i + shift + right)
with (left, right) = window_size; causal means right = 0. A query that sees no key gets
output 0 and a log-sum-exp of -inf (never NaN).
"""

from __future__ import annotations

import math

import torch

from .dropout import DropoutArgs, keep_mask


def attention_mask(seqlen_q: int, seqlen_k: int, causal: bool = False, device=None,
                   window_size: tuple[int, int] = (-1, -1)) -> torch.Tensor | None:
    """Boolean (seqlen_q, seqlen_k) mask, True where query i may attend to key j (None: all)."""
    left, right = window_size[0], 0 if causal else window_size[1]
    if left < 0 and right < 0:
        return None
    i = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=device)[None, :]
    return ((j >= i - left) | (left < 0)) & ((j <= i + right) | (right < 0))


def attention_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout: DropoutArgs | None = None,
    batch_offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(probs, lse, keep): the softmax probabilities (batch, nheads, seqlen_q, seqlen_k) before dropout,
    in float32 (float64 for float64 inputs), 0 where masked; lse (batch, nheads, seqlen_q), -inf for
    rows that see no key; and the kernels' dropout keep mask (dropout.py), or None without dropout."""
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k = k.shape[1]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(headdim)
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    # GQA: give every query head its own copy of its kv head (plain, and O(N) extra memory).
    k = k.repeat_interleave(nheads // k.shape[2], dim=2)
    # (batch, nheads, seqlen_q, seqlen_k): the N x N matrix that flash attention avoids.
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k).to(acc_dtype) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        i = torch.arange(seqlen_q, device=q.device)[:, None] + (seqlen_k - seqlen_q)
        j = torch.arange(seqlen_k, device=q.device)[None, :]
        slopes = alibi_slopes.to(acc_dtype).reshape(-1, nheads, 1, 1)  # (1 or batch, nheads, 1, 1)
        scores = scores - slopes * (i - j).abs().to(acc_dtype)
    mask = attention_mask(seqlen_q, seqlen_k, causal, q.device, window_size)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # -inf for rows that see no key
    # exp(s - lse) is the softmax; rows with lse = -inf would give NaN, so zero them.
    probs = torch.exp(scores - lse.unsqueeze(-1).masked_fill(torch.isinf(lse).unsqueeze(-1), 0.0))
    keep = None
    if dropout is not None:  # the kernels' Philox mask (dropout.py); lse stays that of the full softmax
        bh = (torch.arange(batch, device=q.device)[:, None] + batch_offset) * nheads + torch.arange(nheads,
                                                                                                  device=q.device)
        keep = keep_mask(dropout, bh[:, :, None, None], torch.arange(seqlen_q, device=q.device)[:, None],
                         torch.arange(seqlen_k, device=q.device)[None, :])
    return probs, lse, keep


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout: DropoutArgs | None = None,
    batch_offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (out, lse), lse (batch, nheads, seqlen_q) in natural log. Differentiable
    through plain torch autograd.

    Matmuls run in the input dtype (as "same-dtype standard attention" does); the softmax
    runs in float32 (float64 for float64 inputs) and its probabilities are cast back to the
    input dtype before the second matmul.
    """
    probs, lse, keep = attention_probs(q, k, softmax_scale, causal, window_size, softcap, alibi_slopes, dropout,
                                       batch_offset)
    if keep is not None:
        probs = torch.where(keep, probs * dropout.rescale, 0.0)
    v = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    out = torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
    return out, lse  # float32 (float64 for float64 inputs)


def attention_reference_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout: DropoutArgs | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed sequences: q (total_q, nheads, headdim), k/v (total_k, nheads_k, ...), sequence b
    being rows cu_seqlens[b]:cu_seqlens[b + 1]. Each sequence is attended on its own (the
    mask, shift and ALiBi distances use its own lengths). Returns out (total_q, nheads,
    headdim_v) and lse (nheads, total_q), as flash-attn's varlen functions do."""
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        out, lse = attention_reference(
            q[cu_q[b]:cu_q[b + 1]][None], k[cu_k[b]:cu_k[b + 1]][None], v[cu_k[b]:cu_k[b + 1]][None],
            softmax_scale, causal, window_size, softcap, slopes, dropout, b)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=-1)
