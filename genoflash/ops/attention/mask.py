"""Score masking for the tiles that straddle a boundary (see block_info.py).

Masked scores become -inf, so their probabilities are exactly 0 after exp2.
"""

import triton
import triton.language as tl


@triton.jit
def _mask_scores(s, offs_m, offs_n, seqlen_q, seqlen_k, IS_CAUSAL: tl.constexpr):
    """s is a (BLOCK_M, BLOCK_N) score tile for query rows offs_m and key columns offs_n."""
    visible = offs_n[None, :] < seqlen_k
    if IS_CAUSAL:
        # Bottom-right alignment: query i sees key j iff j <= i + seqlen_k - seqlen_q.
        visible = visible & (offs_n[None, :] <= offs_m[:, None] + (seqlen_k - seqlen_q))
    return tl.where(visible, s, float("-inf"))


@triton.jit
def _mask_scores_transposed(sT, offs_m, offs_n, seqlen_q, seqlen_k, IS_CAUSAL: tl.constexpr):
    """The same mask for a (BLOCK_N, BLOCK_M) tile of transposed scores (keys down, queries across)."""
    visible = offs_n[:, None] < seqlen_k
    if IS_CAUSAL:
        visible = visible & (offs_n[:, None] <= offs_m[None, :] + (seqlen_k - seqlen_q))
    return tl.where(visible, sT, float("-inf"))
