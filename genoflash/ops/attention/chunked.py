"""The `torch` backend: FlashAttention's tiled algorithm written with PyTorch ops.

Same algorithm as the Triton kernels (online softmax over key chunks in the forward,
recomputation from the log-sum-exp in the backward), but each "tile" is a torch tensor
of shape (batch, nheads, chunk_q, chunk_k). Memory is O(N * chunk), never O(N^2), so
genoflash works on any machine, CPU included, at genomic lengths.

Everything is computed in float32 (float64 for float64 inputs): each tile is upcast as it
is used, which on the CPU is also faster than half-precision matmuls. Like the kernels,
the probabilities are rounded to the input dtype before they multiply V (and dS before
it multiplies K or Q), so results match the kernels' rounding.
"""

from __future__ import annotations

import torch

# Work on (batch, nheads, chunk_q, chunk_k) score tiles of at most this many elements.
_TILE_ELEMENTS = 1 << 22


def _round(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round to dtype's precision, keep x's dtype (a matmul operand in the kernels' precision)."""
    return x.to(dtype).to(x.dtype)


def _chunk_sizes(batch_heads: int, seqlen_q: int, seqlen_k: int) -> tuple[int, int]:
    chunk_k = min(seqlen_k, 1024)
    chunk_q = max(16, min(seqlen_q, _TILE_ELEMENTS // max(1, batch_heads * chunk_k)))
    return chunk_q, chunk_k


def _visible_key_range(q0: int, q1: int, seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """Keys [0, hi) that queries [q0, q1) may see (bottom-right causal alignment)."""
    if not causal:
        return seqlen_k
    return max(0, min(seqlen_k, q1 + seqlen_k - seqlen_q))


def _causal_tile_mask(q0, q1, k0, k1, seqlen_q, seqlen_k, device):
    i = torch.arange(q0, q1, device=device)[:, None]
    j = torch.arange(k0, k1, device=device)[None, :]
    return j <= i + (seqlen_k - seqlen_q)


def attention_chunked_forward(q, k, v, softmax_scale: float, causal: bool):
    """q (B, Nq, H, D), k/v (B, Nk, H, D) -> out (B, Nq, H, D) in q's dtype, lse (B, H, Nq) fp32."""
    B, Nq, H, D = q.shape
    Nk = k.shape[1]
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, N, D) views, no copy
    out = torch.empty_like(q)
    lse = torch.empty(B, H, Nq, device=q.device, dtype=torch.float32)
    chunk_q, chunk_k = _chunk_sizes(B * H, Nq, Nk)
    for q0 in range(0, Nq, chunk_q):
        q1 = min(Nq, q0 + chunk_q)
        qc = qh[:, :, q0:q1].to(acc_dtype)
        row_max = torch.full((B, H, q1 - q0), float("-inf"), device=q.device, dtype=acc_dtype)
        row_sum = torch.zeros((B, H, q1 - q0), device=q.device, dtype=acc_dtype)
        # acc is un-normalised: acc / row_sum is the output so far.
        acc = torch.zeros((B, H, q1 - q0, vh.shape[-1]), device=q.device, dtype=acc_dtype)
        for k0 in range(0, _visible_key_range(q0, q1, Nq, Nk, causal), chunk_k):
            k1 = min(Nk, k0 + chunk_k)
            s = torch.matmul(qc, kh[:, :, k0:k1].to(acc_dtype).transpose(-1, -2)) * softmax_scale
            if causal:
                s = s.masked_fill(~_causal_tile_mask(q0, q1, k0, k1, Nq, Nk, q.device), float("-inf"))
            new_max = torch.maximum(row_max, s.amax(dim=-1))
            # A row that has seen only masked keys keeps max -inf; use 0 so exp stays 0, not NaN.
            safe_max = new_max.masked_fill(torch.isinf(new_max), 0.0)
            p = torch.exp(s - safe_max.unsqueeze(-1))
            rescale = torch.exp(row_max - safe_max)  # rescales earlier chunks to the new max
            row_sum = row_sum * rescale + p.sum(dim=-1)
            acc = acc * rescale.unsqueeze(-1) + torch.matmul(_round(p, v.dtype), vh[:, :, k0:k1].to(acc_dtype))
            row_max = new_max
        empty = row_sum == 0  # rows that saw no key: output 0, lse -inf
        out[:, q0:q1] = (acc / row_sum.masked_fill(empty, 1.0).unsqueeze(-1)).transpose(1, 2).to(q.dtype)
        lse[:, :, q0:q1] = (row_max + torch.log(row_sum)).masked_fill(empty, float("-inf")).float()
    return out, lse


def attention_chunked_backward(dout, q, k, v, out, lse, softmax_scale: float, causal: bool):
    """Gradients (dq, dk, dv), recomputing each score tile from q, k and the lse."""
    B, Nq, H, D = q.shape
    Nk = k.shape[1]
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    qh, kh, vh, doh = (t.transpose(1, 2) for t in (q, k, v, dout))
    # delta_i = sum_d dO_id * O_id = sum_j P_ij dP_ij: the softmax-gradient correction term.
    delta = (dout.to(acc_dtype) * out.to(acc_dtype)).sum(-1).transpose(1, 2)  # (B, H, Nq)
    # Rows that saw no key have lse -inf; +inf makes every recomputed probability 0 there.
    lse = lse.to(acc_dtype).masked_fill(torch.isinf(lse), float("inf"))
    dq = torch.zeros(B, H, Nq, D, device=q.device, dtype=acc_dtype)
    dk = torch.zeros(B, H, Nk, D, device=q.device, dtype=acc_dtype)
    dv = torch.zeros(B, H, Nk, vh.shape[-1], device=q.device, dtype=acc_dtype)
    chunk_q, chunk_k = _chunk_sizes(B * H, Nq, Nk)
    for q0 in range(0, Nq, chunk_q):
        q1 = min(Nq, q0 + chunk_q)
        qc, doc = qh[:, :, q0:q1].to(acc_dtype), doh[:, :, q0:q1].to(acc_dtype)
        for k0 in range(0, _visible_key_range(q0, q1, Nq, Nk, causal), chunk_k):
            k1 = min(Nk, k0 + chunk_k)
            kc, vc = kh[:, :, k0:k1].to(acc_dtype), vh[:, :, k0:k1].to(acc_dtype)
            s = torch.matmul(qc, kc.transpose(-1, -2)) * softmax_scale
            if causal:
                s = s.masked_fill(~_causal_tile_mask(q0, q1, k0, k1, Nq, Nk, q.device), float("-inf"))
            p = torch.exp(s - lse[:, :, q0:q1, None])
            dv[:, :, k0:k1] += torch.matmul(_round(p, dout.dtype).transpose(-1, -2), doc)
            dp = torch.matmul(doc, vc.transpose(-1, -2))
            ds = _round(p * (dp - delta[:, :, q0:q1, None]), q.dtype)
            dq[:, :, q0:q1] += torch.matmul(ds, kc)
            dk[:, :, k0:k1] += torch.matmul(ds.transpose(-1, -2), qc)
    to_input = lambda g, like: (g.transpose(1, 2)).to(like.dtype)  # noqa: E731
    return to_input(dq * softmax_scale, q), to_input(dk * softmax_scale, k), to_input(dv, v)

