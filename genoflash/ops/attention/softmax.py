"""Online-softmax bookkeeping, in base 2 (and the backward's two per-row terms: lse in base 2, and
delta = rowsum(O * dO)).

Scores are kept raw (q.k) and the scale is folded into one multiply with log2(e), so
every exponential is an exp2: exp(scale * s - m) == exp2(scale * log2(e) * s - m'),
with m' the running max in the log2 domain.
"""

import math

import triton
import triton.language as tl

from .tiles import _load_tile

LOG2E_HOST = 1.0 / math.log(2.0)  # for the host: softmax_scale * log2(e) is one kernel argument
LN2 = tl.constexpr(math.log(2.0))
LOG2E = tl.constexpr(LOG2E_HOST)


@triton.jit
def _online_softmax_update(s, m_i, l_i, qk_scale_log2, MAY_BE_EMPTY: tl.constexpr):
    """Fold one tile of raw scores s (BLOCK_M, BLOCK_N) into the running (max, sum).

    Returns (p, alpha, m_new, l_new): p are the tile's un-normalised probabilities, and
    alpha = exp2(m_i - m_new) is the factor by which everything accumulated so far (the
    sum and the output accumulator) must be rescaled because the max grew.
    MAY_BE_EMPTY marks masked tiles, where a row can hold only -inf scores so far.
    """
    # qk_scale_log2 > 0 (checked on the host), so max(s) * scale == max(s * scale).
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale_log2)
    if MAY_BE_EMPTY:
        # A row that has seen only masked keys has max -inf; subtracting it would give
        # -inf - -inf = NaN. Any finite stand-in works, since all its p are exp2(-inf) = 0.
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new
    p = tl.math.exp2(s * qk_scale_log2 - m_ref[:, None])
    alpha = tl.math.exp2(m_i - m_ref)
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new


@triton.jit
def _finalize_softmax(acc, m_i, l_i):
    """Normalise once at the end; returns (out, lse) with lse in natural log.

    A row that saw no key (l_i == 0) gets output 0 and lse -inf, never NaN.
    """
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    return out, lse


@triton.jit
def _lse_for_recompute(lse):
    """Natural-log lse from the forward -> base-2 lse for exp2 recomputation in the backward.

    Rows that saw no key have lse -inf; +inf instead makes every recomputed p exactly 0.
    """
    return tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)


@triton.jit
def _rowsum_o_do(o_row, do, offs_m, n_rows, stride_om, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """One channel group's share of delta = rowsum(O * dO), in float32: O's tile is loaded here,
    dO's is on chip already (the dQ pass holds it for its whole key loop)."""
    o = _load_tile(o_row, offs_m, n_rows, stride_om, offs_d, HEAD_DIM, BLOCK_D, True)
    return tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
