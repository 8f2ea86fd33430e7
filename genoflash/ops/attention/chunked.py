"""The `torch` backend: FlashAttention's tiled algorithm written with PyTorch ops.

Same algorithm as the Triton kernels (online softmax over key chunks in the forward,
recomputation from the log-sum-exp in the backward), but each "tile" is a torch tensor
of shape (batch, nheads_k, group, chunk_q, chunk_k). Memory is O(N * chunk), never O(N^2),
so genoflash works on any machine, CPU included, at genomic lengths.

GQA/MQA: query heads are viewed as (nheads_k, group), and K/V tiles as (nheads_k, 1), so a
matmul broadcasts each kv head over its group of query heads without copying K/V to
nheads heads; dK and dV sum over the group.

Everything is computed in float32 (float64 for float64 inputs): each tile is upcast as it
is used, which on the CPU is also faster than half-precision matmuls. Like the kernels,
the probabilities are rounded to the input dtype before they multiply V (and dS before
it multiplies K or Q), so results match the kernels' rounding.

What is computed (softcap, ALiBi, sliding window, causal) is spelled out in reference.py.
"""

from __future__ import annotations

import torch

from .dropout import DropoutArgs, keep_mask

# Work on score tiles of at most this many elements (batch * nheads * chunk_q * chunk_k).
_TILE_ELEMENTS = 1 << 22


def _round(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round to dtype's precision, keep x's dtype (a matmul operand in the kernels' precision)."""
    return x.to(dtype).to(x.dtype)


def _chunk_sizes(batch_heads: int, seqlen_q: int, seqlen_k: int) -> tuple[int, int]:
    chunk_k = max(1, min(seqlen_k, 1024))  # >= 1: a varlen sequence may have no keys
    chunk_q = max(16, min(seqlen_q, _TILE_ELEMENTS // max(1, batch_heads * chunk_k)))
    return chunk_q, chunk_k


def _grouped(t: torch.Tensor, nheads_k: int) -> torch.Tensor:
    """(B, N, H, D) -> (B, nheads_k, H // nheads_k, N, D) view: query head h = (h // group, h % group)."""
    return t.unflatten(2, (nheads_k, -1)).permute(0, 2, 3, 1, 4)


class _Scores:
    """Recomputes score tiles (softcap, ALiBi and the visibility mask included) for one
    (batch, seqlen_q, seqlen_k) problem; shared by the forward and the backward."""

    def __init__(self, q, k, softmax_scale, causal, window_size, softcap, alibi_slopes, acc_dtype,
                 dropout: DropoutArgs | None = None, batch_offset: int = 0):
        self.seqlen_q, self.seqlen_k = q.shape[1], k.shape[1]
        # Dropout stream index b * nheads + h of each (batch, kv head, group) of a grouped tile;
        # batch_offset is the sequence index when a varlen batch is run one sequence at a time.
        self.dropout = dropout
        nheads = q.shape[2]
        self.bh = (torch.arange(q.shape[0], device=q.device)[:, None] + batch_offset) * nheads + torch.arange(
            nheads, device=q.device)[None, :]
        self.bh = self.bh.reshape(q.shape[0], k.shape[2], nheads // k.shape[2], 1, 1)
        self.shift = self.seqlen_k - self.seqlen_q  # bottom-right alignment of positions
        self.left, self.right = window_size[0], 0 if causal else window_size[1]
        self.scale, self.softcap = softmax_scale, softcap
        # (1 or B, nheads_k, group, 1, 1), to broadcast over a tile.
        self.slopes = (None if alibi_slopes is None else
                       alibi_slopes.to(acc_dtype).reshape(-1, k.shape[2], q.shape[2] // k.shape[2], 1, 1))

    def dropped(self, x, q0: int, k0: int):
        """x (a probability tile or dP) with the kernels' dropout mask applied and kept entries rescaled."""
        if self.dropout is None:
            return x
        rows = torch.arange(q0, q0 + x.shape[-2], device=x.device)[:, None]
        cols = torch.arange(k0, k0 + x.shape[-1], device=x.device)[None, :]
        keep = keep_mask(self.dropout, self.bh, rows, cols)
        return torch.where(keep, x * self.dropout.rescale, 0.0)

    def key_range(self, q0: int, q1: int) -> range:
        """Keys [lo, hi) that at least one query of [q0, q1) may see: the rest are skipped."""
        lo = 0 if self.left < 0 else max(0, q0 + self.shift - self.left)
        hi = self.seqlen_k if self.right < 0 else min(self.seqlen_k, q1 + self.shift + self.right)
        return range(lo, hi)

    def chunk_sizes(self, batch_heads: int) -> tuple[int, int]:
        chunk_q, chunk_k = _chunk_sizes(batch_heads, self.seqlen_q, self.seqlen_k)
        if self.left >= 0 and self.right >= 0:
            # A query chunk visits chunk_q + left + right keys: keep chunk_q near the window
            # width so that a narrow window costs O(N * window), not O(N * chunk_q).
            chunk_q = min(chunk_q, max(128, self.left + self.right + 1))
        return chunk_q, chunk_k

    def tile(self, qc, kc, q0, k0):
        """Scores of queries q0.. against keys k0.., and tanh of the softcap (None without)."""
        s = torch.matmul(qc, kc.transpose(-1, -2)) * self.scale
        t = None
        if self.softcap > 0:
            t = torch.tanh(s / self.softcap)
            s = self.softcap * t
        # Is every key of the tile visible to every query? Then no mask (most causal tiles).
        q1, k1 = q0 + s.shape[-2], k0 + s.shape[-1]
        all_visible = ((self.left < 0 or k0 >= q1 - 1 + self.shift - self.left)
                       and (self.right < 0 or k1 - 1 <= q0 + self.shift + self.right))
        if self.slopes is None and all_visible:
            return s, t
        i = torch.arange(q0, q1, device=s.device)[:, None] + self.shift
        j = torch.arange(k0, k1, device=s.device)[None, :]
        if self.slopes is not None:
            s = s - self.slopes * (i - j).abs().to(s.dtype)
        if not all_visible:
            visible = ((j >= i - self.left) | (self.left < 0)) & ((j <= i + self.right) | (self.right < 0))
            s = s.masked_fill(~visible, float("-inf"))
        return s, t


def attention_chunked_forward(q, k, v, softmax_scale: float, causal: bool, window_size=(-1, -1),
                              softcap: float = 0.0, alibi_slopes=None, dropout: DropoutArgs | None = None,
                              batch_offset: int = 0):
    """q (B, Nq, H, D), k (B, Nk, Hk, D), v (B, Nk, Hk, Dv) -> out (B, Nq, H, Dv) in q's dtype,
    lse (B, H, Nq) float32."""
    B, Nq, H, _ = q.shape
    Hk, Dv = k.shape[2], v.shape[-1]
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = _Scores(q, k, softmax_scale, causal, window_size, softcap, alibi_slopes, acc_dtype, dropout,
                     batch_offset)
    qh, kh, vh = (_grouped(t, Hk) for t in (q, k, v))  # views, no copy; kh, vh have group 1
    out = torch.empty(B, Nq, H, Dv, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, H, Nq, device=q.device, dtype=torch.float32)
    out_g, lse_g = _grouped(out, Hk), lse.unflatten(1, (Hk, -1))  # views written tile by tile
    chunk_q, chunk_k = scores.chunk_sizes(B * H)
    for q0 in range(0, Nq, chunk_q):
        q1 = min(Nq, q0 + chunk_q)
        qc = qh[..., q0:q1, :].to(acc_dtype)
        stats_shape = qc.shape[:-1]  # (B, Hk, group, chunk_q)
        row_max = torch.full(stats_shape, float("-inf"), device=q.device, dtype=acc_dtype)
        row_sum = torch.zeros(stats_shape, device=q.device, dtype=acc_dtype)
        # acc is un-normalised: acc / row_sum is the output so far.
        acc = torch.zeros(*stats_shape, Dv, device=q.device, dtype=acc_dtype)
        keys = scores.key_range(q0, q1)
        for k0 in range(keys.start, keys.stop, chunk_k):
            k1 = min(keys.stop, k0 + chunk_k)
            s, _ = scores.tile(qc, kh[..., k0:k1, :].to(acc_dtype), q0, k0)
            new_max = torch.maximum(row_max, s.amax(dim=-1))
            # A row that has seen only masked keys keeps max -inf; use 0 so exp stays 0, not NaN.
            safe_max = new_max.masked_fill(torch.isinf(new_max), 0.0)
            p = torch.exp(s - safe_max.unsqueeze(-1))
            rescale = torch.exp(row_max - safe_max)  # rescales earlier chunks to the new max
            row_sum = row_sum * rescale + p.sum(dim=-1)
            # row_sum took the undropped p (the softmax's normaliser); only the output sees dropout.
            acc = acc * rescale.unsqueeze(-1) + torch.matmul(_round(scores.dropped(p, q0, k0), v.dtype),
                                                             vh[..., k0:k1, :].to(acc_dtype))
            row_max = new_max
        empty = row_sum == 0  # rows that saw no key: output 0, lse -inf
        out_g[..., q0:q1, :] = acc / row_sum.masked_fill(empty, 1.0).unsqueeze(-1)
        lse_g[..., q0:q1] = (row_max + torch.log(row_sum)).masked_fill(empty, float("-inf"))
    return out, lse


def attention_chunked_backward(dout, q, k, v, out, lse, softmax_scale: float, causal: bool,
                               window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None,
                               dropout: DropoutArgs | None = None, batch_offset: int = 0):
    """Gradients (dq, dk, dv), recomputing each score tile from q, k and the lse."""
    B, Nq, H, D = q.shape
    Nk, Hk = k.shape[1], k.shape[2]
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = _Scores(q, k, softmax_scale, causal, window_size, softcap, alibi_slopes, acc_dtype, dropout,
                     batch_offset)
    qh, kh, vh, doh = (_grouped(t, Hk) for t in (q, k, v, dout))
    # delta_i = sum_d dO_id * O_id = sum_j P_ij dP_ij: the softmax-gradient correction term.
    delta = (dout.to(acc_dtype) * out.to(acc_dtype)).sum(-1, keepdim=True)  # (B, Nq, H, 1)
    delta = _grouped(delta, Hk)[..., 0]  # (B, Hk, group, Nq)
    # Rows that saw no key have lse -inf; +inf makes every recomputed probability 0 there.
    lse = lse.to(acc_dtype).masked_fill(torch.isinf(lse), float("inf")).unflatten(1, (Hk, -1))
    # Accumulated in acc_dtype through grouped views; dk and dv have group 1, so the
    # group dimension of each tile's contribution is summed into them.
    dq = torch.zeros(B, Nq, H, D, device=q.device, dtype=acc_dtype)
    dk = torch.zeros(B, Nk, Hk, D, device=q.device, dtype=acc_dtype)
    dv = torch.zeros(B, Nk, Hk, v.shape[-1], device=q.device, dtype=acc_dtype)
    dq_g, dk_g, dv_g = (_grouped(t, Hk) for t in (dq, dk, dv))
    chunk_q, chunk_k = scores.chunk_sizes(B * H)
    for q0 in range(0, Nq, chunk_q):
        q1 = min(Nq, q0 + chunk_q)
        qc, doc = qh[..., q0:q1, :].to(acc_dtype), doh[..., q0:q1, :].to(acc_dtype)
        keys = scores.key_range(q0, q1)
        for k0 in range(keys.start, keys.stop, chunk_k):
            k1 = min(keys.stop, k0 + chunk_k)
            kc, vc = kh[..., k0:k1, :].to(acc_dtype), vh[..., k0:k1, :].to(acc_dtype)
            s, tanh = scores.tile(qc, kc, q0, k0)
            p = torch.exp(s - lse[..., q0:q1, None])
            dv_g[..., k0:k1, :] += torch.matmul(_round(scores.dropped(p, q0, k0), dout.dtype).transpose(-1, -2),
                                                doc).sum(2, keepdim=True)
            dp = scores.dropped(torch.matmul(doc, vc.transpose(-1, -2)), q0, k0)
            ds = p * (dp - delta[..., q0:q1, None])
            if tanh is not None:
                ds = ds * (1 - tanh * tanh)  # d(softcap * tanh(x / softcap)) / dx
            ds = _round(ds, q.dtype)
            dq_g[..., q0:q1, :] += torch.matmul(ds, kc)
            dk_g[..., k0:k1, :] += torch.matmul(ds.transpose(-1, -2), qc).sum(2, keepdim=True)
    return (dq * softmax_scale).to(q.dtype), (dk * softmax_scale).to(k.dtype), dv.to(v.dtype)


def _alibi_of(alibi_slopes, b: int):
    # (nheads,) slopes are shared by every sequence, (batch, nheads) ones are per sequence.
    return alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes


def attention_chunked_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale: float, causal: bool,
                                     window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None,
                                     dropout: DropoutArgs | None = None):
    """Packed q (total_q, H, D), k (total_k, Hk, D), v (total_k, Hk, Dv); sequence b is rows
    cu_seqlens[b]:cu_seqlens[b + 1]. -> out (total_q, H, Dv), lse (H, total_q) float32."""
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()  # one device sync, not one per sequence
    # Rows outside every sequence (after cu_seqlens_q[-1]) are left as empty rows.
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[-1])
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device, dtype=torch.float32)
    for b in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        o, ls = attention_chunked_forward(q[None, qs], k[None, ks], v[None, ks], softmax_scale, causal,
                                         window_size, softcap, _alibi_of(alibi_slopes, b), dropout, b)
        out[qs], lse[:, qs] = o[0], ls[0]
    return out, lse


def attention_chunked_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale: float,
                                      causal: bool, window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None,
                                      dropout: DropoutArgs | None = None):
    """Gradients (dq, dk, dv) of attention_chunked_varlen_forward, sequence by sequence."""
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for b in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        grads = attention_chunked_backward(dout[None, qs], q[None, qs], k[None, ks], v[None, ks], out[None, qs],
                                           lse[None, :, qs], softmax_scale, causal, window_size, softcap,
                                           _alibi_of(alibi_slopes, b), dropout, b)
        dq[qs], dk[ks], dv[ks] = (g[0] for g in grads)
    return dq, dk, dv
